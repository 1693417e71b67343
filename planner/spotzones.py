"""Spot priced where it is modelled: the zones a spot stage really tries, what each costs, and how likely each is.

Pure (no I/O, no clock). The executor's failover tries a spot request's zones in one order,
:meth:`~rubberband.catalog.InstanceType.zones_to_try` (the zones with a spot offer, cheapest first), and keeps
the first with capacity. So a spot stage is planned on that *set* of zones (:class:`SpotOffer`):

* it finds no capacity only when none of the ``k`` zones tried has any: ``p_unavailable`` is ``q_k``, the fitted
  chance that none of ``k`` zones of the region has capacity (:func:`rubberband.planner.spot.p_none_of`);
* it pays zone ``i``'s price with the chance that capacity is found first there, ``q_{i-1} − q_i``
  (``q_0 = 1``), so its expected price is ``Σ_i (q_{i-1} − q_i) · price_i / (1 − q_k)``.

The fitted traces name zones (``us-east-1a``) and the catalog zone IDs (``use1-az1``); which is which differs per
account, so ``q_j`` is the mean over every set of ``j`` traced zones: any of them is as likely to be the one tried
``j``-th. Beyond the zones the traces cover, no more capacity is assumed (``q`` stays at its last value; the
price there still counts nothing). A region fitted zone by zone only (no aligned traces) gives ``q_1``, its
zones' mean unavailability, for every ``k``: later zones are taken to add no capacity (cautious).

A type without traces gets a **prior** (:func:`prior`): the cloud's fitted region entries pooled (mean rate,
mean ``q_j``, mean unavailability quantiles), flagged ``prior`` in the plan and the report; the Uniform-Progress
fall-back still guards the deadline. The catalog carries no published interruption-frequency band, so the pool is
all there is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from rubberband.catalog import InstanceType
from rubberband.planner.search import Goal, PlanSimulator
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimResult
from rubberband.planner.spot import (
    ModelScenario,
    SpotMarketModel,
    SpotOffer,
    SpotScenario,
    SpotSetup,
    ZoneModel,
    ZoneOffer,
)


def first_found(q: Sequence[float], k: int) -> tuple[list[float], float]:
    """(P(capacity found first in the ``i``-th zone tried) for ``i`` = 1..``k``, P(none of the ``k``)), from
    ``q[j - 1]`` = P(none of ``j`` zones has capacity); zones beyond ``len(q)`` add none."""
    if k < 1:
        raise ValueError("a spot request tries at least one zone")
    if not q:
        raise ValueError("first_found needs P(none of 1 zone)")
    none = [1.0] + [min(1.0, max(0.0, float(x))) for x in q]
    none = [float(x) for x in np.minimum.accumulate(none)]  # more zones never have less capacity
    at = [none[min(j, len(none) - 1)] for j in range(k + 1)]
    return [at[i - 1] - at[i] for i in range(1, k + 1)], at[k]


def _region_entry(model: SpotMarketModel, cloud: str, region: str, instance_type: str) -> ZoneModel | None:
    """The fitted entry a spot stage of (cloud, region, type) is modelled on: the region's aligned entry (with
    ``p_none_of``), else its zones' entries folded into one (mean unavailability; the best-ranked zone's rate and
    waits), else None."""
    zones = model.zones_for(cloud, region, instance_type)
    regional = [z for z in zones if len(z.p_none_of) > 1]
    if regional:
        return regional[0]
    if not zones:
        return None
    best = min(zones, key=lambda z: (z.score(), z.zone))
    mean = float(np.mean([z.p_unavailable for z in zones]))
    return replace(best, p_none_of=(mean,))


def prior(model: SpotMarketModel, cloud: str, region: str, instance_type: str) -> ZoneModel | None:
    """A prior for a type without traces, pooled over the fitted entries of other types: those of the same
    region where there are any, else the ``cloud``'s — their region entries where there are any, else their
    zones'. Pooled as the mean preemption rate, the mean ``q_j`` (each entry's extended with its last value: zones
    beyond its traces add no capacity) and the mean unavailability quantiles. None where the cloud has no fitted
    entry at all."""
    own = [z for z in model.zones if z.cloud == cloud]
    near = [z for z in own if z.region == region] or own
    pool = [z for z in near if len(z.p_none_of) > 1] or near
    if not pool:
        return None
    qs = [z.p_none_of or (z.p_unavailable,) for z in pool]
    depth = max(len(q) for q in qs)
    q = tuple(float(np.mean([x[min(j, len(x) - 1)] for x in qs])) for j in range(depth))
    types = sorted({z.instance_type for z in pool})
    where = region if pool[0].region == region and all(z.region == region for z in pool) else cloud
    return ZoneModel(
        cloud=cloud,
        instance_type=instance_type,
        region=region,
        zone=f"{region} (prior)",
        preemption_rate_per_h=float(np.mean([z.preemption_rate_per_h for z in pool])),
        p_unavailable=q[-1],
        unavailable_s=tuple(float(x) for x in np.mean([z.unavailable_s for z in pool], axis=0)),
        rate_source=f"prior: no traces of {instance_type}; pooled over {len(pool)} fitted {where} "
        f"entr{'y' if len(pool) == 1 else 'ies'} of {', '.join(types)}",
        p_none_of=q,
        prior=True,
    )


def spot_offer(model: SpotMarketModel, itype: InstanceType, *, priors: bool = True) -> SpotOffer | None:
    """How a spot stage on ``itype`` is planned: the zones it tries (:meth:`InstanceType.zones_to_try`), each at
    its own price and with the chance capacity is found first there, and the set's fitted model; a prior where
    the type has no traces (``priors``); None where it has no spot price or its cloud no fitted entry."""
    if itype.spot_price_hr is None:
        return None
    base = _region_entry(model, itype.cloud, itype.region, itype.name)
    if base is None and priors:
        base = prior(model, itype.cloud, itype.region, itype.name)
    if base is None:
        return None
    tried = itype.zones_to_try(spot=True) or (itype.region,)
    firsts, none = first_found(base.p_none_of or (base.p_unavailable,), len(tried))
    zones = tuple(ZoneOffer(z, itype.zone_price(z, spot=True), p) for z, p in zip(tried, firsts))
    return SpotOffer(replace(base, p_unavailable=none), zones)


def offer_of(model: ZoneModel, zones: Sequence[tuple[str, float, float]]) -> SpotOffer:
    """A :class:`SpotOffer` as a plan records it: the set's model and its (zone, $/h, P(first)) in order."""
    return SpotOffer(model, tuple(ZoneOffer(z, float(p), float(f)) for z, p, f in zones))


def model_setup(
    model: SpotMarketModel, setup: SpotSetup, *, seed: int, samples: int, types: Sequence[InstanceType]
) -> SpotSetup:
    """``setup`` (its deadline, policy, checkpoint interval and fall-back types) sampling ``model``: per type of
    ``types`` sold on spot its :func:`spot_offer` (a prior where it has no traces), drawn with ``seed`` over
    ``samples`` samples, in place of ``setup``'s scenarios, zones and offers."""
    scenarios: dict[tuple[str, str, str], SpotScenario] = {}
    zones: dict[tuple[str, str, str], str] = {}
    offers: dict[tuple[str, str, str], SpotOffer] = {}
    for itype in sorted(types, key=lambda t: t.key):
        offer = spot_offer(model, itype)
        if offer is None:
            continue
        key = (itype.cloud, itype.region, itype.name)
        scenarios[key] = ModelScenario(offer.model, seed=seed, samples=samples)
        zones[key] = offer.first_zone
        offers[key] = offer
    return replace(setup, scenarios=scenarios, zones=zones, offers=offers)


def why_not_spot(
    sim: PlanSimulator, configs: Sequence[StageConfig], result: SimResult, goal: Goal, setup: SpotSetup
) -> list[str | None]:
    """Per stage of a plan chosen with spot allowed (``configs``, simulated as ``result`` by ``sim``), why it is
    on-demand (None for a spot stage): its type has no spot offer in the catalog, or no spot model (no traces, no
    prior), or — that stage alone moved to spot, the rest as planned — spot misses the deadline at the confidence
    or does not cost less."""
    out: list[str | None] = []
    for i, c in enumerate(configs):
        t = c.instance_type
        if c.spot:
            out.append(None)
        elif t.spot_price_hr is None:
            out.append(f"{t.name} has no spot offer in {t.region}")
        elif not setup.allows(t.cloud, t.region, t.name):
            out.append(f"no spot model for {t.cloud} {t.name} (no traces and no prior)")
        else:
            flipped = sim.simulate([*configs[:i], c.on("spot"), *configs[i + 1 :]])
            p = flipped.p_meet(goal.deadline_s)
            if not goal.met_by(flipped):
                out.append(f"on spot P(meet) {p:.1%} < {goal.confidence:.0%}: too little slack for preemptions")
            elif goal.budget_usd is not None and flipped.cost_mean > goal.budget_usd:
                out.append(f"on spot the mean cost ${flipped.cost_mean:.2f} exceeds the budget")
            elif flipped.cost_mean >= result.cost_mean - 1e-9:
                out.append(
                    f"on spot the plan would cost ${flipped.cost_mean:.2f} mean, not less than "
                    f"${result.cost_mean:.2f} as planned"
                )
            else:
                out.append(
                    f"on spot ${flipped.cost_mean:.2f} mean (P(meet) {p:.1%}) but the search kept on-demand "
                    "(its greedy did not take this move)"
                )
    return out
