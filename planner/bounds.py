"""Lower bounds on the cost of any plan of a plan space: what a plan's cost is measured against (issue 32).

* :func:`work_bound`: every trial-epoch at the cheapest dollars per epoch of any (type, width) at the median
  epoch time; no idle instance, no start-up, no task overhead, and no deadline. It is what the quickstart's
  "plan / work bound" figure divides by; at a tight deadline the plan must buy speed (wider trials, faster
  types, instances idle in a stage's last wave) that this bound never pays for, so its slack grows as the
  deadline tightens, whatever the planner does.
* :func:`deadline_bound`: the same accounting made rigorous and deadline-aware. Each stage option (type,
  width, count) gets a time lower bound (:func:`stage_min_time`: its waves at the smallest straggler factor,
  the cheapest task start) and a cost lower bound (its tasks' compute and overheads on the worker share of an
  instance; the first stage's instances' shortest start-up); a multiple-choice knapsack picks one option per
  stage minimising the summed cost with the summed time (one bracket after another; per bracket when they run
  side by side) within the deadline. Every plan meeting the deadline has every stage's cost and time at or
  above its option's bounds, so the knapsack's minimum is below the optimum.
"""

from __future__ import annotations

import numpy as np

from rubberband.planner.search import PlanSpace, widths_for
from rubberband.planner.simulator import StageConfig, layout

#: Buckets of the deadline in :func:`deadline_bound`'s knapsack (times are rounded down: still a bound).
BUCKETS = 2000


def stage_min_time(space: PlanSpace, i: int, config: StageConfig, f_min: float) -> float:
    """A lower bound on stage ``i``'s duration on ``config``: its waves of tasks at the smallest compute factor
    ``f_min``, each with the cheapest start a task can have (warm, or a move: whichever the model makes shorter)."""
    st = space.stages[i]
    lay = layout(config.instance_type.workers, config.instances, config.workers)
    task = st.epochs_this_stage * space.model.epoch_time(config.instance_type.device, config.workers, lay.nodes)
    waves = -(-st.trials // max(1, lay.slots))
    return waves * (task * f_min + _min_overhead(space, i))


def _min_overhead(space: PlanSpace, i: int) -> float:
    epochs = space.stages[i].epochs_this_stage
    return min(space.model.task_overhead(epochs, moved) for moved in (False, True))


def stage_min_cost(space: PlanSpace, i: int, config: StageConfig, f_min: float) -> float:
    """A lower bound on stage ``i``'s cost on ``config`` (on demand): each task's compute at ``f_min`` and its
    cheapest start, on its share of an instance (``workers / instance workers``)."""
    st = space.stages[i]
    t = config.instance_type
    lay = layout(t.workers, config.instances, config.workers)
    task = st.epochs_this_stage * space.model.epoch_time(t.device, config.workers, lay.nodes) * f_min
    return st.trials * (task + _min_overhead(space, i)) * config.workers / t.workers * t.price_hr / 3600.0


def work_bound(space: PlanSpace) -> float:
    """Σ trial-epochs × the cheapest $ per epoch of any (type, width) of ``space`` at the median epoch time: no
    idle instance, no start-up, no overhead, no deadline (see the module docstring for its slack)."""
    best = float("inf")
    for t in space.types:
        for w in widths_for(t, space.max_workers):
            nodes = 1 if w <= t.workers else -(-w // t.workers)
            per_epoch = space.model.epoch_time(t.device, w, nodes) * t.price_hr / 3600 * w / t.workers
            best = min(best, per_epoch)
    return sum(s.trials * s.epochs_this_stage for s in space.stages) * best


def deadline_bound(
    space: PlanSpace, deadline_s: float, *, min_factor: float, parallel: bool = False, running: bool = False
) -> float:
    """A rigorous lower bound on the mean cost of any plan of ``space`` whose JCT can be within ``deadline_s``
    (module docstring): brackets one after another share the deadline, side by side (``parallel``) each has it
    whole. ``min_factor``: the simulator's smallest compute factor; ``running``: the first stage's instances are
    already up (no start-up). ``inf`` when no plan can be that fast."""
    groups = [list(range(len(space.stages)))]
    if parallel:
        groups = [list(range(first, end)) for first, end in space.brackets()]
    total = 0.0
    for g, stages in enumerate(groups):
        # with parallel brackets a later bracket may be handed running instances: no start-up in its bound
        startup = not running and (g == 0 or not parallel)
        total += _knapsack_bound(space, stages, deadline_s, min_factor, startup)
    return total


def _knapsack_bound(space: PlanSpace, stages: list[int], deadline_s: float, f_min: float, startup: bool) -> float:
    """Minimum Σ cost bounds over one option per stage of ``stages`` with Σ time bounds within ``deadline_s``."""
    step = deadline_s / BUCKETS
    f = np.zeros(BUCKETS + 1)  # least cost with the time so far within b buckets
    for k, i in enumerate(stages):
        g = np.full(BUCKETS + 1, np.inf)
        for c in space.options(i):
            t = c.instance_type
            d = stage_min_time(space, i, c, f_min)
            cost = stage_min_cost(space, i, c, f_min)
            if k == 0 and startup:
                boot = min(space.model.startup(t.cloud, t.name).samples_s)
                d += boot
                cost += c.instances * boot * t.price_hr / 3600.0
            b = int(d / step)  # rounded down: the knapsack only relaxes
            if b > BUCKETS:
                continue
            shifted = np.full(BUCKETS + 1, np.inf)
            shifted[b:] = f[: BUCKETS + 1 - b] + cost
            np.minimum(g, shifted, out=g)
        f = g
    return float(f[BUCKETS])
