"""Test helpers for the executor: a sleep workload whose winners are known, plans and specs.

The executor tests run the real trial runtime (``rubberband.executor.trials``: Ray actors with a
torch.distributed process group) on real local Ray nodes.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rubberband.plan import CatalogInfo, Distribution, Plan, Prediction, StagePlan
from rubberband.planner.plan_record import job_info
from rubberband.spec import JobSpec

TESTS_DIR = Path(__file__).resolve().parent


WORKLOAD = textwrap.dedent('''
    import time

    def train(config, ctx):
        """Sleep ``epoch_s`` per epoch; loss = quality / (epoch + 1), so low quality wins every stage."""
        state = ctx.load_checkpoint() or {"epochs": []}
        steps = 4
        for epoch in range(ctx.start_epoch, ctx.end_epoch):
            for _ in ctx.batches(range(steps)):
                time.sleep(config["epoch_s"] / steps)
            state["epochs"].append(epoch)
            ctx.report(epoch, loss=config["quality"] / (epoch + 1))
            ctx.save_checkpoint(state)
''')


@dataclass(frozen=True)
class SleepyJob:
    """A SHA job of the sleepy workload (:data:`WORKLOAD`: each epoch sleeps ``epoch_s``) on the local cloud: its
    name, the scheduler's trials, η and epochs, its deadline and seed."""

    name: str = "sleepy"
    trials: int = 9
    eta: int = 3
    min_epochs: int = 1
    max_epochs: int = 3
    epoch_s: float = 1.0
    deadline: str = "10m"
    seed: int = 0

    def write(self, directory: Path) -> Path:
        """The spec and the workload module in ``directory``; returns the spec path."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "sleepy_train.py").write_text(WORKLOAD)
        scheduler = {
            "kind": "sha",
            "trials": self.trials,
            "eta": self.eta,
            "min_epochs": self.min_epochs,
            "max_epochs": self.max_epochs,
        }
        spec = {
            "name": self.name,
            "train": "sleepy_train:train",
            "metric": {"name": "loss", "mode": "min"},
            "search_space": {"quality": {"type": "uniform", "low": 0.0, "high": 1.0}},
            "config": {"epoch_s": self.epoch_s},
            "scheduler": scheduler,
            "deadline": self.deadline,
            "resources": {"clouds": ["local"]},
            "seed": self.seed,
        }
        path = directory / "job.yaml"
        path.write_text(json.dumps(spec))  # JSON is YAML
        return path


def write_job(directory: Path, **job: Any) -> Path:
    """A :class:`SleepyJob` (``job``: its fields, by name; the others their defaults) written in ``directory``;
    returns the spec path."""
    return SleepyJob(**job).write(directory)


def write_hyperband_job(directory: Path, *, epoch_s: float = 1.0, spot_margin_s: float = 0.0) -> tuple[Path, JobSpec]:
    """:func:`write_job` as Hyperband (η 3, 1 to 3 epochs: two brackets) whose brackets run in parallel, with
    ``resources.spot_margin_s``; returns (spec path, spec)."""
    from rubberband.spec import load_spec

    spec_path = write_job(directory / "job", epoch_s=epoch_s)
    data = json.loads(spec_path.read_text())
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 3, "brackets": "parallel"}
    data["resources"]["spot_margin_s"] = spot_margin_s
    spec_path.write_text(json.dumps(data))
    return spec_path, load_spec(spec_path)


def make_plan(
    spec,
    stages: list[tuple[str, int, int]],
    *,
    durations: list[float] | None = None,
    prices: dict[str, float] | None = None,
) -> Plan:
    """A plan for ``spec`` with (instance type, instances, workers per trial) per stage."""
    from rubberband.planner.schedule import stages_for

    sched = spec.scheduler
    schedule = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    assert len(schedule) == len(stages)
    prices = prices or {"local.cpu1": 0.05, "local.cpu2": 0.10, "local.cpu4": 0.20}
    durations = durations or [20.0] * len(stages)
    stage_plans = [
        StagePlan(
            bracket=s.bracket,
            stage=s.index,
            trials=s.trials,
            epochs=s.epochs,
            epochs_this_stage=s.epochs_this_stage,
            cloud="local",
            region="local",
            instance_type=t,
            instances=n,
            workers_per_trial=w,
            predicted_duration_s=d,
            predicted_cost_usd=prices[t] * n * d / 3600,
        )
        for s, (t, n, w), d in zip(schedule, stages, durations)
    ]
    total = sum(durations)
    cost = sum(s.predicted_cost_usd for s in stage_plans)
    return Plan(
        job=job_info(spec),
        catalog=CatalogInfo(clouds=["local"], regions=["local"], dates={"local": "2026-11-21"}),
        deadline_s=spec.deadline_s,
        confidence=spec.confidence,
        stages=stage_plans,
        predicted=Prediction(
            jct_s=Distribution(mean=total, p50=total, p95=total * 1.1),
            cost_usd=Distribution(mean=cost, p50=cost, p95=cost * 1.1),
            p_meet_deadline=0.99,
            stage_duration_s=[Distribution(mean=d, p50=d, p95=d) for d in durations],
            stage_cost_usd=[s.predicted_cost_usd for s in stage_plans],
        ),
    )


def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for the CLI subprocess: the workload importable, runs under tmp_path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS_DIR), env.get("PYTHONPATH", "")] if p)
    env["RUBBERBAND_RUNS_DIR"] = str(tmp_path / "runs")
    return env


def run_pids(run_dir: Path) -> list[int]:
    """Live pids of every process group the run recorded (head and nodes)."""
    from rubberband.cloud.local.provider import LocalProvider

    return LocalProvider(run_dir).pids()


class JournalTail:
    """The events of a run's journal so far, read on from where the last :meth:`events` call stopped.

    A test that waits for an event polls the journal up to a hundred times a second; parsing the whole file each
    time took most of a waiting test's CPU (2.2 of its 3.8 CPU-s over 90 s of a resumed cloud run). This reads
    only what was appended: complete lines (a last line without its newline is a write in progress, read next time), each one
    decoded as ``journal.iter_events`` does (a torn or garbled line is skipped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._events: list[dict] = []

    def events(self) -> list[dict] | None:
        """Every event so far (a new list), or None while there is no journal file."""
        from rubberband.executor import journal as J

        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        complete, newline, _in_progress = chunk.rpartition(b"\n")
        if newline:
            self.offset += len(complete) + 1
            self._events.extend(e for e in map(J.decode_line, complete.split(b"\n")) if e is not None)
        return list(self._events)


def wait_for_events(proc, run_dir: Path, found, *, timeout_s: float, poll_s: float = 0.1):
    """Poll the run's journal until ``found(events)`` returns something truthy while ``proc`` (the executor) runs.

    ``found`` gets every event so far at each poll (read incrementally: :class:`JournalTail`). Returns that value;
    fails the test if the executor ends first or ``timeout_s`` passes.
    """
    import time

    import pytest

    from rubberband.executor import journal as J

    tail = JournalTail(run_dir / J.JOURNAL_NAME)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = tail.events()
        value = found(events) if events is not None else None
        if value:
            return value
        if proc.poll() is not None:
            output = proc.communicate()[1] if proc.stderr is not None else ""
            pytest.fail(f"the run ended (exit {proc.returncode}) before the awaited event: {(output or '')[-3000:]}")
        time.sleep(poll_s)
    pytest.fail(f"no awaited event in the journal within {timeout_s:g}s")


def checkpointed_instance(events: list[dict]) -> str | None:
    """The instance the first trial to save a checkpoint runs on (None before any checkpoint)."""
    from rubberband.executor import journal as J

    started = {e["trial_id"]: e["instances"][0] for e in events if e["type"] == J.TRIAL_STARTED}
    saved = [e for e in events if e["type"] == J.CHECKPOINT and e["trial_id"] in started]
    return started[saved[0]["trial_id"]] if saved else None


def lose_node_once_checkpointed(
    proc, run_dir: Path, *, before_kill=None, timeout_s: float = 150.0, victim_of=checkpointed_instance
):
    """Once a trial has checkpointed, SIGKILL its instance's local Ray node (after ``before_kill(id)``: e.g. the
    cloud reclaims the instance) and wait for the run to end. ``victim_of(events)``: the instance to kill once
    there is one (default: the first trial to checkpoint's). Returns (victim, stdout, stderr); the executor's
    exit status is ``proc.returncode``."""
    import os
    import signal

    from rubberband.cloud.local.provider import LocalProvider

    try:
        victim = wait_for_events(proc, run_dir, victim_of, timeout_s=timeout_s, poll_s=0.05)
        if before_kill is not None:
            before_kill(victim)
        os.killpg(LocalProvider(run_dir).record(victim).pgid, signal.SIGKILL)  # that node, nothing else
        out, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return victim, out, err


class LosingBackend:
    """A backend without Ray for the executor's loss handling: provision returns a new instance at once
    (``i-0``, ``i-1``, … ; the requests, with the market asked for, are kept), and every instance checked is lost
    to a spot interruption. The rest of the executor's contract (cloud.backend.ExecutorBackend) answers the
    neutral values; tests that never reach the backend use it too."""

    cloud = "local"
    ray_auth_mode = "token"
    ray_auth_token_path = None
    device_policy = None
    metadata_url = None

    def __init__(self) -> None:
        self.requests: list = []
        self.provisioned: list[str] = []
        self.terminated: list[str] = []

    def start_head(self, run_id):
        raise AssertionError("LosingBackend starts no Ray head")

    def stop_head(self) -> bool:
        return False

    def wait(self, ids, timeout_s):
        return []

    def list(self, run_id=None):
        return []

    def obtained(self, instance_id):
        return None

    def unavailable(self, itype, spot=False) -> bool:
        return False

    def runtime_env(self, code_dir):
        return None

    def provision(self, request):
        from rubberband.cloud.provider import Instance

        ident = f"i-{len(self.provisioned)}"
        self.requests.append(request)
        self.provisioned.append(ident)
        return [
            Instance(
                id=ident,
                cloud="local",
                instance_type=request.instance_type.name,
                zone="local-a",
                state="running",
                run_id=request.run_id,
            )
        ]

    def check_lost(self, ids):
        return {i: "spot-interruption" for i in ids}

    def terminate(self, ids):
        self.terminated.extend(ids)


def worker_context(directory: Path | str, *, rank: int = 0, world_size: int = 1, **task: Any):
    """Rank ``rank`` of ``world_size``'s real WorkerContext, outside Ray (no process group), checkpointing into
    ``directory``: trial ``b0-t000`` from epoch 0, ``end_epoch`` 3, unless ``task`` sets these or other
    :class:`~rubberband.executor.context.WorkerTask` fields by name (``end_epoch``, ``checkpoint_every``,
    ``max_iterations``...)."""
    from rubberband.executor.context import WorkerContext, WorkerTask

    defaults = {
        "trial_id": "b0-t000",
        "config": {},
        "entry_point": "",
        "code_dir": "",
        "start_epoch": 0,
        "end_epoch": 3,
    }
    fields = {**defaults, **task, "rank": rank, "world_size": world_size, "local_rank": rank}
    worker = WorkerTask(**fields, checkpoint_dir=str(directory))
    return WorkerContext(worker, device="cpu", process_group=None)
