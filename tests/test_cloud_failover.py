"""The shared error table, the failover order, blocking and bounded backoff (pure, no cloud)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cloud_helpers import at_once, cloud_catalog

from rubberband.catalog import InstanceType
from rubberband.cloud.aws.quotas import AWS_QUOTAS
from rubberband.cloud.failover import (
    ERROR_TABLE,
    CallContext,
    FailoverExhausted,
    FailoverPolicy,
    RetryPolicy,
    alternatives_for,
    call_with_retry,
    classify,
    provision_with_failover,
)
from rubberband.cloud.provider import Instance, InstanceRequest
from rubberband.errors import CloudError

CATALOG = cloud_catalog()
P3 = CATALOG.find("p3.2xlarge", cloud="aws")


@pytest.mark.parametrize(
    "cloud, code, kind",
    [
        ("aws", "InsufficientInstanceCapacity", "capacity"),
        ("aws", "VcpuLimitExceeded", "quota"),
        ("aws", "MaxSpotInstanceCountExceeded", "quota"),
        ("aws", "RequestLimitExceeded", "transient"),
        ("aws", "AuthFailure", "fatal"),
        ("aws", "UnauthorizedOperation", "fatal"),
        ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", "capacity"),
        ("gcp", "QUOTA_EXCEEDED", "quota"),
        ("gcp", "rateLimitExceeded", "transient"),
        ("gcp", "PERMISSION_DENIED", "fatal"),
    ],
)
def test_error_table(cloud, code, kind):
    assert ERROR_TABLE[code].kind == kind
    err = classify(
        code,
        "details\nover two lines",
        CallContext(cloud, zone="z-1", region="r-1", instance_type="p3.2xlarge"),
        quota="GPUS_ALL_REGIONS" if cloud == "gcp" else None,
    )
    assert err.kind == kind and err.code == code and "\n" not in err.message and "p3.2xlarge" in err.message


def test_unknown_codes_fall_back_on_http_status():
    assert classify("Weird", "x", CallContext("aws"), http_status=503).kind == "transient"
    assert classify("", "x", CallContext("gcp"), http_status=429).kind == "transient"
    assert classify("", "x", CallContext("gcp"), http_status=403).kind == "fatal"
    assert classify("Weird", "x", CallContext("aws"), http_status=400).kind == "fatal"
    assert (
        "Running On-Demand G and VT"
        in classify("VcpuLimitExceeded", "x", CallContext("aws", instance_type="g5.xlarge", quotas=AWS_QUOTAS)).message
    )
    assert (
        "Standard"
        in classify("VcpuLimitExceeded", "x", CallContext("aws", instance_type="m6i.large", quotas=AWS_QUOTAS)).message
    )


def test_backoff_is_exponential_and_bounded():
    delays: list[float] = []
    retry = RetryPolicy(max_tries=6, base_s=1, cap_s=10, sleep=delays.append, rng=random.Random(1))
    calls = []

    def flaky():
        calls.append(1)
        raise CloudError("throttled", kind="transient")

    with pytest.raises(CloudError):
        call_with_retry(flaky, retry)
    assert len(calls) == 6 and len(delays) == 5
    for attempt, delay in enumerate(delays):
        ceiling = min(10, 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    fatal_calls = []

    def denied():
        fatal_calls.append(1)
        raise CloudError("no", kind="fatal")

    with pytest.raises(CloudError):
        call_with_retry(denied, retry)
    assert fatal_calls == [1]  # fatal errors are never retried


def test_alternatives_are_same_shape_cheapest_first():
    alts = alternatives_for(P3, CATALOG, clouds=["aws", "gcp"])
    assert [a.name for a in alts] == ["n1-standard-8+V100x1"]  # 1x V100, cheaper than p3.2xlarge
    any_device = alternatives_for(P3, CATALOG, same_device=False, clouds=["aws"])
    prices = [a.price_hr for a in any_device]
    assert prices == sorted(prices) and {a.workers for a in any_device} == {1} and P3 not in any_device


class ScriptedProvider:
    """Answers provision() from a script keyed by (type, zone); records the order of calls."""

    cloud = "aws"

    def __init__(self, outcomes: dict[tuple[str, str], str]):
        self.outcomes, self.calls = outcomes, []

    def provision(self, request: InstanceRequest) -> list[Instance]:
        key = (request.instance_type.name, request.zone)
        self.calls.append(key)
        kind = self.outcomes.get(key, "ok")
        if kind == "quota-all":
            raise CloudError("quota", kind="quota", quota="GPUS_ALL_REGIONS")
        if kind != "ok":
            raise CloudError(f"{kind} at {key}", kind=kind)
        return [
            Instance(id="i-1", cloud="aws", instance_type=key[0], zone=key[1], state="pending", run_id=request.run_id)
        ]


def test_failover_order_blocking_and_fatal_stop():
    other_region = dataclasses.replace(P3, region="us-west-2", zones=("us-west-2a",))
    alt = InstanceType("aws", "p3.alt", "us-east-1", ("use1-az4",), "V100", 1, 8, 61, 3.5, None)
    scripted = ScriptedProvider({("p3.2xlarge", "use1-az1"): "capacity", ("p3.2xlarge", "use1-az2"): "quota"})
    policy = FailoverPolicy()
    result = provision_with_failover(
        InstanceRequest("r", 0, P3), lambda t: scripted, alternatives=[alt, other_region], policy=policy
    )
    # capacity → next zone; quota → whole region blocked (alt skipped) → next region
    assert [(a.instance_type, a.region, a.outcome) for a in result.attempts] == [
        ("p3.2xlarge", "us-east-1", "capacity"),
        ("p3.2xlarge", "us-east-1", "quota"),
        ("p3.alt", "us-east-1", "skipped"),
        ("p3.2xlarge", "us-west-2", "ok"),
    ]
    assert scripted.calls == [("p3.2xlarge", "use1-az1"), ("p3.2xlarge", "use1-az2"), ("p3.2xlarge", "us-west-2a")]
    fatal = ScriptedProvider({("p3.2xlarge", "use1-az1"): "fatal"})
    with pytest.raises(FailoverExhausted) as info:
        provision_with_failover(InstanceRequest("r", 0, P3), lambda t: fatal, alternatives=[alt])
    assert info.value.kind == "fatal" and fatal.calls == [("p3.2xlarge", "use1-az1")]
    everywhere = ScriptedProvider({("p3.2xlarge", "use1-az1"): "quota-all"})
    policy = FailoverPolicy()
    with pytest.raises(FailoverExhausted):
        provision_with_failover(
            InstanceRequest("r", 0, P3), lambda t: everywhere, alternatives=[other_region], policy=policy
        )
    assert policy.blocked_clouds == {"aws"} and len(everywhere.calls) == 1


def test_a_spot_request_tries_the_zones_with_a_spot_offer_cheapest_first_the_order_the_planner_prices():
    p3 = dataclasses.replace(
        P3,
        zones=("use1-az1", "use1-az2", "use1-az3"),
        zone_spot_prices=(("use1-az2", 0.5), ("use1-az1", 0.6)),  # az3 sells no spot
        spot_price_hr=0.5,
    )
    assert p3.zones_to_try(spot=True) == ("use1-az2", "use1-az1") and p3.zones_to_try() == p3.zones
    assert p3.zone_price("use1-az1", spot=True) == 0.6 and p3.zone_price("use1-az3") == p3.price_hr
    scripted = ScriptedProvider({("p3.2xlarge", "use1-az2"): "capacity", ("p3.2xlarge", "use1-az1"): "capacity"})
    with pytest.raises(FailoverExhausted):
        provision_with_failover(InstanceRequest("r", 0, p3, spot=True), lambda t: scripted)
    assert scripted.calls == [("p3.2xlarge", "use1-az2"), ("p3.2xlarge", "use1-az1")]  # never az3 on spot
    on_demand = ScriptedProvider({("p3.2xlarge", "use1-az1"): "capacity"})
    got = provision_with_failover(InstanceRequest("r", 0, p3), lambda t: on_demand)
    assert on_demand.calls == [("p3.2xlarge", "use1-az1"), ("p3.2xlarge", "use1-az2")] and got.zone == "use1-az2"


def test_provider_pool_builds_one_provider_per_region():
    from rubberband.cloud.registry import ProviderPool, make_provider
    from rubberband.errors import InputError

    built = []

    def factory(cloud, region, **options):
        built.append((cloud, region, options))
        return ScriptedProvider({})

    pool = ProviderPool({"aws": {"ssh_cidr": "203.0.113.7/32"}}, factory=factory)
    assert pool("aws", "us-east-1") is pool.for_type(P3) and pool("aws", "us-west-2") is not pool.for_type(P3)
    assert (
        built
        == [("aws", "us-east-1", {"ssh_cidr": "203.0.113.7/32"}), ("aws", "us-west-2", {"ssh_cidr": "203.0.113.7/32"})]
        and len(pool.providers()) == 2
    )
    with pytest.raises(InputError, match="not a cloud provider"):
        make_provider("local", "local")


def test_provider_pool_builds_one_provider_per_region_when_threads_ask_at_once():
    """A run's launches ask the pool from several threads. Two first asks of one region built two providers,
    each with its own security-group cache and lock, so each launch could create the run's group."""
    import time

    from rubberband.cloud.registry import ProviderPool

    built = []

    def slow_factory(cloud, region, **options):
        built.append(region)
        time.sleep(0.05)  # a provider's build: its session and clients
        return ScriptedProvider({})

    pool = ProviderPool(factory=slow_factory)
    got = at_once(lambda: pool("aws", "us-east-1"), threads=6)
    assert built == ["us-east-1"] and len(got) == 6 and all(p is got[0] for p in got)


def test_a_zone_out_of_capacity_is_tried_again_after_the_retry_time_a_region_without_quota_never():
    """Capacity comes back (spot outages last minutes to hours): a capacity block expires after
    ``capacity_retry_s``; a quota block lasts the run."""
    now = [0.0]
    policy = FailoverPolicy(capacity_retry_s=600.0, clock=lambda: now[0])
    sold_out = ScriptedProvider({("p3.2xlarge", "use1-az1"): "capacity"})
    provision_with_failover(InstanceRequest("r", 0, P3), lambda t: sold_out, policy=policy)
    assert sold_out.calls == [("p3.2xlarge", "use1-az1"), ("p3.2xlarge", "use1-az2")]
    now[0] = 599.0
    sold_out.calls.clear()
    provision_with_failover(InstanceRequest("r", 0, P3), lambda t: sold_out, policy=policy)
    assert sold_out.calls == [("p3.2xlarge", "use1-az2")]  # still skipped
    now[0] = 601.0
    back = ScriptedProvider({})
    provision_with_failover(InstanceRequest("r", 0, P3), lambda t: back, policy=policy)
    assert back.calls == [("p3.2xlarge", "use1-az1")]  # tried again, and it sells
    no_quota = ScriptedProvider({("p3.2xlarge", "use1-az1"): "quota"})
    with pytest.raises(FailoverExhausted):
        provision_with_failover(InstanceRequest("r", 0, P3), lambda t: no_quota, policy=policy)
    now[0] = 1e9
    assert policy.is_blocked(P3, "use1-az1") and policy.is_blocked(P3, "use1-az2")
