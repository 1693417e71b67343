"""Spot preemption and availability: fitting from traces, and the scenarios the simulator samples.

Pure (no I/O, no clock): trace files are read by :mod:`rubberband.spotmodel`; this module turns
their 0/1 tick series into a per-zone model and samples from it (or replays the series themselves).

**Trace semantics** (NSDI'24 "Can't Be Late", Wu et al.; the ``skypilot-org/spot-traces`` format):
``data[i] == 0``: during tick ``i`` a spot instance was available (availability traces) or kept
running (preemption traces); ``1``: none was available, or the instance had been preempted and was
not back yet. A preemption is a 0 → 1 transition.

**The fitted model, per (cloud, instance type, zone)** (:class:`ZoneModel`):

* ``preemption_rate_per_h`` — preemptions per hour a spot instance *runs*: 0 → 1 transitions of the
  preemption traces over their running (0) hours, with a Jeffreys ½ added to the count so a short
  trace without a preemption does not claim the rate is zero. Zones with only availability traces
  take the rate pooled over the type's preemption traces (``rate_source`` says so).
* ``p_unavailable`` — the probability that a spot request finds no capacity: the fraction of
  unavailable ticks of the availability traces (else of the preemption traces).
* ``unavailable_s`` — the distribution of how long unavailability lasts once it starts: empirical
  quantiles (0, 5 %, …, 100 %) of the lengths of the runs of 1s. Runs are long (tens of minutes to
  hours); they decide that waiting for spot capacity is rarely worth it under a deadline.

**Scenarios** (what the simulator asks, vectorised over samples × tasks):

* :class:`ModelScenario` samples the fitted model: preemptions are a Poisson process at the zone's
  rate while an instance runs (memoryless, independent per instance), a request finds no capacity
  with ``p_unavailable`` and then waits a draw of ``unavailable_s``. Draws come from streams keyed
  by (seed, stage, event), so every candidate plan sees the same preemptions (common random numbers).
* :class:`TraceScenario` replays traces: each Monte Carlo sample starts at a random offset of a
  random preemption trace (running instances) and of a random availability trace (requests); a
  task running over ``[t, …)`` is preempted at the trace's next 0 → 1 transition after ``offset + t``
  and a request at ``t`` finds no capacity while the availability trace is at 1 (for the rest of
  that run). Every instance of a sample follows the same trace: a pessimistic, zone-wide
  correlation (single-node traces cannot say how independent instances are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from rubberband.catalog import InstanceType
from rubberband.planner.policies import Market, SpotPolicy, SpotSituation

#: Quantile levels at which unavailability durations are kept (0, 5 %, …, 100 %).
DURATION_LEVELS = tuple(round(i / 20, 2) for i in range(21))
#: Preemptions sampled per task at most; the rest of a task after that many runs uninterrupted.
MAX_PREEMPTIONS = 6
#: The event number of a stage's spot request in the random streams (a task's events are
#: ``wave × MAX_PREEMPTIONS + k``).
REQUEST_EVENT = 1 << 20
#: Used when a zone has no unavailability run at all (it was never unavailable): one tick's worth.
_NO_RUNS_S = 0.0
#: The quantile of unavailability durations the fall-back counts as the wait for capacity.
WAIT_QUANTILE = 0.9


# -- fitting --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceStats:
    """What one 0/1 trace says: ticks, its running (0) ticks, preemptions and unavailable runs."""

    gap_s: float
    ticks: int
    available_ticks: int
    preemptions: int
    unavailable_runs_s: tuple[float, ...]

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_s / 3600.0

    @property
    def running_hours(self) -> float:
        return self.available_ticks * self.gap_s / 3600.0

    @property
    def unavailable_fraction(self) -> float:
        return 1.0 - self.available_ticks / self.ticks if self.ticks else 0.0


def trace_stats(data: Sequence[int], gap_s: float) -> TraceStats:
    """Statistics of one trace (``data``: 0/1 per tick, ``gap_s`` seconds apart)."""
    a = np.asarray(data, dtype=np.int8)
    if a.ndim != 1 or a.size == 0:
        raise ValueError("a trace needs at least one tick")
    if gap_s <= 0 or not math.isfinite(gap_s):
        raise ValueError(f"gap_seconds must be a positive number, got {gap_s!r}")
    preemptions = int(np.count_nonzero((a[:-1] == 0) & (a[1:] == 1)))
    padded = np.concatenate([[0], a, [0]])
    starts = np.flatnonzero((padded[1:-1] == 1) & (padded[:-2] == 0))
    ends = np.flatnonzero((padded[1:-1] == 1) & (padded[2:] == 0))
    runs = tuple(float((e - s + 1) * gap_s) for s, e in zip(starts, ends))
    return TraceStats(
        gap_s=float(gap_s),
        ticks=int(a.size),
        available_ticks=int(np.count_nonzero(a == 0)),
        preemptions=preemptions,
        unavailable_runs_s=runs,
    )


@dataclass(frozen=True)
class ZoneModel:
    """Fitted spot behaviour of one (cloud, instance type, zone); see the module docstring."""

    cloud: str
    instance_type: str
    region: str
    zone: str
    preemption_rate_per_h: float
    p_unavailable: float
    unavailable_s: tuple[float, ...]  # quantiles at DURATION_LEVELS
    running_hours: float = 0.0
    preemptions: int = 0
    observed_hours: float = 0.0
    unavailable_runs: int = 0
    rate_source: str = "preemption traces of this zone"
    #: For an entry fitted on several time-aligned zones of a region: ``p_none_of[j - 1]`` is the probability that
    #: none of ``j`` of those zones, picked at random, has capacity (:func:`p_none_of`); empty otherwise.
    p_none_of: tuple[float, ...] = ()
    #: Not fitted on traces of this type: a prior pooled over other types (:func:`rubberband.planner.spotzones.prior`).
    prior: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.cloud, self.region, self.instance_type)

    def unavailable_quantile(self, q: float) -> float:
        return float(np.interp(q, DURATION_LEVELS, self.unavailable_s))

    def sample_unavailable(self, u: np.ndarray) -> np.ndarray:
        """Unavailability durations from uniforms ``u`` (inverse of the piecewise-linear quantile function)."""
        return np.interp(u, DURATION_LEVELS, self.unavailable_s)

    def score(self) -> float:
        """What ranks zones of equal price (lower is better): the chance that a request falls back to
        on-demand, plus the preemptions of an hour weighted by what one costs (a restart and half a
        checkpoint interval, about a tenth of an hour)."""
        return self.p_unavailable + 0.1 * self.preemption_rate_per_h


def _quantiles(runs: Sequence[float]) -> tuple[float, ...]:
    if not runs:
        return tuple(_NO_RUNS_S for _ in DURATION_LEVELS)
    return tuple(float(x) for x in np.quantile(np.asarray(runs, dtype=float), DURATION_LEVELS))


def _rate(preemptions: int, running_hours: float, gap_s: float) -> float:
    """Preemptions per running hour with a Jeffreys ½ (never 0 from a short trace); at least one tick's exposure."""
    return (preemptions + 0.5) / max(running_hours, gap_s / 3600.0)


def p_none_of(aligned: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """For time-aligned 0/1 availability traces of ``m`` zones (same ticks), ``(q_1, …, q_m)``: ``q_j`` is the mean,
    over every set of ``j`` zones, of the fraction of ticks at which none of them had capacity. ``q_1`` is the
    zones' mean unavailability, ``q_m`` that of the region as a whole; measured, so the correlation between zones
    stays in. Averaging over the sets is what an unknown mapping of the traces' zone names onto the catalog's
    zones (zone IDs, which differ per account) leaves: any ``j`` of them are equally likely to be the ``j`` tried.
    """
    down = np.asarray(aligned, dtype=bool)
    if down.ndim != 2 or down.shape[0] == 0 or down.shape[1] == 0:
        raise ValueError("p_none_of needs at least one non-empty trace")
    m = down.shape[0]
    sums = [0.0] * m
    counts = [0] * m
    for mask in range(1, 1 << m):
        members = [i for i in range(m) if mask >> i & 1]
        frac = float(np.all(down[members], axis=0).mean())
        sums[len(members) - 1] += frac
        counts[len(members) - 1] += 1
    return tuple(s / c for s, c in zip(sums, counts))


@dataclass(frozen=True)
class ZoneTraces:
    """What one zone is fitted from: the statistics of its ``preemption`` traces and of its ``availability``
    traces, and ``pooled`` (preemptions, running hours, gap) over the type's preemption traces, which stands in
    for the preemption rate when the zone has no preemption trace."""

    preemption: Sequence[TraceStats] = ()
    availability: Sequence[TraceStats] = ()
    pooled: tuple[int, float, float] | None = None


def fit_zone(cloud: str, instance_type: str, region: str, zone: str, traces: ZoneTraces) -> ZoneModel:
    """Fit one zone from its ``traces``; raises ValueError when it has neither kind of trace."""
    preemption, availability, pooled = traces.preemption, traces.availability, traces.pooled
    if not preemption and not availability:
        raise ValueError(f"no traces for {cloud} {instance_type} {zone}")
    if preemption:
        count = sum(t.preemptions for t in preemption)
        running = sum(t.running_hours for t in preemption)
        rate = _rate(count, running, min(t.gap_s for t in preemption))
        source = "preemption traces of this zone"
    elif pooled is not None:
        count, running, gap = pooled
        rate = _rate(count, running, gap)
        source = "pooled over the type's preemption traces (none for this zone)"
    else:
        # only availability traces: a running instance is taken to be preempted as often as capacity vanishes
        count = sum(t.preemptions for t in availability)
        running = sum(t.running_hours for t in availability)
        rate = _rate(count, running, min(t.gap_s for t in availability))
        source = "availability traces (no preemption trace of this type)"
    basis = list(availability) or list(preemption)
    ticks = sum(t.ticks for t in basis)
    unavailable = sum(t.ticks - t.available_ticks for t in basis)
    runs = [r for t in basis for r in t.unavailable_runs_s]
    return ZoneModel(
        cloud=cloud,
        instance_type=instance_type,
        region=region,
        zone=zone,
        preemption_rate_per_h=float(rate),
        p_unavailable=float(unavailable / ticks) if ticks else 0.0,
        unavailable_s=_quantiles(runs),
        running_hours=float(running),
        preemptions=int(count),
        observed_hours=float(sum(t.hours for t in basis)),
        unavailable_runs=len(runs),
        rate_source=source,
    )


@dataclass(frozen=True)
class SpotMarketModel:
    """Every fitted zone; the planner asks it which zone a (cloud, region, type) stage would use."""

    zones: tuple[ZoneModel, ...]

    def zones_for(self, cloud: str, region: str, instance_type: str) -> list[ZoneModel]:
        return [z for z in self.zones if z.key == (cloud, region, instance_type)]

    def best_zone(self, cloud: str, region: str, instance_type: str) -> ZoneModel | None:
        """The zone of the region the plan picks for spot: the lowest :meth:`ZoneModel.score` (the catalog
        prices spot per region in the plan, so among zones of one region the most reliable is cheapest)."""
        zones = self.zones_for(cloud, region, instance_type)
        return min(zones, key=lambda z: (z.score(), z.zone)) if zones else None


# -- scenarios ------------------------------------------------------------------------------------


class SpotScenario(Protocol):
    """What the simulator asks about one stage's spot market, vectorised; ``rows`` selects samples."""

    #: The wait for capacity the policy counts when a request finds none (seconds): a high quantile
    #: (:data:`WAIT_QUANTILE`) of how long unavailability lasts, since waiting is a gamble on its length.
    typical_wait_s: float

    def time_to_preemption(self, stage: int, event: int, rows: slice, t_abs: np.ndarray, span: int) -> np.ndarray: ...

    def unavailable_for(self, stage: int, event: int, rows: slice, t_abs: np.ndarray) -> np.ndarray: ...


class ModelScenario:
    """Samples a :class:`ZoneModel` (Poisson preemptions, Bernoulli unavailability, bootstrap waits)."""

    def __init__(self, zone: ZoneModel, *, seed: int, samples: int) -> None:
        self.zone = zone
        self.seed = seed
        self.samples = samples
        self.typical_wait_s = zone.unavailable_quantile(WAIT_QUANTILE)
        self._cache: dict[tuple, np.ndarray] = {}

    def _uniforms(self, stage: int, event: int, kind: int, width: int) -> np.ndarray:
        key = (stage, event, kind)
        have = self._cache.get(key)
        if have is None or have.shape[1] < width:
            seq = np.random.SeedSequence(self.seed, spawn_key=(0x5B07, stage, event, kind))
            have = np.random.Generator(np.random.PCG64(seq)).random((self.samples, max(width, 64)))
            self._cache[key] = have
        return have

    def time_to_preemption(self, stage: int, event: int, rows: slice, t_abs: np.ndarray, span: int) -> np.ndarray:
        rate_s = self.zone.preemption_rate_per_h * max(1, span) / 3600.0
        if rate_s <= 0:
            return np.full(t_abs.shape, np.inf)
        u = self._uniforms(stage, event, 0, t_abs.shape[1])[rows, : t_abs.shape[1]]
        return -np.log1p(-u) / rate_s

    def unavailable_for(self, stage: int, event: int, rows: slice, t_abs: np.ndarray) -> np.ndarray:
        width = t_abs.shape[1]
        hit = self._uniforms(stage, event, 1, width)[rows, :width] < self.zone.p_unavailable
        wait = self.zone.sample_unavailable(self._uniforms(stage, event, 2, width)[rows, :width])
        return np.where(hit, np.maximum(wait, 1.0), 0.0)


@dataclass(frozen=True)
class Trace:
    """One 0/1 trace for replay (``data`` per tick, ``gap_s`` apart)."""

    data: tuple[int, ...]
    gap_s: float
    name: str = ""


class _Compiled:
    """A trace with per-tick look-ups: ticks to the next preemption, ticks left in an unavailable run."""

    def __init__(self, trace: Trace) -> None:
        a = np.asarray(trace.data, dtype=np.int8)
        n = a.size
        self.gap = trace.gap_s
        self.length_s = n * trace.gap_s
        self.down = a
        # transition at tick i: a[i-1] == 0 and a[i] == 1 (circular); next_pre[i]: ticks until the next one ≥ i
        trans = (np.roll(a, 1) == 0) & (a == 1)
        nxt = np.full(2 * n, np.inf)
        where = np.inf
        doubled = np.concatenate([trans, trans])
        for i in range(2 * n - 1, -1, -1):
            if doubled[i]:
                where = i
            nxt[i] = where - i
        self.next_pre = nxt[:n]
        # ticks left in the current run of 1s (0 when available), circular
        left = np.zeros(2 * n)
        doubled_a = np.concatenate([a, a])
        for i in range(2 * n - 1, -1, -1):
            left[i] = (left[i + 1] + 1 if i + 1 < 2 * n else 1) if doubled_a[i] else 0
        self.run_left = np.minimum(left[:n], n)


class TraceScenario:
    """Replays traces: per sample a random preemption trace and availability trace, each at a random offset."""

    def __init__(
        self,
        preemption: Sequence[Trace],
        availability: Sequence[Trace],
        *,
        seed: int,
        samples: int,
        start_s: float = 0.0,
    ) -> None:
        if not preemption and not availability:
            raise ValueError("a trace scenario needs at least one trace")
        pre = [_Compiled(t) for t in (preemption or availability)]
        avail = [_Compiled(t) for t in (availability or preemption)]
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0x7ACE,))))
        pre_pick = gen.integers(0, len(pre), samples)
        avail_pick = gen.integers(0, len(avail), samples)
        #: Running instances replay the preemption traces, requests the availability traces.
        self.preemption = _Replays(pre, pre_pick, gen.random(samples), "next_pre")
        self.availability = _Replays(avail, avail_pick, gen.random(samples), "run_left")
        runs = [r for c in avail for r in _runs_of(c)]
        self.typical_wait_s = float(np.quantile(runs, WAIT_QUANTILE)) if runs else 0.0
        self.start_s = start_s

    def time_to_preemption(self, stage: int, event: int, rows: slice, t_abs: np.ndarray, span: int) -> np.ndarray:
        return self.preemption.at(rows, t_abs, self.start_s)

    def unavailable_for(self, stage: int, event: int, rows: slice, t_abs: np.ndarray) -> np.ndarray:
        return self.availability.at(rows, t_abs, self.start_s)


@dataclass(frozen=True, eq=False)
class _Replays:
    """One kind of trace replayed per sample: the compiled ``traces``, which one each sample replays (``pick``) and
    from which point (``off``, a fraction of its length), and the per-tick table read: ``next_pre`` (seconds to
    the next preemption) or ``run_left`` (seconds left of an unavailable run, 0 while available)."""

    traces: list[_Compiled]
    pick: np.ndarray
    off: np.ndarray
    table: str

    def at(self, rows: slice, t_abs: np.ndarray, start_s: float) -> np.ndarray:
        """The table's seconds at ``t_abs`` (samples ``rows`` × tasks) after the replay's start, ``start_s`` into
        the run."""
        out = np.empty(t_abs.shape)
        picks, offs = self.pick[rows], self.off[rows]
        for k, c in enumerate(self.traces):
            mask = picks == k
            if not mask.any():
                continue
            t = offs[mask, None] * c.length_s + t_abs[mask] + start_s
            idx = (np.floor(t / c.gap).astype(np.int64)) % c.down.size
            frac = t / c.gap - np.floor(t / c.gap)
            values = getattr(c, self.table)[idx]
            if self.table == "next_pre":
                # the next transition strictly after t: one at the current tick has already passed
                values = np.where(values == 0, _next_after(c, idx), values)
                out[mask] = (values - frac) * c.gap
            else:
                out[mask] = np.where(values > 0, (values - frac) * c.gap, 0.0)
        return out


def _next_after(c: _Compiled, idx: np.ndarray) -> np.ndarray:
    nxt = (idx + 1) % c.down.size
    return 1 + c.next_pre[nxt]


def _runs_of(c: _Compiled) -> list[float]:
    a = c.down
    padded = np.concatenate([[0], a, [0]])
    starts = np.flatnonzero((padded[1:-1] == 1) & (padded[:-2] == 0))
    ends = np.flatnonzero((padded[1:-1] == 1) & (padded[2:] == 0))
    return [float((e - s + 1) * c.gap) for s, e in zip(starts, ends)]


# -- what the simulator takes ---------------------------------------------------------------------


@dataclass(frozen=True)
class ZoneOffer:
    """One zone a spot request tries: its spot $/h and the chance a request finds capacity first there."""

    zone: str
    price_hr: float
    p_first: float


@dataclass(frozen=True)
class SpotOffer:
    """A spot stage's market on one (cloud, region, type): the zones tried, in the executor's order, and the
    fitted ``model`` of the set (its ``p_unavailable``: none of them has capacity)."""

    model: ZoneModel
    zones: tuple[ZoneOffer, ...]

    @property
    def prior(self) -> bool:
        return self.model.prior

    @property
    def price_hr(self) -> float:
        """The expected spot $/h paid, given capacity is found: the zones' prices weighted by ``p_first``."""
        found = sum(z.p_first for z in self.zones)
        if found <= 0:
            return self.zones[0].price_hr
        return sum(z.p_first * z.price_hr for z in self.zones) / found

    @property
    def first_zone(self) -> str:
        return self.zones[0].zone


@dataclass(frozen=True)
class SpotSetup:
    """Everything the simulator needs to play spot stages: the deadline the fall-back decisions aim at,
    the shared :class:`~rubberband.planner.policies.SpotPolicy`, and one scenario per (cloud, region, type).

    ``checkpoint_epochs``: a trial of a spot stage checkpoints every this many epochs (and after its last; the
    interval :func:`rubberband.planner.job.checkpoint_interval` chooses, which the executor's trials keep); a
    preemption loses the work since the last one, and the saves not made are not paid.

    ``fallbacks``: per spot type (its ``key``), the on-demand type a trial moves to when the policy gives up
    on spot (:func:`cheapest_fallbacks`); a type not listed falls back to itself, on-demand.

    ``offers``: per (cloud, region, type), the zones its spot requests try and what each costs
    (:class:`SpotOffer`): spot is billed at their expected price
    (:meth:`spot_price`); a type without one at its catalog spot price. ``zones``: the zone a stage names (the
    first one tried).
    """

    deadline_s: float
    scenarios: dict[tuple[str, str, str], SpotScenario]
    policy: SpotPolicy = field(default_factory=SpotPolicy)
    checkpoint_epochs: int = 1
    zones: dict[tuple[str, str, str], str] = field(default_factory=dict)
    fallbacks: Mapping[str, InstanceType] = field(default_factory=dict)
    offers: Mapping[tuple[str, str, str], SpotOffer] = field(default_factory=dict)

    def fallback(self, itype: InstanceType) -> InstanceType:
        """The on-demand type a trial of a spot stage on ``itype`` moves to (``itype`` itself by default)."""
        return self.fallbacks.get(itype.key, itype)

    def spot_price(self, itype: InstanceType) -> float:
        """$/h a spot instance of ``itype`` is billed at: its offer's zone-weighted price, else the catalog's."""
        offer = self.offers.get((itype.cloud, itype.region, itype.name))
        return offer.price_hr if offer is not None else itype.price(True)

    def scenario(self, cloud: str, region: str, instance_type: str) -> SpotScenario | None:
        return self.scenarios.get((cloud, region, instance_type))

    def allows(self, cloud: str, region: str, instance_type: str) -> bool:
        return (cloud, region, instance_type) in self.scenarios


def cheapest_fallbacks(
    types: Sequence[InstanceType], epoch_s: Callable[[InstanceType], float | None]
) -> dict[str, InstanceType]:
    """Per type sold on spot, the on-demand type its trials fall back to, where that is not the type itself.

    The fall-back is bought when the deadline is at stake, so it is chosen for the price of the work it does:
    among ``types`` in the same cloud and region with as many workers per instance (a trial's layout stays
    as planned), the least on-demand price × ``epoch_s`` (seconds per epoch; None: the profile cannot time
    that type, which is skipped). On a tie the type keeps itself. The slower fall-back's time is in every
    decision to fall back (the simulator's and the executor's), so a slower, cheaper type is taken earlier.
    """
    timed = {t.key: epoch_s(t) for t in types}
    out: dict[str, InstanceType] = {}
    for own in types:
        own_s = timed.get(own.key)
        if own.spot_price_hr is None or own_s is None:
            continue
        best, best_cost = own, own.price(False) * own_s
        for other in types:
            other_s = timed.get(other.key)
            if (
                other_s is None
                or other.key == own.key
                or (other.cloud, other.region, other.workers) != (own.cloud, own.region, own.workers)
            ):
                continue
            cost = other.price(False) * other_s
            if cost < best_cost - 1e-12:
                best, best_cost = other, cost
        if best.key != own.key:
            out[own.key] = best
    return out


def stay_on_spot(
    policy: SpotPolicy,
    time_left_s: np.ndarray,
    work_left_s: np.ndarray,
    restart_s: np.ndarray | float,
    on_spot: bool = True,
) -> np.ndarray:
    """``policy.decide`` over arrays of situations: True where it says spot.

    Each distinct situation is decided by the policy object itself (the executor's decision); the
    arrays are only grouped by their slack, on which :class:`SpotPolicy` depends, so the per-sample
    answers are exactly ``policy.decide(SpotSituation(...)) is Market.SPOT``.
    """
    time_left = np.asarray(time_left_s, dtype=float)
    work_left = np.broadcast_to(np.asarray(work_left_s, dtype=float), time_left.shape)
    restart = np.broadcast_to(np.asarray(restart_s, dtype=float), time_left.shape)
    if time_left.size == 0:
        return np.zeros(time_left.shape, dtype=bool)
    # the decision is monotone in the slack for a given restart: find the threshold with the policy itself
    out = np.empty(time_left.shape, dtype=bool)
    flat_t, flat_w, flat_r = time_left.ravel(), work_left.ravel(), restart.ravel()
    restarts, inverse = np.unique(flat_r, return_inverse=True)
    flat_out = out.ravel()
    for k, r in enumerate(restarts):
        sel = inverse == k
        slack = flat_t[sel] - flat_w[sel] - r
        order = np.argsort(slack, kind="stable")
        s_sorted = slack[order]
        # binary search for the first slack at which the policy says spot (monotone: more slack, more spot)
        lo, hi = 0, s_sorted.size
        while lo < hi:
            mid = (lo + hi) // 2
            sit = SpotSituation(
                time_left_s=float(s_sorted[mid] + r), work_left_s=0.0, restart_s=float(r), on_spot=on_spot
            )
            if policy.decide(sit) is Market.SPOT:
                hi = mid
            else:
                lo = mid + 1
        decided = np.zeros(s_sorted.size, dtype=bool)
        decided[lo:] = True
        res = np.empty(s_sorted.size, dtype=bool)
        res[order] = decided
        flat_out[sel] = res
    return flat_out.reshape(time_left.shape)
