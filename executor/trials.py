"""Running one trial (one stage or one resize of it) as data-parallel workers on Ray.

:class:`TrialRun` is the interface between rubberband's executor / profiler and the user's
training code (see docs/training-api.md, "The runtime underneath"): it places one Ray actor per worker on the instances
named by ``TrialSpec.placement`` (a placement group, STRICT_PACK on one instance, PACK across
several; or warm workers from a :class:`~rubberband.executor.pool.WorkerPool`), joins them in a
torch.distributed process group (gloo on CPU, nccl on GPU: ``TrialSpec.device``, chosen by
:mod:`rubberband.devices`) and calls ``train(config, ctx)`` in
each. ``start`` returns at once; ``done_ref`` resolves when rank 0 is finished; ``result``
gathers the outcome or raises :class:`~rubberband.errors.TrainingError` with one line naming the
user's exception and the trial. Actors never outlive the run: ``result`` and ``stop`` release
them (back to the pool when healthy, killed otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from rubberband.errors import ExecutionError, GpuUnavailableError, RubberbandError, TrainingError, TrialPreempted
from rubberband.devices import CPU_WORKER, WorkerDevice
from rubberband.executor.pool import WorkerPool
from rubberband.executor.context import WorkerTask
from rubberband.executor.worker import WorkerFailure, WorkerResult, actor_class, actor_options

#: After the first worker fails, how long to wait for the others to report before killing them.
FAILURE_GRACE_S = 3.0


@dataclass(frozen=True)
class TrialSpec:
    """One run of a trial: which epochs, on which instances, with what code and config."""

    trial_id: str
    config: dict
    entry_point: str
    code_dir: str
    start_epoch: int
    end_epoch: int
    placement: tuple[str, ...]
    checkpoint_dir: str
    #: What each worker asks Ray for and trains on (``rubberband.devices.worker_device`` of the instance type).
    device: WorkerDevice = CPU_WORKER
    max_iterations: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600
    #: Save a checkpoint every this many epochs (and after the last, and on a preemption notice): the plan's
    #: interval for spot stages (``plan.spot.checkpoint_epochs``), 1 elsewhere.
    checkpoint_every: int = 1

    @property
    def workers(self) -> int:
        return len(self.placement)

    @property
    def use_gpu(self) -> bool:
        return self.device.use_gpu

    def validate(self) -> None:
        if not self.placement:
            raise ExecutionError(f"trial {self.trial_id}: placement is empty; give one instance resource per worker")
        if ":" not in self.entry_point:
            raise TrainingError(f"trial {self.trial_id}: entry point {self.entry_point!r} must be 'module:function'")
        if self.end_epoch <= self.start_epoch:
            raise ExecutionError(
                f"trial {self.trial_id}: end_epoch {self.end_epoch} must exceed start_epoch {self.start_epoch}"
            )
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ExecutionError(f"trial {self.trial_id}: max_iterations must be at least 1")


@dataclass(frozen=True)
class EpochReport:
    trial_id: str
    epoch: int
    metrics: dict[str, float]
    seconds: float
    finished_at: float


@dataclass(frozen=True)
class TrialOutcome:
    trial_id: str
    reports: tuple[EpochReport, ...]
    checkpoint_epoch: int | None
    iteration_latencies_s: tuple[float, ...]
    setup_s: float
    started_at: float
    finished_at: float
    #: Whether each worker was a warm process taken from a pool (in rank order); empty without a pool.
    warm_workers: tuple[bool, ...] = ()
    #: Seconds rank 0 spent writing each checkpoint of this run.
    checkpoint_saved_s: tuple[float, ...] = ()
    #: len() of each iterable rank 0 passed to ctx.batches (None: no len), i.e. iterations per epoch.
    pass_lengths: tuple[int | None, ...] = ()
    #: Leading dimension of rank 0's first batch when it was a tensor (per-worker batch size).
    batch_size_seen: int | None = None
    #: Wall-clock time rank 0 began its first iteration (start → this = restart cost).
    first_iteration_at: float | None = None
    #: Rank 0's (start, end) wall-clock times of each pass over ``ctx.batches``.
    pass_times: tuple[tuple[float, float], ...] = ()
    #: Per rank: the torch device it trained on, and the GPU ids Ray assigned it (empty on CPU types).
    devices: tuple[str, ...] = ()
    gpu_ids: tuple[tuple, ...] = ()
    #: The process group's backend ("gloo" or "nccl").
    backend: str = ""


def _collateral(failure: WorkerFailure) -> bool:
    """A failure caused by another rank going away (a broken collective), not a root cause."""
    text = f"{failure.error_type} {failure.message}".lower()
    return failure.error_type in ("DistBackendError", "DistNetworkError", "DistStoreError") or any(
        word in text for word in ("gloo", "connection reset", "connection closed", "broken pipe", "nccl")
    )


def _local_ranks(placement: tuple[str, ...]) -> list[int]:
    seen: dict[str, int] = {}
    ranks = []
    for resource in placement:
        ranks.append(seen.get(resource, 0))
        seen[resource] = ranks[-1] + 1
    return ranks


def _death_cause(exc: BaseException) -> str:
    """Ray's reason for a worker's death on one short line: its error name and what Ray says beyond the
    boilerplate (the exit type and detail: killed, out of memory, its node gone, an error in its creation)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [
        line
        for line in lines
        if not line.startswith(("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:"))
        and line != "The actor died unexpectedly before finishing this task."
    ]
    text = " ".join(" ".join(said).split())
    text = text[:300] + ("…" if len(text) > 300 else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class PlacedWorkers:
    """A trial's worker actors as placed: their ``run`` calls, their placement group (None: taken from the warm
    pool), the pool, and which workers were warm."""

    actors: list[Any]
    refs: list[Any]
    placement_group: Any = None
    pool: WorkerPool | None = None
    warm: tuple[bool, ...] = ()


class TrialRun:
    """A running trial; create with :meth:`start`."""

    def __init__(self, spec: TrialSpec, workers: PlacedWorkers, started_at: float) -> None:
        self.spec = spec
        self._actors = workers.actors
        self._refs = workers.refs
        self._pg = workers.placement_group
        self._pool = workers.pool
        self._warm = workers.warm
        self._started_at = started_at
        refs = workers.refs
        self._outcome: TrialOutcome | None = None
        self._error: Exception | None = None
        self._released = False
        self._placed = False
        self.done_ref = refs[0]

    # -- start -----------------------------------------------------------------------------
    @classmethod
    def start(cls, spec: TrialSpec, *, event_sink: Any = None, pool: WorkerPool | None = None) -> "TrialRun":
        """Place the workers and start ``train`` in each; returns without waiting."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec.validate()
        started = time.time()
        pg = None
        warm: tuple[bool, ...] = ()
        if pool is not None:
            taken = [pool.take(resource, spec.device) for resource in spec.placement]
            actors = [actor for actor, _ in taken]
            warm = tuple(is_warm for _, is_warm in taken)
        else:
            bundles = [spec.device.bundle(resource) for resource in spec.placement]
            strategy = "STRICT_PACK" if len(set(spec.placement)) == 1 else "PACK"
            pg = placement_group(bundles, strategy=strategy, name=f"rb-trial-{spec.trial_id}")
            cls_ = actor_class()
            actors = [
                cls_.options(
                    **actor_options(None, spec.device),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=i
                    ),
                ).remote(spec.workers > 1 or spec.device.use_gpu)
                for i in range(spec.workers)
            ]
        master = actors[0].rendezvous.remote()
        refs = []
        for rank, (actor, local_rank) in enumerate(zip(actors, _local_ranks(spec.placement))):
            task = WorkerTask(
                trial_id=spec.trial_id,
                config=dict(spec.config),
                entry_point=spec.entry_point,
                code_dir=spec.code_dir,
                start_epoch=spec.start_epoch,
                end_epoch=spec.end_epoch,
                rank=rank,
                world_size=spec.workers,
                local_rank=local_rank,
                checkpoint_dir=spec.checkpoint_dir,
                checkpoint_every=spec.checkpoint_every,
                device=spec.device,
                max_iterations=spec.max_iterations,
                env=dict(spec.env),
                timeout_s=spec.timeout_s,
                event_sink=event_sink if rank == 0 else None,
            )
            refs.append(actor.run.remote(task, master))
        return cls(spec, PlacedWorkers(actors, refs, pg, pool, warm), started)

    # -- result ----------------------------------------------------------------------------
    @property
    def placement_group(self) -> Any:
        """The Ray placement group that holds the trial's bundles (one per rank), None when its workers came from
        a :class:`~rubberband.executor.pool.WorkerPool`."""
        return self._pg

    def result(self, timeout_s: float | None = None) -> TrialOutcome:
        """Wait for every worker; raise TrainingError on the first root cause (GpuUnavailableError when a
        GPU worker finds no usable CUDA).

        ``timeout_s`` bounds this call: when it passes, ``TimeoutError`` is raised and the
        trial keeps running (call again, or ``stop``). Independently, a placement that cannot
        be satisfied within ``spec.timeout_s`` raises ExecutionError after cleaning up.
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        if self._outcome is not None:
            return self._outcome
        if self._error is not None:
            raise self._error
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(self._refs)
        results: dict[int, WorkerResult] = {}
        deaths: dict[int, str] = {}
        first_failure: float | None = None
        while pending:
            slice_s = 0.5
            if deadline is not None:
                slice_s = min(slice_s, max(0.0, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=1, timeout=slice_s)
            for ref in ready:
                rank = self._refs.index(ref)
                try:
                    results[rank] = ray.get(ref, timeout=self.spec.timeout_s)
                except RayActorError as exc:
                    deaths[rank] = f"worker {rank} on {self.spec.placement[rank]} died ({_death_cause(exc)})"
                except (GetTimeoutError, RayError) as exc:
                    deaths[rank] = f"worker {rank} failed in the runtime ({type(exc).__name__}: {exc})"
                failed = rank in deaths or results[rank].failure is not None
                if failed and first_failure is None:
                    first_failure = time.monotonic()
            if not pending:
                break
            if first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                break
            if not results and not deaths:
                self._check_placement()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"trial {self.spec.trial_id} still running after {timeout_s:.1f} s")
        failures = sorted(
            (r.failure for r in results.values() if r.failure is not None),
            key=lambda f: (_collateral(f), f.kind == "setup", f.failed_at),
        )
        if failures or deaths or pending:
            self._error = self._training_error(failures, deaths, pending)
            self._release(healthy=False)
            raise self._error
        self._outcome = self._build_outcome(results)
        self._release(healthy=True)
        return self._outcome

    def _check_placement(self) -> None:
        from ray.util.placement_group import placement_group_table

        if self._placed or time.time() - self._started_at <= self.spec.timeout_s:
            return
        import ray

        if self._pg is not None:
            # A GCS query, not pg.ready(): that would start a probe task (a worker process) per call.
            state = placement_group_table(self._pg).get("state", "?")
            problem = f"placement group {state}"
        else:  # pooled workers: they wait for their instance's resource, which must exist
            missing = sorted(set(self.spec.placement) - set(ray.cluster_resources()))
            state = "MISSING" if missing else "CREATED"
            problem = f"no instance offers {', '.join(missing)}"
        if state == "CREATED":
            self._placed = True
            return
        self._error = ExecutionError(
            f"trial {self.spec.trial_id}: could not place {self.spec.workers} worker(s) on "
            f"{', '.join(sorted(set(self.spec.placement)))} within {self.spec.timeout_s:.0f} s "
            f"({problem}); check that those instances are up and have free slots"
        )
        self._release(healthy=False)
        raise self._error

    def _training_error(
        self, failures: list[WorkerFailure], deaths: dict[int, str], pending: list[Any]
    ) -> RubberbandError:
        return training_error(self.spec, failures, deaths, sorted(self._refs.index(ref) for ref in pending))

    def _build_outcome(self, results: dict[int, WorkerResult]) -> TrialOutcome:
        chief = results[0]
        setup_done = [r.setup_done_at for r in results.values() if r.setup_done_at is not None]
        setup_s = max(0.0, max(setup_done) - self._started_at) if setup_done else 0.0
        reports = tuple(
            EpochReport(
                trial_id=self.spec.trial_id,
                epoch=r.epoch,
                metrics=dict(r.metrics),
                seconds=r.seconds,
                finished_at=r.finished_at,
            )
            for r in chief.reports
        )
        return TrialOutcome(
            trial_id=self.spec.trial_id,
            reports=reports,
            checkpoint_epoch=chief.checkpoint_epoch,
            iteration_latencies_s=chief.iteration_latencies_s,
            setup_s=setup_s,
            started_at=self._started_at,
            finished_at=max(r.finished_at for r in results.values()),
            warm_workers=self._warm,
            checkpoint_saved_s=chief.checkpoint_saved_s,
            pass_lengths=chief.pass_lengths,
            batch_size_seen=chief.batch_size_seen,
            first_iteration_at=chief.first_iteration_at,
            pass_times=chief.pass_times,
            devices=tuple(results[r].device for r in sorted(results)),
            gpu_ids=tuple(tuple(results[r].gpu_ids) for r in sorted(results)),
            backend=chief.backend,
        )

    # -- stop ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kill the workers (or give healthy ones back to the pool) and remove the placement group."""
        self._release(healthy=self._outcome is not None)

    def _release(self, *, healthy: bool) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._released:
            return
        self._released = True
        for actor, resource in zip(self._actors, self.spec.placement):
            if healthy and self._pool is not None:
                self._pool.give(resource, actor)
            else:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already removed
                pass


def training_error(
    spec: TrialSpec, failures: list[WorkerFailure], deaths: dict[int, str], pending_ranks: list[int]
) -> RubberbandError:
    """What a trial whose workers failed raises: the root cause among its ranks' failures (``failures``, first
    first), the deaths Ray reported (rank → why) and the ranks that never answered (``pending_ranks``). A
    preemption notice is no failure (:class:`TrialPreempted`: restart elsewhere), a GPU without CUDA is the
    environment's fault (:class:`GpuUnavailableError`), a rank that died with its node takes the others down."""
    trial = spec.trial_id
    preempted = next((f for f in failures if f.kind == "preempted"), None)
    if preempted is not None:  # a preemption notice stopped it after a checkpoint: restart it elsewhere
        return TrialPreempted(f"trial {trial}: rank {preempted.rank}: {preempted.message}")
    unusable = next((f for f in failures if f.kind == "device" and f.error_type == "GpuUnavailableError"), None)
    if unusable is not None:  # an environment fault, not the user's: its own error, never a CPU fall-back
        return GpuUnavailableError(f"trial {trial}: rank {unusable.rank}: {unusable.message}")
    collateral = not failures or _collateral(failures[0])
    if deaths and collateral:
        return TrainingError(f"trial {trial}: {sorted(deaths.items())[0][1]}")
    if pending_ranks and collateral:
        places = sorted({spec.placement[r] for r in pending_ranks})
        seen = f"; rank {failures[0].rank} saw {failures[0].error_type}: {failures[0].message}" if failures else ""
        return TrainingError(
            f"trial {trial}: rank(s) {', '.join(map(str, pending_ranks))} on {', '.join(places)} "
            f"stopped answering (instance lost?){seen}"
        )
    if failures:
        root = failures[0]
        if root.kind == "import":
            return TrainingError(
                f"trial {trial}: cannot import entry point {spec.entry_point!r} from "
                f"{spec.code_dir}: {root.error_type}: {root.message}"
            )
        where = "in train()" if root.kind == "train" else "while joining the process group"
        return TrainingError(f"trial {trial}: rank {root.rank} raised {root.error_type} {where}: {root.message}")
    if deaths:
        return TrainingError(f"trial {trial}: {sorted(deaths.items())[0][1]}")
    return TrainingError(f"trial {trial}: {len(pending_ranks)} worker(s) did not finish after another one failed")
