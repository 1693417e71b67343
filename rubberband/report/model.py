"""ReportData: every number a report shows, computed once from a plan (and its re-plans).

The HTML and Markdown writers and the charts only format and draw what is here, so the two
documents always agree and tests can check the figures against the plan JSON in one place.
Re-planning (the cost-vs-deadline sweep and the cloud comparison) happens here too, through
an injected :data:`~rubberband.report.replan.Replanner`; without one those sections carry a
note saying why they are missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rubberband.clouds import cloud as cloud_facts
from rubberband.clouds import rented_clouds
from rubberband.errors import InfeasibleError, RubberbandError
from rubberband.plan import Alternative, Plan, SpotZoneInfo, StagePlan, Timeline
from rubberband.report import fmt
from rubberband.report.replan import ReplanRequest, Replanner
from rubberband.report.progress import ProgressPoint
from rubberband.report.source import ActualOutcome, ReportSource, TrackingLink

# Colour-blind-friendly, distinct at a glance; stage i always gets STAGE_COLORS[i % len].
STAGE_COLORS = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#EECA3B",
    "#9D755D",
    "#FF9DA6",
    "#79706E",
    "#1F77B4",
    "#BCBD22",
)
OVERHEAD_COLORS = {
    "training": "#54A24B",
    "startup": "#F58518",
    "idle": "#BAB0AC",
    "billing minimum": "#E45756",
    "data transfer": "#B279A2",
    "head instance": "#72B7B2",
}
PLAN_COLOR = "#4C78A8"
STATIC_COLOR = "#E45756"
ACTUAL_COLOR = "#111111"

PARETO_POINTS = 8  # deadlines in the sweep, from the shortest feasible to PARETO_SPAN times it
PARETO_SPAN = 3.0
PROBE_DEADLINE_S = 1.0  # a deadline no job meets: the planner answers with the shortest feasible one


@dataclass(frozen=True)
class StageRow:
    """One row of the plan table (and one colour in every chart)."""

    index: int
    label: str
    color: str
    bracket: int
    stage: int
    trials: int
    epochs: int
    epochs_this_stage: int
    cloud: str
    region: str
    instance_type: str
    instances: int
    workers_per_trial: int
    spot: bool
    duration_s: float | None
    duration_p95_s: float | None
    cost_usd: float | None
    zone: str | None = None  # spot: the first zone its requests try
    spot_price_hr: float | None = None  # spot: the tried zones' prices weighted by where capacity is found first
    spot_prior: bool = False  # spot: the type's spot model is a prior (no traces of it)

    @property
    def market(self) -> str:
        """``on-demand``, ``spot`` or ``spot <zone> $<price>/h`` (and ``prior`` where the spot model is one)."""
        if not self.spot:
            return "on-demand"
        price = f" ${self.spot_price_hr:.3f}/h" if self.spot_price_hr is not None else ""
        return f"spot{' ' + self.zone if self.zone else ''}{price}{' prior' if self.spot_prior else ''}"


@dataclass(frozen=True)
class Summary:
    job_name: str
    scheduler: str
    metric: str
    mode: str
    deadline_s: float
    confidence: float
    budget_usd: float | None
    jct_mean_s: float
    jct_p50_s: float
    jct_p95_s: float
    cost_mean_usd: float
    cost_p50_usd: float
    cost_p95_usd: float
    p_meet_deadline: float
    static_name: str | None
    static_cost_mean_usd: float | None
    static_jct_p95_s: float | None
    savings_usd: float | None
    savings_ratio: float | None
    clouds: tuple[str, ...]
    regions: tuple[str, ...]
    catalog_dates: tuple[tuple[str, str], ...]
    planner_algorithm: str
    planner_samples: int
    planner_seed: int
    planner_seconds: float
    planner_notes: tuple[str, ...]
    #: ASHA on a fixed cluster (plan.asha): "N × type", mean cost, JCT p95, whether it meets the deadline
    asha_name: str | None = None
    asha_cost_mean_usd: float | None = None
    asha_jct_p95_s: float | None = None
    asha_meets_deadline: bool | None = None
    #: parallel Hyperband brackets: a one-line description (start offsets, hand-overs); None otherwise
    brackets_text: str | None = None

    @property
    def catalog_dates_text(self) -> str:
        return ", ".join(f"{cloud} {date}" for cloud, date in self.catalog_dates) or fmt.DASH


@dataclass(frozen=True)
class Share:
    """A slice of the cost: a label, dollars, fraction of the total, and its colour."""

    label: str
    usd: float
    fraction: float
    color: str


@dataclass(frozen=True)
class CostData:
    total_usd: float
    by_stage: tuple[Share, ...]
    by_instance_type: tuple[Share, ...]
    overhead: tuple[Share, ...]  # training first, then each overhead
    overhead_usd: float
    overhead_fraction: float


@dataclass(frozen=True)
class GanttData:
    """One allocation-over-time picture: which instances lived when, doing which stage."""

    title: str
    timeline: Timeline
    stage_of: dict[tuple[int, int], int]  # (bracket, stage) -> row index in the stage table
    horizon_s: float


@dataclass(frozen=True)
class DistributionData:
    jct_samples_s: tuple[float, ...]
    cost_samples_usd: tuple[float, ...]


@dataclass(frozen=True)
class ParetoPoint:
    deadline_s: float
    cost_usd: float
    jct_p95_s: float
    p_meet_deadline: float
    static_cost_usd: float | None


@dataclass(frozen=True)
class ParetoData:
    shortest_jct_s: float
    points: tuple[ParetoPoint, ...]
    chosen_deadline_s: float
    chosen_cost_usd: float
    chosen_static_cost_usd: float | None


@dataclass(frozen=True)
class CloudRow:
    label: str
    cloud: str
    spot: bool
    current: bool
    feasible: bool
    instance_types: str = ""
    jct_p50_s: float | None = None
    jct_p95_s: float | None = None
    cost_mean_usd: float | None = None
    p_meet_deadline: float | None = None
    note: str = ""


@dataclass(frozen=True)
class ActualData:
    jct_s: float
    cost_usd: float
    jct_vs_p50: float  # actual / predicted p50
    cost_vs_mean: float  # actual / predicted mean
    jct_quantile: float | None  # share of simulated JCTs below the actual one
    cost_quantile: float | None
    completed: bool
    gantt: GanttData
    head_usd: float = 0.0  # the run's head instance, part of cost_usd
    predicted_head_usd: float = 0.0  # the plan's mean head cost, part of the predicted mean
    tracking: tuple[TrackingLink, ...] = ()  # where the trials were also logged (TensorBoard, MLflow)
    progress: tuple[ProgressPoint, ...] = ()  # the incumbent's metric over the run
    metric: str = ""
    mode: str = "max"
    before_start_s: float = 0.0  # what the user's command spent before the executor started (not in jct_s)
    head_early_s: float = 0.0  # how much of that the run's head was already starting (begun while planning)


@dataclass(frozen=True)
class ReportData:
    source_label: str
    summary: Summary
    stages: tuple[StageRow, ...]
    costs: CostData
    plan_gantt: GanttData | None
    static_gantt: GanttData | None
    distributions: DistributionData
    pareto: ParetoData | None
    clouds: tuple[CloudRow, ...] | None
    actual: ActualData | None
    notes: dict[str, str] = field(default_factory=dict)  # section id -> why it is missing or partial


# -- building -----------------------------------------------------------------------------------


def stage_label(stage: StagePlan, hyperband: bool) -> str:
    return f"B{stage.bracket}·S{stage.stage}" if hyperband else f"stage {stage.stage}"


def _stage_rows(plan: Plan) -> tuple[StageRow, ...]:
    hyperband = plan.job.scheduler == "hyperband" or len({s.bracket for s in plan.stages}) > 1
    rows = []
    durations = plan.predicted.stage_duration_s
    costs = plan.predicted.stage_cost_usd
    for i, s in enumerate(plan.stages):
        dist = durations[i] if i < len(durations) else None
        if (
            dist is not None
            and s.predicted_duration_s is not None
            and not math.isclose(s.predicted_duration_s, dist.p50)
        ):
            dist = None  # re-planned mid-run: the plan's distribution is of the stage as first planned, not this one
        duration = s.predicted_duration_s if s.predicted_duration_s is not None else (dist.p50 if dist else None)
        cost = s.predicted_cost_usd if s.predicted_cost_usd is not None else (costs[i] if i < len(costs) else None)
        rows.append(
            StageRow(
                index=i,
                label=stage_label(s, hyperband),
                color=STAGE_COLORS[i % len(STAGE_COLORS)],
                bracket=s.bracket,
                stage=s.stage,
                trials=s.trials,
                epochs=s.epochs,
                epochs_this_stage=s.epochs_this_stage,
                cloud=s.cloud,
                region=s.region,
                instance_type=s.instance_type,
                instances=s.instances,
                workers_per_trial=s.workers_per_trial,
                spot=s.spot,
                duration_s=duration,
                duration_p95_s=dist.p95 if dist else None,
                cost_usd=cost,
                zone=s.zone,
                spot_price_hr=s.spot_price_hr,
                spot_prior=s.spot_prior,
            )
        )
    return tuple(rows)


def _shares(items: list[tuple[str, float, str]], total: float) -> tuple[Share, ...]:
    return tuple(Share(label, usd, usd / total if total > 0 else 0.0, color) for label, usd, color in items)


def _costs(plan: Plan, stages: tuple[StageRow, ...]) -> CostData:
    total = plan.predicted.cost_usd.mean
    by_stage = _shares([(r.label, r.cost_usd or 0.0, r.color) for r in stages], total)
    by_type_items = sorted(plan.predicted.cost_by_instance_type.items(), key=lambda kv: -kv[1])
    by_type = _shares(
        [(name, usd, STAGE_COLORS[i % len(STAGE_COLORS)]) for i, (name, usd) in enumerate(by_type_items)], total
    )
    b = plan.predicted.cost_breakdown
    parts = [
        ("training", b.training_usd),
        ("startup", b.startup_usd),
        ("idle", b.idle_usd),
        ("billing minimum", b.billing_minimum_usd),
        ("data transfer", b.transfer_usd),
        ("head instance", b.head_usd),
    ]
    parts = [p for p in parts if p[0] == "training" or p[1] > 0]
    overhead_usd = sum(usd for label, usd in parts if label != "training")
    breakdown_total = sum(usd for _, usd in parts)
    overhead = _shares([(label, usd, OVERHEAD_COLORS[label]) for label, usd in parts], breakdown_total)
    return CostData(
        total_usd=total,
        by_stage=by_stage,
        by_instance_type=by_type,
        overhead=overhead,
        overhead_usd=overhead_usd,
        overhead_fraction=overhead_usd / breakdown_total if breakdown_total > 0 else 0.0,
    )


def _stage_index(plan: Plan) -> dict[tuple[int, int], int]:
    return {(s.bracket, s.stage): i for i, s in enumerate(plan.stages)}


def _horizon(timeline: Timeline | None) -> float:
    if timeline is None:
        return 0.0
    ends = [i.released_s for i in timeline.instances] + [t.end_s for t in timeline.tasks]
    return max(ends, default=0.0)


def _gantt(title: str, timeline: Timeline | None, stage_of: dict[tuple[int, int], int]) -> GanttData | None:
    if timeline is None or not timeline.instances:
        return None
    return GanttData(title=title, timeline=timeline, stage_of=stage_of, horizon_s=_horizon(timeline))


def _summary(plan: Plan, static: Alternative | None) -> Summary:
    p = plan.predicted
    static_cost = static.predicted.cost_usd.mean if static else None
    savings = static_cost - p.cost_usd.mean if static_cost is not None else None
    ratio = static_cost / p.cost_usd.mean if static_cost is not None and p.cost_usd.mean > 0 else None
    regions = tuple(dict.fromkeys(plan.catalog.regions or [s.region for s in plan.stages]))
    return Summary(
        job_name=plan.job.name,
        scheduler=plan.job.scheduler,
        metric=plan.job.metric,
        mode=plan.job.mode,
        deadline_s=plan.deadline_s,
        confidence=plan.confidence,
        budget_usd=plan.budget_usd,
        jct_mean_s=p.jct_s.mean,
        jct_p50_s=p.jct_s.p50,
        jct_p95_s=p.jct_s.p95,
        cost_mean_usd=p.cost_usd.mean,
        cost_p50_usd=p.cost_usd.p50,
        cost_p95_usd=p.cost_usd.p95,
        p_meet_deadline=p.p_meet_deadline,
        static_name=static.name if static else None,
        static_cost_mean_usd=static_cost,
        static_jct_p95_s=static.predicted.jct_s.p95 if static else None,
        savings_usd=savings,
        savings_ratio=ratio,
        clouds=tuple(plan.catalog.clouds),
        regions=regions,
        catalog_dates=tuple(sorted(plan.catalog.dates.items())),
        planner_algorithm=plan.planner.algorithm,
        planner_samples=plan.planner.samples,
        planner_seed=plan.planner.seed,
        planner_seconds=plan.planner.seconds,
        planner_notes=tuple(plan.planner.notes) + spot_notes(plan),
        **_asha_fields(plan),
        brackets_text=_brackets_text(plan),
    )


def _asha_fields(plan: Plan) -> dict:
    a = plan.asha
    if a is None:
        return {}
    return {
        "asha_name": f"{a.instances} × {a.instance_type}",
        "asha_cost_mean_usd": a.predicted.cost_usd.mean,
        "asha_jct_p95_s": a.predicted.jct_s.p95,
        "asha_meets_deadline": a.meets_deadline,
    }


def _brackets_text(plan: Plan) -> str | None:
    if not plan.parallel_brackets:
        return None
    late = [f"bracket {b} +{fmt.duration(o)}" for b, o in enumerate(plan.bracket_offsets_s) if o > 0]
    moves = len(plan.handoffs)
    return (
        f"Hyperband brackets run side by side ({'later starts: ' + ', '.join(late) if late else 'all start at once'}"
        f"); {moves} instance{'s' if moves != 1 else ''} handed between brackets in the typical run."
    )


def _quantile_of(value: float, samples: tuple[float, ...]) -> float | None:
    if not samples:
        return None
    return sum(1 for s in samples if s <= value) / len(samples)


def _actual(plan: Plan, actual: ActualOutcome, dists: DistributionData) -> ActualData:
    p = plan.predicted
    gantt = GanttData(
        title="Actual allocation",
        timeline=actual.timeline,
        stage_of=_stage_index(plan),
        horizon_s=max(_horizon(actual.timeline), actual.jct_s),
    )
    return ActualData(
        jct_s=actual.jct_s,
        cost_usd=actual.cost_usd,
        jct_vs_p50=actual.jct_s / p.jct_s.p50 if p.jct_s.p50 > 0 else math.nan,
        cost_vs_mean=actual.cost_usd / p.cost_usd.mean if p.cost_usd.mean > 0 else math.nan,
        jct_quantile=_quantile_of(actual.jct_s, dists.jct_samples_s),
        cost_quantile=_quantile_of(actual.cost_usd, dists.cost_samples_usd),
        completed=actual.completed,
        gantt=gantt,
        head_usd=actual.head_usd,
        predicted_head_usd=p.cost_breakdown.head_usd,
        tracking=actual.tracking,
        progress=actual.progress,
        metric=plan.job.metric,
        mode=plan.job.mode,
        before_start_s=actual.before_start_s,
        head_early_s=actual.head_early_s,
    )


# -- re-planning sections -------------------------------------------------------------------------


def _static_cost(plan: Plan) -> float | None:
    static = plan.baselines.get("static")
    return static.predicted.cost_usd.mean if static else None


def build_pareto(plan: Plan, replan: Replanner) -> tuple[ParetoData | None, str]:
    """Re-plan at deadlines from the shortest feasible one to PARETO_SPAN times it (or the plan's, if later)."""
    try:
        probe = replan(ReplanRequest(deadline_s=PROBE_DEADLINE_S))
        shortest = probe.predicted.jct_s.p95  # the planner met even this deadline: take what it achieved
    except InfeasibleError as exc:
        if exc.shortest_jct_s is None:
            return None, f"the planner did not say which deadline is feasible ({exc.message})"
        shortest = exc.shortest_jct_s
    except RubberbandError as exc:
        return None, f"re-planning failed: {exc.message}"
    points = []
    failures = []
    longest = max(shortest * PARETO_SPAN, plan.deadline_s)  # the chosen point lies on the curve
    for k in range(PARETO_POINTS):
        deadline = shortest + (longest - shortest) * k / (PARETO_POINTS - 1)
        if k == 0:
            deadline *= 1.001  # stay on the feasible side of the boundary
        try:
            alt = replan(ReplanRequest(deadline_s=deadline))
        except RubberbandError as exc:
            failures.append(f"{fmt.duration(deadline)}: {exc.message}")
            continue
        points.append(
            ParetoPoint(
                deadline_s=deadline,
                cost_usd=alt.predicted.cost_usd.mean,
                jct_p95_s=alt.predicted.jct_s.p95,
                p_meet_deadline=alt.predicted.p_meet_deadline,
                static_cost_usd=_static_cost(alt),
            )
        )
    if not points:
        return None, "no deadline in the sweep could be planned (" + "; ".join(failures[:2]) + ")"
    note = f"{len(failures)} of {PARETO_POINTS} deadlines could not be planned" if failures else ""
    return ParetoData(
        shortest_jct_s=shortest,
        points=tuple(points),
        chosen_deadline_s=plan.deadline_s,
        chosen_cost_usd=plan.predicted.cost_usd.mean,
        chosen_static_cost_usd=_static_cost(plan),
    ), note


def _types_text(plan: Plan) -> str:
    seen: dict[str, None] = {}
    for s in plan.stages:
        seen[f"{s.instance_type}{' (spot)' if s.spot else ''}"] = None
    return ", ".join(seen)


def _row_from_plan(label: str, cloud: str, spot: bool, current: bool, plan: Plan) -> CloudRow:
    p = plan.predicted
    return CloudRow(
        label=label,
        cloud=cloud,
        spot=spot,
        current=current,
        feasible=True,
        instance_types=_types_text(plan),
        jct_p50_s=p.jct_s.p50,
        jct_p95_s=p.jct_s.p95,
        cost_mean_usd=p.cost_usd.mean,
        p_meet_deadline=p.p_meet_deadline,
    )


def build_clouds(plan: Plan, replan: Replanner) -> tuple[CloudRow, ...]:
    """The same job at the same deadline on each cloud that rents instances (AWS, GCP), and with spot instances
    allowed."""
    own_clouds = sorted({s.cloud for s in plan.stages})
    own_spot = any(s.spot for s in plan.stages)
    spot_cloud = own_clouds[0] if len(own_clouds) == 1 else None
    variants = [
        *((f"{cloud_facts(name).label}, on-demand", name, False) for name in rented_clouds()),
        (f"{spot_cloud.upper()}, spot allowed" if spot_cloud else "spot allowed", spot_cloud or "", True),
    ]
    rows: list[CloudRow] = []
    if not any((cloud, spot) == (spot_cloud, own_spot) for _, cloud, spot in variants):
        rows.append(
            _row_from_plan(
                f"this plan ({', '.join(own_clouds)}{', spot' if own_spot else ''})",
                "+".join(own_clouds),
                own_spot,
                True,
                plan,
            )
        )
    for label, cloud, spot in variants:
        if (cloud, spot) == (spot_cloud, own_spot):
            rows.append(_row_from_plan(label, cloud, spot, True, plan))
            continue
        request = ReplanRequest(deadline_s=plan.deadline_s, cloud=cloud or None, spot=spot)
        try:
            alt = replan(request)
        except InfeasibleError as exc:
            extra = ""
            if exc.shortest_jct_s is not None:
                extra = f"; shortest feasible deadline {fmt.duration(exc.shortest_jct_s)}"
            rows.append(
                CloudRow(
                    label=label,
                    cloud=cloud,
                    spot=spot,
                    current=False,
                    feasible=False,
                    note=f"cannot meet the deadline{extra}",
                )
            )
            continue
        except RubberbandError as exc:
            rows.append(CloudRow(label=label, cloud=cloud, spot=spot, current=False, feasible=False, note=exc.message))
            continue
        rows.append(_row_from_plan(label, cloud, spot, False, alt))
    return tuple(rows)


# -- entry point ----------------------------------------------------------------------------------


def build_report_data(
    source: ReportSource,
    *,
    replan: Replanner | None = None,
    replan_missing: str = "no planner was given to re-plan with",
) -> ReportData:
    """Compute everything the report shows. ``replan`` feeds the what-if sections."""
    plan = source.plan
    notes: dict[str, str] = {}
    static = plan.baselines.get("static")
    if static is None:
        notes["summary"] = "the plan carries no static baseline, so savings cannot be shown"
    stages = _stage_rows(plan)
    stage_of = _stage_index(plan)
    plan_gantt = _gantt("This plan", plan.timeline, stage_of)
    if plan_gantt is None:
        notes["gantt"] = "the plan carries no timeline to draw"
    static_gantt = None
    if static is not None:
        static_gantt = _gantt(f"Static baseline ({static.name})", static.timeline, stage_of)
    if static_gantt is None:
        notes["gantt_static"] = "no static baseline timeline in the plan"
    dists = DistributionData(
        jct_samples_s=tuple(plan.predicted.jct_samples_s), cost_samples_usd=tuple(plan.predicted.cost_samples_usd)
    )
    if not dists.jct_samples_s:
        notes["distributions"] = (
            "the plan carries summary statistics only (no simulated samples); "
            "re-run `rubberband plan` with a planner that keeps samples"
        )
    pareto = clouds = None
    if replan is None:
        notes["pareto"] = notes["clouds"] = f"omitted: {replan_missing}"
    else:
        pareto, why = build_pareto(plan, replan)
        if why:
            notes["pareto"] = why
        clouds = build_clouds(plan, replan)
    actual_outcome = source.actual()
    actual = _actual(plan, actual_outcome, dists) if actual_outcome is not None else None
    return ReportData(
        source_label=source.label,
        summary=_summary(plan, static),
        stages=stages,
        costs=_costs(plan, stages),
        plan_gantt=plan_gantt,
        static_gantt=static_gantt,
        distributions=dists,
        pareto=pareto,
        clouds=clouds,
        actual=actual,
        notes=notes,
    )


def _spot_zone_note(z: SpotZoneInfo) -> str:
    """One spot type as the notes name it: the zones its requests try with their prices and the chance capacity is
    found first in each, the expected price, its preemptions and P(no capacity), and whether it is a prior."""
    tried = ", ".join(f"{t.zone} ${t.price_hr:.4g} ({t.p_first:.0%})" for t in z.tried)
    where = f"tries {tried}, expected ${z.price_hr:.3f}/h; " if tried and z.price_hr is not None else f"{z.zone}: "
    prior = f" [prior — {z.rate_source.removeprefix('prior: ')}]" if z.prior else ""
    return (
        f"{z.instance_type} {where}{z.preemption_rate_per_h:.2f} preemptions/h, "
        f"P(no capacity) {z.p_unavailable:.0%}{prior}"
    )


def why_not_notes(plan: Plan) -> tuple[str, ...]:
    """One line per stage on-demand although spot was allowed: why (the plan's ``why_not_spot``)."""
    hyperband = plan.job.scheduler == "hyperband"
    return tuple(
        f"* {'bracket ' + str(s.bracket) + ' ' if hyperband else ''}stage {s.stage} on-demand: {s.why_not_spot}"
        for s in plan.stages
        if not s.spot and s.why_not_spot
    )


def spot_notes(plan: Plan) -> tuple[str, ...]:
    """What the prediction assumes about spot (the model, the zones tried and their prices, priors, the fall-back,
    checkpoints), then why each stage left on-demand is (:func:`why_not_notes`); none without a spot model."""
    info = plan.spot
    if info is None:
        return ()
    spot = sum(1 for s in plan.stages if s.spot)
    used = [z for z in info.zones if any(plan.spot_entry(s) == z for s in plan.stages)]
    zones = "; ".join(_spot_zone_note(z) for z in used)
    moves = sorted(
        {
            f"{s.instance_type} → {s.fallback_instance_type} ({s.fallback_slowdown or 1.0:.2f}× the epoch time)"
            for s in plan.stages
            if s.spot and s.fallback_instance_type
        }
    )
    to = f"on-demand {', '.join(moves)}" if moves else "on-demand"
    return (
        f"Spot: {spot} of {len(plan.stages)} stages on spot; P(meet) and cost include preemptions "
        f"(checkpoint every {info.checkpoint_epochs} epoch{'s' if info.checkpoint_epochs != 1 else ''}, "
        f"Uniform-Progress fall-back to {to}){': ' + zones if zones else ''}; model: {info.model_source}.",
    ) + why_not_notes(plan)
