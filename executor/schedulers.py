"""The scheduler a plan's job asks for: SHA and Hyperband on lanes, or ASHA."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rubberband.executor.asha import AshaScheduler
from rubberband.executor.decisions import LossPolicy
from rubberband.executor.scheduling import Scheduler
from rubberband.executor.sha import ShaScheduler

if TYPE_CHECKING:
    from rubberband.executor.run import Job, Settings


def scheduler_for(job: "Job", settings: "Settings", loss_policy: LossPolicy) -> Scheduler:
    """:class:`AshaScheduler` for an ASHA plan; else :class:`ShaScheduler` (SHA, Hyperband in either bracket
    mode: the plan's lanes say which)."""
    info, metric = job.plan.job, job.spec.metric
    if info.scheduler == "asha":
        trials = info.trials if info.trials is not None else job.plan.stages[0].trials
        return AshaScheduler(trials=trials, eta=info.eta, mode=metric.mode, loss_policy=loss_policy)
    return ShaScheduler(
        metric=metric.name,
        mode=metric.mode,
        prefetch=settings.prefetch,
        loss_policy=loss_policy,
        elastic=settings.elastic,
    )
