"""The journal's events as typed models: one pydantic model per event ``type``, a discriminated union over them.

Writers build an event (``J.TrialStarted(trial_id=..., stage=...)``) and hand it to
:meth:`rubberband.executor.journal.Journal.record`; a wrong or misspelt field fails where the event is built
(``extra="forbid"``), not when a later resume reads the line. On disk an event is its fields as the writer
set them (plus ``type`` and ``t``): the same JSON, field for field, as the untyped dicts of journal version 1,
so old journals, reports and tests read alike. docs/executor.md ("Journal events") describes each field.

Reading is tolerant where the journal may come from another version of rubberband: a field this code does not
know is dropped (a newer minor version may add fields), an event ``type`` it does not know is skipped
(:func:`parse_event` returns None). A field it knows with a value of the wrong type is damage:
:func:`parse_event` raises pydantic's ``ValidationError``, which the reader turns into a one-line error naming
the line and the field.

``decision`` events are typed by their ``kind`` too (:mod:`rubberband.executor.decision_events`), a union
nested in this one; a decision kind this code does not know is skipped like an unknown type.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import Field, TypeAdapter

from rubberband.executor.decision_events import DECISIONS, DecisionEvent
from rubberband.executor.event_base import _Event

#: The journal schema this code writes (``run_started.journal_version``). A journal without it is version 1
#: (the untyped journals, same fields); one with a higher version is refused with "upgrade rubberband".
JOURNAL_VERSION = 2


# -- the run ---------------------------------------------------------------------------------------------------


class RunStarted(_Event):
    type: Literal["run_started"] = "run_started"
    run_id: str
    spec_sha256: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    cloud: str = "local"
    deadline_s: float
    trial_runtime: str | None = None
    pid: int | None = None
    on_late: str | None = None
    #: when the user's command began, on the run's clock (before the head and the first instances started): what
    #: went before this event is reported beside the JCT (``result.json`` ``actual.before_start_s``); absent: unknown
    commanded_at: float | None = None
    #: the user's deadline, counting from ``commanded_at``; ``deadline_s`` is what the executor's start left of it,
    #: which the executor works to (:mod:`~rubberband.executor.deadline`). Absent: the two are one (the command's
    #: start unknown, or a journal written before this field)
    deadline_from_command_s: float | None = None
    #: the journal schema; absent in version-1 journals (the writer stamps the current one)
    journal_version: int = 1


class RunResumed(_Event):
    type: Literal["run_resumed"] = "run_resumed"
    run_id: str | None = None
    attempt: int | None = None
    pid: int | None = None
    on_late: str | None = None


class _RunEnded(_Event):
    """How the run ended (the four end events share these fields)."""

    reason: str | None = None
    error: str | None = None  # older journals named the failure here
    best_trial: str | None = None
    best_metric: float | None = None
    rung: dict[str, Any] | None = None
    outcome: str | None = None
    jct_s: float | None = None
    cost_usd: float | None = None


class RunFinished(_RunEnded):
    type: Literal["run_finished"] = "run_finished"


class RunFailed(_RunEnded):
    type: Literal["run_failed"] = "run_failed"


class RunInterrupted(_RunEnded):
    type: Literal["run_interrupted"] = "run_interrupted"


class RunStopped(_RunEnded):
    """Stopped early with a partial result (``--on-late stop``, or the deadline plus the overrun passed)."""

    type: Literal["run_stopped"] = "run_stopped"


class PlanChanged(_Event):
    """The plan the run follows from now; ``changed``: the plan positions whose stage a re-plan changed (their
    prefetch, if any, is void: it is timed again for the new stage)."""

    type: Literal["plan_changed"] = "plan_changed"
    stage: int | None = None
    plan: dict[str, Any]
    changed: list[int] = []


# -- instances -------------------------------------------------------------------------------------------------


class InstanceRequested(_Event):
    """``t`` is the request time; ``instance_type`` the type obtained (``requested_type`` when failover
    obtained another), ``price_hr`` that type's price."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"requested_type"})

    type: Literal["instance_requested"] = "instance_requested"
    id: str
    instance_type: str
    cloud: str | None = None  # the run's cloud when absent
    region: str | None = None
    price_hr: float
    spot: bool = False
    stage: int = 0
    zone: str | None = None
    requested_type: str | None = None


class InstanceReady(_Event):
    type: Literal["instance_ready"] = "instance_ready"
    id: str
    startup_s: float | None = None


class InstanceTerminated(_Event):
    type: Literal["instance_terminated"] = "instance_terminated"
    id: str
    reason: str | None = None


class InstanceLost(_Event):
    """``t`` is when the loss was seen; ``reason`` ``spot-interruption`` or ``lost``."""

    type: Literal["instance_lost"] = "instance_lost"
    id: str
    reason: str | None = None
    instance_type: str | None = None
    stage: int | None = None
    trials: list[str] = []
    losses: int | None = None


class HeadInstance(_Event):
    """The run's billed head instance (head mode only), journaled once by the executor running on it."""

    type: Literal["head_instance"] = "head_instance"
    id: str
    instance_type: str
    cloud: str | None = None
    price_hr: float
    launched_at: float | None = None  # from the provider; the event's time when absent
    grace_s: float = 0.0


# -- stages and trials -----------------------------------------------------------------------------------------


class StageStarted(_Event):
    type: Literal["stage_started"] = "stage_started"
    stage: int
    bracket: int | None = None
    stage_in_bracket: int | None = None
    trials: int | None = None
    to_run: int | None = None
    epochs: int | None = None
    instance_type: str | None = None
    instances: int | None = None
    workers_per_trial: int | None = None
    predicted_duration_s: float | None = None
    offset_s: float | None = None  # parallel brackets: the bracket's planned start offset


class StageFinished(_Event):
    type: Literal["stage_finished"] = "stage_finished"
    stage: int
    bracket: int | None = None
    metrics: dict[str, float | None] = {}
    promoted: list[str] = []
    ranking: list[str] | None = None


class TrialCreated(_Event):
    type: Literal["trial_created"] = "trial_created"
    trial_id: str
    bracket: int
    index: int
    config: dict[str, Any]


class TrialStarted(_Event):
    type: Literal["trial_started"] = "trial_started"
    trial_id: str
    stage: int
    start_epoch: int
    end_epoch: int
    workers: int | None = None
    instances: list[str] = []
    placement: list[str] = []
    from_checkpoint: int | None = None


class Epoch(_Event):
    """From the trial's rank 0, through the sink actor."""

    type: Literal["epoch"] = "epoch"
    trial_id: str
    epoch: int
    metrics: dict[str, float | None] = {}
    seconds: float | None = None


class Checkpoint(_Event):
    """From the trial's rank 0, through the sink actor."""

    type: Literal["checkpoint"] = "checkpoint"
    trial_id: str
    epoch: int
    path: str | None = None


class TrialStopped(_Event):
    """``reason``: finished, failed, interrupted, instance_lost, preempted, or pruned (ASHA stopped it at the rung
    ``stage``, its metric below the rung's cut)."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"lost", "note", "devices", "gpu_ids"})

    type: Literal["trial_stopped"] = "trial_stopped"
    trial_id: str
    stage: int
    reason: str
    metric: float | None = None
    error: str | None = None
    start_epoch: int | None = None
    end_epoch: int | None = None
    seconds: float | None = None
    setup_s: float | None = None
    checkpoint_epoch: int | None = None
    lost: list[str] | None = None  # instance_lost only
    note: str | None = None
    devices: list[str] | None = None  # per rank, the device it trained on
    gpu_ids: list[list[int | str]] | None = None  # per rank, the GPUs Ray assigned it


class TrialPromoted(_Event):
    type: Literal["trial_promoted"] = "trial_promoted"
    trial_id: str
    from_stage: int
    to_stage: int
    metric: float | None = None
    rank: int | None = None


Event = Annotated[
    Union[
        RunStarted,
        RunResumed,
        RunFinished,
        RunFailed,
        RunInterrupted,
        RunStopped,
        PlanChanged,
        DecisionEvent,
        InstanceRequested,
        InstanceReady,
        InstanceTerminated,
        InstanceLost,
        HeadInstance,
        StageStarted,
        StageFinished,
        TrialCreated,
        TrialStarted,
        Epoch,
        Checkpoint,
        TrialStopped,
        TrialPromoted,
    ],
    Field(discriminator="type"),
]
"""Any journal event (discriminated on ``type``)."""

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def _members(union: Any) -> tuple[Any, ...]:
    return get_args(get_args(union)[0])


#: event type -> its model (the members of :data:`Event`, listed once there); ``decision`` events are typed by
#: their kind (:data:`~rubberband.executor.decision_events.DECISIONS`)
MODELS: dict[str, type[_Event]] = {
    model.model_fields["type"].default: model
    for model in _members(Event)
    if isinstance(model, type) and issubclass(model, _Event)
}


def parse_event(raw: dict[str, Any]) -> _Event | None:
    """The typed event of a journal line's object; None for a ``type`` (or a decision ``kind``) this code does not
    know (skipped).

    Fields the model does not know are dropped (a newer minor version's additions); a known field with a
    wrong value raises ``pydantic.ValidationError``.
    """
    kind = raw.get("type")
    model = DECISIONS.get(raw.get("kind")) if kind == "decision" else MODELS.get(kind)  # type: ignore[arg-type]
    if model is None:
        return None
    return model.model_validate({key: value for key, value in raw.items() if key in model.model_fields})


def to_json_dict(event: _Event) -> dict[str, Any]:
    """The event as the journal writes it: ``type``, ``t`` (when set), then the fields its writer set."""
    fields = event.model_dump(exclude_unset=True)
    fields.pop("type", None)
    for name in event.omit_none:
        if fields.get(name, 0) is None:
            del fields[name]
    out: dict[str, Any] = {"type": type(event).model_fields["type"].default}
    kind = type(event).model_fields.get("kind")
    if kind is not None:  # a decision: its kind comes first, as the journal always wrote it
        fields.pop("kind", None)
        fields = {"kind": kind.default, **fields}
    if event.t is not None:
        out["t"] = fields.pop("t", event.t)
    else:
        fields.pop("t", None)
    out.update(fields)
    return out
