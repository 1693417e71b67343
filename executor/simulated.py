"""A simulated cloud and cluster on virtual time: the real controller runs a plan with no Ray and no cloud.

``rubberband run SPEC --cloud sim`` hands the unchanged :class:`~rubberband.executor.controller.Controller`
(or :class:`~rubberband.executor.brackets.ParallelController`) four stand-ins that share one
:class:`~rubberband.executor.clock.VirtualClock` and one :class:`~rubberband.planner.model.PerformanceModel`
(the one the planner's simulator samples, fitted from the job's profile):

* :class:`SimBackend` — the cloud. A request is up after a start-up drawn from the model's start-up samples of
  its type (bootstrap, as the simulator draws them); a local run's head first boots like a node (the median).
* :class:`SimTrials` — the trial runtime (the real ``TrialSpec``, validated). A trial takes
  ``overhead + epochs × epoch time × straggler × speed``: the epoch time of its shape (device, workers, nodes), a straggler factor per instance and stage
  (lognormal, the model's σ), its configuration's speed for life and the mean of its epochs' factors (the
  fitted variation), and the task overhead (warm start, or restart + checkpoint transfer when its placement
  changed; a fresh instance's worker start on its first trial).
* :class:`SimCluster` — Ray's part: ``wait`` moves the clock to the next thing that happens (a trial done, an
  instance up), at most ``max_step_s`` at a time so that the controller's own timers (prefetch, deadline,
  re-plan) see time pass as they would; side calls (provisioning, termination) run inline and are done when
  virtual time reaches their end (:class:`SimExecutor`, as many at once as the real thread pool).
* the journal sink: epochs and checkpoints are appended to the run's journal, stamped with virtual time.

What it does not play: training (each configuration's metric is a seeded stand-in with a falling curve, so
promotions are made but mean nothing), spot preemptions and sold-out zones (every request gets its type). A head
instance the plan bills (head mode on a cloud) is billed as the plan has it. What it is for: seeing what this executor does with a plan — its
JCT, its bill, its decisions, in the same journal and report as a real run — in seconds, and checking that the
planner's prediction describes it (``bench/bench_sim_executor.py``).
"""

from __future__ import annotations

import builtins
import hashlib
import math
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rubberband.catalog import HEAD_BOOTS_FIRST, Catalog, InstanceType
from rubberband.cloud.backend import BilledHead, HeadHandle, Obtained
from rubberband.cloud.provider import Instance, InstanceRequest, node_resource
from rubberband.executor.backends import SIM_CLOUD, SIM_RUNTIME
from rubberband.executor.clock import VirtualClock
from rubberband.executor.journal import JOURNAL_NAME, JournalSink
from rubberband.executor.runtime import TrialRuntime
from rubberband.executor.trials import TrialSpec
from rubberband.plan import HeadInfo, Plan
from rubberband.planner.model import PerformanceModel
from rubberband.planner.noise import task_factors
from rubberband.profile import Profile
from rubberband.spec import JobSpec


@dataclass
class SimInstance:
    instance: Instance
    itype: InstanceType
    up_at: float
    ended_at: float | None = None
    ran_trial: bool = False


class SimWorld:
    """The state the stand-ins share: clock, model, random draws, instances, running trials."""

    def __init__(self, *, model: PerformanceModel, clock: VirtualClock, seed: int,
                 max_step_s: float, metric_name: str = "loss", metric_mode: str = "min") -> None:
        if not max_step_s > 0 or not math.isfinite(max_step_s):
            raise ValueError(f"max_step_s must be a positive number of seconds, got {max_step_s!r}")
        self.model = model
        self.clock = clock
        self.seed = seed
        self.max_step_s = max_step_s
        self.metric_name = metric_name
        self.metric_mode = metric_mode
        self.rng = np.random.default_rng(seed)
        self.instances: dict[str, SimInstance] = {}
        self.by_resource: dict[str, str] = {}
        self.pending: dict[int, float] = {}  # id(future) -> when a side call (provisioning) is done
        self.trial_due: dict[int, float] = {}  # id(trial) -> when it is done
        self._stragglers: dict[tuple[str, int], float] = {}
        self._speeds: dict[str, float] = {}
        self._placements: dict[str, tuple[str, int]] = {}
        self.call_start: float | None = None  # when the side call being run inline starts (its thread is free)
        self.call_due: float | None = None  # when it ends, if later than its start (set by the call)

    # -- draws -----------------------------------------------------------------------------
    def startup_s(self, itype: InstanceType) -> float:
        return float(self.model.startup(itype.cloud, itype.name).sample(np.array([self.rng.random()]))[0])

    def straggler(self, instance_id: str, stage_key: int) -> float:
        """The instance's straggler factor for one stage (drawn anew each stage, as the simulator does)."""
        key = (instance_id, stage_key)
        if key not in self._stragglers:
            sigma = self.model.straggler_sigma
            self._stragglers[key] = math.exp(sigma * self.rng.standard_normal()) if sigma > 0 else 1.0
        return self._stragglers[key]

    def speed(self, trial_id: str, epochs: int) -> float:
        """A task's speed factor: its configuration's (drawn once per trial) × the mean of its epochs'."""
        variation = self.model.variation
        if not variation.active:
            return 1.0
        if trial_id not in self._speeds:
            self._speeds[trial_id] = float(self.rng.standard_normal())
        z_trial = np.array([self._speeds[trial_id]])
        return float(task_factors(variation, z_trial, np.array([self.rng.standard_normal()]), epochs)[0])

    def quality(self, trial_id: str) -> float:
        """The stand-in quality of a trial's configuration in [0, 1): seeded by the run's seed and its id."""
        digest = hashlib.sha256(f"{self.seed}:{trial_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64

    def metric(self, trial_id: str, epoch: int) -> float:
        """A learning curve that falls with epochs and ranks trials by quality (``max``: mirrored)."""
        loss = self.quality(trial_id) + 1.0 / (epoch + 1)  # in (0, 2)
        return loss if self.metric_mode == "min" else 1.0 - loss / 2.0

    def moved(self, trial_id: str, placement: tuple[str, int]) -> bool:
        """Whether a trial restarts elsewhere (another type or width than its last task's): restart + transfer."""
        before = self._placements.get(trial_id)
        self._placements[trial_id] = placement
        return before is not None and before != placement

    # -- time ------------------------------------------------------------------------------
    def next_event(self, refs: list[Any]) -> float | None:
        """The earliest virtual time after now at which a trial of ``refs`` ends or a side call is done."""
        now = self.clock.time()
        times = [self.trial_due[id(r)] for r in refs if id(r) in self.trial_due]
        times += [t for t in self.pending.values() if t > now]
        return min(times) if times else None


class SimFuture:
    """A side call's result, done once virtual time reaches its end (what ``concurrent.futures.Future`` offers
    the controller: ``done``, ``result``, ``cancelled``)."""

    def __init__(self, world: SimWorld, due: float, value: Any = None, error: BaseException | None = None) -> None:
        self._world = world
        self._due = due
        self._value = value
        self._error = error
        world.pending[id(self)] = due

    def done(self) -> bool:
        if self._world.clock.time() >= self._due:
            self._world.pending.pop(id(self), None)
            return True
        return False

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        self._world.clock.advance_to(self._due)  # a blocking wait for it: time passes until it is done
        self._world.pending.pop(id(self), None)
        if self._error is not None:
            raise self._error
        return self._value


class SimExecutor(Executor):
    """Runs each submitted call inline; the call takes from when one of ``workers`` is free until the end it
    sets (``world.call_due``: an instance's start-up), so calls queue as on a thread pool of that size."""

    def __init__(self, world: SimWorld, workers: int) -> None:
        self._world = world
        self._free_at = [0.0] * max(1, workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        world = self._world
        slot = min(range(len(self._free_at)), key=self._free_at.__getitem__)
        start = max(world.clock.time(), self._free_at[slot])
        world.call_start, world.call_due = start, None
        value, error = None, None
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - handed to whoever reads the future, as a thread pool does
            error = exc
        due = max(start, world.call_due or start)
        world.call_start = world.call_due = None
        self._free_at[slot] = due
        return SimFuture(world, due, value, error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None


class SimBackend:
    """The simulated cloud: every request gets its type, up after a drawn start-up (see the module docstring)."""

    cloud = SIM_CLOUD
    ray_auth_mode = "disabled"
    device_policy = None

    def __init__(self, world: SimWorld, head_type: InstanceType, head: HeadInfo | None = None) -> None:
        self.world = world
        self.head_type = head_type
        self.head = head
        self._count = 0

    def start_head(self, run_id: str) -> HeadHandle:
        """A local run's head is a node that boots first (the median start-up); a head instance (head mode on a
        cloud, when the plan bills one) booted before the job started and is billed as the plan has it."""
        clock = self.world.clock
        if self.head_type.cloud in HEAD_BOOTS_FIRST:
            clock.sleep(self.world.model.startup(self.head_type.cloud, self.head_type.name).quantile(0.5))
        billed = None
        if self.head is not None:
            billed = BilledHead(id="sim-head", instance_type=self.head.instance_type, cloud=self.head.cloud,
                                price_hr=self.head.price_hr, launched_at=clock.time() - self.head.boot_s,
                                grace_s=self.head.grace_s)
        return HeadHandle(address="sim", id="sim-head", billed=billed)

    def stop_head(self) -> bool:
        return False

    def provision(self, request: InstanceRequest) -> list[Instance]:
        world = self.world
        itype = request.instance_type
        start = world.call_start if world.call_start is not None else world.clock.time()
        up_at = start + world.startup_s(itype)
        world.call_due = up_at
        self._count += 1
        ident = f"sim-{self._count}"
        instance = Instance(id=ident, cloud=itype.cloud, instance_type=itype.name,
                            zone=itype.zones[0] if itype.zones else itype.region, state="running",
                            run_id=request.run_id, stage=request.stage, launched_at=start)
        world.instances[ident] = SimInstance(instance, itype, up_at)
        world.by_resource[node_resource(ident)] = ident
        return [instance]

    def wait(self, instance_ids: builtins.list[str], timeout_s: float) -> builtins.list[Instance]:
        return [self.world.instances[i].instance for i in instance_ids if i in self.world.instances]

    def list(self, run_id: str | None = None) -> list[Instance]:
        return [s.instance for s in self.world.instances.values()
                if s.ended_at is None and (run_id is None or s.instance.run_id == run_id)]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        for ident in instance_ids:
            sim = self.world.instances.get(ident)
            if sim is not None and sim.ended_at is None:
                sim.ended_at = self.world.clock.time()

    def check_lost(self, instance_ids: builtins.list[str]) -> dict[str, str]:
        return {}

    def obtained(self, instance_id: str) -> Obtained | None:
        return None

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        return False

    def runtime_env(self, code_dir: str) -> dict | None:
        return None


class SimTrial:
    """A running simulated trial: done at its drawn end; its result carries the epochs' reports."""

    def __init__(self, world: SimWorld, spec: TrialSpec, sink: Any, *, started_at: float, epoch_s: list[float],
                 overhead_s: float) -> None:
        self.world = world
        self.spec = spec
        self.sink = sink
        self.started_at = started_at
        self.epoch_s = epoch_s
        self.overhead_s = overhead_s
        self.finished_at = started_at + overhead_s + sum(epoch_s)
        self.done_ref = self
        self._outcome: Any = None
        world.trial_due[id(self)] = self.finished_at

    def result(self, timeout_s: float | None = None) -> Any:
        from rubberband.executor import journal as J
        from rubberband.executor.trials import EpochReport, TrialOutcome

        if self._outcome is not None:
            return self._outcome
        self.world.clock.advance_to(self.finished_at)
        self.world.trial_due.pop(id(self), None)
        spec, name = self.spec, self.world.metric_name
        reports = []
        at = self.started_at + self.overhead_s
        for epoch, seconds in zip(range(spec.start_epoch, spec.end_epoch), self.epoch_s):
            at += seconds
            value = self.world.metric(spec.trial_id, epoch)
            reports.append(EpochReport(spec.trial_id, epoch, {name: value}, seconds, at))
            if self.sink is not None:
                self.sink.record(J.Epoch(t=at, trial_id=spec.trial_id, epoch=epoch, metrics={name: value},
                                         seconds=seconds))
                self.sink.record(J.Checkpoint(t=at, trial_id=spec.trial_id, epoch=epoch))
        self._outcome = TrialOutcome(trial_id=spec.trial_id, reports=tuple(reports), checkpoint_epoch=spec.end_epoch - 1,
                                     iteration_latencies_s=(), setup_s=self.overhead_s, started_at=self.started_at,
                                     finished_at=self.finished_at)
        return self._outcome

    def stop(self) -> None:
        self.world.trial_due.pop(id(self), None)


class SimTrials:
    """The trial runtime's ``TrialRun`` side: ``start`` draws the trial's length (see the module docstring)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def start(self, spec: TrialSpec, *, event_sink: Any = None, pool: Any = None) -> SimTrial:
        spec.validate()
        world = self.world
        now = world.clock.time()
        ids = list(dict.fromkeys(world.by_resource[r] for r in spec.placement))
        instances = [world.instances[i] for i in ids]
        itype = instances[0].itype
        workers, epochs = len(spec.placement), spec.end_epoch - spec.start_epoch
        model = world.model
        epoch_time = model.epoch_time(itype.device, workers, len(ids))
        factor = max(world.straggler(i, spec.end_epoch) for i in ids) * world.speed(spec.trial_id, epochs)
        moved = world.moved(spec.trial_id, (itype.key, workers)) and spec.start_epoch > 0
        overhead = model.task_overhead(epochs, moved)
        if not all(s.ran_trial for s in instances):  # a fresh instance: its worker processes start first
            overhead += model.worker_start_s
        for s in instances:
            s.ran_trial = True
        return SimTrial(world, spec, event_sink, started_at=now, epoch_s=[epoch_time * factor] * epochs,
                        overhead_s=overhead)


class SimCluster:
    """Ray's part on virtual time (:class:`~rubberband.executor.cluster.Cluster`)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def connect(self, address: str, *, namespace: str, runtime_env: dict | None, auth_mode: str) -> None:
        return None

    def start_sink(self, run_dir: str | Path) -> Any:
        return JournalSink(str(Path(run_dir) / JOURNAL_NAME))  # in this process: appended as the trial ends

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        world = self.world
        now = world.clock.time()
        due = world.trial_due
        ready = [r for r in refs if due.get(id(r), math.inf) <= now]
        if ready:
            return ready
        upcoming = world.next_event(refs)
        step = world.max_step_s if upcoming is None else min(upcoming - now, world.max_step_s)
        world.clock.advance_to(now + max(step, 0.0))
        now = world.clock.time()
        return [r for r in refs if due.get(id(r), math.inf) <= now]

    def node_resources(self) -> dict[str, float]:
        now = self.world.clock.time()
        return {node_resource(i): float(s.itype.workers) for i, s in self.world.instances.items()
                if s.ended_at is None and s.up_at <= now}

    def executor(self, workers: int, name: str) -> Executor:
        return SimExecutor(self.world, workers)

    def close(self) -> None:
        return None


@dataclass
class SimRun:
    """Everything a simulated run hands the controller."""

    world: SimWorld
    backend: SimBackend
    runtime: TrialRuntime
    cluster: SimCluster

    @property
    def clock(self) -> VirtualClock:
        return self.world.clock


def simulated_run(plan: Plan, *, model: PerformanceModel, catalog: Catalog, metric: str, mode: str, seed: int,
                  start: float, max_step_s: float | None = None) -> SimRun:
    """A simulated cloud, runtime and cluster for ``plan`` on a virtual clock that starts at ``start`` (POSIX
    seconds). ``max_step_s``: the longest stretch of virtual time one wait may skip (default: the deadline / 2000,
    at least the controller's poll)."""
    from rubberband.executor.controller import POLL_S

    first = plan.stages[0]
    head_type = catalog.find(first.instance_type, cloud=first.cloud, region=first.region)
    step = max_step_s if max_step_s is not None else max(POLL_S, plan.deadline_s / 2000)
    world = SimWorld(model=model, clock=VirtualClock(start), seed=seed, max_step_s=step,
                     metric_name=metric, metric_mode=mode)
    runtime = TrialRuntime(spec_cls=TrialSpec, run_cls=SimTrials(world), module=SIM_RUNTIME)
    return SimRun(world, SimBackend(world, head_type, plan.head), runtime, SimCluster(world))


def simulated_for(spec: JobSpec, plan: Plan, catalog: Catalog, profile: Profile, *, seed: int | None = None,
                  start: float | None = None) -> SimRun:
    """:func:`simulated_run` for a job: its profile's model, its metric, ``seed`` (default: the spec's), now."""
    import time

    from rubberband.planner.model import fit_performance_model

    return simulated_run(plan, model=fit_performance_model(profile), catalog=catalog, metric=spec.metric.name,
                         mode=spec.metric.mode, seed=spec.seed if seed is None else seed,
                         start=time.time() if start is None else start)
