"""The run journal: an append-only JSONL file of everything that happened in a run.

Every line is one event ``{"type": ..., "t": <POSIX seconds>, ...}`` written with a single
``write`` on an ``O_APPEND`` descriptor and fsync'd, so a crash (even ``kill -9``) leaves at
most a torn last line, which the reader skips. The controller writes run, stage, trial,
instance and decision events; trial workers write epoch and checkpoint events through the
:class:`JournalSink` Ray actor (``event_sink`` in docs/training-api.md, "The runtime underneath").

:func:`read_state` folds the events into a :class:`RunState`: what resume continues from
and what accounting bills.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rubberband.errors import RunDirError
from rubberband.executor.clock import WALL_CLOCK, Clock

JOURNAL_NAME = "journal.jsonl"

# Event types (the "type" field). docs/executor.md describes each one's fields.
RUN_STARTED = "run_started"
RUN_RESUMED = "run_resumed"
RUN_FINISHED = "run_finished"
RUN_FAILED = "run_failed"
RUN_INTERRUPTED = "run_interrupted"
RUN_STOPPED = "run_stopped"  # stopped early with a partial result (--on-late stop, or deadline + overrun)
INSTANCE_REQUESTED = "instance_requested"
INSTANCE_READY = "instance_ready"
INSTANCE_TERMINATED = "instance_terminated"
INSTANCE_LOST = "instance_lost"
HEAD_INSTANCE = "head_instance"  # the run's billed head instance (head mode), once per head
TRIAL_CREATED = "trial_created"
TRIAL_STARTED = "trial_started"
EPOCH = "epoch"
CHECKPOINT = "checkpoint"
TRIAL_STOPPED = "trial_stopped"
TRIAL_PROMOTED = "trial_promoted"
STAGE_STARTED = "stage_started"
STAGE_FINISHED = "stage_finished"
DECISION = "decision"
PLAN_CHANGED = "plan_changed"
END_EVENTS = (RUN_FINISHED, RUN_FAILED, RUN_INTERRUPTED, RUN_STOPPED)


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()


def append_event(path: str | Path, event: dict[str, Any]) -> dict[str, Any]:
    """Append one event (adds ``t`` when missing) durably; return it."""
    event = dict(event)
    event.setdefault("t", time.time())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, _line(event))
        os.fsync(fd)
    finally:
        os.close(fd)
    return event


class Journal:
    """The writer side, owned by the controller."""

    def __init__(self, run_dir: str | Path, *, clock: Clock = WALL_CLOCK) -> None:
        self.clock = clock  # stamps each event's ``t`` (virtual time in a run on a simulated cluster)
        self.path = Path(run_dir) / JOURNAL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        """A crash mid-write may leave a line without its newline: end it so new events start clean."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                if handle.tell() == 0:
                    return
                handle.seek(-1, os.SEEK_END)
                torn = handle.read(1) != b"\n"
        except FileNotFoundError:
            return
        if torn:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)

    def record(self, type: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("t", self.clock.time())
        return append_event(self.path, {"type": type, **fields})

    def events(self) -> list[dict[str, Any]]:
        return list(iter_events(self.path))


def iter_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """Events in file order; a torn or garbled line (crash mid-write) is skipped."""
    for _, event in numbered_events(path):
        yield event


def numbered_events(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line, event) in file order; a torn or garbled line (crash mid-write) is skipped."""
    try:
        with open(path, "rb") as handle:
            for line, raw in enumerate(handle, start=1):
                try:
                    event = json.loads(raw)
                except ValueError:  # UnicodeDecodeError included
                    continue
                if isinstance(event, dict) and isinstance(event.get("type"), str):
                    yield line, event
    except FileNotFoundError:
        return


class JournalSink:
    """Ray actor body: appends events sent by trial workers (epoch, checkpoint) to the journal.

    Create it with :func:`start_sink`; rank 0 calls ``sink.record.remote(event)``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def record(self, event: dict[str, Any]) -> None:
        append_event(self.path, event)

    def ping(self) -> bool:
        return True


def start_sink(run_dir: str | Path):
    """Start the sink actor on the head (no CPUs needed) and wait until it answers.

    It is pinned to the driver's node (the head) so that losing a worker instance never loses the sink.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor = ray.remote(num_cpus=0, max_restarts=0)(JournalSink).options(scheduling_strategy=here).remote(
        str(Path(run_dir) / JOURNAL_NAME))
    ray.get(actor.ping.remote(), timeout=60)
    return actor


# -- the reader ------------------------------------------------------------------------------

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
    finished_stages: dict[int, float | None] = field(default_factory=dict)  # stage -> metric


@dataclass
class StageRecord:
    stage: int
    started_at: float | None = None
    finished_at: float | None = None
    predicted_duration_s: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    promoted: list[str] = field(default_factory=list)


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
    attempts: int = 1
    status: str = "running"  # running | finished | stopped | failed | interrupted
    ended_at: float | None = None
    end_reason: str | None = None
    result: dict[str, Any] | None = None
    instances: dict[str, InstanceLife] = field(default_factory=dict)
    head: HeadLife | None = None  # the billed head instance (head mode only)
    trials: dict[str, TrialState] = field(default_factory=dict)
    stages: dict[int, StageRecord] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def completed_stages(self) -> list[int]:
        return sorted(s for s, rec in self.stages.items() if rec.finished_at is not None)


def read_state(run_dir: str | Path) -> RunState:
    """Fold the journal of ``run_dir`` into a :class:`RunState` (RunDirError if it is not a run)."""
    path = Path(run_dir) / JOURNAL_NAME
    if not Path(run_dir).is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist; pass the directory `rubberband run` created")
    numbered = list(numbered_events(path))
    events = [event for _, event in numbered]
    if not events or events[0]["type"] != RUN_STARTED:
        raise RunDirError(f"{run_dir} has no journal of a run ({JOURNAL_NAME} missing, empty or its first line "
                          f"damaged); pass the directory `rubberband run` created")
    try:
        return fold(events)
    except _DAMAGE:
        pass
    # A line that parses but does not hold what its event needs (a damaged disk, a hand edit): name it,
    # change nothing. The first prefix of the journal that no longer folds ends at that line.
    low, high = 1, len(events)  # fold(events[:low]) works unless the first event is the damaged one
    while low < high:
        mid = (low + high) // 2
        try:
            fold(events[:mid])
            low = mid + 1
        except _DAMAGE:
            high = mid
    line, event = numbered[low - 1]
    raise RunDirError(f"{path}:{line}: the journal's {event['type']!r} event is damaged (a field is missing or "
                      f"of the wrong type); repair or delete that line (keep a copy), then resume; "
                      f"`rubberband down {run_dir}` ends the run's instances")


_DAMAGE = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def fold(events: list[dict[str, Any]]) -> RunState:
    first = events[0]
    state = RunState(run_id=first["run_id"], spec_sha256=first["spec_sha256"], spec=first["spec"],
                     plan=first["plan"], cloud=first.get("cloud", "local"), deadline_s=first["deadline_s"],
                     started_at=first["t"], first_started_at=first["t"])
    for event in events[1:]:
        kind = event["type"]
        t = event.get("t", 0.0)
        if kind == RUN_RESUMED:
            state.attempts += 1
            state.status, state.ended_at, state.end_reason = "running", None, None
            state.started_at = t
        elif kind == PLAN_CHANGED:
            state.plan = event["plan"]
        elif kind == INSTANCE_REQUESTED:
            state.instances[event["id"]] = InstanceLife(
                id=event["id"], instance_type=event["instance_type"], cloud=event.get("cloud", state.cloud),
                price_hr=float(event["price_hr"]), spot=bool(event.get("spot", False)),
                stage=int(event.get("stage", 0)), requested_at=t)
        elif kind == HEAD_INSTANCE:
            state.head = HeadLife(id=event["id"], instance_type=event["instance_type"],
                                  cloud=event.get("cloud", state.cloud), price_hr=float(event["price_hr"]),
                                  launched_at=float(event.get("launched_at", t)),
                                  grace_s=float(event.get("grace_s", 0.0)))
        elif kind == INSTANCE_READY and event["id"] in state.instances:
            state.instances[event["id"]].ready_at = t
        elif kind == INSTANCE_LOST and event["id"] in state.instances:
            state.instances[event["id"]].lost = event.get("reason", "lost")
        elif kind == INSTANCE_TERMINATED and event["id"] in state.instances:
            life = state.instances[event["id"]]
            if life.terminated_at is None:
                life.terminated_at, life.reason = t, event.get("reason")
        elif kind == TRIAL_CREATED:
            state.trials[event["trial_id"]] = TrialState(event["trial_id"], int(event["bracket"]),
                                                         int(event["index"]), dict(event["config"]))
        elif kind == EPOCH and event.get("trial_id") in state.trials:
            trial = state.trials[event["trial_id"]]
            epoch = int(event["epoch"])
            trial.epochs[epoch] = dict(event.get("metrics", {}))
            trial.epoch_runs[epoch] = trial.epoch_runs.get(epoch, 0) + 1
        elif kind == CHECKPOINT and event.get("trial_id") in state.trials:
            trial = state.trials[event["trial_id"]]
            epoch = int(event["epoch"])
            if trial.checkpoint_epoch is None or epoch >= trial.checkpoint_epoch:
                trial.checkpoint_epoch, trial.checkpoint_path = epoch, event.get("path")
        elif kind == TRIAL_STOPPED and event.get("trial_id") in state.trials:
            trial = state.trials[event["trial_id"]]
            if event.get("reason") == "finished":
                trial.finished_stages[int(event["stage"])] = event.get("metric")
            ckpt = event.get("checkpoint_epoch")
            if ckpt is not None and (trial.checkpoint_epoch is None or ckpt > trial.checkpoint_epoch):
                trial.checkpoint_epoch = int(ckpt)
        elif kind == STAGE_STARTED:
            record = state.stages.setdefault(int(event["stage"]), StageRecord(int(event["stage"])))
            record.started_at = record.started_at or t
            record.predicted_duration_s = event.get("predicted_duration_s")
        elif kind == STAGE_FINISHED:
            record = state.stages.setdefault(int(event["stage"]), StageRecord(int(event["stage"])))
            record.finished_at = t
            record.metrics = dict(event.get("metrics", {}))
            record.promoted = list(event.get("promoted", []))
        elif kind == DECISION:
            state.decisions.append(event)
        elif kind in END_EVENTS:
            state.status = {RUN_FINISHED: "finished", RUN_FAILED: "failed", RUN_INTERRUPTED: "interrupted",
                            RUN_STOPPED: "stopped"}[kind]
            state.ended_at = t
            state.end_reason = event.get("reason") or event.get("error")
            if kind == RUN_FINISHED:
                state.result = event
    return state
