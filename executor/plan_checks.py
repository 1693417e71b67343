"""Whether a plan runs a spec's schedule, and the trials a run proposes first.

Both are asked before anything starts (``rubberband run`` checks a plan file against its spec), so they live
apart from the loop.
"""

from __future__ import annotations

from typing import Any

from rubberband.errors import PlanFileError
from rubberband.plan import Plan
from rubberband.planner.schedule import stages_for
from rubberband.search import make_config_source, trial_id_for
from rubberband.spec import JobSpec


def check_plan_matches(spec: JobSpec, plan: Plan, *, source: str = "plan") -> None:
    """The plan must run exactly the spec's schedule (same stages, trials and epochs) and optimise its metric."""
    sched = spec.scheduler
    expected = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    got = [(s.bracket, s.stage, s.trials, s.epochs, s.epochs_this_stage) for s in plan.stages]
    want = [(s.bracket, s.index, s.trials, s.epochs, s.epochs_this_stage) for s in expected]
    if got != want:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise PlanFileError(
                    f"{source}: stage {i} runs {g[2]} trials to {g[3]} epochs but the spec's "
                    f"{sched.kind} schedule needs {w[2]} trials to {w[3]} epochs; "
                    f"re-plan with `rubberband plan`"
                )
        raise PlanFileError(
            f"{source}: has {len(got)} stages but the spec's {sched.kind} schedule has "
            f"{len(want)}; re-plan with `rubberband plan`"
        )
    if plan.job.metric != spec.metric.name or plan.job.mode != spec.metric.mode:
        raise PlanFileError(
            f"{source}: plan optimises {plan.job.metric} ({plan.job.mode}) but the spec's "
            f"metric is {spec.metric.name} ({spec.metric.mode}); re-plan with `rubberband plan`"
        )
    _check_resources(spec, plan, source)


def _check_resources(spec: JobSpec, plan: Plan, source: str) -> None:
    """Every stage runs where the spec allows (its clouds, regions and instance types, the spot fall-backs'
    types too) and on no more instances than the plan's largest stage can use (its trials times their workers): a
    plan made for another spec, or edited by hand, must not start instances the spec rules out, nor a billion."""
    res = spec.resources
    # a static cluster holds the largest stage's instances through the later ones: no stage needs more than that
    useful = max((s.trials * s.workers_per_trial for s in plan.stages), default=0)
    for i, stage in enumerate(plan.stages):
        where = f"{source}: stage {i} ({stage.instances} × {stage.instance_type}, {stage.cloud} {stage.region})"
        if stage.cloud not in res.clouds:
            raise PlanFileError(
                f"{where} runs on {stage.cloud}, which the spec's resources.clouds ({', '.join(res.clouds)}) does "
                f"not allow; re-plan with `rubberband plan`"
            )
        if res.regions and stage.region not in res.regions:
            raise PlanFileError(
                f"{where} runs in {stage.region}, which the spec's resources.regions ({', '.join(res.regions)}) "
                f"does not allow; re-plan with `rubberband plan`"
            )
        allowed = res.instance_types
        for name in filter(None, (stage.instance_type, stage.fallback_instance_type)):
            if allowed and name not in allowed:
                raise PlanFileError(
                    f"{where} uses {name}, which the spec's resources.instance_types ({', '.join(allowed)}) does "
                    f"not allow; re-plan with `rubberband plan`"
                )
        if not plan.is_asha and stage.instances > useful:
            raise PlanFileError(
                f"{where} asks for more instances than the plan's largest stage can use ({useful}: its trials "
                f"times their workers); re-plan with `rubberband plan`"
            )


def trial_configs(spec: JobSpec, plan: Plan) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(trial id, bracket, index, config) of every trial a run proposes when no rung result has come in.

    What a run creates with the default random search (fixed configurations first, then seeded samples); a
    ``tpe`` run asks as its trials start, after the results so far, so only its first asks are these.
    """
    source = make_config_source(spec)
    out = []
    for stage in plan.stages:
        if stage.stage != 0:
            continue
        for i in range(stage.trials):
            trial_id = trial_id_for(stage.bracket, i)
            out.append((trial_id, stage.bracket, i, {**spec.config, **source.propose(trial_id)}))
    return out
