"""The run's head instance in the planner's predictions: a fixed per-run overhead billed for
boot + JCT + results grace under the head's cloud's billing rule, in every sample, in the chosen
plan and in the static baseline, and the same figure the dry run bills for the same plan."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EXAMPLES
from planner_helpers import ideal_model, itype

from rubberband.catalog import BILLING_RULES, load_catalog
from rubberband.cloud.dryrun import schedule_for
from rubberband.catalog import head_types
from rubberband.plan import parse_plan
from rubberband.planner import HeadSpec, PlanOptions, configs_of, plan_job, simulate_plan
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import CATEGORIES, SimSettings, Simulator
from rubberband.planning import billed_heads
from rubberband.profile import load_profile
from rubberband.spec import load_spec

GPU = itype("gpu1", gpus=1, price=3.6)
LOCAL = itype("cpu1", cloud="local", gpus=1, price=0.05)
HEAD = HeadSpec(cloud="aws", instance_type="m6i.large", price_hr=0.096, grace_s=600.0)


def _noisy_sim(heads=None) -> Simulator:
    model = ideal_model(
        t_iter=0.5, dataset=400, batch=10, sigma=0.3, startup_samples=(40.0, 55.0, 70.0, 90.0), termination=1.0
    )
    return Simulator(sha_stages(9, 3, 1, 9), model, SimSettings(samples=64, seed=3, heads=heads))


PLAN = [StageConfig(GPU, 9, 1), StageConfig(GPU, 3, 1), StageConfig(GPU, 1, 1)]


def test_head_cost_is_price_times_boot_jct_grace_under_the_billing_rule_per_sample():
    bare = _noisy_sim().simulate(PLAN)
    with_head = _noisy_sim({"aws": HEAD}).simulate(PLAN)
    assert np.array_equal(bare.jct, with_head.jct) and np.ptp(bare.jct) > 0  # the head changes no time
    boot = 62.5  # the model's median start-up of the head's cloud (40, 55, 70, 90 s)
    expected = BILLING_RULES["aws"].billed_seconds(boot + bare.jct + 600.0) * 0.096 / 3600
    assert np.allclose(with_head.cost - bare.cost, expected)
    assert np.allclose(with_head.breakdown["head"], expected) and np.all(bare.breakdown["head"] == 0)
    assert set(with_head.breakdown) == set(CATEGORIES)
    assert np.allclose(sum(with_head.breakdown[k] for k in CATEGORIES), with_head.cost)
    assert np.allclose(with_head.by_type["m6i.large"], expected)
    # the stages keep the workers' money only
    assert all(np.array_equal(a, b) for a, b in zip(bare.stage_costs, with_head.stage_costs))
    # an explicit boot replaces the model's; a short run still pays the cloud's 60 s minimum
    fixed = _noisy_sim({"aws": HeadSpec("aws", "m6i.large", 0.096, grace_s=0.0, boot_s=5.0)})
    assert np.allclose(
        fixed.simulate(PLAN).breakdown["head"], BILLING_RULES["aws"].billed_seconds(5.0 + bare.jct) * 0.096 / 3600
    )
    tiny = Simulator(
        sha_stages(1, 3, 1, 1),
        ideal_model(t_iter=0.01, dataset=10, batch=10),
        SimSettings(samples=4, heads={"aws": HeadSpec("aws", "m6i.large", 0.096, grace_s=0.0, boot_s=1.0)}),
    )
    assert np.allclose(tiny.simulate([StageConfig(GPU, 1, 1)]).breakdown["head"], 60 * 0.096 / 3600)


def test_screening_and_prefix_bounds_include_the_head_and_local_plans_have_none():
    sim = _noisy_sim({"aws": HEAD})
    full = sim.simulate(PLAN)
    bound, _ = sim.prefix_bounds(PLAN[:2])
    assert bound <= full.cost_mean  # still a lower bound with the head in it
    assert bound > _noisy_sim().prefix_bounds(PLAN[:2])[0]
    local = [StageConfig(LOCAL, 9, 1), StageConfig(LOCAL, 3, 1), StageConfig(LOCAL, 1, 1)]
    assert sim.head_for(local) is None and np.all(sim.simulate(local).breakdown["head"] == 0)


@pytest.fixture(scope="module")
def quickstart():
    spec = load_spec(EXAMPLES / "quickstart.yaml")
    small = spec.model_copy(update={"scheduler": spec.scheduler.model_copy(update={"trials": 9, "max_epochs": 9})})
    return small, load_profile(spec.profile_path()), load_catalog(["aws"])


def test_plan_job_bills_the_head_in_the_plan_and_the_static_baseline(quickstart):
    spec, profile, catalog = quickstart
    heads = billed_heads("instance", grace_s=300.0)
    plan = plan_job(spec, profile, catalog, PlanOptions(deadline_s=1800, samples=200, seed=1, heads=heads))
    parse_plan(plan.model_dump(mode="json"))
    assert plan.head is not None and plan.head.instance_type == head_types()["aws"].name
    assert plan.head.grace_s == 300.0 and plan.head.price_hr == head_types()["aws"].price_hr
    model = fit_performance_model(profile)
    assert plan.head.boot_s == pytest.approx(model.startup("aws", "m6i.large").quantile(0.5))
    # the chosen plan re-simulated without a head: the difference is exactly the head, per sample
    stages, configs = configs_of(plan, catalog)
    bare = Simulator(stages, model, SimSettings(samples=200, seed=1)).simulate(configs)
    head_usd = BILLING_RULES["aws"].billed_seconds(plan.head.boot_s + bare.jct + 300.0) * plan.head.price_hr / 3600
    assert plan.predicted.cost_usd.mean == pytest.approx(bare.cost_mean + head_usd.mean())
    assert plan.predicted.cost_breakdown.head_usd == pytest.approx(head_usd.mean())
    assert plan.predicted.cost_by_instance_type["m6i.large"] == pytest.approx(head_usd.mean())
    static = plan.baselines["static"].predicted
    assert static.cost_breakdown.head_usd > 0 and static.cost_usd.mean >= plan.predicted.cost_usd.mean - 1e-9
    # re-simulating the plan keeps its head; a plan without heads has none
    again = simulate_plan(plan, profile, catalog, samples=200)
    assert again.predicted.cost_usd.mean == pytest.approx(plan.predicted.cost_usd.mean)
    plain = plan_job(spec, profile, catalog, PlanOptions(deadline_s=1800, samples=200, seed=1))
    assert plain.head is None and plain.predicted.cost_breakdown.head_usd == 0


def test_dry_run_and_plan_bill_the_same_head(quickstart):
    spec, profile, catalog = quickstart
    plan = plan_job(spec, profile, catalog, PlanOptions(deadline_s=1800, samples=200, seed=2, heads=billed_heads()))
    (head,) = [s for s in schedule_for(plan, catalog) if s.role == "head"]
    assert head.instance_type == plan.head.instance_type and head.request_at_s == -plan.head.boot_s
    end = max(i.released_s for i in plan.timeline.instances)
    assert head.release_at_s == pytest.approx(end + plan.head.grace_s)
    # the dry run bills the representative (median-JCT) sample, the planner every sample: the same rule
    h = plan.head
    assert head.cost_usd == pytest.approx(
        BILLING_RULES["aws"].cost(h.boot_s + plan.predicted.jct_s.p50 + h.grace_s, h.price_hr),
        abs=5 * h.price_hr / 3600,
    )
    assert head.cost_usd == pytest.approx(plan.predicted.cost_breakdown.head_usd, rel=0.01)
