"""Lower bounds on the cost of any plan of a plan space: what a plan's cost is measured against (issue 32).

* :func:`work_bound`: every trial-epoch at the cheapest dollars per epoch of any (type, width) at the median
  epoch time; no idle instance, no start-up, no task overhead, and no deadline. It is what the quickstart's
  "plan / work bound" figure divides by; at a tight deadline the plan must buy speed (wider trials, faster
  types, instances idle in a stage's last wave) that this bound never pays for, so its slack grows as the
  deadline tightens, whatever the planner does.
* :func:`deadline_bound`: the same accounting made rigorous and deadline-aware. Each stage option (type,
  width, count) gets a time lower bound (:func:`stage_min_time`: its waves at the smallest straggler factor,
  the cheapest task start) and a cost lower bound (:func:`stage_min_cost`: its tasks' compute and overheads on
  the whole instances hosting them; the first stage's instances' shortest start-up); a multiple-choice knapsack picks one option per
  stage minimising the summed cost with the summed time (one bracket after another; per bracket when they run
  side by side) within the deadline. Every plan meeting the deadline has every stage's cost and time at or
  above its option's bounds, so the knapsack's minimum is below the optimum. With ``Accounting(expected=True)``
  it bounds the expected cost instead (median compute, mean start-up).

Measured on the quickstart (SHA n=81, three types, bench/bench_planner.py): plan / work bound 1.62, 1.16, 1.10 at
1.2x, 1.5x, 2x the shortest feasible deadline, of which start-ups are 35 %, 8 % and 5 % of the plan's cost (its
compute is within 3 % of the work bound): a tight deadline needs many instances, and each one boots, billed,
for a minute or two. Plan / expected deadline-aware bound: 1.33, 1.07, 1.04; what is left is the start-up of
instances added after the first stage and the idle time while they boot ahead of their stage, which no
per-stage bound can charge (a stage's new instances depend on the stage before). Over the gap suite
(bench/bench_planner_gap.py) the exact optimum sits a median 1.08x (p95 1.41x) above the expected bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rubberband.planner.search import PlanSpace, widths_for
from rubberband.planner.plan_space import StageConfig, layout

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
    cheapest start, on whole instances: a trial spanning several instances holds them all, and trials sharing an
    instance's slots keep it billed until the last of them ends, so the instances hosting the tasks are billed
    for at least ``⌈tasks / slots per instance⌉`` task times (the idle slots of a part-filled instance paid too)."""
    st = space.stages[i]
    t = config.instance_type
    lay = layout(t.workers, config.instances, config.workers)
    task = st.epochs_this_stage * space.model.epoch_time(t.device, config.workers, lay.nodes) * f_min
    task += _min_overhead(space, i)
    if config.workers > t.workers:
        instance_tasks = st.trials * -(-config.workers // t.workers)
    else:
        instance_tasks = -(-st.trials // (t.workers // config.workers))
    return instance_tasks * task * t.price_hr / 3600.0


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


@dataclass(frozen=True)
class Accounting:
    """How :func:`deadline_bound` counts: ``min_factor``, the simulator's smallest compute factor (rigorous for
    every sample); ``expected``, the bound of the expected cost instead (median compute, mean start-up: what a
    finite sample of the simulator may come in under, but the slack stragglers and the start-up spread do not
    explain); ``running``, the first stage's instances are already up (no start-up)."""

    min_factor: float = 1.0
    expected: bool = False
    running: bool = False

    @property
    def factor(self) -> float:
        return 1.0 if self.expected else self.min_factor

    def boot(self, samples: tuple[float, ...]) -> float:
        return sum(samples) / len(samples) if self.expected else min(samples)


def deadline_bound(space: PlanSpace, deadline_s: float, accounting: Accounting, *, parallel: bool = False) -> float:
    """A lower bound on the mean cost of any plan of ``space`` whose JCT can be within ``deadline_s`` (module
    docstring), counted as ``accounting`` says: brackets one after another share the deadline, side by side
    (``parallel``) each has it whole. ``inf`` when no plan can be that fast."""
    groups = [list(range(len(space.stages)))]
    if parallel:
        groups = [list(range(first, end)) for first, end in space.brackets()]
    total = 0.0
    for g, stages in enumerate(groups):
        # with parallel brackets a later bracket may be handed running instances: no start-up in its bound
        startup = not accounting.running and (g == 0 or not parallel)
        total += _knapsack_bound(space, stages, deadline_s, accounting, startup)
    return total


def _knapsack_bound(
    space: PlanSpace, stages: list[int], deadline_s: float, accounting: Accounting, startup: bool
) -> float:
    """Minimum Σ cost bounds over one option per stage of ``stages`` with Σ time bounds within ``deadline_s``."""
    step = deadline_s / BUCKETS
    f_min = accounting.factor
    f = np.zeros(BUCKETS + 1)  # least cost with the time so far within b buckets
    for k, i in enumerate(stages):
        g = np.full(BUCKETS + 1, np.inf)
        for c in space.options(i):
            t = c.instance_type
            d = stage_min_time(space, i, c, f_min)
            cost = stage_min_cost(space, i, c, f_min)
            if k == 0 and startup:
                boot = accounting.boot(space.model.startup(t.cloud, t.name).samples_s)
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
