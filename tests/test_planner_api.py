import pytest

from rubberband.catalog import load_catalog
from rubberband.plan import parse_plan
from rubberband.planner import (
    Goal,
    PlanOptions,
    PlanSpace,
    RunningState,
    SimSettings,
    plan_job,
    plan_stages,
    simulate_plan,
)
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.profile import load_profile
from rubberband.spec import load_spec
from conftest import EXAMPLES


@pytest.fixture(scope="module")
def inputs():
    spec = load_spec(EXAMPLES / "quickstart.yaml")
    return spec, load_profile(spec.profile_path()), load_catalog(["aws"])


def test_plan_job_fills_the_plan_and_resimulates_identically(inputs):
    spec, profile, catalog = inputs
    small = spec.model_copy(update={"scheduler": spec.scheduler.model_copy(update={"trials": 9, "max_epochs": 9})})
    plan = plan_job(small, profile, catalog, PlanOptions(deadline_s=1800, samples=200, seed=5, include_exact=True))
    parse_plan(plan.model_dump(mode="json"))  # valid against the shared schema
    assert plan.planner.samples == 200 and plan.planner.seed == 5 and plan.planner.iterations >= 1
    assert plan.predicted.p_meet_deadline >= plan.confidence
    assert plan.baselines["exact"].predicted.cost_usd.mean <= plan.predicted.cost_usd.mean + 1e-9
    assert plan.baselines["static"].predicted.cost_usd.mean >= plan.predicted.cost_usd.mean - 1e-9
    assert plan.spec["name"] == spec.name and plan.job.trials == 9
    again = simulate_plan(plan, profile, catalog, samples=200)
    assert again.predicted.cost_usd.mean == pytest.approx(plan.predicted.cost_usd.mean)
    assert again.predicted.jct_s.p95 == pytest.approx(plan.predicted.jct_s.p95)
    assert len(again.timeline.tasks) == sum(s.trials for s in plan.stages)


def test_cloud_any_and_hyperband_plan(inputs):
    spec = load_spec(EXAMPLES / "mixed.yaml")
    profile = load_profile(spec.profile_path())
    plan = plan_job(spec, profile, load_catalog(["aws", "gcp"]), PlanOptions(cloud="any", samples=100))
    assert plan.job.scheduler == "hyperband"
    assert [(s.bracket, s.stage) for s in plan.stages][:2] == [(0, 0), (0, 1)]
    assert len(plan.stages) == 10 and set(plan.catalog.clouds) == {"aws", "gcp"}


def test_replanning_remaining_stages_reuses_running_instances(inputs):
    _, profile, catalog = inputs
    model = fit_performance_model(profile)
    types = [catalog.find("p3.2xlarge")]
    remaining = sha_stages(81, 3, 1, 27)[2:]  # 9 trials then 3, mid-run
    fresh = plan_stages(PlanSpace(remaining, types, model, 1), Goal(3000, 0.9), SimSettings(samples=200))
    running = plan_stages(
        PlanSpace(remaining, types, model, 1),
        Goal(3000, 0.9),
        SimSettings(samples=200, start_state=RunningState(instance_type_key=types[0].key, instances=9)),
    )
    # instances already up: no start-up wait or cost for them
    assert running.result.breakdown["startup"].mean() < fresh.result.breakdown["startup"].mean()
    # the planner minimises cost under the deadline: instances already up can only make it cheaper
    assert running.result.cost_mean <= fresh.result.cost_mean
    assert running.result.p_meet(3000) >= 0.9 and fresh.result.p_meet(3000) >= 0.9


def test_the_shortest_feasible_jct_of_an_infeasible_deadline_is_feasible_on_serial_local_nodes():
    """On the local backend nodes start one after another, so the widest plan is far from the quickest."""
    from rubberband.errors import InfeasibleError

    spec = load_spec(EXAMPLES / "sha_local.yaml")
    profile, catalog = load_profile(spec.profile_path()), load_catalog(["local"])
    with pytest.raises(InfeasibleError) as info:
        plan_job(spec, profile, catalog, PlanOptions(deadline_s=10, samples=200))
    shortest = info.value.shortest_jct_s
    plan = plan_job(spec, profile, catalog, PlanOptions(deadline_s=shortest * 1.02, samples=200))
    assert plan.predicted.p_meet_deadline >= plan.confidence
    assert plan.predicted.jct_s.p95 <= shortest * 1.3  # the bound is near what the planner then achieves
