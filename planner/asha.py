"""ASHA (asynchronous successive halving) simulated on a fixed cluster, the baseline users know, and elastic.

Users who tune with Ray Tune mostly run ``ASHAScheduler`` (Li et al., MLSys'20) on a fixed
cluster. This module predicts its JCT and cost with the same performance model as the elastic
plans, so ``rubberband plan`` can show elastic SHA, static SHA and ASHA side by side; and it plans
``scheduler.kind: asha`` as an elastic cluster that shrinks as the rung ladder empties
(:func:`elastic_asha`).

Semantics (as Ray Tune's ``ASHAScheduler`` runs it, one bracket): rungs at
``min_epochs·η^k`` cumulative epochs below ``max_epochs``. A fixed cluster of ``instances`` ×
``instance_type`` has trial slots (:func:`~rubberband.planner.simulator.layout`); whenever a slot
is free it starts the next of the ``trials`` trials. A running trial reports at every rung it
reaches: it continues iff its metric is not below the ``(1 − 1/η)`` percentile of the results
recorded at that rung before it (no result yet: it continues); otherwise it stops and frees its
slot. A trial that reaches ``max_epochs`` ends. No stage barriers: slots never wait for a rung
to fill. The job ends when the last trial ends; every instance is billed from its request until
then plus its termination latency (a static cluster), plus the run's head when there is one.

Metrics: each trial has a latent quality (a random permutation per sample; correlated with the trial's
slowness at the model's ``speed_quality_rho``) that orders it at every rung. Timing: per epoch the profiled
epoch time × the trial's straggler factor (lognormal, the profile's σ) × its configuration's speed (the
model's variation) + the per-epoch overhead; each rung report adds an evaluation pass; a trial's
start costs the warm-worker start, or where each trial is a new process (:class:`TrialStarts`, Ray Tune's
default) that process's start, contending with the other starts in progress for the cores (× a lognormal
factor per trial: trial starts of uneven length finish out of queue order, as Ray's do, and ASHA's
promotions depend on the order in which results arrive). :func:`ray_tune_starts` derives Ray Tune's from
the profile's measurement: the ASHA baseline a plan shows is Ray Tune's. Instances come up after a start-up draw (serially on local)
plus the worker start. Event-driven per sample (heaps); pure, deterministic given the seed.

Elastic ASHA (:class:`AshaPhases`): the cluster shrinks phase by phase under
:class:`~rubberband.planner.policies.AshaPhasePolicy`. Phase ``k`` is the part of the run where every
trial has started and the lowest rung a running trial trains toward is ``k`` (phase 0 while a trial
has not started); phase ``k`` holds ``instances[k]`` instances (non-increasing). Entering a phase that
holds fewer than are alive, the idle instances (no trial on any of their slots; one never used is idle
from its ready time) are released at once, the others the moment they go idle, the first idle first.
Releases start only once every trial has started, and ASHA never gives a freed slot work again after
that, so they never change which slot runs what: one event run of the peak cluster
(:meth:`AshaSimulator.trace`) serves every phase count, and :meth:`AshaSimulator.bill` derives when
each instance goes from it: the phases cost less and never change the JCT. An instance is billed
from its request until its release (at the latest the job's end) plus the type's termination
latency; the fixed cluster (every phase at its size) releases none and is billed as above.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rubberband.catalog import SERIAL_PROVISIONING, InstanceType
from rubberband.clouds import billing_rule
from rubberband.plan import Timeline, TimelineInstance, TimelineTask
from rubberband.planner.model import PerformanceModel
from rubberband.planner.policies import AshaPhasePolicy
from rubberband.planner.schedule import rungs
from rubberband.planner.search import widths_for
from rubberband.planner.plan_space import Layout, layout, useful_instances
from rubberband.planner.simulator import needed_on_time
from rubberband.planner.start_lanes import StartLanes, TrialStart

__all__ = [
    "ASHA_SAMPLES",
    "AshaCluster",
    "AshaPhases",
    "AshaResult",
    "AshaRungs",
    "AshaSchedule",
    "AshaSearch",
    "AshaSettings",
    "AshaSimulator",
    "AshaTrace",
    "allowed_late",
    "asha_baseline",
    "elastic_asha",
    "lateness_order",
    "phase_releases",
    "rungs",
    "shrink_phases",
]

#: Monte Carlo samples of an ASHA prediction (event-driven, so fewer than the vectorised simulator's).
ASHA_SAMPLES = 200
#: Samples used while searching the cluster size (the chosen size is confirmed with ASHA_SAMPLES).
SEARCH_SAMPLES = 32
#: (type, width) pairs searched: those with the lowest price per trained epoch (a fixed cluster's
#: cost is mostly its slots' time; the search is event-driven and costs ~0.5 s a pair).
PAIRS_SEARCHED = 3


@dataclass(frozen=True)
class AshaCluster:
    """A fixed cluster: ``instances`` × ``instance_type``, ``workers`` per trial."""

    instance_type: InstanceType
    instances: int
    workers: int


@dataclass(frozen=True)
class AshaPhases:
    """An elastic ASHA cluster: ``instance_type`` and ``workers`` per trial throughout, ``instances[k]``
    instances held in phase ``k`` (one count per rung, non-increasing; :class:`AshaPhasePolicy`'s rule).
    ``instances[0]`` is the peak: the cluster every trial starts on."""

    instance_type: InstanceType
    instances: tuple[int, ...]
    workers: int

    def __post_init__(self) -> None:
        AshaPhasePolicy(self.instances)  # validates: ≥ 1 per phase, never growing
        if self.workers < 1:
            raise ValueError(f"AshaPhases.workers must be ≥ 1, got {self.workers!r}")

    @classmethod
    def fixed(cls, cluster: AshaCluster, phases: int) -> AshaPhases:
        """The fixed cluster as ``phases`` phases of the same size (it releases nothing)."""
        return cls(cluster.instance_type, (cluster.instances,) * phases, cluster.workers)

    @property
    def policy(self) -> AshaPhasePolicy:
        return AshaPhasePolicy(self.instances)

    @property
    def peak(self) -> AshaCluster:
        """The cluster phase 0 holds."""
        return AshaCluster(self.instance_type, self.instances[0], self.workers)


@dataclass
class AshaResult:
    """Distributions over samples of one ASHA run on one cluster (fixed, or elastic by phase).

    ``cluster`` is the peak cluster (phase 0's); ``phases`` the instances of each phase (all equal for a
    fixed cluster). ``phase_durations`` / ``phase_costs`` (samples, phases): seconds spent in each phase
    (phase 0 from the job's start, the last until its end) and the instances' bills attributed to each
    phase by the share of their billed life spent in it (head excluded; they sum to cost − head)."""

    cluster: AshaCluster
    jct: np.ndarray
    cost: np.ndarray
    breakdown: dict[str, np.ndarray]
    promotions: np.ndarray  # (samples, rungs): trials that reached each rung
    phases: tuple[int, ...] = ()
    phase_durations: np.ndarray | None = None
    phase_costs: np.ndarray | None = None

    @property
    def cost_mean(self) -> float:
        return float(self.cost.mean())

    def meets(self, deadline_s: float, confidence: float) -> bool:
        return int(np.count_nonzero(self.jct <= deadline_s)) >= needed_on_time(len(self.jct), confidence)

    def jct_quantile(self, q: float) -> float:
        return float(np.quantile(self.jct, q))

    def representative_index(self) -> int:
        """The sample whose JCT is closest to the median (the plan's timeline shows it)."""
        return int(np.argmin(np.abs(self.jct - np.median(self.jct))))

    @property
    def elastic(self) -> AshaPhases:
        """The cluster by phase."""
        c = self.cluster
        return AshaPhases(c.instance_type, self.phases or (c.instances,), c.workers)


@dataclass(frozen=True)
class AshaTrace:
    """One event run of ASHA on a peak cluster, ``samples`` rows: what billing any phase counts needs.

    ``request`` / ``ready`` / ``idle_from`` (samples, instances): when each instance was requested, came
    up, and went idle for good (its slots' last trial ended; never used: its ready time).
    ``bounds`` (samples, phases): when each phase began (phase 0 at 0; a phase skipped begins with the
    next one; one never reached begins at the JCT). ``tasks``: a trace of one ``sample``, that sample's
    (trial, rung, slot, start, end) of every trial's segment toward a rung (empty otherwise)."""

    cluster: AshaCluster
    jct: np.ndarray
    busy: np.ndarray
    promotions: np.ndarray
    request: np.ndarray
    ready: np.ndarray
    idle_from: np.ndarray
    bounds: np.ndarray
    layout: Layout
    tasks: tuple[tuple[int, int, int, float, float], ...] = ()


@dataclass(frozen=True)
class _SampleOut:
    """Where one sample's event run writes (rows of the trace's arrays; ``tasks``: None, or a list to record in)."""

    reached: np.ndarray
    idle_from: np.ndarray
    bounds: np.ndarray
    tasks: list[tuple[int, int, int, float, float]] | None


def phase_releases(idle_from: np.ndarray, bounds: np.ndarray, instances: Sequence[int]) -> np.ndarray:
    """When each instance is released under :class:`AshaPhasePolicy` (inf: kept to the job's end).

    The instances go idle for good in the order of ``idle_from`` (ties: by index), and the rule releases
    them in that order: the ``r``-th to go idle (from 0) goes once it is idle and a phase holding at most
    ``peak − r − 1`` instances has begun (released so far = min(idle so far, peak − the phase's count))."""
    n, peak = idle_from.shape
    phases = len(instances)
    first = [next((ph for ph in range(1, phases) if instances[ph] <= peak - r - 1), phases) for r in range(peak)]
    begins = np.concatenate([bounds, np.full((n, 1), math.inf)], axis=1)  # column `phases`: never
    order = np.argsort(idle_from, axis=1, kind="stable")
    went = np.maximum(np.take_along_axis(idle_from, order, axis=1), begins[:, first])
    release = np.empty_like(went)
    np.put_along_axis(release, order, went, axis=1)
    return release


def _phase_figures(
    bounds: np.ndarray, jct: np.ndarray, request: np.ndarray, gone: np.ndarray, cost: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds in each phase, cost attributed to each phase), per sample: phase ``k`` lasts from ``bounds[k]``
    (0 for phase 0) to the next phase's start (the JCT for the last); each instance's bill ``cost`` goes to the
    phases in proportion to its life (``request`` → ``gone``) spent in each, the first phase reaching to the
    past and the last to the future (a life of no length: to the phase it was requested in)."""
    n, phases = bounds.shape
    durations = np.concatenate([bounds[:, 1:], jct[:, None]], axis=1) - bounds
    lo = np.concatenate([np.full((n, 1), -math.inf), bounds[:, 1:]], axis=1)[:, None, :]
    hi = np.concatenate([bounds[:, 1:], np.full((n, 1), math.inf)], axis=1)[:, None, :]
    overlap = np.clip(np.minimum(gone[:, :, None], hi) - np.maximum(request[:, :, None], lo), 0.0, None)
    span = overlap.sum(axis=2, keepdims=True)
    at_request = np.count_nonzero(bounds[:, None, 1:] <= request[:, :, None], axis=2)
    point = np.arange(phases)[None, None, :] == at_request[:, :, None]
    share = np.where(span > 0, overlap / np.where(span > 0, span, 1.0), point)
    return durations, (share * cost[:, :, None]).sum(axis=1)


def _slot_instances(lay: Layout, slot: int) -> range:
    """The instances (indices) slot ``slot`` runs on."""
    if lay.span == 1:
        return range(slot // lay.per_instance, slot // lay.per_instance + 1)
    return range(slot * lay.span, (slot + 1) * lay.span)


@dataclass(frozen=True)
class AshaSchedule:
    """What ASHA runs: ``trials`` trials, promoted by ``eta`` at rungs from ``min_epochs`` up to ``max_epochs``
    cumulative epochs (:func:`~rubberband.planner.schedule.rungs`)."""

    trials: int
    eta: int
    min_epochs: int
    max_epochs: int


@dataclass(frozen=True)
class TrialStarts:
    """How trials start where each is a new process (Ray Tune's ``reuse_actors=False``, its default): a start takes
    ``start_s`` alone (None: the model's ``task_start_s``) × a lognormal factor of σ ``sigma`` per trial, and the
    starts in progress on one instance (on one host where ``shared_host``: the local cloud's instances share this
    machine's cores) share ``concurrency`` start lanes by processor sharing; then ``busy_s`` that holds no core
    (Tune's driver handling the other trials' results and ends), the same for every trial, so that an instance's
    starts still complete in the order they began."""

    concurrency: float
    start_s: float | None = None
    sigma: float = 0.0
    shared_host: bool = False
    busy_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.concurrency >= 1:
            raise ValueError("concurrency must be at least 1 start lane")
        if self.start_s is not None and not (self.start_s >= 0 and math.isfinite(self.start_s)):
            raise ValueError("start_s must be a finite number of seconds ≥ 0 (None: the model's task_start_s)")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError("sigma must be a finite number ≥ 0 (0: every trial start alike)")
        if not (self.busy_s >= 0 and math.isfinite(self.busy_s)):
            raise ValueError("busy_s must be a finite number of seconds ≥ 0")


def ray_tune_starts(model: PerformanceModel, itype: InstanceType) -> TrialStarts | None:
    """Ray Tune's trial starts on ``itype`` from the profile's measurement (None where the profile has none): each
    trial's start is Tune's measured start plus the model's ``task_start_s`` (the user's code up to the first
    iteration), on the start lanes of the cores the starts share: the instance's vCPUs, or on a shared host (the
    local cloud) the profiling machine's cores, every instance's starts together; then Tune's busy seconds."""
    tune = model.tune_start
    if tune is None:
        return None
    shared = itype.cloud in SERIAL_PROVISIONING
    return TrialStarts(
        concurrency=tune.lanes(tune.host_cores if shared else itype.vcpus),
        start_s=tune.start_s + model.task_start_s,
        sigma=tune.sigma,
        shared_host=shared,
        busy_s=tune.busy_s,
    )


@dataclass(frozen=True)
class AshaSettings:
    """How :class:`AshaSimulator` plays ASHA: ``samples`` Monte Carlo samples from ``seed``; ``spot``: every instance
    priced at spot; ``head_cost(instance_type, jct)`` bills the run's head for a cluster of that type (per-sample
    array; None: no head). ``starts``: how trials start on a type where they contend (:class:`TrialStarts`; None,
    or a type it gives None for: each takes the model's ``task_start_s``, independently), e.g. Ray Tune's
    (``lambda t: ray_tune_starts(model, t)``)."""

    samples: int = ASHA_SAMPLES
    seed: int = 0
    spot: bool = False
    head_cost: Callable[[InstanceType, np.ndarray], np.ndarray] | None = None
    starts: Callable[[InstanceType], TrialStarts | None] | None = None


class AshaSimulator:
    """Simulates ASHA for one job (``schedule``) on fixed or elastic clusters under ``settings``; see the module
    docstring."""

    def __init__(self, model: PerformanceModel, schedule: AshaSchedule, settings: AshaSettings | None = None) -> None:
        settings = settings or AshaSettings()
        self.model = model
        self.schedule = schedule
        self.settings = settings
        self.trials = schedule.trials
        self.eta = schedule.eta
        self.milestones = rungs(schedule.eta, schedule.min_epochs, schedule.max_epochs)
        # the phase rule of this rung ladder (which phase the run is in depends on the rungs only, not the counts)
        self._ladder = AshaPhasePolicy((1,) * len(self.milestones))
        #: event runs (:meth:`trace` calls) so far: what a search reports as candidates simulated
        self.runs = 0
        self.samples = settings.samples
        self.seed = settings.seed
        self.spot = settings.spot
        self.head_cost = settings.head_cost
        samples, trials = self.samples, self.trials
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(0xA5A,))))
        self._quality = np.argsort(rng.random((samples, trials)), axis=1).astype(float)
        sigma = model.straggler_sigma
        self._factor = (
            np.exp(sigma * rng.standard_normal((samples, trials))) if sigma > 0 else np.ones((samples, trials))
        )
        self._boot_u = rng.random((samples, 1024))
        self._starts_on = settings.starts
        self._ones = np.ones(trials)
        # drawn after the rest only where starts are modelled: without them every other draw is unchanged
        self._start_z = rng.standard_normal((samples, trials)) if settings.starts is not None else None
        variation = model.variation
        if variation.config_sigma > 0 or variation.config_log_mean != 0.0:
            # configurations differ in speed, as in the elastic plans' simulator; promotion ranks by a quality as
            # correlated with slowness as the model says (drawn last: without spread every other draw is unchanged)
            z = rng.standard_normal((samples, trials))
            self._factor = self._factor * np.exp(variation.config_log_mean + variation.config_sigma * z)
            rho = variation.speed_quality_rho
            if rho != 0.0:
                latent = rho * z + math.sqrt(max(0.0, 1.0 - rho * rho)) * rng.standard_normal((samples, trials))
                self._quality = np.argsort(np.argsort(latent, axis=1), axis=1).astype(float)
            if variation.config_mean_se > 0:  # the population's speed, one draw per sample (as the simulator)
                self._factor = self._factor * np.exp(variation.config_mean_se * rng.standard_normal((samples, 1)))

    def set_qualities(self, qualities: Sequence[float]) -> None:
        """Use one fixed order of the trials' qualities (higher is better) in every sample, e.g. the scores a
        benchmark's trials report, instead of a random permutation per sample."""
        values = np.asarray(qualities, dtype=float)
        if values.shape != (self.trials,):
            raise ValueError(f"qualities must hold one value per trial ({self.trials}), not {values.shape}")
        self._quality = np.broadcast_to(values, (self.samples, self.trials))

    def runs_alike(self, itype: InstanceType) -> tuple:
        """What of ``itype`` this simulator reads (two types with the same are simulated and billed alike): its
        name, device, slots, price, start-ups and trial starts (by cloud and name), and its head's cost."""
        head = float(self.head_cost(itype, np.array([3600.0]))[0]) if self.head_cost is not None else 0.0
        starts = self._starts_on(itype) if self._starts_on is not None else None
        return (itype.cloud, itype.name, itype.device, itype.workers, itype.vcpus, itype.price(self.spot), starts, head)

    def simulate(self, cluster: AshaCluster | AshaPhases, samples: int | None = None) -> AshaResult:
        """ASHA on ``cluster`` (fixed, or elastic by phase) over the first ``samples`` samples (default: all)."""
        phases = cluster if isinstance(cluster, AshaPhases) else AshaPhases.fixed(cluster, len(self.milestones))
        return self.bill(self.trace(phases.peak, samples), phases)

    def trace(self, cluster: AshaCluster, samples: int | None = None, *, sample: int | None = None) -> AshaTrace:
        """One event run of ASHA on ``cluster`` over the first ``samples`` samples; with ``sample``, that one
        sample alone, its tasks recorded (for a timeline). Phase counts do not change it (module docstring)."""
        n = self.samples if samples is None else min(samples, self.samples)
        if sample is not None and not 0 <= sample < self.samples:
            raise ValueError(f"sample must be within [0, {self.samples}), got {sample}")
        rows = range(n) if sample is None else range(sample, sample + 1)
        out = self._trace(cluster, rows, rows, record=sample is not None)
        assert isinstance(out, AshaTrace)  # no lateness to stop at
        return out

    def simulate_unless_late(
        self,
        cluster: AshaCluster,
        goal: tuple[float, float],
        first: Sequence[int] = (),
        samples: int | None = None,
    ) -> AshaResult | list[int]:
        """ASHA on the fixed ``cluster`` over the first ``samples`` samples (default: all), as :meth:`simulate`,
        where it meets ``goal`` (deadline, confidence); else, as soon as more samples miss the deadline than the
        confidence allows, the samples run, latest first. The samples in ``first`` run first: pass the latest
        samples of a neighbouring cluster, and a cluster that misses is known after a few samples instead of
        most of them. The decision is :meth:`simulate`'s."""
        n = self.samples if samples is None else min(samples, self.samples)
        deadline_s, confidence = goal
        allowed = allowed_late(n, confidence)
        seen = set(first)
        order = [s for s in first if 0 <= s < n] + [s for s in range(n) if s not in seen]
        out = self._trace(cluster, range(n), order, late=(deadline_s, allowed))
        if isinstance(out, list):
            return out
        return self.bill(out, AshaPhases.fixed(cluster, len(self.milestones)))

    def _trace(
        self,
        cluster: AshaCluster,
        rows: range,
        order: Sequence[int],
        *,
        record: bool = False,
        late: tuple[float, int] | None = None,
    ) -> AshaTrace | list[int]:
        """The event runs of samples ``rows`` (their rows in the trace, in sample order), run in ``order``, their
        tasks recorded where ``record``; with ``late`` (deadline, samples allowed to miss it), as soon as more than
        allowed miss it, the samples run, latest first."""
        itype, k, w = cluster.instance_type, cluster.instances, cluster.workers
        model = self.model
        lay = layout(itype.workers, k, w)
        if lay.slots < 1:
            raise ValueError("the cluster has no trial slot")
        self.runs += 1
        starts = self._starts_on(itype) if self._starts_on is not None else None
        epoch = model.epoch_time(itype.device, w, lay.nodes)
        startup = model.startup(itype.cloud, itype.name)
        head_boot = model.head_wait_s(itype.cloud, itype.name)
        boot = startup.sample(self._boot_u[rows.start : rows.stop, :k])
        m = len(rows)
        gained: np.ndarray | float = 0.0
        if itype.cloud in SERIAL_PROVISIONING:
            overlap = model.start_overlap(itype.cloud)  # a shared host: the starts contend (profiled)
            if overlap is not None:
                boot, gained = overlap.serial(boot, itype.workers)
            request = head_boot + np.concatenate([np.zeros((m, 1)), np.cumsum(boot, axis=1)[:, :-1]], axis=1)
        else:
            request = np.full((m, k), head_boot)
        if starts is not None and starts.start_s is not None:
            ready = request + boot  # each trial starts its own process (its start is the trial's): no worker pool
        else:
            ready = request + boot + model.worker_start_s + gained
        jct = np.empty(m)
        reached = np.zeros((m, len(self.milestones)), dtype=np.int64)
        busy = np.zeros(m)
        idle_from = np.empty((m, k))
        bounds = np.zeros((m, len(self.milestones)))
        tasks: list[tuple[int, int, int, float, float]] | None = [] if record else None
        on = _Cluster(lay, epoch, starts)
        missed, ran = 0, []
        for s in order:
            row = s - rows.start
            out = _SampleOut(reached[row], idle_from[row], bounds[row], tasks)
            jct[row], busy[row] = self._run(s, ready[row], on, out)
            if late is not None:
                ran.append(s)
                missed += bool(jct[row] > late[0])
                if missed > late[1]:
                    return sorted(ran, key=lambda x: -jct[x - rows.start])
        return AshaTrace(cluster, jct, busy, reached, request, ready, idle_from, bounds, lay, tuple(tasks or ()))

    def bill(self, trace: AshaTrace, cluster: AshaPhases) -> AshaResult:
        """What ``cluster`` costs on ``trace`` (an event run of its peak cluster): every instance billed from its
        request until its release under the phase rule (at the latest the job's end) plus the type's termination
        latency, the run's head on top; and the per-phase figures."""
        if cluster.peak != trace.cluster:
            raise ValueError(f"the trace ran on {trace.cluster}, not on {cluster.peak} (phase 0 of the cluster billed)")
        if len(cluster.instances) != len(self.milestones):
            raise ValueError(
                f"an ASHA cluster needs one instance count per rung ({len(self.milestones)}), got {cluster.instances}"
            )
        itype, w = cluster.instance_type, cluster.workers
        price = itype.price(self.spot) / 3600.0
        rule = billing_rule(itype.cloud)
        gone = self.model.termination(itype.cloud, itype.name).quantile(0.5)
        jct = trace.jct
        release = phase_releases(trace.idle_from, trace.bounds, cluster.instances)
        end = np.minimum(release, jct[:, None])
        billed = rule.billed_seconds(end - trace.request + gone)
        total = billed.sum(axis=1) * price
        training = trace.busy * price * w / itype.workers
        # an instance released before it came up stops booting then
        booted = np.where(np.isfinite(release), np.minimum(trace.ready, end), trace.ready)
        startup_cost = (booted - trace.request).sum(axis=1) * price
        head = self.head_cost(itype, jct) if self.head_cost is not None else np.zeros(len(jct))
        breakdown = {
            "training": training,
            "startup": startup_cost,
            "idle": total - training - startup_cost,
            "head": head,
        }
        durations, costs = _phase_figures(trace.bounds, jct, trace.request, end + gone, billed * price)
        return AshaResult(
            trace.cluster, jct, total + head, breakdown, trace.promotions, cluster.instances, durations, costs
        )

    def timeline(self, cluster: AshaPhases, sample: int) -> Timeline:
        """Instances and tasks of one sample (e.g. :meth:`AshaResult.representative_index`) in the plan's schema:
        each instance's first and last phase (``first_stage``, ``last_stage``: positions in the rung ladder), each
        trial's segment toward a rung as a task of that rung's stage."""
        trace = self.trace(cluster.peak, sample=sample)
        release = phase_releases(trace.idle_from, trace.bounds, cluster.instances)[0]
        jct = float(trace.jct[0])
        itype = cluster.instance_type
        rule = billing_rule(itype.cloud)
        gone = self.model.termination(itype.cloud, itype.name).quantile(0.5)
        bounds = trace.bounds[0]
        lay = trace.layout
        instances = []
        for i in range(cluster.instances[0]):
            end = min(float(release[i]), jct)
            requested = float(trace.request[0, i])
            instances.append(
                TimelineInstance(
                    id=f"i{i}",
                    instance_type=itype.name,
                    cloud=itype.cloud,
                    first_stage=0,
                    last_stage=int(np.count_nonzero(bounds[1:] < end)),
                    requested_s=requested,
                    ready_s=min(float(trace.ready[0, i]), end),
                    released_s=end,
                    cost_usd=rule.cost(end - requested + gone, itype.price(self.spot)),
                )
            )
        tasks = [
            TimelineTask(
                trial=trial,
                stage=rung,
                bracket=0,
                instance_ids=[f"i{x}" for x in _slot_instances(lay, slot)],
                workers=cluster.workers,
                start_s=start,
                end_s=end,
            )
            for trial, rung, slot, start, end in sorted(trace.tasks, key=lambda t: (t[3], t[0]))
        ]
        return Timeline(instances=instances, tasks=tasks)

    def _run(self, s: int, ready: np.ndarray, on: _Cluster, out: _SampleOut) -> tuple[float, float]:
        """One sample: event-driven ASHA; returns (JCT, slot-seconds spent starting and training) and fills
        ``out`` (rungs reached, when each instance went idle for good, when each phase began, the tasks)."""
        reached, idle_from, bounds, tasks = out.reached, out.idle_from, out.bounds, out.tasks
        model = self.model
        lay, epoch, spec = on.layout, on.epoch_s, on.starts
        if lay.span == 1:
            slot_ready = np.repeat(ready, lay.per_instance)
        else:
            slot_ready = ready[: lay.slots * lay.span].reshape(lay.slots, lay.span).max(axis=1)
        free = [(float(t), j) for j, t in enumerate(slot_ready)]
        freed = [t for t, _ in free]  # when each slot last became free
        heapq.heapify(free)
        events: list[tuple[float, int, int, int]] = []  # (time, trial, rung, slot)
        # independent starts (the default) take task_start_s each: folded into the first segment
        shared_host = spec is not None and spec.shared_host
        starts = (
            StartLanes(spec.concurrency, model.task_start_s if spec.start_s is None else spec.start_s)
            if spec is not None
            else None
        )
        bracket = AshaRungs(self.eta, len(self.milestones))
        # plain lists: the loop below runs once per report, and indexing numpy arrays one item at a time is slow
        quality = self._quality[s].tolist()
        epoch_of = (epoch * self._factor[s] + model.epoch_overhead_s).tolist()  # one epoch, per trial
        start_factor = (
            np.exp(spec.sigma * self._start_z[s]) if spec is not None and self._start_z is not None else self._ones
        ).tolist()
        rung_epochs = [m - (self.milestones[r - 1] if r > 0 else 0) for r, m in enumerate(self.milestones)]
        eval_s = model.eval_time_s
        task_start_s = model.task_start_s
        tune_busy_s = spec.busy_s if spec is not None else 0.0  # after each start's CPU work (Ray Tune's driver)
        next_trial = 0
        end = 0.0
        busy = 0.0
        inf = math.inf
        last_phase = last_rung = len(self.milestones) - 1
        toward = [0] * len(self.milestones)  # trials training (or starting) toward each rung
        counted = [0] * len(self.milestones)  # trials reaching each rung
        trials = self.trials
        began = [0.0] * trials  # when each trial's current segment began
        phase = 0
        lowest = 0  # once every trial has started: the lowest rung a trial trains toward (it never falls)
        on_result, heappush, heappop = bracket.on_result, heapq.heappush, heapq.heappop  # per report: local names

        def segment(trial: int, rung: int) -> float:
            return rung_epochs[rung] * epoch_of[trial] + eval_s

        while True:
            t_free = free[0][0] if next_trial < trials and free else inf
            t_start = starts.next_time() if starts is not None else inf
            t_report = events[0][0] if events else inf
            if t_free == inf and t_start == inf and t_report == inf:
                break
            if t_free <= t_start and t_free <= t_report:  # a free slot starts the next trial
                t, j = heappop(free)
                toward[0] += 1
                began[next_trial] = t
                if starts is None:
                    d = task_start_s * start_factor[next_trial] + segment(next_trial, 0)
                    busy += d
                    heappush(events, (t + d, next_trial, 0, j))
                else:
                    work = starts.work * start_factor[next_trial]
                    start = TrialStart(work, t, next_trial, j, instance=_start_domain(False, lay, j))
                    starts.add(_start_domain(shared_host, lay, j), start)
                next_trial += 1
                continue
            if starts is not None and t_start <= t_report:  # starts' CPU work done: Tune's busy part, then training
                for t, began_at, trial, j in starts.pop_done():
                    d = tune_busy_s + segment(trial, 0)
                    busy += t - began_at + d
                    heappush(events, (t + d, trial, 0, j))
                continue
            t, trial, rung, j = heappop(events)
            counted[rung] += 1
            toward[rung] -= 1
            if tasks is not None:
                tasks.append((trial, rung, j, began[trial], t))
            if rung == last_rung or not on_result(rung, quality[trial]):  # the last rung decides nothing
                end = max(end, t)
                heappush(free, (t, j))
                freed[j] = t
            else:
                d = segment(trial, rung + 1)
                busy += d
                toward[rung + 1] += 1
                began[trial] = t
                heappush(events, (t + d, trial, rung + 1, j))
            if next_trial == trials and phase < last_phase:
                # no trial is left to start, so the lowest rung trained toward only rises (promotions go up)
                while lowest <= last_rung and not toward[lowest]:
                    lowest += 1
                now = self._ladder.phase(unstarted=0, lowest_rung=lowest if lowest <= last_rung else None)
                while phase < now:
                    phase += 1
                    bounds[phase] = t
        bounds[phase + 1 :] = end  # phases never reached begin (and end) with the job
        reached[:] = counted
        if lay.span == 1:
            idle_from[:] = np.asarray(freed).reshape(-1, lay.per_instance).max(axis=1)
        else:
            idle_from[:] = ready  # instances no slot spans are idle once up
            idle_from[: lay.slots * lay.span] = np.repeat(freed, lay.span)
        return end, busy


class AshaRungs:
    """The rung bookkeeping of Ray Tune's ``_Bracket`` (``ray/tune/schedulers/async_hyperband.py``,
    one bracket, ``stop_last_trials``): per rung the results recorded so far. A trial's first result
    at a rung continues iff it is not below the ``(1 − 1/η)`` percentile (numpy's linear one) of the
    results recorded at that rung before it (none yet: it continues); either way it is recorded.
    Ray stops a trial at ``max_t`` regardless."""

    def __init__(self, eta: float, rungs: int) -> None:
        self.q = 1.0 - 1.0 / eta
        self.recorded: list[list[float]] = [[] for _ in range(rungs)]

    def on_result(self, rung: int, value: float) -> bool:
        """Record ``value`` at ``rung`` (higher is better); True: the trial continues."""
        rec = self.recorded[rung]
        n = len(rec)
        if n:  # numpy's (linear) percentile of the sorted results, inline: this runs once per simulated report
            pos = self.q * (n - 1)
            lo = int(pos)
            cut = rec[lo] if lo + 1 >= n else rec[lo] + (rec[lo + 1] - rec[lo]) * (pos - lo)
            stop = value < cut
        else:
            stop = False
        bisect.insort(rec, value)
        return not stop


def _start_domain(shared_host: bool, lay: Layout, slot: int) -> int:
    """The starts ``slot``'s trial start contends with: its instance's (its first instance's where a trial spans
    several), or every instance's on a shared host."""
    if shared_host:
        return 0
    return slot // lay.per_instance if lay.span == 1 else slot * lay.span


@dataclass(frozen=True)
class _Cluster:
    """What one event run plays on: the cluster's slot layout, its epoch seconds and how its trials start (None:
    independently, the model's ``task_start_s`` each)."""

    layout: Layout
    epoch_s: float
    starts: TrialStarts | None


def _fewest_meeting(
    sim: AshaSimulator, widest: AshaCluster, deadline_s: float, confidence: float
) -> tuple[AshaResult, bool]:
    """On screening samples: (the fewest instances of ``widest``'s type and width meeting the deadline, True); or
    (``widest`` itself, False) where even it misses.

    Searched up from one slot step, doubling, then by bisection between the last miss and the first meet: a miss
    shows after a few samples (latest first) and a small cluster runs quickly, so the search pays for full
    screening runs only near the answer, never for the widest cluster unless the answer is near it (a loose
    deadline met by one instance takes one run, not a bisection down from hundreds)."""
    itype, workers, most = widest.instance_type, widest.workers, widest.instances
    step = _instance_step(itype, workers)
    screened: dict[int, AshaResult] = {}
    late: list[int] = []  # samples by lateness on the clusters that missed, latest first: a miss shows early

    def meets(k: int) -> bool:
        nonlocal late
        res = sim.simulate_unless_late(
            AshaCluster(itype, k * step, workers), (deadline_s, confidence), late, SEARCH_SAMPLES
        )
        if isinstance(res, AshaResult):
            screened[k] = res
            return True
        late = lateness_order(res, allowed_late(SEARCH_SAMPLES, confidence) + 1, late, SEARCH_SAMPLES)
        return False

    widest_k = max(1, most // step)
    lo, k = 1, 1  # every count below lo misses
    while k < widest_k and not meets(k):
        lo, k = k + 1, 2 * k
    if k >= widest_k:
        whole = sim.simulate(AshaCluster(itype, widest_k * step, workers), SEARCH_SAMPLES)
        if not whole.meets(deadline_s, confidence):
            return whole, False
        screened[widest_k] = whole
        k = widest_k
    hi = k
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return screened[lo], True


def allowed_late(samples: int, confidence: float) -> int:
    """How many of ``samples`` samples may miss the deadline where it is met at ``confidence``."""
    return samples - needed_on_time(samples, confidence)


def lateness_order(ran: list[int], late: int, before: list[int], samples: int) -> list[int]:
    """The order to run ``samples`` samples in on the next cluster, after one on which ``ran`` ran (latest first,
    its first ``late`` late): those late first, then those not run there (in ``before``'s order, then by index),
    then those on time there, latest first. Lateness carries over between neighbouring clusters (on Hyperband
    R=243 at 1.2× the shortest deadline, every sample late on 76 g5.xlarge was among the 15 latest of 200 on 75),
    so a sample late on one is the likeliest to be late on the next, and one on time there the least likely: the
    searches only ever try a cluster larger than every one that missed."""
    done = set(ran)
    unrun = [s for s in before if s not in done]
    seen = done.union(unrun)
    return ran[:late] + unrun + [s for s in range(samples) if s not in seen] + ran[late:]


def _instance_step(itype: InstanceType, workers: int) -> int:
    """Instances per trial slot step: a trial wider than an instance takes whole instances."""
    return -(-workers // itype.workers) if workers > itype.workers else 1


def _confirmed(sim: AshaSimulator, screened: AshaResult, most: int, deadline_s: float, confidence: float) -> AshaResult:
    """``screened``'s cluster with every sample, grown a slot step at a time while the screening was optimistic (at
    most to ``most`` instances, where the result may miss the deadline)."""
    itype, workers = screened.cluster.instance_type, screened.cluster.workers
    step = _instance_step(itype, workers)
    k = screened.cluster.instances // step
    # samples by lateness on the clusters tried (the screening's to begin with): a miss shows early
    ran = [int(s) for s in np.argsort(-screened.jct, kind="stable")]
    late = lateness_order(ran, int((screened.jct > deadline_s).sum()), [], sim.samples)
    while k * step < most:
        res = sim.simulate_unless_late(AshaCluster(itype, k * step, workers), (deadline_s, confidence), late)
        if isinstance(res, AshaResult):
            return res
        late = lateness_order(res, allowed_late(sim.samples, confidence) + 1, late, sim.samples)
        k += 1
    return sim.simulate(AshaCluster(itype, k * step, workers))


def _ranked_pairs(
    sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int
) -> list[tuple[InstanceType, int]]:
    """Every (type, width) pair, by price per trained epoch (then type key and width): a fixed cluster's cost is
    mostly its slots' time."""
    model = sim.model
    pairs = []
    seen: set[tuple] = set()
    for itype in types:
        twin = sim.runs_alike(itype)
        if twin in seen:  # the same type in another region at the same prices: the same runs, searched once
            continue
        seen.add(twin)
        for w in widths_for(itype, max_workers):
            nodes = layout(itype.workers, _instance_step(itype, w), w).nodes
            per_epoch = model.epoch_time(itype.device, w, nodes) * itype.price(sim.spot) * w / itype.workers
            pairs.append((per_epoch, itype.key, w, itype))
    pairs.sort(key=lambda x: (x[0], x[1], x[2]))
    return [(itype, w) for _, _, w, itype in pairs]


@dataclass(frozen=True)
class _Screened:
    """A (type, width) pair's fewest instances meeting the deadline on screening samples, and its most useful."""

    result: AshaResult
    most: int


def _fixed_search(
    sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int, deadline_s: float, confidence: float
) -> tuple[list[_Screened], AshaResult | None]:
    """(each pair meeting the deadline on screening samples, at its fewest instances; the quickest cluster tried
    where a pair meets it nowhere, on screening samples), pairs as :func:`asha_baseline` says."""
    meeting: list[_Screened] = []
    quickest: AshaResult | None = None
    for rank, (itype, w) in enumerate(_ranked_pairs(sim, types, max_workers)):
        if rank >= PAIRS_SEARCHED * (1 if meeting else 3):
            break
        most = useful_instances(sim.trials, itype.workers, w)
        res, meets = _fewest_meeting(sim, AshaCluster(itype, most, w), deadline_s, confidence)
        if meets:
            meeting.append(_Screened(res, most))
        else:
            quickest = _quicker(quickest, res, confidence)
    return meeting, quickest


def _quicker(a: AshaResult | None, b: AshaResult, confidence: float) -> AshaResult:
    return b if a is None or b.jct_quantile(confidence) < a.jct_quantile(confidence) else a


def _cheapest(results: Sequence[AshaResult]) -> AshaResult | None:
    """The cheapest result (mean cost; the first of equals)."""
    best: AshaResult | None = None
    for res in results:
        if best is None or res.cost_mean < best.cost_mean:
            best = res
    return best


def asha_baseline(
    sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int, deadline_s: float, confidence: float
) -> tuple[AshaResult, bool] | None:
    """The cheapest fixed cluster on which ASHA meets the deadline at the confidence: (result, True);
    when none does, the quickest cluster tried (a slot for every trial): (result, False).

    Searched over the :data:`PAIRS_SEARCHED` (type, width) pairs with the lowest price per trained
    epoch (more when none of those meets the deadline, up to three times as many), each at its
    fewest instances meeting the deadline (doubling, then bisection, on :data:`SEARCH_SAMPLES` samples). The pairs are confirmed
    with every sample cheapest screening first, until the cheapest confirmed costs no more than the next one's
    screening: the confirmation is most of the search's time, and a pair screened dearer rarely wins."""
    meeting, quickest = _fixed_search(sim, types, max_workers, deadline_s, confidence)
    best: AshaResult | None = None
    for found in sorted(meeting, key=lambda f: f.result.cost_mean):
        if best is not None and best.cost_mean <= found.result.cost_mean:
            break
        res = _confirmed(sim, found.result, found.most, deadline_s, confidence)
        if not res.meets(deadline_s, confidence):
            quickest = _quicker(quickest, res, confidence)
        elif best is None or res.cost_mean < best.cost_mean:
            best = res
    if best is not None:
        return best, True
    if quickest is None:
        return None
    return sim.simulate(quickest.cluster), False


def shrink_phases(
    sim: AshaSimulator, cluster: AshaCluster, deadline_s: float, confidence: float
) -> tuple[AshaResult, int, int]:
    """The cheapest phase counts found from the fixed ``cluster`` (every phase at its size): (result, phase counts
    billed, steps taken).

    Greedy: each step tries, for every phase ``k`` ≥ 1, one step fewer instances (whole slots: a spanning trial's
    instances together) and the fewest (one slot's worth), later phases capped at the new count (the counts
    never grow), and takes the move that saves most while the deadline is still met at the confidence; it stops
    when no move saves. Every candidate is billed on one event run of ``cluster`` with all samples (phase
    counts change when instances go, never the run itself: the module docstring), so nothing needs confirming."""
    itype, peak, w = cluster.instance_type, cluster.instances, cluster.workers
    step = _instance_step(itype, w)
    trace = sim.trace(cluster)
    counts = (peak,) * len(sim.milestones)
    best = sim.bill(trace, AshaPhases(itype, counts, w))
    billed = steps = 0
    while True:
        moves: list[tuple[float, int, tuple[int, ...], AshaResult]] = []
        for k in range(1, len(counts)):
            for to in sorted({counts[k] - step, step}, reverse=True):
                if not step <= to < counts[k]:
                    continue
                trial = counts[:k] + tuple(min(c, to) for c in counts[k:])
                res = sim.bill(trace, AshaPhases(itype, trial, w))
                billed += 1
                if res.meets(deadline_s, confidence) and res.cost_mean < best.cost_mean - 1e-12:
                    moves.append((best.cost_mean - res.cost_mean, -k, trial, res))
        if not moves:
            return best, billed + 1, steps
        _, _, counts, best = max(moves, key=lambda m: (m[0], m[1], m[2]))
        steps += 1


@dataclass
class AshaSearch:
    """What :func:`elastic_asha` found: the cheapest elastic cluster meeting the deadline (None when none does),
    the cheapest fixed one (:func:`asha_baseline`'s answer), and, when none meets it, the quickest fixed
    cluster tried (all samples) and that cluster elastic (its own JCT at the confidence as the deadline)."""

    elastic: AshaResult | None
    fixed: AshaResult | None
    quickest: AshaResult | None
    quickest_elastic: AshaResult | None
    candidates: int  # event runs plus phase counts billed
    steps: int  # greedy steps over every start searched


def elastic_asha(
    sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int, deadline_s: float, confidence: float
) -> AshaSearch:
    """The cheapest elastic ASHA cluster meeting the deadline at the confidence.

    Starts from each (type, width) pair's fewest instances meeting the deadline on a fixed cluster (the pairs
    :func:`asha_baseline` searches, so its answer comes along), lowers the later phases' counts
    (:func:`shrink_phases`) and keeps the cheapest. Never costlier than the best fixed cluster: shrinking that
    one alone costs at most as much."""
    runs = sim.runs
    screened, quickest = _fixed_search(sim, types, max_workers, deadline_s, confidence)
    meeting: list[AshaResult] = []
    for pair in screened:  # every pair is shrunk: each confirmed
        res = _confirmed(sim, pair.result, pair.most, deadline_s, confidence)
        if res.meets(deadline_s, confidence):
            meeting.append(res)
        else:
            quickest = _quicker(quickest, res, confidence)
    fixed = _cheapest(meeting)
    billed = steps = 0
    shrunk = []
    for res in meeting:
        found, tried, taken = shrink_phases(sim, res.cluster, deadline_s, confidence)
        shrunk.append(found)
        billed, steps = billed + tried, steps + taken
    quickest_all = quickest_elastic = None
    if fixed is None and quickest is not None:
        quickest_all = sim.simulate(quickest.cluster)
        quickest_elastic, tried, taken = shrink_phases(
            sim, quickest.cluster, quickest_all.jct_quantile(confidence), confidence
        )
        billed, steps = billed + tried, steps + taken
    return AshaSearch(_cheapest(shrunk), fixed, quickest_all, quickest_elastic, sim.runs - runs + billed, steps)
