"""Reference plans: the best static plan and an exact optimum over the planner's plan space.

* **Static**: one instance type, one instance count and one trial width for the whole job (a fixed
  cluster: instances a stage cannot use idle until the job ends). The cheapest one meeting the
  deadline at the confidence. Searched by branch and bound on rigorous cost and JCT lower bounds
  (exact); the planner additionally skips plans whose screening samples are clearly too slow
  (``cheapest_feasible(screen_slack=...)``), which keeps the result monotone in the deadline.
* **Exact**: depth-first enumeration of every per-stage configuration in the planner's plan space,
  with prefix simulation shared through the simulator's cache and branch-and-bound pruning on the
  cost so far. Exponential: meant for small jobs, to measure the greedy planner's gap. It starts
  from nothing (no incumbent from the plan under test, so it is an independent check) and stops
  after ``max_nodes`` search nodes; :attr:`BaselineResult.capped` then says the answer is the best
  found, not a proven optimum (:meth:`BaselineResult.optimality` words it for the plan and the CLI).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rubberband.catalog import SERIAL_PROVISIONING
from rubberband.planner.bounds import stage_min_time
from rubberband.planner.brackets import ParallelSimulator
from rubberband.planner.search import Evaluator, Plan, PlanSearch, PlanSpace, count_for_waves, widths_for
from rubberband.planner.plan_space import StageConfig, efficient_counts, layout, plan_key
from rubberband.planner.simulator import RunningState, SimResult, Simulator, needed_on_time


class BoundedSimulator(Protocol):
    """What :func:`lower_bounds` reads of a simulator: any :class:`~rubberband.planner.search.PlanSimulator`,
    or a view of one bracket's (:mod:`~rubberband.planner.brackets`)."""

    @property
    def spot(self) -> bool: ...

    @property
    def start_state(self) -> RunningState | None: ...

    def min_factor(self) -> float: ...


class HoldsSimulator(Protocol):
    """An :class:`~rubberband.planner.search.Evaluator`, or anything else holding the simulator to bound."""

    @property
    def sim(self) -> BoundedSimulator: ...


@dataclass
class BaselineResult:
    plan: Plan | None
    result: SimResult | None
    evaluated: int
    #: Search nodes visited (exact search: prefixes bounded plus full plans simulated).
    nodes: int = 0
    #: The exact search stopped at its node cap: ``plan`` is the best found, not proven optimal.
    capped: bool = False

    def optimality(self) -> str:
        """How far the exact search got, in words (for the plan JSON, the CLI and the bench)."""
        if self.capped:
            return f"capped after {self.nodes} nodes, not proven optimal"
        return f"proven optimal ({self.nodes} nodes searched)"


def static_plans(space: PlanSpace) -> list[Plan]:
    """Every static plan: (type, width, count) with counts efficient for the largest stage."""
    most = max(s.trials for s in space.stages)
    plans = []
    for t in space.types:
        for w in widths_for(t, space.max_workers):
            for n in efficient_counts(most, t.workers, w):
                plans.append(tuple(StageConfig(t, n, w) for _ in space.stages))
    return plans


def lower_bounds(space: PlanSpace, evaluator: HoldsSimulator, plan: Plan) -> tuple[float, float]:
    """Rigorous lower bounds on a plan's mean cost and on every sample's JCT.

    Cost: every plan pays its tasks' compute (at the smallest possible straggler factor), the
    start-up of its first stage's instances and its checkpoint transfers; a plan that keeps the
    same instances through stages (static) also pays for them until its last stage starts.
    With parallel brackets (:mod:`~rubberband.planner.brackets`) the bounds are per bracket.
    """
    sim = evaluator.sim
    if isinstance(sim, ParallelSimulator):
        return parallel_lower_bounds(space, sim, plan)
    f_min = sim.min_factor()
    model = space.model
    running = sim.start_state is not None
    cost = 0.0
    times = []
    prev = None
    for i, (st, c) in enumerate(zip(space.stages, plan)):
        t = c.instance_type
        price = t.price(sim.spot or c.spot) / 3600.0  # spot: preemptions and fall-backs only add to it
        lay = layout(t.workers, c.instances, c.workers)
        base = st.epochs_this_stage * model.epoch_time(t.device, c.workers, lay.nodes)
        moved = prev is not None and st.index > 0 and prev.placement != c.placement
        task = base * f_min + model.task_overhead(st.epochs_this_stage, moved)
        cost += st.trials * task * c.workers / t.workers * price
        times.append(-(-st.trials // max(1, lay.slots)) * task)
        prev = c
    t0 = plan[0].instance_type
    startup = 0.0 if running else min(model.startup(t0.cloud, t0.name).samples_s)
    cost += plan[0].instances * startup * t0.price(sim.spot or plan[0].spot) / 3600.0
    if len({c.key for c in plan}) == 1:  # static: all instances live until the last stage starts
        if t0.cloud in SERIAL_PROVISIONING:
            # instances after the first are requested (and billed) only once the one before is up,
            # so only the first is sure to live from the start; the others at least boot
            held = (startup + sum(times[:-1])) + (plan[0].instances - 1) * startup
        else:
            held = plan[0].instances * (startup + sum(times[:-1]))
        cost = max(cost, t0.price(sim.spot or plan[0].spot) / 3600.0 * held)
    return cost, startup + sum(times)


def cheapest_feasible(
    search: PlanSearch,
    plans: list[Plan],
    *,
    incumbent: tuple[Plan, SimResult] | None = None,
    screen_slack: int | None = None,
    cost_margin: float | None = None,
) -> BaselineResult:
    """Cheapest of ``plans`` (full-sample mean cost) meeting the search's goal, by branch and bound.

    Plans are visited in order of their rigorous cost lower bound, and the search stops at the
    first plan whose bound is not below the best plan found so far: every plan left is at least
    as costly, so the answer is the same as evaluating every plan, and plans that cannot win are
    never simulated at all. A plan whose JCT lower bound exceeds the deadline is skipped. With
    ``screen_slack``, a plan is first screened (few samples) and skipped when fewer than
    ``ceil(confidence·n) − screen_slack`` screening samples are within the deadline - a rule that
    only skips more for a tighter deadline or a higher confidence, so the answer stays monotone
    in both. With ``cost_margin`` too, a plan whose screening samples say it costs more than the best plan found
    so far (:func:`clearly_costlier`), on the screening samples or on the evaluator's sharper
    :meth:`~rubberband.planner.search.Evaluator.mid` sample, is not simulated in full either: on large jobs the
    full simulations of plans that meet the deadline but cannot win were most of the planning time (SHA n=729:
    106 of them at 2x the shortest deadline, their screened cost within 0.2 % of their full cost every one;
    Hyperband R=243 with parallel brackets: 40 near-ties, 26 once the mid sample looks too), and one the mid
    sample ranks costlier than the best is not either (:func:`_may_be_cheaper`; R=243 at 2x the shortest
    deadline: 5 full simulations instead of 26, the same plans over the 200 workloads of bench_planner_gap.py
    planned with 1000 samples).
    """
    space, evaluator, deadline_s = search.space, search.evaluator, search.deadline_s
    seen = set()
    bounded = []
    for order, plan in enumerate(plans):
        key = plan_key(plan)
        if key in seen:
            continue
        seen.add(key)
        cost_lb, jct_lb = lower_bounds(space, evaluator, plan)
        if jct_lb <= deadline_s:
            bounded.append((cost_lb, order, plan))
    bounded.sort(key=lambda x: (x[0], x[1]))
    best = incumbent
    evaluated = 0
    for cost_lb, _, plan in bounded:
        if best is not None and cost_lb >= best[1].cost_mean:
            break
        if screen_slack is not None and not search.kept_by_screen(evaluator.screen(plan), screen_slack):
            continue
        if cost_margin is not None and best is not None and not _may_be_cheaper(evaluator, plan, best[0], cost_margin):
            continue
        res = evaluator.full(plan)
        evaluated += 1
        if search.meets(res) and (best is None or res.cost_mean < best[1].cost_mean):
            best = (plan, res)
    return BaselineResult(best[0] if best else None, best[1] if best else None, evaluated)


def _may_be_cheaper(evaluator: Evaluator, plan: Plan, best: Plan, cost_margin: float) -> bool:
    """Whether ``plan`` may cost less than ``best``, so that its full simulation can change the answer: not
    :func:`clearly_costlier` on the screening samples or on the sharper mid sample, and cheaper than ``best`` on
    the mid sample's mean (both plans on the same samples: a near-tie the mid sample ranks costlier is decided by
    it, as within 0.01 % the full samples would)."""
    if any(clearly_costlier(look(plan), look(best), cost_margin) for look in (evaluator.screen, evaluator.mid)):
        return False
    return evaluator.mid(plan).cost_mean < evaluator.mid(best).cost_mean


def clearly_costlier(candidate: SimResult, best: SimResult, margin: float) -> bool:
    """Whether ``candidate`` costs more than ``best`` by more than ``margin`` of best's mean cost, beyond three
    standard errors of their paired per-sample difference: both results are of the same samples (common random
    numbers), so the difference's spread is small and a few samples tell a clearly costlier plan."""
    d = candidate.cost - best.cost
    n = len(d)
    se = float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return float(d.mean()) - 3.0 * se > margin * float(best.cost.mean())


def shrink(space: PlanSpace, plan: Plan) -> Plan:
    """The elastic version of a plan: per stage only the instances its waves need."""
    out = []
    for st, c in zip(space.stages, plan):
        waves = -(-st.trials // max(1, layout(c.instance_type.workers, c.instances, c.workers).slots))
        out.append(
            StageConfig(
                c.instance_type, count_for_waves(st.trials, c.instance_type.workers, c.workers, waves), c.workers
            )
        )
    return tuple(out)


def best_static(search: PlanSearch) -> BaselineResult:
    """Cheapest static plan meeting the search's goal (None when none does)."""
    return cheapest_feasible(search, static_plans(search.space))


def exact_optimum(search: PlanSearch, *, incumbent: float = math.inf, max_nodes: int = 200_000) -> BaselineResult:
    """Cheapest plan of the whole plan space meeting the search's goal (branch and bound).

    ``incumbent`` (a cost bound) is for callers that know one independently; the planner passes
    none, so the search does not depend on the plan it checks. After ``max_nodes`` search nodes
    (prefix bounds and full simulations) it stops and returns ``capped=True``.
    """
    space, sim, deadline_s = search.space, search.evaluator.sim, search.deadline_s
    f_min = sim.min_factor()
    options = [space.options(i) for i in range(len(space.stages))]
    # fastest possible remaining time after stage i (single wave, best option)
    rest = [0.0] * (len(options) + 1)
    for i in range(len(options) - 1, -1, -1):
        rest[i] = rest[i + 1] + min(stage_min_time(space, i, c, f_min) for c in options[i])
    need = needed_on_time(sim.samples, search.confidence)
    best: list = [incumbent, None, None]
    count = [0, 0]  # full plans simulated, nodes visited
    capped = [False]

    def dfs(prefix: tuple[StageConfig, ...]) -> None:
        i = len(prefix)
        if i == len(options):
            count[0] += 1
            res = search.evaluator.full(prefix)
            if search.meets(res) and res.cost_mean < best[0]:
                best[:] = [res.cost_mean, prefix, res]
            return
        for config in options[i]:
            if count[1] >= max_nodes:
                capped[0] = True
                return
            count[1] += 1
            candidate = prefix + (config,)
            if i + 1 < len(options):
                cost_lb, barrier = sim.prefix_bounds(candidate)
                if cost_lb >= best[0]:
                    continue
                if int((barrier + rest[i + 1] <= deadline_s).sum()) < need:
                    continue
            dfs(candidate)

    dfs(())
    return BaselineResult(best[1], best[2], count[0], nodes=count[1], capped=capped[0])


class _Running:
    """A bounds view of a bracket's simulator that pays no first-stage start-up (it may be handed instances)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.spot = sim.spot
        self.start_state = RunningState("", 0)

    def min_factor(self) -> float:
        return self.sim.min_factor()


@dataclass
class _View:
    """Holds one bracket's simulator (or its :class:`_Running` view) as an evaluator holds its ``sim``: what
    :func:`~rubberband.planner.baselines.lower_bounds` reads."""

    sim: Simulator | _Running


def parallel_lower_bounds(space, sim: ParallelSimulator, plan: Sequence[StageConfig]) -> tuple[float, float]:
    """Rigorous lower bounds on a parallel plan's mean cost and JCT: per bracket (as
    :func:`~rubberband.planner.baselines.lower_bounds` bounds one SHA run), costs added and
    JCTs maxed; brackets after the first may be handed instances, so their start-up is not
    counted in the cost bound."""
    subspaces = sim.__dict__.setdefault("_subspaces", {})
    # per bracket and its stages' configurations: pool plans share brackets (the knapsack ladders combine them)
    bounds = sim.__dict__.setdefault("_bracket_bounds", {})
    cost, jct = 0.0, 0.0
    for b, (lo, hi) in enumerate(sim.ranges):
        key = (id(space), b)
        if key not in subspaces:
            subspaces[key] = PlanSpace(space.stages[lo:hi], space.types, space.model, space.max_workers)
        sub_space = subspaces[key]
        sub_plan = tuple(plan[lo:hi])
        bkey = (key, plan_key(sub_plan))
        if bkey not in bounds:
            c_b, j_b = lower_bounds(sub_space, _View(sim.subs[b]), sub_plan)
            if b > 0:
                c_b, _ = lower_bounds(sub_space, _View(_Running(sim.subs[b])), sub_plan)
            bounds[bkey] = (c_b, j_b)
        c_b, j_b = bounds[bkey]
        cost += c_b
        jct = max(jct, sim.offsets[b] + j_b)
    cost += float(sim.head_cost(plan, np.full(1, jct))[0])
    return cost, jct
