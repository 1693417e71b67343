"""Greedy marginal-benefit planner (RubberBand, EuroSys'21).

Plan space: per stage an instance type, a trial width ``w ≤ max_workers_per_trial`` and an
instance count; stages may use different types and clouds. Only *efficient* instance counts are
considered (those at which the number of waves changes; any other count only adds idle instances).

The search walks from the fastest plan (maximum useful parallelism) towards cheaper plans. Each
step generates one-step changes per stage (one wave more or less, another instance type or a
halved / doubled width at the same number of waves), screens them with a prefix of the Monte
Carlo samples, and takes a cheaper-and-not-slower candidate if there is one, else the candidate
with the best cost-marginal benefit ``M = (cost(X) − cost(Y)) / (JCT(Y) − JCT(X))``.

Monotonicity by construction: the walk itself ignores the deadline and the confidence; it only
*stops* once two consecutive plans have no screening sample within the deadline (a rule that can
only stop later for a looser deadline). Every plan on the walk is evaluated with the full sample
set (common random numbers) and the answer is the cheapest of them that meets the deadline at
the requested confidence. So a looser deadline sees a superset of plans (never a costlier answer)
and a higher confidence a subset (never a cheaper one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from rubberband.catalog import InstanceType
from rubberband.errors import ProfileError
from rubberband.planner.model import PerformanceModel
from rubberband.planner.schedule import Stage
from rubberband.planner.simulator import SimResult, Simulator, StageConfig, efficient_counts, layout

Plan = tuple[StageConfig, ...]


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

    def __init__(self, stages: Sequence[Stage], types: Iterable[InstanceType], model: PerformanceModel,
                 max_workers: int) -> None:
        self.stages = list(stages)
        self.model = model
        self.max_workers = max_workers
        usable = [t for t in types if model.plannable(t.device)]
        if not usable:
            devices = sorted({t.device for t in types})
            raise ProfileError(f"no allowed instance type has a device the profile covers (types offer "
                               f"{', '.join(devices) or 'nothing'}; profile covers "
                               f"{', '.join(sorted(model.devices))}); add device_speed entries to the "
                               f"profile or allow other instance types")
        self.types = sorted(usable, key=lambda t: (t.price_hr, t.key))
        self.skipped = sorted({t.name for t in types if not model.plannable(t.device)})
        self._counts: dict[tuple, list[int]] = {}
        self._frontiers: dict[int, list[StageConfig]] = {}

    def counts(self, stage: int, itype: InstanceType, workers: int) -> list[int]:
        key = (stage, itype.workers, workers)
        if key not in self._counts:
            self._counts[key] = efficient_counts(self.stages[stage].trials, itype.workers, workers)
        return self._counts[key]

    def options(self, stage: int) -> list[StageConfig]:
        """Every efficient configuration of one stage (for the exact optimiser)."""
        out = []
        for t in self.types:
            for w in widths_for(t, self.max_workers):
                for n in self.counts(stage, t, w):
                    out.append(StageConfig(t, n, w))
        return out

    def stage_time(self, stage: int, config: StageConfig) -> float:
        """Deterministic stage time at the median (no start-up): waves × task time."""
        st = self.stages[stage]
        lay = layout(config.instance_type.workers, config.instances, config.workers)
        task = st.epochs_this_stage * self.model.epoch_time(config.instance_type.device, config.workers, lay.nodes)
        return waves_of(st.trials, config) * task

    def stage_estimate(self, stage: int, config: StageConfig) -> tuple[float, float]:
        """Deterministic (duration, cost) of one stage in isolation, at the median start-up."""
        t = config.instance_type
        duration = self.stage_time(stage, config) + self.model.eval_time_s
        startup = self.model.startup(t.cloud, t.name).quantile(0.5)
        return duration, config.instances * t.price_hr / 3600.0 * (duration + startup)

    def frontier(self, stage: int) -> list[StageConfig]:
        """Pareto-optimal configurations of one stage by the isolated estimate, fastest first."""
        if stage not in self._frontiers:
            scored = sorted(((*self.stage_estimate(stage, c), c) for c in self.options(stage)),
                            key=lambda x: (x[0], x[1]))
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

    def neighbours(self, plan: Plan, reach: int = 3) -> list[Plan]:
        """One-step changes: one stage moves 1..reach places down its frontier (cheaper, slower)."""
        out: list[Plan] = []
        for i, config in enumerate(plan):
            front = self.frontier(i)
            keys = [c.key for c in front]
            pos = keys.index(config.key) if config.key in keys else -1
            for step in range(1, reach + 1):
                if pos + step < len(front):
                    out.append(plan[:i] + (front[pos + step],) + plan[i + 1:])
            if pos == -1:  # a plan from elsewhere: offer the frontier points near it
                out.extend(plan[:i] + (c,) + plan[i + 1:] for c in front[:reach])
        return out


@dataclass
class WalkResult:
    """Every plan on the walk with its full-sample result, plus bookkeeping."""

    path: list[tuple[Plan, SimResult]] = field(default_factory=list)
    candidates_evaluated: int = 0
    iterations: int = 0


def plan_key(plan: Plan) -> tuple:
    return tuple(c.key for c in plan)


class Evaluator:
    """Caches screening and full-sample results of plans for one simulator."""

    def __init__(self, sim: Simulator, screen_samples: int) -> None:
        self.sim = sim
        self.screen_samples = min(screen_samples, sim.samples)
        self._screen: dict[tuple, SimResult] = {}
        self._full: dict[tuple, SimResult] = {}

    def screen(self, plan: Plan) -> SimResult:
        key = plan_key(plan)
        if key not in self._screen:
            self._screen[key] = self.sim.simulate(plan, self.screen_samples)
        return self._screen[key]

    def full(self, plan: Plan) -> SimResult:
        key = plan_key(plan)
        if key not in self._full:
            self._full[key] = self.sim.simulate(plan)
        return self._full[key]

    def evaluated_full(self) -> list[SimResult]:
        return list(self._full.values())


def walk(space: PlanSpace, evaluator: Evaluator, deadline_s: float, *, start: Plan | None = None,
         patience: int = 2, max_steps: int = 500) -> WalkResult:
    """Marginal-benefit walk from the fastest plan towards cheaper plans (deadline only stops it)."""
    result = WalkResult()
    current = start or space.fastest()
    cur_screen = evaluator.screen(current)
    result.path.append((current, evaluator.full(current)))
    misses = 0
    for _ in range(max_steps):
        result.iterations += 1
        best = None
        for candidate in space.neighbours(current):
            res = evaluator.screen(candidate)
            result.candidates_evaluated += 1
            saving = cur_screen.cost_mean - res.cost_mean
            if saving <= 1e-9:
                continue
            slower = res.jct_mean - cur_screen.jct_mean
            # cheaper-and-not-slower first (by saving), then by marginal benefit
            score = (1, saving) if slower <= 0 else (0, saving / slower)
            if best is None or score > best[0]:
                best = (score, candidate, res)
        if best is None:
            break
        current, cur_screen = best[1], best[2]
        result.path.append((current, evaluator.full(current)))
        if int((cur_screen.jct <= deadline_s).sum()) == 0:
            misses += 1
            if misses >= patience:
                break
        else:
            misses = 0
    return result
