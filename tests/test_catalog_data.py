"""The shipped catalogs: every row parses and the figures hold together."""

from __future__ import annotations

import csv
import io
import re
from importlib import resources

import pytest

from rubberband.catalog import N1_GPU_LIMITS, load_catalog, parse_catalog, shipped_catalog_text

AWS_TYPES = [
    "p3.2xlarge",
    "p3.8xlarge",
    "p3.16xlarge",
    "g4dn.xlarge",
    "g4dn.12xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "g5.48xlarge",
    "p4d.24xlarge",
    "p5.48xlarge",
]
AWS_REGIONS = ["us-east-1", "us-west-2"]
GCP_REGIONS = ["us-central1", "us-east1"]
GCP_TYPES = [
    "a2-highgpu-1g",
    "a2-highgpu-2g",
    "a2-highgpu-4g",
    "a2-highgpu-8g",
    "g2-standard-4",
    "g2-standard-48",
    "n1-standard-8+V100x1",
    "n1-standard-4+V100x8",
    "n1-standard-4+T4x1",
    "n1-standard-32+T4x4",
]


def _rows(cloud: str) -> list[dict]:
    lines = [line for line in shipped_catalog_text(cloud).splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


@pytest.fixture(scope="module")
def shipped():
    # An explicit empty user dir: these tests read what rubberband ships, whatever ~/.rubberband holds.
    return load_catalog(user_dir="/nonexistent-rubberband-user-dir")


@pytest.mark.parametrize("cloud", ["aws", "gcp", "local"])
def test_every_shipped_row_parses_and_is_dated(cloud):
    text = shipped_catalog_text(cloud)
    assert re.search(r"^# date: \d{4}-\d{2}-\d{2}$", text, re.M)
    assert re.search(r"^# source: \S", text, re.M)
    rows = _rows(cloud)
    assert rows, f"{cloud}.csv has no rows"
    for row in rows:
        price = float(row["Price"])
        assert price > 0, row
        if row["SpotPrice"]:
            assert 0 < float(row["SpotPrice"]) < price, row
        assert row["Region"] and row["AvailabilityZone"], row
    # One CSV row becomes exactly one (type, region, zone) fact: no duplicates.
    keys = [
        (r["InstanceType"], r["AcceleratorName"], r["AcceleratorCount"], r["Region"], r["AvailabilityZone"])
        for r in rows
    ]
    assert len(keys) == len(set(keys))
    assert parse_catalog(cloud, text).types


def test_catalog_data_comes_from_skypilot_commits():
    for cloud, commit in (
        ("aws", "001367d22a0033fac286a8c71aeac7109e431bcb"),
        ("gcp", "017e2502fb63c7a28757acd94002b2d6099d3e3d"),
    ):
        text = resources.files("rubberband.catalogs").joinpath(f"{cloud}.csv").read_text()
        assert "skypilot-org/skypilot-catalog" in text and commit in text


@pytest.mark.parametrize("region", AWS_REGIONS)
@pytest.mark.parametrize("name", AWS_TYPES)
def test_aws_types_exist_in_both_regions(shipped, name, region):
    t = shipped.find(name, cloud="aws", region=region)
    assert t.device != "CPU" and t.accelerator_count >= 1
    assert t.spot_price_hr is not None and t.spot_price_hr < t.price_hr
    assert set(t.spot_zones) <= set(t.zones)
    assert all(z.startswith({"us-east-1": "use1-az", "us-west-2": "usw2-az"}[region]) for z in t.zones)


@pytest.mark.parametrize("region", GCP_REGIONS)
@pytest.mark.parametrize("name", GCP_TYPES)
def test_gcp_offerings_exist_in_both_regions(shipped, name, region):
    t = shipped.find(name, cloud="gcp", region=region)
    assert t.zones and all(z.startswith(region + "-") for z in t.zones)
    assert t.spot_price_hr is not None and t.spot_price_hr < t.price_hr


def test_aws_prices_match_the_brief(shipped):
    """BRIEF.md's us-east-1 rows are the first zone (use1-az1) of the same snapshot."""
    brief = {
        "p3.2xlarge": (3.06, 0.5197),
        "p3.8xlarge": (12.24, 1.8029),
        "p3.16xlarge": (24.48, 4.8549),
        "g4dn.xlarge": (0.526, 0.2010),
        "g5.xlarge": (1.006, 0.4177),
        "p4d.24xlarge": (32.7726, 6.7915),
    }
    for name, (on_demand, spot) in brief.items():
        t = shipped.find(name, cloud="aws", region="us-east-1")
        assert t.price_hr == pytest.approx(on_demand)
        assert dict(t.zone_spot_prices)["use1-az1"] == pytest.approx(spot)
        assert t.spot_price_hr == min(dict(t.zone_spot_prices).values()) <= spot


def test_aws_zone_without_spot_keeps_its_on_demand_row(shipped):
    p3 = shipped.find("p3.2xlarge", cloud="aws", region="us-east-1")
    assert "use1-az3" in p3.zones and "use1-az3" not in p3.spot_zones
    assert p3.spot_zones[0] == "use1-az1"  # cheapest spot zone first


def _gcp_part(accel: str, count: int, region: str, column: str) -> float:
    values = {
        float(r[column])
        for r in _rows("gcp")
        if not r["InstanceType"]
        and r["AcceleratorName"] == accel
        and int(r["AcceleratorCount"]) == count
        and r["Region"] == region
    }
    assert len(values) == 1
    return values.pop()


def _gcp_host(name: str, region: str, column: str) -> float:
    values = {float(r[column]) for r in _rows("gcp") if r["InstanceType"] == name and r["Region"] == region}
    assert len(values) == 1
    return values.pop()


@pytest.mark.parametrize("region", GCP_REGIONS)
def test_gcp_composition_price_is_host_plus_gpu(shipped, region):
    composed = [t for t in shipped.types if t.cloud == "gcp" and t.region == region]
    assert len(composed) >= 20
    for t in composed:
        for column, value in (("Price", t.price_hr), ("SpotPrice", t.spot_price_hr)):
            expected = _gcp_host(t.host_type, region, column) + _gcp_part(t.device, t.accelerator_count, region, column)
            assert value == pytest.approx(expected, abs=1e-9), (t.name, column)
    brief = shipped.find("n1-standard-8+V100x1", cloud="gcp", region="us-central1")
    assert brief.price_hr == pytest.approx(0.38 + 2.48) and brief.spot_price_hr == pytest.approx(0.0963 + 0.992)
    a2 = shipped.find("a2-highgpu-1g", cloud="gcp", region="us-central1")
    assert a2.price_hr == pytest.approx(0.73948 + 2.93391)  # brief's host-only 0.73948 plus one A100


def test_gcp_compositions_follow_gcps_n1_limits(shipped):
    n1 = [t for t in shipped.types if t.cloud == "gcp" and t.host_type.startswith("n1-")]
    for t in n1:
        max_vcpus, max_memory = N1_GPU_LIMITS[t.device][t.accelerator_count]
        assert t.vcpus <= max_vcpus and t.memory_gib <= max_memory, t.name
    names = {t.name for t in n1}
    assert "n1-standard-16+V100x1" not in names  # 1 V100 allows at most 12 vCPUs
    assert "n1-standard-32+V100x2" not in names  # 2 V100s allow at most 24 vCPUs
    assert not any(t.device == "T4" and t.accelerator_count == 8 for t in n1)  # GCP offers 1, 2 or 4 T4s
    assert {"n1-standard-32+V100x8", "n1-standard-32+T4x1"} <= names


def test_gcp_zones_intersect(shipped):
    # In us-east1 V100s are sold in zone c only, A100s (a2) in zone b only.
    assert shipped.find("n1-standard-8+V100x1", cloud="gcp", region="us-east1").zones == ("us-east1-c",)
    assert shipped.find("a2-highgpu-8g", cloud="gcp", region="us-east1").zones == ("us-east1-b",)
    assert shipped.find("n1-standard-8+T4x1", cloud="gcp", region="us-east1").zones == ("us-east1-c", "us-east1-d")


def test_gpu_naming(shipped):
    gcp = {t.name: t for t in shipped.types if t.cloud == "gcp" and t.region == "us-central1"}
    assert (gcp["a2-highgpu-8g"].device, gcp["a2-highgpu-8g"].accelerator_memory_gib) == ("A100", 40)
    assert (gcp["g2-standard-48"].device, gcp["g2-standard-48"].accelerator_count) == ("L4", 4)
    aws = {t.name: t for t in shipped.types if t.cloud == "aws" and t.region == "us-east-1"}
    assert (aws["p5.48xlarge"].device, aws["p5.48xlarge"].accelerator_memory_gib) == ("H100", 80)
    assert aws["g5.xlarge"].device == "A10G"


@pytest.mark.parametrize(
    "cloud, region, order",
    [
        ("aws", "us-east-1", ["T4", "A10G", "V100", "A100", "H100"]),
        ("aws", "us-west-2", ["T4", "A10G", "V100", "A100", "H100"]),
        ("gcp", "us-central1", ["T4", "L4", "V100", "A100"]),
        ("gcp", "us-east1", ["T4", "L4", "V100", "A100"]),
    ],
)
def test_per_worker_prices_order_by_gpu_generation(shipped, cloud, region, order):
    types = [t for t in shipped.types if t.cloud == cloud and t.region == region]
    cheapest = [min(t.price_per_worker() for t in types if t.device == device) for device in order]
    assert cheapest == sorted(cheapest), dict(zip(order, cheapest))
    for t in types:
        # A worker never costs more than the whole machine, and spot is cheaper per worker too.
        assert t.price_per_worker() <= t.price_hr
        assert t.price_per_worker(spot=True) < t.price_per_worker()


def test_aws_multi_gpu_types_price_linearly_per_worker(shipped):
    for region in AWS_REGIONS:
        small, big = (shipped.find(n, cloud="aws", region=region) for n in ("p3.2xlarge", "p3.16xlarge"))
        assert big.price_per_worker() == pytest.approx(small.price_per_worker())
