"""The plan: per stage, which instances (and market), how many, and how many workers per trial (schema v3).

A plan is the planner's output and the executor's input. It carries the simulator's
predictions (JCT and cost distributions, per-stage figures, one representative
timeline for Gantt charts) and the baselines it was compared with.
``docs/plan.md`` documents every field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rubberband.errors import PlanFileError
from rubberband.versioned import DocumentSchema, read_json, validate_versioned
from rubberband.files import write_text_atomic

PLAN_SCHEMA_VERSION = 3
#: Older plan schemas this version reads (v1: Hyperband brackets always ran one after another;
#: v2: no spot model, a stage's ``spot`` meant spot prices with no preemptions).
READABLE_PLAN_VERSIONS = (1, 2)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Distribution(_Model):
    mean: float
    p50: float
    p95: float


class StagePlan(_Model):
    """One SHA stage (of one Hyperband bracket): its trials and the resources they run on."""

    bracket: int = Field(default=0, ge=0)
    stage: int = Field(ge=0, description="index of the stage within its bracket")
    trials: int = Field(ge=1)
    epochs: int = Field(ge=1, description="cumulative epochs each trial has reached at the end of the stage")
    epochs_this_stage: int = Field(ge=1, description="epochs each trial trains in this stage")
    cloud: str
    region: str
    instance_type: str
    instances: int = Field(ge=1)
    workers_per_trial: int = Field(ge=1)
    spot: bool = Field(default=False, description="the stage's market: spot (true) or on-demand")
    zone: str | None = Field(
        default=None,
        description="spot: the first zone the executor's spot request tries (a catalog zone; plan.spot.zones "
        "lists every zone tried, in order, with its price; docs/spot.md)",
    )
    spot_price_hr: float | None = Field(
        default=None,
        ge=0,
        description="spot: the $/h the stage is priced at, the tried zones' spot prices weighted by the chance "
        "capacity is found first in each",
    )
    spot_prior: bool = Field(
        default=False, description="spot: the type has no traces; its spot model is a prior pooled over others"
    )
    why_not_spot: str | None = Field(
        default=None, description="spot allowed but the stage on-demand: why (e.g. no spot price, or spot's P(meet))"
    )
    fallback_instance_type: str | None = Field(
        default=None,
        description="spot: the on-demand type (same cloud and region) a preempted trial moves to when the spot "
        "policy gives up on spot, where cheaper per epoch than the stage's own type (None: its own type)",
    )
    fallback_slowdown: float | None = Field(
        default=None, gt=0, description="epoch time on fallback_instance_type over epoch time on instance_type"
    )
    predicted_duration_s: float | None = Field(default=None, description="p50 of the stage's duration")
    predicted_task_s: float | None = Field(
        default=None,
        description="median seconds of one trial's task in the "
        "stage (no waiting for instances); prefetch is timed from waves × this",
    )
    predicted_cost_usd: float | None = Field(default=None, description="mean cost attributed to the stage")


class CostBreakdown(_Model):
    """Where the money goes (means over samples): useful work versus overheads."""

    training_usd: float = 0.0
    startup_usd: float = 0.0
    idle_usd: float = 0.0
    billing_minimum_usd: float = 0.0
    transfer_usd: float = 0.0
    head_usd: float = Field(
        default=0.0,
        description="the run's head instance (head mode on aws/gcp): its "
        "price from its own boot until the job ends plus the watchdog's results grace",
    )


class Prediction(_Model):
    jct_s: Distribution
    cost_usd: Distribution
    p_meet_deadline: float = Field(ge=0, le=1)
    stage_duration_s: list[Distribution] = Field(default_factory=list)
    stage_cost_usd: list[float] = Field(default_factory=list)
    cost_breakdown: CostBreakdown = Field(default_factory=CostBreakdown)
    cost_by_instance_type: dict[str, float] = Field(default_factory=dict)
    jct_samples_s: list[float] = Field(
        default_factory=list,
        description="a few hundred simulated JCTs (for report histograms); optional, empty when not kept",
    )
    cost_samples_usd: list[float] = Field(
        default_factory=list, description="the simulated costs of the same samples; optional, empty when not kept"
    )


class TimelineInstance(_Model):
    """One instance's life in the representative sample (seconds from job start)."""

    id: str
    instance_type: str
    cloud: str
    first_stage: int
    last_stage: int
    requested_s: float
    ready_s: float
    released_s: float
    cost_usd: float


class TimelineTask(_Model):
    """One trial's work in one stage in the representative sample."""

    trial: int
    stage: int
    bracket: int = 0
    instance_ids: list[str]
    workers: int
    start_s: float
    end_s: float


class HeadInfo(_Model):
    """The run's head instance the prediction bills (``rubberband run --cloud aws|gcp --head instance``).

    A fixed per-run overhead: the head is billed (its cloud's billing rule) from its request,
    ``boot_s`` before the job starts, until ``grace_s`` after the job ends (the watchdog's results
    grace). Absent for local runs and for ``--head local`` (the CLI machine is the head).
    """

    cloud: str
    instance_type: str
    price_hr: float = Field(ge=0)
    boot_s: float = Field(ge=0, description="head request until the job starts (its boot + Ray head)")
    grace_s: float = Field(ge=0, description="job end until the head is gone (the watchdog's done grace)")


class TriedZone(_Model):
    """One zone a spot request tries (in the executor's order): its spot price and P(capacity found first here)."""

    zone: str
    price_hr: float = Field(ge=0)
    p_first: float = Field(ge=0, le=1)


class SpotZoneInfo(_Model):
    """The fitted spot behaviour a spot stage was planned with (see :class:`rubberband.spotmodel.ZoneFit`) and the
    zones its requests try (see :mod:`rubberband.planner.spotzones`)."""

    cloud: str
    instance_type: str
    region: str
    zone: str = Field(
        description="the spot model's entry it is modelled on (trace zone names; REGION*: the region's zones "
        "together; 'REGION (prior)': no traces of the type)"
    )
    preemption_rate_per_h: float = Field(ge=0)
    p_unavailable: float = Field(ge=0, le=1, description="P(none of the zones tried has capacity)")
    unavailable_s: list[float] = Field(min_length=2, description="quantiles 0, 5 %, …, 100 % of unavailability")
    rate_source: str = ""
    tried: list[TriedZone] = Field(
        default_factory=list, description="the catalog zones a spot request tries, in order (empty: a v3 plan)"
    )
    price_hr: float | None = Field(default=None, ge=0, description="expected spot $/h over the tried zones")
    prior: bool = Field(default=False, description="no traces of this type: a prior pooled over the fitted types")


class SpotInfo(_Model):
    """How the plan's spot stages were simulated: the model, the fall-back policy, checkpoints."""

    model_source: str = Field(description="the spot model file (or 'shipped default') and its traces' source")
    zones: list[SpotZoneInfo] = Field(default_factory=list, description="per spot-capable type, the zone used")
    margin_s: float = Field(default=0.0, ge=0, description="SpotPolicy.margin_s: slack kept beyond one restart")
    checkpoint_epochs: int = Field(
        default=1,
        ge=1,
        description="a trial checkpoints every this many epochs; a preemption loses the work since the last one",
    )


class Timeline(_Model):
    instances: list[TimelineInstance] = Field(default_factory=list)
    tasks: list[TimelineTask] = Field(default_factory=list)


class Handoff(_Model):
    """An instance one Hyperband bracket hands to another instead of a release and a new request
    (parallel brackets; in the representative sample)."""

    instance_type: str
    from_stage: int = Field(ge=0, description="position in `stages` of the stage that releases it")
    to_stage: int = Field(ge=0, description="position in `stages` of the stage that takes it over")
    at_s: float = Field(description="when the giving stage releases it (seconds from job start)")
    instance_id: str = ""


class BaselineASHA(_Model):
    """ASHA (asynchronous successive halving) simulated on a fixed cluster, as the baseline users know."""

    instance_type: str
    cloud: str
    instances: int = Field(ge=1)
    workers_per_trial: int = Field(ge=1)
    predicted: Prediction
    meets_deadline: bool = Field(
        description="whether this cluster meets the deadline at the confidence "
        "(false: the quickest cluster tried, shown for comparison)"
    )
    trial_starts: Literal["ray_tune", "warm_workers"] = Field(
        default="warm_workers",
        description="how its trials start: ray_tune: as Ray Tune's, each a new process (the profile's measured "
        "tune_trial_start); warm_workers: as this executor's (an ASHA plan's own cluster, or no Ray Tune "
        "measurement in the profile)",
    )


class Alternative(_Model):
    """A plan the chosen one is compared with (best static plan, exact optimum)."""

    name: str
    stages: list[StagePlan]
    predicted: Prediction
    timeline: Timeline | None = None
    #: For the exact optimum: "proven optimal (N nodes searched)" or "capped after N nodes, not proven optimal".
    note: str | None = None


class PlannerInfo(_Model):
    algorithm: str = "greedy-marginal-benefit"
    candidates_evaluated: int = 0
    iterations: int = 0
    seconds: float = 0.0
    samples: int = 0
    seed: int = 0
    notes: list[str] = Field(default_factory=list)


class SurvivorInfo(_Model):
    """Who the predictions let survive a promotion when configurations differ in speed: promotion ranks by
    metric, so when quality goes with speed the survivors are not a random sample."""

    basis: Literal["fitted", "bound"] = Field(
        description="fitted: the profiled configurations' rank correlation; bound: too few scored configurations "
        "to fit it, planned at a conservative (upper) bound"
    )
    rho: float = Field(
        ge=-1, le=1, description="the correlation of slowness and quality planned with (> 0: slow promoted)"
    )
    rank_correlation: float | None = Field(
        default=None, description="the profiled configurations' Spearman correlation of slowness and score"
    )
    note: str = ""


class JobInfo(_Model):
    name: str
    spec_sha256: str
    scheduler: Literal["sha", "hyperband", "asha"]
    eta: int
    min_epochs: int
    max_epochs: int
    trials: int | None = None
    metric: str
    mode: Literal["min", "max"]


class CatalogInfo(_Model):
    clouds: list[str]
    regions: list[str]
    dates: dict[str, str]


class Plan(_Model):
    schema_version: Literal[3] = PLAN_SCHEMA_VERSION
    job: JobInfo
    catalog: CatalogInfo
    deadline_s: float = Field(gt=0)
    confidence: float = Field(gt=0, lt=1)
    budget_usd: float | None = None
    stages: list[StagePlan] = Field(min_length=1)
    predicted: Prediction
    timeline: Timeline = Field(default_factory=Timeline)
    baselines: dict[str, Alternative] = Field(default_factory=dict)
    planner: PlannerInfo = Field(default_factory=PlannerInfo)
    profile_sha256: str | None = None
    spec: dict[str, Any] | None = Field(
        default=None,
        description="the job spec the plan was made for (JobSpec dump), so reports and the executor can re-plan",
    )
    profile_path: str | None = None
    head: HeadInfo | None = Field(
        default=None,
        description="the billed head instance the predictions include "
        "(cost_breakdown.head_usd); None when the run has no billed head",
    )
    head_start_s: float = Field(
        default=0.0,
        ge=0,
        description="seconds from the executor's start until the run's Ray head takes nodes, as the predictions "
        "count them (a local run's head, as profiled; 0 where the head is up before the run starts); a head "
        "started while planning has run part of it before the executor starts (result.json)",
    )
    brackets: Literal["sequential", "parallel"] = Field(
        default="sequential", description="how Hyperband brackets run: one after another or side by side"
    )
    bracket_offsets_s: list[float] = Field(
        default_factory=list,
        description="parallel: each bracket's start, seconds after the job starts (bracket 0 at 0)",
    )
    handoffs: list[Handoff] = Field(
        default_factory=list,
        description="parallel: instances handed from one bracket to another in the representative sample",
    )
    asha: BaselineASHA | None = Field(default=None, description="ASHA simulated on a fixed cluster")
    survivors: SurvivorInfo | None = Field(
        default=None,
        description="configurations differ in speed: who the predictions let survive a promotion (None: they do "
        "not differ, or were not measured)",
    )
    spot: SpotInfo | None = Field(
        default=None,
        description="spot allowed: the preemption model and policy the "
        "predictions include (None: on-demand only, or a v2 plan)",
    )

    def spot_entry(self, stage: StagePlan) -> SpotZoneInfo | None:
        """The spot model and zones tried that ``stage`` (on spot) was planned with; None on-demand or without."""
        if self.spot is None or not stage.spot:
            return None
        key = (stage.cloud, stage.region, stage.instance_type)
        return next((z for z in self.spot.zones if (z.cloud, z.region, z.instance_type) == key), None)

    @property
    def parallel_brackets(self) -> bool:
        """Whether several Hyperband brackets run side by side."""
        return self.brackets == "parallel" and len({s.bracket for s in self.stages}) > 1

    @property
    def is_asha(self) -> bool:
        """Whether the plan runs ASHA: one elastic cluster whose stages are the rung ladder's phases (stage ``k``
        holds ``instances`` instances once every trial has started and none trains below rung ``k``)."""
        return self.job.scheduler == "asha"

    @property
    def phase_instances(self) -> tuple[int, ...]:
        """ASHA: the instances each phase holds, phase by phase (``AshaPhasePolicy.instances``)."""
        if not self.is_asha:
            raise PlanFileError(f"the plan runs {self.job.scheduler}, not ASHA: it has no phases")
        return tuple(s.instances for s in self.stages)


def parse_plan(data: Any, *, source: str = "<plan>") -> Plan:
    """A plan from parsed JSON; older schema versions (:data:`READABLE_PLAN_VERSIONS`) are upgraded."""
    if isinstance(data, dict) and data.get("schema_version") in READABLE_PLAN_VERSIONS:
        # v1 → v2 → v3 only added fields (defaults: sequential brackets, no hand-overs, no ASHA baseline,
        # no spot model)
        data = {**data, "schema_version": PLAN_SCHEMA_VERSION}
    schema = DocumentSchema(
        Plan,
        kind="plan",
        version=PLAN_SCHEMA_VERSION,
        error=PlanFileError,
        remedy="regenerate it with `rubberband plan`",
    )
    return validate_versioned(schema, data, source=source)


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    data = read_json(
        path,
        kind="plan file",
        error=PlanFileError,
        missing=f"create it with `rubberband plan SPEC --out {path}`",
        remedy="regenerate it with `rubberband plan`",
    )
    return parse_plan(data, source=str(path))


def write_plan(plan: Plan, path: str | Path) -> None:
    """Write atomically so an interrupted write never leaves a half plan behind."""
    write_text_atomic(path, plan_json(plan) + "\n", make_parents=True)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2)
