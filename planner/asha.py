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
start costs the warm-worker start. Instances come up after a start-up draw (serially on local)
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

    def __init__(self, model: PerformanceModel, *, trials: int, eta: int, min_epochs: int, max_epochs: int,
                 samples: int = ASHA_SAMPLES, seed: int = 0, spot: bool = False,
                 head_cost: Callable[[InstanceType, np.ndarray], np.ndarray] | None = None) -> None:
        self.model = model
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
        self._factor = np.exp(sigma * rng.standard_normal((samples, trials))) if sigma > 0 else \
            np.ones((samples, trials))
        self._boot_u = rng.random((samples, 1024))

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
        breakdown = {"training": training, "startup": startup_cost, "idle": total - training - startup_cost,
                     "head": head}
        return AshaResult(cluster, jct, total + head, breakdown, reached)

    def _run(self, s: int, ready: np.ndarray, lay, epoch: float, reached: np.ndarray) -> tuple[float, float]:
        """One sample: event-driven ASHA; returns (JCT, slot-seconds spent training)."""
        model = self.model
        if lay.span == 1:
            slot_ready = np.repeat(ready, lay.per_instance)
        else:
            slot_ready = ready[:lay.slots * lay.span].reshape(lay.slots, lay.span).max(axis=1)
        free = [(float(t), j) for j, t in enumerate(slot_ready)]
        heapq.heapify(free)
        events: list[tuple[float, int, int, int]] = []  # (time, trial, rung, slot)
        recorded: list[list[float]] = [[] for _ in self.milestones]
        quality = self._quality[s]
        factor = self._factor[s]
        q_cut = 1.0 - 1.0 / self.eta
        per_epoch = model.epoch_overhead_s
        next_trial = 0
        end = 0.0
        busy = 0.0

        def segment(trial: int, rung: int) -> float:
            epochs = self.milestones[rung] - (self.milestones[rung - 1] if rung > 0 else 0)
            return epochs * (epoch * factor[trial] + per_epoch) + model.eval_time_s

        while next_trial < self.trials or events:
            # start new trials on every slot free before the next report
            while next_trial < self.trials and free and (not events or free[0][0] <= events[0][0]):
                t, j = heapq.heappop(free)
                d = model.task_start_s + segment(next_trial, 0)
                busy += d
                heapq.heappush(events, (t + d, next_trial, 0, j))
                next_trial += 1
            if not events:
                break
            t, trial, rung, j = heapq.heappop(events)
            reached[rung] += 1
            rec = recorded[rung]
            stop = bool(rec) and quality[trial] < _percentile(rec, q_cut)
            bisect.insort(rec, float(quality[trial]))
            if stop or rung + 1 == len(self.milestones):
                end = max(end, t)
                heapq.heappush(free, (t, j))
            else:
                d = segment(trial, rung + 1)
                busy += d
                heapq.heappush(events, (t + d, trial, rung + 1, j))
        return end, busy


def _smallest_meeting(sim: AshaSimulator, itype: InstanceType, workers: int, deadline_s: float, confidence: float,
                      most: int) -> AshaResult | None:
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


def asha_baseline(sim: AshaSimulator, types: Sequence[InstanceType], max_workers: int, deadline_s: float,
                  confidence: float) -> tuple[AshaResult, bool] | None:
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
