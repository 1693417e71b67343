"""Test helpers for the executor: a small real trial runtime, a sleep workload, plans and specs.

``TrialSpec`` / ``TrialRun`` below follow CONTRACT_TRIALS.md (one real Ray actor per worker,
pinned with the node's ``rb-node-<id>`` resource, calling the user's ``train(config, ctx)``,
epoch / checkpoint events to the journal sink, checkpoints as ``epoch-<k>.pt`` + ``latest``)
without torch.distributed, so the executor can be tested before the real runtime
(``rubberband.executor.trials``, branch ``profiler``) is merged. Swapping it in is the one
name :data:`TRIAL_RUNTIME`.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import ray
from ray import cloudpickle

from rubberband.errors import TrainingError
from rubberband.plan import CatalogInfo, Distribution, JobInfo, Plan, Prediction, StagePlan
from rubberband.training import TrainContext

#: The trial runtime the executor tests run with (module defining TrialSpec and TrialRun).
TRIAL_RUNTIME = "executor_helpers"
TESTS_DIR = Path(__file__).resolve().parent


# -- stand-in trial runtime (CONTRACT_TRIALS.md) ---------------------------------------------

@dataclass(frozen=True)
class TrialSpec:
    trial_id: str
    config: dict
    entry_point: str
    code_dir: str
    start_epoch: int
    end_epoch: int
    placement: tuple[str, ...]
    checkpoint_dir: str
    use_gpu: bool = False
    max_iterations: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600

    @property
    def workers(self) -> int:
        return len(self.placement)


@dataclass(frozen=True)
class EpochReport:
    trial_id: str
    epoch: int
    metrics: dict
    seconds: float
    finished_at: float


@dataclass(frozen=True)
class TrialOutcome:
    trial_id: str
    reports: tuple
    checkpoint_epoch: int | None
    iteration_latencies_s: tuple
    setup_s: float
    started_at: float
    finished_at: float


class _Context(TrainContext):
    def __init__(self, spec: TrialSpec, rank: int, sink: Any) -> None:
        self.trial_id, self.start_epoch, self.end_epoch = spec.trial_id, spec.start_epoch, spec.end_epoch
        self.rank, self.world_size, self.local_rank = rank, spec.workers, 0
        self.device, self.process_group = "cpu", None
        self._spec, self._sink = spec, sink
        self.reports: list[EpochReport] = []
        self.latencies: list[float] = []
        self.checkpoint_epoch: int | None = None
        self._epoch_started = time.time()
        self._last_epoch = spec.start_epoch - 1

    def batches(self, iterable: Iterable) -> Iterator:
        for i, item in enumerate(iterable):
            if self._spec.max_iterations is not None and i >= self._spec.max_iterations:
                return
            t = time.perf_counter()
            yield item
            self.latencies.append(time.perf_counter() - t)

    def report(self, epoch: int, **metrics: float) -> None:
        now = time.time()
        self._last_epoch = epoch
        if self.rank == 0:
            report = EpochReport(self.trial_id, epoch, dict(metrics), now - self._epoch_started, now)
            self.reports.append(report)
            if self._sink is not None:
                self._sink.record.remote({"type": "epoch", "trial_id": self.trial_id, "epoch": epoch,
                                          "metrics": dict(metrics), "seconds": report.seconds, "t": now})
        self._epoch_started = now

    def save_checkpoint(self, state: dict) -> None:
        if self.rank != 0:
            return
        directory = Path(self._spec.checkpoint_dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"epoch-{self._last_epoch}.pt"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(pickle.dumps(state))
        tmp.replace(path)
        latest = directory / "latest"
        tmp = directory / ".latest.tmp"
        tmp.write_text(path.name)
        tmp.replace(latest)
        self.checkpoint_epoch = self._last_epoch
        if self._sink is not None:
            self._sink.record.remote({"type": "checkpoint", "trial_id": self.trial_id, "epoch": self._last_epoch,
                                      "path": str(path), "t": time.time()})

    def load_checkpoint(self) -> dict | None:
        latest = Path(self._spec.checkpoint_dir) / "latest"
        if not latest.exists():
            return None
        return pickle.loads((latest.parent / latest.read_text().strip()).read_bytes())


class _Worker:
    def run(self, spec: TrialSpec, rank: int, sink: Any, created_at: float) -> TrialOutcome:
        started = time.time()
        if spec.code_dir not in sys.path:
            sys.path.insert(0, spec.code_dir)
        module, function = spec.entry_point.split(":")
        train = getattr(importlib.import_module(module), function)
        ctx = _Context(spec, rank, sink)
        setup = time.time() - created_at
        try:
            train(dict(spec.config), ctx)
        except Exception as exc:  # noqa: BLE001 - becomes the trial's TrainingError
            raise TrainingError(f"trial {spec.trial_id}: {type(exc).__name__}: {exc}") from None
        return TrialOutcome(spec.trial_id, tuple(ctx.reports), ctx.checkpoint_epoch, tuple(ctx.latencies), setup,
                            started, time.time())


class TrialRun:
    """One Ray actor per worker (1 CPU + a sliver of its instance's resource each)."""

    def __init__(self, spec: TrialSpec, actors: list, refs: list) -> None:
        self.spec, self._actors, self._refs = spec, actors, refs
        self.done_ref = refs[0]

    @classmethod
    def start(cls, spec: TrialSpec, *, event_sink: Any = None) -> "TrialRun":
        worker = ray.remote(_Worker)
        created = time.time()
        actors = [worker.options(num_cpus=1, resources={resource: 1}).remote() for resource in spec.placement]
        refs = [actor.run.remote(spec, rank, event_sink if rank == 0 else None, created)
                for rank, actor in enumerate(actors)]
        return cls(spec, actors, refs)

    def result(self, timeout_s: float | None = None) -> TrialOutcome:
        try:
            outcomes = ray.get(self._refs, timeout=timeout_s if timeout_s is not None else self.spec.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            raise TrainingError(str(getattr(cause, "message", cause)).splitlines()[-1]) from None
        except ray.exceptions.RayError as exc:
            raise TrainingError(f"trial {self.spec.trial_id}: worker died ({type(exc).__name__})") from None
        return outcomes[0]

    def stop(self) -> None:
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass


cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- a sleep workload whose metric the test knows in advance -----------------------------------

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


def write_job(directory: Path, *, name: str = "sleepy", trials: int = 9, eta: int = 3, min_epochs: int = 1,
              max_epochs: int = 3, epoch_s: float = 1.0, deadline: str = "10m", seed: int = 0) -> Path:
    """A spec + workload module in ``directory``; returns the spec path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sleepy_train.py").write_text(WORKLOAD)
    spec = {
        "name": name, "train": "sleepy_train:train", "metric": {"name": "loss", "mode": "min"},
        "search_space": {"quality": {"type": "uniform", "low": 0.0, "high": 1.0}},
        "config": {"epoch_s": epoch_s},
        "scheduler": {"kind": "sha", "trials": trials, "eta": eta, "min_epochs": min_epochs,
                      "max_epochs": max_epochs},
        "deadline": deadline, "resources": {"clouds": ["local"]}, "seed": seed,
    }
    path = directory / "job.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def make_plan(spec, stages: list[tuple[str, int, int]], *, durations: list[float] | None = None,
              prices: dict[str, float] | None = None) -> Plan:
    """A plan for ``spec`` with (instance type, instances, workers per trial) per stage."""
    from rubberband.planner.schedule import stages_for

    sched = spec.scheduler
    schedule = stages_for(sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs,
                          max_epochs=sched.max_epochs)
    assert len(schedule) == len(stages)
    prices = prices or {"local.cpu1": 0.05, "local.cpu2": 0.10, "local.cpu4": 0.20}
    durations = durations or [20.0] * len(stages)
    stage_plans = [StagePlan(bracket=s.bracket, stage=s.index, trials=s.trials, epochs=s.epochs,
                             epochs_this_stage=s.epochs_this_stage, cloud="local", region="local",
                             instance_type=t, instances=n, workers_per_trial=w, predicted_duration_s=d,
                             predicted_cost_usd=prices[t] * n * d / 3600)
                   for s, (t, n, w), d in zip(schedule, stages, durations)]
    total = sum(durations)
    cost = sum(s.predicted_cost_usd for s in stage_plans)
    return Plan(job=JobInfo(name=spec.name, spec_sha256=spec.sha256(), scheduler=sched.kind, eta=sched.eta,
                            min_epochs=sched.min_epochs, max_epochs=sched.max_epochs, trials=sched.trials,
                            metric=spec.metric.name, mode=spec.metric.mode),
                catalog=CatalogInfo(clouds=["local"], regions=["local"], dates={"local": "2026-11-21"}),
                deadline_s=spec.deadline_s, confidence=spec.confidence, stages=stage_plans,
                predicted=Prediction(jct_s=Distribution(mean=total, p50=total, p95=total * 1.1),
                                     cost_usd=Distribution(mean=cost, p50=cost, p95=cost * 1.1),
                                     p_meet_deadline=0.99,
                                     stage_duration_s=[Distribution(mean=d, p50=d, p95=d) for d in durations],
                                     stage_cost_usd=[s.predicted_cost_usd for s in stage_plans]))


def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for the CLI subprocess: the stand-in runtime importable, runs under tmp_path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS_DIR), env.get("PYTHONPATH", "")] if p)
    env["RUBBERBAND_TRIAL_RUNTIME"] = TRIAL_RUNTIME
    env["RUBBERBAND_RUNS_DIR"] = str(tmp_path / "runs")
    return env


def run_pids(run_dir: Path) -> list[int]:
    """Live pids of every process group the run recorded (head and nodes)."""
    from rubberband.cloud.local import LocalProvider

    return LocalProvider(run_dir).pids()
