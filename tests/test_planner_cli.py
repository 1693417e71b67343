import json
import re

import pytest

from rubberband.catalog import head_types
from rubberband.plan import load_plan
from conftest import EXAMPLES


def test_plan_json_has_the_documented_keys(cli_here, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--json", "--samples", "200", "--out", out)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # stdout is only the plan JSON
    p = plan["predicted"]
    for key in ("mean", "p50", "p95"):
        assert p["jct_s"][key] > 0 and p["cost_usd"][key] > 0
    assert 0.95 <= p["p_meet_deadline"] <= 1.0
    assert plan["deadline_s"] == 31 * 60
    assert [s["trials"] for s in plan["stages"]] == [81, 27, 9, 3]
    assert [s["epochs"] for s in plan["stages"]] == [1, 3, 9, 27]
    for stage in plan["stages"]:
        assert stage["instance_type"] and stage["instances"] >= 1 and stage["workers_per_trial"] == 1
    static = plan["baselines"]["static"]
    assert static["predicted"]["cost_usd"]["mean"] >= p["cost_usd"]["mean"]
    assert len(static["stages"]) == 4 and len({s["instances"] for s in static["stages"]}) == 1
    assert plan["planner"]["candidates_evaluated"] > 0 and plan["planner"]["seconds"] > 0
    assert plan["planner"]["samples"] == 200
    assert plan["spec"]["name"] == "quickstart-resnet50" and plan["profile_path"].endswith(".json")
    assert plan["timeline"]["tasks"] and plan["timeline"]["instances"]
    # the file written with --out is the same plan and loads with the shared schema
    assert load_plan(out).predicted.cost_usd.mean == pytest.approx(p["cost_usd"]["mean"])
    # an aws run gets its own head instance by default: billed in the prediction and in the static baseline
    head = plan["head"]
    assert head["cloud"] == "aws" and head["instance_type"] == "m6i.large" and head["grace_s"] == 600
    assert head["boot_s"] > 0 and head["price_hr"] > 0
    # per second above the 60 s minimum: boot + mean JCT + grace, each sample rounded up to a second
    expected = (head["boot_s"] + p["jct_s"]["mean"] + head["grace_s"]) * head["price_hr"] / 3600
    assert p["cost_breakdown"]["head_usd"] == pytest.approx(expected, abs=head["price_hr"] / 3600)
    assert p["cost_by_instance_type"]["m6i.large"] == pytest.approx(p["cost_breakdown"]["head_usd"])
    assert static["predicted"]["cost_breakdown"]["head_usd"] > 0


def test_plan_table_compares_with_static(cli_here):
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--samples", "200")
    assert result.returncode == 0, result.stderr
    assert "best static plan" in result.stdout and "saves" in result.stdout
    assert "g5.xlarge" in result.stdout or "p3.2xlarge" in result.stdout
    price = re.escape(f"(${head_types()['aws'].price_hr:.4f}/h")
    assert re.search(r"head\s+instance\s+m6i\.large\s+" + price, result.stdout), result.stdout


def test_a_plan_for_head_local_bills_no_head(cli_here):
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--json", "--samples", "200", "--head", "local")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["head"] is None and plan["predicted"]["cost_breakdown"]["head_usd"] == 0
    assert "m6i.large" not in plan["predicted"]["cost_by_instance_type"]
    bad = cli_here("plan", EXAMPLES / "quickstart.yaml", "--head", "cloud")
    assert bad.returncode == 2 and "--head" in bad.stderr and "Traceback" not in bad.stderr


def test_infeasible_deadline_exits_3_with_shortest_jct_and_cost(cli_here):
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--deadline", "10m", "--samples", "100")
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "shortest feasible JCT" in lines[0] and "$" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--cloud", "mars"], "--cloud"),
        (["--confidence", "1.5"], "--confidence"),
        (["--deadline", "soon"], "--deadline"),
        (["--samples", "0"], "--samples"),
        (["--profile", "/nonexistent/profile.json"], "profile"),
    ],
)
def test_bad_flags_exit_2_with_one_line(cli_here, args, needle):
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


def test_malformed_profile_exits_2(cli_here, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"schema_version": 1, "workload": {"name": "x"}, "measurements": []}))
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--profile", bad)
    assert result.returncode == 2
    assert "profile field" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfe\x00binary", "profile is not valid JSON"),
        (b"{not json", "profile is not valid JSON"),
        (None, "is a directory"),
    ],
)
def test_unreadable_profile_exits_2(cli_here, tmp_path, content, needle):
    bad = tmp_path / "p.json"
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    result = cli_here("plan", EXAMPLES / "quickstart.yaml", "--profile", bad)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr
