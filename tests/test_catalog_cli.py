"""`rubberband catalog show`: the real CLI in a subprocess."""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture
def env(tmp_path):
    environment = dict(os.environ)
    environment["RUBBERBAND_CATALOG_DIR"] = str(tmp_path / "no-user-catalogs")
    return environment


def test_show_prints_a_dated_table(cli_here, env):
    result = cli_here("catalog", "show", "--cloud", "gcp", "--gpu", "v100", "--region", "us-east1", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "prices as of gcp 2025-05-31 (shipped:gcp.csv)" in out
    lines = [line for line in out.splitlines() if "n1-standard" in line]
    assert len(lines) == 13  # every documented N1 + V100 combination with these hosts
    assert all("V100 ×" in line and "us-east1" in line for line in lines)
    first = lines[0].split("│")
    # Cheapest per worker first: n1-standard-4 + 8 V100s, (0.19 + 19.84) / 8.
    assert "n1-standard-4+V100x8" in first[3] and first[9].strip() == "2.5038" and first[10].strip() == "c"


def test_show_spot_prices_per_worker_at_spot(cli_here, env):
    result = cli_here("catalog", "show", "--cloud", "aws", "--region", "us-east-1", "--spot", "--gpu", "V100", env=env)
    assert result.returncode == 0, result.stderr
    rows = [line.split("│") for line in result.stdout.splitlines() if "p3." in line]
    per_worker = [float(r[9]) for r in rows]
    assert per_worker == sorted(per_worker)
    assert [r[3].strip() for r in rows] == ["p3.16xlarge", "p3.8xlarge", "p3.2xlarge"]
    assert per_worker[0] == pytest.approx(2.7531 / 8, abs=1e-4)


def test_show_json_carries_dates_sources_and_prices(cli_here, env):
    result = cli_here("catalog", "show", "--json", env=env)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["dates"] == {"aws": "2025-05-31", "gcp": "2025-05-31", "local": "2026-11-21"}
    assert set(payload["sources"].values()) == {"shipped:aws.csv", "shipped:gcp.csv", "shipped:local.csv"}
    by_key = {(t["cloud"], t["region"], t["name"]): t for t in payload["types"]}
    p3 = by_key[("aws", "us-east-1", "p3.2xlarge")]
    assert (p3["price_hr"], p3["spot_price_hr"], p3["workers"], p3["device"]) == (3.06, 0.5197, 1, "V100")
    assert p3["spot_zones"][0] == "use1-az1" and "use1-az3" in p3["zones"]
    g2 = by_key[("gcp", "us-central1", "g2-standard-48")]
    assert g2["price_per_worker_hr"] == pytest.approx((1.7615 + 2.24016) / 4, abs=1e-6)
    assert {t["cloud"] for t in payload["types"]} == {"aws", "gcp", "local"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cloud", "azure"], "rubberband: error: --cloud must be one of aws, gcp, local (got 'azure')"),
        (["--gpu", "K80"], "rubberband: error: --gpu 'K80' is not in the catalog; use one of"),
        (
            ["--cloud", "aws", "--region", "us-central1"],
            "rubberband: error: --region 'us-central1' is not in the catalog for aws; use one of us-east-1, us-west-2",
        ),
        (["--frobnicate"], "rubberband: error: No such option: --frobnicate"),
    ],
)
def test_bad_flags_exit_2_with_one_line(cli_here, env, args, message):
    result = cli_here("catalog", "show", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_update_refuses_other_clouds(cli_here, env):
    result = cli_here("catalog", "update", "gcp", env=env)
    assert result.returncode == 2
    assert result.stderr == (
        "rubberband: error: catalog update refreshes aws (got 'gcp'); other clouds' prices ship with rubberband\n"
    )
