"""The seams the executor is built on: how it launches trials and how it re-plans.

* :class:`TrialRuntime` wraps a trial-runtime module that defines ``TrialSpec`` and
  ``TrialRun`` as in docs/training-api.md, "The runtime underneath" (``rubberband.executor.trials`` by default; tests
  pass their own small one). Swapping runtimes is one name.
* :data:`Replanner` is any callable taking a :class:`ReplanRequest` and returning a plan for
  the remaining stages (or ``None``), or a :class:`ReplanAnswer` (that plan plus the current plan's
  outlook under the same model); :func:`planner_replanner` adapts
  ``rubberband.planner.plan_stages`` when the planner is installed.
"""

from __future__ import annotations

import importlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rubberband.errors import InputError
from rubberband.executor.survivors import TrialTimes
from rubberband.plan import Plan
from rubberband.spec import JobSpec

DEFAULT_TRIAL_RUNTIME = "rubberband.executor.trials"


def check_module_name(value: str) -> str:
    """A trial runtime's module name as passed in (a dotted Python name); InputError for anything else. Whether
    it imports is :meth:`TrialRuntime.load`'s to say."""
    name = value.strip()
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise InputError(f"trial runtime {value!r} is not a module name (dotted, like {DEFAULT_TRIAL_RUNTIME})")
    return name


class TrialHandle(Protocol):
    """What ``TrialRun.start`` returns (docs/training-api.md, "The runtime underneath")."""

    done_ref: Any

    def result(self, timeout_s: float | None = None) -> Any: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class TrialRuntime:
    """A trial runtime: its ``TrialSpec`` dataclass and its ``TrialRun`` class."""

    spec_cls: Any
    run_cls: Any
    module: str = ""

    @classmethod
    def load(cls, module: str = DEFAULT_TRIAL_RUNTIME) -> "TrialRuntime":
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise InputError(
                f"trial runtime module {module!r} cannot be imported ({exc}); "
                f"install rubberband with its executor.trials module"
            ) from None
        try:
            return cls(spec_cls=mod.TrialSpec, run_cls=mod.TrialRun, module=module)
        except AttributeError:
            raise InputError(f"trial runtime module {module!r} lacks TrialSpec or TrialRun") from None

    def start(self, *, event_sink: Any = None, pool: Any = None, **spec_fields: Any) -> TrialHandle:
        """Start a trial; with ``pool`` (a WorkerPool) its workers are warm processes reused across trials."""
        extra = {"pool": pool} if pool is not None else {}
        return self.run_cls.start(self.spec_cls(**spec_fields), event_sink=event_sink, **extra)


@dataclass(frozen=True)
class ReplanRequest:
    """What the executor knows at a stage boundary, for re-planning the stages after it.

    ``next_stage`` is the index (in ``plan.stages``) of the first stage not yet run;
    ``epoch_seconds`` maps ``"<instance type>/<workers per trial>"`` to measured epoch
    times; ``iteration_latencies`` maps ``"<device>/<workers>/<nodes>"`` to rank 0's measured
    iteration latencies (the profile's shape); ``startup_s`` maps an instance type to measured
    request→ready latencies; ``running`` maps an instance type key (``cloud:region:name``) to how
    many instances of it are up and kept for the next stage; ``unavailable`` lists the type keys
    the run's failover found sold out in every zone (or without quota): a plan must not use them.

    Parallel brackets (:func:`~rubberband.planner.brackets.parallel_remainder`): ``stages`` lists the
    plan positions to re-plan, bracket by bracket, the bracket at its boundary first (empty: every
    stage from ``next_stage`` on, one after another), and ``offsets_s`` when each of those brackets'
    next stage can start, in seconds from now (its running stage's remaining time, or its start
    offset); the proposal's stages come in the order of ``stages``. ``bracket_running``: per bracket of
    ``offsets_s``, what ``running`` is for the first: the instances (type key → count) up or coming for
    that bracket's next stage, its current stage's included (they carry over when it keeps their type).
    ``survivors``: per bracket of the remaining work, the trials its next stage will run, best ranked first, with
    their measured epochs (:func:`~rubberband.executor.survivors.measured_survivors`): the prediction plays them
    at their own speeds rather than drawing survivors from the population.
    """

    spec: JobSpec
    plan: Plan
    next_stage: int
    elapsed_s: float
    spent_usd: float
    remaining_deadline_s: float
    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)
    setup_seconds: list[float] = field(default_factory=list)
    startup_s: dict[str, list[float]] = field(default_factory=dict)
    at_risk: bool = False
    iteration_latencies: dict[str, list[float]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    unavailable: tuple[str, ...] = ()
    stages: tuple[int, ...] = ()
    offsets_s: tuple[float, ...] = ()
    bracket_running: tuple[dict[str, int], ...] = ()
    survivors: dict[int, tuple[TrialTimes, ...]] = field(default_factory=dict)

    def positions(self) -> list[int]:
        """Plan positions of the stages to re-plan, in the order a proposal gives them."""
        return list(self.stages) if self.stages else list(range(self.next_stage, len(self.plan.stages)))


#: A late run's re-plan targets the shortest feasible JCT plus this share (the cheapest plan that quick).
QUICKEST_SLACK = 1.02


@dataclass(frozen=True)
class ReplanAnswer:
    """A re-planner's answer: its proposal (or None) and how the current plan's remaining stages look under
    the same re-fitted model (None when it did not simulate them: the executor then judges the current plan
    by its stage predictions scaled by the slowdown so far)."""

    proposal: "Plan | None"
    current_p_meet: float | None = None
    current_jct_p50_s: float | None = None
    current_cost_usd: float | None = None


#: Returns a plan whose ``stages`` are the remaining stages (same trials and epochs, possibly other
#: instances), with predictions for the remaining part under ``remaining_deadline_s``; or None. When
#: the deadline is at risk and out of reach it may return the quickest plan, which then misses it. It may
#: also return a :class:`ReplanAnswer`, adding the current plan's outlook.
Replanner = Callable[[ReplanRequest], "Plan | ReplanAnswer | None"]


def profile_with_measurements(profile: Any, request: ReplanRequest, *, keep: int = 500, latencies: bool = True) -> Any:
    """The profile plus what this run measured (iteration latencies, instance startups), for re-fitting.

    ``latencies``: False leaves the run's iteration latencies out of the device fit. Where configurations differ
    in speed, a stage's latencies measure which configurations it ran as much as its shape: a later stage runs
    the survivors (the slow ones, where slow configurations score best) at another worker count, and folding them
    in makes that shape look slow; each survivor's own measured speed (``known_trials``) carries the run's truth.
    """
    from rubberband.profile import LatencyMeasurement, StartupSamples

    measurements = list(profile.measurements)
    for key, latencies_s in (request.iteration_latencies if latencies else {}).items():
        device, workers, nodes = key.split("/")
        if latencies_s and int(nodes) <= int(workers):
            measurements.append(
                LatencyMeasurement(
                    device=device,
                    workers=int(workers),
                    nodes=int(nodes),
                    iteration_latencies_s=latencies_s[-keep:],
                    source="measured",
                )
            )
    startup = list(profile.startup)
    for name, samples in request.startup_s.items():
        if samples:
            cloud = request.plan.stages[0].cloud
            startup.append(StartupSamples(cloud=cloud, instance_type=name, samples_s=samples, source="measured"))
    return profile.model_copy(update={"measurements": measurements, "startup": startup})


def known_trials(model: Any, survivors: dict[int, tuple[TrialTimes, ...]]) -> dict[int, Any]:
    """Per bracket, its measured survivors' speeds relative to ``model`` (the re-fitted one), best ranked first:
    each trial's median log ratio of a measured epoch to the model's epoch at that shape (its iterations plus the
    per-epoch overhead, as the profile's configurations are compared), over the epochs it has. Epochs on a device
    the model cannot time are skipped; a bracket with no such trial is left out."""
    from rubberband.planner.noise import KnownTrials

    out: dict[int, Any] = {}
    for bracket, trials in survivors.items():
        speeds, counts = [], []
        for trial in trials:
            logs = [
                math.log(e.seconds / predicted)
                for e in trial.epochs
                if model.plannable(e.device)
                and (predicted := model.epoch_time(e.device, e.workers, e.nodes) + model.epoch_overhead_s) > 0
            ]
            if not logs:
                break  # the order matters: a gap would shift the trials after it to the wrong ranks
            speeds.append(statistics.median(logs))
            counts.append(len(logs))
        if speeds:
            out[bracket] = KnownTrials(tuple(speeds), tuple(counts), model.straggler_sigma)
    return out


def planner_replanner(catalog: Any, profile: Any) -> Replanner | None:
    """Re-plan the remaining stages with ``rubberband.planner.plan_stages`` (None without the planner).

    The performance model is re-fitted from the profile plus the latencies measured so far, and
    the instances kept for the next stage are passed as already running. The answer carries the
    current plan's outlook under that model (P(meet), median time left, cost) and the cheapest plan
    that meets the remaining deadline at the spec's confidence; when no plan does any more, the
    cheapest plan that finishes soonest (at the shortest feasible JCT). The executor's
    :class:`~rubberband.planner.policies.LatenessPolicy` decides what to do with them.
    """
    try:
        from rubberband.planner import (
            BracketSetup,
            Goal,
            ParallelSimulator,
            PlanSpace,
            RunningState,
            SearchOptions,
            SimSettings,
            Simulator,
            allowed_types,
            configs_of,
            fit_performance_model,
            plan_stages,
            prediction,
            stage_plans,
        )
        from rubberband.planner.schedule import Stage
    except (ImportError, AttributeError):
        return None
    from rubberband.errors import InfeasibleError

    def replan(request: ReplanRequest) -> ReplanAnswer:
        spec = request.spec
        # configurations that differ in speed: the survivors' own speeds, not a re-fitted shape, carry the run
        spread = fit_performance_model(profile).variation.config_sigma > 0 and bool(request.survivors)
        model = fit_performance_model(profile_with_measurements(profile, request, latencies=not spread))
        rest = [request.plan.stages[i] for i in request.positions()]
        stages = [Stage(s.bracket, s.stage, s.trials, s.epochs, s.epochs_this_stage) for s in rest]
        # parallel brackets: each bracket's rest starts at its own offset from now (the first's at once)
        parallel = bool(request.offsets_s) and len(request.offsets_s) > 1

        def state(counts: dict[str, int]) -> RunningState:
            """Mid-run, "now" is time 0 and nothing waits for a head (an empty key: nothing of any type runs)."""
            if not counts:
                return RunningState(instance_type_key="", instances=0)
            key, count = max(counts.items(), key=lambda item: item[1])
            return RunningState(instance_type_key=key, instances=count)

        running = state(request.running)
        per_bracket = None
        if parallel:  # every bracket's next stage may keep what runs for it; none of them waits for a head
            counts = list(request.bracket_running) or [request.running]
            per_bracket = [running] + [state(c) for c in counts[1:]]
            per_bracket += [state({})] * (len(request.offsets_s) - len(per_bracket))
        deadline_s = request.remaining_deadline_s
        settings = SimSettings(
            seed=spec.seed,
            spot=spec.resources.spot,
            start_state=running,
            known_trials=known_trials(model, request.survivors) or None,
        )
        brackets = BracketSetup(offsets=request.offsets_s, states=per_bracket) if parallel else None
        current = None
        try:
            _, configs = configs_of(request.plan.model_copy(update={"stages": rest}), catalog)
            sim = (
                ParallelSimulator(stages, model, settings, brackets) if parallel else Simulator(stages, model, settings)
            )
            current = sim.simulate(configs)
        except Exception:  # noqa: BLE001 - a type left the catalog: judge the current plan by the slowdown
            current = None
        figures = (
            {}
            if current is None
            else dict(
                current_p_meet=current.p_meet(deadline_s),
                current_jct_p50_s=current.jct_quantile(0.5),
                current_cost_usd=current.cost_mean,
            )
        )
        types = [t for t in allowed_types(catalog, spec) if t.key not in request.unavailable]
        if not types:
            return ReplanAnswer(None, **figures)
        space = PlanSpace(stages, types, model, spec.resources.max_workers_per_trial)
        options = SearchOptions(brackets=brackets)
        try:
            out = plan_stages(space, Goal(deadline_s, spec.confidence), settings, options)
        except InfeasibleError as exc:
            if exc.shortest_jct_s is None:
                return ReplanAnswer(None, **figures)
            # out of reach: the quickest plan (the policy takes it only when it makes the run clearly less late)
            out = plan_stages(space, Goal(exc.shortest_jct_s * QUICKEST_SLACK, spec.confidence), settings, options)
        proposal = request.plan.model_copy(
            update={
                "stages": stage_plans(stages, out.configs, out.result, model, settings),
                "predicted": prediction(out.result, deadline_s),
            }
        )
        return ReplanAnswer(proposal, **figures)

    return replan
