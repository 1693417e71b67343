"""Realistic plans for the report tests, built directly (no planner), and a fake replanner.

``make_plan`` lays an SHA job (27 trials, η=3, 1→27 epochs by default) onto instances stage by
stage: trials run in lanes of ``workers`` GPUs, instances are requested at a stage's start,
ready after a start-up delay, kept when the next stage still needs them and released when it
does not. Costs, the cost breakdown, per-stage figures and the distributions all come from
that timeline, so the plan is self-consistent the way a planner's would be. The static
baseline is the same job on a fixed cluster held for the whole run.

``FakeReplanner`` re-plans deterministically: the cheapest parallelism level whose p95 JCT
meets the deadline, on the requested cloud, spot prices when spot is allowed, and
``InfeasibleError`` (with the shortest feasible deadline) below the fastest level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rubberband.planner.schedule import sha_stages
from rubberband.errors import CatalogError, InfeasibleError
from rubberband.plan import (
    Alternative,
    CatalogInfo,
    CostBreakdown,
    Distribution,
    JobInfo,
    Plan,
    PlannerInfo,
    Prediction,
    StagePlan,
    Timeline,
    TimelineInstance,
    TimelineTask,
)
from rubberband.report.replan import ReplanRequest

CLOUDS = {
    "aws": {
        "region": "us-east-1",
        "gpu_hr": 3.06,
        "spot_gpu_hr": 0.65,
        "types": {1: "p3.2xlarge", 4: "p3.8xlarge", 8: "p3.16xlarge"},
    },
    "gcp": {
        "region": "us-central1",
        "gpu_hr": 2.86,
        "spot_gpu_hr": 1.09,
        "types": {1: "n1-standard-8+1xV100", 4: "n1-standard-32+4xV100", 8: "n1-standard-64+8xV100"},
    },
}
EPOCH_S = 40.0  # one epoch on one GPU
STARTUP_S = 95.0  # requested -> ready
SCALING = 0.85  # speedup(w) = w ** SCALING
# per level: workers per trial in each stage and the most 4-GPU instances held at once
LEVELS = {3: ((1, 2, 4, 8), 7), 2: ((1, 1, 2, 4), 4), 1: ((1, 1, 1, 2), 2)}


@dataclass
class _Lane:
    instance_ids: list[str]
    free_at: float


@dataclass(frozen=True)
class _Fleet:
    """How a plan holds its instances: the workers per trial in each stage, the most instances held at once and
    whether it holds that many the whole run (the static baseline)."""

    workers: tuple[int, ...]
    cap: int
    static: bool = False


@dataclass(frozen=True)
class _Layout:
    """One simulated sample of a plan: its stages, timeline and JCT, the stages' windows and costs, the cost
    breakdown, the cost per instance type and the total."""

    stage_plans: list[StagePlan]
    timeline: Timeline
    jct: float
    stage_windows: list[tuple[float, float]]
    stage_cost: list[float]
    breakdown: dict[str, float]
    by_type: dict[str, float]
    total: float


def _layout(stages, fleet: _Fleet, *, cloud: str, spot: bool, seed: int) -> _Layout:
    """Simulate one sample: returns stage plans, timeline, jct, per-stage durations/costs and breakdown."""
    workers, cap, static = fleet.workers, fleet.cap, fleet.static
    info = CLOUDS[cloud]
    gpu_hr = info["spot_gpu_hr"] if spot else info["gpu_hr"]
    rng = np.random.default_rng(seed)
    instances: dict[str, dict] = {}
    alive: list[str] = []
    tasks: list[TimelineTask] = []
    stage_plans: list[StagePlan] = []
    stage_windows = []
    t = 0.0
    counter = 0
    for i, st in enumerate(stages):
        w = workers[i]
        gpus = 4 if w <= 4 else 8
        needed = math.ceil(st.trials * w / gpus)
        count = cap if static else max(1, min(needed, cap if gpus == 4 else max(1, cap // 2)))
        itype = info["types"][gpus]
        # keep matching instances from the previous stage, release the rest, request new ones
        keep = [iid for iid in alive if instances[iid]["type"] == itype][:count]
        for iid in alive:
            if iid not in keep:
                instances[iid]["released"] = t
        new = []
        for _ in range(count - len(keep)):
            counter += 1
            iid = f"{cloud}-{counter:02d}"
            instances[iid] = {
                "type": itype,
                "gpus": gpus,
                "requested": t,
                "ready": t + STARTUP_S + rng.uniform(-10, 25),
                "released": None,
                "first": i,
                "last": i,
            }
            new.append(iid)
        alive = keep + new
        for iid in alive:
            instances[iid]["last"] = i
        lanes: list[_Lane] = []
        if w <= gpus:
            for iid in alive:
                for _ in range(gpus // w):
                    lanes.append(_Lane([iid], max(t, instances[iid]["ready"])))
        else:
            span = w // gpus
            for k in range(0, len(alive) - span + 1, span):
                group = alive[k : k + span]
                lanes.append(_Lane(group, max(t, *(instances[g]["ready"] for g in group))))
        base = st.epochs_this_stage * EPOCH_S / (w**SCALING)
        for trial in range(st.trials):
            lane = min(lanes, key=lambda ln: ln.free_at)
            dur = base * rng.lognormal(0.0, 0.08)
            tasks.append(
                TimelineTask(
                    trial=trial,
                    stage=st.index,
                    bracket=0,
                    instance_ids=list(lane.instance_ids),
                    workers=w,
                    start_s=lane.free_at,
                    end_s=lane.free_at + dur,
                )
            )
            lane.free_at += dur
        end = max(ln.free_at for ln in lanes)
        stage_windows.append((t, end))
        stage_plans.append(
            StagePlan(
                stage=st.index,
                trials=st.trials,
                epochs=st.epochs,
                epochs_this_stage=st.epochs_this_stage,
                cloud=cloud,
                region=info["region"],
                instance_type=itype,
                instances=count,
                workers_per_trial=w,
                spot=spot,
            )
        )
        t = end
    for iid in alive:
        instances[iid]["released"] = t
    jct = t
    timeline_instances = []
    breakdown = {"training": 0.0, "startup": 0.0, "idle": 0.0, "billing_minimum": 0.0}
    stage_cost = [0.0] * len(stages)
    by_type: dict[str, float] = {}
    for iid, inst in instances.items():
        rate = gpu_hr * inst["gpus"] / 3600
        life = inst["released"] - inst["requested"]
        billed = max(life, 60.0)
        cost = rate * billed
        busy = sum(
            (tk.end_s - tk.start_s) * tk.workers / inst["gpus"] / len(tk.instance_ids)
            for tk in tasks
            if iid in tk.instance_ids
        )
        startup = inst["ready"] - inst["requested"]
        breakdown["training"] += rate * busy
        breakdown["startup"] += rate * startup
        breakdown["idle"] += rate * max(0.0, life - startup - busy)
        breakdown["billing_minimum"] += rate * (billed - life)
        by_type[inst["type"]] = by_type.get(inst["type"], 0.0) + cost
        for s, (a, b) in enumerate(stage_windows):
            overlap = max(0.0, min(b, inst["released"]) - max(a, inst["requested"]))
            stage_cost[s] += rate * overlap
        timeline_instances.append(
            TimelineInstance(
                id=iid,
                instance_type=inst["type"],
                cloud=cloud,
                first_stage=inst["first"],
                last_stage=inst["last"],
                requested_s=inst["requested"],
                ready_s=inst["ready"],
                released_s=inst["released"],
                cost_usd=round(cost, 6),
            )
        )
    total = sum(i.cost_usd for i in timeline_instances)
    return _Layout(
        stage_plans,
        Timeline(instances=timeline_instances, tasks=tasks),
        jct,
        stage_windows,
        stage_cost,
        breakdown,
        by_type,
        total,
    )


def _dist(values: np.ndarray) -> Distribution:
    return Distribution(
        mean=float(np.mean(values)), p50=float(np.percentile(values, 50)), p95=float(np.percentile(values, 95))
    )


def _prediction(layout: _Layout, deadline_s: float, seed: int, n_samples: int) -> Prediction:
    jct, windows, stage_cost = layout.jct, layout.stage_windows, layout.stage_cost
    breakdown, by_type, total = layout.breakdown, layout.by_type, layout.total
    rng = np.random.default_rng(seed + 1)
    noise = rng.lognormal(0.0, 0.06, size=400)
    jct_samples = jct * noise
    cost_samples = total * (0.6 + 0.4 * noise) * rng.lognormal(0.0, 0.01, size=400)
    cost_dist = _dist(cost_samples)
    scale = cost_dist.mean / total
    stage_durations = [Distribution(mean=(b - a) * 1.01, p50=b - a, p95=(b - a) * 1.12) for a, b in windows]
    return Prediction(
        jct_s=_dist(jct_samples),
        cost_usd=cost_dist,
        p_meet_deadline=float(np.mean(jct_samples <= deadline_s)),
        stage_duration_s=stage_durations,
        stage_cost_usd=[c * cost_dist.mean / sum(stage_cost) for c in stage_cost],
        cost_breakdown=CostBreakdown(
            training_usd=breakdown["training"] * scale,
            startup_usd=breakdown["startup"] * scale,
            idle_usd=breakdown["idle"] * scale,
            billing_minimum_usd=breakdown["billing_minimum"] * scale,
            transfer_usd=0.0,
        ),
        cost_by_instance_type={k: v * scale for k, v in by_type.items()},
        jct_samples_s=[float(x) for x in jct_samples[:n_samples]],
        cost_samples_usd=[float(x) for x in cost_samples[:n_samples]],
    )


@dataclass(frozen=True)
class SyntheticPlan:
    """The knobs of :func:`make_plan`: the SHA job (``trials``, ``eta``, epochs), its deadline, the parallelism
    ``level`` (:data:`LEVELS`), the cloud and market, the seed and the distributions' kept ``samples``, and
    whether the plan carries a static baseline, its spec and which catalogs."""

    deadline_s: float = 3600.0
    level: int = 3
    cloud: str = "aws"
    spot: bool = False
    trials: int = 27
    eta: int = 3
    min_epochs: int = 1
    max_epochs: int = 27
    seed: int = 7
    samples: int = 400
    with_static: bool = True
    with_spec: bool = True
    catalog_clouds: tuple[str, ...] = ("aws", "gcp")

    def spec(self) -> dict | None:
        if not self.with_spec:
            return None
        return {
            "name": "quickstart",
            "train": "examples.quickstart:train",
            "metric": {"name": "val_loss", "mode": "min"},
            "search_space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}},
            "scheduler": {
                "kind": "sha",
                "trials": self.trials,
                "eta": self.eta,
                "min_epochs": self.min_epochs,
                "max_epochs": self.max_epochs,
            },
            "deadline_s": self.deadline_s,
            "resources": {"clouds": [self.cloud], "spot": self.spot},
        }


def make_plan(**knobs) -> Plan:
    """A self-consistent SHA plan with a timeline, distributions and a static baseline (``knobs``: the fields of
    :class:`SyntheticPlan`)."""
    o = SyntheticPlan(**knobs)
    deadline_s, cloud, spot, seed, samples = o.deadline_s, o.cloud, o.spot, o.seed, o.samples
    stages = sha_stages(o.trials, o.eta, o.min_epochs, o.max_epochs)
    workers, cap = LEVELS[o.level]
    workers = tuple(workers[min(i, len(workers) - 1)] for i in range(len(stages)))
    laid = _layout(stages, _Fleet(workers, cap), cloud=cloud, spot=spot, seed=seed)
    predicted = _prediction(laid, deadline_s, seed, samples)
    sp = [
        s.model_copy(update={"predicted_duration_s": d.p50, "predicted_cost_usd": c})
        for s, d, c in zip(laid.stage_plans, predicted.stage_duration_s, predicted.stage_cost_usd)
    ]
    baselines = {}
    if o.with_static:
        static = _layout(
            stages,
            _Fleet(tuple(min(w, 4) for w in workers), max(2, cap - 1), static=True),
            cloud=cloud,
            spot=spot,
            seed=seed + 100,
        )
        ssp = static.stage_plans
        baselines["static"] = Alternative(
            name=f"{ssp[0].instances}× {ssp[0].instance_type} for the whole job",
            stages=ssp,
            predicted=_prediction(static, deadline_s, seed + 100, samples),
            timeline=static.timeline,
        )
    spec = o.spec()
    timeline = laid.timeline
    return Plan(
        job=JobInfo(
            name="quickstart",
            spec_sha256="0" * 64,
            scheduler="sha",
            eta=o.eta,
            min_epochs=o.min_epochs,
            max_epochs=o.max_epochs,
            trials=o.trials,
            metric="val_loss",
            mode="min",
        ),
        catalog=CatalogInfo(
            clouds=list(o.catalog_clouds),
            regions=[CLOUDS[cloud]["region"]],
            dates={c: "2025-01-01" for c in o.catalog_clouds},
        ),
        deadline_s=deadline_s,
        confidence=0.95,
        stages=sp,
        predicted=predicted,
        timeline=timeline,
        baselines=baselines,
        planner=PlannerInfo(candidates_evaluated=212, iterations=9, seconds=1.8, samples=1000, seed=seed),
        spec=spec,
    )


@dataclass
class FakeReplanner:
    """Deterministic stand-in for the planner: cheapest level that meets the deadline."""

    cloud: str = "aws"
    spot: bool = False
    catalog_clouds: tuple[str, ...] = ("aws", "gcp")
    samples: int = 200
    calls: list[ReplanRequest] = field(default_factory=list)

    def _p95(self, level: int, cloud: str, spot: bool) -> float:
        return make_plan(level=level, cloud=cloud, spot=spot, samples=0, with_static=False).predicted.jct_s.p95

    def __call__(self, request: ReplanRequest) -> Plan:
        self.calls.append(request)
        cloud = request.cloud or self.cloud
        spot = self.spot if request.spot is None else request.spot
        if cloud not in self.catalog_clouds:
            raise CatalogError(f"cloud {cloud!r} has no catalog; use one of {', '.join(self.catalog_clouds)}")
        deadline = request.deadline_s or 3600.0
        for level in (1, 2, 3):
            if self._p95(level, cloud, spot) <= deadline:
                return make_plan(
                    deadline_s=deadline,
                    level=level,
                    cloud=cloud,
                    spot=spot,
                    samples=self.samples,
                    catalog_clouds=self.catalog_clouds,
                )
        fastest = make_plan(level=3, cloud=cloud, spot=spot, samples=0, with_static=False)
        raise InfeasibleError(
            f"no plan meets {deadline:.0f}s",
            shortest_jct_s=fastest.predicted.jct_s.p95,
            cost_usd=fastest.predicted.cost_usd.mean,
        )
