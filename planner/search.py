"""Greedy marginal-benefit planner (RubberBand, EuroSys'21) and its candidate pool.

Plan space: per stage an instance type, a trial width ``w ≤ max_workers_per_trial`` and an
instance count; stages may use different types and clouds. Only *efficient* instance counts are
considered (those at which the number of waves changes; any other count only adds idle instances).

:func:`descend` is RubberBand's greedy: from a feasible plan, generate one-step changes per stage,
screen them with a prefix of the Monte Carlo samples (common random numbers), confirm the best
with all samples, and take the cheaper-and-not-slower candidate if there is one, else the one
with the best cost-marginal benefit ``M = (cost(X) − cost(Y)) / (JCT(Y) − JCT(X))`` among those
still meeting the deadline at the confidence; repeat until nothing improves.

The planner (:mod:`rubberband.planner.api`) runs it from the cheapest feasible plan of a
deadline-independent pool (from the paper's start, maximum useful parallelism, only when the pool has
none): the :func:`knapsack_plans` ladder (optimal under additive per-stage estimates), the elastic
shrinks of all static plans and the fastest plan; the pool is searched by branch and bound.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Protocol, Sequence

import networkx as nx
import numpy as np

from rubberband.catalog import InstanceType
from rubberband.errors import ProfileError
from rubberband.plan import Timeline
from rubberband.planner.model import PerformanceModel
from rubberband.planner.schedule import Stage
from rubberband.planner.plan_space import HeadSpec, StageConfig, efficient_counts, layout, plan_key
from rubberband.planner.simulator import RunningState, SimOptions, SimResult, SimSettings, needed_on_time
from rubberband.planner.spot import SpotSetup

Plan = tuple[StageConfig, ...]


class PlanSimulator(Protocol):
    """What the search, the baselines and the planner ask of a simulator of whole plans.

    :class:`~rubberband.planner.simulator.Simulator` (Hyperband brackets one after another) and
    :class:`~rubberband.planner.brackets.ParallelSimulator` (side by side) both satisfy it.
    """

    stages: list[Stage]
    model: PerformanceModel
    settings: SimSettings

    @property
    def samples(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def spot(self) -> bool: ...

    @property
    def options(self) -> SimOptions: ...

    @property
    def start_state(self) -> RunningState | None: ...

    @property
    def spot_setup(self) -> SpotSetup | None: ...

    def simulate(self, configs: Sequence[StageConfig], samples: int | None = None) -> SimResult:
        """A full plan (one StageConfig per stage) with the first ``samples`` samples (None: all)."""
        ...

    def head_for(self, configs: Sequence[StageConfig]) -> HeadSpec | None:
        """The billed head of a plan (None: none)."""
        ...

    def head_cost(self, configs: Sequence[StageConfig], jct: np.ndarray) -> np.ndarray:
        """Per-sample cost of the plan's head for job completion times ``jct``."""
        ...

    def min_factor(self) -> float:
        """A lower bound of a task's compute factor (for rigorous bounds)."""
        ...

    def prefix_bounds(self, configs: Sequence[StageConfig]) -> tuple[float, np.ndarray]:
        """Lower bound on the mean cost of any plan starting with ``configs``, and the barrier times."""
        ...

    def trace(self, configs: Sequence[StageConfig], sample: int) -> tuple[Timeline, nx.DiGraph, float]:
        """Timeline of one sample, its DAG and critical path."""
        ...


def widths_for(itype: InstanceType, max_workers: int) -> list[int]:
    """Trial widths considered on a type: powers of two and the type's capacity, up to the cap."""
    widths = {1 << i for i in range(0, 11) if (1 << i) <= max_workers}
    if itype.workers <= max_workers:
        widths.add(itype.workers)
    return sorted(widths)


def count_for_waves(trials: int, capacity: int, workers: int, waves: int) -> int:
    slots = -(-trials // max(1, waves))
    if workers <= capacity:
        return -(-slots // (capacity // workers))
    return slots * -(-workers // capacity)


def waves_of(trials: int, config: StageConfig) -> int:
    lay = layout(config.instance_type.workers, config.instances, config.workers)
    return -(-trials // max(1, lay.slots))


class PlanSpace:
    """Per-stage options over the allowed instance types."""

    def __init__(
        self, stages: Sequence[Stage], types: Iterable[InstanceType], model: PerformanceModel, max_workers: int
    ) -> None:
        self.stages = list(stages)
        self.model = model
        self.max_workers = max_workers
        usable = [t for t in types if model.plannable(t.device)]
        if not usable:
            devices = sorted({t.device for t in types})
            raise ProfileError(
                f"no allowed instance type has a device the profile covers (types offer "
                f"{', '.join(devices) or 'nothing'}; profile covers "
                f"{', '.join(sorted(model.devices))}); add device_speed entries to the "
                f"profile or allow other instance types"
            )
        self.types = sorted(usable, key=lambda t: (t.price_hr, t.key))
        self.skipped = sorted({t.name for t in types if not model.plannable(t.device)})
        self._counts: dict[tuple, list[int]] = {}
        self._frontiers: dict[int, list[StageConfig]] = {}
        self._options: dict[int, list[StageConfig]] = {}
        self._estimates: dict[int, list[tuple[float, float, StageConfig]]] = {}
        self._ladders: dict[tuple, tuple[list[StageConfig], list[float]]] = {}  # match_time's per (stage, type, width)
        self._times: dict[tuple, float] = {}  # stage_time per (stage, type, count, width): asked for by every move

    def counts(self, stage: int, itype: InstanceType, workers: int) -> list[int]:
        key = (stage, itype.workers, workers)
        if key not in self._counts:
            self._counts[key] = efficient_counts(self.stages[stage].trials, itype.workers, workers)
        return self._counts[key]

    def options(self, stage: int) -> list[StageConfig]:
        """Every efficient configuration of one stage (for the exact optimiser)."""
        if stage not in self._options:
            self._options[stage] = [
                StageConfig(t, n, w)
                for t in self.types
                for w in widths_for(t, self.max_workers)
                for n in self.counts(stage, t, w)
            ]
        return self._options[stage]

    def estimates(self, stage: int) -> list[tuple[float, float, StageConfig]]:
        """(duration, cost, config) of every option of one stage by :meth:`stage_estimate`."""
        if stage not in self._estimates:
            self._estimates[stage] = [(*self.stage_estimate(stage, c), c) for c in self.options(stage)]
        return self._estimates[stage]

    def stage_time(self, stage: int, config: StageConfig) -> float:
        """Deterministic stage time at the median (no start-up): waves × task time."""
        key = (stage, config.instance_type.key, config.instances, config.workers)
        out = self._times.get(key)
        if out is None:
            st = self.stages[stage]
            lay = layout(config.instance_type.workers, config.instances, config.workers)
            task = st.epochs_this_stage * self.model.epoch_time(config.instance_type.device, config.workers, lay.nodes)
            out = self._times[key] = waves_of(st.trials, config) * task
        return out

    def brackets(self) -> list[tuple[int, int]]:
        """(first, end) stage positions of each bracket."""
        out: list[tuple[int, int]] = []
        for i, st in enumerate(self.stages):
            if st.index == 0 or not out:
                out.append((i, i + 1))
            else:
                out[-1] = (out[-1][0], i + 1)
        return out

    def match_time(self, stage: int, itype: InstanceType, workers: int, target_s: float) -> StageConfig:
        """The fewest instances of (type, width) whose stage time is within ``target_s`` (else the most)."""
        key = (stage, itype.key, workers)
        ladder = self._ladders.get(key)
        if ladder is None:
            configs = [StageConfig(itype, n, workers) for n in self.counts(stage, itype, workers)]
            # more instances never take longer (the waves only shrink): negated times ascend, so bisect
            ladder = self._ladders[key] = (configs, [-self.stage_time(stage, c) for c in configs])
        configs, negated = ladder
        i = bisect_left(negated, -(target_s * (1 + 1e-9)))
        return configs[min(i, len(configs) - 1)]

    def stage_estimate(self, stage: int, config: StageConfig) -> tuple[float, float]:
        """Deterministic (duration, cost) of one stage in isolation, at the median start-up."""
        t = config.instance_type
        st = self.stages[stage]
        duration = self.stage_time(stage, config) + waves_of(st.trials, config) * self.model.task_overhead(
            st.epochs_this_stage, False
        )
        startup = self.model.startup(t.cloud, t.name).quantile(0.5)
        return duration, config.instances * t.price_hr / 3600.0 * (duration + startup)

    def frontier(self, stage: int) -> list[StageConfig]:
        """Pareto-optimal configurations of one stage by the isolated estimate, fastest first."""
        if stage not in self._frontiers:
            scored = sorted(self.estimates(stage), key=lambda x: (x[0], x[1]))
            front: list[StageConfig] = []
            best_cost = float("inf")
            for duration, cost, config in scored:
                if cost < best_cost - 1e-12:
                    front.append(config)
                    best_cost = cost
            self._frontiers[stage] = front
        return self._frontiers[stage]

    def fastest(self) -> Plan:
        """Maximum useful parallelism: per stage the configuration that finishes first."""
        return tuple(self.frontier(i)[0] for i in range(len(self.stages)))

    def cheapest(self) -> Plan:
        """Per stage the configuration of least isolated cost (its frontier's slowest point)."""
        return tuple(self.frontier(i)[-1] for i in range(len(self.stages)))

    def neighbours(self, plan: Plan, reach: int = 3) -> list[Plan]:
        """One-step changes: one stage moves 1..reach places down its frontier (cheaper, slower)."""
        out: list[Plan] = []
        for i, config in enumerate(plan):
            front = self.frontier(i)
            keys = [c.key for c in front]
            pos = keys.index(config.key) if config.key in keys else -1
            for step in range(1, reach + 1):
                if pos + step < len(front):
                    out.append(plan[:i] + (front[pos + step],) + plan[i + 1 :])
            if pos == -1:  # a plan from elsewhere: offer the frontier points near it
                out.extend(plan[:i] + (c,) + plan[i + 1 :] for c in front[:reach])
        return out


#: Samples of :meth:`Evaluator.mid`.
MID_SAMPLES = 200


class Evaluator:
    """Caches screening and full-sample results of plans for one simulator.

    Screening simulates the whole plan with the first ``screen_samples`` samples; the simulator's prefix cache
    replays only the stages from the first one a candidate changes. (Hyperband brackets one after another used to
    be screened bracket by bracket, each later bracket starting with only the previous bracket's last instances
    up: the instances a later bracket's first stage adds were booted at the bracket's start instead of ahead of
    time as the full simulation prefetches them, so every plan that grows at a bracket boundary failed its screen
    and the descent never tried it: up to 45 % above the exact optimum in bench_planner_gap.py.)
    """

    def __init__(self, sim: PlanSimulator, screen_samples: int) -> None:
        self.sim = sim
        self.screen_samples = min(screen_samples, sim.samples)
        self._screen: dict[tuple, SimResult] = {}
        self._full: dict[tuple, SimResult] = {}
        self._mid: dict[tuple, SimResult] = {}

    def screen(self, plan: Plan) -> SimResult:
        key = plan_key(plan)
        if key not in self._screen:
            self._screen[key] = self.sim.simulate(plan, self.screen_samples)
        return self._screen[key]

    def mid(self, plan: Plan) -> SimResult:
        """The plan with the first :data:`MID_SAMPLES` samples (all, where the simulator has no more): a second,
        sharper screen of the plan's cost before its full simulation."""
        key = plan_key(plan)
        if key not in self._mid:
            self._mid[key] = self.sim.simulate(plan, min(MID_SAMPLES, self.sim.samples))
        return self._mid[key]

    def full(self, plan: Plan) -> SimResult:
        key = plan_key(plan)
        if key not in self._full:
            self._full[key] = self.sim.simulate(plan)
        return self._full[key]

    def evaluated_full(self) -> list[SimResult]:
        return list(self._full.values())


@dataclass(frozen=True)
class Goal:
    """What a plan must achieve: finish within ``deadline_s`` seconds with probability at least ``confidence``,
    and (when set) cost at most ``budget_usd`` on average."""

    deadline_s: float
    confidence: float
    budget_usd: float | None = None

    def met_by(self, result: SimResult) -> bool:
        """Whether ``result`` meets the deadline at the confidence (count-based: :meth:`SimResult.meets`)."""
        return result.meets(self.deadline_s, self.confidence)


@dataclass(frozen=True)
class PlanSearch:
    """One search for the cheapest plan of ``space`` that meets ``goal``, every candidate judged by ``evaluator``
    (screened on a prefix of the samples, confirmed on all): what the greedy (:func:`descend`) and the baselines
    (:func:`~rubberband.planner.baselines.cheapest_feasible`, :func:`~rubberband.planner.baselines.exact_optimum`)
    search."""

    space: PlanSpace
    evaluator: Evaluator
    goal: Goal

    @property
    def deadline_s(self) -> float:
        return self.goal.deadline_s

    @property
    def confidence(self) -> float:
        return self.goal.confidence

    def meets(self, result: SimResult) -> bool:
        return self.goal.met_by(result)

    def screen_need(self, slack: int = 0) -> int:
        """Screening samples within the deadline a candidate needs to be kept (``slack`` fewer than the confidence's
        share of the screening samples)."""
        return needed_on_time(self.evaluator.screen_samples, self.goal.confidence) - slack

    def kept_by_screen(self, screened: SimResult, slack: int = 0) -> bool:
        """Whether a screening keeps its candidate: at least :meth:`screen_need` of its samples within the deadline."""
        return int((screened.jct <= self.deadline_s).sum()) >= self.screen_need(slack)

    def judged_by(self, evaluator: Evaluator) -> PlanSearch:
        """The same search with candidates judged by ``evaluator`` (another simulator of the job)."""
        return replace(self, evaluator=evaluator)


#: A neighbourhood: the candidate plans one step from a plan.
Moves = Callable[[PlanSpace, Plan], list[Plan]]


class _Moves:
    """Candidate plans in the order they are found, each once (never the plan moved from)."""

    def __init__(self, plan: Plan, first: Iterable[Plan] = ()) -> None:
        self.out: list[Plan] = list(first)
        self.seen = {plan_key(p) for p in self.out} | {plan_key(plan)}

    def add(self, candidate: Plan) -> None:
        key = plan_key(candidate)
        if key not in self.seen:
            self.seen.add(key)
            self.out.append(candidate)


def local_moves(space: PlanSpace, plan: Plan) -> list[Plan]:
    """Richer one-stage changes for the deadline-aware descent: frontier steps, one instance-count
    step on the same type and width, and every frontier (type, width) pair at the same waves; then
    block moves (:func:`_block_moves`) and type moves (:func:`_type_moves`) over prefixes and suffixes of
    the brackets."""
    moves = _Moves(plan, space.neighbours(plan))
    for i in range(len(plan)):
        for change in _stage_changes(space, plan, i):
            moves.add(plan[:i] + (change,) + plan[i + 1 :])
    pairs: dict[tuple, StageConfig] = {}
    for i in range(len(plan)):
        for c in space.frontier(i):
            pairs.setdefault((c.instance_type.key, c.workers), c)
    blocks = _blocks(space, plan)
    _block_moves(space, plan, (pairs, blocks), moves)
    _type_moves(space, plan, (pairs, blocks), moves)
    return moves.out


def _stage_changes(space: PlanSpace, plan: Plan, i: int) -> list[StageConfig]:
    """Stage ``i``'s changes: one instance-count step down and up on its type and width, its other widths on the
    same instances, every frontier (type, width) pair (and the neighbouring stages', whose instances would carry
    over) at the same waves and at the same stage time, and a neighbouring stage's very configuration."""
    config = plan[i]
    trials = space.stages[i].trials
    t, w = config.instance_type, config.workers
    waves = waves_of(trials, config)
    counts = space.counts(i, t, w)
    changes = [StageConfig(t, n, w) for n in counts if n < config.instances][-1:]
    changes += [StageConfig(t, n, w) for n in counts if n > config.instances][:1]
    # other widths on the same instances (none starts or stops; the waves change): neither the same waves nor the
    # same time on another width keeps the count
    changes += [
        StageConfig(t, config.instances, v)
        for v in widths_for(t, space.max_workers)
        if v != w and config.instances in space.counts(i, t, v)
    ]
    pairs = {(c.instance_type.key, c.workers): c for c in space.frontier(i)}
    for j in (i - 1, i + 1):  # align with a neighbouring stage (instances carry over)
        if 0 <= j < len(plan):
            pairs.setdefault((plan[j].instance_type.key, plan[j].workers), plan[j])
            # its very configuration, where that is an efficient count here: every instance carries over, none
            # starts (the same waves or the same time on its type may need a count that pays start-ups)
            if plan[j].instances in space.counts(i, plan[j].instance_type, plan[j].workers):
                changes.append(plan[j])
    for c in pairs.values():
        if (c.instance_type.key, c.workers) != (t.key, w):
            changes.append(
                StageConfig(
                    c.instance_type, count_for_waves(trials, c.instance_type.workers, c.workers, waves), c.workers
                )
            )
            changes.append(space.match_time(i, c.instance_type, c.workers, space.stage_time(i, config)))
    return changes


def _blocks(space: PlanSpace, plan: Plan) -> list[tuple[int, int]]:
    """The blocks of stages (first, end) a block move switches together: prefixes and suffixes of each bracket
    (and all of it), and the whole plan when it has several brackets; in order."""
    blocks = set()
    for first, last in space.brackets():
        blocks |= {(first, b) for b in range(first + 2, last + 1)} | {(a, last) for a in range(first + 1, last - 1)}
    if len(space.brackets()) > 1:
        blocks.add((0, len(plan)))
    return sorted(blocks)


def _block_moves(
    space: PlanSpace, plan: Plan, options: tuple[dict[tuple, StageConfig], list[tuple[int, int]]], moves: _Moves
) -> None:
    """Block moves: a block of stages switches to one frontier (type, width) pair (``options``: the pairs, the
    blocks) at the same waves, or at the same stage times, so instances carry over and no resize is paid where a
    single-stage move would pay it."""
    pairs, blocks = options
    for c in pairs.values():
        t, w = c.instance_type, c.workers
        for a, b in blocks:
            same_waves, same_time = list(plan), list(plan)
            for i in range(a, b):
                trials = space.stages[i].trials
                same_waves[i] = StageConfig(t, count_for_waves(trials, t.workers, w, waves_of(trials, plan[i])), w)
                same_time[i] = space.match_time(i, t, w, space.stage_time(i, plan[i]))
            moves.add(tuple(same_waves))
            moves.add(tuple(same_time))


def _type_moves(
    space: PlanSpace, plan: Plan, options: tuple[dict[tuple, StageConfig], list[tuple[int, int]]], moves: _Moves
) -> None:
    """Type moves: a block of stages switches to one instance type of the frontier pairs (``options``: the pairs,
    the blocks), each stage at its cheapest width that keeps the stage time."""
    pairs, blocks = options
    for t in {c.instance_type.key: c.instance_type for c in pairs.values()}.values():
        for a, b in blocks:
            typed = list(plan)
            for i in range(a, b):
                target = space.stage_time(i, plan[i])
                options_i = [space.match_time(i, t, w, target) for w in widths_for(t, space.max_workers)]
                fitting = [o for o in options_i if space.stage_time(i, o) <= target * (1 + 1e-9)] or options_i
                typed[i] = min(fitting, key=lambda o: (space.stage_estimate(i, o)[1], o.workers))
            moves.add(tuple(typed))


@dataclass
class DescentResult:
    plan: Plan
    result: SimResult
    candidates_evaluated: int = 0
    iterations: int = 0
    #: False: an ascent (:func:`ascend`) that found no plan meeting the deadline; ``result`` is then a screening
    met: bool = True


def simple_moves(space: PlanSpace, plan: Plan) -> list[Plan]:
    """One-stage changes: frontier steps and one instance-count step on the same type and width."""
    out = space.neighbours(plan)
    seen = {plan_key(p) for p in out} | {plan_key(plan)}
    for i, config in enumerate(plan):
        counts = space.counts(i, config.instance_type, config.workers)
        lower = [n for n in counts if n < config.instances][-1:]
        for n in lower:
            candidate = plan[:i] + (StageConfig(config.instance_type, n, config.workers),) + plan[i + 1 :]
            if plan_key(candidate) not in seen:
                seen.add(plan_key(candidate))
                out.append(candidate)
    return out


@dataclass(frozen=True)
class DescentLimits:
    """How far :func:`descend` looks: the best ``confirm`` screened candidates of a step are confirmed with every
    sample, at most ``max_steps`` steps are taken, and a stuck descent pairs its ``trades`` largest savings that
    miss the deadline with a second move (0: no trades). Two trades find what four did over the gap suite and
    the honesty cases (bench_planner_gap.py, tests/test_planner_honesty.py), none leaves five of them 2.4 % above
    the exact optimum; each costs a neighbourhood of screens (Hyperband R=243: a fifth of the planning time).

    Where the stuck plan's neighbourhood has at most ``climb_neighbourhood`` plans (jobs of a few stages), its
    ``climbs`` least costly moves that keep the deadline are paired with a second move too: a step up that opens
    a cheaper step down (release an instance a stage later, so that the next bracket keeps it). Over the gap
    suite's held-out seed this brought a sequential Hyperband case from 7.5 % above the exact optimum to it, and
    the descent alone from the fastest plan from p95 1.0056 to 1.0000. Larger neighbourhoods (Hyperband R=243:
    hundreds of plans) are not climbed: there climbing cost 0.3 s of planning at 2x the shortest deadline
    (+40 %) for 0.05 % of cost."""

    confirm: int = 3
    max_steps: int = 500
    trades: int = 2
    climbs: int = 2
    climb_neighbourhood: int = 64


def descend(
    search: PlanSearch, start: Plan, moves: Moves | None = None, limits: DescentLimits = DescentLimits()
) -> DescentResult:
    """RubberBand's deadline-aware greedy: from a feasible plan, repeatedly take the cheaper
    candidate with the best marginal benefit among those that still meet the deadline.

    Candidates (``moves``, default :func:`local_moves`) are screened with a prefix of the samples; the best few
    are confirmed with all samples, and a step is taken only when the full-sample plan is feasible and cheaper,
    so the result is never costlier than ``start``. Where no single move is both cheaper and feasible, a trade
    of two moves (:meth:`_Descent.trade`; ``limits.trades`` savings paired, 0 turns it off) gets the greedy out
    of the local minimum that one-move descents stop in.
    """
    return _Descent(search, moves or local_moves, limits).run(start)


class _Descent:
    """One run of :func:`descend`: the search, the neighbourhood, the limits, and what it has evaluated."""

    def __init__(self, search: PlanSearch, moves: Moves, limits: DescentLimits) -> None:
        self.search = search
        self.moves = moves
        self.limits = limits
        self.candidates = 0

    def _screened(self, candidate: Plan, cur_screen: SimResult) -> tuple[float, SimResult]:
        """A candidate's screening result and its saving over the current plan's (screening samples)."""
        res = self.search.evaluator.screen(candidate)
        self.candidates += 1
        return cur_screen.cost_mean - res.cost_mean, res

    def _in_time(self, res: SimResult) -> bool:
        return self.search.kept_by_screen(res)

    def _confirmed(self, ranked: list[tuple], cur: SimResult) -> tuple[Plan, SimResult] | None:
        """The first of the best ``confirm`` ranked candidates that, with every sample, meets the deadline and is
        cheaper than the current plan (None: none)."""
        for _, candidate in ranked[: self.limits.confirm]:
            res = self.search.evaluator.full(candidate)
            if self.search.meets(res) and res.cost_mean < cur.cost_mean:
                return candidate, res
        return None

    def run(self, start: Plan) -> DescentResult:
        current, cur = start, self.search.evaluator.full(start)
        out = DescentResult(current, cur)
        if not self.search.meets(cur):
            return out
        for _ in range(self.limits.max_steps):
            out.iterations += 1
            cur_screen = self.search.evaluator.screen(current)
            ranked = []
            for candidate in self.moves(self.search.space, current):
                saving, res = self._screened(candidate, cur_screen)
                if saving <= 1e-9 or not self._in_time(res):
                    continue
                slower = res.jct_mean - cur_screen.jct_mean
                ranked.append(((1, saving) if slower <= 0 else (0, saving / slower), candidate))
            ranked.sort(key=lambda x: x[0], reverse=True)
            step = self._confirmed(ranked, cur)
            if step is None and self.limits.trades:
                step = self.trade(current, cur, cur_screen)
            if step is None:
                break
            current, cur = step
        out.plan, out.result = current, cur
        out.candidates_evaluated = self.candidates
        return out

    def trade(self, current: Plan, cur: SimResult, cur_screen: SimResult) -> tuple[Plan, SimResult] | None:
        """A two-move step out of a local minimum: a saving that alone misses the deadline, paired with
        a second move that wins the time back, when the pair is still cheaper than ``current``; in a small
        neighbourhood also a move that costs a little more (a climb), paired with a second move that saves more.

        Only the ``limits.trades`` largest single savings (and ``limits.climbs`` smallest climbs) are paired, so
        the step costs that many neighbourhoods of screening, and it runs only where the one-move greedy is stuck.
        """
        misses, climbs = [], []
        neighbourhood = self.moves(self.search.space, current)
        for candidate in neighbourhood:
            saving, res = self._screened(candidate, cur_screen)
            if saving > 1e-9 and not self._in_time(res):
                misses.append((saving, candidate))
            elif saving <= 1e-9 and self._in_time(res):
                climbs.append((saving, candidate))
        misses.sort(key=lambda x: x[0], reverse=True)
        climbs.sort(key=lambda x: x[0], reverse=True)
        ranked = []
        seen = set()
        firsts = misses[: self.limits.trades]
        if len(neighbourhood) <= self.limits.climb_neighbourhood:
            firsts += climbs[: self.limits.climbs]
        for _, first in firsts:
            for candidate in self.moves(self.search.space, first):
                key = plan_key(candidate)
                if key in seen:
                    continue
                seen.add(key)
                saving, res = self._screened(candidate, cur_screen)
                if saving > 1e-9 and self._in_time(res):
                    ranked.append((saving, candidate))
        ranked.sort(key=lambda x: x[0], reverse=True)
        return self._confirmed(ranked, cur)


def rising_moves(space: PlanSpace, plan: Plan) -> list[Plan]:
    """One-stage steps up, the ascent's neighbourhood: a stage moves 1-3 places up its frontier (faster, costlier),
    or takes one more efficient instance count on its type and width."""
    moves = _Moves(plan)
    for i, config in enumerate(plan):
        front = space.frontier(i)
        keys = [c.key for c in front]
        pos = keys.index(config.key) if config.key in keys else len(front)
        for c in reversed(front[max(0, pos - 3) : pos]):
            moves.add(plan[:i] + (c,) + plan[i + 1 :])
        t, w = config.instance_type, config.workers
        for n in [n for n in space.counts(i, t, w) if n > config.instances][:1]:
            moves.add(plan[:i] + (StageConfig(t, n, w),) + plan[i + 1 :])
    return moves.out


@dataclass(frozen=True)
class AscentLimits:
    """How far :func:`ascend` looks: only from a start at most ``late_factor`` times the deadline late (the JCT at
    the confidence), through neighbourhoods of at most ``neighbourhood`` plans (jobs of a few stages: the climbs'
    bound, :class:`DescentLimits`), for at most ``max_steps`` steps.

    Over the 400 cases of bench_planner_gap.py (seeds 0 and 1) the walk up found a cheaper plan twice, from
    cheapest plans 1.07x and 1.94x late. From further away it is a long walk (the quickstart at 1.2x the shortest
    deadline: 2.6x the planning candidates) to where the descent from the fast side already is."""

    late_factor: float = 2.0
    neighbourhood: int = 64
    max_steps: int = 24


def ascend(
    search: PlanSearch,
    start: Plan,
    moves: Moves | None = None,
    limits: AscentLimits = AscentLimits(),
    *,
    below_usd: float = math.inf,
) -> DescentResult:
    """The greedy from the other side: from a cheap plan (the planner's: :meth:`PlanSpace.cheapest`), take the
    move that buys the most time up to the deadline per dollar (the screened JCT at the confidence, common random
    numbers) until a plan meets the deadline with every sample. Moves that cost ``below_usd`` or more (the plan
    in hand) are not taken: a walk that reaches the deadline only above it has nothing to offer. Not ``met`` where
    a neighbourhood on the way is larger than ``limits.neighbourhood``, nothing below ``below_usd`` bought time,
    or no plan met the deadline in ``limits.max_steps``.

    The descent walks down from fast plans; where the optimum is a cheap plan with a few instances added (start
    two instances for a first stage, keep one through the rest), every plan between them is costlier or late,
    and the walk down stops short. The walk up reaches it in a step or two; :func:`descend` then refines it.
    """
    space, current = search.space, start
    moves = moves or rising_moves
    out = DescentResult(current, search.evaluator.screen(current), met=False)
    if out.result.jct_quantile(search.confidence) > limits.late_factor * search.deadline_s:
        return out
    for _ in range(limits.max_steps):
        cur = out.result
        late = cur.jct_quantile(search.confidence)
        if search.kept_by_screen(cur):
            full = search.evaluator.full(current)
            out.candidates_evaluated += 1
            if search.meets(full):
                out.plan, out.result, out.met = current, full, True
                return out
            late = full.jct_quantile(search.confidence)  # in time on the screening samples only: still late
        neighbourhood = moves(space, current)
        if len(neighbourhood) > limits.neighbourhood:
            return out
        out.iterations += 1
        best: tuple[tuple[float, float], Plan, SimResult] | None = None
        for candidate in neighbourhood:
            res = search.evaluator.screen(candidate)
            out.candidates_evaluated += 1
            # time bought beyond the deadline is worth nothing: a jump far past it must not outscore a step to it
            gained = late - max(res.jct_quantile(search.confidence), search.deadline_s)
            if gained <= 1e-9 or res.cost_mean >= below_usd:
                continue
            extra = res.cost_mean - cur.cost_mean
            score = (math.inf if extra <= 1e-12 else gained / extra, -res.cost_mean)
            if best is None or score > best[0]:
                best = (score, candidate, res)
        if best is None:
            return out
        _, current, out.result = best
        out.plan = current
    return out


def knapsack_plans(space: PlanSpace, **kwargs) -> list[Plan]:
    """Knapsack ladders over all options, and over each instance type alone (no type changes)."""
    plans = _knapsack(space, None, **kwargs)
    seen = {plan_key(p) for p in plans}
    for t in space.types:
        for plan in _knapsack(space, t.key, **kwargs):
            if plan_key(plan) not in seen:
                seen.add(plan_key(plan))
                plans.append(plan)
    return plans


def _knapsack(
    space: PlanSpace, only_type: str | None, *, buckets: int = 400, ladder: float = 1.01, span: float = 12.0
) -> list[Plan]:
    """Plans that are optimal under the additive per-stage estimate, for a ladder of time budgets.

    A multiple-choice knapsack over stages (minimise the sum of isolated stage cost estimates
    subject to the sum of stage time estimates within a budget), solved once by dynamic
    programming over discretised time; the ladder of budgets (fastest total × 1.03^j) does not
    depend on the deadline, so these plans can join the deadline-independent pool.
    """
    n = len(space.stages)
    estimates = [
        [e for e in space.estimates(i) if only_type is None or e[2].instance_type.key == only_type] for i in range(n)
    ]
    fastest = sum(min(d for d, _, _ in opts) for opts in estimates)
    horizon = fastest * span
    step = horizon / buckets
    inf = float("inf")
    f = np.zeros(buckets + 1)
    choices = []
    for opts in estimates:
        g = np.full(buckets + 1, inf)
        arg = np.full(buckets + 1, -1, dtype=np.int64)
        for k, (d, cost, _) in enumerate(opts):
            b = int(math.ceil(d / step - 1e-9))
            if b > buckets:
                continue
            shifted = np.full(buckets + 1, inf)
            shifted[b:] = f[: buckets + 1 - b] + cost
            better = shifted < g
            g[better] = shifted[better]
            arg[better] = k
        choices.append(arg)
        f = g
    plans: list[Plan] = []
    seen = set()
    budget = fastest
    while budget <= horizon:
        t = int(math.floor(budget / step + 1e-9))
        if np.isfinite(f[t]):
            picked = []  # last stage first
            for i in range(n - 1, -1, -1):
                k = int(choices[i][t])
                d, _, c = estimates[i][k]
                picked.append(c)
                t -= int(math.ceil(d / step - 1e-9))
            plan = tuple(reversed(picked))
            key = plan_key(plan)
            if key not in seen:
                seen.add(key)
                plans.append(plan)
        budget *= ladder
    return plans


def with_markets(moves, spot_allowed):
    """``moves`` with the market as one more move dimension per stage (issue 15).

    Every candidate of ``moves`` keeps each stage's market (a move of type, width or count leaves the
    stage on spot if it was, where its new type may be bought on spot), and each stage, each bracket's
    suffix of stages, and the whole plan may switch market. ``spot_allowed(config)``: whether a
    configuration may run on spot (its type has a spot price and a fitted spot model).
    """

    def keep(plan: Plan, candidate: Plan) -> Plan:
        return tuple(
            c.on(p.market) if p.market != c.market and (p.market != "spot" or spot_allowed(c)) else c
            for p, c in zip(plan, candidate)
        )

    def moves_with_markets(space: PlanSpace, plan: Plan) -> list[Plan]:
        out = []
        seen = {plan_key(plan)}

        def add(candidate: Plan) -> None:
            key = plan_key(candidate)
            if key not in seen:
                seen.add(key)
                out.append(candidate)

        def flipped(c: StageConfig) -> StageConfig | None:
            if c.market == "spot":
                return c.on("on_demand")
            return c.on("spot") if spot_allowed(c) else None

        for i, c in enumerate(plan):
            f = flipped(c)
            if f is not None:
                add(plan[:i] + (f,) + plan[i + 1 :])
        for first, last in space.brackets():
            for a in range(first, last):
                for market in ("spot", "on_demand"):
                    block = [c.on(market) if (market == "on_demand" or spot_allowed(c)) else c for c in plan[a:last]]
                    add(plan[:a] + tuple(block) + plan[last:])
        for candidate in moves(space, plan):
            add(keep(plan, candidate))
        return out

    return moves_with_markets
