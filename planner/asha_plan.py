"""Planning ASHA (``scheduler.kind: asha``): the cheapest elastic ASHA cluster meeting the deadline, written as a
plan whose stages are ASHA's phases (:func:`plan_asha`); the fixed-cluster ASHA baseline a SHA or Hyperband plan
shows beside its own prediction (:func:`asha_info`, trials started as Ray Tune's); and an ASHA plan replayed
(:func:`replay_asha_plan`, ``rubberband simulate``). The simulation itself is :mod:`~rubberband.planner.asha`.
Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from rubberband.catalog import Catalog, InstanceType
from rubberband.errors import InfeasibleError, PlanFileError, SpecError
from rubberband.plan import (
    Alternative,
    BaselineASHA,
    CatalogInfo,
    CostBreakdown,
    Distribution,
    Plan,
    PlannerInfo,
    Prediction,
    StagePlan,
)
from rubberband.planner.asha import (
    ASHA_SAMPLES,
    AshaPhases,
    AshaResult,
    AshaSchedule,
    AshaSearch,
    AshaSettings,
    AshaSimulator,
    asha_baseline,
    elastic_asha,
    ray_tune_starts,
)
from rubberband.planner.model import fit_performance_model
from rubberband.planner.offerings import allowed_types
from rubberband.planner.plan_record import (
    distribution,
    head_info,
    head_start_s,
    heads_of,
    job_info,
    profile_sha256,
    subsample,
    survivor_info,
    variation_notes,
)
from rubberband.planner.policies import AshaPhasePolicy
from rubberband.planner.schedule import Stage, asha_stages
from rubberband.planner.search import Goal, PlanSpace
from rubberband.planner.plan_space import HeadSpec, StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import Profile
from rubberband.spec import JobSpec
from rubberband.units import format_duration, format_usd


def cluster_head_cost(billing: Simulator) -> Callable[[InstanceType, np.ndarray], np.ndarray]:
    """An ASHA cluster's head bill as ``billing`` prices it: the head a one-instance stage of the cluster's type
    gets, for each sample's JCT (the ASHA simulator's ``head_cost``)."""
    return lambda itype, jct: billing.head_cost([StageConfig(itype, 1, 1)], jct)


def asha_info(space: PlanSpace, spec: JobSpec, goal: Goal, settings: SimSettings) -> BaselineASHA | None:
    """ASHA with the job's trials (every bracket's first stage of ``space``), η and epochs on the cheapest fixed
    cluster of ``space``'s types and widths meeting ``goal`` (else the quickest one tried), in the plan's schema;
    seeded, priced (``settings.spot``: at spot) and billed a head (``settings.heads``) as the plan was."""
    sched = spec.scheduler
    usable = [t for t in space.types if space.model.plannable(t.device)]
    if not usable:
        return None
    billing = Simulator(
        space.stages, space.model, SimSettings(samples=1, seed=settings.seed, spot=settings.spot, heads=settings.heads)
    )
    sim = AshaSimulator(
        space.model,
        AshaSchedule(
            trials=sum(s.trials for s in space.stages if s.index == 0),
            eta=sched.eta,
            min_epochs=sched.min_epochs,
            max_epochs=sched.max_epochs,
        ),
        AshaSettings(
            seed=settings.seed,
            spot=settings.spot,
            head_cost=cluster_head_cost(billing),
            starts=lambda itype: ray_tune_starts(space.model, itype),  # the baseline is Ray Tune's ASHA
        ),
    )
    found = asha_baseline(sim, usable, space.max_workers, goal.deadline_s, goal.confidence)
    if found is None:
        return None
    res, meets = found
    return _baseline_asha(res, goal.deadline_s, meets, ray_tune=space.model.tune_start is not None)


def asha_prediction(
    res: AshaResult, deadline_s: float, *, head: HeadSpec | None = None, phases: bool = False
) -> Prediction:
    """Summary statistics of an ASHA simulation, in the plan's schema. ``head``: the billed head's type is listed
    in ``cost_by_instance_type`` too (as a stage plan's prediction lists it); ``phases``: with the per-phase
    figures as the stages' (``stage_duration_s``, ``stage_cost_usd``)."""
    by_type = {res.cluster.instance_type.name: float(res.cost.mean() - res.breakdown["head"].mean())}
    head_usd = float(res.breakdown["head"].mean())
    if head is not None and head_usd > 0:
        by_type[head.instance_type] = by_type.get(head.instance_type, 0.0) + head_usd
    durations: list[Distribution] = []
    costs: list[float] = []
    if phases and res.phase_durations is not None and res.phase_costs is not None:
        durations = [distribution(d) for d in res.phase_durations.T]
        costs = [float(c.mean()) for c in res.phase_costs.T]
    return Prediction(
        jct_s=distribution(res.jct),
        cost_usd=distribution(res.cost),
        p_meet_deadline=float(np.mean(res.jct <= deadline_s)),
        stage_duration_s=durations,
        stage_cost_usd=costs,
        cost_breakdown=CostBreakdown(**{f"{k}_usd": float(v.mean()) for k, v in res.breakdown.items()}),
        cost_by_instance_type=dict(sorted(by_type.items())),
        jct_samples_s=subsample(res.jct),
        cost_samples_usd=subsample(res.cost),
    )


@dataclass(frozen=True)
class AshaJob:
    """An ASHA job as :func:`~rubberband.planner.job.plan_job` resolved it: the spec, the deadline and confidence
    planned for, the seed, the samples asked for (at most :data:`~rubberband.planner.asha.ASHA_SAMPLES` are
    simulated), the billed heads and whether to record the fixed-cluster baseline as ``plan.asha`` too."""

    spec: JobSpec
    deadline_s: float
    confidence: float
    seed: int
    samples: int = ASHA_SAMPLES
    heads: Mapping[str, HeadSpec] | None = None
    baseline: bool = True

    def __post_init__(self) -> None:
        if self.spec.scheduler.kind != "asha":
            raise ValueError(f"AshaJob needs a spec with scheduler.kind asha, not {self.spec.scheduler.kind}")
        if self.spec.resources.spot:
            raise SpecError(
                "spec field 'resources.spot': scheduler.kind asha runs on on-demand instances; set "
                "resources.spot: false or use kind: sha"
            )


def plan_asha(job: AshaJob, profile: Profile, catalog: Catalog, cloud: str | None = None) -> Plan:
    """The cheapest elastic ASHA plan meeting the deadline at the confidence (:func:`~rubberband.planner.asha.
    elastic_asha`): one stage per rung, stage ``k`` holding the instances of phase ``k``
    (:class:`~rubberband.planner.policies.AshaPhasePolicy`), every stage on the same type and width. The best
    fixed ASHA cluster is ``baselines["static"]`` (its count in every stage). Raises InfeasibleError as
    :func:`~rubberband.planner.api.plan_stages` does: with the shortest JCT (the quickest fixed cluster tried)
    and its cost elastic."""
    spec, sched = job.spec, job.spec.scheduler
    if sched.trials is None:  # the spec refuses it; a JobSpec built otherwise may not
        raise ValueError("ASHA needs a number of trials")
    stages = asha_stages(sched.trials, sched.eta, sched.min_epochs, sched.max_epochs)
    model = fit_performance_model(profile)
    space = PlanSpace(stages, allowed_types(catalog, spec, cloud), model, spec.resources.max_workers_per_trial)
    samples = max(1, min(job.samples, ASHA_SAMPLES))
    billing = Simulator(stages, model, SimSettings(samples=1, seed=job.seed, heads=job.heads))
    sim = AshaSimulator(
        model,
        AshaSchedule(trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs),
        AshaSettings(
            samples=samples,
            seed=job.seed,
            head_cost=cluster_head_cost(billing),
        ),
    )
    deadline, conf = job.deadline_s, job.confidence
    found = elastic_asha(sim, space.types, spec.resources.max_workers_per_trial, deadline, conf)
    if found.elastic is None or found.fixed is None:
        raise _asha_infeasible(found, deadline, conf)
    chosen, fixed = found.elastic, found.fixed
    if spec.budget_usd is not None and chosen.cost_mean > spec.budget_usd:
        raise InfeasibleError(
            f"the cheapest plan meeting the deadline costs {format_usd(chosen.cost_mean)} (mean), above the "
            f"budget of {format_usd(spec.budget_usd)}; raise budget_usd or loosen the deadline",
            shortest_jct_s=chosen.jct_quantile(conf),
            cost_usd=chosen.cost_mean,
        )
    itype = chosen.cluster.instance_type
    head = billing.head_for([StageConfig(itype, 1, 1)])
    notes = [f"not plannable (device not in profile): {', '.join(space.skipped)}"] if space.skipped else []
    notes.append(
        "ASHA: stage k is the phase in which every trial has started and no trial trains below rung k; it "
        "holds `instances` instances, idle ones beyond that released at once, busy ones as they go idle; "
        "stage trials are SHA's expected survivors (ASHA's own vary from run to run)"
    )
    if chosen.phases == fixed.phases and chosen.cluster == fixed.cluster:
        notes.append("no phase released an instance for less: the plan is the best fixed ASHA cluster")
    return Plan(
        job=job_info(spec),
        catalog=CatalogInfo(
            clouds=sorted({t.cloud for t in space.types}),
            regions=sorted({t.region for t in space.types}),
            dates={c: d for c, d in catalog.dates.items() if any(t.cloud == c for t in space.types)},
        ),
        deadline_s=deadline,
        confidence=conf,
        budget_usd=spec.budget_usd,
        stages=asha_stage_plans(stages, chosen),
        predicted=asha_prediction(chosen, deadline, head=head, phases=True),
        timeline=sim.timeline(chosen.elastic, chosen.representative_index()),
        baselines={
            "static": Alternative(
                name="static",
                stages=asha_stage_plans(stages, fixed),
                predicted=asha_prediction(fixed, deadline, head=head, phases=True),
                timeline=sim.timeline(fixed.elastic, fixed.representative_index()),
                note="ASHA on a fixed cluster: every instance held to the end",
            )
        },
        planner=PlannerInfo(
            algorithm="asha-phase-greedy",
            candidates_evaluated=found.candidates,
            iterations=found.steps,
            samples=samples,
            seed=job.seed,
            notes=notes + variation_notes(model) + [f"instance types used: {itype.name}"],
        ),
        profile_sha256=profile_sha256(profile),
        spec=spec.model_dump(mode="json"),
        head=head_info(head),
        head_start_s=head_start_s(model, itype),
        asha=_baseline_asha(fixed, deadline, True) if job.baseline else None,
        survivors=survivor_info(model),
        brackets="sequential",
    )


def _asha_infeasible(found: AshaSearch, deadline_s: float, confidence: float) -> InfeasibleError:
    """No ASHA cluster meets the deadline: the error names the quickest one tried (its JCT at the confidence, and
    its cost run elastically), as :func:`~rubberband.planner.api.plan_stages` names the quickest plan."""
    quickest = found.quickest_elastic or found.quickest
    if quickest is None:
        return InfeasibleError(f"no ASHA cluster could be simulated for a deadline of {format_duration(deadline_s)}")
    shortest = quickest.jct_quantile(confidence)
    c = quickest.cluster
    return InfeasibleError(
        f"no plan meets the deadline of {format_duration(deadline_s)} with {confidence:.0%} confidence; the "
        f"shortest feasible JCT is {format_duration(shortest)} ({shortest:.0f} s at p{confidence * 100:.0f}, ASHA "
        f"starting on {c.instances} × {c.instance_type.name}) costing {format_usd(quickest.cost_mean)}; set the "
        f"deadline to at least {shortest:.0f} s or lower the confidence",
        shortest_jct_s=shortest,
        cost_usd=quickest.cost_mean,
    )


def asha_stage_plans(stages: Sequence[Stage], res: AshaResult) -> list[StagePlan]:
    """An ASHA cluster as the plan's stages: one per rung (``stages``: :func:`~rubberband.planner.schedule.
    asha_stages`), stage ``k`` with phase ``k``'s instances, its median duration and its mean attributed cost."""
    c = res.cluster
    itype = c.instance_type
    counts = res.phases or (c.instances,) * len(stages)
    if len(counts) != len(stages):
        raise ValueError(f"{len(stages)} rungs but {len(counts)} phase counts")
    out = []
    for k, (st, count) in enumerate(zip(stages, counts)):
        out.append(
            StagePlan(
                bracket=0,
                stage=st.index,
                trials=st.trials,
                epochs=st.epochs,
                epochs_this_stage=st.epochs_this_stage,
                cloud=itype.cloud,
                region=itype.region,
                instance_type=itype.name,
                instances=count,
                workers_per_trial=c.workers,
                spot=False,
                predicted_duration_s=None
                if res.phase_durations is None
                else float(np.quantile(res.phase_durations[:, k], 0.5)),
                predicted_cost_usd=None if res.phase_costs is None else float(res.phase_costs[:, k].mean()),
            )
        )
    return out


def _baseline_asha(res: AshaResult, deadline_s: float, meets: bool, *, ray_tune: bool = False) -> BaselineASHA:
    """A fixed ASHA cluster in the plan's schema (``plan.asha``); ``ray_tune``: its trials started as Ray Tune's."""
    c = res.cluster
    return BaselineASHA(
        instance_type=c.instance_type.name,
        cloud=c.instance_type.cloud,
        instances=c.instances,
        workers_per_trial=c.workers,
        predicted=asha_prediction(res, deadline_s),
        meets_deadline=meets,
        trial_starts="ray_tune" if ray_tune else "warm_workers",
    )


def asha_phase_policy(plan: Plan) -> AshaPhasePolicy:
    """The phase rule an ASHA plan is run by: ``instances[k]`` = ``plan.stages[k].instances`` (the executor's
    ASHA scheduler holds that many instances in phase ``k``, as the plan's simulation did)."""
    if not plan.is_asha:
        raise PlanFileError(f"the plan runs {plan.job.scheduler}, not ASHA: it has stages, not ASHA phases")
    return AshaPhasePolicy(plan.phase_instances)


def replay_asha_plan(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = ASHA_SAMPLES, seed: int | None = None
) -> AshaResult:
    """The Monte Carlo distributions of an ASHA plan under the elastic ASHA simulator: its job, type, width and
    phase counts, its billed head (``rubberband simulate``). The stages must share one type and width, as
    :func:`plan_asha` writes them."""
    policy = asha_phase_policy(plan)
    job = plan.job
    if job.trials is None:
        raise PlanFileError("the ASHA plan names no trials; regenerate it with `rubberband plan`")
    shapes = {(s.cloud, s.region, s.instance_type, s.workers_per_trial) for s in plan.stages}
    if len(shapes) != 1:
        raise PlanFileError("an ASHA plan's stages must share one instance type and width; regenerate it")
    cloud, region, name, workers = shapes.pop()
    itype = catalog.find(name, cloud=cloud, region=region)
    model = fit_performance_model(profile)
    model.require(itype.device)
    stages = asha_stages(job.trials, job.eta, job.min_epochs, job.max_epochs)
    billing = Simulator(stages, model, SimSettings(samples=1, heads=heads_of(plan)))
    sim = AshaSimulator(
        model,
        AshaSchedule(trials=job.trials, eta=job.eta, min_epochs=job.min_epochs, max_epochs=job.max_epochs),
        AshaSettings(
            samples=samples,
            seed=plan.planner.seed if seed is None else seed,
            head_cost=cluster_head_cost(billing),
        ),
    )
    return sim.simulate(AshaPhases(itype, policy.instances, workers))
