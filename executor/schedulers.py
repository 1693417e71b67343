"""The scheduler a plan's job asks for: SHA and Hyperband on lanes, or ASHA."""

from __future__ import annotations

from rubberband.executor.asha import AshaScheduler
from rubberband.executor.decisions import LossPolicy
from rubberband.executor.scheduling import Scheduler
from rubberband.executor.sha import ShaScheduler
from rubberband.plan import Plan
from rubberband.planner.policies import PrefetchPolicy
from rubberband.search import learns_from_results
from rubberband.spec import JobSpec


def scheduler_for(
    plan: Plan, spec: JobSpec, loss_policy: LossPolicy, *, prefetch: PrefetchPolicy, elastic: bool
) -> Scheduler:
    """:class:`AshaScheduler` for an ASHA plan; else :class:`ShaScheduler` (SHA, Hyperband in either bracket
    mode: the plan's lanes say which), for ``spec``'s metric. ``prefetch`` / ``elastic``: the run's settings for
    SHA's lanes. A sampler that learns is asked for each configuration as its trial starts (ASHA always asks so)."""
    metric = spec.metric
    info = plan.job
    if info.scheduler == "asha":
        trials = info.trials if info.trials is not None else plan.stages[0].trials
        return AshaScheduler(trials=trials, eta=info.eta, mode=metric.mode, loss_policy=loss_policy)
    return ShaScheduler(
        metric=metric,
        prefetch=prefetch,
        loss_policy=loss_policy,
        elastic=elastic,
        ask_at_start=learns_from_results(spec),
    )
