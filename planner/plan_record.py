"""What a plan file records beside its stages, in the plan's schema (:mod:`rubberband.plan`): a simulation's
summary, the job, the billed head, the survivor model and what the prediction assumes. Shared by the two planners
that write plans (:mod:`~rubberband.planner.api` for SHA and Hyperband, :mod:`~rubberband.planner.asha_plan` for
ASHA) and by the replays that read them back (:func:`heads_of`, :func:`configs_of`). Pure."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from rubberband.catalog import Catalog, InstanceType
from rubberband.plan import CostBreakdown, Distribution, HeadInfo, JobInfo, Plan, Prediction, SurvivorInfo
from rubberband.planner.model import PerformanceModel
from rubberband.planner.schedule import Stage
from rubberband.planner.plan_space import HeadSpec, StageConfig
from rubberband.planner.simulator import SimResult
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
