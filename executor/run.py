"""Running a plan: the executor's parts put together, its start (or resume), its loop, and its teardown.

:class:`Executor` builds one run's parts around one journal — the plan it follows (:mod:`~rubberband.executor.
runplan`), its instances (:mod:`~rubberband.executor.fleet`), its trials (:mod:`~rubberband.executor.
trialrunner`), loss detection, spot decisions and re-plans, the scheduler the plan's job asks for (SHA and
Hyperband on lanes, or ASHA) — and runs the one loop (:mod:`~rubberband.executor.loop`). It starts the run's
head and connects to it, resumes where an earlier executor stopped (its journal holds every decision that one
took), and whatever happens terminates every instance of the run in ``finally`` and writes ``result.json``
with how it ended.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rubberband.catalog import Catalog
from rubberband.cloud.backend import ExecutorBackend
from rubberband.devices import DevicePolicy
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.actuator import Actuator
from rubberband.executor.clock import WALL_CLOCK, Clock
from rubberband.executor.deadline import remaining_deadline
from rubberband.executor.cluster import Cluster, RayCluster
from rubberband.executor.decisions import DeadlineWatch, LossPolicy
from rubberband.executor.fleet import Fleet, stop_orphans
from rubberband.executor.loop import RunLoop
from rubberband.executor.losses import LossDesk
from rubberband.executor.observations import Begin
from rubberband.executor.progress import Progress
from rubberband.executor.replanning import Replanning
from rubberband.executor.runplan import RunPlan
from rubberband.executor.runtime import DEFAULT_TRIAL_RUNTIME, Replanner, TrialRuntime
from rubberband.executor.scheduling import Scheduler
from rubberband.executor.schedulers import scheduler_for
from rubberband.executor.services import Services
from rubberband.executor.spotdesk import SpotDesk
from rubberband.executor.stopping import Interrupted, RunGuard, RunStopped
from rubberband.executor.tracking import open_tracking
from rubberband.executor.trialrunner import TrialRunner
from rubberband.plan import Plan
from rubberband.planner.policies import LatenessPolicy, PrefetchPolicy, SpotPolicy
from rubberband.profile import Profile
from rubberband.search import ConfigSource, make_config_source
from rubberband.spec import JobSpec

#: Instance losses a run tolerates before it gives up (a flapping cloud must not loop forever); spot
#: interruptions are not counted (:class:`~rubberband.executor.decisions.LossPolicy`).
MAX_INSTANCE_LOSSES = 10


@dataclass(frozen=True)
class Job:
    """What to run: the spec, its plan, the catalog it was planned from, and its profile (the re-planner's and
    the prefetch lead time's start-up samples)."""

    spec: JobSpec
    plan: Plan
    catalog: Catalog
    profile: Profile | None = None


@dataclass(frozen=True)
class Target:
    """Where it runs: the run's id and directory, the cloud side (provider + head), the trial runtime, the
    cluster (Ray, or a simulated one), the clock (wall, or virtual) and the journal (default: the run
    directory's)."""

    run_id: str
    run_dir: Path
    backend: ExecutorBackend
    runtime: TrialRuntime
    cluster: Cluster | None = None
    clock: Clock = WALL_CLOCK
    journal: J.Journal | None = None


@dataclass(frozen=True)
class Settings:
    """How it behaves: the deadline (default the plan's; counting from ``commanded_at`` where that is given, so a
    fresh run works to what its start leaves of it) and how far past it a run may go (``math.inf``: to the
    end), what a boundary does when no plan meets it (``on_late``), the limits, and the policies (defaults: the
    planner's own, so the prediction describes the run). ``elastic``: False holds every instance to the end."""

    deadline_s: float | None = None
    overrun_s: float = 0.0
    on_late: str = "finish"
    #: when the user's command began, on the run's clock (journaled; the result reports what went before the start;
    #: None: unknown, as on a simulated run's virtual clock)
    commanded_at: float | None = None
    trial_timeout_s: float = 600.0
    elastic: bool = True
    max_instance_losses: int = MAX_INSTANCE_LOSSES
    prefetch: PrefetchPolicy = field(default_factory=PrefetchPolicy)
    device_policy: DevicePolicy | None = None
    spot_policy: SpotPolicy | None = None


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    best_trial: str | None
    best_metric: float | None
    result: dict[str, Any] = field(default_factory=dict)


class Executor:
    """Runs one job's plan on a target (see the module docstring). ``replanner``: asked at every boundary;
    ``progress``: gets a :class:`Progress` snapshot after each turn of the loop."""

    def __init__(
        self,
        job: Job,
        target: Target,
        settings: Settings | None = None,
        *,
        replanner: Replanner | None = None,
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.job, self.target = job, target
        self.settings = settings or Settings()
        self.replanner = replanner
        self.progress = progress
        self.deadline_s = self.settings.deadline_s or job.plan.deadline_s
        self.run_dir = Path(target.run_dir)
        self.result: dict[str, Any] = {}
        self._spent_earlier = 0.0

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> RunResult:
        """Run (or resume) to the end; teardown always happens, and the journal says how it ended."""
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        tracking = open_tracking(self.job.spec, self.run_dir, self.target.run_id)  # SpecError before anything starts
        services = self._services()
        self.services = services
        self._record_start(resume)
        loop = self._assemble()
        status, error, exc_to_raise = "failed", None, None
        if tracking is not None:
            tracking.start()  # a thread of its own: a slow tracking server never stalls the loop
        try:
            self.actuator.search = self._restore_search()  # inside: a study that cannot be opened ends cleanly
            self._connect(loop)
            loop.run()
            status = "finished"
        except KeyboardInterrupt:
            status, error = "interrupted", "interrupted (SIGINT)"
            exc_to_raise = Interrupted(
                f"run interrupted; every instance was terminated, resume with `rubberband run --resume {self.run_dir}`"
            )
        except Interrupted as exc:
            status, error, exc_to_raise = "interrupted", str(exc), exc
        except RunStopped as exc:  # on purpose, with a partial result: returned, not raised
            status, error = "stopped", str(exc)
        except BaseException as exc:  # noqa: BLE001 - teardown must follow any failure
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            try:
                self._teardown(status, error)
            finally:
                if tracking is not None:
                    tracking.close()  # after the run's end event: the trackers log how the run ended
        if exc_to_raise is not None:
            raise exc_to_raise
        best = self.result.get("best") or {}
        return RunResult(
            self.target.run_id, self.run_dir, status, best.get("trial_id"), best.get("metric"), self.result
        )

    def _services(self) -> Services:
        target, job = self.target, self.job
        return Services(
            run_id=target.run_id,
            run_dir=self.run_dir,
            spec=job.spec,
            catalog=job.catalog,
            journal=target.journal or J.Journal(self.run_dir, clock=target.clock),
            clock=target.clock,
            cluster=target.cluster if target.cluster is not None else RayCluster(target.clock),
            backend=target.backend,
        )

    def _record_start(self, resume: bool) -> None:
        journal, job, target = self.services.journal, self.job, self.target
        if not resume:
            commanded_at = self.settings.commanded_at
            asked = self.deadline_s  # the user's, from their command where its start is known
            self.deadline_s = remaining_deadline(asked, commanded_at, self.services.clock.time())
            journal.record(
                J.RunStarted(
                    run_id=target.run_id,
                    spec_sha256=job.spec.sha256(),
                    spec=job.spec.model_dump(mode="json"),
                    plan=job.plan.model_dump(mode="json"),
                    cloud=job.plan.stages[0].cloud,
                    deadline_s=self.deadline_s,
                    deadline_from_command_s=asked if commanded_at is not None else None,
                    trial_runtime=target.runtime.module,
                    pid=os.getpid(),
                    on_late=self.settings.on_late,
                    commanded_at=commanded_at,
                )
            )
            return
        stop_orphans(self.services)  # what the earlier executor left: stopped, billed up to now
        self._spent_earlier = bill_run(journal.state, now=self.services.clock.time()).workers_usd
        attempt = journal.state.attempts + 1
        journal.record(
            J.RunResumed(run_id=target.run_id, attempt=attempt, pid=os.getpid(), on_late=self.settings.on_late)
        )

    def _assemble(self) -> RunLoop:
        """The run's parts around its journal (whose fold holds the decisions an earlier executor took)."""
        services, settings, job = self.services, self.settings, self.job
        runplan = RunPlan(job.plan, job.catalog, services.journal.state.choices)
        devices = settings.device_policy or services.backend.device_policy or DevicePolicy()
        fleet = Fleet(services, runplan, devices=devices, prefetch=settings.prefetch)
        fleet.profile = job.profile
        self.fleet = fleet
        losses = LossDesk(services, fleet, LossPolicy(settings.max_instance_losses))
        runner = TrialRunner(
            services, fleet, self.target.runtime, timeout_s=settings.trial_timeout_s, confirm_lost=losses.confirm
        )
        margin = job.plan.spot.margin_s if job.plan.spot is not None else job.spec.resources.spot_margin_s
        spot = SpotDesk(services, fleet, settings.spot_policy or SpotPolicy(margin_s=margin), self.deadline_s)
        lateness = LatenessPolicy(
            confidence=job.plan.confidence, on_late=settings.on_late, overrun_s=settings.overrun_s
        )
        replanning = Replanning(services, fleet, self.replanner, lateness, self.deadline_s)
        self.scheduler: Scheduler = scheduler_for(
            job.plan,
            job.spec,
            LossPolicy(settings.max_instance_losses),
            prefetch=settings.prefetch,
            elastic=settings.elastic,
        )
        self.actuator = Actuator(services, fleet, runner, spot, replanning)
        self.actuator.outlook = self.scheduler  # type: ignore[assignment]
        self.actuator.remainder = getattr(self.scheduler, "outlook", None)
        self.runner = runner
        self.guard = RunGuard(services, DeadlineWatch(self.deadline_s, settings.overrun_s))
        report = self._report_progress if self.progress is not None else None
        return RunLoop(services, self.scheduler, (fleet, runner, losses, spot, self.actuator), self.guard, report)

    def _restore_search(self) -> ConfigSource:
        """The spec's configuration source, told every trial and completed rung an earlier executor journaled."""
        state, plan = self.services.journal.state, self.job.plan
        source = make_config_source(self.job.spec, run_key=self.target.run_id)
        for trial in sorted(state.trials.values(), key=lambda t: (t.bracket, t.index)):
            source.restore(trial.trial_id, trial.config)
        for g in state.completed_stages():
            record, stage = state.stages[g], plan.stages[g]
            last = g + 1 == len(plan.stages) or plan.stages[g + 1].bracket != stage.bracket
            source.rung_finished(stage.epochs, record.metrics, None if last else record.promoted)
        return source

    def _connect(self, loop: RunLoop) -> None:
        """Start the head, request the first instances (they boot while the driver connects), connect, and catch
        SIGINT / SIGTERM from then on (after ``ray.init``, which installs its own SIGTERM handler)."""
        services = self.services
        backend, journal = services.backend, services.journal
        head = backend.start_head(services.run_id)
        journal.record(J.HeadStarted(address=head.address, pid=head.pid, requested_at=head.requested_at))
        billed = head.billed
        state = journal.state
        if billed is not None and (state.head is None or state.head.id != billed.id):
            # the instance this executor runs on, which the run pays for: journaled once, so result.json bills it
            journal.record(
                J.HeadInstance(
                    id=billed.id,
                    instance_type=billed.instance_type,
                    cloud=billed.cloud,
                    price_hr=billed.price_hr,
                    launched_at=billed.launched_at,
                    grace_s=billed.grace_s,
                )
            )
        loop.dispatch(Begin(resumed=state.attempts > 1))
        # The driver speaks the head's auth mode; a backend whose workers are other machines ships rubberband and
        # the training code with the driver's job.
        services.cluster.connect(
            head.address,
            namespace=services.run_id,
            auth_mode=backend.ray_auth_mode,
            auth_token_path=backend.ray_auth_token_path,
            runtime_env=backend.runtime_env(services.spec.base_dir),
        )
        self.guard.catch_signals()
        self.runner.sink = services.cluster.start_sink(self.run_dir)
        if self.target.runtime.module == DEFAULT_TRIAL_RUNTIME:
            from rubberband.executor.pool import WorkerPool

            # Trials take warm workers, so a stage boundary (resize) costs a process-group re-init (~0.05 s),
            # not a process start (~2.5 s): that is what the simulator assumes. A job of one-worker CPU trials
            # (scikit-learn, XGBoost, a sleep) never pays for torch.
            stages = self.fleet.runplan.plan.stages
            self.fleet.workers = WorkerPool(warm_torch=any(s.workers_per_trial > 1 for s in stages))

    # -- progress and the end -------------------------------------------------------------------------------
    def _report_progress(self) -> None:
        assert self.progress is not None
        services, plan = self.services, self.fleet.runplan.plan
        stage, bracket, pending = self.scheduler.progress()
        state = services.journal.current
        now = services.clock.time()
        self.progress(
            Progress(
                stage=stage,
                stages=len(plan.stages),
                bracket=bracket,
                trials_alive=len(self.runner.running),
                trials_pending=pending,
                epochs_done=sum(len(t.epochs) for t in state.trials.values()),
                instances=len(self.fleet.alive()),
                spent_usd=self.fleet.spent(now, self._spent_earlier),
                predicted_usd=plan.predicted.cost_usd.mean,
                elapsed_s=now - state.first_started_at,
                deadline_s=self.deadline_s,
            )
        )

    def _teardown(self, status: str, error: str | None) -> None:
        """Stop trials, shut Ray down, terminate every instance of the run and the head; journal it."""
        self.guard.ignore_signals()
        try:
            self.runner.stop_all()
            workers, self.fleet.workers = self.fleet.workers, None  # an instance up during teardown gets none
            if workers is not None:
                try:
                    workers.close()
                except Exception:  # noqa: BLE001 - their nodes are terminated below anyway
                    pass
            try:
                self.services.cluster.close()
            except Exception:  # noqa: BLE001
                pass
            self.fleet.teardown()
            self._write_result(status, error)
        finally:
            self.guard.restore_signals()

    def _write_result(self, status: str, error: str | None) -> None:
        from rubberband.executor.result import Ending, build_result, write_result

        services = self.services
        now = services.clock.time()
        state, plan = services.journal.state, self.fleet.runplan.plan
        result = build_result(state, plan, self.job.spec, Ending(status, error, now), self.run_dir)
        best = result["best"] or {}  # the best so far, whatever the outcome
        end = J.END_EVENT_OF.get(status, J.RunFailed)
        services.journal.record(
            end(
                t=now,
                reason=error,
                best_trial=best.get("trial_id"),
                best_metric=best.get("metric"),
                rung=best.get("rung"),
                outcome=result["outcome"],
                jct_s=result["actual"]["jct_s"],
                cost_usd=result["actual"]["cost_usd"],
            )
        )
        write_result(result, self.run_dir)
        self.result = result
