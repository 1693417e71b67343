"""What the executor's loop observes, as typed events handed to the scheduler.

Everything that happens to a run reaches its scheduler as one of these: an instance came up or was lost, a
preemption notice came, a trial's task ended (finished, failed, stopped on a notice, or died with its
instance), an epoch was reported, the plan changed under a re-plan, or simply time passed (:class:`Tick`, the
clock the deadline, prefetch, bracket offsets and liveness are timed by). The loop
(:mod:`rubberband.executor.loop`) gathers them from the cluster, the cloud and the clock; the scheduler
(:mod:`rubberband.executor.scheduling`) answers each with actions (:mod:`rubberband.executor.actions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union


@dataclass(frozen=True)
class Begin:
    """The run starts (``resumed``: an earlier executor ran it before)."""

    resumed: bool = False


@dataclass(frozen=True)
class InstanceUp:
    """A requested instance is up and joined (``token``: its request)."""

    token: str
    instance_id: str


@dataclass(frozen=True)
class InstancesLost:
    """Instances the cloud or Ray no longer show (id → ``spot-interruption`` | ``lost``), already journaled and
    billed; ``stage``: the stage each served; ``trials``: the trials that ran on them (each reported as a
    :class:`TrialEnded` ``lost`` before), in the order they go first again."""

    lost: dict[str, str]
    stage: dict[str, int]
    trials: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoticeSeen:
    """A preemption notice for ``instance_id`` (journaled): its trials stop after their next checkpoint.
    ``trials``: those running on it now."""

    instance_id: str
    stage: int
    trials: tuple[str, ...]


class Ending(str, Enum):
    """How a trial's task ended."""

    FINISHED = "finished"  # trained to its end epoch (``metric`` set; ``error`` when it reported none)
    FAILED = "failed"  # its training raised, or its workers died while its instances live on
    PREEMPTED = "preempted"  # stopped after a checkpoint on its instance's preemption notice
    LOST = "lost"  # its instance went away: it restarts from its checkpoint elsewhere


@dataclass(frozen=True)
class TrialEnded:
    """A trial's task in stage ``stage`` ended (journaled). ``instances``: the instances it ran on; ``cold``: it was
    the first task on one of them (its time includes the workers' start); ``seconds``: how long it took;
    ``gone``: (lost) the instances found gone and why."""

    trial_id: str
    stage: int
    ending: Ending
    instances: tuple[str, ...]
    metric: float | None = None
    error: str | None = None
    seconds: float = 0.0
    cold: bool = False
    gone: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EpochReported:
    """A trial's rank 0 reported an epoch (through the journal sink)."""

    trial_id: str
    epoch: int


@dataclass(frozen=True)
class PlanFollowed:
    """A re-plan changed the stages at these plan positions (not started yet); the lanes follow it."""

    changed: tuple[int, ...]


@dataclass(frozen=True)
class Tick:
    """Time passed: ``elapsed_s`` since the job first started."""

    elapsed_s: float


Observation = Union[Begin, InstanceUp, InstancesLost, NoticeSeen, TrialEnded, EpochReported, PlanFollowed, Tick]
"""Anything the loop observes."""
