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
from rubberband.cloud.gcp import GcpProvider
from rubberband.cloud.provider import InstanceRequest

N1 = parse_catalog("gcp", GCP_CATALOG_CSV).find("n1-standard-8+V100x1", region="us-central1")
ZONE_URL = "/compute/v1/projects/rubberband-test/zones/us-central1-a"


def _call(fake, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(fake.url + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _vm(name: str, **extra) -> dict:
    return {"name": name, "machineType": "zones/us-central1-a/machineTypes/n1-standard-8",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/p/global/images/i"}}],
            "networkInterfaces": [{"network": "global/networks/default"}], **extra}


def test_bodies_with_unknown_or_missing_fields_are_refused_as_the_api_does(gce_fake):
    status, answer = _call(gce_fake, "POST", f"{ZONE_URL}/instances", _vm("a", gpus=1))
    assert status == 400 and 'Unknown name "gpus" at \'resource\'' in answer["error"]["message"]
    status, answer = _call(gce_fake, "POST", f"{ZONE_URL}/instances",
                           _vm("b", scheduling={"provisioningModel": "SPOT", "spotty": True}))
    assert status == 400 and "resource.scheduling" in answer["error"]["message"]
    body = _vm("c")
    del body["networkInterfaces"]
    status, answer = _call(gce_fake, "POST", f"{ZONE_URL}/instances", body)
    assert status == 400 and "At least one network interface is required" in answer["error"]["message"]
    status, answer = _call(gce_fake, "POST", "/compute/v1/projects/rubberband-test/global/firewalls",
                           {"name": "fw", "network": "global/networks/default"})
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
    cleanup_run once the firewall rules are."""
    gce_fake.op_delay_s = 0.3
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.05, ssh_cidr="203.0.113.9/32")
    made = provider.provision(InstanceRequest("run-p", 0, N1, count=5, zone="us-central1-a"))
    assert len(made) == 5 and len(gce_fake.firewalls) == 3  # deny, internal, ssh
    assert all(gce_fake.operations[name]["status"] == "DONE" for name in gce_fake.request_ids.values())
    assert sorted(i.id for i in provider.list("run-p")) == sorted(i.id for i in made)
    assert len(provider.wait([i.id for i in made], timeout_s=30)) == 5
    listed = [r for r in gce_fake.requests if r.endswith("/aggregated/instances")]
    assert len(listed) >= 3  # 5 VMs in pages of 2: three pages per listing
    provider.terminate([i.id for i in made])
    assert not gce_fake.instances  # terminate waited for the deletes to be DONE
    assert sorted(provider.cleanup_run("run-p")) == ["firewall/rubberband-run-p-deny", "firewall/rubberband-run-p-internal",
                                                     "firewall/rubberband-run-p-ssh"]
    assert not gce_fake.firewalls and provider.leftover_runs() == []


def test_a_stockout_in_a_slow_operation_surfaces_when_it_is_done(gce_fake):
    gce_fake.op_delay_s, gce_fake.stockout_types = 0.2, {"n1-standard-8"}
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.05)
    from rubberband.errors import CloudError

    with pytest.raises(CloudError) as info:
        provider.provision(InstanceRequest("run-s", 0, N1, zone="us-central1-b"))
    assert info.value.kind == "capacity" and info.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert not gce_fake.instances
