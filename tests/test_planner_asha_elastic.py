"""Elastic ASHA: the phase rule's releases, their bills, the phase search and ``kind: asha`` planned as a Plan."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from conftest import EXAMPLES
from planner_helpers import ideal_model, itype
from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError, PlanFileError, SpecError
from rubberband.plan import parse_plan, plan_json
from rubberband.planner.job import PlanOptions, plan_job
from rubberband.planner.replay import replay_plan
from rubberband.planner.asha_plan import asha_phase_policy, replay_asha_plan
from rubberband.planner.asha import (
    AshaCluster,
    AshaPhases,
    AshaSchedule,
    AshaSettings,
    AshaSimulator,
    TrialStarts,
    asha_baseline,
    elastic_asha,
    phase_releases,
    shrink_phases,
)
from rubberband.planner.policies import AshaPhasePolicy
from rubberband.planner.schedule import asha_stages
from rubberband.profile import load_profile
from rubberband.spec import JobSpec, parse_spec

GPU1 = itype("gpu1", gpus=1, price=3.6)
GPU4 = itype("gpu4", gpus=4, price=14.4)
QUICKSTART_TYPES = ("p3.2xlarge", "g4dn.xlarge", "g5.xlarge")


def _closed_form_sim() -> AshaSimulator:
    """9 one-slot trials, η=3, rungs 1, 3, 9 epochs of 50 s each, start-up 30 s, evaluation 5 s, termination 10 s;
    the first trial is the best and every other one stops at rung 0 (each below the one before it)."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, eval_s=5.0, termination=10.0)
    sim = AshaSimulator(model, AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9), AshaSettings(samples=4))
    sim.set_qualities(np.arange(9, dtype=float)[::-1])
    return sim


def test_phases_release_idle_instances_first_idle_first_and_bill_each_until_then():
    """Trial 0 alone goes on: phase 1 (no trial below rung 1) begins when rung 0's results come in at
    30 + 50 + 5 = 85 s, phase 2 when trial 0 reports rung 1 at 85 + 100 + 5 = 190 s; the JCT is 190 + 300 + 5."""
    sim = _closed_form_sim()
    price = 3.6 / 3600
    jct = 495.0
    fixed = sim.simulate(AshaCluster(GPU1, 9, 1))
    assert np.allclose(fixed.jct, jct) and np.allclose(fixed.cost, 9 * (jct + 10) * price)
    assert np.allclose(fixed.phase_durations, [85.0, 105.0, 305.0])
    # (9, 1, 1): the eight idle instances go at 85 s, trial 0's stays to the end
    shrunk = sim.simulate(AshaPhases(GPU1, (9, 1, 1), 1))
    assert np.array_equal(shrunk.jct, fixed.jct) and np.array_equal(shrunk.promotions, fixed.promotions)
    assert np.allclose(shrunk.cost, ((jct + 10) + 8 * (85 + 10)) * price)
    # phase costs: each instance's bill shared by its life in each phase
    kept = (jct + 10) * price
    assert np.allclose(
        shrunk.phase_costs[0], [kept * 85 / 505 + 8 * 85 * price, kept * 105 / 505 + 8 * 10 * price, kept * 315 / 505]
    )
    # (9, 3, 1): six go at 85 s (the first idle first, ties by index), two more when phase 2 begins at 190 s
    stepped = sim.simulate(AshaPhases(GPU1, (9, 3, 1), 1))
    assert np.allclose(stepped.cost, ((jct + 10) + 6 * (85 + 10) + 2 * (190 + 10)) * price)
    timeline = sim.timeline(AshaPhases(GPU1, (9, 3, 1), 1), 0)
    released = {i.id: i.released_s for i in timeline.instances}
    assert released == {"i0": jct, **{f"i{k}": 85.0 for k in range(1, 7)}, "i7": 190.0, "i8": 190.0}
    assert [i.last_stage for i in timeline.instances] == [2] + [0] * 6 + [1, 1]
    assert sorted((t.trial, t.stage) for t in timeline.tasks) == [(0, 0), (0, 1), (0, 2)] + [
        (k, 0) for k in range(1, 9)
    ]
    assert sum(i.cost_usd for i in timeline.instances) == pytest.approx(stepped.cost[0])


def _reference_releases(idle_from: np.ndarray, bounds: np.ndarray, counts: tuple[int, ...]) -> np.ndarray:
    """The rule as AshaPhasePolicy states it, event by event: at each moment an instance goes idle or a phase
    begins, release idle instances (the first idle first) while the phase has a surplus."""
    policy = AshaPhasePolicy(counts)
    peak = len(idle_from)
    release = np.full(peak, np.inf)
    for t in sorted(set(idle_from) | set(bounds[1:])):
        phase = max((k for k in range(len(counts)) if bounds[k] <= t), default=0)
        idle = sorted((idle_from[i], i) for i in range(peak) if idle_from[i] <= t and release[i] == np.inf)
        alive = int(np.count_nonzero(release == np.inf))
        for _, i in idle[: policy.surplus(phase, alive)]:
            release[i] = t
    return release


def test_releases_follow_the_policy_event_by_event():
    rng = np.random.default_rng(7)
    for _ in range(200):
        peak, phases = int(rng.integers(1, 9)), int(rng.integers(1, 5))
        counts = tuple(sorted((int(x) for x in rng.integers(1, peak + 1, phases - 1)), reverse=True))
        counts = (peak, *counts)
        bounds = np.concatenate([[0.0], np.sort(rng.uniform(0, 100, phases - 1))])
        idle_from = rng.uniform(0, 120, peak)
        got = phase_releases(idle_from[None, :], bounds[None, :], counts)[0]
        assert np.array_equal(got, _reference_releases(idle_from, bounds, counts)), (counts, bounds, idle_from)


def test_shrinking_never_costs_more_than_the_same_fixed_cluster_and_keeps_its_jct():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.2, termination=10.0, eval_s=2.0)
    sim = AshaSimulator(
        model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=60, seed=4)
    )
    for cluster in (AshaCluster(GPU1, 9, 1), AshaCluster(GPU4, 3, 2), AshaCluster(GPU4, 4, 8)):
        fixed = sim.simulate(cluster)
        assert fixed.phases == (cluster.instances,) * 4
        assert np.allclose(fixed.phase_costs.sum(axis=1), fixed.cost - fixed.breakdown["head"])
        assert np.allclose(fixed.phase_durations.sum(axis=1), fixed.jct)
        loose = fixed.jct_quantile(0.9) * 2
        found, billed, steps = shrink_phases(sim, cluster, loose, 0.9)
        counts = found.phases
        assert counts[0] == cluster.instances and list(counts) == sorted(counts, reverse=True)
        assert billed > 1 and steps >= 1 and found.meets(loose, 0.9)
        # the same draws: the same run, every sample at most as dear and the mean strictly cheaper
        assert np.array_equal(found.jct, fixed.jct) and found.jct_quantile(0.9) == fixed.jct_quantile(0.9)
        assert np.all(found.cost <= fixed.cost + 1e-12) and found.cost_mean < fixed.cost_mean
        for counts in ((cluster.instances, cluster.instances, 1, 1), (cluster.instances,) + (2,) * 3):
            other = sim.simulate(AshaPhases(cluster.instance_type, counts, cluster.workers))
            assert np.all(other.cost <= fixed.cost + 1e-12) and np.array_equal(other.jct, fixed.jct)


def test_a_fixed_cluster_as_phases_is_todays_fixed_cluster():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.2, task_start=3.0)
    sim = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=30, starts=lambda _: TrialStarts(2.0)),
    )
    cluster = AshaCluster(GPU4, 2, 1)
    a, b = sim.simulate(cluster), sim.simulate(AshaPhases.fixed(cluster, 3))
    assert np.array_equal(a.jct, b.jct) and np.array_equal(a.cost, b.cost)
    for key in a.breakdown:
        assert np.array_equal(a.breakdown[key], b.breakdown[key])


def test_phase_counts_are_validated():
    with pytest.raises(ValueError, match="must not grow"):
        AshaPhases(GPU1, (3, 4, 1), 1)
    with pytest.raises(ValueError):
        AshaPhases(GPU1, (3, 0), 1)
    sim = _closed_form_sim()
    with pytest.raises(ValueError, match="one instance count per rung"):
        sim.simulate(AshaPhases(GPU1, (9, 1), 1))
    trace = sim.trace(AshaCluster(GPU1, 9, 1))
    with pytest.raises(ValueError, match="not on"):
        sim.bill(trace, AshaPhases(GPU1, (8, 1, 1), 1))


def test_the_elastic_search_is_never_costlier_than_the_fixed_baseline():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.1, termination=5.0)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=60))
    wide = sim.simulate(AshaCluster(GPU1, 27, 1))
    deadline = wide.jct_quantile(0.9) * 1.5
    found = elastic_asha(sim, [GPU1, GPU4], 4, deadline, 0.9)
    base, meets = asha_baseline(sim, [GPU1, GPU4], 4, deadline, 0.9)
    assert meets and found.fixed is not None and found.elastic is not None
    assert found.fixed.cluster == base.cluster and np.array_equal(found.fixed.cost, base.cost)
    assert found.elastic.meets(deadline, 0.9) and found.elastic.cost_mean < base.cost_mean
    assert found.candidates > 0 and found.quickest is None
    late = elastic_asha(sim, [GPU1], 1, 60.0, 0.9)
    assert late.elastic is None and late.quickest is not None and late.quickest.cluster.instances == 27
    assert late.quickest_elastic.cost_mean <= late.quickest.cost_mean


# -- kind: asha planned as a Plan ------------------------------------------------------------------------------


def _asha_spec(deadline: float | str = "40m", **scheduler) -> JobSpec:
    data = {
        "name": "asha-job",
        "train": "m:f",
        "metric": {"name": "val_acc", "mode": "max"},
        "search_space": {"lr": {"type": "loguniform", "low": 0.001, "high": 0.3}},
        "scheduler": {"kind": "asha", "trials": 27, "eta": 3, "min_epochs": 1, "max_epochs": 9, **scheduler},
        "deadline": deadline,
        "resources": {"clouds": ["aws"], "instance_types": list(QUICKSTART_TYPES), "max_workers_per_trial": 1},
        "profile": str(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"),
    }
    return parse_spec(data)


@pytest.fixture(scope="module")
def quickstart():
    return load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"), load_catalog(["aws"])


def _shortest(spec: JobSpec, quickstart) -> float:
    with pytest.raises(InfeasibleError) as info:
        plan_job(spec, *quickstart, PlanOptions(deadline_s=1.0, samples=200))
    return info.value.shortest_jct_s


def test_an_asha_spec_plans_an_elastic_plan_meeting_the_deadline(quickstart):
    spec = _asha_spec()
    shortest = _shortest(spec, quickstart)
    deadline = shortest * 1.5
    started = time.perf_counter()
    plan = plan_job(spec, *quickstart, PlanOptions(deadline_s=deadline, samples=200))
    assert time.perf_counter() - started < 10.0
    assert plan.is_asha and plan.job.scheduler == "asha" and plan.brackets == "sequential"
    expected = asha_stages(27, 3, 1, 9)
    assert [(s.stage, s.trials, s.epochs, s.epochs_this_stage) for s in plan.stages] == [
        (s.index, s.trials, s.epochs, s.epochs_this_stage) for s in expected
    ]
    counts = plan.phase_instances
    assert list(counts) == sorted(counts, reverse=True) and counts[-1] < counts[0]
    assert asha_phase_policy(plan).instances == counts
    assert len({(s.instance_type, s.workers_per_trial) for s in plan.stages}) == 1
    p = plan.predicted
    assert p.p_meet_deadline >= plan.confidence and p.jct_s.p95 <= deadline * 1.001
    assert len(p.stage_duration_s) == len(plan.stages) == len(p.stage_cost_usd)
    assert sum(p.stage_cost_usd) == pytest.approx(p.cost_usd.mean - p.cost_breakdown.head_usd)
    assert all(s.predicted_duration_s is not None and s.predicted_cost_usd is not None for s in plan.stages)
    static = plan.baselines["static"]
    assert len({s.instances for s in static.stages}) == 1 and static.stages[0].instances == counts[0]
    assert static.predicted.p_meet_deadline >= plan.confidence
    assert p.cost_usd.mean <= static.predicted.cost_usd.mean
    assert plan.asha is not None and plan.asha.meets_deadline and plan.asha.instances == counts[0]
    assert plan.timeline.instances and plan.timeline.tasks
    # the JSON validates as a Plan, and replays to the same figures with the same seed
    again = parse_plan(json.loads(plan_json(plan)))
    assert again.phase_instances == counts
    replayed = replay_asha_plan(again, quickstart[0], quickstart[1], samples=200)
    assert replayed.cost_mean == pytest.approx(p.cost_usd.mean) and float(np.mean(replayed.jct <= deadline)) == (
        pytest.approx(p.p_meet_deadline)
    )
    with pytest.raises(PlanFileError, match="replay_asha_plan"):
        replay_plan(again, quickstart[0], quickstart[1])


def test_an_infeasible_asha_deadline_names_the_shortest_jct(quickstart):
    spec = _asha_spec()
    with pytest.raises(InfeasibleError, match="shortest feasible JCT") as info:
        plan_job(spec, *quickstart, PlanOptions(deadline_s=60.0, samples=200))
    shortest = info.value.shortest_jct_s
    assert shortest > 60.0 and info.value.cost_usd > 0
    assert (
        plan_job(spec, *quickstart, PlanOptions(deadline_s=shortest * 1.1, samples=200)).predicted.p_meet_deadline
        >= 0.95
    )
    with pytest.raises(InfeasibleError, match="budget"):
        plan_job(
            spec.model_copy(update={"budget_usd": 0.01}), *quickstart, PlanOptions(deadline_s=shortest * 2, samples=200)
        )


def test_an_asha_spec_on_spot_is_refused_where_the_planner_gets_it(quickstart):
    spec = _asha_spec()
    spot = spec.model_copy(update={"resources": spec.resources.model_copy(update={"spot": True})})
    with pytest.raises(SpecError, match=r"resources\.spot.*use kind: sha"):
        plan_job(spot, *quickstart, PlanOptions(deadline_s=3600.0, samples=50))


def test_the_plan_command_prints_asha_phases(quickstart, capsys):
    from rubberband.commands.plan import print_plan

    plan = plan_job(
        _asha_spec(), *quickstart, PlanOptions(deadline_s=_shortest(_asha_spec(), quickstart) * 2, samples=100)
    )
    print_plan(plan)
    out = capsys.readouterr().out
    assert "ASHA plan for asha-job" in out and "rung epochs" in out and "best fixed ASHA cluster" in out
    assert "vs ASHA on a fixed cluster" not in out  # the fixed ASHA cluster is the static baseline here


def test_asha_plans_through_the_cli(cli_here, tmp_path):
    spec = tmp_path / "asha.yaml"
    text = (EXAMPLES / "quickstart.yaml").read_text().replace("kind: sha", "kind: asha")
    spec.write_text(text.replace("profile: profiles/", f"profile: {EXAMPLES / 'profiles'}/").replace("31m", "45m"))
    out = tmp_path / "plan.json"
    result = cli_here("plan", spec, "--json", "--out", out)
    assert result.returncode == 0, result.stderr
    plan = parse_plan(json.loads(result.stdout))
    assert plan.is_asha and plan.planner.samples == 200
    replay = cli_here("simulate", out, "--json")
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["phase_instances"] == list(plan.phase_instances)
    refused = cli_here("simulate", out, "--preemption-traces", tmp_path)
    assert refused.returncode == 2 and "on-demand" in refused.stderr
    report = cli_here("report", out, "--out", tmp_path / "report", "--no-replan")
    assert report.returncode == 0, report.stderr
    assert "ASHA job" in (tmp_path / "report" / "report.md").read_text()
