"""Spot priced where it is modelled (issue 30 item 4): the zones a spot stage really tries, in the executor's order,
each at its own price and weighted by where capacity is found; priors for types without traces; and why a stage
left on-demand is."""

from __future__ import annotations

import json
import dataclasses

import numpy as np
import pytest

from conftest import EXAMPLES
from planner_helpers import ideal_model, itype
from rubberband.planner.schedule import stages_for
from rubberband.planner.search import Goal
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.planner.spot import SpotMarketModel, SpotSetup, ZoneModel, p_none_of
from rubberband.planner.spotzones import first_found, model_setup, prior, spot_offer, why_not_spot
from rubberband.spotmodel import fit_traces, load_spot_model, read_traces

Q = (0.4, 0.25, 0.15, 0.1)  # P(none of j zones has capacity), j = 1..4


def _write(path, data, gap=60):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))


def _region(q=Q, itype_name="gpu1", region="r1", rate=0.5) -> ZoneModel:
    return ZoneModel(
        cloud="aws",
        instance_type=itype_name,
        region=region,
        zone=f"{region}*",
        preemption_rate_per_h=rate,
        p_unavailable=q[-1],
        unavailable_s=tuple([600.0] * 21),
        p_none_of=q,
    )


def _spot_type(prices=(("r1-z2", 1.0), ("r1-z1", 2.0), ("r1-z3", 3.0)), name="gpu1"):
    return dataclasses.replace(
        itype(name, price=6.0), zones=("r1-z1", "r1-z2", "r1-z3"), zone_spot_prices=prices, spot_price_hr=prices[0][1]
    )


# -- fitting: P(none of j zones) ----------------------------------------------------------------------


def test_p_none_of_is_the_mean_over_sets_of_zones_of_the_ticks_none_had_capacity(tmp_path):
    a, b = [1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 1]
    assert p_none_of([a, b]) == pytest.approx((4 / 6, 3 / 6))
    _write(tmp_path / "availability" / "aws-1" / "us-east-1a_v100_1.json", a)
    _write(tmp_path / "availability" / "aws-1" / "us-east-1b_v100_1.json", b)
    region = next(z for z in fit_traces(read_traces(tmp_path), source="t").zones if z.zone == "us-east-1*")
    assert region.p_none_of == pytest.approx([4 / 6, 3 / 6]) and region.p_unavailable == pytest.approx(3 / 6)


def test_the_shipped_model_has_the_regions_p_none_of_falling_with_each_zone_to_the_any_zone_figure():
    zones = {z.zone: z for z in load_spot_model().zones}
    east = zones["us-east-1*"]
    assert len(east.p_none_of) == 4 and east.p_none_of[-1] == pytest.approx(east.p_unavailable, abs=1e-6)
    assert list(east.p_none_of) == sorted(east.p_none_of, reverse=True)
    alone = np.mean([zones[f"us-east-1{x}"].p_unavailable for x in "acdf"])
    assert east.p_none_of[0] == pytest.approx(alone, abs=1e-3)


# -- the zones tried and their prices -----------------------------------------------------------------


def test_first_found_weighs_each_zone_by_the_chance_capacity_is_found_there_first():
    firsts, none = first_found(Q, 3)
    assert firsts == pytest.approx([0.6, 0.15, 0.10]) and none == pytest.approx(0.15)
    firsts, none = first_found((0.4, 0.25), 4)  # zones beyond the traces add no capacity
    assert firsts == pytest.approx([0.6, 0.15, 0.0, 0.0]) and none == pytest.approx(0.25)


def test_a_spot_offer_is_the_executors_zones_in_its_order_at_their_prices():
    gpu = _spot_type()
    offer = spot_offer(SpotMarketModel((_region(),)), gpu)
    assert offer is not None and not offer.prior
    assert [z.zone for z in offer.zones] == list(gpu.zones_to_try(spot=True)) == ["r1-z2", "r1-z1", "r1-z3"]
    assert [z.price_hr for z in offer.zones] == [1.0, 2.0, 3.0]
    expected = (0.6 * 1.0 + 0.15 * 2.0 + 0.10 * 3.0) / 0.85
    assert offer.price_hr == pytest.approx(expected) and offer.price_hr > gpu.spot_price_hr
    assert offer.model.p_unavailable == pytest.approx(0.15)  # none of the three tried, not of the four traced
    two = spot_offer(SpotMarketModel((_region(),)), _spot_type((("r1-z2", 1.0), ("r1-z1", 2.0))))
    assert two is not None and two.model.p_unavailable == pytest.approx(0.25)


def test_spot_is_billed_at_the_offers_price_in_the_simulator():
    gpu = _spot_type()
    stages = stages_for("sha", trials=9, eta=3, min_epochs=1, max_epochs=9)
    model = ideal_model(t_iter=1.0, startup=60.0, restart=30.0, dataset=1000, batch=10)
    calm = SpotMarketModel((dataclasses.replace(_region(q=(0.0,)), preemption_rate_per_h=0.0, p_unavailable=0.0),))
    base = SpotSetup(deadline_s=1e6, scenarios={})
    setup = model_setup(calm, base, seed=0, samples=100, types=[gpu])
    assert setup.zones[("aws", "r1", "gpu1")] == "r1-z2"
    plan = tuple(StageConfig(gpu, s.trials, 1, "spot") for s in stages)
    zone_true = Simulator(stages, model, SimSettings(samples=100, spot_setup=setup)).simulate(plan)
    cheapest = Simulator(
        stages, model, SimSettings(samples=100, spot_setup=dataclasses.replace(setup, offers={}))
    ).simulate(plan)
    # nothing is ever unavailable: capacity is always found in the first zone, at its price, the cheapest
    assert zone_true.cost_mean == pytest.approx(cheapest.cost_mean, rel=1e-9)
    dear = calm.zones[0]
    dear_setup = model_setup(
        SpotMarketModel((dataclasses.replace(dear, p_none_of=(0.5,), p_unavailable=0.5),)),
        base,
        seed=0,
        samples=100,
        types=[gpu],
    )
    assert dear_setup.spot_price(gpu) == pytest.approx(1.0)  # only the first zone has traced capacity


# -- priors ---------------------------------------------------------------------------------------------


def test_a_type_without_traces_gets_a_prior_pooled_from_the_regions_traced_types_flagged_as_one():
    traced = _region()
    model = SpotMarketModel((traced, _region(q=(0.9, 0.8), region="r2", rate=2.0)))
    g5 = _spot_type(name="g5")
    offer = spot_offer(model, g5)
    assert offer is not None and offer.prior and offer.model.prior
    assert offer.model.preemption_rate_per_h == traced.preemption_rate_per_h  # the same region's entry
    assert "prior" in offer.model.rate_source and "gpu1" in offer.model.rate_source
    elsewhere = prior(model, "aws", "r9", "g5")  # no traced type there: the cloud's regions pooled
    assert elsewhere is not None and elsewhere.preemption_rate_per_h == pytest.approx(1.25)
    assert elsewhere.p_none_of == pytest.approx(((0.4 + 0.9) / 2, (0.25 + 0.8) / 2, (0.15 + 0.8) / 2, (0.1 + 0.8) / 2))
    assert prior(model, "gcp", "r1", "g5") is None and spot_offer(model, g5, priors=False) is None


# -- why a stage stays on-demand ------------------------------------------------------------------------


def test_why_not_spot_names_the_missing_offer_and_spots_p_meet():
    stages = stages_for("sha", trials=9, eta=3, min_epochs=1, max_epochs=9)
    model = ideal_model(t_iter=1.0, startup=60.0, restart=30.0, dataset=1000, batch=10)
    gpu = _spot_type()
    no_spot = dataclasses.replace(itype("od", price=6.0), spot_price_hr=None)
    stormy = SpotMarketModel((dataclasses.replace(_region(), preemption_rate_per_h=60.0),))
    plan = tuple(StageConfig(no_spot if s.index == 0 else gpu, s.trials, 1) for s in stages)
    quick = Simulator(stages, model, SimSettings(samples=100)).simulate(plan)
    deadline = quick.jct_quantile(0.9) * 1.02
    setup = model_setup(stormy, SpotSetup(deadline_s=deadline, scenarios={}), seed=0, samples=100, types=[gpu])
    sim = Simulator(stages, model, SimSettings(samples=100, spot_setup=setup))
    why = why_not_spot(sim, plan, sim.simulate(plan), Goal(deadline, 0.9), setup)
    assert why[0] == "od has no spot offer in r1"
    assert all(w is not None and w.startswith("on spot P(meet)") and "< 90%" in w for w in why[1:])


# -- through the CLI ------------------------------------------------------------------------------------

SPEC = """name: spot-zones
train: cifar_resnet:train
metric: {{name: val_acc, mode: max}}
search_space:
  lr: {{type: loguniform, low: 0.001, high: 0.3}}
scheduler: {{kind: sha, trials: 27, eta: 3, min_epochs: 1, max_epochs: 9}}
deadline: {deadline}
confidence: 0.9
resources:
  clouds: [aws]
  instance_types: [{types}]
  max_workers_per_trial: 1
  spot: true
profile: {profile}
seed: 0
"""


def _plan_cli(cli_here, tmp_path, deadline: str, types: str):
    spec = tmp_path / "spot.yaml"
    profile = EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"
    spec.write_text(SPEC.format(deadline=deadline, types=types, profile=profile))
    out = tmp_path / "plan.json"
    r = cli_here("plan", spec, "--samples", "100", "--out", out, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stdout


def test_plan_cli_names_real_zones_and_prices_and_flags_a_prior(cli_here, tmp_path):
    plan, out = _plan_cli(cli_here, tmp_path, "2h", "g5.xlarge")
    spot = [s for s in plan["stages"] if s["spot"]]
    assert spot, out  # g5.xlarge has no traces: planned on spot with a prior, not silently on-demand
    entry = next(z for z in plan["spot"]["zones"] if z["instance_type"] == "g5.xlarge" and z["region"] == "us-east-1")
    assert entry["prior"] and entry["tried"][0]["zone"].startswith("use1-az")
    assert [t["price_hr"] for t in entry["tried"]] == sorted(t["price_hr"] for t in entry["tried"])
    s = spot[0]
    assert s["zone"] == next(z for z in plan["spot"]["zones"] if z["region"] == s["region"])["tried"][0]["zone"]
    assert s["spot_prior"] and s["spot_price_hr"] > 0
    assert "*" not in (s["zone"] or "")
    assert f"spot {s['zone']}" in out and "prior" in out and "tries use1-az" in out
    r = cli_here("report", tmp_path / "plan.json", "--out", tmp_path / "report", "--no-replan")
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"spot {s['zone']} ${s['spot_price_hr']:.3f}/h prior" in report and "[prior — no traces of g5" in report


def test_plan_cli_says_why_a_stage_stays_on_demand(cli_here, tmp_path):
    plan, out = _plan_cli(cli_here, tmp_path, "12m", "p3.2xlarge")  # the shortest is 10m 15s
    od = [s for s in plan["stages"] if not s["spot"]]
    assert od and all(s["why_not_spot"] for s in od)
    assert "on-demand*" in out and f"* stage {od[0]['stage']} on-demand: {od[0]['why_not_spot']}" in out
