"""The GCE fake behaves like Compute Engine where rubberband's client depends on it, and the client copes:
strict request bodies, operations that take time (PENDING → RUNNING → DONE), idempotent requestIds, paged lists."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from cloud_helpers import GCP_CATALOG_CSV
from gce_fake import gce_fake  # noqa: F401  (fixture)

from rubberband.catalog import parse_catalog
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.provider import InstanceRequest

N1 = parse_catalog("gcp", GCP_CATALOG_CSV).find("n1-standard-8+V100x1", region="us-central1")
ZONE_URL = "/compute/v1/projects/rubberband-test/zones/us-central1-a"


def _call(fake, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        fake.url + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _vm(name: str, **extra) -> dict:
    return {
        "name": name,
        "machineType": "zones/us-central1-a/machineTypes/n1-standard-8",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/p/global/images/i"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        **extra,
    }


def test_bodies_with_unknown_or_missing_fields_are_refused_as_the_api_does(gce_fake):
    status, answer = _call(gce_fake, "POST", f"{ZONE_URL}/instances", _vm("a", gpus=1))
    assert status == 400 and "Unknown name \"gpus\" at 'resource'" in answer["error"]["message"]
    status, answer = _call(
        gce_fake, "POST", f"{ZONE_URL}/instances", _vm("b", scheduling={"provisioningModel": "SPOT", "spotty": True})
    )
    assert status == 400 and "resource.scheduling" in answer["error"]["message"]
    body = _vm("c")
    del body["networkInterfaces"]
    status, answer = _call(gce_fake, "POST", f"{ZONE_URL}/instances", body)
    assert status == 400 and "At least one network interface is required" in answer["error"]["message"]
    status, answer = _call(
        gce_fake,
        "POST",
        "/compute/v1/projects/rubberband-test/global/firewalls",
        {"name": "fw", "network": "global/networks/default"},
    )
    assert status == 400 and "allowed or denied" in answer["error"]["message"]
    assert not gce_fake.instances and not gce_fake.firewalls
    assert len(gce_fake.rejected) == 4
    gce_fake.rejected.clear()  # the fixture fails any test whose requests the fake had to refuse


def test_operations_take_time_and_a_repeated_request_id_is_one_request(gce_fake):
    gce_fake.op_delay_s = 0.6
    status, op = _call(gce_fake, "POST", f"{ZONE_URL}/instances?requestId=req-1", _vm("vm-1"))
    assert status == 200 and op["status"] == "PENDING"
    assert _call(gce_fake, "GET", f"{ZONE_URL}/instances/vm-1")[1]["status"] == "PROVISIONING"
    again = _call(gce_fake, "POST", f"{ZONE_URL}/instances?requestId=req-1", _vm("vm-1"))[1]
    assert again["name"] == op["name"] and len(gce_fake.instances) == 1  # a retry, not a second VM (no 409)
    time.sleep(0.35)
    assert _call(gce_fake, "GET", f"{ZONE_URL}/operations/{op['name']}")[1]["status"] == "RUNNING"
    waited = _call(gce_fake, "POST", f"{ZONE_URL}/operations/{op['name']}/wait")[1]  # blocks until due
    assert waited["status"] == "DONE"
    assert _call(gce_fake, "GET", f"{ZONE_URL}/instances/vm-1")[1]["status"] == "STAGING"
    status, op = _call(gce_fake, "DELETE", f"{ZONE_URL}/instances/vm-1?requestId=req-2")
    assert _call(gce_fake, "GET", f"{ZONE_URL}/instances/vm-1")[1]["status"] == "STOPPING"
    assert _call(gce_fake, "POST", f"{ZONE_URL}/operations/{op['name']}/wait")[1]["status"] == "DONE"
    assert _call(gce_fake, "GET", f"{ZONE_URL}/instances/vm-1")[0] == 404


def test_lists_are_paged(gce_fake):
    for index in range(5):
        assert _call(gce_fake, "POST", f"{ZONE_URL}/instances", _vm(f"vm-{index}"))[0] == 200
    first = _call(gce_fake, "GET", f"{ZONE_URL}/instances")[1]
    assert len(first["items"]) == 2 and first["nextPageToken"]
    second = _call(gce_fake, "GET", f"{ZONE_URL}/instances?pageToken={first['nextPageToken']}&maxResults=3")[1]
    assert [i["name"] for i in second["items"]] == ["vm-2", "vm-3", "vm-4"] and "nextPageToken" not in second


def test_the_client_follows_pages_and_waits_for_slow_operations(gce_fake):
    """GcpProvider against operations that take 0.3 s and pages of 2: a 5-VM gang comes back complete and only
    when its inserts are DONE; list() sees every VM across pages; terminate() returns once the VMs are gone, and
    cleanup_run once the firewall rules and the workers' Cloud NAT are."""
    gce_fake.op_delay_s = 0.3
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.05, ssh_cidr="203.0.113.9/32")
    made = provider.provision(InstanceRequest("run-p", 0, N1, count=5, zone="us-central1-a"))
    assert len(made) == 5 and len(gce_fake.firewalls) == 3  # deny, internal, ssh
    assert list(gce_fake.routers) == [("us-central1", "rubberband-run-p-nat")]  # made (and waited on) first
    assert all(gce_fake.operations[name]["status"] == "DONE" for name in gce_fake.request_ids.values())
    assert sorted(i.id for i in provider.list("run-p")) == sorted(i.id for i in made)
    assert len(provider.wait([i.id for i in made], timeout_s=30)) == 5
    listed = [r for r in gce_fake.requests if r.endswith("/aggregated/instances")]
    assert len(listed) >= 3  # 5 VMs in pages of 2: three pages per listing
    provider.terminate([i.id for i in made])
    assert not gce_fake.instances  # terminate waited for the deletes to be DONE
    assert sorted(provider.cleanup_run("run-p")) == [
        "firewall/rubberband-run-p-deny",
        "firewall/rubberband-run-p-internal",
        "firewall/rubberband-run-p-ssh",
        "router/rubberband-run-p-nat",
        "subnetwork/rubberband-run-p-workers",
    ]
    assert not gce_fake.firewalls and not gce_fake.routers and not gce_fake.subnetworks
    assert provider.leftover_runs() == []


def test_a_stockout_in_a_slow_operation_surfaces_when_it_is_done(gce_fake):
    gce_fake.op_delay_s, gce_fake.stockout_types = 0.2, {"n1-standard-8"}
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.05)
    from rubberband.errors import CloudError

    with pytest.raises(CloudError) as info:
        provider.provision(InstanceRequest("run-s", 0, N1, zone="us-central1-b"))
    assert info.value.kind == "capacity" and info.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert not gce_fake.instances


REGION_URL = "/compute/v1/projects/rubberband-test/regions/us-central1"


def _router(name: str, **extra) -> dict:
    nat = {
        "name": name,
        "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
        "natIpAllocateOption": "AUTO_ONLY",
    }
    return {"name": name, "network": "global/networks/default", "nats": [nat], **extra}


def _refused(fake, body: dict, words: str, url: str = f"{REGION_URL}/routers") -> None:
    status, answer = _call(fake, "POST", url, body)
    assert status == 400 and words in answer["error"]["message"], answer


def test_routers_are_refused_and_served_as_the_api_does(gce_fake):
    """routers.insert refuses unknown fields, a missing or malformed network, a region that is not the request's,
    NAT sections without their options or with addresses AUTO_ONLY does not take, and a second NAT beside one that
    serves every subnetwork; get / list / aggregatedList / delete answer as Compute Engine does (region operations,
    paged lists, 404 once gone)."""
    _refused(gce_fake, _router("r1", labels={"a": "b"}), 'Unknown name "labels"')  # routers have no labels
    bad_nat = _router("r1")
    bad_nat["nats"][0]["natIpsAuto"] = True
    _refused(gce_fake, bad_nat, "Unknown name \"natIpsAuto\" at 'resource.nats[0]'")
    _refused(gce_fake, {"name": "r1"}, "The network of a router must be specified")
    _refused(gce_fake, _router("r1", network="default"), "resource.network")
    _refused(gce_fake, _router("r1", network="projects/another/global/networks/default"), "resource.network")
    _refused(gce_fake, _router("r1", region="us-east1"), "region of the request")
    _refused(gce_fake, _router("R_1"), "resource.name")
    _refused(gce_fake, _router("r1"), "Unknown region", url="/compute/v1/projects/rubberband-test/regions/moon/routers")
    for key in ("sourceSubnetworkIpRangesToNat", "natIpAllocateOption"):
        missing = _router("r1")
        del missing["nats"][0][key]
        _refused(gce_fake, missing, f"resource.nats[0].{key}")
    auto_with_ips = _router("r1")
    auto_with_ips["nats"][0]["natIps"] = ["regions/us-central1/addresses/a"]
    _refused(gce_fake, auto_with_ips, "AUTO_ONLY")
    manual = _router("r1")
    manual["nats"][0]["natIpAllocateOption"] = "MANUAL_ONLY"
    _refused(gce_fake, manual, "MANUAL_ONLY")
    assert not gce_fake.routers and len(gce_fake.rejected) == 12

    status, op = _call(gce_fake, "POST", f"{REGION_URL}/routers?requestId=r-1", _router("r1", region="us-central1"))
    assert status == 200 and op["region"].endswith("/regions/us-central1") and "zone" not in op
    status, done = _call(gce_fake, "POST", f"{REGION_URL}/operations/{op['name']}/wait")
    assert status == 200 and done["status"] == "DONE"
    assert _call(gce_fake, "GET", f"{ZONE_URL}/operations/{op['name']}")[0] == 404  # a region's, not a zone's
    status, again = _call(gce_fake, "POST", f"{REGION_URL}/routers?requestId=r-1", _router("r1"))
    assert again["name"] == op["name"] and len(gce_fake.routers) == 1  # the same request: nothing redone
    assert _call(gce_fake, "POST", f"{REGION_URL}/routers", _router("r1"))[0] == 409
    _refused(gce_fake, _router("r2"), "excludes any other")  # one NAT of every subnetwork per region and network
    status, other_region = _call(
        gce_fake, "POST", "/compute/v1/projects/rubberband-test/regions/us-east1/routers", _router("r2")
    )
    assert status == 200  # another region: room for its own NAT
    plain = {"name": "r3", "network": "global/networks/default"}  # a router without a NAT takes no room
    assert _call(gce_fake, "POST", f"{REGION_URL}/routers", plain)[0] == 200
    gce_fake.rejected.clear()

    status, found = _call(gce_fake, "GET", f"{REGION_URL}/routers/r1")
    assert status == 200 and found["network"].endswith("/projects/rubberband-test/global/networks/default")
    assert found["nats"][0]["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    status, page = _call(gce_fake, "GET", f"{REGION_URL}/routers?maxResults=1")
    assert [r["name"] for r in page["items"]] == ["r1"] and page["nextPageToken"]
    status, every = _call(gce_fake, "GET", "/compute/v1/projects/rubberband-test/aggregated/routers")
    assert {scope: [r["name"] for r in scoped["routers"]] for scope, scoped in every["items"].items()} == {
        "regions/us-central1": ["r1"],
        "regions/us-east1": ["r2"],
    }  # a page of two (the fixture's page size)
    status, op = _call(gce_fake, "DELETE", f"{REGION_URL}/routers/r1")
    _call(gce_fake, "POST", f"{REGION_URL}/operations/{op['name']}/wait")
    assert _call(gce_fake, "GET", f"{REGION_URL}/routers/r1")[0] == 404
    assert _call(gce_fake, "DELETE", f"{REGION_URL}/routers/r1")[0] == 404


def _subnet(name: str, cidr: str, **extra) -> dict:
    return {"name": name, "network": "global/networks/default", "ipCidrRange": cidr, **extra}


def _nat_of(name: str, *subnetworks: str) -> dict:
    nat = {
        "name": name,
        "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
        "natIpAllocateOption": "AUTO_ONLY",
        "subnetworks": [{"name": s, "sourceIpRangesToNat": ["ALL_IP_RANGES"]} for s in subnetworks],
    }
    return {"name": name, "network": "global/networks/default", "nats": [nat]}


def test_subnetworks_are_refused_and_served_as_the_api_does(gce_fake):
    """subnetworks.insert refuses unknown fields, a missing range, a range that is no canonical IPv4 network of /8 to
    /29, one overlapping a subnetwork of the network in any region (the default network's own included, and the
    10.128.0.0/9 it keeps for them) or a peered network's; a VM's interface must name a subnetwork of its region and
    network and takes its address from it; a NAT of chosen subnetworks must name existing ones, say which ranges and
    share none with another NAT; a subnetwork in use by a VM or a NAT, or an auto mode network's own, is not
    deleted."""
    url = f"{REGION_URL}/subnetworks"
    _refused(gce_fake, _subnet("s1", "10.64.0.0/20", labels={"a": "b"}), 'Unknown name "labels"', url)
    _refused(gce_fake, {"name": "s1", "network": "global/networks/default"}, "resource.ipCidrRange", url)
    _refused(gce_fake, _subnet("s1", "10.64.0.1/20"), "not a valid IPv4 range", url)
    _refused(gce_fake, _subnet("s1", "10.64.0.0/30"), "not a valid IPv4 range", url)
    _refused(gce_fake, _subnet("s1", "10.130.0.0/20"), "auto mode range", url)
    gce_fake.add_subnetwork("us-east1", "mine", "10.64.0.0/16")
    _refused(gce_fake, _subnet("s1", "10.64.16.0/20"), "conflicts with existing subnetwork 'mine'", url)
    gce_fake.peered_ranges = ["10.65.0.0/16"]
    _refused(gce_fake, _subnet("s1", "10.65.0.0/20"), "peered network", url)
    assert len(gce_fake.rejected) == 7 and list(gce_fake.subnetworks) == [("us-east1", "mine")]
    gce_fake.rejected.clear()
    status, op = _call(gce_fake, "POST", url, _subnet("s1", "10.66.0.0/20"))
    assert status == 200 and op["region"].endswith("/regions/us-central1")
    assert _call(gce_fake, "POST", url, _subnet("s1", "10.67.0.0/20"))[0] == 409
    status, every = _call(gce_fake, "GET", "/compute/v1/projects/rubberband-test/aggregated/subnetworks?maxResults=500")
    names = {(scope, n["name"]) for scope, scoped in every["items"].items() for n in scoped["subnetworks"]}
    assert {("regions/us-central1", "default"), ("regions/us-central1", "s1"), ("regions/us-east1", "mine")} <= names

    vm = {
        "name": "vm-1",
        "machineType": "zones/us-central1-a/machineTypes/n1-standard-8",
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": "x"}}],
        "networkInterfaces": [
            {"network": "global/networks/default", "subnetwork": "regions/us-east1/subnetworks/mine"}
        ],
    }
    _refused(gce_fake, vm, "cannot be found in us-central1", f"{ZONE_URL}/instances")  # another region's
    vm["networkInterfaces"][0]["subnetwork"] = "regions/us-central1/subnetworks/s1"
    assert _call(gce_fake, "POST", f"{ZONE_URL}/instances", vm)[0] == 200
    nic = gce_fake.instances[("us-central1-a", "vm-1")]["networkInterfaces"][0]
    assert nic["networkIP"].startswith("10.66.") and nic["subnetwork"].endswith("/subnetworks/s1")
    routers = f"{REGION_URL}/routers"
    _refused(gce_fake, _nat_of("n1", "regions/us-central1/subnetworks/nope"), "must exist", routers)
    no_ranges = _nat_of("n1", "regions/us-central1/subnetworks/s1")
    del no_ranges["nats"][0]["subnetworks"][0]["sourceIpRangesToNat"]
    _refused(gce_fake, no_ranges, "sourceIpRangesToNat", routers)
    assert _call(gce_fake, "POST", routers, _nat_of("n1", "regions/us-central1/subnetworks/s1"))[0] == 200
    _refused(gce_fake, _nat_of("n2", "regions/us-central1/subnetworks/s1"), "already served", routers)
    assert _call(gce_fake, "POST", routers, _nat_of("n3", "regions/us-central1/subnetworks/default"))[0] == 200
    assert gce_fake.nat_serves("vm-1")
    status, answer = _call(gce_fake, "DELETE", f"{url}/s1")
    assert status == 400 and "instances/vm-1" in answer["error"]["message"]  # the VM first
    _call(gce_fake, "DELETE", f"{ZONE_URL}/instances/vm-1")
    _call(gce_fake, "GET", f"{ZONE_URL}/instances")  # the delete lands
    time.sleep(0.1)
    status, answer = _call(gce_fake, "DELETE", f"{url}/s1")
    assert status == 400 and "routers/n1" in answer["error"]["message"]  # then the NAT that names it
    op = _call(gce_fake, "DELETE", f"{routers}/n1")[1]
    _call(gce_fake, "POST", f"{REGION_URL}/operations/{op['name']}/wait")
    op = _call(gce_fake, "DELETE", f"{url}/s1")[1]
    _call(gce_fake, "POST", f"{REGION_URL}/operations/{op['name']}/wait")
    assert _call(gce_fake, "GET", f"{url}/s1")[0] == 404
    assert _call(gce_fake, "DELETE", f"{url}/default")[0] == 400  # the auto mode network's own
    gce_fake.rejected.clear()
