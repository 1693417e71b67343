"""Reference plans: the best static plan and an exact optimum over the planner's plan space.

* **Static**: one instance type, one instance count and one trial width for the whole job (a fixed
  cluster: instances a stage cannot use idle until the job ends). The cheapest one meeting the
  deadline at the confidence. Exact over static plans: candidates are visited in order of a
  rigorous cost lower bound and pruned by it, and by a JCT lower bound.
* **Exact**: depth-first enumeration of every per-stage configuration in the planner's plan space,
  with prefix simulation shared through the simulator's cache and branch-and-bound pruning on the
  cost so far. Exponential: meant for small jobs, to measure the greedy planner's gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rubberband.planner.search import Evaluator, Plan, PlanSpace, widths_for
from rubberband.planner.simulator import SimResult, StageConfig, efficient_counts, layout


@dataclass
class BaselineResult:
    plan: Plan | None
    result: SimResult | None
    evaluated: int


def _stage_min_time(space: PlanSpace, i: int, config: StageConfig, f_min: float) -> float:
    st = space.stages[i]
    lay = layout(config.instance_type.workers, config.instances, config.workers)
    task = st.epochs_this_stage * space.model.epoch_time(config.instance_type.device, config.workers, lay.nodes)
    waves = -(-st.trials // max(1, lay.slots))
    return waves * (task * f_min + space.model.eval_time_s)


def static_plans(space: PlanSpace) -> list[Plan]:
    """Every static plan: (type, width, count) with counts efficient for the largest stage."""
    most = max(s.trials for s in space.stages)
    plans = []
    for t in space.types:
        for w in widths_for(t, space.max_workers):
            for n in efficient_counts(most, t.workers, w):
                plans.append(tuple(StageConfig(t, n, w) for _ in space.stages))
    return plans


def best_static(space: PlanSpace, evaluator: Evaluator, deadline_s: float, confidence: float) -> BaselineResult:
    """Cheapest static plan meeting the deadline at the confidence (None when none does)."""
    f_min = evaluator.sim.min_factor()
    bounded = []
    for plan in static_plans(space):
        t = plan[0].instance_type
        startup = min(space.model.startup(t.cloud, t.name).samples_s)
        times = [_stage_min_time(space, i, c, f_min) for i, c in enumerate(plan)]
        jct_lb = startup + sum(times)
        # all instances live from request to (at least) the start of the last stage
        cost_lb = plan[0].instances * t.price(evaluator.sim.spot) / 3600.0 * (startup + sum(times[:-1]))
        bounded.append((cost_lb, jct_lb, plan))
    bounded.sort(key=lambda x: x[0])
    best: tuple[Plan, SimResult] | None = None
    evaluated = 0
    for cost_lb, jct_lb, plan in bounded:
        if best is not None and cost_lb >= best[1].cost_mean:
            break
        if jct_lb > deadline_s:
            continue
        res = evaluator.full(plan)
        evaluated += 1
        if res.meets(deadline_s, confidence) and (best is None or res.cost_mean < best[1].cost_mean):
            best = (plan, res)
    return BaselineResult(best[0] if best else None, best[1] if best else None, evaluated)


def exact_optimum(space: PlanSpace, evaluator: Evaluator, deadline_s: float, confidence: float,
                  *, incumbent: float = math.inf, max_plans: int = 200_000) -> BaselineResult:
    """Cheapest plan of the whole plan space meeting the deadline (branch and bound)."""
    sim = evaluator.sim
    f_min = sim.min_factor()
    options = [space.options(i) for i in range(len(space.stages))]
    # fastest possible remaining time after stage i (single wave, best option)
    rest = [0.0] * (len(options) + 1)
    for i in range(len(options) - 1, -1, -1):
        rest[i] = rest[i + 1] + min(_stage_min_time(space, i, c, f_min) for c in options[i])
    need = math.ceil(confidence * sim.samples - 1e-9)
    best: list = [incumbent, None, None]
    count = [0]

    def dfs(prefix: tuple[StageConfig, ...]) -> None:
        i = len(prefix)
        if i == len(options):
            count[0] += 1
            res = evaluator.full(prefix)
            if res.meets(deadline_s, confidence) and res.cost_mean < best[0]:
                best[:] = [res.cost_mean, prefix, res]
            return
        if count[0] >= max_plans:
            return
        for config in options[i]:
            candidate = prefix + (config,)
            if i + 1 < len(options):
                cost_lb, barrier = sim.prefix_bounds(candidate)
                if cost_lb >= best[0]:
                    continue
                if int((barrier + rest[i + 1] <= deadline_s).sum()) < need:
                    continue
            dfs(candidate)

    dfs(())
    return BaselineResult(best[1], best[2], count[0])
