"""What a scheduler asks the executor to do: a small vocabulary of actions, in the spirit of Ray Tune's decisions.

A scheduler (:mod:`rubberband.executor.scheduling`) never touches the cloud, Ray or the journal: it looks at
an observation and a read-only view and answers with these. The loop's :class:`~rubberband.executor.actuator.
Actuator` carries each out (journal, instances, trials, the search) in the order given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from rubberband.executor.placement import Slot


@dataclass(frozen=True)
class CreateTrials:
    """Ask the search for configurations: trials ``index`` … ``index + count − 1`` of ``bracket`` (those a crash
    cut off are asked again; existing ones are kept)."""

    bracket: int
    count: int
    index: int = 0


@dataclass(frozen=True)
class RungResult:
    """``trial_id``'s result at stage ``stage`` came in: the search hears it at once, before the rung's decision
    (``last``: the last rung of its bracket, so the trial is done)."""

    trial_id: str
    stage: int
    metric: float | None
    last: bool


@dataclass(frozen=True)
class OpenStage:
    """Stage ``stage`` starts with ``trials`` trials, ``to_run`` of which have epochs to run (journaled)."""

    stage: int
    trials: int
    to_run: int


@dataclass(frozen=True)
class StartTrial:
    """Train ``trial_id`` from ``start_epoch`` up to ``end_epoch`` (exclusive) on ``slot``, for stage ``stage``."""

    trial_id: str
    stage: int
    start_epoch: int
    end_epoch: int
    slot: Slot


@dataclass(frozen=True)
class FinishFromCheckpoint:
    """A trial whose checkpoint covers its stage's last epoch finished it before an interruption: its metric is
    the journal's (no epoch to run)."""

    trial_id: str
    stage: int
    metric: float


@dataclass(frozen=True)
class Promote:
    """``trial_id`` goes on from ``from_stage`` to ``to_stage`` (ranked ``rank`` among the stage's results)."""

    trial_id: str
    from_stage: int
    to_stage: int
    metric: float | None
    rank: int


@dataclass(frozen=True)
class StopTrial:
    """``trial_id`` goes no further than ``stage`` (ASHA: its result at that rung is below the rung's cut)."""

    trial_id: str
    stage: int
    metric: float | None


@dataclass(frozen=True)
class CloseStage:
    """Stage ``stage`` is over: its results, the trials it promoted and its ranking; the search hears them.
    ``last``: the last rung of its bracket (nothing promoted from it)."""

    stage: int
    metrics: dict[str, float | None]
    promoted: tuple[str, ...]
    ranking: tuple[str, ...]
    last: bool


@dataclass(frozen=True)
class RequestInstances:
    """Request ``count`` instances for stage ``stage`` on the market the spot policy says (``trigger``: start,
    prefetch, preemption, lost, notice). ``waiting``: trials the stage still has to start (the spot decision's
    outlook). ``replaces``: the lost or noticed instance they replace; ``reason``: why, journaled as ``replace``
    (None: an ordinary request). ``prefetch``: the journaled ahead-of-time figures (estimated remaining, lead).
    ``at``: the stage the requesting lane runs now, from which the spot decision looks at the run (default
    ``stage``)."""

    stage: int
    count: int
    trigger: str
    waiting: int = 0
    replaces: str | None = None
    reason: str | None = None
    prefetch: tuple[float, float] | None = None
    at: int | None = None


@dataclass(frozen=True)
class KeepInstance:
    """Carry an instance (its request ``token``) over to stage ``stage``."""

    token: str
    stage: int


@dataclass(frozen=True)
class ReleaseInstance:
    """Release an instance now (terminated; one still booting is released the moment it is up)."""

    token: str
    reason: str
    stage: int


@dataclass(frozen=True)
class HandOver:
    """Give an instance a lane releases to another lane's request of the same type (``request``: its token),
    which is cancelled if not sent yet, else released as soon as its instance is up."""

    token: str
    request: str


@dataclass(frozen=True)
class Replan:
    """Re-plan the remaining work before stage ``stage`` starts (``lane``: the lane at its boundary; None: a
    failover re-plan of every lane's remaining stages)."""

    stage: int
    lane: int | None


@dataclass(frozen=True)
class EnterPhase:
    """Elastic ASHA: phase ``phase`` of the rung ladder begins; it holds ``instances`` (``alive`` now)."""

    phase: int
    instances: int
    alive: int


Action = Union[
    CreateTrials,
    RungResult,
    OpenStage,
    StartTrial,
    FinishFromCheckpoint,
    Promote,
    StopTrial,
    CloseStage,
    RequestInstances,
    KeepInstance,
    ReleaseInstance,
    HandOver,
    Replan,
    EnterPhase,
]
"""Anything a scheduler may ask."""
