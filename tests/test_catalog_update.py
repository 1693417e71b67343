"""`rubberband catalog update aws` against a moto server (prices from a Price List fake in the server)."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from moto.core.responses import ActionResult
from moto.ec2.responses.spot_instances import SpotInstances

from rubberband.catalog import load_catalog, parse_catalog
from rubberband.cloud.aws.pricing import zone_names_by_id
from catalog_helpers import aws_env, moto_with_prices

PRICES = {
    ("g5.xlarge", "us-east-1"): 1.006,
    ("p4d.24xlarge", "us-east-1"): 32.7726,
    ("p3.8xlarge", "us-east-1"): 12.24,
    ("g4dn.xlarge", "us-east-1"): 0.526,
}


def _zone_ids(endpoint: str) -> dict[str, str]:
    """Zone name -> zone ID as the moto server reports them (checked against zone_names_by_id)."""
    ec2 = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    ids = {z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}
    assert zone_names_by_id(ec2) == {zone_id: name for name, zone_id in ids.items()}
    assert len(set(ids.values())) == len(ids)
    return ids


def test_update_writes_a_dated_catalog_that_load_catalog_then_prefers(cli, tmp_path):
    with moto_with_prices(PRICES) as price_list:
        env = aws_env(price_list.endpoint, tmp_path)
        result = cli(
            "catalog",
            "update",
            "aws",
            "--region",
            "us-east-1",
            "--type",
            "g5.xlarge",
            "--type",
            "p4d.24xlarge",
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert {(c["instanceType"], c["regionCode"], c["operatingSystem"], c["tenancy"]) for c in price_list.calls} == {
            ("g5.xlarge", "us-east-1", "Linux", "Shared"),
            ("p4d.24xlarge", "us-east-1", "Linux", "Shared"),
        }
        zone_ids = _zone_ids(price_list.endpoint)

    written = tmp_path / "catalogs" / "aws.csv"
    assert f"wrote {written}" in result.stderr
    assert [p.name for p in written.parent.iterdir()] == ["aws.csv"]  # no temporary file left behind
    text = written.read_text()
    catalog = parse_catalog("aws", text, path=written)
    assert catalog.dates["aws"] == dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    assert "# source: AWS Price List API" in text
    g5 = catalog.find("g5.xlarge", region="us-east-1")
    p4d = catalog.find("p4d.24xlarge", region="us-east-1")
    # Hardware from moto's DescribeInstanceTypes, prices from the Price List, zones as zone IDs.
    assert (g5.device, g5.accelerator_count, g5.vcpus, g5.memory_gib, g5.price_hr) == ("A10G", 1, 4, 16, 1.006)
    assert (p4d.device, p4d.accelerator_count, p4d.vcpus, p4d.price_hr) == ("A100", 8, 96, 32.7726)
    assert set(g5.zones) <= set(zone_ids.values()) and len(g5.zones) >= 3
    assert g5.spot_price_hr == pytest.approx(0.00001)  # moto's own (fake) spot price
    assert set(g5.spot_zones) <= set(g5.zones)

    # The user catalog now replaces the shipped one, for the CLI and for load_catalog alike.
    shown = cli("catalog", "show", "--cloud", "aws", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    import json

    payload = json.loads(shown.stdout)
    assert payload["sources"] == {"aws": str(written)}
    assert {t["name"] for t in payload["types"]} == {"g5.xlarge", "p4d.24xlarge"}
    assert load_catalog(["aws"], user_dir=written.parent).sources["aws"] == str(written)


def test_update_keeps_the_latest_linux_spot_price_per_zone(cli, tmp_path, monkeypatch):
    """moto's spot history is one fixed price, so the server's response is patched with a real-shaped history."""
    now = dt.datetime.now(dt.timezone.utc)
    history = [  # (type, zone name, product, price, age)
        ("p3.8xlarge", "us-east-1a", "Linux/UNIX", "5.0", dt.timedelta(hours=5)),
        ("p3.8xlarge", "us-east-1a", "Linux/UNIX", "1.8029", dt.timedelta(minutes=5)),
        ("p3.8xlarge", "us-east-1b", "Linux/UNIX", "2.0691", dt.timedelta(hours=1)),
        ("p3.8xlarge", "us-east-1b", "Windows", "0.01", dt.timedelta(minutes=1)),
        ("g4dn.xlarge", "us-east-1c", "Linux/UNIX (Amazon VPC)", "0.2010", dt.timedelta(minutes=2)),
    ]

    def describe_spot_price_history(self):
        wanted = set(self._get_param("InstanceTypes", []))
        return ActionResult(
            {
                "SpotPriceHistory": [
                    {
                        "InstanceType": t,
                        "AvailabilityZone": z,
                        "ProductDescription": d,
                        "SpotPrice": p,
                        "Timestamp": (now - age).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                    }
                    for t, z, d, p, age in history
                    if not wanted or t in wanted
                ]
            }
        )

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)
    with moto_with_prices(PRICES) as price_list:
        env = aws_env(price_list.endpoint, tmp_path)
        out = tmp_path / "elsewhere"
        result = cli(
            "catalog",
            "update",
            "aws",
            "--region",
            "us-east-1",
            "--type",
            "p3.8xlarge",
            "--type",
            "g4dn.xlarge",
            "--out",
            str(out),
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        zone_ids = _zone_ids(price_list.endpoint)

    assert not (tmp_path / "catalogs").exists()  # --out wins over RUBBERBAND_CATALOG_DIR
    catalog = parse_catalog("aws", (out / "aws.csv").read_text())
    p3 = catalog.find("p3.8xlarge", region="us-east-1")
    # moto does not describe p3.8xlarge: its hardware comes from the shipped catalog.
    assert (p3.device, p3.accelerator_count, p3.vcpus, p3.memory_gib, p3.price_hr) == ("V100", 4, 32, 244, 12.24)
    assert dict(p3.zone_spot_prices) == {zone_ids["us-east-1a"]: 1.8029, zone_ids["us-east-1b"]: 2.0691}
    assert p3.spot_price_hr == 1.8029 and p3.spot_zones[0] == zone_ids["us-east-1a"]
    g4dn = catalog.find("g4dn.xlarge", region="us-east-1")
    assert dict(g4dn.zone_spot_prices) == {zone_ids["us-east-1c"]: 0.201}
    assert len(g4dn.zones) > 1  # offered zones without a spot price keep an on-demand row


def test_update_without_credentials_fails_in_one_line_and_writes_nothing(cli, tmp_path):
    with moto_with_prices(PRICES) as price_list:
        result = cli(
            "catalog",
            "update",
            "aws",
            "--region",
            "us-east-1",
            "--type",
            "g5.xlarge",
            env=aws_env(price_list.endpoint, tmp_path, credentials=False),
            timeout=120,
        )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no AWS credentials found" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "catalogs").exists()


def test_update_api_error_keeps_the_previous_catalog(cli, tmp_path):
    previous = tmp_path / "catalogs" / "aws.csv"
    previous.parent.mkdir()
    previous.write_text("# date: 2025-01-01\nprevious file\n")
    with moto_with_prices(PRICES, fail_with="AccessDeniedException") as price_list:
        result = cli(
            "catalog",
            "update",
            "aws",
            "--region",
            "us-east-1",
            "--type",
            "g5.xlarge",
            env=aws_env(price_list.endpoint, tmp_path),
            timeout=120,
        )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "rubberband: error: AWS pricing:GetProducts failed: AccessDeniedException: injected by the test harness"
    )
    assert previous.read_text() == "# date: 2025-01-01\nprevious file\n"
    assert [p.name for p in previous.parent.iterdir()] == ["aws.csv"]


def test_update_with_no_prices_writes_nothing(cli, tmp_path):
    with moto_with_prices({}) as price_list:
        result = cli(
            "catalog",
            "update",
            "aws",
            "--region",
            "us-east-1",
            "--type",
            "g5.xlarge",
            env=aws_env(price_list.endpoint, tmp_path),
            timeout=120,
        )
    assert result.returncode == 2
    assert "AWS returned no prices for g5.xlarge in us-east-1; nothing written" in result.stderr
    assert not (tmp_path / "catalogs").exists()
