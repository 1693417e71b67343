"""Plan a whole SHA or Hyperband job: (spec, profile, catalog) → :class:`rubberband.plan.Plan`.

:func:`plan_job` builds the plan space, the goal and the simulation settings from the spec (spot allowed per
stage with a :class:`SpotMarket`), searches with :func:`~rubberband.planner.api.plan_stages`, simulates the ASHA
baseline beside the search, and records the chosen plan with its baselines. ASHA jobs go to
:func:`~rubberband.planner.asha_plan.plan_asha`. On spot stages, where a checkpoint save takes time, a longer
checkpoint interval is tried (:func:`checkpoint_interval`). Pure: the caller times the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from rubberband.catalog import Catalog
from rubberband.plan import Alternative, CatalogInfo, Plan, PlannerInfo, SpotInfo, SpotZoneInfo, TriedZone
from rubberband.planner.api import DEFAULT_SAMPLES, SearchOptions, StagesPlan, plan_stages
from rubberband.planner.asha_plan import AshaJob, asha_info, plan_asha
from rubberband.planner.beside import Beside, in_turn
from rubberband.planner.brackets import BracketSetup, ParallelSimulator
from rubberband.planner.model import fit_performance_model
from rubberband.planner.offerings import allowed_types, region_twins_merged
from rubberband.planner.plan_record import (
    handoff_records,
    head_info,
    head_start_s,
    job_info,
    prediction,
    profile_sha256,
    stage_plans,
    survivor_info,
    variation_notes,
)
from rubberband.planner.plan_space import HeadSpec, StageConfig
from rubberband.planner.policies import SpotPolicy
from rubberband.planner.schedule import stages_for
from rubberband.planner.search import Goal, PlanSimulator, PlanSpace
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.planner.spot import SpotMarketModel, SpotSetup, ZoneModel, cheapest_fallbacks
from rubberband.planner.spotzones import model_setup, why_not_spot
from rubberband.profile import Profile
from rubberband.spec import JobSpec


@dataclass(frozen=True)
class SpotMarket:
    """The spot market a ``resources.spot: true`` spec is planned with: the fitted ``model`` of preemptions and
    unavailability, its name in ``plan.spot`` (``source``) and the fall-back ``policy`` (None: SpotPolicy with
    the spec's ``resources.spot_margin_s``)."""

    model: SpotMarketModel
    source: str = ""
    policy: SpotPolicy | None = None


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`plan_job` plans a job, beyond its spec, profile and catalog.

    Overrides of the spec (None: the spec's): ``deadline_s``, ``confidence``, ``seed``, ``cloud`` (aws, gcp,
    local or ``any``) and ``brackets`` (``parallel`` | ``sequential``: its ``scheduler.brackets``).
    ``samples``: Monte Carlo samples per candidate. ``include_exact``: also search the whole plan space exactly
    (``baselines["exact"]``); ``asha``: also simulate ASHA on the cheapest fixed cluster meeting the deadline
    (``plan.asha``). ``heads`` (cloud → :class:`HeadSpec`): the run's billed head instance per cloud, chosen by
    the caller for head mode on AWS/GCP; the plan's first stage's cloud picks one, and every prediction (the
    chosen plan's and the baselines') includes it; None or no entry for the cloud: no head is billed (local runs,
    ``--head local``). ``spot``: with ``resources.spot: true``, spot is allowed per stage and simulated with this
    market's preemptions and unavailability (:class:`SpotMarket`); None keeps the old reading of ``spot: true``
    (every stage at spot prices, never preempted). ``beside``: runs a part of planning that does not depend on
    the search (the ASHA baseline) beside it (:class:`Beside`); the default runs it in turn, in this process."""

    deadline_s: float | None = None
    confidence: float | None = None
    cloud: str | None = None
    samples: int = DEFAULT_SAMPLES
    seed: int | None = None
    include_exact: bool = False
    heads: Mapping[str, HeadSpec] | None = None
    brackets: str | None = None
    asha: bool = True
    spot: SpotMarket | None = None
    beside: Beside = in_turn


def plan_job(spec: JobSpec, profile: Profile, catalog: Catalog, options: PlanOptions | None = None) -> Plan:
    """Plan a whole job: the cheapest elastic plan meeting the deadline, with baselines (``options``:
    :class:`PlanOptions`).

    ``scheduler.kind: asha`` is planned by :func:`~rubberband.planner.asha_plan.plan_asha` (an elastic ASHA
    cluster, its stages the rungs; ``samples`` capped at :data:`~rubberband.planner.asha.ASHA_SAMPLES`);
    ``include_exact``, ``brackets`` and ``spot`` do not apply to it.
    """
    options = options or PlanOptions()
    deadline = float(options.deadline_s if options.deadline_s is not None else spec.deadline_s)
    conf = float(options.confidence if options.confidence is not None else spec.confidence)
    seed = int(options.seed if options.seed is not None else spec.seed)
    sched = spec.scheduler
    if sched.kind == "asha":  # one elastic cluster shrinking by phase of the rung ladder, not stages
        job = AshaJob(spec, deadline, conf, seed, samples=options.samples, heads=options.heads, baseline=options.asha)
        return plan_asha(job, profile, catalog, options.cloud)
    stages = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    market = options.spot if spec.resources.spot else None  # spot per stage, with this market's model
    types = allowed_types(catalog, spec, options.cloud, spot_required=False if market is not None else None)
    model = fit_performance_model(profile)
    settings = SimSettings(
        samples=options.samples, seed=seed, spot=spec.resources.spot and market is None, heads=options.heads
    )
    if market is not None:
        policy = market.policy or SpotPolicy(margin_s=spec.resources.spot_margin_s)
        fallbacks = cheapest_fallbacks(
            types, lambda t: model.epoch_time(t.device, 1, 1) if model.plannable(t.device) else None
        )
        setup = model_setup(
            market.model,
            SpotSetup(deadline_s=deadline, scenarios={}, policy=policy, fallbacks=fallbacks),
            seed=seed,
            samples=options.samples,
            types=[t for t in types if t.spot_price_hr is not None],
        )
        settings = replace(settings, spot_setup=setup)
    on_demand = market is None and not settings.spot
    space = PlanSpace(
        stages, region_twins_merged(types) if on_demand else types, model, spec.resources.max_workers_per_trial
    )
    goal = Goal(deadline, conf, spec.budget_usd)
    brackets = BracketSetup() if (options.brackets or sched.brackets) == "parallel" else None
    search = SearchOptions(brackets=brackets, include_exact=options.include_exact)
    # the ASHA baseline reads the seed, the spot pricing and the heads, none of which the search changes
    asha_pending = options.beside(lambda: asha_info(space, spec, goal, settings)) if options.asha else None
    try:
        out = plan_stages(space, goal, settings, search)
        if settings.spot_setup is not None:
            out, settings = _sparser_checkpoints(space, goal, settings, search, out)
        asha_out = asha_pending.result() if asha_pending is not None else None
    finally:
        if asha_pending is not None:
            asha_pending.cancel()  # nothing once its result is in
    market_only = SimSettings(spot=settings.spot)  # the baselines' stages: on-demand, or all at spot prices
    baselines = {}
    if out.static is not None:
        plan_s, res_s, tl_s = out.static
        baselines["static"] = Alternative(
            name="static",
            stages=stage_plans(stages, plan_s, res_s, settings=market_only),
            predicted=prediction(res_s, deadline),
            timeline=tl_s,
        )
    if out.exact is not None:
        plan_e, res_e, tl_e = out.exact
        baselines["exact"] = Alternative(
            name="exact",
            stages=stage_plans(stages, plan_e, res_e, settings=market_only),
            predicted=prediction(res_e, deadline),
            timeline=tl_e,
            note=out.exact_note,
        )
    used = {c.instance_type for c in out.configs}
    why_not = None
    if market is not None and settings.spot_setup is not None and out.result is not None:
        sim: PlanSimulator = (
            ParallelSimulator(stages, model, settings, BracketSetup(offsets=out.offsets or None))
            if out.brackets == "parallel"
            else Simulator(stages, model, settings)
        )
        why_not = why_not_spot(sim, out.configs, out.result, goal, settings.spot_setup)
    return Plan(
        job=job_info(spec),
        catalog=CatalogInfo(
            clouds=sorted({t.cloud for t in types}),
            regions=sorted({t.region for t in types}),
            dates={c: d for c, d in catalog.dates.items() if any(t.cloud == c for t in types)},
        ),
        deadline_s=deadline,
        confidence=conf,
        budget_usd=spec.budget_usd,
        stages=[
            s if why_not is None else s.model_copy(update={"why_not_spot": why_not[i]})
            for i, s in enumerate(stage_plans(stages, out.configs, out.result, model, settings))
        ],
        predicted=prediction(out.result, deadline),
        timeline=out.timeline,
        baselines=baselines,
        planner=PlannerInfo(
            candidates_evaluated=out.candidates_evaluated,
            iterations=out.iterations,
            samples=options.samples,
            seed=seed,
            notes=out.notes
            + variation_notes(model)
            + [f"instance types used: {', '.join(sorted(t.name for t in used))}"],
        ),
        profile_sha256=profile_sha256(profile),
        spec=spec.model_dump(mode="json"),
        head=head_info(out.head),
        head_start_s=head_start_s(model, out.configs[0].instance_type),
        asha=asha_out,
        survivors=survivor_info(model),
        brackets=out.brackets,
        bracket_offsets_s=[round(o, 3) for o in out.offsets],
        handoffs=handoff_records(out.handoffs),
        spot=None
        if settings.spot_setup is None or market is None
        else spot_info(settings.spot_setup, market.source or "spot model"),
    )


def _sparser_checkpoints(
    space: PlanSpace, goal: Goal, settings: SimSettings, search: SearchOptions, out: StagesPlan
) -> tuple[StagesPlan, SimSettings]:
    """Where a checkpoint save takes time, a longer interval on spot stages may pay: the job planned again with the
    interval at which ``out``'s stages cost least (:func:`checkpoint_interval`), taken (with its settings) when it
    meets the goal for less; else ``out`` and ``settings``."""
    setup = settings.spot_setup
    if setup is None or out.result is None:
        return out, settings
    every = checkpoint_interval(Simulator(space.stages, space.model, settings), out.configs, goal)
    if every == setup.checkpoint_epochs:
        return out, settings
    sparser = replace(settings, spot_setup=replace(setup, checkpoint_epochs=every))
    again = plan_stages(space, goal, sparser, search)
    if again.result is not None and goal.met_by(again.result) and again.result.cost_mean < out.result.cost_mean - 1e-12:
        return again, sparser
    return out, settings


#: Checkpoint intervals (epochs) tried for a plan with spot stages whose checkpoint save takes time.
CHECKPOINT_INTERVALS = (1, 2, 3, 5, 10)
#: A longer interval is taken only when it makes the plan at least this much cheaper (else planning again
#: for it costs more time than it can save money).
CHECKPOINT_GAIN = 0.01


def checkpoint_interval(sim: Simulator, configs: Sequence[StageConfig], goal: Goal) -> int:
    """The checkpoint interval on spot stages (:data:`CHECKPOINT_INTERVALS`) at which ``configs``, played one stage
    after another by ``sim`` (its job and settings, its spot setup's interval varied), cost least while meeting
    ``goal``: each save skipped saves its time (``model.checkpoint_save_s``), each epoch between saves is work a
    preemption loses. 1 where saves take no time, ``sim`` has no spot setup or no stage is on spot, or where no
    interval meets the deadline, or none saves :data:`CHECKPOINT_GAIN`."""
    setup = sim.spot_setup
    if setup is None or sim.model.checkpoint_save_s <= 0 or not any(c.spot for c in configs):
        return 1
    best, best_cost, every_epoch = 1, math.inf, math.inf
    for every in CHECKPOINT_INTERVALS:
        trial = Simulator(
            sim.stages, sim.model, replace(sim.settings, spot_setup=replace(setup, checkpoint_epochs=every))
        )
        result = trial.simulate(configs)
        if every == 1:
            every_epoch = result.cost_mean
        if goal.met_by(result) and result.cost_mean < best_cost - 1e-12:
            best, best_cost = every, result.cost_mean
    return best if best_cost < every_epoch * (1 - CHECKPOINT_GAIN) else 1


def spot_info(setup: SpotSetup, source: str) -> SpotInfo:
    """The plan's record of the spot model and policy its predictions include, and per type the zones tried."""
    zones = []
    for key in sorted(setup.scenarios):
        offer = setup.offers.get(key)
        z: ZoneModel | None = offer.model if offer is not None else getattr(setup.scenarios[key], "zone", None)
        if z is not None:
            zones.append(
                SpotZoneInfo(
                    cloud=z.cloud,
                    instance_type=z.instance_type,
                    region=z.region,
                    zone=z.zone,
                    preemption_rate_per_h=z.preemption_rate_per_h,
                    p_unavailable=z.p_unavailable,
                    unavailable_s=list(z.unavailable_s),
                    rate_source=z.rate_source,
                    tried=[]
                    if offer is None
                    else [
                        TriedZone(zone=o.zone, price_hr=o.price_hr, p_first=round(o.p_first, 6)) for o in offer.zones
                    ],
                    price_hr=None if offer is None else round(offer.price_hr, 6),
                    prior=z.prior,
                )
            )
    return SpotInfo(
        model_source=source, zones=zones, margin_s=setup.policy.margin_s, checkpoint_epochs=setup.checkpoint_epochs
    )
