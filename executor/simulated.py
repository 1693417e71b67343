"""A simulated cloud and cluster on virtual time: the real executor runs a plan with no Ray and no cloud.

``rubberband run SPEC --cloud sim`` hands the unchanged :class:`~rubberband.executor.run.Executor` four stand-ins
that share one :class:`~rubberband.executor.sim_world.SimWorld` — one
:class:`~rubberband.executor.clock.VirtualClock` and one :class:`~rubberband.planner.model.PerformanceModel` (the
one the planner's simulator samples, fitted from the job's profile):

* :class:`~rubberband.executor.sim_cloud.SimBackend` — the cloud. A request is up after a start-up drawn from the
  model's start-up samples of its type (bootstrap, as the simulator draws them); a local run's head first boots
  like a node (the median). Spot requests follow the plan's spot model (``plan.spot.zones``; see "Spot" below).
* :class:`SimTrials` — the trial runtime (the real ``TrialSpec``, validated). A trial takes
  ``overhead + epochs × epoch time × straggler × speed``: the epoch time of its shape (device, workers, nodes), a
  straggler factor per instance and stage (lognormal, the model's σ), its configuration's speed for life and the
  mean of its epochs' factors (the fitted variation), and the task overhead (warm start, or restart + checkpoint
  transfer when its placement changed; a fresh instance's worker start on its first trial).
* :class:`SimCluster` — Ray's part: ``wait`` moves the clock to the next thing that happens (a trial done, a
  notice posted, an instance up or taken back), to the loop's next timer at the latest, and never more than
  ``max_step_s`` at a time; side calls (provisioning, termination) run inline and are done when virtual time
  reaches their end (:class:`~rubberband.executor.sim_cloud.SimExecutor`, as many at once as the real pool).
* the journal sink: epochs and checkpoints are appended to the run's journal, stamped with virtual time.

**Spot** (the model of :mod:`rubberband.planner.spot`, drawn as its ``ModelScenario`` draws, from a stream of the
run's seed of its own so that on-demand draws do not move): a spot instance is preempted after an exponential
time at its zone's ``preemption_rate_per_h``, counted from when it is up; from then on the cloud reports it lost
(``spot-interruption``), Ray no longer shows its ``rb-node-<id>``, and a trial on it ends at that moment with a
dead worker's error (:class:`~rubberband.executor.sim_world.SimWorkerDied`) after journaling the epochs — and
checkpoints — it finished before. A spot request finds no capacity with the zone's ``p_unavailable`` (for a
drawn duration; requests made together share one draw) and then falls over to on-demand where it may, else fails
with the cloud's capacity error.

**Scripted events** (:class:`~rubberband.executor.sim_world.SimScript`, for tests of the executor's reactions on
virtual time): an instance's preemption notice (its trials stop right after their next checkpoint, as real
workers do: ``TrialPreempted``), an instance lost (a dead node), and types sold out in every zone for the whole
run (failover obtains an alternative for each request, and the type is reported unavailable throughout).

What it does not play: training (each configuration's metric is a seeded stand-in with a falling curve, so
promotions are made but mean nothing — unless ``curve`` replays a recorded table); spot types the plan has no zone model for (spot prices, never preempted).
A head instance the plan bills (head mode on a cloud) is billed as the plan has it. What it is for: seeing what
this executor does with a plan — its JCT, its bill, its decisions, in the same journal and report as a real run —
in seconds, and checking that the planner's prediction describes it (``bench/bench_sim_executor.py``).
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from rubberband.catalog import Catalog
from rubberband.cloud.provider import node_resource
from rubberband.errors import TrialPreempted
from rubberband.executor import journal as J
from rubberband.executor.backends import SIM_RUNTIME
from rubberband.executor.checkpoints import due
from rubberband.executor.clock import VirtualClock
from rubberband.executor.runtime import TrialRuntime
from rubberband.executor.sim_cloud import SimBackend, SimExecutor, SimFuture
from rubberband.executor.sim_world import SimInstance, SimScript, SimSettings, SimWorkerDied, SimWorld
from rubberband.executor.trials import EpochReport, TrialOutcome, TrialSpec
from rubberband.plan import Plan
from rubberband.planner.model import PerformanceModel
from rubberband.planner.spot import DURATION_LEVELS, ZoneModel

if TYPE_CHECKING:
    from rubberband.executor.run import Job

__all__ = [
    "SimBackend",
    "SimCluster",
    "SimFuture",
    "SimInstance",
    "SimNotices",
    "SimRun",
    "SimScript",
    "SimSettings",
    "SimTrials",
    "SimWorld",
    "simulated_for",
    "simulated_run",
]

#: The shortest stretch a wait moves the clock when nothing is due sooner (a zero wait would not move it).
MIN_STEP_S = 1e-3


@dataclass(frozen=True)
class Span:
    """When a simulated trial's task runs: from ``started_at``, ``overhead_s`` then one entry of ``epoch_s`` per
    epoch; ``lost_at``: when its instance is taken back (its workers die), ``notice_at``: when its instance's
    preemption notice came (it stops after its next epoch)."""

    started_at: float
    overhead_s: float
    epoch_s: tuple[float, ...]
    lost_at: float | None = None
    notice_at: float | None = None


class SimTrial:
    """A running simulated trial: done at its drawn end (or its instance's loss, or after the epoch a notice
    came in); its result carries the epochs' reports."""

    def __init__(self, world: SimWorld, spec: TrialSpec, sink: Any, span: Span) -> None:
        self.world, self.spec, self.sink, self.span = world, spec, sink, span
        self.started_at = span.started_at
        # each epoch's end, summed one by one: the task ends where its last epoch does, to the last bit (a sum taken
        # at once can round below it on a clock near 1.8e9 s, and the last epoch's report was lost)
        self.epoch_ends = tuple(itertools.accumulate(span.epoch_s, initial=span.started_at + span.overhead_s))[1:]
        self.finished_at = self.epoch_ends[-1] if self.epoch_ends else span.started_at + span.overhead_s
        lost = span.lost_at
        self.lost_at = max(lost, span.started_at) if lost is not None and lost < self.finished_at else None
        self.stopped_at = self._notice_stop()
        self.done_ref = self
        self._outcome: Any = None
        self._reports: list[EpochReport] = []
        world.due[id(self)] = min(t for t in (self.finished_at, self.lost_at, self.stopped_at) if t is not None)

    def _notice_stop(self) -> float | None:
        """The end of the first epoch that ends after the notice (its checkpoint saved), if before the task's end."""
        notice = self.span.notice_at
        if notice is None:
            return None
        for at in self.epoch_ends[:-1]:
            if at >= notice:
                return at
        return None

    def _record(self, until: float, *, checkpoint_last: bool = False) -> None:
        """Report (and checkpoint where due, through the sink) each epoch that ended by ``until`` not reported yet."""
        spec, name = self.spec, self.world.metric_name
        epochs = zip(range(spec.start_epoch, spec.end_epoch), self.span.epoch_s, self.epoch_ends)
        for i, (epoch, seconds, at) in enumerate(epochs):
            if at > until:
                break
            if i < len(self._reports):
                continue
            value = self.world.metric(spec.trial_id, epoch, spec.config)
            self._reports.append(EpochReport(spec.trial_id, epoch, {name: value}, seconds, at))
            if self.sink is not None:
                self.sink.record(
                    J.Epoch(t=at, trial_id=spec.trial_id, epoch=epoch, metrics={name: value}, seconds=seconds)
                )
                last = checkpoint_last and at >= until
                if last or due(epoch, spec.end_epoch, spec.checkpoint_every):
                    self.sink.record(J.Checkpoint(t=at, trial_id=spec.trial_id, epoch=epoch))

    def _died(self) -> SimWorkerDied:
        """Its instance was taken back: the epochs before are reported (checkpointed where due); the next task restores."""
        assert self.lost_at is not None
        self._record(self.lost_at)
        self.world.interrupted.add(self.spec.trial_id)
        return SimWorkerDied(
            f"trial {self.spec.trial_id}: its worker died with its node (instance taken back "
            f"after {len(self._reports)} of {len(self.span.epoch_s)} epochs)"
        )

    def result(self, timeout_s: float | None = None) -> Any:
        if self._outcome is not None:
            if isinstance(self._outcome, BaseException):
                raise self._outcome
            return self._outcome
        self.world.due.pop(id(self), None)
        ends = [t for t in (self.lost_at, self.stopped_at) if t is not None]
        if ends and min(ends) < self.finished_at:
            end = min(ends)
            self.world.clock.advance_to(end)
            if end == self.lost_at:
                self._outcome = self._died()
            else:  # the notice: stopped right after the checkpoint of the epoch it came in
                self._record(end, checkpoint_last=True)
                self.world.interrupted.add(self.spec.trial_id)
                self._outcome = TrialPreempted(f"trial {self.spec.trial_id}: preemption notice; checkpointed")
            raise self._outcome
        self.world.clock.advance_to(self.finished_at)
        self._record(self.finished_at)
        spec = self.spec
        self._outcome = TrialOutcome(
            trial_id=spec.trial_id,
            reports=tuple(self._reports),
            checkpoint_epoch=spec.end_epoch - 1,
            iteration_latencies_s=(),
            setup_s=self.span.overhead_s,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )
        return self._outcome

    def stop(self) -> None:
        self.world.due.pop(id(self), None)
        if self._outcome is None and self.lost_at is not None and self.world.clock.time() >= self.lost_at:
            self._outcome = self._died()  # stopped as its instance's loss was found: it died then all the same


class SimTrials:
    """The trial runtime's ``TrialRun`` side: ``start`` draws the trial's length (see the module docstring)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def start(self, spec: TrialSpec, *, event_sink: Any = None, pool: Any = None) -> SimTrial:
        spec.validate()
        world = self.world
        ids = list(dict.fromkeys(world.by_resource[r] for r in spec.placement))
        instances = [world.instances[i] for i in ids]
        itype = instances[0].itype
        workers, epochs = len(spec.placement), spec.end_epoch - spec.start_epoch
        model = world.model
        epoch_time = model.epoch_time(itype.device, workers, len(ids))
        factor = max(world.straggler(i, spec.end_epoch) for i in ids) * world.speed(spec.trial_id, epochs)
        moved = world.moved(spec.trial_id, (itype.key, workers)) and spec.start_epoch > 0
        restored = spec.trial_id in world.interrupted  # after its instance was taken back: a checkpoint restore
        world.interrupted.discard(spec.trial_id)
        overhead = model.task_overhead(epochs, moved or restored, spec.checkpoint_every)
        if not all(s.ran_trial for s in instances):  # a fresh instance: its worker processes start first
            overhead += model.worker_start_s
        for s in instances:
            s.ran_trial = True
        span = Span(
            started_at=world.clock.time(),
            overhead_s=overhead,
            epoch_s=(epoch_time * factor,) * epochs,
            lost_at=_earliest(s.taken_at for s in instances),
            notice_at=_earliest(s.notice_at for s in instances),
        )
        return SimTrial(world, spec, event_sink, span)


def _earliest(times: Any) -> float | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


class SimNoticeRef:
    """A notice watcher's pending answer: ready once the instance's notice is posted."""


class SimNotices:
    """The preemption-notice watchers on virtual time (:class:`~rubberband.executor.cluster.NoticeWatching`): a
    watched instance's notice is the script's."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self._watched: set[str] = set()
        self._pending: dict[str, SimNoticeRef] = {}

    def watching(self, instance_id: str) -> bool:
        return instance_id in self._watched

    def watch(self, instance_id: str, resource: str) -> str | None:
        self._watched.add(instance_id)
        sim = self.world.instances.get(instance_id)
        if sim is not None and sim.notice_at is not None:
            ref = SimNoticeRef()
            self.world.due[id(ref)] = sim.notice_at
            self._pending[instance_id] = ref
        return None

    def unwatch(self, instance_id: str) -> None:
        self._watched.discard(instance_id)
        self.taken(instance_id)

    def taken(self, instance_id: str) -> None:
        ref = self._pending.pop(instance_id, None)
        if ref is not None:
            self.world.due.pop(id(ref), None)

    def names(self, instance_ids: tuple[str, ...] | list[str]) -> list[str]:
        return [f"sim-notice-{i}" for i in instance_ids if i in self._watched]

    def found(self, ask: tuple[str, ...] = ()) -> dict[str, Any]:
        now = self.world.clock.time()
        out: dict[str, Any] = {}
        for ident in [*self._pending, *ask]:
            sim = self.world.instances.get(ident)
            if ident in self._watched and sim is not None and sim.notice_at is not None and sim.notice_at <= now:
                out[ident] = {"cloud": "sim", "action": "terminate", "time": f"{sim.notice_at:.3f}"}
        return out

    def refs(self) -> list[Any]:
        return list(self._pending.values())


class SimCluster:
    """Ray's part on virtual time (:class:`~rubberband.executor.cluster.Cluster`)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self._notices = SimNotices(world)

    @property
    def idle_tick_s(self) -> float:
        return self.world.max_step_s

    @property
    def liveness_every_s(self) -> float:
        return 0.0  # a wait returns when the world takes an instance back: look at every turn

    def connect(
        self,
        address: str,
        *,
        namespace: str,
        runtime_env: dict | None,
        auth_mode: str,
        auth_token_path: str | None = None,
    ) -> None:
        return None

    def start_sink(self, run_dir: str | Path) -> Any:
        # in this process, appended as the trial ends; not fsync'd (a simulated run is never resumed)
        return J.JournalSink(str(Path(run_dir) / J.JOURNAL_NAME), durable=False)

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        """Move the clock to the next thing that happens (or the timeout, or ``max_step_s``); the refs ready then."""
        world = self.world
        now = world.clock.time()
        ready = [r for r in refs if world.due.get(id(r), math.inf) <= now]
        if ready:
            return ready
        upcoming = world.next_event(refs)
        step = min(world.max_step_s, max(0.0, timeout_s), math.inf if upcoming is None else upcoming - now)
        world.clock.advance_to(now + max(step, MIN_STEP_S))
        now = world.clock.time()
        return [r for r in refs if world.due.get(id(r), math.inf) <= now]

    def wake(self) -> None:
        return None  # one thread: a side call is done when the clock reaches it

    def node_resources(self) -> dict[str, float]:
        now = self.world.clock.time()
        return {
            node_resource(i): float(s.itype.workers)
            for i, s in self.world.instances.items()
            if s.running(now) and s.up_at <= now
        }

    def executor(self, workers: int, name: str) -> Executor:
        return SimExecutor(self.world, workers)

    def watchers(self, cloud: str, metadata_url: str | None) -> SimNotices:
        return self._notices

    def close(self) -> None:
        return None


@dataclass
class SimRun:
    """Everything a simulated run hands the executor."""

    world: SimWorld
    backend: SimBackend
    runtime: TrialRuntime
    cluster: SimCluster

    @property
    def clock(self) -> VirtualClock:
        return self.world.clock


def spot_zones(plan: Plan) -> dict[tuple[str, str, str], ZoneModel]:
    """The spot model the plan's spot stages were planned with, per (cloud, region, type) (``plan.spot.zones``);
    empty for a plan without one (on-demand, or spot priced without preemptions)."""
    if plan.spot is None:
        return {}
    return {
        (z.cloud, z.region, z.instance_type): ZoneModel(
            cloud=z.cloud,
            instance_type=z.instance_type,
            region=z.region,
            zone=z.zone,
            preemption_rate_per_h=z.preemption_rate_per_h,
            p_unavailable=z.p_unavailable,
            unavailable_s=tuple(
                float(x)
                for x in np.interp(DURATION_LEVELS, np.linspace(0.0, 1.0, len(z.unavailable_s)), z.unavailable_s)
            ),
            rate_source=z.rate_source,
        )
        for z in plan.spot.zones
    }


def default_step_s(plan: Plan) -> float:
    """The longest stretch one wait may skip by default (a safety net: every timer of the loop is exact): the
    deadline / 100, at least 0.2 s."""
    return max(0.2, plan.deadline_s / 100)


def simulated_run(plan: Plan, model: PerformanceModel, catalog: Catalog, settings: SimSettings, start: float) -> SimRun:
    """A simulated cloud, runtime and cluster for ``plan`` on a virtual clock that starts at ``start`` (POSIX
    seconds), drawn as ``settings`` say."""
    first = plan.stages[0]
    head_type = catalog.find(first.instance_type, cloud=first.cloud, region=first.region)
    world = SimWorld(model, VirtualClock(start), settings)
    runtime = TrialRuntime(spec_cls=TrialSpec, run_cls=SimTrials(world), module=SIM_RUNTIME)
    return SimRun(world, SimBackend(world, catalog, head_type, plan.head), runtime, SimCluster(world))


def simulated_for(
    job: "Job",
    *,
    seed: int | None = None,
    start: float | None = None,
    script: SimScript | None = None,
    curve: Callable[[dict[str, Any], int], float] | None = None,
) -> SimRun:
    """:func:`simulated_run` for a job: its profile's model, its metric, ``seed`` (default: the spec's), now (or
    ``start``), ``script``'s events and ``curve``'s metrics (:class:`SimSettings`)."""
    import time

    from rubberband.planner.model import fit_performance_model

    if job.profile is None:
        raise ValueError("a simulated run plays the job from its profile: the job has none")
    spec, plan = job.spec, job.plan
    settings = SimSettings(
        seed=spec.seed if seed is None else seed,
        max_step_s=default_step_s(plan),
        metric_name=spec.metric.name,
        metric_mode=spec.metric.mode,
        spot_zones=spot_zones(plan),
        script=script or SimScript(),
        curve=curve,
    )
    now = time.time() if start is None else start
    return simulated_run(plan, fit_performance_model(job.profile), job.catalog, settings, now)
