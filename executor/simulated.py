"""A simulated cloud and cluster on virtual time: the real controller runs a plan with no Ray and no cloud.

``rubberband run SPEC --cloud sim`` hands the unchanged :class:`~rubberband.executor.controller.Controller`
(or :class:`~rubberband.executor.brackets.ParallelController`) four stand-ins that share one
:class:`~rubberband.executor.clock.VirtualClock` and one :class:`~rubberband.planner.model.PerformanceModel`
(the one the planner's simulator samples, fitted from the job's profile):

* :class:`SimBackend` — the cloud. A request is up after a start-up drawn from the model's start-up samples of
  its type (bootstrap, as the simulator draws them); a local run's head first boots like a node (the median).
  Spot requests follow the plan's spot model (``plan.spot.zones``: the zone model the planner's simulator
  sampled for the stage's (cloud, region, type); see "Spot" below).
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

**Spot** (the model of :mod:`rubberband.planner.spot`, drawn as its ``ModelScenario`` draws, from a stream of
the run's seed of its own so that on-demand draws do not move):

* a spot instance is preempted after an exponential time at its zone's ``preemption_rate_per_h``, counted from
  when it is up (a Poisson process while it runs, independent per instance: a trial over ``k`` instances is hit
  at ``k`` × the rate, as the simulator has it). From then on the cloud reports it lost
  (``check_lost``: ``spot-interruption``), Ray no longer shows its ``rb-node-<id>``, and a trial on it ends at
  that moment with a dead worker's error (:class:`SimWorkerDied`, not a ``TrainingError``) after journaling the
  epochs — and checkpoints — it finished before; the controller journals ``instance_lost``, replaces the
  instance on the market its ``SpotPolicy`` picks and restarts the trial from its checkpoint (a restore: restart
  overhead + checkpoint transfer);
* a spot request finds no capacity with the zone's ``p_unavailable``; the zone then has none for a duration drawn
  from its ``unavailable_s`` and every spot request until then finds none too (requests made together — a
  stage's — share one draw, as the simulator draws one per stage request). Such a request falls over to
  on-demand when it allows that (``on_demand_fallback``, reported through ``obtained``: the controller journals
  the fall-back and bills on-demand), as the cloud's failover does; else it fails with the cloud's capacity
  error (:class:`~rubberband.cloud.failover.FailoverExhausted`). The executor never waits for capacity (the
  planner's simulator may, where the slack covers the wait's 0.9 quantile).

What it does not play: training (each configuration's metric is a seeded stand-in with a falling curve, so
promotions are made but mean nothing); preemption notices (the cloud posts none: a preemption is seen as a lost
instance); spot types the plan has no zone model for (spot prices, never preempted, as the plan predicted them);
failover to other zones or types, and a spot zone blocked for the rest of the run after it had no capacity (each
request is drawn afresh; ``unavailable`` is always False). A head
instance the plan bills (head mode on a cloud) is billed as the plan has it. What it is for: seeing what this executor does with a plan — its
JCT, its bill, its decisions, in the same journal and report as a real run — in seconds, and checking that the
planner's prediction describes it (``bench/bench_sim_executor.py``; spot plans: ``bench/bench_sim_spot.py``).
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
from rubberband.cloud.failover import Attempt, FailoverExhausted
from rubberband.cloud.provider import Instance, InstanceRequest, node_resource
from rubberband.executor.backends import SIM_CLOUD, SIM_RUNTIME
from rubberband.executor.checkpoints import due
from rubberband.executor.clock import VirtualClock
from rubberband.executor.journal import JOURNAL_NAME, JournalSink
from rubberband.executor.runtime import TrialRuntime
from rubberband.executor.trials import TrialSpec
from rubberband.plan import HeadInfo, Plan
from rubberband.planner.model import PerformanceModel
from rubberband.planner.noise import task_factors
from rubberband.planner.spot import DURATION_LEVELS, ZoneModel
from rubberband.profile import Profile
from rubberband.spec import JobSpec


#: The cloud's error code when a spot request finds no capacity (AWS's; only its kind, ``capacity``, matters).
NO_CAPACITY = "InsufficientInstanceCapacity"
#: The stream of spot draws (preemptions, capacity): its own, keyed by the run's seed.
_SPOT_STREAM = 0x5B07


class SimWorkerDied(RuntimeError):
    """A trial's workers died with their (preempted) instance: what Ray raises then (a dead actor / node), an
    ordinary error for the controller, which asks the cloud whether the instance is gone."""


@dataclass
class SimInstance:
    instance: Instance
    itype: InstanceType
    up_at: float
    ended_at: float | None = None
    ran_trial: bool = False
    spot: bool = False  # the market it runs on (on-demand after a spot request fell over)
    preempted_at: float | None = None  # spot: when the cloud takes it back (None: never)
    obtained: Obtained | None = None  # what failover reports for it, when it is not what was asked

    def preempted(self, now: float) -> bool:
        """Whether the cloud has taken it back by ``now`` (before the controller terminated it)."""
        return (
            self.preempted_at is not None
            and self.preempted_at <= now
            and (self.ended_at is None or self.ended_at >= self.preempted_at)
        )

    def running(self, now: float) -> bool:
        return self.ended_at is None and not self.preempted(now)


class SimWorld:
    """The state the stand-ins share: clock, model, random draws, instances, running trials."""

    def __init__(
        self,
        *,
        model: PerformanceModel,
        clock: VirtualClock,
        seed: int,
        max_step_s: float,
        metric_name: str = "loss",
        metric_mode: str = "min",
        spot_zones: dict[tuple[str, str, str], ZoneModel] | None = None,
    ) -> None:
        if not max_step_s > 0 or not math.isfinite(max_step_s):
            raise ValueError(f"max_step_s must be a positive number of seconds, got {max_step_s!r}")
        self.model = model
        self.clock = clock
        self.seed = seed
        self.max_step_s = max_step_s
        self.metric_name = metric_name
        self.metric_mode = metric_mode
        self.rng = np.random.default_rng(seed)
        #: the spot model per (cloud, region, instance type): the zone the plan's spot stages were planned with
        self.spot_zones = dict(spot_zones or {})
        self.spot_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(_SPOT_STREAM,))))
        self._no_capacity_until: dict[tuple[str, str, str], float] = {}
        self._capacity_drawn: dict[tuple[str, str, str], tuple[float, bool]] = {}  # key -> (at, had capacity)
        self.interrupted: set[str] = set()  # trials whose last task died with its instance: the next one restores
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

    def spot_zone(self, itype: InstanceType) -> ZoneModel | None:
        """The spot model of a type's (cloud, region, type); None: spot there is never preempted nor sold out."""
        return self.spot_zones.get((itype.cloud, itype.region, itype.name))

    def preemption_after_s(self, zone: ZoneModel) -> float:
        """How long a spot instance runs before the cloud takes it back: exponential at the zone's rate (the
        simulator's ``time_to_preemption``, ``-log(1 - u) / rate``)."""
        rate_s = zone.preemption_rate_per_h / 3600.0
        if rate_s <= 0:
            return math.inf
        return float(-math.log1p(-self.spot_rng.random()) / rate_s)

    def spot_capacity(self, zone: ZoneModel, at: float) -> bool:
        """Whether a spot request at ``at`` finds capacity in the zone: none while an earlier draw's unavailability
        lasts; else none with ``p_unavailable``, for a duration drawn from ``unavailable_s``. Requests at the same
        moment share one draw."""
        key = zone.key
        drawn = self._capacity_drawn.get(key)
        if drawn is not None and drawn[0] == at:
            return drawn[1]
        if at < self._no_capacity_until.get(key, -math.inf):
            found = False
        else:
            hit, u = self.spot_rng.random(2)
            found = not hit < zone.p_unavailable
            if not found:
                wait = float(zone.sample_unavailable(np.array([u]))[0])
                self._no_capacity_until[key] = at + max(wait, 1.0)
        self._capacity_drawn[key] = (at, found)
        return found

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
        return int.from_bytes(digest[:8], "big") / 2**64

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
        times += [
            s.preempted_at
            for s in self.instances.values()  # an idle instance's loss is seen then
            if s.ended_at is None and s.preempted_at is not None and s.preempted_at > now
        ]
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
    """The simulated cloud: every request gets its type, up after a drawn start-up; spot follows the plan's spot
    model (see the module docstring)."""

    cloud = SIM_CLOUD
    ray_auth_mode = "disabled"
    device_policy = None
    metadata_url = None  # no preemption notices: the simulated spot model takes instances back

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
            billed = BilledHead(
                id="sim-head",
                instance_type=self.head.instance_type,
                cloud=self.head.cloud,
                price_hr=self.head.price_hr,
                launched_at=clock.time() - self.head.boot_s,
                grace_s=self.head.grace_s,
            )
        return HeadHandle(address="sim", id="sim-head", billed=billed)

    def stop_head(self) -> bool:
        return False

    def provision(self, request: InstanceRequest) -> list[Instance]:
        world = self.world
        itype = request.instance_type
        start = world.call_start if world.call_start is not None else world.clock.time()
        zone_name = itype.zones[0] if itype.zones else itype.region
        spot = request.spot
        model = world.spot_zone(itype) if spot else None
        obtained = None
        if model is not None and not world.spot_capacity(model, start):
            tried = Attempt(
                itype.cloud,
                itype.region,
                zone_name,
                itype.name,
                "capacity",
                NO_CAPACITY,
                f"no spot capacity for {itype.name} in {model.zone}",
                market="spot",
            )
            if not request.on_demand_fallback:
                raise FailoverExhausted(
                    f"could not provision {request.count}x {itype.name} for run "
                    f"{request.run_id} (tried {itype.name}@{zone_name}: capacity) — no spot "
                    f"capacity and no on-demand fall-back allowed",
                    kind="capacity",
                    attempts=[tried],
                )
            spot, model = False, None
            itype = request.on_demand_type or itype  # the plan's fall-back type, where it names one
            zone_name = itype.zones[0] if itype.zones else itype.region
            obtained = Obtained(
                itype,
                zone_name,
                (tried, Attempt(itype.cloud, itype.region, zone_name, itype.name, "ok", market="on_demand")),
                spot=False,
            )
        up_at = start + world.startup_s(itype)
        world.call_due = up_at
        self._count += 1
        ident = f"sim-{self._count}"
        instance = Instance(
            id=ident,
            cloud=itype.cloud,
            instance_type=itype.name,
            zone=zone_name,
            state="running",
            run_id=request.run_id,
            stage=request.stage,
            launched_at=start,
        )
        preempted_at = None if model is None else up_at + world.preemption_after_s(model)
        world.instances[ident] = SimInstance(
            instance,
            itype,
            up_at,
            spot=spot,
            preempted_at=preempted_at if math.isfinite(preempted_at or 0.0) else None,
            obtained=obtained,
        )
        world.by_resource[node_resource(ident)] = ident
        return [instance]

    def wait(self, instance_ids: builtins.list[str], timeout_s: float) -> builtins.list[Instance]:
        return [self.world.instances[i].instance for i in instance_ids if i in self.world.instances]

    def list(self, run_id: str | None = None) -> list[Instance]:
        now = self.world.clock.time()
        return [
            s.instance
            for s in self.world.instances.values()
            if s.running(now) and (run_id is None or s.instance.run_id == run_id)
        ]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        now = self.world.clock.time()
        for ident in instance_ids:
            sim = self.world.instances.get(ident)
            if sim is not None and sim.ended_at is None:  # a preempted one ended when the cloud took it back
                sim.ended_at = sim.preempted_at if sim.preempted_at is not None and sim.preempted(now) else now

    def check_lost(self, instance_ids: builtins.list[str]) -> dict[str, str]:
        """The spot instances the cloud has taken back (``spot-interruption``)."""
        now = self.world.clock.time()
        return {
            i: "spot-interruption"
            for i in instance_ids
            if i in self.world.instances and self.world.instances[i].preempted(now)
        }

    def obtained(self, instance_id: str) -> Obtained | None:
        """On-demand in place of spot where a spot request found no capacity (None: what was asked)."""
        sim = self.world.instances.get(instance_id)
        return None if sim is None else sim.obtained

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        return False

    def runtime_env(self, code_dir: str) -> dict | None:
        return None


class SimTrial:
    """A running simulated trial: done at its drawn end; its result carries the epochs' reports."""

    def __init__(
        self,
        world: SimWorld,
        spec: TrialSpec,
        sink: Any,
        *,
        started_at: float,
        epoch_s: list[float],
        overhead_s: float,
        lost_at: float | None = None,
    ) -> None:
        self.world = world
        self.spec = spec
        self.sink = sink
        self.started_at = started_at
        self.epoch_s = epoch_s
        self.overhead_s = overhead_s
        self.finished_at = started_at + overhead_s + sum(epoch_s)
        #: when its instance is taken back before it ends (its workers die then); None: it runs to its end
        self.lost_at = max(lost_at, started_at) if lost_at is not None and lost_at < self.finished_at else None
        self.done_ref = self
        self._outcome: Any = None
        self._reports: list[Any] = []
        world.trial_due[id(self)] = self.finished_at if self.lost_at is None else self.lost_at

    def _record(self, until: float) -> None:
        """Report (and checkpoint where due, through the sink) each epoch that ended by ``until`` not reported yet."""
        from rubberband.executor import journal as J
        from rubberband.executor.trials import EpochReport

        spec, name = self.spec, self.world.metric_name
        at = self.started_at + self.overhead_s
        for i, (epoch, seconds) in enumerate(zip(range(spec.start_epoch, spec.end_epoch), self.epoch_s)):
            at += seconds
            if at > until:
                break
            if i < len(self._reports):
                continue
            value = self.world.metric(spec.trial_id, epoch)
            self._reports.append(EpochReport(spec.trial_id, epoch, {name: value}, seconds, at))
            if self.sink is not None:
                self.sink.record(
                    J.Epoch(t=at, trial_id=spec.trial_id, epoch=epoch, metrics={name: value}, seconds=seconds)
                )
                if due(epoch, spec.end_epoch, spec.checkpoint_every):
                    self.sink.record(J.Checkpoint(t=at, trial_id=spec.trial_id, epoch=epoch))

    def _died(self) -> SimWorkerDied:
        """Its instance was taken back: the epochs before are reported (checkpointed where due); the next task restores."""
        assert self.lost_at is not None
        self._record(self.lost_at)
        self.world.interrupted.add(self.spec.trial_id)
        return SimWorkerDied(
            f"trial {self.spec.trial_id}: its worker died with its node (spot instance taken back "
            f"after {len(self._reports)} of {len(self.epoch_s)} epochs)"
        )

    def result(self, timeout_s: float | None = None) -> Any:
        from rubberband.executor.trials import TrialOutcome

        if self._outcome is not None:
            if isinstance(self._outcome, BaseException):
                raise self._outcome
            return self._outcome
        self.world.trial_due.pop(id(self), None)
        spec = self.spec
        if self.lost_at is not None:
            self.world.clock.advance_to(self.lost_at)
            self._outcome = self._died()
            raise self._outcome
        self.world.clock.advance_to(self.finished_at)
        self._record(self.finished_at)
        self._outcome = TrialOutcome(
            trial_id=spec.trial_id,
            reports=tuple(self._reports),
            checkpoint_epoch=spec.end_epoch - 1,
            iteration_latencies_s=(),
            setup_s=self.overhead_s,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )
        return self._outcome

    def stop(self) -> None:
        self.world.trial_due.pop(id(self), None)
        if self._outcome is None and self.lost_at is not None and self.world.clock.time() >= self.lost_at:
            self._outcome = self._died()  # stopped as its instance's loss was found: it died then all the same


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
        restored = spec.trial_id in world.interrupted  # after its instance was taken back: a checkpoint restore
        world.interrupted.discard(spec.trial_id)
        overhead = model.task_overhead(epochs, moved or restored, spec.checkpoint_every)
        if not all(s.ran_trial for s in instances):  # a fresh instance: its worker processes start first
            overhead += model.worker_start_s
        for s in instances:
            s.ran_trial = True
        lost = [s.preempted_at for s in instances if s.preempted_at is not None]
        return SimTrial(
            world,
            spec,
            event_sink,
            started_at=now,
            epoch_s=[epoch_time * factor] * epochs,
            overhead_s=overhead,
            lost_at=min(lost) if lost else None,
        )


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
        return {
            node_resource(i): float(s.itype.workers)
            for i, s in self.world.instances.items()
            if s.running(now) and s.up_at <= now
        }

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


def simulated_run(
    plan: Plan,
    *,
    model: PerformanceModel,
    catalog: Catalog,
    metric: str,
    mode: str,
    seed: int,
    start: float,
    max_step_s: float | None = None,
) -> SimRun:
    """A simulated cloud, runtime and cluster for ``plan`` on a virtual clock that starts at ``start`` (POSIX
    seconds). ``max_step_s``: the longest stretch of virtual time one wait may skip (default: the deadline / 2000,
    at least the controller's poll)."""
    from rubberband.executor.controller import POLL_S

    first = plan.stages[0]
    head_type = catalog.find(first.instance_type, cloud=first.cloud, region=first.region)
    step = max_step_s if max_step_s is not None else max(POLL_S, plan.deadline_s / 2000)
    world = SimWorld(
        model=model,
        clock=VirtualClock(start),
        seed=seed,
        max_step_s=step,
        metric_name=metric,
        metric_mode=mode,
        spot_zones=spot_zones(plan),
    )
    runtime = TrialRuntime(spec_cls=TrialSpec, run_cls=SimTrials(world), module=SIM_RUNTIME)
    return SimRun(world, SimBackend(world, head_type, plan.head), runtime, SimCluster(world))


def simulated_for(
    spec: JobSpec,
    plan: Plan,
    catalog: Catalog,
    profile: Profile,
    *,
    seed: int | None = None,
    start: float | None = None,
) -> SimRun:
    """:func:`simulated_run` for a job: its profile's model, its metric, ``seed`` (default: the spec's), now."""
    import time

    from rubberband.planner.model import fit_performance_model

    return simulated_run(
        plan,
        model=fit_performance_model(profile),
        catalog=catalog,
        metric=spec.metric.name,
        mode=spec.metric.mode,
        seed=spec.seed if seed is None else seed,
        start=time.time() if start is None else start,
    )
