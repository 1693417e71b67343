"""The scheduler a plan's job asks for: SHA and Hyperband on lanes, or ASHA."""

from __future__ import annotations

from rubberband.executor.asha import AshaScheduler
from rubberband.executor.decisions import LossPolicy
from rubberband.executor.scheduling import Scheduler
from rubberband.executor.sha import ShaScheduler
from rubberband.plan import Plan
from rubberband.planner.policies import PrefetchPolicy
from rubberband.spec import Metric


def scheduler_for(
    plan: Plan, metric: Metric, loss_policy: LossPolicy, *, prefetch: PrefetchPolicy, elastic: bool
) -> Scheduler:
    """:class:`AshaScheduler` for an ASHA plan; else :class:`ShaScheduler` (SHA, Hyperband in either bracket
    mode: the plan's lanes say which). ``prefetch`` / ``elastic``: the run's settings for SHA's lanes."""
    info = plan.job
    if info.scheduler == "asha":
        trials = info.trials if info.trials is not None else plan.stages[0].trials
        return AshaScheduler(trials=trials, eta=info.eta, mode=metric.mode, loss_policy=loss_policy)
    return ShaScheduler(
        metric=metric.name, mode=metric.mode, prefetch=prefetch, loss_policy=loss_policy, elastic=elastic
    )
