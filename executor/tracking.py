"""Experiment tracking people already use — TensorBoard and MLflow — fed from the run's journal.

Why from the journal: every fact a tracker wants is there already (a trial's configuration when it is created, each
epoch's metrics as its rank 0 reports them through the sink actor, how each task of a trial ended, the promotions,
how the run ended), so trackers need no hook in the trial workers (which stay free of torch and of any tracking
package) nor in the executor's loop. :class:`Tracking` follows the journal file from a thread of the executor's
process, the way :class:`~rubberband.executor.journal.StateFold` does (complete lines from a byte offset), and hands
each new event to its sinks: :class:`TensorBoardSink` (tensorboardX event files under ``RUN_DIR/tensorboard/<trial>``)
and :class:`MlflowSink` (one MLflow run per trial, the rubberband run id as a tag). The thread keeps a slow or dead
tracking server from ever stalling the run; a sink that fails is turned off for the rest of the run and its error
kept. What it did is kept in ``RUN_DIR/tracking.json`` (the journal offset it reached, where each sink wrote, the
trials' MLflow run ids), so a resumed run continues the same MLflow runs and the report links them.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Protocol

from rubberband import install_hint
from rubberband.credentials import redact
from rubberband.errors import SpecError
from rubberband.executor.event_base import _Event
from rubberband.executor.events import (
    Epoch,
    RunResumed,
    TrialCreated,
    TrialPromoted,
    TrialStopped,
    _RunEnded,
    parse_event,
)
from rubberband.executor.journal import JOURNAL_NAME, decode_line
from rubberband.files import write_text_atomic
from rubberband.spec import JobSpec

TRACKING_FILE = "tracking.json"
TENSORBOARD_DIR = "tensorboard"
#: How often the follower looks at the journal (seconds): a TensorBoard or MLflow page is a few seconds behind.
FOLLOW_EVERY_S = 2.0
#: How long the end of a run waits for the follower's last pass (a dead tracking server must not hold teardown).
CLOSE_WAIT_S = 60.0
#: A trial's last task ending → its MLflow run's status when the rubberband run ends.
MLFLOW_STATUS = {"finished": "FINISHED", "pruned": "FINISHED", "failed": "FAILED"}


class Sink(Protocol):
    """One tracking tool, told each journal event (it ignores those it does not log)."""

    name: str

    def on(self, event: _Event) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """What ``tracking.json`` keeps of it (where it wrote; what a resumed run needs to continue)."""
        ...


# -- preflight -----------------------------------------------------------------------------------------------


def check_tracking(spec: JobSpec, *, timeout_s: float = 10.0) -> None:
    """Fail fast (before planning or starting anything) when the spec's ``tracking`` cannot work here: a package
    missing, or no MLflow server answering at an http(s) URI. Raises a one-line :class:`SpecError`. (Packages are
    looked for, not imported: MLflow takes seconds to import.)"""
    tracking = spec.tracking
    if tracking.tensorboard:
        _require("tensorboardX", "tensorboard", "tensorboard", "set tensorboard: false")
    if tracking.mlflow is not None:
        _require("mlflow", "mlflow", "mlflow", "remove tracking.mlflow")
        if tracking.mlflow.startswith(("http://", "https://")):
            _check_server(tracking.mlflow, timeout_s)


def _require(module: str, field: str, extra: str, instead: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise SpecError(
            f"spec field 'tracking.{field}': needs {module}, which is not installed; {install_hint(extra)} "
            f"(or {instead})"
        )


def _import_tensorboardx() -> Any:
    _require("tensorboardX", "tensorboard", "tensorboard", "set tensorboard: false")
    import tensorboardX

    return tensorboardX


def _import_mlflow() -> Any:
    _require("mlflow", "mlflow", "mlflow", "remove tracking.mlflow")
    from mlflow.tracking import MlflowClient

    return MlflowClient


def _check_server(uri: str, timeout_s: float) -> None:
    """An MLflow tracking server answers ``GET /health`` with 200 (no retries: a wrong URI fails in seconds)."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # the spec's own http(s) URI
            ok = answer.status == 200
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SpecError(
            f"spec field 'tracking.mlflow': no MLflow tracking server answers at {uri} ({reason}); start one "
            f"(mlflow server --backend-store-uri sqlite:///mlflow.db --port 5000) or fix the URI"
        ) from None
    if not ok:
        raise SpecError(f"spec field 'tracking.mlflow': {url} did not answer 200; is {uri} an MLflow tracking server?")


# -- the sinks -----------------------------------------------------------------------------------------------


class TensorBoardSink:
    """TensorBoard event files, one folder per trial (``RUN_DIR/tensorboard/<trial>``): each reported metric as a
    scalar at its epoch (the step), the epoch's seconds, and the trial's configuration as text.
    ``tensorboard --logdir RUN_DIR/tensorboard`` shows every trial side by side."""

    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        self._summary_writer = _import_tensorboardx().SummaryWriter
        self.logdir = run_dir / TENSORBOARD_DIR
        self._writers: dict[str, Any] = {}

    def _writer(self, trial_id: str) -> Any:
        if trial_id not in self._writers:
            self._writers[trial_id] = self._summary_writer(logdir=str(self.logdir / trial_id), flush_secs=30)
        return self._writers[trial_id]

    def on(self, event: _Event) -> None:
        if isinstance(event, TrialCreated):
            text = "\n".join(f"    {k}: {v!r}" for k, v in sorted(event.config.items()))
            self._writer(event.trial_id).add_text("config", text, 0, walltime=event.t)
        elif isinstance(event, Epoch):
            writer = self._writer(event.trial_id)
            for key, value in event.metrics.items():
                if value is not None:
                    writer.add_scalar(key, value, event.epoch, walltime=event.t)
            if event.seconds is not None:
                writer.add_scalar("rubberband/epoch_seconds", event.seconds, event.epoch, walltime=event.t)
        elif isinstance(event, _RunEnded):
            self.close()

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def describe(self) -> dict[str, Any]:
        return {"logdir": TENSORBOARD_DIR}  # relative to the run directory (it may be fetched from a cloud head)


class MlflowSink:
    """One MLflow run per trial in one experiment: its configuration as params, each epoch's metrics (step = the
    epoch), tags for the rubberband run id, trial, bracket, last stage and how its last task ended, and — when the
    rubberband run ends — its final status (FINISHED for a trial that finished or was pruned, FAILED, else KILLED)
    and a ``rubberband.best`` tag on the best trial.

    ``connect``: makes the ``MlflowClient`` (or anything with its methods), called on the first event, on the
    follower's thread (MLflow takes seconds to import; the run does not wait for it); ``known``: what an earlier
    executor of this run kept in ``tracking.json`` (trial → MLflow run id, each trial's last state)."""

    name = "mlflow"

    def __init__(
        self, connect: Callable[[], Any], uri: str, experiment: str, run_id: str, known: dict[str, Any] | None
    ) -> None:
        self._connect, self.uri, self.run_id = connect, uri, run_id
        known = known or {}
        self.experiment = experiment
        self.experiment_id: str | None = known.get("experiment_id")
        self.runs: dict[str, str] = dict(known.get("runs", {}))
        self.states: dict[str, str] = dict(known.get("states", {}))
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            client = self._connect()
            found = client.get_experiment_by_name(self.experiment)
            made = found.experiment_id if found is not None else client.create_experiment(self.experiment)
            self._client, self.experiment_id = client, str(made)
        return self._client

    def on(self, event: _Event) -> None:
        if isinstance(event, TrialCreated):
            self._created(event)
        elif isinstance(event, Epoch) and event.trial_id in self.runs:
            metrics = {k: v for k, v in event.metrics.items() if v is not None}
            if event.seconds is not None:
                metrics["rubberband.epoch_seconds"] = event.seconds
            for key, value in metrics.items():
                self.client.log_metric(self.runs[event.trial_id], key, float(value), _ms(event.t), event.epoch)
        elif isinstance(event, TrialStopped) and event.trial_id in self.runs:
            self.states[event.trial_id] = event.reason
            run = self.runs[event.trial_id]
            self.client.set_tag(run, "rubberband.state", event.reason)
            self.client.set_tag(run, "rubberband.stage", str(event.stage))
        elif isinstance(event, TrialPromoted) and event.trial_id in self.runs:
            self.client.set_tag(self.runs[event.trial_id], "rubberband.promoted_to_stage", str(event.to_stage))
        elif isinstance(event, RunResumed):
            for trial_id, run in self.runs.items():  # the earlier executor ended them; they go on
                if MLFLOW_STATUS.get(self.states.get(trial_id, "")) != "FINISHED":
                    self.client.update_run(run, status="RUNNING")
        elif isinstance(event, _RunEnded):
            self._ended(event)

    def _created(self, event: TrialCreated) -> None:
        if event.trial_id in self.runs:  # an earlier executor of this run created it
            return
        tags = {
            "rubberband.run_id": self.run_id,
            "rubberband.trial_id": event.trial_id,
            "rubberband.bracket": str(event.bracket),
        }
        client = self.client  # connected: the experiment id is known from here on
        run = client.create_run(
            self.experiment_id, start_time=_ms(event.t), tags=tags, run_name=f"{self.run_id}/{event.trial_id}"
        )
        run_id = run.info.run_id
        self.runs[event.trial_id] = run_id
        for key, value in sorted(event.config.items()):
            self.client.log_param(run_id, str(key), str(value)[:6000])  # MLflow's longest param value

    def _ended(self, event: _RunEnded) -> None:
        for trial_id, run in self.runs.items():
            if trial_id == event.best_trial:
                self.client.set_tag(run, "rubberband.best", "true")
            status = MLFLOW_STATUS.get(self.states.get(trial_id, ""), "KILLED")
            self.client.set_terminated(run, status=status, end_time=_ms(event.t))

    def flush(self) -> None:
        return None  # every call above is one request: nothing is buffered

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "experiment": self.experiment,
            "experiment_id": self.experiment_id,
            "experiment_url": experiment_url(self.uri, self.experiment_id) if self.experiment_id else None,
            "runs": dict(self.runs),
            "states": dict(self.states),
        }


def experiment_url(uri: str, experiment_id: str) -> str | None:
    """The MLflow UI's page of an experiment where the tracking URI is its server's (http, https), else None."""
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}"


def _ms(t: float | None) -> int:
    return int((t if t is not None else time.time()) * 1000)


# -- following the journal -------------------------------------------------------------------------------------


class Tracking:
    """Follows ``RUN_DIR/journal.jsonl`` from ``offset`` and hands each new event to the sinks (see the module
    docstring). :meth:`advance` is one pass; :meth:`start` runs passes every ``every_s`` on a thread until
    :meth:`close`, which makes a last pass (the run's end event included) and closes the sinks."""

    def __init__(self, run_dir: Path, sinks: list[Sink], *, offset: int = 0, every_s: float = FOLLOW_EVERY_S) -> None:
        self.run_dir = Path(run_dir)
        self.sinks = list(sinks)
        self.offset = offset
        self.every_s = every_s
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def advance(self) -> int:
        """Hand the events appended since the last pass to every sink still on; the number of events."""
        try:
            with open(self.run_dir / JOURNAL_NAME, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return 0
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line without its newline is still being written
        events = [e for e in (_typed(raw) for raw in complete.split(b"\n")) if e is not None]
        for sink in self.live():
            try:
                for event in events:
                    sink.on(event)
                sink.flush()
            except Exception as exc:  # noqa: BLE001 - a tracking tool's failure must never fail the run
                self.errors[sink.name] = redact(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        self.offset += len(complete)
        if complete:
            self.save()
        return len(events)

    def live(self) -> list[Sink]:
        return [s for s in self.sinks if s.name not in self.errors]

    def save(self) -> None:
        """Write ``tracking.json``: the offset reached and each sink's description (with its error, if it failed)."""
        data: dict[str, Any] = {"journal_offset": self.offset}
        for sink in self.sinks:
            data[sink.name] = {**sink.describe(), "error": self.errors.get(sink.name)}
        write_text_atomic(self.run_dir / TRACKING_FILE, json.dumps(data, indent=2) + "\n")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="rubberband-tracking", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(self.every_s):
            self.advance()
        self.advance()  # the last pass: everything up to the run's end event
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                self.errors.setdefault(sink.name, redact(f"{type(exc).__name__}: {exc}"))
        self.save()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop following after a last pass (on the thread; inline when it was never started)."""
        self._stop.set()
        if self._thread is None:
            self._follow()
        else:
            self._thread.join(wait_s)


def _typed(raw: bytes) -> _Event | None:
    event = decode_line(raw) if raw else None
    if event is None:
        return None
    try:
        return parse_event(event)
    except ValueError:  # a damaged line: the executor's own fold reports it; trackers skip it
        return None


def read_tracking(run_dir: str | Path) -> dict[str, Any] | None:
    """What ``tracking.json`` of a run directory says (None: the run tracked nothing)."""
    path = Path(run_dir) / TRACKING_FILE
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def open_tracking(spec: JobSpec, run_dir: Path, run_id: str) -> Tracking | None:
    """The spec's trackers for this run (None when it names none), continuing where an earlier executor of the
    same run left off (``tracking.json``)."""
    tracking = spec.tracking
    if not tracking.enabled:
        return None
    known = read_tracking(run_dir) or {}
    sinks: list[Sink] = []
    if tracking.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if tracking.mlflow is not None:
        if tracking.mlflow.startswith(("http://", "https://")):
            _check_server(tracking.mlflow, 10.0)  # from where the executor runs (a cloud run's head), in seconds
        uri = tracking.mlflow
        experiment = tracking.mlflow_experiment or spec.name
        sinks.append(
            MlflowSink(lambda: _import_mlflow()(tracking_uri=uri), uri, experiment, run_id, known.get("mlflow"))
        )
    return Tracking(run_dir, sinks, offset=int(known.get("journal_offset", 0)))
