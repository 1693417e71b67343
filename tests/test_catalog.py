import pytest

from rubberband.catalog import BILLING_RULES, BillingRule, load_catalog, parse_catalog
from rubberband.errors import CatalogError


@pytest.fixture(autouse=True)
def _shipped_catalogs_only(tmp_path, monkeypatch):
    """Read what rubberband ships, whatever the machine's ~/.rubberband/catalogs holds."""
    monkeypatch.setenv("RUBBERBAND_CATALOG_DIR", str(tmp_path / "no-user-catalogs"))


def test_shipped_catalogs_load_and_are_dated():
    catalog = load_catalog()
    assert set(catalog.clouds()) == {"aws", "gcp", "local"}
    assert all(len(date) == 10 for date in catalog.dates.values())
    p3 = catalog.find("p3.2xlarge", cloud="aws")
    assert p3.device == "V100" and p3.workers == 1 and p3.price_hr == pytest.approx(3.06)


def test_gcp_accelerators_compose_with_hosts():
    catalog = load_catalog(["gcp"])
    v100 = catalog.find("n1-standard-8+V100x1")
    assert v100.price_hr == pytest.approx(0.38 + 2.48) and v100.workers == 1


def test_local_types_hold_one_worker_per_cpu():
    catalog = load_catalog(["local"])
    assert [t.workers for t in catalog.types] == [1, 2, 4]


@pytest.mark.parametrize("lifetime, billed", [(0, 60), (10, 60), (60, 60), (60.2, 61), (3600, 3600)])
def test_aws_bills_per_second_with_a_minute_minimum(lifetime, billed):
    assert BILLING_RULES["aws"].billed_seconds(lifetime) == billed


def test_billing_cost():
    assert BillingRule(1, 60).cost(30, 3.6) == pytest.approx(0.06)


def test_filter_names_unknown_things():
    catalog = load_catalog()
    with pytest.raises(CatalogError, match="resources.instance_types: 'p9.huge'"):
        catalog.filter(clouds=["aws"], names=["p9.huge"])
    with pytest.raises(CatalogError, match="region 'mars-1'"):
        catalog.filter(clouds=["aws"], regions=["mars-1"])


def test_malformed_catalogs_fail_with_line():
    header = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
        "AvailabilityZone\n"
    )
    with pytest.raises(CatalogError, match="date"):
        parse_catalog("aws", header + "p3.2xlarge,V100,1,8,61,,3.06,,us-east-1,us-east-1a\n")
    with pytest.raises(CatalogError, match=":3: column Price"):
        parse_catalog("aws", "# date: 2025-01-01\n" + header + "p3.2xlarge,V100,1,8,61,,cheap,,us-east-1,a\n")
