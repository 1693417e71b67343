"""The run journal: an append-only JSONL file of everything that happened in a run.

Every line is one event ``{"type": ..., "t": <POSIX seconds>, ...}`` written with a single
``write`` on an ``O_APPEND`` descriptor and fsync'd, so a crash (even ``kill -9``) leaves at
most a torn last line, which the reader skips. Each event is a typed model
(:mod:`rubberband.executor.events`, re-exported here: ``J.TrialStarted(...)``). The executor
writes run, stage, trial, instance and decision events (:mod:`~rubberband.executor.decision_events`) with :meth:`Journal.record`; trial workers
write epoch and checkpoint events through the :class:`JournalSink` Ray actor (``event_sink`` in
docs/training-api.md, "The runtime underneath").

The run's state is a fold of the events (:func:`~rubberband.executor.runstate.apply`, in one place, decisions
included: :mod:`rubberband.executor.runstate`). :func:`read_state` folds a
run directory's journal from disk (resume, report, ``down``, accounting); a live :class:`Journal`
keeps its own fold current as events are appended, by whichever process (:attr:`Journal.state`
reads only the bytes appended since it last looked), so the executor never re-reads the file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, TypeVar

from pydantic import ValidationError

from rubberband import install_hint
from rubberband.errors import RunDirError
from rubberband.executor.clock import WALL_CLOCK, Clock
from rubberband.executor.decision_events import (  # noqa: F401  (re-exported: J.Keep etc.)
    AshaPhase,
    DeadlinePassed,
    Down,
    Failover,
    Handoff,
    HeadStarted,
    Keep,
    NoticeTaken,
    NoticeWatcherFailed,
    OrphanHeadStopped,
    Prefetch,
    Release,
    Replace,
    Replan,
    SpotDecision,
)
from rubberband.executor.event_base import _Event
from rubberband.executor.events import (  # noqa: F401  (re-exported: J.TrialStarted etc.)
    EVENT_ADAPTER,
    JOURNAL_VERSION,
    MODELS,
    Checkpoint,
    Epoch,
    Event,
    HeadInstance,
    InstanceLost,
    InstanceReady,
    InstanceRequested,
    InstanceTerminated,
    PlanChanged,
    RunFailed,
    RunFinished,
    RunInterrupted,
    RunResumed,
    RunStarted,
    RunStopped,
    StageFinished,
    StageStarted,
    TrialCreated,
    TrialPromoted,
    TrialStarted,
    TrialStopped,
    _RunEnded,
    parse_event,
    to_json_dict,
)
from rubberband.executor.runstate import (  # noqa: F401  (re-exported: J.RunState etc.)
    DecisionState,
    HeadLife,
    InstanceLife,
    RunState,
    StageRecord,
    TrialState,
    apply,
    fold,
    start_state,
)

JOURNAL_NAME = "journal.jsonl"
AnyEvent = TypeVar("AnyEvent", bound=_Event)


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
#: the end event of each final status
END_EVENT_OF: dict[str, type[_RunEnded]] = {
    "finished": RunFinished,
    "failed": RunFailed,
    "interrupted": RunInterrupted,
    "stopped": RunStopped,
}


def encode_line(event: dict[str, Any]) -> bytes:
    """One journal line: the event as compact JSON and a newline (what :func:`decode_line` reads back)."""
    return (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()


def append_event(path: str | Path, event: dict[str, Any] | _Event, *, durable: bool = True) -> dict[str, Any]:
    """Append one event durably (``t`` from the wall clock when missing: :class:`Journal` stamps its own
    events from the run's clock first); return what was written. ``durable=False`` skips the fsync (a run on
    virtual time, which is never resumed: nothing to recover after a crash).

    A typed event is written as :func:`~rubberband.executor.events.to_json_dict` gives it; a dict is written
    as it is (old-journal fixtures, tools): use the typed events everywhere else.
    """
    data = to_json_dict(event) if isinstance(event, _Event) else dict(event)
    if data.get("t") is None:
        data["t"] = time.time()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, encode_line(data))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return data


class Journal:
    """The writer side, owned by the executor (and ``rubberband down``), with the run's state folded live.

    :meth:`record` appends a typed event. :attr:`state` is the :class:`RunState` of every complete line in the
    file, the sink actor's epoch and checkpoint lines included: the first access folds the file, each later
    one (and each :meth:`record` once :attr:`state` has been read) folds only what was appended since, into
    the same object. So ``journal.state`` is the one source of truth for the run's state.
    """

    def __init__(self, run_dir: str | Path, *, clock: Clock = WALL_CLOCK, durable: bool = True) -> None:
        self.clock = clock  # stamps each event's ``t`` (the run's clock)
        self.durable = durable  # fsync each line (False: a run on virtual time, never resumed)
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JOURNAL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._end_torn_line()
        self._fold = StateFold(self.path, self.run_dir)
        self._live = False  # whether someone has read .state (record then keeps it current)
        self._error: RunDirError | None = None  # a damaged line met while recording: raised by .state
        self._lock = threading.Lock()  # one append-and-fold at a time, should two threads record

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

    def record(self, event: AnyEvent) -> AnyEvent:
        """Append ``event`` durably (``t`` from the clock when it has none; a ``run_started`` gets the current
        ``journal_version``) and fold it into :attr:`state`; return the event as written."""
        if not isinstance(event, _Event):
            raise TypeError(f"Journal.record takes a typed event (rubberband.executor.events), not {type(event)!r}")
        update: dict[str, Any] = {}
        if event.t is None:
            update["t"] = self.clock.time()
        if isinstance(event, RunStarted):
            update["journal_version"] = JOURNAL_VERSION
        if update:
            event = event.model_copy(update=update)
        with self._lock:
            append_event(self.path, event, durable=self.durable)
            if self._live and self._error is None:
                try:  # never raise here: the event is on disk, and teardown records must not fail on a bad line
                    self._fold.advance()
                except RunDirError as exc:
                    self._error = exc
        return event

    @property
    def state(self) -> RunState:
        """The run's state: the fold of every complete line appended so far (RunDirError if damaged)."""
        with self._lock:
            self._live = True
            if self._error is not None:
                raise self._error
            return self._fold.advance()

    @property
    def current(self) -> RunState:
        """The state as folded so far, without looking at the file again: every event this journal recorded is
        in it; lines another writer (the trial workers' sink) appended since the last :attr:`state` are not.
        The loop reads :attr:`state` once a turn and everything else this, so a turn opens the file once."""
        with self._lock:
            folded = self._fold.state
            if not self._live or folded is None or self._error is not None:
                folded = None
        return folded if folded is not None else self.state

    def events(self) -> list[dict[str, Any]]:
        return list(iter_events(self.path))


def iter_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """Events (the raw JSON objects) in file order; a torn or garbled line (crash mid-write) is skipped."""
    for _, event in numbered_events(path):
        yield event


def numbered_events(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line, event) in file order; a torn or garbled line (crash mid-write) is skipped."""
    try:
        with open(path, "rb") as handle:
            for line, raw in enumerate(handle, start=1):
                event = decode_line(raw)
                if event is not None:
                    yield line, event
    except FileNotFoundError:
        return


def decode_line(raw: bytes) -> dict[str, Any] | None:
    """A line's event object, or None for a torn or garbled line (skipped)."""
    try:
        event = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


class JournalSink:
    """Ray actor body: appends events sent by trial workers (epoch, checkpoint) to the journal.

    Create it with :func:`start_sink`; rank 0 calls ``sink.record.remote(J.Epoch(...))``. A dict is validated
    into its typed event first, so nothing the fold would refuse reaches the file.
    """

    def __init__(self, path: str, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable

    def record(self, event: _Event | dict[str, Any]) -> None:
        if not isinstance(event, _Event):
            event = EVENT_ADAPTER.validate_python(event)
        append_event(self.path, event, durable=self.durable)

    def ping(self) -> bool:
        return True


def start_sink(run_dir: str | Path) -> Any:
    """Start the sink actor on the head (no CPUs needed) and wait until it answers.

    It is pinned to the driver's node (the head) so that losing a worker instance never loses the sink.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor: Any = (
        ray.remote(num_cpus=0, max_restarts=0)(JournalSink)
        .options(scheduling_strategy=here)
        .remote(str(Path(run_dir) / JOURNAL_NAME))
    )
    ray.get(actor.ping.remote(), timeout=60)
    return actor


# -- the reader ------------------------------------------------------------------------------


def read_state(run_dir: str | Path) -> RunState:
    """Fold the journal of ``run_dir`` into a :class:`RunState` (RunDirError if it is not a run, if a line is
    damaged, or if a newer rubberband wrote it). A torn last line (a crash mid-write) is skipped."""
    if not Path(run_dir).is_dir():
        raise RunDirError(f"run directory {run_dir} does not exist; pass the directory `rubberband run` created")
    return StateFold(Path(run_dir) / JOURNAL_NAME, Path(run_dir)).advance(final=True)


def _no_run(run_dir: Path) -> RunDirError:
    return RunDirError(
        f"{run_dir} has no journal of a run ({JOURNAL_NAME} missing, empty or its first line "
        f"damaged); pass the directory `rubberband run` created"
    )


class _Damaged(Exception):
    """A line that parses but does not hold what its event needs (field, what is wrong)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem


class StateFold:
    """The fold of one journal file, advanced over what was appended since the last call.

    It remembers the byte offset of the first line it has not folded; :meth:`advance` reads from there to the
    end of the file and folds each complete line. A last line without its newline is a write in progress (or a
    crash's torn line): it is left for the next call, unless ``final`` (a reader of a finished file), where it
    is folded if it parses and skipped if not. A line that does not parse as JSON is skipped (torn); one that
    parses but is not a valid event raises a one-line RunDirError naming the line and the field, and changes
    nothing (the fold stays where it was).
    """

    def __init__(self, path: Path, run_dir: Path) -> None:
        self.path, self.run_dir = path, run_dir
        self.offset = 0  # bytes folded so far
        self.lines = 0  # lines folded so far
        self.state: RunState | None = None
        self.version: int | None = None  # the journal's schema version (from run_started)

    def advance(self, *, final: bool = False) -> RunState:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            chunk = b""
        pieces = chunk.split(b"\n")
        tail = pieces.pop()  # after the last newline: empty, or a line still being written (or torn)
        for raw in pieces:
            self._fold_line(raw)
            self.offset += len(raw) + 1
            self.lines += 1
        if final and tail:
            self._fold_line(tail)
            self.offset += len(tail)
            self.lines += 1
        if self.state is None:
            raise _no_run(self.run_dir)
        return self.state

    def _fold_line(self, raw: bytes) -> None:
        event = decode_line(raw)
        if event is None:
            return
        line = self.lines + 1
        try:
            if self.state is None:
                if event["type"] != RUN_STARTED:
                    raise _no_run(self.run_dir)
                self._check_version(event.get("journal_version", 1), line)  # before its fields: they may differ
                typed = parse_event(event)
                assert isinstance(typed, RunStarted)
                self._check_version(typed.journal_version, line)
                if typed.t is None:
                    raise _Damaged("t", "required field is missing")
                self.version = typed.journal_version
                self.state = start_state(typed)
                return
            typed = parse_event(event)
            if typed is not None:  # a type this code does not know (a newer minor version's): skipped
                apply(self.state, typed)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(the event)"
            problem = "required field is missing" if err["type"] == "missing" else err["msg"]
            raise self._damage(line, event["type"], field, problem) from None
        except _Damaged as exc:
            raise self._damage(line, event["type"], exc.field, exc.problem) from None

    def _check_version(self, version: Any, line: int) -> None:
        if isinstance(version, int) and not isinstance(version, bool) and version > JOURNAL_VERSION:
            raise RunDirError(
                f"{self.path}:{line}: the journal is version {version}, newer than this rubberband "
                f"reads (up to {JOURNAL_VERSION}); upgrade rubberband ({install_hint().replace('pip install', 'pip install -U', 1)}) "
                f"to resume or report this run; `rubberband down {self.run_dir}` ends its instances"
            )

    def _damage(self, line: int, kind: str, field: str, problem: str) -> RunDirError:
        return RunDirError(
            f"{self.path}:{line}: the journal's {kind!r} event is damaged (field {field!r}: "
            f"{problem}); repair or delete that line (keep a copy), then resume; "
            f"`rubberband down {self.run_dir}` ends the run's instances"
        )
