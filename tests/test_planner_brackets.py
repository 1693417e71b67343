"""Hyperband brackets as parallel branches: the simulator, hand-overs, the planner, the plan schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner_helpers import ideal_model, itype
from rubberband.errors import InfeasibleError, PlanFileError, SpecError
from rubberband.plan import PLAN_SCHEMA_VERSION, parse_plan, plan_json
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.job import PlanOptions, plan_job
from rubberband.planner.baselines import parallel_lower_bounds
from rubberband.planner.brackets import BracketSetup, ParallelSimulator, bracket_ranges
from rubberband.planner.schedule import Stage, hyperband_brackets
from rubberband.planner.search import Goal, PlanSpace
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.spec import parse_spec

GPU1 = itype("gpu1", gpus=1, price=3.6)
HB = [s for b in hyperband_brackets(3, 1, 9) for s in b]  # brackets of 9, 5 and 3 trials


def _one(bracket: int, trials: int = 1, epochs: int = 1) -> Stage:
    return Stage(bracket, 0, trials, epochs, epochs)


def test_brackets_run_side_by_side_jct_is_the_longest_and_costs_add_up():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0)  # 50 s per epoch
    configs = [
        StageConfig(GPU1, 3, 1),
        StageConfig(GPU1, 1, 1),
        StageConfig(GPU1, 1, 1),
        StageConfig(GPU1, 2, 1),
        StageConfig(GPU1, 1, 1),
        StageConfig(GPU1, 3, 1),
    ]
    par = ParallelSimulator(HB, model, SimSettings(samples=20, seed=3), BracketSetup(share=False))
    res = par.simulate(configs)
    subs = [
        Simulator(HB[lo:hi], model, SimSettings(samples=20, seed=3 + 7919 * b)).simulate(configs[lo:hi])
        for b, (lo, hi) in enumerate(bracket_ranges(HB))
    ]
    assert np.allclose(res.jct, np.max([s.jct for s in subs], axis=0))
    assert np.allclose(res.cost, sum(s.cost for s in subs))
    assert len(res.stage_durations) == len(HB) == len(res.stage_costs)
    seq = Simulator(HB, model, SimSettings(samples=20, seed=3)).simulate(configs)
    assert res.jct.max() < 0.6 * seq.jct.min()  # the sum of the brackets versus the longest


def test_an_instance_released_while_another_bracket_boots_is_handed_over():
    """Bracket 0 releases its instance at 150 s; bracket 1 (offset 100 s) asked for one at 100 s,
    up at 200 s: it gets bracket 0's instead, saving price × (150 − 100 + termination)."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=100.0, termination=20.0)
    stages = [_one(0), _one(1)]
    configs = [StageConfig(GPU1, 1, 1), StageConfig(GPU1, 1, 1)]
    alone = ParallelSimulator(
        stages, model, SimSettings(samples=10), BracketSetup(offsets=[0.0, 100.0], share=False)
    ).simulate(configs)
    shared_sim = ParallelSimulator(stages, model, SimSettings(samples=10), BracketSetup(offsets=[0.0, 100.0]))
    shared = shared_sim.simulate(configs)
    assert np.allclose(shared.jct, alone.jct) and np.allclose(shared.jct, 100 + 100 + 50)
    saved = 3.6 / 3600 * (150 - 100 + 20)
    assert np.allclose(alone.cost - shared.cost, saved)
    assert np.allclose(alone.stage_costs[1] - shared.stage_costs[1], saved)
    timeline, _, critical = shared_sim.trace(configs, 0)
    assert critical == pytest.approx(250.0)
    assert len(timeline.instances) == 1 and timeline.instances[0].released_s == pytest.approx(250.0)
    assert {tuple(t.instance_ids) for t in timeline.tasks} == {("i0",)}
    assert [(h.from_stage, h.to_stage) for h in shared_sim.last_handoffs] == [(0, 1)]
    # started at once, bracket 1's instance is requested before anything is released: no hand-over
    at_once = ParallelSimulator(stages, model, SimSettings(samples=10)).simulate(configs)
    assert np.allclose(
        at_once.cost,
        ParallelSimulator(stages, model, SimSettings(samples=10), BracketSetup(share=False)).simulate(configs).cost,
    )


def test_a_release_after_the_new_instance_is_up_is_not_handed_over():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=100.0, termination=20.0)
    stages = [_one(0, epochs=4), _one(1)]  # bracket 0 releases at 300 s; bracket 1's instance is up at 200 s
    configs = [StageConfig(GPU1, 1, 1), StageConfig(GPU1, 1, 1)]
    settings = SimSettings(samples=10)
    assert np.allclose(
        ParallelSimulator(stages, model, settings, BracketSetup(offsets=[0.0, 100.0])).simulate(configs).cost,
        ParallelSimulator(stages, model, settings, BracketSetup(offsets=[0.0, 100.0], share=False))
        .simulate(configs)
        .cost,
    )


def test_parallel_lower_bounds_hold():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.1)
    space = PlanSpace(HB, [GPU1], model, 1)
    sim = ParallelSimulator(HB, model, SimSettings(samples=50))
    for plan in [space.fastest(), tuple(space.frontier(i)[-1] for i in range(len(HB)))]:
        cost_lb, jct_lb = parallel_lower_bounds(space, sim, plan)
        res = sim.simulate(plan)
        assert cost_lb <= res.cost.min() + 1e-9 and jct_lb <= res.jct.min() + 1e-9


def test_offsets_must_start_bracket_zero_at_once():
    model = ideal_model()
    with pytest.raises(ValueError, match="bracket 0 starts at 0"):
        ParallelSimulator(HB, model, brackets=BracketSetup(offsets=[5.0, 0.0, 0.0]))


def test_planner_parallel_brackets_are_quicker_and_not_costlier_than_sequential():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=60.0, sigma=0.05, termination=10.0)
    types = [GPU1, itype("gpu4", gpus=4, price=14.4)]
    shortest = {}
    for mode in ("sequential", "parallel"):
        with pytest.raises(InfeasibleError) as exc:
            plan_stages(
                PlanSpace(HB, types, model, 8),
                Goal(1.0, 0.9),
                SimSettings(samples=100),
                SearchOptions(brackets=BracketSetup() if mode == "parallel" else None),
            )
        shortest[mode] = exc.value.shortest_jct_s
    assert shortest["parallel"] < 0.6 * shortest["sequential"]
    deadline = shortest["sequential"] * 1.2
    seq = plan_stages(PlanSpace(HB, types, model, 8), Goal(deadline, 0.9), SimSettings(samples=100))
    par = plan_stages(
        PlanSpace(HB, types, model, 8),
        Goal(deadline, 0.9),
        SimSettings(samples=100),
        SearchOptions(brackets=BracketSetup()),
    )
    assert par.brackets == "parallel" and len(par.offsets) == 3 and par.offsets[0] == 0
    assert par.result.meets(deadline, 0.9)
    assert par.result.cost_mean <= seq.result.cost_mean * 1.02
    # the timeline holds every trial of every bracket once per stage
    assert len(par.timeline.tasks) == sum(s.trials for s in HB)
    assert len({t.trial for t in par.timeline.tasks}) == sum(s.trials for s in HB if s.index == 0)


def test_parallel_planning_is_never_costlier_than_static_or_sequential():
    """With a loose deadline one bracket after another (instances carried over) can be cheapest: the
    parallel planner then says so and returns the sequential plan."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=60.0, sigma=0.05, termination=10.0)
    for factor in (1.0, 3.0):
        seq = plan_stages(PlanSpace(HB, [GPU1], model, 8), Goal(4000.0 * factor, 0.9), SimSettings(samples=100))
        par = plan_stages(
            PlanSpace(HB, [GPU1], model, 8),
            Goal(4000.0 * factor, 0.9),
            SimSettings(samples=100),
            SearchOptions(brackets=BracketSetup()),
        )
        assert par.result.cost_mean <= seq.result.cost_mean * (1 + 1e-9)
        if par.static is not None:
            assert par.result.cost_mean <= par.static[1].cost_mean * (1 + 1e-9)
        if par.brackets == "sequential":
            assert "one after another is cheapest" in " ".join(par.notes) and par.offsets == ()


def _spec(**scheduler):
    return parse_spec(
        {
            "name": "hb",
            "train": "m:f",
            "metric": {"name": "acc", "mode": "max"},
            "search_space": {"lr": {"type": "uniform", "low": 0.0, "high": 1.0}},
            "scheduler": {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 9, **scheduler},
            "deadline": "2h",
            "resources": {"clouds": ["aws"], "max_workers_per_trial": 1},
        }
    )


def test_spec_brackets_default_parallel_and_digest_unchanged():
    spec = _spec()
    assert spec.scheduler.brackets == "parallel"
    assert _spec(brackets="sequential").sha256() != spec.sha256()
    assert _spec(brackets="parallel").sha256() == spec.sha256()
    with pytest.raises(SpecError, match="scheduler.brackets.*parallel.*sequential"):
        _spec(brackets="side-by-side")


def _plan_json(quickstart):
    """A parallel plan of the quickstart profile (small Hyperband, few samples), as JSON."""
    from rubberband.catalog import load_catalog
    from rubberband.profile import load_profile

    spec = _spec()
    profile = load_profile(quickstart)
    catalog = load_catalog(["aws"])
    spec = spec.model_copy(
        update={"resources": spec.resources.model_copy(update={"instance_types": ["p3.2xlarge", "g5.xlarge"]})}
    )
    return plan_job(spec, profile, catalog, PlanOptions(deadline_s=1500, samples=100))


@pytest.fixture(scope="module")
def parallel_plan():
    from pathlib import Path

    return _plan_json(Path(__file__).resolve().parents[1] / "examples/profiles/resnet50_cifar10_v100.json")


def test_plan_schema_v2_records_parallel_brackets_and_reads_v1(parallel_plan):
    plan = parallel_plan
    assert plan.schema_version == PLAN_SCHEMA_VERSION == 3
    assert plan.brackets == "parallel" and plan.parallel_brackets and len(plan.bracket_offsets_s) == 3
    again = parse_plan(json.loads(plan_json(plan)))
    assert again == plan
    v1 = json.loads(plan_json(plan))
    for key in ("brackets", "bracket_offsets_s", "handoffs", "asha"):
        v1.pop(key)
    v1["schema_version"] = 1
    old = parse_plan(v1, source="old.json")
    assert old.schema_version == 3 and old.brackets == "sequential" and not old.parallel_brackets
    with pytest.raises(PlanFileError, match="old.json: plan schema_version 7 is not supported.*version 3"):
        parse_plan({**v1, "schema_version": 7}, source="old.json")


def test_a_parallel_plan_is_re_simulated_with_its_brackets_side_by_side(parallel_plan):
    from pathlib import Path

    from rubberband.catalog import load_catalog
    from rubberband.planner.replay import simulate_plan
    from rubberband.profile import load_profile

    profile = load_profile(Path(__file__).resolve().parents[1] / "examples/profiles/resnet50_cifar10_v100.json")
    again = simulate_plan(parallel_plan, profile, load_catalog(["aws"]), samples=100)
    assert again.predicted.jct_s.p50 == pytest.approx(parallel_plan.predicted.jct_s.p50, rel=1e-9)
    assert again.predicted.cost_usd.mean == pytest.approx(parallel_plan.predicted.cost_usd.mean, rel=1e-9)
    sequential = simulate_plan(
        parallel_plan.model_copy(update={"brackets": "sequential"}), profile, load_catalog(["aws"]), samples=100
    )
    assert sequential.predicted.jct_s.p50 > 1.5 * again.predicted.jct_s.p50


def test_the_executor_accepts_a_parallel_plan(parallel_plan):
    from rubberband.executor.lanes import LaneLayout
    from rubberband.executor.plan_checks import check_plan_matches

    check_plan_matches(_spec(), parallel_plan, source="p.json")  # run by the executor's lanes, side by side
    layout = LaneLayout.for_plan(parallel_plan)
    assert layout.parallel and len(layout.ranges) == len({s.bracket for s in parallel_plan.stages})
    sequential = parallel_plan.model_copy(update={"brackets": "sequential"})
    check_plan_matches(_spec(), sequential)
    assert not LaneLayout.for_plan(sequential).parallel  # one lane after another


def test_plan_output_and_report_show_brackets_and_asha(parallel_plan, capsys):
    from rubberband.commands.plan import print_plan
    from rubberband.report.model import build_report_data
    from rubberband.report.source import PlanSource

    assert parallel_plan.asha is not None
    print_plan(parallel_plan)
    out = capsys.readouterr().out
    assert "Brackets run side by side" in out and "ASHA on a fixed cluster" in out
    summary = build_report_data(PlanSource(parallel_plan), replan=None).summary
    assert summary.asha_cost_mean_usd == parallel_plan.asha.predicted.cost_usd.mean
    assert summary.brackets_text and "side by side" in summary.brackets_text


def test_run_plans_hyperband_brackets_side_by_side_as_plan_does(tmp_path, capsys):
    """`rubberband run` (without --plan) plans the spec's brackets (default parallel), as `rubberband plan` does."""
    from pathlib import Path

    import yaml

    from rubberband.commands.run import PlanSource, _load_or_make_plan
    from rubberband.spec import load_spec

    profile = Path(__file__).resolve().parents[1] / "examples/profiles/resnet50_cifar10_v100.json"
    path = tmp_path / "hb.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "hb",
                "train": "m:f",
                "metric": {"name": "acc", "mode": "max"},
                "search_space": {"lr": {"type": "uniform", "low": 0.0, "high": 1.0}},
                "scheduler": {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 9},
                "deadline": "40m",
                "resources": {"clouds": ["aws"], "instance_types": ["g5.xlarge"], "max_workers_per_trial": 1},
                "profile": str(profile),
            }
        )
    )
    spec = load_spec(path)
    plan, fresh = _load_or_make_plan(spec, PlanSource(path, None, "aws", None, head="local"))
    assert fresh and plan.parallel_brackets
    assert "one after another" not in capsys.readouterr().err


def test_sequential_brackets_screen_without_counting_start_ups_twice():
    """Screened bracket by bracket, a later bracket used to pay the run's head start and its instances' start-ups
    again, although the full simulation carries them over: on start-up-dominated runs every plan failed its screen
    and a feasible deadline was refused ("shortest feasible JCT 1m 12s" for a 1m 40s deadline). The evaluator's
    screen of a later bracket starts with the previous bracket's instances running."""
    from rubberband.planner.search import Evaluator

    model = ideal_model(t_iter=0.05, dataset=100, batch=10, startup=25.0)  # 0.5 s epochs, 25 s start-ups
    configs = tuple(StageConfig(GPU1, 1, 1) for _ in HB)
    sim = Simulator(HB, model, SimSettings(samples=200, seed=1))
    evaluator = Evaluator(sim, 50)
    full, screen = sim.simulate(configs, 50), evaluator.screen(configs)
    assert screen.jct.mean() <= full.jct.mean() + 1.0  # not pessimistic by two start-ups
    deadline = float(np.quantile(sim.simulate(configs).jct, 0.95)) + 5.0
    out = plan_stages(PlanSpace(HB, [GPU1], model, 8), Goal(deadline, 0.9))
    assert out.result.meets(deadline, 0.9)


# -- the shared provisioning queue (serial start-ups on the local backend) -------------------------

LOCAL1 = itype("local.cpu1", cloud="local", gpus=1, price=0.36)


def _local_model(startup: float = 10.0):
    """50 s epochs; local nodes start in ``startup`` s (the run's head too), gone at once."""
    from dataclasses import replace

    from rubberband.planner.model import StartupModel

    model = ideal_model(t_iter=0.5, dataset=1000, batch=10)
    return replace(
        model,
        startup_by_cloud={"local": StartupModel((startup,), "test")},
        termination_by_cloud={"local": StartupModel((0.0,), "test")},
    )


def test_local_brackets_starting_together_come_up_one_after_another_in_start_order():
    """Head up at 10 s; then one provisioner for the whole run: bracket 0 (ends last) gets the first node
    (10 → 20 s), bracket 1's two nodes follow (20 → 30, 30 → 40 s), bracket 2's last (40 → 50 s)."""
    model = _local_model()
    stages = [_one(0, epochs=3), _one(1, trials=2, epochs=2), _one(2)]
    configs = [StageConfig(LOCAL1, 1, 1), StageConfig(LOCAL1, 2, 1), StageConfig(LOCAL1, 1, 1)]
    sim = ParallelSimulator(stages, model, SimSettings(samples=8, seed=1))
    assert sim.start_order(configs) == [0, 1, 2]
    # each bracket alone, with the provisioner to itself
    alone = [
        ParallelSimulator([s], model, SimSettings(samples=8, seed=1)).simulate([c]) for s, c in zip(stages, configs)
    ]
    assert [float(r.jct[0]) for r in alone] == pytest.approx([170.0, 130.0, 70.0])
    queued = sim.bracket_results(configs)
    assert [float(r.jct[0]) for r in queued] == pytest.approx([170.0, 140.0, 100.0])
    res = sim.simulate(configs)
    assert np.allclose(res.jct, 170.0)
    timeline, _, critical = sim.trace(configs, 0)
    assert critical == pytest.approx(170.0)
    assert np.allclose(
        sorted((i.requested_s, i.ready_s) for i in timeline.instances),
        [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0), (40.0, 50.0)],
    )
    # billed from when each node starts (as the local provider journals it), not from the queue
    assert np.allclose(res.breakdown["startup"], 4 * 10.0 * 0.36 / 3600)
    # the same job on a cloud that starts instances at once: the brackets do not wait for each other
    aws = [StageConfig(GPU1, c.instances, 1) for c in configs]
    on_aws = ParallelSimulator(
        stages, ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=10.0), SimSettings(samples=8)
    )
    assert [float(r.jct[0]) for r in on_aws.bracket_results(aws)] == pytest.approx([160.0, 110.0, 60.0])


def test_the_critical_bracket_gets_the_first_node():
    """The bracket predicted to end last is served first, whatever its position."""
    model = _local_model()
    stages = [_one(0), _one(1, epochs=4)]
    configs = [StageConfig(LOCAL1, 1, 1), StageConfig(LOCAL1, 1, 1)]
    sim = ParallelSimulator(stages, model, SimSettings(samples=4))
    assert sim.start_order(configs) == [1, 0]
    assert [float(r.jct[0]) for r in sim.bracket_results(configs)] == pytest.approx([80.0, 220.0])


def test_a_later_request_waits_for_the_start_ups_submitted_before_it():
    """Bracket 1 starts 5 s after bracket 0: its request (5 + 10 s head) waits until bracket 0's node is
    up at 20 s, so its node is up at 30 s, not 25 s (first come, first served, whatever the brackets'
    order); and bracket 0's second stage's new node (asked for ahead of its first stage's end) waits
    for nobody."""
    model = _local_model()
    stages = [Stage(0, 0, 2, 1, 1), Stage(0, 1, 1, 2, 1), _one(1)]
    local2 = itype("local.cpu2", cloud="local", gpus=2, price=0.72)
    configs = [StageConfig(LOCAL1, 1, 1), StageConfig(local2, 1, 1), StageConfig(LOCAL1, 1, 1)]
    sim = ParallelSimulator(stages, model, SimSettings(samples=4), BracketSetup(offsets=[0.0, 5.0], share=False))
    b0, b1 = sim.bracket_results(configs)
    assert float(b1.jct[0]) == pytest.approx(30.0 - 5.0 + 50.0)
    alone0 = ParallelSimulator(stages[:2], model, SimSettings(samples=4)).simulate(configs[:2])
    assert np.allclose(b0.jct, alone0.jct)
    assert np.allclose(sim.simulate(configs).jct, np.maximum(b0.jct, 5.0 + b1.jct))


def test_fifo_starts_serves_batches_in_submission_order_ties_by_rank():
    from rubberband.planner.provisioning import fifo_starts

    submitted = np.array([[0.0, 0.0, 5.0], [3.0, 0.0, 1.0]])
    busy = np.array([[10.0, 4.0, 1.0], [2.0, 2.0, 2.0]])
    starts = fifo_starts(submitted, busy, [1, 0, 2])
    # sample 0: batch 1 first (tie, rank 0) 0→4, batch 0 4→14, batch 2 at 14; sample 1: 1 (0→2), 2 (2→4), 0 at 4
    assert starts.tolist() == [[4.0, 0.0, 14.0], [4.0, 0.0, 2.0]]


def test_a_stage_requested_while_the_stage_before_still_starts_nodes_waits_for_them():
    """Local SHA (one simulator): stage 0's two nodes start 10 → 20 s and 20 → 30 s; stage 1's new
    ``local.cpu2`` is asked for at the first task's start (20 s, its 5 s stage is shorter than the lead)
    and starts only when the provisioner is free (30 s): up at 40 s, its 5 s task ends at 45 s."""
    model = ideal_model(t_iter=0.5, dataset=100, batch=10)  # 5 s epochs
    from dataclasses import replace

    from rubberband.planner.model import StartupModel

    model = replace(
        model,
        startup_by_cloud={"local": StartupModel((10.0,), "test")},
        termination_by_cloud={"local": StartupModel((0.0,), "test")},
    )
    local2 = itype("local.cpu2", cloud="local", gpus=2, price=0.72)
    stages = [Stage(0, 0, 2, 1, 1), Stage(0, 1, 1, 2, 1)]
    configs = [StageConfig(LOCAL1, 2, 1), StageConfig(local2, 1, 1)]
    sim = Simulator(stages, model, SimSettings(samples=4))
    assert sim.request_offsets(configs) == [None, 0.0]
    assert np.allclose(sim.simulate(configs).jct, 45.0)
    timeline, _, critical = sim.trace(configs, 0)
    assert critical == pytest.approx(45.0)
    assert np.allclose(
        sorted((i.requested_s, i.ready_s) for i in timeline.instances), [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]
    )


def test_brackets_side_by_side_share_one_draw_of_the_population_speed():
    """Each bracket has its own random streams, but the configurations all come from one population: a sample
    whose population is slow is slow in every bracket."""
    import dataclasses

    from rubberband.planner.noise import Variation

    model = dataclasses.replace(ideal_model(), variation=Variation(config_sigma=0.01, config_mean_se=0.5))
    par = ParallelSimulator(HB, model, SimSettings(samples=400, seed=3))
    assert len({sub.seed for sub in par.subs}) == len(par.subs)  # streams apart...
    jcts = [sub.simulate([StageConfig(itype(), 1, 1)] * len(sub.stages)).jct for sub in par.subs]
    assert min(np.corrcoef(np.log(jcts))[0, 1:]) > 0.95  # ...but one population per sample
