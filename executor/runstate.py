"""The run's state as the fold of its journal: instances, trials, stages, and every decision the executor took.

:func:`apply` folds one typed event into a :class:`RunState` (in place): the one place where the run's state
follows from its events. :class:`DecisionState` is the part the executor's decisions hang on — whether the
run's spot stages still buy spot, whether some fell back to on-demand, which planned types failover replaced
(substitutes), how many instances were lost, which instances got a preemption notice or a replacement, which
stages were prefetched, whether the deadline passed, which unavailable types were re-planned around, and
elastic ASHA's phase — so an executor resumed after ``kill -9`` takes up exactly the decisions the one before
had taken (:mod:`rubberband.executor.journal` reads and writes the file; this module has no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rubberband.executor import decision_events as D
from rubberband.executor import events as E
from rubberband.executor.event_base import _Event

#: The reason a backend gives for a spot instance the cloud took back (``check_lost``); not counted as a loss.
SPOT_INTERRUPTION = "spot-interruption"


@dataclass
class InstanceLife:
    """One instance's life as the journal tells it (POSIX seconds)."""

    id: str
    instance_type: str
    cloud: str
    price_hr: float
    spot: bool
    stage: int
    requested_at: float
    ready_at: float | None = None
    terminated_at: float | None = None
    reason: str | None = None
    lost: str | None = None  # why it went away on its own (spot-interruption, lost), from instance_lost


@dataclass
class HeadLife:
    """The run's head instance (head mode): the executor's own machine, billed from its launch until
    ``grace_s`` (the watchdog's results grace) after the run ends; never terminated by the executor."""

    id: str
    instance_type: str
    cloud: str
    price_hr: float
    launched_at: float
    grace_s: float = 0.0


@dataclass
class TrialState:
    trial_id: str
    bracket: int
    index: int
    config: dict[str, Any]
    checkpoint_epoch: int | None = None
    checkpoint_path: str | None = None
    epochs: dict[int, dict[str, float]] = field(default_factory=dict)
    epoch_runs: dict[int, int] = field(default_factory=dict)  # epoch -> how many times it was reported
    epoch_seconds: dict[int, float] = field(default_factory=dict)  # epoch -> its seconds (the last report's)
    finished_stages: dict[int, float | None] = field(default_factory=dict)  # stage (or ASHA rung) -> metric
    promoted_from: set[int] = field(default_factory=set)  # stages (rungs) it was promoted from
    pruned_at: int | None = None  # ASHA: the rung where it was stopped


@dataclass
class StageRecord:
    stage: int
    started_at: float | None = None
    finished_at: float | None = None
    predicted_duration_s: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    promoted: list[str] = field(default_factory=list)


@dataclass
class DecisionState:
    """What the executor has decided so far, folded from its ``decision`` and ``instance_lost`` events."""

    on_spot: bool = True  # the run's spot stages still buy spot (False once the spot policy moved them)
    fell_back: bool = False  # some spot stage's instances were bought on-demand
    substitutes: dict[str, str] = field(default_factory=dict)  # planned type key -> the key failover obtained
    noticed: dict[str, float] = field(default_factory=dict)  # instance -> when its preemption notice was taken
    replaced: set[str] = field(default_factory=set)  # instances whose replacement was requested
    prefetched: set[int] = field(default_factory=set)  # stages whose extra instances were requested ahead
    deadline_passed: bool = False
    replanned_around: set[str] = field(default_factory=set)  # unavailable type keys a failover re-plan answered
    lost: set[str] = field(default_factory=set)  # instances handled as lost
    losses: int = 0  # instances lost over the run
    counted_losses: int = 0  # toward the loss limit: no spot interruptions, since an attempt last ended
    asha_phase: int = 0  # elastic ASHA: the phase of the rung ladder entered last


@dataclass
class RunState:
    """Everything resume and accounting need, rebuilt from the journal."""

    run_id: str
    spec_sha256: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    cloud: str
    deadline_s: float
    started_at: float
    first_started_at: float
    #: how long the user's command ran before the executor started (``run_started.commanded_at``: loading, planning,
    #: in head mode the head's boot and the upload): part of the result's JCT, which counts from the command
    before_start_s: float = 0.0
    #: how much of the head's start ran before the executor's first start (the command began it while planning:
    #: ``head_started.requested_at``); the plan counts the whole start (``Plan.head_start_s``) after it
    head_early_s: float = 0.0
    #: the user's deadline, counting from their command (``deadline_s`` counts from the executor's start)
    deadline_from_command_s: float | None = None
    attempts: int = 1
    status: str = "running"  # running | finished | stopped | failed | interrupted
    ended_at: float | None = None
    end_reason: str | None = None
    result: dict[str, Any] | None = None
    instances: dict[str, InstanceLife] = field(default_factory=dict)
    head: HeadLife | None = None  # the billed head instance (head mode only)
    trials: dict[str, TrialState] = field(default_factory=dict)
    stages: dict[int, StageRecord] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # each as journaled
    choices: DecisionState = field(default_factory=DecisionState)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def completed_stages(self) -> list[int]:
        return sorted(s for s, rec in self.stages.items() if rec.finished_at is not None)


def start_state(first: E.RunStarted) -> RunState:
    """The state a journal's ``run_started`` event begins."""
    t = first.t if first.t is not None else 0.0
    return RunState(
        run_id=first.run_id,
        spec_sha256=first.spec_sha256,
        spec=first.spec,
        plan=first.plan,
        cloud=first.cloud,
        deadline_s=first.deadline_s,
        started_at=t,
        first_started_at=t,
        before_start_s=max(0.0, t - first.commanded_at) if first.commanded_at is not None else 0.0,
        deadline_from_command_s=first.deadline_from_command_s,
    )


def fold(events: list[dict[str, Any]] | list[_Event]) -> RunState:
    """The state of a list of events (typed, or raw journal objects), the first being ``run_started``.

    Raw objects are validated (pydantic ``ValidationError`` on damage); unknown types are skipped.
    """
    typed = [e if isinstance(e, _Event) else E.parse_event(e) for e in events]
    first = typed[0]
    if not isinstance(first, E.RunStarted):
        raise ValueError("a journal begins with run_started")
    state = start_state(first)
    for event in typed[1:]:
        if event is not None:
            apply(state, event)
    return state


def apply(state: RunState, event: _Event) -> None:
    """Fold one event into ``state`` (in place): the one place where the run's state follows from its events."""
    t = event.t if event.t is not None else 0.0
    if isinstance(event, D._Decision):
        state.decisions.append({**E.to_json_dict(event), "t": t})
        if isinstance(event, D.HeadStarted) and state.attempts == 1 and event.requested_at is not None:
            state.head_early_s = max(0.0, state.first_started_at - event.requested_at)
        _decide(state.choices, event, t)
        return
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event, t)


# -- run, plan and instances --------------------------------------------------------------------------------------


def _resumed(state: RunState, event: Any, t: float) -> None:
    if state.status != "running":  # the attempt before ended (gave up, stopped): its losses no longer count
        state.choices.counted_losses = 0
    state.attempts += 1
    state.status, state.ended_at, state.end_reason = "running", None, None
    state.started_at = t


def _ended(state: RunState, event: Any, t: float) -> None:
    state.status = _END_STATUS[type(event)]
    state.ended_at = t
    state.end_reason = event.reason or event.error
    if isinstance(event, E.RunFinished):
        state.result = E.to_json_dict(event)


def _plan_changed(state: RunState, event: Any, t: float) -> None:
    state.plan = event.plan
    state.choices.prefetched -= set(event.changed)  # re-planned stages' prefetch is timed again


def _requested(state: RunState, event: Any, t: float) -> None:
    state.instances[event.id] = InstanceLife(
        id=event.id,
        instance_type=event.instance_type,
        cloud=event.cloud if event.cloud is not None else state.cloud,
        price_hr=event.price_hr,
        spot=event.spot,
        stage=event.stage,
        requested_at=t,
    )


def _head(state: RunState, event: Any, t: float) -> None:
    state.head = HeadLife(
        id=event.id,
        instance_type=event.instance_type,
        cloud=event.cloud if event.cloud is not None else state.cloud,
        price_hr=event.price_hr,
        launched_at=event.launched_at if event.launched_at is not None else t,
        grace_s=event.grace_s,
    )


def _ready(state: RunState, event: Any, t: float) -> None:
    if event.id in state.instances:
        state.instances[event.id].ready_at = t


def _lost(state: RunState, event: Any, t: float) -> None:
    reason = event.reason if event.reason is not None else "lost"
    if event.id in state.instances:
        state.instances[event.id].lost = reason
    choices = state.choices
    if event.id not in choices.lost:
        choices.lost.add(event.id)
        choices.losses += 1
        choices.counted_losses += reason != SPOT_INTERRUPTION


def _terminated(state: RunState, event: Any, t: float) -> None:
    life = state.instances.get(event.id)
    if life is not None and life.terminated_at is None:
        life.terminated_at, life.reason = t, event.reason


# -- trials and stages ---------------------------------------------------------------------------------------------


def _created(state: RunState, event: Any, t: float) -> None:
    state.trials[event.trial_id] = TrialState(event.trial_id, event.bracket, event.index, dict(event.config))


def _epoch(state: RunState, event: Any, t: float) -> None:
    trial = state.trials.get(event.trial_id)
    if trial is not None:
        trial.epochs[event.epoch] = dict(event.metrics)
        trial.epoch_runs[event.epoch] = trial.epoch_runs.get(event.epoch, 0) + 1
        if event.seconds is not None:
            trial.epoch_seconds[event.epoch] = float(event.seconds)


def _checkpoint(state: RunState, event: Any, t: float) -> None:
    trial = state.trials.get(event.trial_id)
    if trial is not None and (trial.checkpoint_epoch is None or event.epoch >= trial.checkpoint_epoch):
        trial.checkpoint_epoch, trial.checkpoint_path = event.epoch, event.path


def _trial_stopped(state: RunState, event: Any, t: float) -> None:
    trial = state.trials.get(event.trial_id)
    if trial is None:
        return
    if event.reason == "finished":
        trial.finished_stages[event.stage] = event.metric
    elif event.reason == "pruned":
        trial.pruned_at = event.stage
    ckpt = event.checkpoint_epoch
    if ckpt is not None and (trial.checkpoint_epoch is None or ckpt > trial.checkpoint_epoch):
        trial.checkpoint_epoch = ckpt


def _promoted(state: RunState, event: Any, t: float) -> None:
    trial = state.trials.get(event.trial_id)
    if trial is not None:
        trial.promoted_from.add(event.from_stage)


def _stage_started(state: RunState, event: Any, t: float) -> None:
    record = state.stages.setdefault(event.stage, StageRecord(event.stage))
    record.started_at = record.started_at or t
    record.predicted_duration_s = event.predicted_duration_s


def _stage_finished(state: RunState, event: Any, t: float) -> None:
    record = state.stages.setdefault(event.stage, StageRecord(event.stage))
    record.finished_at = t
    record.metrics = dict(event.metrics)
    record.promoted = list(event.promoted)


_END_STATUS: dict[type, str] = {
    E.RunFinished: "finished",
    E.RunFailed: "failed",
    E.RunInterrupted: "interrupted",
    E.RunStopped: "stopped",
}

_HANDLERS: dict[type, Callable[[RunState, Any, float], None]] = {
    E.RunResumed: _resumed,
    **{end: _ended for end in _END_STATUS},
    E.PlanChanged: _plan_changed,
    E.InstanceRequested: _requested,
    E.HeadInstance: _head,
    E.InstanceReady: _ready,
    E.InstanceLost: _lost,
    E.InstanceTerminated: _terminated,
    E.TrialCreated: _created,
    E.Epoch: _epoch,
    E.Checkpoint: _checkpoint,
    E.TrialStopped: _trial_stopped,
    E.TrialPromoted: _promoted,
    E.StageStarted: _stage_started,
    E.StageFinished: _stage_finished,
}


# -- decisions ------------------------------------------------------------------------------------------------------


def _decide(choices: DecisionState, event: D._Decision, t: float) -> None:
    """Fold one decision into the decision state."""
    if isinstance(event, D.SpotDecision):
        choices.on_spot = event.market == "spot"
        choices.fell_back = choices.fell_back or not choices.on_spot
    elif isinstance(event, D.Failover):
        if event.requested_market == "spot" and event.obtained_market == "on_demand":
            choices.fell_back = True
        if event.substituted and event.requested_key and event.obtained_key:
            choices.substitutes[event.requested_key] = event.obtained_key
    elif isinstance(event, D.NoticeTaken):
        choices.noticed.setdefault(event.id, t)
    elif isinstance(event, D.Replace) and event.id is not None:
        choices.replaced.add(event.id)
    elif isinstance(event, D.Prefetch):
        choices.prefetched.add(event.stage)
    elif isinstance(event, D.DeadlinePassed):
        choices.deadline_passed = True
    elif isinstance(event, D.Replan) and event.trigger == "failover":
        choices.replanned_around.update(event.unavailable)
    elif isinstance(event, D.AshaPhase):
        choices.asha_phase = max(choices.asha_phase, event.phase)
