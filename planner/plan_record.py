"""What a plan file records beside its stages, in the plan's schema (:mod:`rubberband.plan`): a simulation's
summary, the stages as simulated, the job, the billed head, the survivor model, the brackets' hand-overs and what
the prediction assumes. Shared by the two planners
that write plans (:mod:`~rubberband.planner.job` for SHA and Hyperband, :mod:`~rubberband.planner.asha_plan` for
ASHA) and by the replays that read them back (:func:`heads_of`, :func:`configs_of`). Pure."""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np

from rubberband.catalog import Catalog, InstanceType
from rubberband.plan import (
    CostBreakdown,
    Distribution,
    Handoff,
    HeadInfo,
    JobInfo,
    Plan,
    Prediction,
    StagePlan,
    SurvivorInfo,
)
from rubberband.planner.brackets import Handoff as BracketHandoff
from rubberband.planner.model import PerformanceModel
from rubberband.planner.schedule import Stage
from rubberband.planner.plan_space import HeadSpec, StageConfig, normalise
from rubberband.planner.simulator import SimResult, SimSettings, Simulator
from rubberband.profile import Profile
from rubberband.spec import JobSpec

#: Simulated samples kept in a plan (for histograms in reports); the rest only feed the summaries.
SAMPLES_KEPT = 300


def distribution(values: np.ndarray) -> Distribution:
    """Samples' mean, median and 95th percentile, in the plan's schema."""
    return Distribution(
        mean=float(values.mean()), p50=float(np.quantile(values, 0.5)), p95=float(np.quantile(values, 0.95))
    )


def prediction(result: SimResult, deadline_s: float) -> Prediction:
    """Summary statistics of a simulation, in the plan's schema."""
    return Prediction(
        jct_s=distribution(result.jct),
        cost_usd=distribution(result.cost),
        p_meet_deadline=result.p_meet(deadline_s),
        stage_duration_s=[distribution(d) for d in result.stage_durations],
        stage_cost_usd=[float(c.mean()) for c in result.stage_costs],
        cost_breakdown=CostBreakdown(**{f"{k}_usd": float(v.mean()) for k, v in result.breakdown.items()}),
        cost_by_instance_type={k: float(np.mean(v)) for k, v in sorted(result.by_type.items())},
        jct_samples_s=subsample(result.jct),
        cost_samples_usd=subsample(result.cost),
    )


def subsample(values: np.ndarray, at_most: int = SAMPLES_KEPT) -> list[float]:
    """The first ``at_most`` Monte Carlo samples (already i.i.d.), paired across JCT and cost, for histograms."""
    return [round(float(v), 6) for v in values[:at_most]]


def profile_sha256(profile: Profile) -> str:
    return hashlib.sha256(profile.model_dump_json(exclude={"fitted"}).encode()).hexdigest()


def head_start_s(model: PerformanceModel, first: InstanceType) -> float:
    """The plan's ``head_start_s``: the head's wait its predictions count, for its first stage's type."""
    return round(model.head_wait_s(first.cloud, first.name), 3)


def job_info(spec: JobSpec) -> JobInfo:
    """What a plan records of the job it was made for (the spec's name, hash, schedule and metric)."""
    sched = spec.scheduler
    return JobInfo(
        name=spec.name,
        spec_sha256=spec.sha256(),
        scheduler=sched.kind,
        eta=sched.eta,
        min_epochs=sched.min_epochs,
        max_epochs=sched.max_epochs,
        trials=sched.trials,
        metric=spec.metric.name,
        mode=spec.metric.mode,
    )


#: A population mean known no better than this (log standard error: ±10 % in speed) is noted in the plan.
MEAN_SE_NOTE = 0.1


def variation_notes(model: PerformanceModel) -> list[str]:
    """What the prediction assumes about per-epoch noise and configuration speed, when not measured."""
    v = model.variation
    if v.configs == 0:
        return [
            "the profile has no whole-epoch times of sampled configurations (schema v1 or --configs 0): "
            "P(meet deadline) assumes no per-epoch noise and every configuration as fast as the profiled one; "
            "re-run `rubberband profile` to measure them"
        ]
    if v.configs == 1:
        return [
            "the profile timed one configuration: P(meet deadline) assumes every configuration as fast as it; "
            "profile with a larger --budget to measure their spread"
        ]
    if v.config_mean_se >= MEAN_SE_NOTE:
        return [
            f"the profile's {v.configs} configurations know how fast the search space's configurations are only to "
            f"±{math.expm1(v.config_mean_se):.0%} (their spread over √{v.configs}), the same for every trial of the "
            "run: the prediction is that much wider; fold finished runs in (`rubberband profile --from-run RUN_DIR` "
            "adds each one's first stage as configurations) or profile more of them (--configs)"
        ]
    return []


def survivor_info(model: PerformanceModel) -> SurvivorInfo | None:
    """The plan's record of who survives a promotion (None: configurations as fast as each other)."""
    v = model.variation
    if v.config_sigma <= 0:
        return None
    return SurvivorInfo(
        basis="bound" if v.speed_quality_bound else "fitted",
        rho=round(max(-1.0, min(1.0, v.speed_quality_rho)), 6),
        rank_correlation=None if v.speed_quality_fit is None else round(v.speed_quality_fit, 6),
        note=v.speed_quality_source,
    )


def head_info(head: HeadSpec | None) -> HeadInfo | None:
    """The plan's record of a (resolved) billed head."""
    if head is None:
        return None
    return HeadInfo(
        cloud=head.cloud,
        instance_type=head.instance_type,
        price_hr=head.price_hr,
        boot_s=float(head.boot_s or 0.0),
        grace_s=head.grace_s,
    )


def heads_of(plan: Plan) -> dict[str, HeadSpec]:
    """The billed head a plan's predictions include, as the simulator takes it (empty: none)."""
    h = plan.head
    if h is None:
        return {}
    return {
        h.cloud: HeadSpec(
            cloud=h.cloud, instance_type=h.instance_type, price_hr=h.price_hr, grace_s=h.grace_s, boot_s=h.boot_s
        )
    }


def configs_of(plan: Plan, catalog: Catalog) -> tuple[list[Stage], tuple[StageConfig, ...]]:
    """The schedule stages and stage configurations of an existing plan (a stage's market is spot when
    the plan has a spot model and the stage says ``spot``; a v2 plan's spot stages are priced at spot)."""
    stages, configs = [], []
    for sp in plan.stages:
        itype = catalog.find(sp.instance_type, cloud=sp.cloud, region=sp.region)
        stages.append(Stage(sp.bracket, sp.stage, sp.trials, sp.epochs, sp.epochs_this_stage))
        market = "spot" if sp.spot and plan.spot is not None else "on_demand"
        configs.append(StageConfig(itype, sp.instances, sp.workers_per_trial, market))
    return stages, tuple(configs)


def stage_plans(
    stages: Sequence[Stage],
    configs: Sequence[StageConfig],
    result: SimResult | None = None,
    model: PerformanceModel | None = None,
    settings: SimSettings | None = None,
) -> list[StagePlan]:
    """The plan's stages, as simulated with ``settings`` (its ``spot``: every stage bought at spot, the old
    reading of ``resources.spot``; its ``spot_setup``: spot per stage) with ``result``'s predictions.

    With ``model``, each says its median task time (``predicted_task_s``), from which the executor times the next
    stage's prefetch before a trial has finished, as the simulator does. With a spot setup too, a spot stage says
    its zone (the first its requests try), its zone-weighted spot price, whether its spot model is a prior, and
    its trials' fall-back type (and how much slower it is)."""
    out = []
    tasks: list[float | None] = [None] * len(configs)
    spot = settings is not None and settings.spot
    spot_setup = None if settings is None else settings.spot_setup
    sim = None
    if model is not None:
        sim = Simulator(stages, model, SimSettings(samples=1, spot_setup=spot_setup))
        normal = [normalise(c, s.trials) for c, s in zip(configs, stages)]
        tasks = [sum(sim.task_time(i, c, normal[i - 1] if i else None)) for i, c in enumerate(normal)]
    zones = {} if spot_setup is None else spot_setup.zones
    offers = {} if spot_setup is None else spot_setup.offers
    for i, (st, c) in enumerate(zip(stages, configs)):
        moved_to = None if spot_setup is None or not c.spot else spot_setup.fallback(c.instance_type)
        if moved_to is not None and moved_to.key == c.instance_type.key:
            moved_to = None
        offer = offers.get((c.instance_type.cloud, c.instance_type.region, c.instance_type.name)) if c.spot else None
        out.append(
            StagePlan(
                bracket=st.bracket,
                stage=st.index,
                trials=st.trials,
                epochs=st.epochs,
                epochs_this_stage=st.epochs_this_stage,
                cloud=c.instance_type.cloud,
                region=c.instance_type.region,
                instance_type=c.instance_type.name,
                instances=c.instances,
                workers_per_trial=c.workers,
                spot=spot or c.spot,
                zone=zones.get((c.instance_type.cloud, c.instance_type.region, c.instance_type.name))
                if c.spot
                else None,
                spot_price_hr=None if offer is None else round(offer.price_hr, 6),
                spot_prior=offer is not None and offer.prior,
                fallback_instance_type=None if moved_to is None else moved_to.name,
                fallback_slowdown=None
                if moved_to is None or sim is None
                else round(sim.spots.fallback_slowdown(normalise(c, st.trials)), 6),
                predicted_duration_s=None if result is None else float(np.quantile(result.stage_durations[i], 0.5)),
                predicted_cost_usd=None if result is None else float(result.stage_costs[i].mean()),
                predicted_task_s=tasks[i],
            )
        )
    return out


def handoff_records(handoffs: Sequence[BracketHandoff]) -> list[Handoff]:
    """Parallel brackets' hand-overs of the representative sample (instances one bracket releases and another
    takes), in the plan's schema."""
    return [
        Handoff(
            instance_type=h.instance_type,
            from_stage=h.from_stage,
            to_stage=h.to_stage,
            at_s=round(h.at_s, 3),
            instance_id=h.instance_id,
        )
        for h in handoffs
    ]
