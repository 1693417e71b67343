"""ASHA (asynchronous successive halving) simulated on a fixed cluster: the baseline users know.

Users who tune with Ray Tune mostly run ``ASHAScheduler`` (Li et al., MLSys'20) on a fixed
cluster. This module predicts its JCT and cost with the same performance model as the elastic
plans, so ``rubberband plan`` can show elastic SHA, static SHA and ASHA side by side.

Semantics (as Ray Tune's ``ASHAScheduler`` runs it, one bracket): rungs at
``min_epochs·η^k`` cumulative epochs below ``max_epochs``. A fixed cluster of ``instances`` ×
``instance_type`` has trial slots (:func:`~rubberband.planner.simulator.layout`); whenever a slot
is free it starts the next of the ``trials`` trials. A running trial reports at every rung it
reaches: it continues iff its metric is not below the ``(1 − 1/η)`` percentile of the results
recorded at that rung before it (no result yet: it continues); otherwise it stops and frees its
slot. A trial that reaches ``max_epochs`` ends. No stage barriers: slots never wait for a rung
to fill. The job ends when the last trial ends; every instance is billed from its request until
then plus its termination latency (a static cluster), plus the run's head when there is one.

Metrics: each trial has a latent quality (a random permutation per sample) that orders it at
every rung. Timing: per epoch the profiled epoch time × the trial's straggler factor (lognormal,
the profile's σ) + the per-epoch overhead; each rung report adds an evaluation pass; a trial's
start costs the warm-worker start (× a lognormal factor of σ ``start_sigma`` per trial when set: trial
starts of uneven length finish out of queue order, as Ray's do, and ASHA's promotions depend on the
order in which results arrive). Instances come up after a start-up draw (serially on local)
plus the worker start. Event-driven per sample (heaps); pure, deterministic given the seed.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from rubberband.catalog import BILLING_RULES, HEAD_BOOTS_FIRST, SERIAL_PROVISIONING, InstanceType
from rubberband.planner.model import PerformanceModel
from rubberband.planner.search import widths_for
from rubberband.planner.simulator import layout, useful_instances

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


@dataclass
class AshaResult:
    """Distributions over samples of one ASHA run on one cluster."""

    cluster: AshaCluster
    jct: np.ndarray
    cost: np.ndarray
    breakdown: dict[str, np.ndarray]
    promotions: np.ndarray  # (samples, rungs): trials that reached each rung

    @property
    def cost_mean(self) -> float:
        return float(self.cost.mean())

    def meets(self, deadline_s: float, confidence: float) -> bool:
        return int(np.count_nonzero(self.jct <= deadline_s)) >= math.ceil(confidence * len(self.jct) - 1e-9)

    def jct_quantile(self, q: float) -> float:
        return float(np.quantile(self.jct, q))


def rungs(eta: int, min_epochs: int, max_epochs: int) -> list[int]:
    """Cumulative epochs at which a trial reports (Ray Tune's milestones), ending with ``max_epochs``."""
    out = []
    r = min_epochs
    while r < max_epochs:
        out.append(r)
        r *= eta
    return out + [max_epochs]


def _percentile(sorted_values: list[float], q: float) -> float:
    """numpy's default (linear) percentile of a sorted list, q in [0, 1]."""
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class AshaSimulator:
    """Simulates ASHA for one job (trials, η, epochs) on fixed clusters; see the module docstring.

    ``head_cost(instance_type, jct)`` bills the run's head for a cluster of that type (per-sample
    array; None: no head).
    """

    def __init__(
        self,
        model: PerformanceModel,
        *,
        trials: int,
        eta: int,
        min_epochs: int,
        max_epochs: int,
        samples: int = ASHA_SAMPLES,
        seed: int = 0,
        spot: bool = False,
        head_cost: Callable[[InstanceType, np.ndarray], np.ndarray] | None = None,
        start_concurrency: float | None = None,
        start_sigma: float = 0.0,
    ) -> None:
        if start_concurrency is not None and start_concurrency < 1:
            raise ValueError("start_concurrency must be at least 1 (or None: unlimited)")
        if not (start_sigma >= 0 and math.isfinite(start_sigma)):
            raise ValueError("start_sigma must be a finite number ≥ 0 (0: every trial start takes task_start_s)")
        self.model = model
        self.start_concurrency = start_concurrency
        self.trials = trials
        self.eta = eta
        self.milestones = rungs(eta, min_epochs, max_epochs)
        self.samples = samples
        self.seed = seed
        self.spot = spot
        self.head_cost = head_cost
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0xA5A,))))
        self._quality = np.argsort(rng.random((samples, trials)), axis=1).astype(float)
        sigma = model.straggler_sigma
        self._factor = (
            np.exp(sigma * rng.standard_normal((samples, trials))) if sigma > 0 else np.ones((samples, trials))
        )
        self._boot_u = rng.random((samples, 1024))
        # drawn after the rest, so that start_sigma 0 leaves every other draw (and so every result) unchanged
        self._start_factor = (
            np.exp(start_sigma * rng.standard_normal((samples, trials)))
            if start_sigma > 0
            else np.ones((samples, trials))
        )

    def set_qualities(self, qualities: Sequence[float]) -> None:
        """Use one fixed order of the trials' qualities (higher is better) in every sample, e.g. the scores a
        benchmark's trials report, instead of a random permutation per sample."""
        values = np.asarray(qualities, dtype=float)
        if values.shape != (self.trials,):
            raise ValueError(f"qualities must hold one value per trial ({self.trials}), not {values.shape}")
        self._quality = np.broadcast_to(values, (self.samples, self.trials))

    def simulate(self, cluster: AshaCluster, samples: int | None = None) -> AshaResult:
        n = self.samples if samples is None else min(samples, self.samples)
        itype, k, w = cluster.instance_type, cluster.instances, cluster.workers
        model = self.model
        lay = layout(itype.workers, k, w)
        if lay.slots < 1:
            raise ValueError("the cluster has no trial slot")
        epoch = model.epoch_time(itype.device, w, lay.nodes)
        startup = model.startup(itype.cloud, itype.name)
        head_boot = startup.quantile(0.5) if itype.cloud in HEAD_BOOTS_FIRST else 0.0
        boot = startup.sample(self._boot_u[:n, :k])
        if itype.cloud in SERIAL_PROVISIONING:
            request = head_boot + np.concatenate([np.zeros((n, 1)), np.cumsum(boot, axis=1)[:, :-1]], axis=1)
        else:
            request = np.full((n, k), head_boot)
        ready = request + boot + model.worker_start_s
        jct = np.empty(n)
        reached = np.zeros((n, len(self.milestones)), dtype=np.int64)
        busy = np.zeros(n)
        for s in range(n):
            jct[s], busy[s] = self._run(s, ready[s], lay, epoch, reached[s])
        price = itype.price(self.spot) / 3600.0
        rule = BILLING_RULES.get(itype.cloud, BILLING_RULES["aws"])
        gone = model.termination(itype.cloud, itype.name).quantile(0.5)
        life = jct[:, None] - request
        billed = rule.billed_seconds(life + gone)
        total = billed.sum(axis=1) * price
        training = busy * price * w / itype.workers
        startup_cost = (ready - request).sum(axis=1) * price
        head = self.head_cost(itype, jct) if self.head_cost is not None else np.zeros(n)
        breakdown = {
            "training": training,
            "startup": startup_cost,
            "idle": total - training - startup_cost,
            "head": head,
        }
        return AshaResult(cluster, jct, total + head, breakdown, reached)

    def _run(self, s: int, ready: np.ndarray, lay, epoch: float, reached: np.ndarray) -> tuple[float, float]:
        """One sample: event-driven ASHA; returns (JCT, slot-seconds spent starting and training)."""
        model = self.model
        if lay.span == 1:
            slot_ready = np.repeat(ready, lay.per_instance)
        else:
            slot_ready = ready[: lay.slots * lay.span].reshape(lay.slots, lay.span).max(axis=1)
        free = [(float(t), j) for j, t in enumerate(slot_ready)]
        heapq.heapify(free)
        events: list[tuple[float, int, int, int]] = []  # (time, trial, rung, slot)
        # unlimited starts (the default) take task_start_s each: folded into the first segment
        starts = _Starts(self.start_concurrency, model.task_start_s) if self.start_concurrency else None
        bracket = AshaRungs(self.eta, len(self.milestones))
        quality = self._quality[s]
        factor = self._factor[s]
        start_factor = self._start_factor[s]
        per_epoch = model.epoch_overhead_s
        next_trial = 0
        end = 0.0
        busy = 0.0
        inf = math.inf

        def segment(trial: int, rung: int) -> float:
            epochs = self.milestones[rung] - (self.milestones[rung - 1] if rung > 0 else 0)
            return epochs * (epoch * factor[trial] + per_epoch) + model.eval_time_s

        while True:
            t_free = free[0][0] if next_trial < self.trials and free else inf
            t_start = starts.next_time() if starts is not None else inf
            t_report = events[0][0] if events else inf
            if t_free == inf and t_start == inf and t_report == inf:
                break
            if t_free <= t_start and t_free <= t_report:  # a free slot starts the next trial
                t, j = heapq.heappop(free)
                if starts is None:
                    d = model.task_start_s * start_factor[next_trial] + segment(next_trial, 0)
                    busy += d
                    heapq.heappush(events, (t + d, next_trial, 0, j))
                else:
                    domain = j // lay.per_instance if lay.span == 1 else j * lay.span
                    starts.add(t, domain, next_trial, j, start_factor[next_trial])
                next_trial += 1
                continue
            if starts is not None and t_start <= t_report:  # trial starts done: their first segment runs
                for t, began, trial, j in starts.pop_done():
                    d = segment(trial, 0)
                    busy += t - began + d
                    heapq.heappush(events, (t + d, trial, 0, j))
                continue
            t, trial, rung, j = heapq.heappop(events)
            reached[rung] += 1
            if not bracket.on_result(rung, float(quality[trial])) or rung + 1 == len(self.milestones):
                end = max(end, t)
                heapq.heappush(free, (t, j))
            else:
                d = segment(trial, rung + 1)
                busy += d
                heapq.heappush(events, (t + d, trial, rung + 1, j))
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
        stop = bool(rec) and value < _percentile(rec, self.q)
        bisect.insort(rec, value)
        return not stop


class _Starts:
    """Trial starts in progress when they contend: each needs ``work`` seconds alone
    (``task_start_s``); the starts in progress on one instance (``domain``) share ``concurrency``
    start lanes by processor sharing, each progressing at min(1, concurrency / n) while n are in
    progress. That is how Ray Tune's trial actors start (``reuse_actors=False``, its default: a new
    worker process per trial, whose interpreter and imports start on the node's few cores)."""

    def __init__(self, concurrency: float, work: float) -> None:
        self.concurrency = concurrency
        self.work = work
        self._active: dict[int, list[list[float]]] = {}  # domain -> [[remaining, began, trial, slot]]
        self._updated: dict[int, float] = {}

    def _advance(self, domain: int, t: float) -> None:
        active = self._active.get(domain)
        if active:
            done = (t - self._updated[domain]) * min(1.0, self.concurrency / len(active))
            for a in active:
                a[0] -= done
        self._updated[domain] = t

    def add(self, t: float, domain: int, trial: int, slot: int, factor: float = 1.0) -> None:
        """A start of ``work × factor`` seconds (alone) begins at ``t``."""
        self._advance(domain, t)
        self._active.setdefault(domain, []).append([self.work * factor, t, trial, slot])

    def _domain_next(self, domain: int) -> float:
        active = self._active[domain]
        return self._updated[domain] + min(a[0] for a in active) / min(1.0, self.concurrency / len(active))

    def next_time(self) -> float:
        return min((self._domain_next(d) for d, a in self._active.items() if a), default=math.inf)

    def pop_done(self) -> list[tuple[float, float, int, int]]:
        """The starts finishing at :meth:`next_time`: (time, began, trial, slot), in trial order."""
        t = self.next_time()
        out: list[list[float]] = []
        for domain, active in self._active.items():
            if not active or self._domain_next(domain) > t + 1e-9:
                continue
            self._advance(domain, t)
            keep: list[list[float]] = []
            for a in active:
                (out if a[0] <= 1e-9 else keep).append(a)
            self._active[domain] = keep
        return sorted(((t, a[1], int(a[2]), int(a[3])) for a in out), key=lambda x: x[2])


def _smallest_meeting(
    sim: AshaSimulator, itype: InstanceType, workers: int, deadline_s: float, confidence: float, most: int
) -> AshaResult | None:
    """The fewest instances of (type, width) meeting the deadline (bisection on screening samples)."""
    step = -(-workers // itype.workers) if workers > itype.workers else 1

    def meets(k: int) -> bool:
        return sim.simulate(AshaCluster(itype, k * step, workers), SEARCH_SAMPLES).meets(deadline_s, confidence)

    hi = max(1, most // step)
    if not meets(hi):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    k = lo
    while True:  # confirm with every sample (grow while the screening was optimistic)
        res = sim.simulate(AshaCluster(itype, k * step, workers))
        if res.meets(deadline_s, confidence) or k * step >= most:
            return res
        k += 1


def asha_baseline(
    sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int, deadline_s: float, confidence: float
) -> tuple[AshaResult, bool] | None:
    """The cheapest fixed cluster on which ASHA meets the deadline at the confidence: (result, True);
    when none does, the quickest cluster tried (a slot for every trial): (result, False).

    Searched over the :data:`PAIRS_SEARCHED` (type, width) pairs with the lowest price per trained
    epoch (more when none of those meets the deadline, up to three times as many), each at its
    fewest instances meeting the deadline (bisection on :data:`SEARCH_SAMPLES` samples, confirmed
    with all)."""
    model = sim.model
    pairs = []
    for itype in types:
        for w in widths_for(itype, max_workers):
            nodes = layout(itype.workers, 1 if w <= itype.workers else -(-w // itype.workers), w).nodes
            per_epoch = model.epoch_time(itype.device, w, nodes) * itype.price(sim.spot) * w / itype.workers
            pairs.append((per_epoch, itype.key, w, itype))
    pairs.sort(key=lambda x: (x[0], x[1], x[2]))
    best: AshaResult | None = None
    quickest: AshaResult | None = None
    for rank, (_, _, w, itype) in enumerate(pairs):
        if rank >= PAIRS_SEARCHED * (1 if best is not None else 3):
            break
        most = useful_instances(sim.trials, itype.workers, w)
        res = _smallest_meeting(sim, itype, w, deadline_s, confidence, most)
        if res is not None and res.meets(deadline_s, confidence):
            if best is None or res.cost_mean < best.cost_mean:
                best = res
        elif res is None or not res.meets(deadline_s, confidence):
            widest = sim.simulate(AshaCluster(itype, most, w), SEARCH_SAMPLES)
            if quickest is None or widest.jct_quantile(confidence) < quickest.jct_quantile(confidence):
                quickest = widest
    if best is not None:
        return best, True
    if quickest is None:
        return None
    return sim.simulate(quickest.cluster), False
