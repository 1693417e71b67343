"""``rubberband spot fit/show``, ``rubberband simulate`` and ``rubberband plan`` with spot, through the real CLI."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES

pytestmark = pytest.mark.e2e

SPEC = """name: spot-cli
train: cifar_resnet:train
metric: {{name: val_acc, mode: max}}
search_space:
  lr: {{type: loguniform, low: 0.001, high: 0.3}}
scheduler: {{kind: sha, trials: 27, eta: 3, min_epochs: 1, max_epochs: 9}}
deadline: {deadline}
confidence: 0.9
resources:
  clouds: [aws]
  instance_types: [p3.2xlarge]
  max_workers_per_trial: 1
  spot: true
profile: {profile}
seed: 0
"""


def _trace(path, data, gap=60):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))


@pytest.fixture(scope="module")
def spot_plan(tmp_path_factory):
    from conftest import run_cli_here

    d = tmp_path_factory.mktemp("spot")
    spec = d / "spot.yaml"
    spec.write_text(SPEC.format(deadline="40m", profile=EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    plan = d / "plan.json"
    r = run_cli_here("plan", spec, "--samples", "100", "--out", plan)
    assert r.returncode == 0, r.stderr
    return d, plan, r.stdout


def test_plan_shows_the_market_per_stage_and_the_spot_assumptions(spot_plan):
    _, plan, out = spot_plan
    assert "market" in out and "Spot:" in out
    data = json.loads(plan.read_text())
    assert data["schema_version"] == 3 and data["spot"]["zones"]
    assert any(s["spot"] for s in data["stages"])


def test_simulate_with_the_plans_own_model_and_with_traces(cli_here, spot_plan, tmp_path):
    d, plan, _ = spot_plan
    r = cli_here("simulate", plan, "--samples", "100", "--json")
    assert r.returncode == 0, r.stderr
    own = json.loads(r.stdout)
    assert 0 <= own["hit_rate"] <= 1 and own["cost_usd"]["p10"] <= own["cost_usd"]["p50"] <= own["cost_usd"]["p90"]
    # traces where spot never has capacity: every spot stage falls back to on-demand (dearer, never preempted)
    _trace(tmp_path / "availability" / "aws-x" / "us-east-1a_v100_1.json", [1] * 500)
    _trace(tmp_path / "preemption" / "aws-x" / "us-east-1a_v100_1.json", [1] * 500)
    r = cli_here("simulate", plan, "--samples", "100", "--json", "--preemption-traces", tmp_path)
    assert r.returncode == 0, r.stderr
    never = json.loads(r.stdout)
    assert never["cost_usd"]["mean"] > own["cost_usd"]["mean"] and "traces" in never["source"]
    assert never["spot_events_mean"]["stages_on_demand"] >= 1 and never["spot_events_mean"]["preemptions"] == 0
    r = cli_here("simulate", plan, "--samples", "100")
    assert r.returncode == 0 and "hit rate" in r.stdout and "p90" in r.stdout


def test_spot_fit_and_show(cli, tmp_path):  # the real entry point, in a subprocess (the others run in this process)
    _trace(tmp_path / "t" / "preemption" / "aws-x" / "us-east-1a_v100_1.json", [0] * 50 + [1] * 10 + [0] * 60)
    out = tmp_path / "model.json"
    r = cli("spot", "fit", "--traces", tmp_path / "t", "--out", out)
    assert r.returncode == 0, r.stderr
    model = json.loads(out.read_text())
    assert model["zones"][0]["zone"] == "us-east-1a" and model["zones"][0]["preemptions"] == 1
    r = cli("spot", "show")
    assert r.returncode == 0 and "us-east-1a" in r.stdout and "p3.2xlarge" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["spot", "fit", "--traces", "{tmp}/missing", "--out", "{tmp}/m.json"], "does not exist"),
        (["spot", "fit", "--traces", "{tmp}/bad", "--out", "{tmp}/m.json"], "gap_seconds"),
        (["simulate", "{tmp}/nope.json"], "does not exist"),
        (["simulate", "{plan}", "--preemption-traces", "{tmp}/bad"], "gap_seconds"),
        (["simulate", "{plan}", "--samples", "3"], "--samples"),
        (["spot", "show", "{tmp}/bad/preemption/aws-x/us-east-1a_v100_1.json"], "spot model"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(cli_here, spot_plan, tmp_path, args, needle):
    _, plan, _ = spot_plan
    bad = tmp_path / "bad" / "preemption" / "aws-x" / "us-east-1a_v100_1.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"metadata": {"gap_seconds": 0}, "data": [0]}')
    r = cli_here(*[a.format(tmp=tmp_path, plan=plan) for a in args])
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "m.json").exists()


def test_simulate_an_on_demand_plan_ignores_traces(cli_here, tmp_path):
    plan = tmp_path / "plan.json"
    r = cli_here("plan", EXAMPLES / "quickstart.yaml", "--samples", "50", "--out", plan)
    assert r.returncode == 0, r.stderr
    assert json.loads(plan.read_text())["spot"] is None
    r = cli_here("simulate", plan, "--samples", "50", "--json")
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert figures["spot_stages"] == 0 and figures["hit_rate"] >= 0.9
