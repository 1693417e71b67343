"""The executor's decisions as typed journal events: one pydantic model per ``decision`` kind.

Every decision the executor takes (or declines) is journaled as ``{"type": "decision", "kind": ..., ...}``:
the same JSON as journal version 2 wrote, field for field, so old journals, reports and tools read alike. Each
kind is its own model here (``extra="forbid"``: a misspelt field fails where the event is built), joined in
:data:`DecisionEvent`, a union discriminated on ``kind`` nested in the journal's union on ``type``
(:mod:`rubberband.executor.events`). The run's decision state — spot or on-demand, fall-backs, substitutes,
losses, noticed instances, prefetched stages, the deadline passed, types re-planned around — is the fold of
these events (:class:`rubberband.executor.journal.DecisionState`), so a resumed executor takes up the same
decisions. docs/executor.md ("Journal events") describes each kind.

Reading is tolerant as for every event: a field this code does not know is dropped, a kind it does not know
is skipped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import Field

from rubberband.executor.event_base import _Event


class _Decision(_Event):
    """Every decision: ``type`` ``decision``, its ``kind``, and ``t`` (POSIX seconds; the writer fills it in)."""

    type: Literal["decision"] = "decision"


# -- the run's head ----------------------------------------------------------------------------------------------


class HeadStarted(_Decision):
    kind: Literal["head_started"] = "head_started"
    address: str | None = None
    pid: int | None = None
    #: when the head's start began (POSIX time): before ``run_started`` where the command started it while planning
    requested_at: float | None = None


class OrphanHeadStopped(_Decision):
    """A resumed executor stopped the head an earlier one left running."""

    kind: Literal["orphan_head_stopped"] = "orphan_head_stopped"


class Down(_Decision):
    """``rubberband down`` terminated what the run left (``terminated``: how many instances and processes)."""

    kind: Literal["down"] = "down"
    terminated: int = 0


# -- instances ---------------------------------------------------------------------------------------------------


class Keep(_Decision):
    """An instance carried over to stage ``stage`` (``id``: its id, or its request's token while it boots)."""

    kind: Literal["keep"] = "keep"
    id: str
    stage: int


class Release(_Decision):
    kind: Literal["release"] = "release"
    id: str
    stage: int | None = None
    reason: str | None = None


class Handoff(_Decision):
    """Parallel brackets: an instance one bracket releases goes to another bracket's waiting request."""

    kind: Literal["handoff"] = "handoff"
    id: str
    instance_type: str | None = None
    from_stage: int | None = None
    to_stage: int
    from_bracket: int | None = None
    to_bracket: int | None = None
    request: str | None = None
    request_outcome: str | None = None


class Prefetch(_Decision):
    """The next stage's extra instances requested ahead, once this stage's remaining time ≤ the lead time."""

    kind: Literal["prefetch"] = "prefetch"
    stage: int
    count: int
    instance_type: str | None = None
    estimated_remaining_s: float | None = None
    lead_s: float | None = None
    quantile: float | None = None


class Replace(_Decision):
    """A replacement requested for a lost or noticed instance (``id``: None when a stage left without instances
    asks for new ones)."""

    kind: Literal["replace"] = "replace"
    id: str | None = None
    stage: int
    token: str | None = None
    instance_type: str | None = None
    reason: str | None = None
    spot: bool | None = None


class Failover(_Decision):
    """Provisioning obtained another type or market than asked. ``substituted``: another type than the plan's
    (not a spot stage's planned fall-back type bought on-demand); ``requested_key`` → ``obtained_key`` then
    stands in for the planned type in every later stage (the run's substitutes)."""

    kind: Literal["failover"] = "failover"
    id: str
    stage: int | None = None
    requested: str | None = None
    obtained: str | None = None
    requested_key: str | None = None
    obtained_key: str | None = None
    substituted: bool | None = None
    zone: str | None = None
    requested_price_hr: float | None = None
    obtained_price_hr: float | None = None
    attempts: list[str] = []
    requested_market: str | None = None
    obtained_market: str | None = None
    reason: str | None = None


class AshaPhase(_Decision):
    """Elastic ASHA entered phase ``phase`` (the lowest rung still trained toward), which holds ``instances``."""

    kind: Literal["asha_phase"] = "asha_phase"
    phase: int
    instances: int
    alive: int | None = None


# -- spot --------------------------------------------------------------------------------------------------------


class SpotDecision(_Decision):
    """Spot or on-demand for instances of ``for_stage`` requested now (the run's spot stages stay on-demand once
    moved)."""

    kind: Literal["spot"] = "spot"
    stage: int | None = None
    for_stage: int | None = None
    trigger: str | None = None
    id: str | None = None
    previous: str | None = None
    market: Literal["spot", "on_demand"]
    confidence: float | None = None
    quantile: float | None = None
    time_left_s: float | None = None
    work_left_s: float | None = None
    restart_s: float | None = None
    slack_s: float | None = None
    margin_s: float | None = None
    reason: str | None = None


class NoticeTaken(_Decision):
    """A preemption notice for instance ``id``: its trials stop after their next checkpoint."""

    kind: Literal["notice"] = "notice"
    id: str
    stage: int | None = None
    cloud: str | None = None
    action: str | None = None
    notice_time: str | None = None
    trials: list[str] = []
    reason: str | None = None


class NoticeWatcherFailed(_Decision):
    kind: Literal["notice_watcher"] = "notice_watcher"
    id: str
    started: bool = False
    error: str | None = None


# -- the deadline and re-planning --------------------------------------------------------------------------------


class DeadlinePassed(_Decision):
    kind: Literal["deadline_passed"] = "deadline_passed"
    stage: int | None = None
    elapsed_s: float | None = None
    deadline_s: float | None = None
    overrun_s: float | None = None
    note: str | None = None


class Replan(_Decision):
    """A re-plan at a stage boundary (or after a failover, ``trigger: failover``) and what the lateness policy
    made of it; parallel brackets add the remainder's brackets, stages and offsets."""

    kind: Literal["replan"] = "replan"
    stage: int
    elapsed_s: float | None = None
    predicted_remaining_s: float | None = None
    slowdown: float | None = None
    at_risk: bool | None = None
    action: str | None = None
    accepted: bool | None = None
    reason: str | None = None
    on_late: str | None = None
    current_p_meet: float | None = None
    current_jct_p50_s: float | None = None
    current_cost_usd: float | None = None
    proposal_cost_usd: float | None = None
    proposal_p_meet: float | None = None
    proposal_jct_p50_s: float | None = None
    trigger: str | None = None
    unavailable: list[str] = []
    source: str | None = None
    substitutions: dict[str, str] = {}
    bracket: int | None = None
    stages: list[int] = []
    offsets_s: list[float] = []
    starts_in_s: float | None = None


DecisionEvent = Annotated[
    Union[
        HeadStarted,
        OrphanHeadStopped,
        Down,
        Keep,
        Release,
        Handoff,
        Prefetch,
        Replace,
        Failover,
        AshaPhase,
        SpotDecision,
        NoticeTaken,
        NoticeWatcherFailed,
        DeadlinePassed,
        Replan,
    ],
    Field(discriminator="kind"),
]
"""Any decision (discriminated on ``kind``)."""

#: decision kind -> its model (the members of :data:`DecisionEvent`, listed once there)
DECISIONS: dict[str, type[_Decision]] = {
    model.model_fields["kind"].default: model for model in get_args(get_args(DecisionEvent)[0])
}


def decision_model(raw: dict[str, Any]) -> type[_Decision] | None:
    """The model of a raw ``decision`` line (None: a kind this code does not know, skipped)."""
    return DECISIONS.get(raw.get("kind"))  # type: ignore[arg-type]
