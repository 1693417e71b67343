"""The seams the controller is built on: how it launches trials and how it re-plans.

* :class:`TrialRuntime` wraps a trial-runtime module that defines ``TrialSpec`` and
  ``TrialRun`` as in CONTRACT_TRIALS.md (``rubberband.executor.trials`` by default; tests
  pass their own small one). Swapping runtimes is one name.
* :data:`Replanner` is any callable taking a :class:`ReplanRequest` and returning a plan for
  the remaining stages (or ``None``); :func:`planner_replanner` adapts
  ``rubberband.planner.plan_stages`` when the planner is installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rubberband.errors import InputError
from rubberband.plan import Plan
from rubberband.spec import JobSpec

DEFAULT_TRIAL_RUNTIME = "rubberband.executor.trials"


class TrialHandle(Protocol):
    """What ``TrialRun.start`` returns (CONTRACT_TRIALS.md)."""

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
            raise InputError(f"trial runtime module {module!r} cannot be imported ({exc}); "
                             f"install rubberband with its executor.trials module") from None
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


#: A late run's re-plan targets the shortest feasible JCT plus this share (the cheapest plan that quick).
QUICKEST_SLACK = 1.02
#: A late proposal must finish at least this share sooner than the current plan (median JCT) to be taken.
LATE_GAIN = 0.05

#: Returns a plan whose ``stages`` are the remaining stages (same trials and epochs, possibly other
#: instances), with predictions for the remaining part under ``remaining_deadline_s``; or None. When
#: the deadline is at risk and out of reach it may return the quickest plan, which then misses it.
Replanner = Callable[[ReplanRequest], "Plan | None"]


def profile_with_measurements(profile: Any, request: ReplanRequest, *, keep: int = 500) -> Any:
    """The profile plus what this run measured (iteration latencies, instance startups), for re-fitting."""
    from rubberband.profile import LatencyMeasurement, StartupSamples

    measurements = list(profile.measurements)
    for key, latencies in request.iteration_latencies.items():
        device, workers, nodes = key.split("/")
        if latencies and int(nodes) <= int(workers):
            measurements.append(LatencyMeasurement(device=device, workers=int(workers), nodes=int(nodes),
                                                   iteration_latencies_s=latencies[-keep:], source="measured"))
    startup = list(profile.startup)
    for name, samples in request.startup_s.items():
        if samples:
            cloud = request.plan.stages[0].cloud
            startup.append(StartupSamples(cloud=cloud, instance_type=name, samples_s=samples, source="measured"))
    return profile.model_copy(update={"measurements": measurements, "startup": startup})


def planner_replanner(catalog: Any, profile: Any) -> Replanner | None:
    """Re-plan the remaining stages with ``rubberband.planner.plan_stages`` (None without the planner).

    The performance model is re-fitted from the profile plus the latencies measured so far, and
    the instances kept for the next stage are passed as already running. When the deadline is at
    risk and no plan meets it any more, the proposal is the cheapest plan that finishes soonest
    (at the shortest feasible JCT), as long as it finishes sooner than the current plan would.
    """
    try:
        from rubberband.planner import (RunningState, Simulator, allowed_types, configs_of,
                                        fit_performance_model, plan_stages, prediction, stage_plans)
        from rubberband.planner.schedule import Stage
    except (ImportError, AttributeError):
        return None
    from rubberband.errors import InfeasibleError

    def replan(request: ReplanRequest) -> Plan | None:
        spec = request.spec
        model = fit_performance_model(profile_with_measurements(profile, request))
        rest = request.plan.stages[request.next_stage:]
        stages = [Stage(s.bracket, s.stage, s.trials, s.epochs, s.epochs_this_stage) for s in rest]
        running = None
        if request.running:
            key, count = max(request.running.items(), key=lambda item: item[1])
            running = RunningState(instance_type_key=key, instances=count)
        types = [t for t in allowed_types(catalog, spec) if t.key not in request.unavailable]
        if not types:
            return None
        options = dict(confidence=spec.confidence, max_workers_per_trial=spec.resources.max_workers_per_trial,
                       spot=spec.resources.spot, seed=spec.seed, running=running)
        try:
            out = plan_stages(stages, model, types, deadline_s=request.remaining_deadline_s, **options)
        except InfeasibleError as exc:
            if not request.at_risk or exc.shortest_jct_s is None:
                raise
            # out of reach: be as little late as possible, if that is sooner than the current plan
            out = plan_stages(stages, model, types, deadline_s=exc.shortest_jct_s * QUICKEST_SLACK, **options)
            _, current = configs_of(request.plan.model_copy(update={"stages": rest}), catalog)
            now = Simulator(stages, model, seed=spec.seed, spot=spec.resources.spot, start_state=running)
            current_s, quickest_s = now.simulate(current).jct_quantile(0.5), out.result.jct_quantile(0.5)
            if quickest_s >= current_s * (1 - LATE_GAIN):
                raise InfeasibleError(f"{exc}; the current plan (p50 {current_s:.0f} s) is about as quick as "
                                      f"any (p50 {quickest_s:.0f} s)") from None
        return request.plan.model_copy(update={
            "stages": stage_plans(stages, out.configs, out.result, spec.resources.spot),
            "predicted": prediction(out.result, request.remaining_deadline_s)})

    return replan
