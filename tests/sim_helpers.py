"""Running the real executor on virtual time, for tests of its behaviour through public seams.

A :class:`SimCase` is a job (spec, plan, catalog, performance model) plus what the simulated world should play
(a seed, a :class:`~rubberband.executor.simulated.SimScript` of notices, losses and sold-out types) and how the
executor should behave (:class:`~rubberband.executor.run.Settings`, a re-planner). :meth:`SimCase.run` runs the
unchanged :class:`~rubberband.executor.run.Executor` on it — no Ray, no cloud, seconds of wall time — and
returns what a user would look at: the result and the journal.

:func:`cpu_model` is a performance model for the local catalog's CPU types with a closed form (perfect scaling,
fixed start-ups), so a test can say when things happen. :class:`KillingJournal` stops the executor dead after a
given number of decisions, as ``kill -9`` would: nothing more reaches the journal or the cloud.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from rubberband.catalog import Catalog, load_catalog
from rubberband.executor import journal as J
from rubberband.executor.decision_events import DECISIONS
from rubberband.executor.run import Executor, Job, RunResult, Settings, Target
from rubberband.executor.runtime import Replanner
from rubberband.executor.sim_world import SimSettings
from rubberband.executor.simulated import SimRun, SimScript, default_step_s, simulated_run, spot_zones
from rubberband.plan import Plan
from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel
from rubberband.spec import JobSpec

#: The virtual clock's start: nowhere near today's wall clock.
START = 1_800_000_000.0


def cpu_model(
    *, epoch_s: float = 1.0, startup_s: float = 2.0, worker_start_s: float = 0.0, sigma: float = 0.0
) -> PerformanceModel:
    """A model of the local CPU types: an epoch takes ``epoch_s`` on one worker and scales perfectly, every
    instance is up ``startup_s`` after its request; no restart, checkpoint or evaluation cost."""
    iterations = 10
    device = DeviceModel(
        alpha_grad=epoch_s / iterations,
        beta_grad=0.0,
        alpha_sync_node=0.0,
        beta_sync_node=0.0,
        alpha_sync_cross=0.0,
        beta_sync_cross=0.0,
        gamma=1.0,
    )
    startup = StartupModel((startup_s,), "test")
    return PerformanceModel(
        dataset_size=iterations * 10,
        batch_size_per_worker=10,
        restart_overhead_s=0.0,
        checkpoint_size_gb=0.0,
        eval_time_s=0.0,
        reference_device="CPU",
        devices={"CPU": device},
        straggler_sigma=sigma,
        startup_by_cloud={cloud: startup for cloud in ("local", "aws", "gcp")},
        termination_by_cloud={cloud: StartupModel((0.0,), "test") for cloud in ("local", "aws", "gcp")},
        worker_start_s=worker_start_s,
    )


@dataclass
class SimOutcome:
    """What a simulated run left: the world it ran in, its result (None when it raised: ``error``), its journal."""

    sim: SimRun
    run_dir: Path
    result: RunResult | None
    error: BaseException | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(J.iter_events(self.run_dir / J.JOURNAL_NAME))

    def of(self, kind: str) -> list[dict[str, Any]]:
        """Events of a type (``trial_started``), or decisions of a kind (``spot``)."""
        return [e for e in self.events if e["type"] == kind or (e["type"] == J.DECISION and e.get("kind") == kind)]

    @property
    def state(self) -> J.RunState:
        return J.read_state(self.run_dir)


@dataclass
class SimCase:
    """A job to run on virtual time (see the module docstring); ``catalog`` defaults to the local one."""

    spec: JobSpec
    plan: Plan
    model: PerformanceModel = field(default_factory=cpu_model)
    catalog: Catalog | None = None
    seed: int = 0
    script: SimScript = field(default_factory=SimScript)
    settings: Settings = field(default_factory=Settings)
    replanner: Replanner | None = None
    max_step_s: float | None = None

    def world(self) -> SimRun:
        """A fresh simulated cloud and cluster for the case (its clock at :data:`START`)."""
        settings = SimSettings(
            seed=self.seed,
            max_step_s=self.max_step_s or default_step_s(self.plan),
            metric_name=self.spec.metric.name,
            metric_mode=self.spec.metric.mode,
            spot_zones=spot_zones(self.plan),
            script=self.script,
        )
        return simulated_run(self.plan, self.model, self.catalog_or_local(), settings, START)

    def catalog_or_local(self) -> Catalog:
        return self.catalog if self.catalog is not None else load_catalog(["local"])

    def executor(self, run_dir: Path, sim: SimRun, *, journal: J.Journal | None = None) -> Executor:
        """The executor of the case in the world ``sim``; with a :class:`KillingJournal`, a cloud that hears
        nothing more once it is dead."""
        job = Job(self.spec, self.plan, self.catalog_or_local())
        backend: Any = Mortal(sim.backend, journal) if isinstance(journal, KillingJournal) else sim.backend
        journal = journal or J.Journal(run_dir, clock=sim.clock, durable=False)
        target = Target("sim-run", run_dir, backend, sim.runtime, cluster=sim.cluster, clock=sim.clock, journal=journal)
        return Executor(job, target, self.settings, replanner=self.replanner)

    def run(
        self, run_dir: Path, *, sim: SimRun | None = None, resume: bool = False, journal: J.Journal | None = None
    ) -> SimOutcome:
        """Run (or resume, in the same world ``sim``) to the end; an exception the run raises is kept."""
        sim = sim or self.world()
        executor = self.executor(run_dir, sim, journal=journal)
        try:
            return SimOutcome(sim, run_dir, executor.run(resume=resume))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it (a kill, a refusal)
            return SimOutcome(sim, run_dir, None, exc)

    def but(self, **changes: Any) -> "SimCase":
        return replace(self, **changes)


class Killed(BaseException):
    """The executor was killed (``kill -9``): nothing after this reaches the journal or the cloud."""


class KillingJournal(J.Journal):
    """A journal whose process dies right after its ``after``-th decision is written (or, with ``when``, right
    after the first event ``when`` is true of): that event is on disk, nothing later is (the executor's teardown
    included), and the cloud is no longer told anything (``dead``: the test's backend wrapper asks it)."""

    def __init__(
        self, run_dir: Path, *, clock: Any, after: int | None = None, when: Callable[[Any], bool] | None = None
    ) -> None:
        super().__init__(run_dir, clock=clock)
        self.after = after
        self.when = when
        self.decisions = 0
        self.dead = False

    def record(self, event: Any) -> Any:
        if self.dead:
            return event
        written = super().record(event)
        if type(written) in DECISIONS.values():
            self.decisions += 1
        if (self.after is not None and self.decisions >= self.after) or (self.when is not None and self.when(written)):
            self.dead = True
            raise Killed(f"killed after decision {self.decisions} ({type(written).__name__})")
        return written


class Mortal:
    """A backend of an executor that may be killed: once its journal is dead, nothing reaches the cloud."""

    def __init__(self, backend: Any, journal: KillingJournal) -> None:
        self._backend, self._journal = backend, journal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def terminate(self, instance_ids: list[str]) -> None:
        if not self._journal.dead:
            self._backend.terminate(instance_ids)

    def stop_head(self) -> bool:
        return False if self._journal.dead else self._backend.stop_head()


def write_cpu_profile(path: Path, *, epoch_s: float = 1.0, startup_s: float = 2.0) -> Path:
    """A profile of the local CPU types in which an epoch on one worker takes ``epoch_s`` and every instance is up
    ``startup_s`` after its request: what ``rubberband run --cloud sim`` plays a job with (tests/executor_helpers'
    sleep workload, whose ``epoch_s`` it matches)."""
    import json

    data = {
        "workload": {
            "name": "sleepy",
            "origin": "tests (sim_helpers.write_cpu_profile)",
            "dataset_size": 10,
            "batch_size_per_worker": 1,
            "restart_overhead_s": 0.0,
            "checkpoint_size_gb": 0.0,
        },
        "measurements": [{"device": "CPU", "workers": 1, "nodes": 1, "iteration_latencies_s": [epoch_s / 10] * 5}],
        "startup": [{"cloud": "local", "samples_s": [startup_s] * 3}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def write_spread_profile(path: Path, *, rho: float, sigma: float = 0.5) -> Path:
    """:func:`write_cpu_profile` with ten configurations whose speeds differ (log σ ``sigma``) and whose scores go
    with their slowness at ``rho``: what ``rubberband profile --configs 10`` records of such a workload."""
    import json
    import math

    import numpy as np

    write_cpu_profile(path, epoch_s=1.0, startup_s=2.0)
    data = json.loads(path.read_text())
    rng = np.random.default_rng(1)
    data["schema_version"] = 2
    data["epoch_measurements"] = [
        {
            "config": {"quality": float(i)},
            "device": "CPU",
            "workers": 1,
            "nodes": 1,
            "iterations_per_epoch": 10,
            "epoch_times_s": [float(math.exp(sigma * z + 0.02 * e)) for e in rng.standard_normal(4)],
            "quality": float(rho * z + math.sqrt(1 - rho * rho) * rng.standard_normal()),
        }
        for i, z in enumerate(np.linspace(-1.5, 1.5, 10))
    ]
    path.write_text(json.dumps(data))
    return path


def boundary_prediction(events: list[dict], stage: int) -> float:
    """The re-plan's prediction of the rest at the boundary before ``stage`` (its proposal's median JCT when it was
    taken, else the current plan's under the re-fitted model), from a run's journal events."""
    decision = [e for e in events if e.get("kind") == "replan" and e["stage"] == stage][-1]
    return decision["proposal_jct_p50_s"] if decision["accepted"] else decision["current_jct_p50_s"]
