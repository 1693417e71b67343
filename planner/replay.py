"""Replay an existing plan: its simulator rebuilt as it was planned (or as a :class:`Replay` changes it: seed,
deadline, spot scenarios, fall-back policy), its distributions (:func:`replay_plan`) and a copy of it with new
predictions (:func:`simulate_plan`, e.g. after a new profile). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rubberband.catalog import Catalog
from rubberband.errors import PlanFileError
from rubberband.plan import Plan
from rubberband.planner.api import DEFAULT_SAMPLES, timeline_of
from rubberband.planner.brackets import BracketSetup, ParallelSimulator
from rubberband.planner.model import PerformanceModel, fit_performance_model
from rubberband.planner.plan_record import configs_of, handoff_records, heads_of, prediction, stage_plans
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.policies import SpotPolicy
from rubberband.planner.schedule import Stage
from rubberband.planner.search import PlanSimulator
from rubberband.planner.simulator import SimResult, SimSettings, Simulator
from rubberband.planner.spot import ModelScenario, SpotScenario, SpotSetup, ZoneModel
from rubberband.planner.spotzones import offer_of
from rubberband.profile import Profile


def plan_spot_setup(
    plan: Plan, replay: Replay | None = None, *, samples: int = DEFAULT_SAMPLES, catalog: Catalog | None = None
) -> SpotSetup | None:
    """The spot setup a plan was made with (its own fitted zones, sampled ``samples`` times), or as ``replay``
    changes it: its seed and deadline, its ``spot_scenarios`` (e.g. trace replays) in place of the zones and
    another fall-back ``spot_policy``; None for a plan without a spot model. ``catalog`` resolves the stages'
    fall-back types (without it, every trial falls back to its own type)."""
    info = plan.spot
    if info is None:
        return None
    replay = replay or Replay()
    seed = replay.seed_for(plan)
    policy = replay.spot_policy or SpotPolicy(margin_s=info.margin_s)
    scenarios = replay.spot_scenarios
    offers = {}
    zones = {}
    fitted: dict[tuple[str, str, str], SpotScenario] = {}
    for z in info.zones:
        zone = ZoneModel(
            cloud=z.cloud,
            instance_type=z.instance_type,
            region=z.region,
            zone=z.zone,
            preemption_rate_per_h=z.preemption_rate_per_h,
            p_unavailable=z.p_unavailable,
            unavailable_s=tuple(z.unavailable_s),
            rate_source=z.rate_source,
            prior=z.prior,
        )
        fitted[zone.key] = ModelScenario(zone, seed=seed, samples=samples)
        zones[zone.key] = z.tried[0].zone if z.tried else z.zone
        if z.tried:  # priced at the zones tried (a v3 plan without them: at the catalog's spot price)
            offers[zone.key] = offer_of(zone, [(t.zone, t.price_hr, t.p_first) for t in z.tried])
    if scenarios is None:
        scenarios = fitted
    fallbacks = {}
    for sp in plan.stages:
        if sp.spot and sp.fallback_instance_type and catalog is not None:
            own = catalog.find(sp.instance_type, cloud=sp.cloud, region=sp.region)
            fallbacks[own.key] = catalog.find(sp.fallback_instance_type, cloud=sp.cloud, region=sp.region)
    return SpotSetup(
        deadline_s=replay.deadline_for(plan),
        scenarios=dict(scenarios),
        policy=policy,
        checkpoint_epochs=info.checkpoint_epochs,
        zones=zones,
        fallbacks=fallbacks,
        offers=offers,
    )


@dataclass(frozen=True)
class Replay:
    """What a replay of an existing plan changes about how it was planned (None: as planned): the ``seed`` of its
    random streams, the ``deadline_s`` its spot fall-back decisions aim at (and its P(meet) is read against),
    ``spot_scenarios`` in place of its own spot model for its spot stages (e.g. trace replays, ``rubberband
    simulate --preemption-traces``) and the fall-back ``spot_policy`` (anything with SpotPolicy's ``decide``:
    baselines)."""

    seed: int | None = None
    deadline_s: float | None = None
    spot_scenarios: Mapping[tuple[str, str, str], SpotScenario] | None = None
    spot_policy: SpotPolicy | None = None

    def seed_for(self, plan: Plan) -> int:
        return plan.planner.seed if self.seed is None else self.seed

    def deadline_for(self, plan: Plan) -> float:
        return plan.deadline_s if self.deadline_s is None else self.deadline_s


def plan_simulator(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> tuple[PlanSimulator, list[Stage], tuple[StageConfig, ...], PerformanceModel]:
    """(simulator, stages, configs, model) that replay an existing plan as it was planned (``samples`` samples),
    or as ``replay`` changes it."""
    if not plan.stages:
        raise PlanFileError("the plan has no stages; regenerate it with `rubberband plan`")
    if plan.is_asha:
        raise PlanFileError(
            "an ASHA plan's stages are phases of one ASHA run, not SHA stages: replay it with replay_asha_plan"
        )
    replay = replay or Replay()
    stages, configs = configs_of(plan, catalog)
    model = fit_performance_model(profile)
    for c in configs:
        model.require(c.instance_type.device)
    setup = plan_spot_setup(plan, replay, samples=samples, catalog=catalog)
    settings = SimSettings(
        samples=samples,
        seed=replay.seed_for(plan),
        spot=setup is None and any(s.spot for s in plan.stages),
        heads=heads_of(plan),
        spot_setup=setup,
    )
    sim: PlanSimulator
    if plan.parallel_brackets:
        sim = ParallelSimulator(stages, model, settings, BracketSetup(offsets=plan.bracket_offsets_s or None))
    else:
        sim = Simulator(stages, model, settings)
    return sim, stages, configs, model


def replay_plan(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> SimResult:
    """The Monte Carlo distributions of an existing plan (``samples``, ``replay``: :func:`plan_simulator`'s)."""
    sim, _, configs, _ = plan_simulator(plan, profile, catalog, samples=samples, replay=replay)
    return sim.simulate(configs)


def simulate_plan(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> Plan:
    """Re-simulate an existing plan (e.g. with a new profile; ``samples``, ``replay``: :func:`plan_simulator`'s);
    returns a copy with new predictions (against ``replay``'s deadline, if it sets one)."""
    replay = replay or Replay()
    deadline = replay.deadline_for(plan)
    sim, stages, configs, model = plan_simulator(plan, profile, catalog, samples=samples, replay=replay)
    result = sim.simulate(configs)
    update = {
        "stages": stage_plans(stages, configs, result, model, sim.settings),
        "predicted": prediction(result, deadline),
        "timeline": timeline_of(sim, configs, result),
        "deadline_s": deadline,
    }
    if plan.parallel_brackets and isinstance(sim, ParallelSimulator):
        update["handoffs"] = handoff_records(sim.last_handoffs)
    return plan.model_copy(update=update)
