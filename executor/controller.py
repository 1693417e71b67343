"""The SHA / Hyperband controller: runs a plan stage by stage on elastic instances.

For each stage of the plan (Hyperband brackets one after another) it places every trial on
the stage's instances (:mod:`rubberband.executor.placement`), trains it to the stage's
epochs through the trial runtime, ranks the trials by the spec's metric, promotes the top
ones and restarts them from their checkpoints with the next stage's workers on the next
stage's instances. Around that it keeps the cluster elastic:

* instances of the same type carry over from one stage to the next;
* the next stage's extra instances are requested ahead, once the current stage's estimated
  remaining time drops to the lead time of the planner's own
  :class:`~rubberband.planner.policies.PrefetchPolicy` (a start-up quantile), so the simulator's
  prediction describes what the executor does;
* an instance is released the moment no remaining work of its stage needs it and the next
  stage does not keep it (the same policy's carry-over);
* at each stage boundary an injected :data:`~rubberband.executor.runtime.Replanner` may
  re-plan the remaining stages and the :class:`~rubberband.planner.policies.LatenessPolicy`
  decides: go on, take a cheaper plan, buy speed, finish late or stop now with the best so far
  (``on_late``); when failover
  had to give another type than planned, the remaining stages are re-planned without the
  unavailable types (the re-planner, else the type failover obtained stands in).

A lost instance (spot interruption, or any node that dies mid-stage) is told apart from a trial
whose training raised: on a trial error (and every few seconds for every instance) the backend
and Ray's view of the ``rb-node-<id>`` resource are asked whether the instance still runs. A lost
one is journaled (``instance_lost``), billed up to the loss, dropped from the stage, replaced
through the same failover path, and its trials restart from their latest checkpoints — at most
``max_instance_losses`` times per executor, spot interruptions not counted (the spot policy and the
deadline bound those).

Everything goes to the journal; every instance of the run is terminated in ``finally``.

This module is the loop and its effects. The decisions it asks for are small objects without I/O:
the planner's (:mod:`rubberband.planner.policies`: prefetch and carry-over, lateness, spot or on-demand,
the ones the simulator takes too) and the executor's own (:mod:`rubberband.executor.decisions`: the
deadline, lost instances, promotion, the re-plan's outlook and proposals, failover's stand-ins). The
instances' requests, arrivals and terminations go through :class:`~rubberband.executor.instances.InstancePool`,
the notice watchers through :class:`~rubberband.executor.notices.NoticeWatchers`, and everything Ray does
for the loop through :class:`~rubberband.executor.cluster.Cluster` (a simulated one for ``--cloud sim``).
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rubberband.catalog import SERIAL_PROVISIONING, Catalog, InstanceType
from rubberband.cloud.backend import ExecutorBackend
from rubberband.cloud.failover import alternatives_for
from rubberband.cloud.provider import node_resource
from rubberband.errors import ExecutionError, GpuUnavailableError, PlanFileError, TrainingError, TrialPreempted
from rubberband.executor import journal as J
from rubberband.executor.accounting import bill_run
from rubberband.executor.checkpoints import latest_epoch
from rubberband.executor.clock import WALL_CLOCK, Clock
from rubberband.executor.cluster import Cluster, RayCluster
from rubberband.executor.decisions import (
    DeadlineState,
    DeadlineWatch,
    LossPolicy,
    boundary_outlook,
    judge_proposal,
    mean_task_s,
    price_hr,
    promote,
    proposal_problem,
    rank,
    requeue_first,
    slowdown,
    stand_in_stages,
    startup_samples,
)
from rubberband.devices import DevicePolicy
from rubberband.executor.instances import InstancePool, PoolInstance
from rubberband.executor.notices import WATCHERS_ENV, NoticeWatchers
from rubberband.executor.placement import Slot, make_slots, slot_count
from rubberband.executor.runtime import DEFAULT_TRIAL_RUNTIME, ReplanAnswer, ReplanRequest, Replanner, TrialRuntime
from rubberband.plan import Plan, StagePlan
from rubberband.executor import spot as S
from rubberband.planner.policies import Action, LatenessPolicy, Market, PrefetchPolicy, SpotPolicy, SpotSituation
from rubberband.planner.schedule import stages_for
from rubberband.profile import Profile
from rubberband.search import ConfigSource, make_config_source, trial_id_for
from rubberband.spec import JobSpec
from rubberband.units import format_duration

POLL_S = 0.2
RESULT_TIMEOUT_S = 60.0
#: How often every ready instance's Ray node is looked for (seconds).
LIVENESS_EVERY_S = 2.0
#: After a trial error, how long to wait for the backend or Ray to call its instances lost (Ray marks a
#: dead node within ~2 s on the run's head) before calling it a training failure.
LOSS_CONFIRM_S = 5.0
#: Instance losses one executor tolerates before it gives up (a flapping cloud must not loop forever); spot
#: interruptions are not counted (:class:`~rubberband.executor.decisions.LossPolicy`).
MAX_INSTANCE_LOSSES = 10


class RunStopped(ExecutionError):
    """The run was stopped early on purpose, with a partial result (outcome ``stopped``, exit 5)."""

    exit_code = 5


class DeadlineExceeded(RunStopped):
    """The run passed its deadline by more than its allowed overrun; everything was stopped."""


class Interrupted(ExecutionError):
    """SIGINT / SIGTERM arrived; everything was stopped."""

    exit_code = 130


# -- helpers ---------------------------------------------------------------------------------


def check_plan_matches(spec: JobSpec, plan: Plan, *, source: str = "plan") -> None:
    """The plan must run exactly the spec's schedule (same stages, trials and epochs)."""
    sched = spec.scheduler
    expected = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    got = [(s.bracket, s.stage, s.trials, s.epochs, s.epochs_this_stage) for s in plan.stages]
    want = [(s.bracket, s.index, s.trials, s.epochs, s.epochs_this_stage) for s in expected]
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise PlanFileError(
                    f"{source}: stage {i} runs {g[2]} trials to {g[3]} epochs but the spec's "
                    f"{sched.kind} schedule needs {w[2]} trials to {w[3]} epochs; "
                    f"re-plan with `rubberband plan`"
                )
        raise PlanFileError(
            f"{source}: has {len(got)} stages but the spec's {sched.kind} schedule has "
            f"{len(want)}; re-plan with `rubberband plan`"
        )
    if plan.job.metric != spec.metric.name or plan.job.mode != spec.metric.mode:
        raise PlanFileError(
            f"{source}: plan optimises {plan.job.metric} ({plan.job.mode}) but the spec's "
            f"metric is {spec.metric.name} ({spec.metric.mode}); re-plan with `rubberband plan`"
        )


def trial_configs(spec: JobSpec, plan: Plan) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(trial id, bracket, index, config) of every trial a run proposes when no rung result has come in.

    What a run creates with the default random search (fixed configurations first, then seeded samples).
    """
    source = make_config_source(spec)
    out = []
    for stage in plan.stages:
        if stage.stage != 0:
            continue
        for i in range(stage.trials):
            trial_id = trial_id_for(stage.bracket, i)
            out.append((trial_id, stage.bracket, i, {**spec.config, **source.propose(trial_id)}))
    return out


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


# -- state -----------------------------------------------------------------------------------


@dataclass
class RunningTrial:
    trial_id: str
    slot: Slot
    handle: Any
    start_epoch: int
    end_epoch: int
    started_at: float
    cold: bool = False  # the first trial on one of its instances: its time includes the node's worker start
    preempted: bool = False  # stopped after a checkpoint on its instance's preemption notice: restarts elsewhere


@dataclass
class Progress:
    """A snapshot for the progress display."""

    stage: int
    stages: int
    bracket: int
    trials_alive: int
    trials_pending: int
    epochs_done: int
    instances: int
    spent_usd: float
    predicted_usd: float
    elapsed_s: float
    deadline_s: float


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str
    best_trial: str | None
    best_metric: float | None
    result: dict[str, Any] = field(default_factory=dict)


def _devices_used(outcome: Any) -> dict[str, Any]:
    """Per rank, the device a trial trained on and the GPUs Ray assigned it (for the journal; {} if not known)."""
    out: dict[str, Any] = {}
    if getattr(outcome, "devices", ()):
        out["devices"] = list(outcome.devices)
    if any(getattr(outcome, "gpu_ids", ())):
        out["gpu_ids"] = [list(ids) for ids in outcome.gpu_ids]
    return out


# -- the controller --------------------------------------------------------------------------


class Controller:
    """Runs one job's plan on a backend (provider + Ray head); see the module docstring."""

    def __init__(
        self,
        *,
        spec: JobSpec,
        plan: Plan,
        catalog: Catalog,
        run_dir: str | Path,
        backend: ExecutorBackend,
        runtime: TrialRuntime,
        run_id: str,
        replanner: Replanner | None = None,
        profile: Profile | None = None,
        progress: Callable[[Progress], None] | None = None,
        deadline_s: float | None = None,
        overrun_s: float = 0.0,
        trial_timeout_s: float = 600.0,
        elastic: bool = True,
        max_instance_losses: int = MAX_INSTANCE_LOSSES,
        on_late: str = "finish",
        prefetch: PrefetchPolicy | None = None,
        device_policy: DevicePolicy | None = None,
        spot_policy: SpotPolicy | None = None,
        clock: Clock = WALL_CLOCK,
        cluster: Cluster | None = None,
    ) -> None:
        self.spec = spec
        self.clock = clock  # every reading of time (journal, deadline, durations, polling): wall or virtual
        # where trials run and are waited for: the run's Ray cluster, or a simulated one (executor.simulated)
        self.cluster: Cluster = cluster if cluster is not None else RayCluster(clock)
        self.plan = plan
        self.catalog = catalog
        self.run_dir = Path(run_dir)
        self.runtime = runtime
        self.run_id = run_id
        self.replanner = replanner
        self.profile = profile
        self.progress = progress
        self.deadline_s = deadline_s or plan.deadline_s
        # a late run goes on this long past the deadline (math.inf: to the end), then everything is stopped
        self.overrun_s = overrun_s
        self.deadline = DeadlineWatch(self.deadline_s, overrun_s)
        self._deadline_passed = False
        # at a boundary: go on, buy speed, finish late or stop (on_late) — the decision, without I/O
        self.lateness = LatenessPolicy(confidence=plan.confidence, on_late=on_late, overrun_s=overrun_s)
        # prefetch lead time and carry-over: the simulator's own policy, so predictions describe this executor
        self.prefetch = prefetch or PrefetchPolicy()
        # spot or on-demand for each spot request (Uniform Progress): the simulator's own policy object
        self.spot_policy = spot_policy or SpotPolicy(
            margin_s=plan.spot.margin_s if plan.spot is not None else spec.resources.spot_margin_s
        )
        self._on_spot = True  # the run's spot stages still buy spot (False once the policy moved them to on-demand)
        self._fell_back = False  # some spot stage's instances were bought on-demand
        self._noticed: dict[str, float] = {}  # instance -> when its preemption notice was seen
        self._replaced: set[str] = set()  # instances whose replacement was already requested (on notice)
        self.watchers = NoticeWatchers(backend.cloud, backend.metadata_url)  # ready spot instances' notice watchers
        self._stage_seconds: list[float] = []  # the current stage's task times (not cold), for estimates
        self.trial_timeout_s = trial_timeout_s
        # GPU + nccl on GPU types, CPU + gloo otherwise (a backend may say otherwise: test boots' logical GPUs)
        self.devices = device_policy or backend.device_policy or DevicePolicy()
        self.elastic = elastic  # False: hold every instance to the end (the static baseline, for benchmarks)
        self.journal = J.Journal(self.run_dir, clock=clock)
        # Requests run side by side, each until its instance is up and joined (the simulator's model), except on a
        # backend whose instances come up one after another (local Ray nodes race for ports when started at once).
        self.instances = InstancePool(
            run_id=run_id,
            backend=backend,
            catalog=catalog,
            journal=self.journal,
            clock=clock,
            cluster=self.cluster,
            serial=plan.stages[0].cloud in SERIAL_PROVISIONING,
        )
        self.pool = self.instances.entries  # token -> PoolInstance: every instance this executor asked for
        self._provisioner = self.instances.provisioner
        self._terminator = self.instances.terminator
        self.running: dict[Any, RunningTrial] = {}
        self.sink = None
        self.workers: Any = None  # WorkerPool: warm worker processes per instance, reused across trials
        self.state: J.RunState | None = None
        self.stage_index = 0
        self.epoch_seconds: dict[str, list[float]] = {}
        self.setup_seconds: list[float] = []
        self.iteration_latencies: dict[str, list[float]] = {}
        self.startup_seconds: dict[str, list[float]] = {}
        self.prefetched: set[int] = set()
        self.loss_policy = LossPolicy(max_instance_losses)  # replace a lost instance while needed, up to the limit
        self.losses = 0  # instances lost while this executor ran
        self.counted_losses = 0  # those that count toward the limit (not spot interruptions)
        self.substitutes: dict[str, InstanceType] = {}  # planned type key -> the type failover obtained instead
        self._seen_in_ray: set[str] = set()  # instances whose rb-node-<id> resource Ray has shown
        self._lost: set[str] = set()  # instances already handled as lost
        self._ran_on: set[str] = set()  # instances that have run a trial (their workers are warm)
        self._spent_earlier = 0.0  # what the run's earlier executors (before a resume) cost
        self._rerun_last: set[tuple[int, str]] = set()  # (stage, trial): last epoch checkpointed, never reported
        self._last_liveness = 0.0
        self._saved_signals: dict[int, Any] = {}
        self._signal: str | None = None

    @property
    def backend(self) -> ExecutorBackend:
        """The cloud side (provider + head): one object, held by the instance pool that talks to it."""
        return self.instances.backend

    @backend.setter
    def backend(self, backend: ExecutorBackend) -> None:
        self.instances.backend = backend

    # -- entry points ----------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> RunResult:
        """Run (or resume) to the end; teardown always happens, and the journal says how it ended."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "checkpoints").mkdir(exist_ok=True)
        if resume:
            self.state = self.journal.state
            self._stop_orphans()
            self._spent_earlier = bill_run(self.journal.state, now=self.clock.time()).workers_usd
            self.journal.record(
                J.RunResumed(
                    run_id=self.run_id, attempt=self.state.attempts + 1, pid=os.getpid(), on_late=self.lateness.on_late
                )
            )
        else:
            self.journal.record(
                J.RunStarted(
                    run_id=self.run_id,
                    spec_sha256=self.spec.sha256(),
                    spec=self.spec.model_dump(mode="json"),
                    plan=self.plan.model_dump(mode="json"),
                    cloud=self.plan.stages[0].cloud,
                    deadline_s=self.deadline_s,
                    trial_runtime=self.runtime.module,
                    pid=os.getpid(),
                    on_late=self.lateness.on_late,
                )
            )
        self.state = self.journal.state
        status, error, exc_to_raise = "failed", None, None
        self._best: tuple[str | None, float | None] = (None, None)
        try:
            self.search = self._restore_search()  # inside: a study that cannot be opened ends the run cleanly
            self._connect()
            self._best = self._run_stages()
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
            self._teardown(status, error)
        if exc_to_raise is not None:
            raise exc_to_raise
        best = self.result.get("best") or {}
        return RunResult(self.run_id, self.run_dir, status, best.get("trial_id"), best.get("metric"), self.result)

    # -- setup -----------------------------------------------------------------------------
    def _stop_orphans(self) -> None:
        """Stop every node (and the head) an earlier executor of this run left running."""
        known = self.state.instances
        for instance in self.backend.list(self.run_id):
            if instance.id not in known:
                self._journal_unrecorded(instance)
            self.backend.terminate([instance.id])
            self.journal.record(J.InstanceTerminated(id=instance.id, reason="orphan"))
        for life in known.values():  # dead without a termination record: bill it up to now
            if life.terminated_at is None:
                self.journal.record(J.InstanceTerminated(id=life.id, reason="lost"))
        if self.backend.stop_head():
            self.journal.record(J.Decision(kind="orphan_head_stopped"))

    def _journal_unrecorded(self, instance: Any) -> None:
        """Journal the request of an instance the provider lists but the journal never saw, so it is billed."""
        try:
            price = self.catalog.find(instance.instance_type, cloud=instance.cloud).price_hr
        except Exception:  # noqa: BLE001 - unknown type: bill nothing rather than crash cleanup
            price = 0.0
        self.journal.record(
            J.InstanceRequested(
                t=instance.launched_at or self.clock.time(),
                id=instance.id,
                instance_type=instance.instance_type,
                cloud=instance.cloud,
                price_hr=price,
                spot=False,
                stage=instance.stage,
            )
        )

    def _connect(self) -> None:
        head = self.backend.start_head(self.run_id)
        self.journal.record(J.Decision(kind="head_started", address=head.address, pid=head.pid))
        billed = head.billed
        if billed is not None and (self.state.head is None or self.state.head.id != billed.id):
            # the instance this executor runs on, which the run pays for: journaled once, so result.json bills it
            self.journal.record(
                J.HeadInstance(
                    id=billed.id,
                    instance_type=billed.instance_type,
                    cloud=billed.cloud,
                    price_hr=billed.price_hr,
                    launched_at=billed.launched_at,
                    grace_s=billed.grace_s,
                )
            )
            self.state = self.journal.state
        self._request_first_instances()  # the first node boots while the driver connects
        # The driver speaks the head's auth mode: token locally; a backend whose head serves cloud nodes
        # (which run with auth disabled, docs/clouds.md) says ``ray_auth_mode = "disabled"``. A backend whose
        # workers are other machines ships rubberband and the training code with the driver's job.
        self.cluster.connect(
            head.address,
            namespace=self.run_id,
            auth_mode=self.backend.ray_auth_mode,
            runtime_env=self.backend.runtime_env(self.spec.base_dir),
        )
        self._catch_signals()  # after ray.init, which installs its own SIGTERM handler (it aborts)
        self.sink = self.cluster.start_sink(self.run_dir)
        if self.runtime.module == DEFAULT_TRIAL_RUNTIME:
            from rubberband.executor.pool import WorkerPool

            # Trials take warm workers, so a stage boundary (resize) costs a process-group re-init
            # (~0.05 s), not a process start (~2.5 s): that is what the simulator assumes.
            self.workers = WorkerPool()

    def _request_first_instances(self) -> None:
        """Request the instances of the stage the run starts (or resumes) with, as soon as the head is up.

        Not for a stage about to be re-planned (a resumed run stopped exactly at a boundary).
        """
        done = set(self.state.completed_stages())
        g = next((i for i in range(len(self.plan.stages)) if i not in done), None)
        if g is None or (g > 0 and g not in self.state.stages):
            return
        stage = self.plan.stages[g]
        itype = self._stage_itype(stage)
        missing = stage.instances - len(self._stage_pool(g))
        if missing <= 0:
            return
        self.stage_index = g  # the spot decision looks at the run from this stage on
        spot = self._buy_spot(stage, trigger="start", waiting=stage.trials)
        for _ in range(missing):
            self._request(g, itype, spot)

    def _catch_signals(self) -> None:
        """SIGINT / SIGTERM become :class:`Interrupted` at the next poll of the main loop, so teardown runs."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupted(signum, frame):  # raising inside Ray's C code would garble it: flag, then raise in the loop
            self._signal = signal.Signals(signum).name

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved_signals.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, interrupted)

    # -- stages ----------------------------------------------------------------------------
    def _restore_search(self) -> ConfigSource:
        """The spec's configuration source, told every trial and completed rung an earlier executor journaled."""
        source = make_config_source(self.spec, run_key=self.run_id)
        for trial in sorted(self.state.trials.values(), key=lambda t: (t.bracket, t.index)):
            source.restore(trial.trial_id, trial.config)
        for g in self.state.completed_stages():
            record, stage = self.state.stages[g], self.plan.stages[g]
            last = g + 1 == len(self.plan.stages) or self.plan.stages[g + 1].bracket != stage.bracket
            source.rung_finished(stage.epochs, record.metrics, None if last else record.promoted)
        return source

    def _create_trials(self, stage: StagePlan) -> None:
        """Ask the search for a bracket's configurations as the bracket starts (after the earlier ones' results)."""
        for index in range(stage.trials):
            trial_id = trial_id_for(stage.bracket, index)
            if trial_id not in self.state.trials:  # all of them on a fresh bracket; any a crash cut off on resume
                config = {**self.spec.config, **self.search.propose(trial_id)}
                self.journal.record(
                    J.TrialCreated(trial_id=trial_id, bracket=stage.bracket, index=index, config=config)
                )
        self.state = self.journal.state

    def _stage_trials(self, g: int) -> list[str]:
        stage = self.plan.stages[g]
        if stage.stage == 0:
            return sorted(t for t, s in self.state.trials.items() if s.bracket == stage.bracket)
        return list(self.state.stages[g - 1].promoted)

    def _run_stages(self) -> tuple[str | None, float | None]:
        done = set(self.state.completed_stages())
        finals: dict[str, float | None] = {}
        for g, stage in enumerate(self.plan.stages):
            last_of_bracket = g + 1 == len(self.plan.stages) or self.plan.stages[g + 1].bracket != stage.bracket
            if g in done:
                if last_of_bracket:
                    finals.update(self.state.stages[g].metrics)
                continue
            self.stage_index = g
            if g > 0 and (g - 1) in self.state.stages and g not in self.state.stages:
                self._maybe_replan(g)
            stage = self.plan.stages[g]
            if stage.stage == 0:
                self._create_trials(stage)
            metrics = self._run_stage(g, stage)
            keep = None if last_of_bracket else self.plan.stages[g + 1].trials
            ranking, promoted = promote(metrics, self.spec.metric.mode, self._stage_trials(g), keep)
            for position, trial_id in enumerate(promoted):
                self.journal.record(
                    J.TrialPromoted(
                        trial_id=trial_id, from_stage=g, to_stage=g + 1, metric=metrics[trial_id], rank=position
                    )
                )
            if last_of_bracket:
                finals.update(metrics)
            self.journal.record(
                J.StageFinished(stage=g, bracket=stage.bracket, metrics=metrics, promoted=promoted, ranking=ranking)
            )
            self.search.rung_finished(stage.epochs, metrics, None if last_of_bracket else promoted)
            self.state = self.journal.state
        if not finals:
            return None, None
        best = rank(finals, self.spec.metric.mode, sorted(finals))[0]
        return best, finals[best]

    def _stage_itype(self, stage: StagePlan) -> InstanceType:
        """The type a stage runs on: the planned one, or what failover obtained in its place."""
        return self._substitute(self._planned_type(stage))

    def _substitute(self, itype: InstanceType) -> InstanceType:
        """What failover obtained in place of ``itype`` (followed when it failed over again), else ``itype``."""
        seen = {itype.key}
        while itype.key in self.substitutes and self.substitutes[itype.key].key not in seen:
            itype = self.substitutes[itype.key]
            seen.add(itype.key)
        return itype

    def _same_type(self, a: StagePlan, b: StagePlan) -> bool:
        return self._stage_itype(a).key == self._stage_itype(b).key and a.spot == b.spot

    def _serves(self, entry: PoolInstance, stage: StagePlan) -> bool:
        """Whether ``entry`` may run ``stage``'s trials: the stage's type on a market that fits, or (a spot stage
        moved to on-demand) its fall-back type bought on-demand."""
        if not self._fits(entry.spot, stage):
            return False
        if entry.itype.key == self._stage_itype(stage).key:
            return True
        return not entry.spot and entry.itype.key == self._fallback_itype(stage).key

    def _fits(self, spot: bool, stage: StagePlan) -> bool:
        """Whether an instance bought on this market may serve ``stage``: its planned market, or on-demand for a
        spot stage once the spot policy moved the run's spot work to on-demand (those instances carry over)."""
        planned = S.stage_market(stage) is Market.SPOT
        return spot == planned or (planned and not spot and self._fell_back)

    def _start_epoch(self, trial_id: str, stage: StagePlan) -> int:
        """First epoch to run: right after the trial's newest checkpoint (journal or disk) within this stage."""
        base = stage.epochs - stage.epochs_this_stage
        trial = self.state.trials[trial_id]
        ckpt = max(
            (
                e
                for e in (trial.checkpoint_epoch, latest_epoch(self.run_dir / "checkpoints" / trial_id))
                if e is not None
            ),
            default=None,
        )
        return ckpt + 1 if ckpt is not None and ckpt + 1 > base else base

    def _settle(
        self, g: int, stage: StagePlan, trial_id: str, start: int, metrics: dict[str, float | None]
    ) -> int | None:
        """The first epoch a pending trial must run, past its newest checkpoint; None if it needs none.

        Asked once when a stage starts and again right before the trial starts: a checkpoint can
        appear after a trial was queued (the workers of a lost local node may outlive it by a moment).
        A trial whose checkpoint covers the stage's last epoch (the executor died, or its instance was
        lost, right after the save) takes its metric from the journal (a trial reports an epoch before
        checkpointing it); only if that report never arrived is the last epoch run again.
        """
        if (g, trial_id) in self._rerun_last:
            return start
        start = max(start, self._start_epoch(trial_id, stage))
        if start < stage.epochs:
            return start
        epochs = self.journal.state.trials[trial_id].epochs  # the sink's epochs included
        metric = epochs.get(stage.epochs - 1, {}).get(self.spec.metric.name)
        if metric is None:
            self._rerun_last.add((g, trial_id))
            return stage.epochs - 1
        metrics[trial_id] = metric  # the journal's fold sets the trial's finished stage
        self.journal.record(
            J.TrialStopped(
                trial_id=trial_id,
                stage=g,
                reason="finished",
                metric=metric,
                note="every epoch of the stage was checkpointed before the interruption",
            )
        )
        return None

    def _start_next(
        self, g: int, stage: StagePlan, pending: list[tuple[str, int]], slot: Slot, metrics: dict[str, float | None]
    ) -> None:
        """Start the first pending trial that still has epochs to run on a free slot."""
        while pending:
            trial_id, start = pending.pop(0)
            settled = self._settle(g, stage, trial_id, start, metrics)
            if settled is not None:
                self._start_trial(g, stage, trial_id, settled, slot)
                return

    def _run_stage(self, g: int, stage: StagePlan) -> dict[str, float | None]:
        itype = self._stage_itype(stage)
        trials = self._stage_trials(g)
        metrics: dict[str, float | None] = {}
        pending: list[tuple[str, int]] = []
        for trial_id in trials:
            trial = self.state.trials[trial_id]
            if g in trial.finished_stages:
                metrics[trial_id] = trial.finished_stages[g]
                continue
            start = self._settle(g, stage, trial_id, self._start_epoch(trial_id, stage), metrics)
            if start is not None:
                pending.append((trial_id, start))
        self.journal.record(
            J.StageStarted(
                stage=g,
                bracket=stage.bracket,
                stage_in_bracket=stage.stage,
                trials=len(trials),
                to_run=len(pending),
                epochs=stage.epochs,
                instance_type=stage.instance_type,
                instances=stage.instances,
                workers_per_trial=stage.workers_per_trial,
                predicted_duration_s=stage.predicted_duration_s,
            )
        )
        self._claim_instances(g, stage, itype, needed=bool(pending))
        failures: list[str] = []
        slots: list[Slot] = []
        trial_seconds: list[float] = []
        self._stage_seconds = trial_seconds  # the spot decisions' estimate of this stage's remainder reads them
        while not self.prefetch.may_promote(len(pending) + len(self.running)):
            self._check_deadline()
            self._collect_provisioned()
            self._collect_terminations()
            self._check_liveness(g, stage, slots, pending)
            used = {i for s in slots for i in s.instance_ids}
            unused = [p.id for p in self._stage_pool(g) if p.ready and p.id not in used and self._workers_up(p)]
            if unused:  # instances came up: add their slots (a spanning trial waits for enough of them)
                slots.extend(make_slots(unused, itype.workers, stage.workers_per_trial))
            for slot in slots:
                if not pending:
                    break
                if slot.free and not self._noticed.keys() & set(slot.instance_ids):  # a noticed instance takes none
                    self._start_next(g, stage, pending, slot, metrics)
            finished = self._wait_some()
            lost_now: dict[str, str] = {}
            stopped: list[tuple[str, tuple[str, ...]]] = []
            preempted: list[str] = []  # instances whose trials stopped on a notice
            for run in finished:
                metric, error, seconds, lost = self._collect_trial(g, stage, run)
                run.slot.trial_id = None
                if run.preempted:  # first in line again, after its checkpoint, on another instance
                    pending.insert(0, (run.trial_id, self._start_epoch(run.trial_id, stage)))
                    preempted.extend(run.slot.instance_ids)
                    continue
                if lost:  # the instance went away, not the training: restart from the checkpoint elsewhere
                    lost_now.update(lost)
                    stopped.append((run.trial_id, run.slot.instance_ids))
                    continue
                if not run.cold:  # a task time as the simulator has it: a new node's worker start is not in it
                    trial_seconds.append(seconds)
                if error:
                    failures.append(error)
                metrics[run.trial_id] = metric
            if lost_now:
                self._handle_lost(g, lost_now, slots, pending, stopped=stopped)
            if preempted:  # the workers saw a notice first: take it now, before placing anything there again
                self._poll_notices(g, pending, ask=tuple(dict.fromkeys(preempted)))
            self._release_noticed(g, slots)
            if pending and not self._stage_pool(g):  # every instance went (noticed, lost): the stage needs one
                self._refill(g, stage, pending)
            if not pending:
                self._release_idle(g, slots)
            self._maybe_prefetch(g, stage, pending, trial_seconds, slots)
            self._report_progress(g, len(pending))
        if trials and all(metrics.get(t) is None for t in trials) and failures:
            raise ExecutionError(f"all {len(trials)} trials of stage {g} failed; first error: {failures[0]}")
        self._release_idle(g, slots, stage_done=True)
        return {t: metrics.get(t) for t in trials}

    # -- trials ----------------------------------------------------------------------------
    def _slot_itype(self, slot: Slot, stage: StagePlan) -> InstanceType:
        """The type of the instance a slot is on: a trial's workers ask Ray for what that node has (an
        instance kept across a re-plan or a failover may be of another type than its new stage's)."""
        entry = self._entry(slot.instance_ids[0]) if slot.instance_ids else None
        return entry.itype if entry is not None else self._stage_itype(stage)

    def _start_trial(self, g: int, stage: StagePlan, trial_id: str, start: int, slot: Slot) -> None:
        trial = self.state.trials[trial_id]
        ckpt_dir = self.run_dir / "checkpoints" / trial_id
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        handle = self.runtime.start(
            event_sink=self.sink,
            trial_id=trial_id,
            config=trial.config,
            entry_point=self.spec.train,
            code_dir=self.spec.base_dir,
            start_epoch=start,
            end_epoch=stage.epochs,
            placement=slot.placement,
            checkpoint_dir=str(ckpt_dir),
            checkpoint_every=S.checkpoint_every(self.plan, stage),
            device=self.devices.for_type(self._slot_itype(slot, stage)),
            timeout_s=self.trial_timeout_s,
            pool=self.workers,
            **self._env_field(slot),
        )
        slot.trial_id = trial_id
        cold = not set(slot.instance_ids) <= self._ran_on
        self._ran_on.update(slot.instance_ids)
        run = RunningTrial(trial_id, slot, handle, start, stage.epochs, self.clock.time(), cold=cold)
        self.running[handle.done_ref] = run
        self.journal.record(
            J.TrialStarted(
                trial_id=trial_id,
                stage=g,
                start_epoch=start,
                end_epoch=stage.epochs,
                workers=len(slot.placement),
                instances=list(slot.instance_ids),
                placement=list(slot.placement),
                from_checkpoint=latest_epoch(ckpt_dir),
            )
        )

    def _wait_some(self) -> list[RunningTrial]:
        ready = self.cluster.wait(list(self.running), POLL_S)
        return [self.running.pop(ref) for ref in ready]

    def _collect_trial(
        self, g: int, stage: StagePlan, run: RunningTrial
    ) -> tuple[float | None, str | None, float, dict[str, str]]:
        """Gather a finished trial; journal it. On an error whose instance was lost, return those instances.

        A GPU type whose workers find no usable CUDA fails every trial placed on it: that trial is journaled as
        failed and the run stops at once (:class:`GpuUnavailableError`, naming the type) instead of paying for
        the rest of the stage to fail the same way."""
        trial = self.state.trials[run.trial_id]
        metric, error = None, None
        unusable: GpuUnavailableError | None = None
        try:
            outcome = run.handle.result(timeout_s=RESULT_TIMEOUT_S)
        except TrialPreempted as exc:  # its instance got a notice: checkpointed, restarts on the replacement
            run.handle.stop()
            run.preempted = True
            self.journal.record(
                J.TrialStopped(
                    trial_id=run.trial_id,
                    stage=g,
                    reason="preempted",
                    metric=None,
                    error=str(exc),
                    start_epoch=run.start_epoch,
                    end_epoch=run.end_epoch,
                    seconds=self.clock.time() - run.started_at,
                    setup_s=None,
                    checkpoint_epoch=latest_epoch(self.run_dir / "checkpoints" / run.trial_id),
                )
            )
            return None, None, self.clock.time() - run.started_at, {}
        except TrainingError as exc:
            error = str(exc)
            outcome = None
        except Exception as exc:  # noqa: BLE001 - a dead worker or a timeout fails the trial, not the run
            error = f"{type(exc).__name__}: {exc}"
            outcome = None
            unusable = exc if isinstance(exc, GpuUnavailableError) else None
        finally:
            run.handle.stop()
        seconds = self.clock.time() - run.started_at
        if outcome is not None:
            reports = sorted(outcome.reports, key=lambda r: r.epoch)
            for report in reports:  # the epochs themselves reach the state through the journal (the sink's lines)
                key = f"{stage.instance_type}/{stage.workers_per_trial}"
                self.epoch_seconds.setdefault(key, []).append(float(report.seconds))
            final = [r for r in reports if r.epoch == run.end_epoch - 1] or reports[-1:]
            if final:
                metric = final[0].metrics.get(self.spec.metric.name)
            self.setup_seconds.append(float(outcome.setup_s))
            shape = f"{self._planned_type(stage).device}/{len(run.slot.placement)}/{len(run.slot.instance_ids)}"
            self.iteration_latencies.setdefault(shape, []).extend(float(x) for x in outcome.iteration_latencies_s)
            seconds = outcome.finished_at - run.started_at
            if metric is None:
                error = (
                    f"trial {run.trial_id} reported no metric {self.spec.metric.name!r} for epoch {run.end_epoch - 1}"
                )
        if outcome is None and error is not None:
            lost = self._confirm_lost(run.slot.instance_ids, wait_s=LOSS_CONFIRM_S)
            if lost:
                self.journal.record(
                    J.TrialStopped(
                        trial_id=run.trial_id,
                        stage=g,
                        reason="instance_lost",
                        metric=None,
                        error=error,
                        lost=sorted(lost),
                        start_epoch=run.start_epoch,
                        end_epoch=run.end_epoch,
                        seconds=seconds,
                        setup_s=None,
                        checkpoint_epoch=latest_epoch(self.run_dir / "checkpoints" / run.trial_id),
                    )
                )
                return None, None, seconds, lost
        reason = "finished" if error is None else "failed"
        ckpt = (
            trial.checkpoint_epoch if outcome is None or outcome.checkpoint_epoch is None else outcome.checkpoint_epoch
        )
        self.journal.record(
            J.TrialStopped(
                trial_id=run.trial_id,
                stage=g,
                reason=reason,
                metric=metric,
                error=error,
                start_epoch=run.start_epoch,
                end_epoch=run.end_epoch,
                seconds=seconds,
                setup_s=None if outcome is None else outcome.setup_s,
                checkpoint_epoch=ckpt,
                **_devices_used(outcome),
            )
        )
        if unusable is not None:
            raise unusable
        return metric, error, seconds, {}  # a finished trial's stage metric: in the state, by the journal's fold

    # -- lost instances --------------------------------------------------------------------
    def _confirm_lost(self, instance_ids: tuple[str, ...] | list[str], *, wait_s: float) -> dict[str, str]:
        """Which of these instances are gone (id → ``spot-interruption`` | ``lost``), asking for up to ``wait_s``.

        The backend says whether the cloud (or the local process group) still runs it, and why not;
        Ray says whether its node still offers ``rb-node-<id>`` (only for nodes Ray has shown before).
        """
        ids = list(dict.fromkeys(instance_ids))
        deadline = self.clock.monotonic() + wait_s
        while True:
            lost: dict[str, str] = {}
            try:
                lost.update(self.backend.check_lost(ids))
            except Exception:  # noqa: BLE001 - a cloud hiccup: Ray's view below still counts
                pass
            try:
                for ident in self._gone_from_ray(ids, self.cluster.node_resources()):
                    lost.setdefault(ident, "lost")
            except Exception:  # noqa: BLE001 - Ray's view is asked again on the next try
                pass
            if lost or self.clock.monotonic() >= deadline:
                return lost
            self.clock.sleep(0.5)

    def _gone_from_ray(self, ids: list[str], resources: dict[str, float]) -> list[str]:
        """Those of ``ids`` whose ``rb-node-<id>`` resource Ray showed before and no longer does."""
        gone = []
        for ident in ids:
            if node_resource(ident) in resources:
                self._seen_in_ray.add(ident)
            elif ident in self._seen_in_ray:
                gone.append(ident)
        return gone

    def _check_liveness(self, g: int, stage: StagePlan, slots: list[Slot], pending: list[tuple[str, int]]) -> None:
        """Every few seconds: is every ready instance's Ray node still there? Handle the ones that are gone."""
        now = self.clock.monotonic()
        if now - self._last_liveness < LIVENESS_EVERY_S:
            return
        self._last_liveness = now
        self._poll_notices(g, pending)
        self._watch_ready()
        lost = self._poll_lost()
        if lost:
            self._handle_lost(g, lost, slots, pending, stopped=[])

    def _watch_ready(self) -> None:
        """A notice watcher on every ready spot instance that has none yet (Ray may show a node late)."""
        for entry in self.pool.values():
            if entry.ready and not entry.released and entry.spot and not self.watchers.watching(entry.id):
                self._watch(entry)

    def _poll_lost(self) -> dict[str, str]:
        """Ready instances whose Ray node is gone, confirmed (id → reason); none when Ray does not answer."""
        try:
            resources = self.cluster.node_resources()
        except Exception:  # noqa: BLE001 - the next poll asks again
            return {}
        ready = [p.id for p in self.pool.values() if p.id is not None and p.ready and not p.released]
        suspects = self._gone_from_ray(ready, resources)
        return self._confirm_lost(suspects, wait_s=0.0) if suspects else {}

    def _handle_lost(
        self,
        g: int,
        lost: dict[str, str],
        slots: list[Slot],
        pending: list[tuple[str, int]],
        *,
        stopped: list[tuple[str, tuple[str, ...]]],
    ) -> None:
        """Journal and bill the lost instances, stop and re-queue their trials, and request replacements.

        ``stopped``: (trial, its instances) already collected and journaled by the caller.
        """
        now = self.clock.time()
        gone = set(lost)
        affected: dict[str, list[str]] = {ident: [] for ident in lost}
        for trial_id, instance_ids in stopped:
            for ident in gone & set(instance_ids):
                affected[ident].append(trial_id)
        requeue = [trial_id for trial_id, _ in stopped]
        for ref, run in list(self.running.items()):  # the other trials on those instances die with them
            hit = gone & set(run.slot.instance_ids)
            if not hit:
                continue
            del self.running[ref]
            try:
                run.handle.stop()
            except Exception:  # noqa: BLE001 - its workers are gone already
                pass
            run.slot.trial_id = None
            self.journal.record(
                J.TrialStopped(
                    trial_id=run.trial_id,
                    stage=g,
                    reason="instance_lost",
                    metric=None,
                    error=f"instance {', '.join(sorted(hit))} lost",
                    lost=sorted(hit),
                    start_epoch=run.start_epoch,
                    end_epoch=run.end_epoch,
                    seconds=now - run.started_at,
                    setup_s=None,
                    checkpoint_epoch=latest_epoch(self.run_dir / "checkpoints" / run.trial_id),
                )
            )
            requeue.append(run.trial_id)
            for ident in hit:
                affected[ident].append(run.trial_id)
        stage = self.plan.stages[g]
        requeue_first(pending, requeue, lambda trial_id: self._start_epoch(trial_id, stage))
        slots[:] = [s for s in slots if not gone & set(s.instance_ids)]
        for ident, reason in lost.items():
            if ident in self._lost:  # handled already (another of its trials reported first)
                continue
            self._lost.add(ident)
            self.losses += 1
            self.counted_losses += self.loss_policy.counts(reason)
            entry = self._entry(ident)
            self.journal.record(
                J.InstanceLost(
                    t=now,
                    id=ident,
                    reason=reason,
                    stage=g,
                    instance_type=entry.itype.name if entry is not None else None,
                    trials=sorted(set(affected.get(ident, []))),
                    losses=self.losses,
                )
            )
            self.journal.record(J.InstanceTerminated(t=now, id=ident, reason="lost"))  # billed up to the loss
            if entry is not None:
                entry.terminated_at = now
            self._seen_in_ray.discard(ident)
            self._unwatch(ident)
            if self.workers is not None:
                try:
                    self.workers.shrink(node_resource(ident))
                except Exception:  # noqa: BLE001 - its idle workers died with it
                    pass
            self._terminator.submit(self.instances.terminate_now, ident)  # make sure the cloud stops billing it
            if entry is None:
                continue
            entry.released = True
            if ident in self._replaced:  # its replacement was requested when its preemption notice came
                continue
            if self.loss_policy.replace(
                serves=entry.assigned_stage, current=g, work_left=bool(pending), losses=self.counted_losses
            ):
                self._replace(entry, ident, reason, waiting=len(pending))
        if self.loss_policy.exhausted(self.counted_losses):
            raise ExecutionError(
                f"{self.counted_losses} instances were lost during this run, not counting spot "
                f"interruptions (limit {self.loss_policy.max_losses}); the cloud keeps taking them "
                f"away — resume later with `rubberband run --resume {self.run_dir}`"
            )

    # -- instances -------------------------------------------------------------------------
    def _entry(self, instance_id: str) -> PoolInstance | None:
        """The pool entry of a provisioned instance (None: not one of this run's, or not up yet)."""
        return self.instances.entry(instance_id)

    def _stage_pool(self, g: int) -> list[PoolInstance]:
        return self.instances.of_stage(g)

    def _claim_instances(self, g: int, stage: StagePlan, itype: InstanceType, *, needed: bool) -> None:
        """Give stage ``g`` its instances: reuse same-type ones, request the rest, release the others."""
        for p in list(self.pool.values()):
            if p.released or p.assigned_stage >= g:
                continue
            if self._serves(p, stage) and (len(self._stage_pool(g)) < stage.instances or not self.elastic):
                p.assigned_stage = g
                self.journal.record(J.Decision(kind="keep", id=p.id or p.token, stage=g))
            else:
                self._release(p, "not needed by stage %d" % g)
        if not needed:
            return
        missing = stage.instances - len(self._stage_pool(g))
        if missing > 0:
            spot = self._buy_spot(stage, trigger="start", waiting=stage.trials)
            for _ in range(missing):
                self._request(g, itype, spot)

    def _request(self, g: int, itype: InstanceType, spot: bool) -> PoolInstance:
        """Request one ``itype`` for stage ``g``; a spot stage's instance bought on-demand (the spot policy's
        decision, or no spot capacity anywhere where the stage allows it) is of its fall-back type."""
        stage = self.plan.stages[g]
        fallback = self._fallback_itype(stage) if S.stage_market(stage) is Market.SPOT else None
        if fallback is not None and not spot:
            itype = fallback
        return self.instances.request(
            g, itype, spot, on_demand_fallback=spot and S.on_demand_allowed(stage), on_demand_type=fallback
        )

    def _collect_provisioned(self) -> None:
        """Take the instances that came up: note failover's substitutes and start-ups, warm their workers and
        watch for notices, or release one no longer wanted."""
        for arrival in self.instances.collect():
            entry = arrival.entry
            if arrival.substituted:
                self.substitutes[arrival.requested.key] = entry.itype
            self._fell_back = self._fell_back or arrival.moved_to_on_demand
            self.startup_seconds.setdefault(entry.itype.name, []).append(arrival.startup_s)
            if entry.released:  # no longer wanted while it was starting
                entry.released = False
                self._release(entry, "no longer needed when it came up")
            elif self.workers is not None:  # start its worker processes now, off the critical path
                entry.warming = self.workers.warm(
                    node_resource(entry.id), entry.itype.workers, wait=False, device=self.devices.for_type(entry.itype)
                )
            if not entry.released:
                self._watch(entry)

    def _workers_up(self, entry: PoolInstance) -> bool:
        """Whether a ready instance's worker processes answer: only then does it take trials, as the simulator
        has it (an instance is ready after its start-up plus the worker start), so a waiting trial goes to a
        slot that frees sooner rather than wait on a node whose workers are still starting."""
        if not entry.warming:
            return True
        import ray

        try:
            done, _ = ray.wait(entry.warming, num_returns=len(entry.warming), timeout=0)
        except Exception:  # noqa: BLE001 - the trial on it will tell (and loss detection)
            done = entry.warming
        if len(done) == len(entry.warming):
            entry.warming = []
        return not entry.warming

    def _release(self, entry: PoolInstance, why: str) -> None:
        if entry.released:
            return
        entry.released = True
        if entry.id is None:  # still provisioning: released as soon as it is up
            return
        self.journal.record(J.Decision(kind="release", id=entry.id, stage=self.stage_index, reason=why))
        self._unwatch(entry.id)
        if self.workers is not None:
            self.workers.shrink(node_resource(entry.id))
        self.instances.terminate(entry, why)

    def _collect_terminations(self, wait: bool = False) -> None:
        self.instances.collect_terminations(wait)

    def _release_idle(self, g: int, slots: list[Slot], *, stage_done: bool = False) -> None:
        """No pending trials: keep idle instances the next stage can use, release the rest now."""
        busy = {i for s in slots if not s.free for i in s.instance_ids}
        nxt = self.plan.stages[g + 1] if g + 1 < len(self.plan.stages) else None
        if not self.elastic and (nxt is not None or not stage_done):
            for entry in self._stage_pool(g):
                if stage_done:
                    entry.assigned_stage = g + 1
            return
        moving = {i for s in slots if not s.free for i in s.instance_ids if i in self._noticed}
        pool = self._stage_pool(g)
        later = self._carriable(nxt, [p for p in pool if p.id in busy])
        for entry in pool:
            if entry.id in busy:  # a still-booting instance is idle too: kept or released at once
                continue
            if entry.replaces in moving and not stage_done:  # its trials come over at their next checkpoint
                continue
            same = self._carriable(nxt, [entry]) == 1
            if nxt is not None and self.prefetch.keep_for_next(
                same, len(self._stage_pool(g + 1)), nxt.instances, later=later
            ):
                entry.assigned_stage = g + 1
                self.journal.record(J.Decision(kind="keep", id=entry.id or entry.token, stage=g + 1))
            else:
                self._release(entry, f"idle: stage {g} needs it no more")

    def _carriable(self, nxt: StagePlan | None, entries: list[PoolInstance]) -> int:
        """How many of ``entries`` the stage ``nxt`` could keep: its type and market, and no preemption notice."""
        if nxt is None:
            return 0
        return sum(1 for e in entries if self._serves(e, nxt) and e.id not in self._noticed)

    def _prefetch_lead(self, itype: InstanceType) -> float:
        """The prefetch policy's lead time for ``itype``: its start-up quantile over what this run measured,
        else the profile's samples, else the planner model's documented per-cloud defaults."""
        return self.prefetch.lead_s(startup_samples(itype, self.startup_seconds, self.profile))

    def _maybe_prefetch(
        self, g: int, stage: StagePlan, pending: list, trial_seconds: list[float], slots: list[Slot]
    ) -> None:
        """Request the next stage's extra instances once this stage's remaining time ≤ the policy's lead time."""
        if g + 1 >= len(self.plan.stages) or (g + 1) in self.prefetched:
            return
        nxt = self.plan.stages[g + 1]
        itype = self._stage_itype(nxt)
        reusable = self.prefetch.carried(self._same_type(stage, nxt), stage.instances, nxt.instances)
        extra = nxt.instances - reusable - len(self._stage_pool(g + 1))
        if extra <= 0:
            self.prefetched.add(g + 1)
            return
        n_slots = max(1, len(slots))
        per_trial = mean_task_s(trial_seconds, stage, slots=n_slots)  # the plan's: prefetch timed as predicted
        if per_trial is None:
            return
        now = self.clock.time()
        remaining = self.prefetch.remaining_s(
            per_trial_s=per_trial,
            waiting=len(pending),
            slots=n_slots,
            running_elapsed_s=[now - r.started_at for r in self.running.values()],
        )
        lead = self._prefetch_lead(itype)
        started = bool(self.running) or bool(trial_seconds)
        if self.prefetch.should_request(remaining, lead, first_task_started=started):
            self.prefetched.add(g + 1)
            self.journal.record(
                J.Decision(
                    kind="prefetch",
                    stage=g + 1,
                    count=extra,
                    instance_type=itype.name,
                    estimated_remaining_s=remaining,
                    lead_s=lead,
                    quantile=self.prefetch.quantile,
                )
            )
            spot = self._buy_spot(nxt, trigger="prefetch", waiting=len(pending))
            for _ in range(extra):
                self._request(g + 1, itype, spot)

    # -- spot: fall-back to on-demand, preemption notices -----------------------------------
    def _spot_situation(self, *, waiting: int, replacing: bool) -> SpotSituation:
        """What the spot policy looks at, from now: time to the deadline, the run's predicted remaining time at the
        simulator's quantile (:meth:`_work_left_s`; plus a replacement's start-up when one is awaited), and one restart
        of the current stage."""
        g = min(self.stage_index, len(self.plan.stages) - 1)
        stage = self.plan.stages[g]
        now = self.clock.time()
        lead = self._prefetch_lead(self._stage_itype(stage))
        work = self._work_left_s(g, waiting=waiting, awaited_s=lead if replacing else 0.0)
        key = f"{stage.instance_type}/{stage.workers_per_trial}"
        interval = (
            statistics.mean(self.epoch_seconds[key])
            if self.epoch_seconds.get(key)
            else self._per_trial_s(g) / max(1, stage.epochs_this_stage)
        )
        restart = S.restart_s(
            startup_s=lead,
            restore_s=statistics.mean(self.setup_seconds) if self.setup_seconds else 0.0,
            checkpoint_interval_s=interval,
        )
        return SpotSituation(
            time_left_s=self.deadline_s - (now - self.state.first_started_at),
            work_left_s=work,
            restart_s=restart,
            on_spot=self._on_spot,
        )

    def _work_left_s(self, g: int, *, waiting: int, awaited_s: float) -> float:
        """The run's predicted remaining time: stage ``g``'s remainder (``waiting`` trials not started) and every
        later stage; ``awaited_s``: a replacement's start-up the stage waits for. (Parallel brackets: the longest
        remaining bracket, :class:`~rubberband.executor.brackets.ParallelController`.)"""
        return self._stages_left_s(
            g, len(self.plan.stages), waiting=waiting, running=list(self.running.values()), awaited_s=awaited_s
        )

    def _stages_left_s(self, g: int, end: int, *, waiting: int, running: list[RunningTrial], awaited_s: float) -> float:
        """Stages ``g … end − 1`` from now, as the spot decisions see them (:data:`~rubberband.executor.spot.
        DECISION_QUANTILE`, the simulator's view): ``g``'s remainder as the prefetch estimate has it (``running``
        trials' rest + waiting waves × the mean trial time), the later ones' predictions scaled by the slowdown so
        far, and ``awaited_s``; each stage's work on its fall-back type (:func:`~rubberband.executor.spot.
        decision_outlook`), where Uniform Progress measures it."""
        stage = self.plan.stages[g]
        itype = self._stage_itype(stage)
        n_slots = max(1, slot_count(stage.instances, itype.workers, stage.workers_per_trial))
        now = self.clock.time()
        current = self.prefetch.remaining_s(
            per_trial_s=self._per_trial_s(g),
            waiting=waiting,
            slots=n_slots,
            running_elapsed_s=[now - r.started_at for r in running],
        )
        cur = self._stage_outlook(g)
        conf = S.DECISION_QUANTILE
        ratio = S.at_confidence(cur.p50_s, cur.p95_s, conf) / cur.p50_s if cur.p50_s > 0 else 1.0
        return S.work_left_s(
            current_remaining_s=current * S.fallback_slowdown(stage),
            current_ratio=ratio,
            later=[S.decision_outlook(self.plan, i) for i in range(g + 1, end)],
            confidence=conf,
            slowdown=self._slowdown(),
            waiting_for_instance_s=awaited_s,
        )

    def _slowdown(self) -> float:
        """Actual over predicted duration of the stages finished so far (1 before any)."""
        done = [i for i, r in self.state.stages.items() if r.finished_at and i < len(self.plan.stages)]
        return slowdown(self._finished_durations(done))

    def _finished_durations(self, stages: list[int]) -> list[tuple[float, float]]:
        """(actual, predicted) duration of each of these finished stages."""
        return [
            (
                self.state.stages[i].finished_at - self.state.stages[i].started_at,
                self.plan.stages[i].predicted_duration_s or 0.0,
            )
            for i in stages
        ]

    def _per_trial_s(self, g: int) -> float:
        """Stage ``g``'s mean task time: measured in this run (not cold), else the plan's, else its duration per
        wave."""
        stage = self.plan.stages[g]
        n_slots = slot_count(stage.instances, self._stage_itype(stage).workers, stage.workers_per_trial)
        return mean_task_s(self._stage_seconds_of(g), stage, slots=n_slots) or 0.0

    def _stage_seconds_of(self, g: int) -> list[float]:
        """The task times (not cold) measured so far in stage ``g``, the one running."""
        return self._stage_seconds

    def _stage_outlook(self, i: int) -> S.StageOutlook:
        """Stage ``i``'s predicted duration: the plan's p50 (and p95 where the plan's prediction has it)."""
        return S.stage_outlook(self.plan, i)

    def _buy_spot(
        self, stage: StagePlan, *, trigger: str, waiting: int, instance: str | None = None, replacing: bool = False
    ) -> bool:
        """Spot (True) or on-demand for instances of ``stage`` requested now, as :class:`SpotPolicy` decides.

        Only for stages planned on spot. Journaled (``decision`` kind ``spot``) on every preemption, notice or
        loss, and whenever the market changes; the run's spot stages stay on-demand once moved (the policy's
        ``return_factor`` says when they may go back).
        """
        if S.stage_market(stage) is not Market.SPOT:
            return False
        situation = self._spot_situation(waiting=waiting, replacing=replacing)
        market = self.spot_policy.decide(situation)
        note = ""
        if market is Market.ON_DEMAND and not S.on_demand_allowed(stage):
            market, note = Market.SPOT, "; the plan allows no on-demand fall-back"
        was = self._on_spot
        self._on_spot = market is Market.SPOT
        self._fell_back = self._fell_back or not self._on_spot
        if trigger in ("preemption", "notice", "lost") or self._on_spot != was:
            if market is Market.SPOT:
                why = (
                    f"slack {situation.slack_s:.0f} s after one more restart ({situation.restart_s:.0f} s) "
                    f"exceeds the margin: spot"
                )
            else:
                why = (
                    f"slack {situation.slack_s:.0f} s after one more restart ({situation.restart_s:.0f} s) is at "
                    f"most the margin ({self.spot_policy.margin_s:g} s): on-demand keeps the deadline"
                )
            self.journal.record(
                J.Decision(
                    kind="spot",
                    stage=self.stage_index,
                    for_stage=self.plan.stages.index(stage),
                    trigger=trigger,
                    id=instance,
                    previous=(Market.SPOT if was else Market.ON_DEMAND).value,
                    confidence=self.plan.confidence,
                    quantile=S.DECISION_QUANTILE,  # of the predictions the decision saw (the simulator's)
                    **S.decision_fields(situation, market, self.spot_policy.margin_s),
                    reason=why + note,
                )
            )
        return self._on_spot

    def _replace(self, entry: PoolInstance, ident: str, reason: str, *, waiting: int) -> PoolInstance:
        """Request the replacement of a lost (or noticed) instance: on the market the spot policy says."""
        target = self.plan.stages[entry.assigned_stage]
        spot = entry.spot
        if entry.spot:
            trigger = "notice" if ident in self._noticed else "preemption" if reason == "spot-interruption" else "lost"
            spot = self._buy_spot(target, trigger=trigger, waiting=waiting, instance=ident, replacing=True)
        replacement = self._request(entry.assigned_stage, self._stage_itype(target), spot)
        replacement.replaces = ident if ident in self._noticed else None
        self._replaced.add(ident)
        self.journal.record(
            J.Decision(
                kind="replace",
                id=ident,
                stage=entry.assigned_stage,
                token=replacement.token,
                instance_type=replacement.itype.name,
                reason=reason,
                spot=spot,
            )
        )
        return replacement

    def _watch(self, entry: PoolInstance) -> None:
        """Start the preemption-notice watcher of a ready spot instance (when its cloud posts notices)."""
        if not entry.spot:
            return
        error = self.watchers.watch(entry.id, node_resource(entry.id))
        if error is not None:
            self.journal.record(J.Decision(kind="notice_watcher", id=entry.id, started=False, error=error))

    def _unwatch(self, ident: str) -> None:
        self.watchers.unwatch(ident)

    def _env_field(self, slot: Slot) -> dict[str, Any]:
        env = self._trial_env(slot)
        return {"env": env} if env else {}  # only then: a stand-in runtime's TrialSpec need not know ``env``

    def _trial_env(self, slot: Slot) -> dict[str, str]:
        """The trial's environment: the watchers of its instances, which its workers ask at every checkpoint."""
        names = self.watchers.names(slot.instance_ids)
        return {WATCHERS_ENV: ",".join(names)} if names else {}

    def _poll_notices(self, g: int, pending: list[tuple[str, int]], *, ask: tuple[str, ...] = ()) -> None:
        """Preemption notices that came: journal each, and request its instance's replacement now.

        ``ask``: instances whose watchers to ask right now (a trial on them stopped on a notice: the controller
        must know before it places anything there again).
        """
        for ident, notice in self._notices_found(ask).items():
            self._take_notice(g, pending, ident, notice)

    def _notices_found(self, ask: tuple[str, ...] = ()) -> dict[str, Any]:
        """Instance → notice (None: none, or its watcher is gone) of the watchers that answered, and of ``ask``."""
        return self.watchers.found(ask)

    def _take_notice(self, g: int, pending: list[tuple[str, int]], ident: str, notice: dict[str, Any] | None) -> None:
        """A notice for ``ident`` (serving stage ``g``, whose ``pending`` trials wait): journal it, and request the
        instance's replacement now when the stage (or the next it is kept for) still needs it."""
        if notice is None or ident in self._noticed:
            return
        self.watchers.taken(ident)
        self._noticed[ident] = self.clock.time()
        entry = self._entry(ident)
        trials = sorted(r.trial_id for r in self.running.values() if ident in r.slot.instance_ids)
        self.journal.record(
            J.Decision(
                kind="notice",
                id=ident,
                stage=g,
                cloud=notice.get("cloud"),
                action=notice.get("action"),
                notice_time=notice.get("time"),
                trials=trials,
                reason="preemption notice: its trials stop after their next checkpoint; replacement requested now",
            )
        )
        if entry is None or entry.released:
            return
        wanted = LossPolicy.needed(serves=entry.assigned_stage, current=g, work_left=bool(pending or trials))
        if wanted and ident not in self._replaced:
            self._replace(entry, ident, "preemption-notice", waiting=len(pending) + len(trials))

    def _next_stage_of(self, g: int) -> int | None:
        """The stage that follows ``g`` (and may keep its instances): the next one of the plan."""
        return g + 1 if g + 1 < len(self.plan.stages) else None

    def _refill(self, g: int, stage: StagePlan, pending: list[tuple[str, int]]) -> None:
        """Trials wait and the stage has no instance left (none running, none coming): request its instances."""
        spot = self._buy_spot(stage, trigger="start", waiting=len(pending))
        for _ in range(stage.instances):
            entry = self._request(g, self._stage_itype(stage), spot)
            self.journal.record(
                J.Decision(
                    kind="replace",
                    id=None,
                    stage=g,
                    token=entry.token,
                    instance_type=entry.itype.name,
                    reason="no instance left for the stage's trials",
                    spot=spot,
                )
            )

    def _release_noticed(self, g: int, slots: list[Slot]) -> None:
        """A noticed instance whose trials have stopped takes no more: drop its slots and release it now."""
        if not self._noticed:
            return
        busy = {i for s in slots if not s.free for i in s.instance_ids}
        nxt = self._next_stage_of(g)
        for entry in self._stage_pool(g) + (self._stage_pool(nxt) if nxt is not None else []):
            if entry.id in self._noticed and entry.id not in busy and entry.ready:
                slots[:] = [s for s in slots if entry.id not in s.instance_ids]
                self._release(entry, "preemption notice")

    # -- decisions -------------------------------------------------------------------------
    def _check_deadline(self) -> None:
        if self._signal is not None:
            raise Interrupted(
                f"run stopped by {self._signal}; every instance was terminated; "
                f"resume with `rubberband run --resume {self.run_dir}`"
            )
        elapsed = self.clock.time() - self.state.first_started_at
        state = self.deadline.state(elapsed)
        if state is not DeadlineState.ON_TIME and not self._deadline_passed:
            self._deadline_passed = True
            self.journal.record(
                J.Decision(
                    kind="deadline_passed",
                    stage=self.stage_index,
                    elapsed_s=round(elapsed, 3),
                    deadline_s=self.deadline_s,
                    overrun_s=None if math.isinf(self.overrun_s) else self.overrun_s,
                    note="late: the run goes on until the deadline plus the allowed overrun",
                )
            )
        if state is DeadlineState.OVER:
            allowed = f" plus the allowed overrun ({format_duration(self.overrun_s)})" if self.overrun_s else ""
            raise DeadlineExceeded(
                f"run passed its deadline ({format_duration(self.deadline_s)}){allowed} in stage "
                f"{self.stage_index}; every instance was terminated; to finish it anyway: "
                f"rubberband run --resume {self.run_dir} --overrun none"
            )

    def _maybe_replan(self, g: int) -> None:
        """At the boundary before stage ``g``: re-plan the rest if the deadline is at risk or it pays."""
        done = [s for s in range(g) if s in self.state.stages and self.state.stages[s].finished_at]
        outlook = boundary_outlook(
            elapsed_s=self.clock.time() - self.state.first_started_at,
            finished=self._finished_durations(done),
            remaining_predicted_s=sum(s.predicted_duration_s or 0.0 for s in self.plan.stages[g:]),
            deadline_s=self.deadline_s,
        )
        decision = outlook.decision_fields(g)
        request = self._replan_request(g, outlook.elapsed_s, outlook.at_risk, self.plan.stages[g:])
        if request.unavailable:
            self._replan_around(g, request, decision)
            return
        self._replan_decide(g, request, decision, outlook.remaining_s)

    def _replan_request(
        self, g: int, elapsed: float, at_risk: bool, rest: list[StagePlan], **extra: Any
    ) -> ReplanRequest:
        """What the re-planner is told at the boundary before stage ``g`` (whose kept instances run already)
        about the stages ``rest``; ``extra``: more :class:`ReplanRequest` fields (parallel brackets)."""
        spent = bill_run(self.journal.state, now=self.clock.time()).total_usd
        running: dict[str, int] = {}
        for entry in self._stage_pool(g):
            running[entry.itype.key] = running.get(entry.itype.key, 0) + 1
        return ReplanRequest(
            spec=self.spec,
            plan=self.plan,
            next_stage=g,
            elapsed_s=elapsed,
            spent_usd=spent,
            remaining_deadline_s=max(1.0, self.deadline_s - elapsed),
            epoch_seconds=dict(self.epoch_seconds),
            setup_seconds=list(self.setup_seconds),
            startup_s=dict(self.startup_seconds),
            at_risk=at_risk,
            iteration_latencies=dict(self.iteration_latencies),
            running=running,
            unavailable=tuple(self._unavailable(rest)),
            **extra,
        )

    def _replan_decide(self, g: int, request: ReplanRequest, decision: dict[str, Any], remaining_pred: float) -> None:
        """Ask the re-planner for the stages of ``request`` (before stage ``g``), let the :class:`LatenessPolicy`
        decide from both outlooks, journal the decision, take the proposal when it says so, and stop the run
        (:class:`RunStopped`) on ``stop``. ``remaining_pred``: the run's remaining time by its stage predictions
        scaled by the slowdown so far (the current plan's outlook without a re-planner)."""
        positions = request.positions()
        answer, note = self._ask_replanner(request)
        candidate = answer.proposal
        rest = [self.plan.stages[i] for i in positions]
        problem = (
            None
            if candidate is None
            else proposal_problem(candidate.stages, rest, unavailable=request.unavailable, key_of=self._planned_key)
        )
        if problem is not None:
            candidate, note = None, problem
        judged = judge_proposal(
            self.lateness,
            rest=rest,
            candidate=candidate,
            at_risk=request.at_risk,
            current_p_meet=answer.current_p_meet,
            current_jct_p50_s=answer.current_jct_p50_s,
            remaining_pred_s=remaining_pred,
            time_left_s=self.deadline_s - request.elapsed_s,
        )
        verdict = judged.verdict
        reason = f"{note}; {verdict.reason}" if note else verdict.reason
        self.journal.record(
            J.Decision(
                **decision, action=verdict.action.value, accepted=verdict.take_proposal, reason=reason, **judged.figures
            )
        )
        if verdict.take_proposal:
            stages = list(self.plan.stages)
            for i, stage in zip(positions, candidate.stages):
                stages[i] = stage
                self.prefetched.discard(i)
            self.plan = self.plan.model_copy(update={"stages": stages})
            self.journal.record(J.PlanChanged(stage=g, plan=self.plan.model_dump(mode="json")))
        if verdict.action is Action.STOP:
            hint = "--on-late finish" if self.lateness.on_late == "stop" else "--overrun none"
            raise RunStopped(
                f"{verdict.reason} (before stage {g}); every instance was terminated; to go on "
                f"anyway: rubberband run --resume {self.run_dir} {hint}"
            )

    def _ask_replanner(self, request: ReplanRequest) -> tuple[ReplanAnswer, str]:
        """The re-planner's answer (an empty one when there is none, it failed or proposed nothing) and a note."""
        if self.replanner is None:
            return ReplanAnswer(None), "no re-planner available"
        try:
            answer = self.replanner(request)
        except Exception as exc:  # noqa: BLE001 - a failing re-plan keeps the current plan
            return ReplanAnswer(None), f"re-planner failed: {exc}"
        if answer is None:
            return ReplanAnswer(None), "re-planner proposed nothing"
        if not isinstance(answer, ReplanAnswer):
            answer = ReplanAnswer(answer)
        return answer, "" if answer.proposal is not None else "re-planner proposed nothing"

    def _planned_key(self, stage: StagePlan) -> str:
        """The catalog key of the type a stage is planned on."""
        return self._planned_type(stage).key

    def _planned_type(self, stage: StagePlan) -> InstanceType:
        return self.catalog.find(stage.instance_type, cloud=stage.cloud, region=stage.region)

    def _fallback_itype(self, stage: StagePlan) -> InstanceType:
        """What a spot stage's instances are bought as on-demand: the plan's fall-back type (cheaper per epoch),
        else the stage's own type."""
        if stage.fallback_instance_type and S.stage_market(stage) is Market.SPOT:
            return self.catalog.find(stage.fallback_instance_type, cloud=stage.cloud, region=stage.region)
        return self._stage_itype(stage)

    def _unavailable(self, stages: list[StagePlan]) -> list[str]:
        """Keys of the planned types of ``stages`` failover found unavailable (substituted, or every zone blocked)."""
        out: list[str] = []
        for stage in stages:
            itype = self._planned_type(stage)
            if itype.key in out:
                continue
            if itype.key in self.substitutes or self.backend.unavailable(itype, spot=stage.spot):
                out.append(itype.key)
        return out

    def _stand_in(self, itype: InstanceType, spot: bool, unavailable: list[str]) -> InstanceType | None:
        """What runs instead of an unavailable type: what failover obtained for it, else the cheapest alternative."""
        if itype.key in self.substitutes:
            return self._substitute(itype)
        for alt in alternatives_for(itype, self.catalog, spot=spot, clouds=[itype.cloud]):
            if (
                alt.region == itype.region
                and alt.key not in unavailable
                and not self.backend.unavailable(alt, spot=spot)
            ):
                return alt
        return None

    def _replan_around(self, g: int, request: ReplanRequest, decision: dict[str, Any]) -> None:
        """Re-plan the stages of ``request`` (``g…``; parallel brackets: ``request.stages``) without the types
        failover found unavailable; journal the decision.

        The re-planner (when there is one) plans with those types excluded; without one, or when its
        proposal is unusable, each unavailable type is replaced by its stand-in (same workers per
        instance, so placement and epochs are unchanged) and the stage's predicted cost re-priced.
        """
        positions = request.positions()
        rest = [self.plan.stages[i] for i in positions]
        unavailable = list(request.unavailable)
        names = ", ".join(k.rsplit(":", 1)[-1] for k in unavailable)
        decision = {**decision, "trigger": "failover", "unavailable": unavailable}
        stages: list[StagePlan] | None = None
        note = ""
        if self.replanner is not None:  # without one: stand-ins, and no note
            answer, note = self._ask_replanner(request)  # failed or proposed nothing: stand-ins, and why
            candidate = answer.proposal
            if candidate is not None:
                problem = proposal_problem(candidate.stages, rest, unavailable=unavailable, key_of=self._planned_key)
                if problem is not None:
                    note = f"re-planner's {problem}"
                else:
                    stages = list(candidate.stages)
                    decision.update(
                        source="replanner",
                        proposal_cost_usd=candidate.predicted.cost_usd.mean,
                        proposal_p_meet=candidate.predicted.p_meet_deadline,
                    )
        if stages is None:
            stages, substitutions = stand_in_stages(
                rest,
                unavailable,
                type_of=self._planned_type,
                stand_in=lambda itype, spot: self._stand_in(itype, spot, unavailable),
            )
            if not substitutions:
                self.journal.record(
                    J.Decision(
                        **decision,
                        accepted=False,
                        source="substitution",
                        reason=f"failover: {names} unavailable and no available type can "
                        f"stand in{'; ' + note if note else ''}",
                    )
                )
                return
            decision.update(
                source="substitution",
                substitutions=substitutions,
                proposal_cost_usd=sum(s.predicted_cost_usd or 0.0 for s in stages),
            )
        reason = f"failover: {names} unavailable in every zone; remaining stages re-planned without it"
        self.journal.record(
            J.Decision(
                **decision,
                accepted=True,
                reason=reason + (f" ({note})" if note else ""),
                current_cost_usd=sum(s.predicted_cost_usd or 0.0 for s in rest),
            )
        )
        changed = list(self.plan.stages)
        for i, stage in zip(positions, stages):
            changed[i] = stage
            self.prefetched.discard(i)
        self.plan = self.plan.model_copy(update={"stages": changed})
        self.journal.record(J.PlanChanged(stage=g, plan=self.plan.model_dump(mode="json")))

    # -- progress and the end --------------------------------------------------------------
    def _report_progress(self, g: int, pending: int) -> None:
        if self.progress is None:
            return
        stage = self.plan.stages[g]
        epochs = sum(len(t.epochs) for t in self.journal.state.trials.values())  # the sink's epochs so far
        self.progress(
            Progress(
                stage=g,
                stages=len(self.plan.stages),
                bracket=stage.bracket,
                trials_alive=len(self.running),
                trials_pending=pending,
                epochs_done=epochs,
                instances=sum(1 for p in self.pool.values() if not p.released),
                spent_usd=self._spent(),
                predicted_usd=self.plan.predicted.cost_usd.mean,
                elapsed_s=self.clock.time() - self.state.first_started_at,
                deadline_s=self.deadline_s,
            )
        )

    def _spent(self) -> float:
        """Cost so far (cheap estimate, no billing minimums): earlier executors' bill plus this one's instances,
        plus the billed head's time since its launch."""
        now = self.clock.time()
        total = self._spent_earlier
        head = self.state.head
        if head is not None:
            total += head.price_hr * max(0.0, now - head.launched_at) / 3600.0
        for p in self.pool.values():
            if p.requested_at is not None:
                total += price_hr(p.itype, p.spot) * ((p.terminated_at or now) - p.requested_at) / 3600.0
        return total

    def _teardown(self, status: str, error: str | None) -> None:
        """Stop trials, shut Ray down, terminate every instance of the run and the head; journal it."""
        main = threading.current_thread() is threading.main_thread()
        if main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous = signal.signal(sig, signal.SIG_IGN)
                self._saved_signals.setdefault(sig, previous)
        try:
            for run in list(self.running.values()):
                try:
                    run.handle.stop()
                except Exception:  # noqa: BLE001
                    pass
                self.journal.record(J.TrialStopped(trial_id=run.trial_id, stage=self.stage_index, reason="interrupted"))
            self.running.clear()
            if self.workers is not None:
                try:
                    self.workers.close()
                except Exception:  # noqa: BLE001 - their nodes are terminated below anyway
                    pass
                self.workers = None  # an instance that comes up during teardown gets no workers (Ray is going)
            try:
                self.cluster.close()
            except Exception:  # noqa: BLE001
                pass
            self._provisioner.shutdown(wait=True, cancel_futures=True)
            for _ in self.pool:
                try:
                    self._collect_provisioned()
                    break
                except ExecutionError:
                    continue
            self._collect_terminations(wait=True)
            live = {p.id: p for p in self.pool.values() if p.id is not None and not p.released}
            journaled = self.journal.state.instances
            for instance in self.backend.list(self.run_id):
                live.setdefault(instance.id, None)
                if instance.id not in journaled:  # started but never journaled (failed mid-provisioning)
                    self._journal_unrecorded(instance)
            for instance_id in live:
                self.backend.terminate([instance_id])
                self.journal.record(J.InstanceTerminated(id=instance_id, reason="teardown"))
            for p in live.values():
                if p is not None:
                    p.released = True
            self._terminator.shutdown(wait=True)
            self.backend.stop_head()
            self.state = self.journal.state
            self._write_result(status, error)
        finally:
            for sig, handler in self._saved_signals.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _write_result(self, status: str, error: str | None) -> None:
        from rubberband.executor.result import build_result, write_result

        now = self.clock.time()
        result = build_result(
            self.state, self.plan, spec=self.spec, status=status, error=error, now=now, run_dir=self.run_dir
        )
        best = result["best"] or {}  # the best so far, whatever the outcome
        end = J.END_EVENT_OF.get(status, J.RunFailed)
        self.journal.record(
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
