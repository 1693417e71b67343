"""Spot model (issue 15): fitting from traces, sampling, the simulator's preemptions and fall-back, the search's
market dimension, and plan JSON with a spot model (old plans included)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_helpers import ideal_model, itype
from rubberband.plan import PLAN_SCHEMA_VERSION, parse_plan, plan_json
from rubberband.planner.policies import Market, SpotPolicy, SpotSituation
from rubberband.planner.schedule import stages_for
from rubberband.planner.search import Goal, PlanSpace, local_moves, with_markets
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.planner.spot import (
    DURATION_LEVELS,
    ModelScenario,
    SpotSetup,
    Trace,
    TraceScenario,
    ZoneModel,
    ZoneTraces,
    cheapest_fallbacks,
    fit_zone,
    stay_on_spot,
    trace_stats,
)
from rubberband.clouds import cloud
from rubberband.spotmodel import (
    SpotTraceError,
    fit_traces,
    load_spot_model,
    parse_spot_model,
    read_trace,
    read_traces,
)


def _write(path, data, gap=60):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


# -- fitting ----------------------------------------------------------------------------------------


def test_trace_stats_count_preemptions_runs_and_running_hours():
    data = [0] * 60 + [1] * 30 + [0] * 60 + [1] * 10 + [0] * 40  # 200 ticks of 60 s
    s = trace_stats(data, 60)
    assert s.preemptions == 2
    assert s.available_ticks == 160 and math.isclose(s.running_hours, 160 / 60)
    assert s.unavailable_runs_s == (1800.0, 600.0)
    assert math.isclose(s.unavailable_fraction, 0.2)


def test_fit_recovers_a_known_rate_and_unavailability():
    rng = np.random.default_rng(0)
    rate_h, gap = 0.5, 30.0
    data = []
    # alternating up periods (exponential, mean 2 h) and down runs of exactly 20 min
    while len(data) < 200_000:
        up = max(1, int(rng.exponential(3600 / rate_h) / gap))
        data += [0] * up + [1] * 40
    fit = fit_zone("aws", "p3.2xlarge", "us-east-1", "us-east-1a", ZoneTraces(preemption=[trace_stats(data, gap)]))
    assert fit.preemption_rate_per_h == pytest.approx(rate_h, rel=0.1)
    assert fit.unavailable_quantile(0.5) == pytest.approx(1200.0)
    down = 40 / (40 + 3600 / rate_h / gap)
    assert fit.p_unavailable == pytest.approx(down, rel=0.15)


def test_a_trace_without_preemptions_gets_a_small_positive_rate_not_zero():
    fit = fit_zone("aws", "t", "r", "ra", ZoneTraces(preemption=[trace_stats([0] * 3600, 1.0)]))
    assert fit.preemptions == 0 and 0 < fit.preemption_rate_per_h <= 0.5 + 1e-9


def test_fit_traces_from_a_folder_names_zone_type_region_and_pools_missing_rates(tmp_path):
    _write(tmp_path / "preemption" / "aws-01-01-2024" / "us-east-1c_v100_1.json", [0] * 50 + [1] * 10 + [0] * 60)
    _write(tmp_path / "availability" / "aws-01-01-2024" / "us-east-1a_v100_1.json", [0] * 90 + [1] * 10)
    model = fit_traces(read_traces(tmp_path), source="test")
    by_zone = {z.zone: z for z in model.zones}
    assert set(by_zone) == {"us-east-1a", "us-east-1c"}
    a, c = by_zone["us-east-1a"], by_zone["us-east-1c"]
    assert a.instance_type == c.instance_type == "p3.2xlarge" and a.region == "us-east-1"
    assert "pooled" in a.rate_source and a.preemption_rate_per_h == pytest.approx(c.preemption_rate_per_h)
    assert a.p_unavailable == pytest.approx(0.1)
    round_trip = parse_spot_model(json.loads(model.model_dump_json()), source="x")
    assert round_trip == model


def test_shipped_model_names_its_source_and_the_paper():
    model = load_spot_model()
    assert "NSDI" in model.paper and "Can't Be Late" in model.paper and "spot-traces" in model.source
    zones = {z.zone: z for z in model.zones if z.instance_type == "p3.2xlarge"}
    assert len(zones) == 9 + 3  # nine zones and three regions' "any zone" entries
    # the README's figures: 17 % unavailable in us-east-1a, 90 % in us-west-2b
    assert zones["us-east-1a"].p_unavailable == pytest.approx(0.17, abs=0.01)
    assert zones["us-west-2b"].p_unavailable == pytest.approx(0.90, abs=0.01)
    # falling over to another zone of the region helps, but zones are correlated: far above the product
    any_east = zones["us-east-1*"]
    alone = [zones[f"us-east-1{x}"].p_unavailable for x in "acdf"]
    assert math.prod(alone) < any_east.p_unavailable < min(alone)
    best = model.market_model().best_zone("aws", "us-east-1", "p3.2xlarge")
    assert best is not None and best.zone == "us-east-1*"


def test_an_any_zone_entry_is_available_when_any_zone_is(tmp_path):
    _write(tmp_path / "availability" / "aws-1" / "us-east-1a_v100_1.json", [1, 1, 0, 0, 1, 1])
    _write(tmp_path / "availability" / "aws-1" / "us-east-1b_v100_1.json", [1, 0, 0, 1, 1, 1])
    model = fit_traces(read_traces(tmp_path), source="t")
    any_zone = next(z for z in model.zones if z.zone == "us-east-1*")
    assert any_zone.p_unavailable == pytest.approx(3 / 6)  # ticks 0, 4, 5


def test_region_of_zones():
    assert cloud("aws").region_of("us-east-1a") == "us-east-1" and cloud("aws").region_of("us-east-1*") == "us-east-1*"
    assert (
        cloud("gcp").region_of("us-central1-a") == "us-central1"
        and cloud("gcp").region_of("us-central1") == "us-central1"
    )


@pytest.mark.parametrize(
    "content, needle",
    [
        ("not json", "not valid JSON"),
        ('{"data": [0, 1]}', "'metadata'"),
        ('{"metadata": {"gap_seconds": -3}, "data": [0]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 30}, "data": []}', "'data'"),
        ('{"metadata": {"gap_seconds": 30}, "data": [0, 2]}', "data.1"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_trace_files_raise_one_line_errors_naming_the_field(tmp_path, content, needle):
    path = tmp_path / "preemption" / "aws-x" / "us-east-1a_v100_1.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(SpotTraceError, match=needle) as err:
        read_trace(path)
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_kind_and_cloud_come_from_the_whole_path_even_when_the_deepest_folder_is_passed(tmp_path):
    """`--preemption-traces spot-traces/availability/1-node/aws-02-15-2023` (the folder as shipped): the folders
    above the one given still say availability and aws; the nearest folder wins; metadata.kind still wins."""
    deep = tmp_path / "preemption" / "availability" / "1-node" / "aws-02-15-2023"
    _write(deep / "us-east-1a_v100_1.json", [0, 1])
    (trace,) = read_traces(deep)
    assert (trace.kind, trace.cloud, trace.zone) == ("availability", "aws", "us-east-1a")
    path = deep / "us-east-1b_v100_1.json"
    path.write_text('{"metadata": {"gap_seconds": 60, "kind": "preemption"}, "data": [0]}')
    assert read_trace(path).kind == "preemption"


def test_a_trace_whose_kind_or_cloud_cannot_be_told_is_refused(tmp_path):
    with pytest.raises(SpotTraceError, match="availability or a preemption"):
        read_trace(_write(tmp_path / "aws-x" / "us-east-1a_v100_1.json", [0]))
    with pytest.raises(SpotTraceError, match="cloud"):
        read_trace(_write(tmp_path / "preemption" / "zz" / "us-east-1a_v100_1.json", [0]))
    with pytest.raises(SpotTraceError, match="does not exist"):
        read_traces(tmp_path / "missing")


# -- sampling ---------------------------------------------------------------------------------------


def _zone(rate=1.0, p=0.0, wait=3600.0) -> ZoneModel:
    return ZoneModel(
        cloud="aws",
        instance_type="gpu1",
        region="r1",
        zone="r1a",
        preemption_rate_per_h=rate,
        p_unavailable=p,
        unavailable_s=tuple(wait for _ in DURATION_LEVELS),
    )


def test_model_scenario_samples_poisson_preemptions_at_the_rate():
    sc = ModelScenario(_zone(rate=2.0), seed=1, samples=4000)
    t = np.zeros((4000, 8))
    gaps = sc.time_to_preemption(0, 0, slice(0, 4000), t, span=1)
    assert gaps.mean() == pytest.approx(1800.0, rel=0.05)
    # an instance spanning two nodes is preempted when either is: twice the rate
    assert sc.time_to_preemption(0, 0, slice(0, 4000), t, span=2).mean() == pytest.approx(900.0, rel=0.05)
    # common random numbers: the same stage and event see the same draws
    assert np.array_equal(
        gaps, ModelScenario(_zone(rate=2.0), seed=1, samples=4000).time_to_preemption(0, 0, slice(0, 4000), t, span=1)
    )


def test_model_scenario_unavailability_hits_at_its_probability_with_its_durations():
    sc = ModelScenario(_zone(p=0.3, wait=1234.0), seed=2, samples=5000)
    wait = sc.unavailable_for(0, 0, slice(0, 5000), np.zeros((5000, 4)))
    assert np.mean(wait > 0) == pytest.approx(0.3, abs=0.02)
    assert set(np.unique(wait)) <= {0.0, 1234.0}


def test_trace_scenario_replays_the_next_transition_and_the_rest_of_a_down_run():
    # ticks of 10 s: up 0..9, down 10..14, up 15..29 (circular)
    data = tuple([0] * 10 + [1] * 5 + [0] * 15)
    sc = TraceScenario([Trace(data, 10.0)], [Trace(data, 10.0)], seed=0, samples=1)
    sc.preemption.off[:] = 0.0
    sc.availability.off[:] = 0.0
    t = np.array([[0.0, 55.0, 120.0]])
    assert np.allclose(sc.time_to_preemption(0, 0, slice(0, 1), t, 1), [100.0, 45.0, 280.0])
    assert np.allclose(sc.unavailable_for(0, 0, slice(0, 1), t), [0.0, 0.0, 30.0])


@settings(max_examples=60, deadline=None)
@given(
    time_left=st.lists(st.floats(0, 1e5), min_size=1, max_size=30),
    work=st.floats(0, 5e4),
    restart=st.floats(0, 5e3),
    on_spot=st.booleans(),
    policy=st.builds(SpotPolicy, margin_s=st.floats(0, 1e3), return_factor=st.sampled_from([math.inf, 1.0, 3.0])),
)
def test_the_vectorised_decision_is_the_policy_objects_own(time_left, work, restart, on_spot, policy):
    got = stay_on_spot(policy, np.array(time_left), np.full(len(time_left), work), restart, on_spot=on_spot)
    want = [policy.decide(SpotSituation(t, work, restart, on_spot)) is Market.SPOT for t in time_left]
    assert list(got) == want


# -- the simulator ----------------------------------------------------------------------------------

STAGES = stages_for("sha", trials=9, eta=3, min_epochs=1, max_epochs=9)
GPU = itype("gpu1", price=3.0)


def _setup(zone: ZoneModel, deadline_s: float, samples: int = 400, margin: float = 0.0) -> SpotSetup:
    return SpotSetup(
        deadline_s=deadline_s,
        scenarios={zone.key: ModelScenario(zone, seed=0, samples=samples)},
        policy=SpotPolicy(margin_s=margin),
        zones={zone.key: zone.zone},
    )


def _plan(market: str, n: int = 9) -> tuple[StageConfig, ...]:
    return tuple(StageConfig(GPU, min(n, s.trials), 1, market) for s in STAGES)


def _model():
    return ideal_model(t_iter=1.0, startup=60.0, restart=30.0, dataset=1000, batch=10)  # 100 s per epoch


def test_spot_that_never_fails_costs_the_spot_price_and_takes_the_on_demand_time():
    zone = _zone(rate=0.0, p=0.0)
    sim = Simulator(STAGES, _model(), SimSettings(samples=200, spot_setup=_setup(zone, 1e6, 200)))
    od, spot = sim.simulate(_plan("on_demand")), sim.simulate(_plan("spot"))
    assert np.allclose(od.jct, spot.jct)
    assert spot.cost_mean == pytest.approx(od.cost_mean / 3, rel=1e-6)


def test_preemptions_lengthen_the_job_and_lose_work_since_the_checkpoint():
    calm = Simulator(STAGES, _model(), SimSettings(samples=400, spot_setup=_setup(_zone(rate=0.0), 1e7))).simulate(
        _plan("spot")
    )
    busy = Simulator(STAGES, _model(), SimSettings(samples=400, spot_setup=_setup(_zone(rate=6.0), 1e7))).simulate(
        _plan("spot")
    )
    assert busy.jct_mean > calm.jct_mean + 60
    assert calm.spot_events["preemptions"].sum() == 0 < busy.spot_events["preemptions"].mean()
    # trials spend about 1500 s on spot here: at 6/h a few preemptions per run, fewer than six per task
    assert 1.0 < busy.spot_events["preemptions"].mean() < 6 * 13
    assert np.all(busy.jct >= calm.jct - 1e-6)
    # with an ample deadline the policy keeps every replacement on spot: still far below on-demand
    od = Simulator(STAGES, _model(), SimSettings(samples=400)).simulate(_plan("on_demand"))
    assert busy.cost_mean < od.cost_mean * 0.6


def test_a_tight_deadline_moves_preempted_trials_to_on_demand():
    od = Simulator(STAGES, _model(), SimSettings(samples=400)).simulate(_plan("on_demand"))
    deadline = float(od.jct.max()) + 200.0
    loose = Simulator(STAGES, _model(), SimSettings(samples=400, spot_setup=_setup(_zone(rate=6.0), 1e7))).simulate(
        _plan("spot")
    )
    tight = Simulator(
        STAGES, _model(), SimSettings(samples=400, spot_setup=_setup(_zone(rate=6.0), deadline))
    ).simulate(_plan("spot"))
    # falling back keeps more samples on time, and costs more than staying on spot
    assert tight.p_meet(deadline) > loose.p_meet(deadline)
    assert tight.cost_mean > loose.cost_mean


def test_no_capacity_at_the_request_falls_back_to_on_demand_under_a_deadline():
    od = Simulator(STAGES, _model(), SimSettings(samples=400)).simulate(_plan("on_demand"))
    never = _zone(rate=0.0, p=1.0, wait=36000.0)
    sim = Simulator(STAGES, _model(), SimSettings(samples=400, spot_setup=_setup(never, float(od.jct.max()) + 600)))
    res = sim.simulate(_plan("spot"))
    assert res.cost_mean == pytest.approx(od.cost_mean, rel=1e-6)
    assert np.allclose(res.jct, od.jct)
    assert np.all(res.spot_events["stages_on_demand"] >= 1) and res.spot_events["preemptions"].sum() == 0


# -- the fall-back type ------------------------------------------------------------------------------

SLOW = itype("slow1", price=0.5, device="T4")  # half the speed at a sixth of the price: a third per epoch


def _two_device_model():
    from dataclasses import replace

    model = _model()
    v100 = model.devices["V100"]
    return replace(model, devices={"V100": v100, "T4": replace(v100, alpha_grad=2 * v100.alpha_grad)})


def test_the_fallback_is_the_cheapest_type_per_epoch_with_the_same_workers_per_instance():
    model = _two_device_model()
    mid = itype("mid1", price=1.8, device="V100")  # as fast as gpu1, cheaper: the cheapest per epoch
    quad = itype("quad", gpus=4, price=0.1, device="T4")  # cheapest of all, but 4 workers per instance
    unknown = itype("odd1", price=0.01, device="H100")  # no speed in the profile: never chosen
    epoch = lambda t: model.epoch_time(t.device, 1, 1) if model.plannable(t.device) else None  # noqa: E731
    assert cheapest_fallbacks([GPU, SLOW, quad, unknown], epoch) == {GPU.key: SLOW}
    assert cheapest_fallbacks([GPU, SLOW, mid, quad, unknown], epoch) == {GPU.key: SLOW, mid.key: SLOW}
    assert cheapest_fallbacks([GPU], epoch) == {}  # alone it falls back to itself
    far = itype("slow1", price=0.5, device="T4")
    far = type(far)(**{**far.__dict__, "region": "r2", "zones": ("r2a",)})
    assert cheapest_fallbacks([GPU, far], epoch) == {}  # another region is no fall-back


def test_a_stage_bought_on_demand_runs_on_the_fallback_type_at_its_speed_and_price():
    """No spot capacity ever, under a deadline: every stage is bought on-demand, on the fall-back type: the same
    JCT and cost as the all-on-demand plan on that type, and the cost is that type's."""
    model = _two_device_model()
    on_slow = tuple(StageConfig(SLOW, c.instances, 1, "on_demand") for c in _plan("on_demand"))
    od = Simulator(STAGES, model, SimSettings(samples=200)).simulate(on_slow)
    never = _zone(rate=0.0, p=1.0, wait=36000.0)
    setup = _setup(never, float(od.jct.max()) + 600, samples=200)
    setup = SpotSetup(**{**setup.__dict__, "fallbacks": {GPU.key: SLOW}})
    res = Simulator(STAGES, model, SimSettings(samples=200, spot_setup=setup)).simulate(_plan("spot"))
    assert np.all(res.spot_events["stages_on_demand"] >= 1)
    assert np.allclose(res.jct, od.jct) and res.cost_mean == pytest.approx(od.cost_mean, rel=1e-6)
    assert float(np.mean(res.by_type["slow1"])) == pytest.approx(res.cost_mean, rel=1e-9)
    assert float(np.abs(res.by_type.get("gpu1", 0.0)).max()) < 1e-9


def test_work_moved_to_a_cheaper_fallback_costs_less_and_is_billed_to_it():
    """Many preemptions and a deadline: what the policy moves to on-demand runs on the fall-back type. Moving it to
    one that costs a third per epoch (but takes twice as long) saves money against moving it to the stage's own
    type; the decisions count the work at its speed, so with less slack whole stages go there at their request
    (1.5×) and with more only preempted trials do (2.5×). The cost by type shows what the fall-back type was paid."""
    model = _two_device_model()
    od = Simulator(STAGES, model, SimSettings(samples=400)).simulate(_plan("on_demand"))
    for factor, moved in ((1.5, "stages_on_demand"), (2.5, "moved_to_on_demand")):
        own = _setup(_zone(rate=6.0), float(od.jct.max()) * factor)
        cheaper = SpotSetup(**{**own.__dict__, "fallbacks": {GPU.key: SLOW}})
        to_own = Simulator(STAGES, model, SimSettings(samples=400, spot_setup=own)).simulate(_plan("spot"))
        to_slow = Simulator(STAGES, model, SimSettings(samples=400, spot_setup=cheaper)).simulate(_plan("spot"))
        assert to_slow.spot_events[moved].mean() > 0
        assert to_slow.cost_mean < to_own.cost_mean
        assert "slow1" not in to_own.by_type and float(np.mean(to_slow.by_type["slow1"])) > 0
        total = sum(np.mean(v) for v in to_slow.by_type.values())
        assert total == pytest.approx(to_slow.cost_mean, rel=1e-9)


# -- the checkpoint interval -------------------------------------------------------------------------


def test_a_longer_checkpoint_interval_pays_the_saves_it_makes_only():
    from dataclasses import replace

    model = replace(_model(), epoch_overhead_s=12.0, checkpoint_save_s=10.0)
    assert model.task_overhead(6, False) == pytest.approx(6 * 12.0)
    assert model.task_overhead(6, False, 3) == pytest.approx(6 * 2.0 + 2 * 10.0)
    assert model.task_overhead(7, False, 3) == pytest.approx(7 * 2.0 + 3 * 10.0)  # and after the last epoch
    # a save can not take longer than the whole per-epoch overhead it is part of
    assert replace(model, checkpoint_save_s=50.0).task_overhead(4, False, 4) == pytest.approx(12.0)


def test_the_interval_is_longer_where_saves_are_slow_and_preemptions_rare():
    """Saves of 30 s an epoch (of 100 s): with rare preemptions the plan saves every few epochs; with saves that
    take no time, or on-demand only, every epoch."""
    from dataclasses import replace

    from rubberband.planner.job import checkpoint_interval

    slow_saves = replace(_model(), epoch_overhead_s=30.0, checkpoint_save_s=30.0)
    deadline = 1e6
    rare = _setup(_zone(rate=0.05), deadline, samples=200)
    every = checkpoint_interval(
        Simulator(STAGES, slow_saves, SimSettings(samples=200, spot_setup=rare)), _plan("spot"), Goal(deadline, 0.9)
    )
    assert every > 1
    free_saves = replace(slow_saves, checkpoint_save_s=0.0)
    assert (
        checkpoint_interval(
            Simulator(STAGES, free_saves, SimSettings(spot_setup=rare)), _plan("spot"), Goal(deadline, 0.9)
        )
        == 1
    )
    assert (
        checkpoint_interval(
            Simulator(STAGES, slow_saves, SimSettings(spot_setup=rare)), _plan("on_demand"), Goal(deadline, 0.9)
        )
        == 1
    )
    sparse = Simulator(STAGES, slow_saves, SimSettings(samples=200, spot_setup=replace(rare, checkpoint_epochs=every)))
    dense = Simulator(STAGES, slow_saves, SimSettings(samples=200, spot_setup=rare))
    assert sparse.simulate(_plan("spot")).cost_mean < dense.simulate(_plan("spot")).cost_mean


def test_the_representative_trace_of_a_spot_plan_builds():
    sim = Simulator(STAGES, _model(), SimSettings(samples=50, spot_setup=_setup(_zone(rate=3.0), 1e6, 50)))
    configs = _plan("spot")
    res = sim.simulate(configs)
    timeline, _, critical = sim.trace(configs, res.representative_index())
    assert critical == pytest.approx(float(res.jct[res.representative_index()]), rel=1e-6)
    assert timeline.tasks


# -- the search -------------------------------------------------------------------------------------


def _plan_with(deadline_s: float, rate: float):
    from rubberband.planner.api import plan_stages

    zone = _zone(rate=rate, p=0.2, wait=7200.0)
    types = [GPU]
    return plan_stages(
        PlanSpace(STAGES, types, _model(), 1),
        Goal(deadline_s, 0.9),
        SimSettings(samples=200, spot_setup=_setup(zone, deadline_s, 200)),
    )


def test_the_search_takes_spot_when_the_slack_is_ample_and_on_demand_when_tight():
    space = PlanSpace(STAGES, [GPU], _model(), 1)
    fastest = Simulator(STAGES, _model(), SimSettings(samples=200)).simulate(space.fastest())
    tight = fastest.jct_quantile(0.9) * 1.05
    out = _plan_with(tight, rate=30.0)  # a preemption every 2 min: no slack for one
    assert not any(c.spot for c in out.configs)
    ample = _plan_with(fastest.jct_quantile(0.9) * 4, rate=0.5)
    assert all(c.spot for c in ample.configs)
    assert ample.result.meets(fastest.jct_quantile(0.9) * 4, 0.9)
    assert ample.result.cost_mean < out.result.cost_mean * 0.7


def test_market_moves_flip_stages_and_keep_markets_through_other_moves():
    space = PlanSpace(STAGES, [GPU, itype("gpu2", gpus=2, price=6.0)], _model(), 2)
    plan = _plan("spot", 3)
    moves = with_markets(local_moves, lambda c: c.instance_type.name == "gpu1")(space, plan)
    assert any(all(c.market == "on_demand" for c in m) for m in moves)
    assert any(m[0].market == "on_demand" and m[1:] == plan[1:] for m in moves)
    # a move onto a type without spot leaves that stage on-demand; the others keep spot
    for m in moves:
        for c in m:
            assert c.market == "on_demand" or c.instance_type.name == "gpu1"


# -- plan JSON ----------------------------------------------------------------------------------------


def test_plans_with_a_spot_model_round_trip_and_old_plans_load(tmp_path):
    from rubberband.catalog import load_catalog
    from rubberband.planner.job import PlanOptions, SpotMarket, plan_job
    from rubberband.planner.replay import replay_plan
    from rubberband.profile import load_profile
    from rubberband.spec import load_spec
    from conftest import EXAMPLES

    spec = load_spec(EXAMPLES / "quickstart.yaml")
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"spot": True})})
    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    catalog = load_catalog(["aws"])
    plan = plan_job(
        spec,
        profile,
        catalog,
        PlanOptions(
            samples=100,
            asha=False,
            deadline_s=2700.0,
            spot=SpotMarket(load_spot_model().market_model(), source="shipped"),
        ),
    )
    assert plan.schema_version == PLAN_SCHEMA_VERSION == 3 and plan.spot is not None
    assert any(s.spot and s.zone for s in plan.stages)
    again = parse_plan(json.loads(plan_json(plan)))
    assert again == plan
    # the replay of the plan's own model gives the plan's prediction
    res = replay_plan(again, profile, catalog, samples=100)
    assert res.cost_mean == pytest.approx(plan.predicted.cost_usd.mean, rel=1e-9)
    # a v2 plan (no spot model; `spot` meant spot prices, never preempted) still loads and replays that way
    old = json.loads(plan_json(plan))
    old["schema_version"] = 2
    del old["spot"]
    for s in old["stages"]:
        del s["zone"]
    legacy = parse_plan(old)
    assert legacy.spot is None and legacy.schema_version == 3
    fiction = replay_plan(legacy, profile, catalog, samples=100)
    assert fiction.cost_mean < res.cost_mean


def test_parallel_hyperband_brackets_play_spot_stages():
    from rubberband.planner.brackets import ParallelSimulator

    stages = stages_for("hyperband", trials=None, min_epochs=1, max_epochs=9, eta=3)
    zone = _zone(rate=3.0, p=0.2)
    configs = tuple(StageConfig(GPU, max(1, s.trials // 3), 1, "spot" if s.index == 0 else "on_demand") for s in stages)
    od = ParallelSimulator(stages, _model(), SimSettings(samples=100)).simulate(
        tuple(c.on("on_demand") for c in configs)
    )
    sim = ParallelSimulator(stages, _model(), SimSettings(samples=100, spot_setup=_setup(zone, 1e6, 100)))
    res = sim.simulate(configs)
    assert res.cost_mean < od.cost_mean and res.jct_mean >= od.jct_mean - 1e-6
    timeline, _, _ = sim.trace(configs, res.representative_index())
    assert timeline.tasks


@settings(max_examples=50, deadline=None)
@given(data=st.lists(st.integers(0, 1), min_size=1, max_size=400), gap=st.floats(1.0, 600.0))
def test_trace_stats_agree_with_a_direct_count(data, gap):
    s = trace_stats(data, gap)
    assert s.preemptions == sum(1 for a, b in zip(data, data[1:]) if (a, b) == (0, 1))
    assert s.available_ticks == data.count(0)
    assert sum(s.unavailable_runs_s) == pytest.approx(data.count(1) * gap)
    assert len(s.unavailable_runs_s) == sum(1 for i, x in enumerate(data) if x == 1 and (i == 0 or data[i - 1] == 0))
    fit = fit_zone("aws", "t", "r", "ra", ZoneTraces(availability=[s]))
    assert fit.p_unavailable == pytest.approx(data.count(1) / len(data))
    assert list(fit.unavailable_s) == sorted(fit.unavailable_s)
