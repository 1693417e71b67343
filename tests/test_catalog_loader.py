"""Loader behaviour: the user catalog directory, per-zone spot prices, GCP composition rules."""

from __future__ import annotations

import pytest

from rubberband.catalog import CATALOG_DIR_ENV, load_catalog, n1_accepts, parse_catalog, user_catalog_dir
from rubberband.errors import CatalogError

AWS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
)
GCP_HEADER = (
    "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice\n"
)
REFRESHED = "# date: 2026-01-02\n" + AWS_HEADER + "p3.2xlarge,V100,1,8,61,,2.50,0.40,us-east-1,use1-az1\n"


def test_user_catalog_dir_follows_the_environment(tmp_path):
    assert user_catalog_dir({CATALOG_DIR_ENV: str(tmp_path)}) == tmp_path
    assert user_catalog_dir({"HOME": "/ignored"}).parts[-2:] == (".rubberband", "catalogs")


def test_refreshed_catalog_replaces_the_shipped_one(tmp_path, monkeypatch):
    (tmp_path / "aws.csv").write_text(REFRESHED)
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path))
    catalog = load_catalog(["aws", "gcp"])
    assert catalog.dates["aws"] == "2026-01-02" and catalog.sources["aws"] == str(tmp_path / "aws.csv")
    assert [t.name for t in catalog.types if t.cloud == "aws"] == ["p3.2xlarge"]
    assert catalog.find("p3.2xlarge").price_hr == 2.50
    # Clouds the user did not refresh still load from the shipped files.
    assert catalog.sources["gcp"] == "shipped:gcp.csv" and catalog.dates["gcp"] == "2025-05-31"


def test_without_a_user_catalog_the_shipped_one_loads_offline(tmp_path, monkeypatch):
    monkeypatch.setenv(CATALOG_DIR_ENV, str(tmp_path / "missing"))
    catalog = load_catalog()
    assert catalog.sources == {"aws": "shipped:aws.csv", "gcp": "shipped:gcp.csv", "local": "shipped:local.csv"}


def test_a_broken_user_catalog_is_named_in_the_error(tmp_path):
    (tmp_path / "aws.csv").write_text(AWS_HEADER + "p3.2xlarge,V100,1,8,61,,3.06,,us-east-1,use1-az1\n")
    with pytest.raises(CatalogError, match=r"aws.csv: catalog has no '# date: YYYY-MM-DD' line"):
        load_catalog(["aws"], user_dir=tmp_path)


def test_explicit_directory_needs_every_cloud(tmp_path):
    (tmp_path / "aws.csv").write_text(REFRESHED)
    assert load_catalog(["aws"], directory=tmp_path).sources["aws"] == str(tmp_path / "aws.csv")
    with pytest.raises(CatalogError, match="gcp.csv does not exist"):
        load_catalog(["gcp"], directory=tmp_path)
    with pytest.raises(CatalogError, match="unknown cloud 'azure'"):
        load_catalog(["azure"])


def test_spot_is_per_zone_and_the_cheapest_zone_wins():
    text = (
        "# date: 2025-01-01\n"
        + AWS_HEADER
        + (
            "p3.2xlarge,V100,1,8,61,,3.06,0.70,us-east-1,use1-az2\n"
            "p3.2xlarge,V100,1,8,61,,3.06,,us-east-1,use1-az3\n"
            "p3.2xlarge,V100,1,8,61,,3.06,0.52,us-east-1,use1-az1\n"
        )
    )
    t = parse_catalog("aws", text).types[0]
    assert t.zones == ("use1-az2", "use1-az3", "use1-az1")
    assert t.spot_price_hr == 0.52 and t.zone_spot_prices == (("use1-az1", 0.52), ("use1-az2", 0.70))
    assert t.price(spot=True) == 0.52 and t.price_per_worker() == 3.06


def test_type_without_any_spot_zone_refuses_spot():
    text = "# date: 2025-01-01\n" + AWS_HEADER + "p3.2xlarge,V100,1,8,61,,3.06,,us-east-1,use1-az3\n"
    t = parse_catalog("aws", text).types[0]
    assert t.spot_price_hr is None and t.spot_zones == ()
    with pytest.raises(CatalogError, match="has no spot price"):
        t.price(spot=True)


def test_negative_spot_is_rejected_with_its_line():
    with pytest.raises(CatalogError, match=r":3: SpotPrice must be a positive"):
        parse_catalog("aws", "# date: 2025-01-01\n" + AWS_HEADER + "p3.2xlarge,V100,1,8,61,,3.06,-1,us-east-1,a\n")


def test_n1_limits():
    assert n1_accepts("V100", 1, 8, 30) and not n1_accepts("V100", 1, 16, 60)
    assert n1_accepts("T4", 1, 32, 120) and not n1_accepts("T4", 8, 4, 15)
    assert not n1_accepts("A100", 1, 4, 15)  # A100s only come bundled with a2 hosts


def test_bundled_host_needs_its_gpu_row_in_a_shared_zone():
    host = "a2-highgpu-1g,12,85,A100,1,,us-central1,us-central1-a,0.73948,0.29576\n"
    with pytest.raises(CatalogError, match=r"a2-highgpu-1g needs a price row for 1x A100 in us-central1"):
        parse_catalog("gcp", "# date: 2025-01-01\n" + GCP_HEADER + host)
    gpu_elsewhere = ",,,A100,1,,us-central1,us-central1-b,2.93391,1.1472\n"
    with pytest.raises(CatalogError, match="share no zone"):
        parse_catalog("gcp", "# date: 2025-01-01\n" + GCP_HEADER + host + gpu_elsewhere)


def test_n1_host_composes_only_where_both_are_sold():
    text = (
        "# date: 2025-01-01\n"
        + GCP_HEADER
        + (
            "n1-standard-8,8,30,,,,us-east1,us-east1-b,0.38,0.0963\n"
            "n1-standard-8,8,30,,,,us-east1,us-east1-c,0.38,0.0963\n"
            ",,,V100,1,,us-east1,us-east1-c,2.48,0.992\n"
            ",,,T4,1,,us-east1,us-east1-d,0.35,0.14\n"
        )
    )
    names = {t.name: t for t in parse_catalog("gcp", text).types}
    assert set(names) == {"n1-standard-8+V100x1"}  # T4 only in zone d, where no host is sold
    v100 = names["n1-standard-8+V100x1"]
    assert v100.zones == ("us-east1-c",) and v100.price_hr == 2.86 and v100.spot_price_hr == 1.0883
