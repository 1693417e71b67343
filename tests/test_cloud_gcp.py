"""GcpProvider (google-cloud-compute over REST) against the local GCE fake in tests/gce_fake.py."""

from __future__ import annotations

import dataclasses

import pytest
from cloud_helpers import cloud_catalog
from gce_fake import GceFake, gce_fake  # noqa: F401  (fixture)

from rubberband.cloud.backend import CloudBackend
from rubberband.cloud.failover import FailoverExhausted, FailoverPolicy, RetryPolicy, provision_with_failover
from rubberband.cloud.gcp.names import firewall_name
from rubberband.cloud.gcp.provider import PREEMPTED, PREEMPTED_OPERATION, GcpProvider
from rubberband.cloud.gcp.run_network import network_tag
from rubberband.cloud.provider import TAG_MANAGED, TAG_ROLE, TAG_RUN_ID, TAG_STAGE, InstanceRequest
from rubberband.cloud.registry import ProviderPool
from rubberband.cloud.teardown import (
    cleanup_leftovers,
    find_orphans,
    terminate_instances,
    terminate_run,
    terminate_run_detailed,
)
from rubberband.errors import CloudError, InputError, RubberbandError

CATALOG = cloud_catalog()
V100_2Z = CATALOG.find("n1-standard-8+V100x1", region="us-central1")  # zones us-central1-a, -b
V100 = dataclasses.replace(V100_2Z, zones=("us-central1-a",))
T4X4 = CATALOG.find("n1-standard-8+T4x4", region="us-central1")  # us-central1-a
A2 = CATALOG.find("a2-highgpu-1g", region="us-central1")  # A100 bundled with the host


def provider(fake: GceFake, **kwargs) -> GcpProvider:
    kwargs.setdefault("retry", RetryPolicy(max_tries=3, sleep=lambda s: None))
    return GcpProvider("us-central1", endpoint=fake.url, poll_s=0.01, **kwargs)


def test_insert_labels_accelerators_spot_script_and_firewall(gce_fake):
    gce_fake.pending_polls = 2  # operations are RUNNING at first: the provider must wait on them
    p = provider(gce_fake, ssh_cidr="198.51.100.0/24")
    script = "#!/bin/bash\necho join\n"
    made = p.provision(
        InstanceRequest("run-g", 1, V100, count=2, spot=True, startup_script=script, extra_tags={TAG_ROLE: "worker"})
    )
    assert len(made) == 2 and all(i.zone == "us-central1-a" for i in made)
    running = p.wait([i.id for i in made], timeout_s=10)
    assert {i.state for i in running} == {"running"} and {i.instance_type for i in running} == {V100.name}
    assert len(gce_fake.instances) == 2
    for body in gce_fake.instances.values():
        labels = body["labels"]
        assert labels[TAG_MANAGED] == "true" and labels[TAG_RUN_ID] == "run-g" and labels[TAG_STAGE] == "1"
        assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
        assert body["guestAccelerators"] == [
            {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-v100", "acceleratorCount": 1}
        ]
        assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
        assert body["scheduling"]["provisioningModel"] == "SPOT"
        assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert body["metadata"]["items"] == [
            {"key": "install-nvidia-driver", "value": "True"},  # GPU: the DLVM's
            {"key": "startup-script", "value": script},
        ]  # driver install
        assert body["tags"]["items"] == [network_tag("run-g")]
        assert body["scheduling"].get("maxRunDuration") is None  # no cap asked for: spot's DELETE only
    internal = gce_fake.firewalls[firewall_name("run-g")]
    assert internal["sourceTags"] == internal["targetTags"] == [network_tag("run-g")]
    assert "sourceRanges" not in internal
    ssh = gce_fake.firewalls[firewall_name("run-g", "ssh")]
    assert ssh["sourceRanges"] == ["198.51.100.0/24"] and ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]

    assert sorted(i.id for i in p.list("run-g")) == sorted(i.id for i in made)
    p.set_labels(made[0].id, {TAG_STAGE: "2"})
    assert {i.stage for i in p.list("run-g")} == {1, 2}
    lines: list[str] = []
    assert len(terminate_run(p, "run-g", echo=lines.append)) == 2
    assert not gce_fake.instances and not gce_fake.firewalls
    assert sum(line.startswith("terminated gcp rb-run-g-") for line in lines) == 2
    assert terminate_run(p, "run-g") == []


def test_bundled_gpu_host_on_demand_and_env_endpoint(gce_fake, monkeypatch):
    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    p = GcpProvider("us-central1", poll_s=0.01)  # endpoint from the environment, anonymous credentials
    (made,) = p.provision(InstanceRequest("run-h", 0, A2, max_lifetime_s=7200))
    body = next(iter(gce_fake.instances.values()))
    assert body["scheduling"]["maxRunDuration"] == {"seconds": "7200"}
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["machineType"].endswith("/a2-highgpu-1g") and "guestAccelerators" not in body
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert firewall_name("run-h", "ssh") not in gce_fake.firewalls
    assert made.instance_type == "a2-highgpu-1g"
    terminate_run(p, "run-h")
    assert not gce_fake.instances


def test_stockout_fails_over_zone_then_type_and_gangs_roll_back(gce_fake):
    p = provider(gce_fake)
    gce_fake.stockout_zones = {"us-central1-a"}
    policy = FailoverPolicy()
    result = provision_with_failover(
        InstanceRequest("run-i", 0, V100_2Z), lambda t: p, alternatives=[T4X4], policy=policy
    )
    assert [(a.zone, a.outcome) for a in result.attempts] == [("us-central1-a", "capacity"), ("us-central1-b", "ok")]
    assert result.attempts[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    gce_fake.stockout_zones = {"us-central1-b"}
    result = provision_with_failover(
        InstanceRequest("run-i", 1, V100_2Z), lambda t: p, alternatives=[T4X4], policy=policy
    )  # zone a is already blocked for V100: not tried again
    assert [(a.instance_type, a.zone, a.outcome) for a in result.attempts] == [
        (V100.name, "us-central1-a", "skipped"),
        (V100.name, "us-central1-b", "capacity"),
        (T4X4.name, "us-central1-a", "ok"),
    ]
    assert len(gce_fake.instances) == 2
    gce_fake.stockout_sync, gce_fake.stockout_zones = True, {"us-central1-a"}  # a 503 that says it in words
    with pytest.raises(CloudError) as sync:
        p.provision(InstanceRequest("run-i", 2, V100))
    assert sync.value.kind == "capacity" and gce_fake.inserts[-1] == ("us-central1-a", "n1-standard-8")
    gce_fake.stockout_sync = False
    terminate_run(p, "run-i")

    gce_fake.stockout_zones, gce_fake.capacity_left = set(), 2
    with pytest.raises(CloudError) as info:
        p.provision(InstanceRequest("run-j", 0, V100, count=3))
    assert info.value.kind == "capacity" and not gce_fake.instances  # the two that booted were deleted
    terminate_run(p, "run-j")
    assert not gce_fake.firewalls

    gce_fake.capacity_left, gce_fake.pending_polls, gce_fake.wait_errors = None, 1, 2  # retried, then it works
    assert len(p.provision(InstanceRequest("run-t", 0, V100))) == 1 and gce_fake.wait_errors == 0
    gce_fake.wait_errors = 3  # outlasts the 3 tries: the inserted VMs are deleted, the error surfaces
    with pytest.raises(CloudError) as transient:
        p.provision(InstanceRequest("run-t", 1, V100, count=2))
    assert transient.value.kind == "transient" and transient.value.code == "backendError"
    assert [i.stage for i in p.list("run-t")] == [0]
    terminate_run(p, "run-t")
    assert not gce_fake.instances and not gce_fake.firewalls


def test_quota_blocks_region_or_cloud_and_names_the_quota(gce_fake):
    p = provider(gce_fake)
    gce_fake.quota = "NVIDIA_V100_GPUS"
    policy = FailoverPolicy()
    with pytest.raises(FailoverExhausted) as info:
        provision_with_failover(InstanceRequest("run-k", 0, V100_2Z), lambda t: p, alternatives=[T4X4], policy=policy)
    assert info.value.kind == "quota" and "NVIDIA_V100_GPUS" in info.value.message
    assert [a.outcome for a in info.value.attempts] == ["quota", "skipped", "skipped"]
    assert ("gcp", "us-central1") in policy.blocked_regions and len(gce_fake.inserts) == 1

    gce_fake.quota = "GPUS_ALL_REGIONS"
    policy = FailoverPolicy()
    with pytest.raises(FailoverExhausted) as info:
        provision_with_failover(InstanceRequest("run-k", 0, V100), lambda t: p, policy=policy)
    assert policy.blocked_clouds == {"gcp"} and "every region" in info.value.message

    gce_fake.quota, gce_fake.quota_sync = "CPUS", True  # 403 quotaExceeded on the insert itself
    with pytest.raises(CloudError) as sync:
        p.provision(InstanceRequest("run-k", 0, V100))
    assert sync.value.kind == "quota" and sync.value.quota == "CPUS" and "\n" not in sync.value.message
    assert not gce_fake.instances
    p.cleanup_run("run-k")


def test_bad_input_and_missing_credentials(gce_fake, monkeypatch, tmp_path):
    with pytest.raises(InputError, match="region 'us-nowhere9'"):
        GcpProvider("us-nowhere9", endpoint=gce_fake.url)
    p = provider(gce_fake)
    aws_type = CATALOG.find("p3.2xlarge", cloud="aws")
    with pytest.raises(InputError, match="belongs to aws"):
        p.provision(InstanceRequest("run-l", 0, aws_type))
    with pytest.raises(InputError, match="zone 'us-central1-f'"):
        p.provision(InstanceRequest("run-l", 0, V100, zone="us-central1-f"))
    monkeypatch.delenv("RUBBERBAND_GCE_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(CloudError) as info:
        GcpProvider("us-central1")
    assert info.value.kind == "fatal" and "application-default" in info.value.message
    assert isinstance(info.value, RubberbandError) and "\n" not in str(info.value)
    assert gce_fake.inserts == [] and not gce_fake.instances


def test_orphans_and_leftover_firewalls(gce_fake):
    p = provider(gce_fake)
    old = p.provision(InstanceRequest("run-m", 0, V100))
    p.provision(InstanceRequest("run-n", 0, V100, extra_tags={TAG_ROLE: "head"}))
    now = old[0].launched_at + 10
    assert find_orphans(p, 3600, now=now) == []
    assert [i.run_id for i in find_orphans(p, 3600, active_runs={"run-n"}, now=now + 7200)] == ["run-m"]
    result = terminate_instances(p, find_orphans(p, 3600, now=now + 7200))
    assert len(result.instances) == 2 and not gce_fake.instances
    assert "firewall/rubberband-run-m-internal" in result.resources and not gce_fake.firewalls
    assert "router/rubberband-run-m-nat" in result.resources and not gce_fake.routers
    p.ensure_firewall("run-gone")  # a firewall whose run never got (or lost) its VMs
    assert p.leftover_runs() == ["run-gone"]
    assert (
        sorted(cleanup_leftovers(p)) == ["firewall/rubberband-run-gone-deny", "firewall/rubberband-run-gone-internal"]
        and not gce_fake.firewalls
    )


def test_preempted_spot_vms_are_reported_with_their_reason(gce_fake):
    """Compute Engine records a preemption as a compute.instances.preempted zone operation: a spot VM it took back
    is reported with the reason ``preempted`` by list (a VM left TERMINATED), describe (a VM deleted, as
    instanceTerminationAction=DELETE does) and wait; the executor's backend calls that a spot interruption. A VM
    deleted by someone else is only gone."""
    p = provider(gce_fake)
    pool = ProviderPool({"gcp": {"endpoint": gce_fake.url, "poll_s": 0.01}})
    backend = CloudBackend(
        pool,
        p.provision(InstanceRequest("run-p", 0, V100, extra_tags={TAG_ROLE: "head"}))[0],
        join_check=lambda i, t: None,
    )
    deleted, stopped, by_user, alive = backend.provision(InstanceRequest("run-p", 0, V100, count=4, spot=True))
    ids = [deleted.id, stopped.id, by_user.id, alive.id]
    assert backend.check_lost(ids) == {}
    gce_fake.instances[("us-central1-a", stopped.id)]["scheduling"]["instanceTerminationAction"] = "STOP"
    gce_fake.preempt(deleted.id)
    gce_fake.preempt(stopped.id)
    p.terminate([by_user.id])  # another client (here: another provider) deletes it
    workers = pool("gcp", "us-central1")
    listed = {i.id: i for i in workers.list("run-p")}
    assert deleted.id not in listed and by_user.id not in listed
    assert (listed[stopped.id].state, listed[stopped.id].state_reason) == ("stopped", PREEMPTED)
    assert (listed[alive.id].state, listed[alive.id].state_reason) == ("running", "")
    described = {i.id: i for i in workers.describe(ids)}
    assert sorted(described) == sorted([deleted.id, stopped.id, alive.id])
    assert (described[deleted.id].state, described[deleted.id].state_reason) == ("terminated", PREEMPTED)
    assert described[deleted.id].instance_type == V100.name and described[deleted.id].run_id == "run-p"
    assert backend.check_lost(ids) == {
        deleted.id: "spot-interruption",
        stopped.id: "spot-interruption",
        by_user.id: "lost",
    }
    for gone in (deleted, stopped):
        with pytest.raises(CloudError) as info:
            workers.wait([gone.id], timeout_s=1)
        assert info.value.code == "InstancePreempted" and "preempted" in info.value.message
        assert info.value.kind == "capacity"
    with pytest.raises(CloudError) as info:
        workers.wait([by_user.id], timeout_s=1)
    assert info.value.code == "InstanceGone" and "preempted" not in info.value.message
    assert any(r.startswith("GET") and r.endswith("/zones/us-central1-a/operations") for r in gce_fake.requests)
    preempted_ops = [o for o in gce_fake.operations.values() if o["operationType"] == PREEMPTED_OPERATION]
    assert len(preempted_ops) == 2
    terminate_run(p, "run-p")
    assert not gce_fake.instances and not gce_fake.firewalls


def test_another_process_of_the_run_reuses_its_firewall(gce_fake):
    """The head's provider finds the rule the CLI's provider made: the 409 alreadyExists answer (whose message,
    long with the request URL, gets cut short) means the rule is there."""
    run_id = "sleepy-20261121-115434-38a9"
    cli_side, head_side = provider(gce_fake), provider(gce_fake)
    rules = [firewall_name(run_id, "deny"), firewall_name(run_id)]
    assert cli_side.ensure_firewall(run_id) == head_side.ensure_firewall(run_id) == rules
    assert list(gce_fake.firewalls) == rules
    assert sorted(head_side.cleanup_run(run_id)) == sorted(f"firewall/{r}" for r in rules) and not gce_fake.firewalls


def test_only_the_run_reaches_its_ray_ports_and_only_the_head_is_public(gce_fake):
    """The run's rules, evaluated with the default network's own (internal range, SSH from anywhere) as the VPC
    evaluates them: nothing outside the run reaches a Ray port (GCS 6379, dashboard 8265, any worker port) of
    any of its VMs, SSH reaches the head from the user's CIDR alone, and only the head has an external address (the
    default: workers go out through the run's Cloud NAT). The run's VMs are capped by the cloud itself
    (maxRunDuration with DELETE; the fake is strict about both)."""
    from rubberband.cloud.gcp.run_network import head_tag

    p = provider(gce_fake, ssh_cidr="203.0.113.7/32")
    (head,) = p.provision(InstanceRequest("run-n", 0, V100, extra_tags={TAG_ROLE: "head"}, max_lifetime_s=3600))
    (worker,) = p.provision(InstanceRequest("run-n", 1, V100, extra_tags={TAG_ROLE: "worker"}, max_lifetime_s=1800))
    bodies = {name: body for (_, name), body in gce_fake.instances.items()}
    assert bodies[head.id]["networkInterfaces"][0]["accessConfigs"]  # the head's SSH
    assert not bodies[worker.id]["networkInterfaces"][0].get("accessConfigs")  # workers: no external address
    assert bodies[head.id]["tags"]["items"] == [network_tag("run-n"), head_tag("run-n")]
    assert bodies[worker.id]["tags"]["items"] == [network_tag("run-n")]
    for name, cap in ((head.id, "3600"), (worker.id, "1800")):
        assert bodies[name]["scheduling"]["maxRunDuration"] == {"seconds": cap}
        assert bodies[name]["scheduling"]["instanceTerminationAction"] == "DELETE"
    rules = {r["name"]: r for r in gce_fake.firewalls.values()}
    assert rules[firewall_name("run-n", "deny")]["priority"] < 65534  # outranks the default network's allows
    assert all(
        r["priority"] < rules[firewall_name("run-n", "deny")]["priority"] for n, r in rules.items() if "allowed" in r
    )

    run_vm = dict(source_tags=(network_tag("run-n"),))
    other_vm = "10.128.0.99"  # another VM of the project, inside default-allow-internal's range
    for target in (head.id, worker.id):
        for port in (6379, 8265, 10001, 20000, 29500, 22):
            assert not gce_fake.ingress_allowed(other_vm, target, port), (target, port)
            assert not gce_fake.ingress_allowed("198.51.100.1", target, port), (target, port)
            assert not gce_fake.ingress_allowed("203.0.113.7", target, port) or (target, port) == (head.id, 22)
        assert gce_fake.ingress_allowed("10.128.0.50", target, 6379, **run_vm)  # the run's own nodes
    assert gce_fake.ingress_allowed("203.0.113.7", head.id, 22)
    assert not gce_fake.ingress_allowed("203.0.113.7", worker.id, 22)
    # without the run's deny the default network's own rules would let any VM of the project in
    del gce_fake.firewalls[firewall_name("run-n", "deny")]
    assert gce_fake.ingress_allowed(other_vm, worker.id, 6379)
    p.terminate([head.id, worker.id])
    p.cleanup_run("run-n")
    assert not gce_fake.firewalls and not gce_fake.routers


def test_fake_refuses_lifetime_fields_the_real_api_refuses(gce_fake):
    """maxRunDuration without an instanceTerminationAction (or an action on a standard VM without a duration) is a
    400, as on Compute Engine: the provider never sends either."""
    import requests

    base = f"{gce_fake.url}/compute/v1/projects/rubberband-test/zones/us-central1-a/instances"
    body = {
        "name": "x",
        "machineType": "zones/us-central1-a/machineTypes/e2-standard-2",
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
    }
    for scheduling in (
        {"maxRunDuration": {"seconds": "600"}},
        {"instanceTerminationAction": "DELETE"},
        {"maxRunDuration": {"seconds": "5"}, "instanceTerminationAction": "DELETE"},
    ):
        assert requests.post(base, json={**body, "scheduling": scheduling}, timeout=10).status_code == 400
    ok = {"maxRunDuration": {"seconds": "600"}, "instanceTerminationAction": "DELETE"}
    assert requests.post(base, json={**body, "scheduling": ok}, timeout=10).status_code == 200
    gce_fake.rejected.clear()


# -- egress of private workers: the run's own subnetwork and Cloud NAT -------------------------------------------

EVERY_SUBNETWORK = [
    {
        "name": "nat",
        "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
        "natIpAllocateOption": "AUTO_ONLY",
    }
]


def test_private_workers_go_out_through_the_runs_own_nat_which_goes_with_the_run(gce_fake):
    """The default (worker_egress nat): the head alone has an external address and needs no NAT; before its first
    worker the run makes its own subnetwork (a free /20, marked as the run's) and one Cloud Router with a Cloud NAT of
    that subnetwork alone (addresses by Google), marked as the run's; its workers go into that subnetwork; another
    process of the run (the head's executor) reuses both; teardown deletes them, and only them."""
    import ipaddress

    from rubberband.cloud.gcp.names import owner_marker, router_name, subnet_name
    from rubberband.cloud.gcp.run_network import SUBNET_POOL

    cli_side, head_side = provider(gce_fake), provider(gce_fake)
    gce_fake.add_router("us-central1", "vpn-router")  # the user's own router without a NAT: no conflict
    (head,) = cli_side.provision(InstanceRequest("run-q", 0, V100, extra_tags={TAG_ROLE: "head"}))
    assert list(gce_fake.routers) == [("us-central1", "vpn-router")] and not gce_fake.subnetworks
    assert cli_side.ensure_worker_egress("run-q") == router_name("run-q")  # what start_head does before the head
    workers = head_side.provision(InstanceRequest("run-q", 1, V100, count=2, extra_tags={TAG_ROLE: "worker"}))
    head_side.provision(InstanceRequest("run-q", 2, V100, extra_tags={TAG_ROLE: "worker"}))
    subnet = gce_fake.subnetworks[("us-central1", subnet_name("run-q"))]
    assert subnet["description"].endswith(owner_marker("run-q")) and subnet["network"].endswith("/networks/default")
    block = ipaddress.ip_network(subnet["ipCidrRange"])
    assert block.prefixlen == 20 and block.subnet_of(ipaddress.ip_network(SUBNET_POOL))
    router = gce_fake.routers[("us-central1", router_name("run-q"))]
    assert router["description"].endswith(owner_marker("run-q"))
    assert router["network"].endswith("/global/networks/default") and router["region"].endswith("/us-central1")
    assert router["nats"] == [
        {
            "name": router_name("run-q"),
            "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
            "subnetworks": [
                {
                    "name": f"projects/rubberband-test/regions/us-central1/subnetworks/{subnet_name('run-q')}",
                    "sourceIpRangesToNat": ["ALL_IP_RANGES"],
                }
            ],
            "natIpAllocateOption": "AUTO_ONLY",
        }
    ]
    assert sum(r.startswith("POST") and r.endswith("/routers") for r in gce_fake.requests) == 1
    assert sum(r.startswith("POST") and r.endswith("/subnetworks") for r in gce_fake.requests) == 1
    bodies = {name: body for (_, name), body in gce_fake.instances.items()}
    assert bodies[head.id]["networkInterfaces"][0]["accessConfigs"]
    assert ipaddress.ip_address(bodies[head.id]["networkInterfaces"][0]["networkIP"]) not in block
    for w in workers:
        nic = bodies[w.id]["networkInterfaces"][0]
        assert not nic.get("accessConfigs") and ipaddress.ip_address(nic["networkIP"]) in block
        assert nic["subnetwork"].endswith(f"/regions/us-central1/subnetworks/{subnet_name('run-q')}")
    assert all(gce_fake.nat_serves(w.id) for w in workers)
    lines: list[str] = []
    terminate_run(head_side, "run-q", echo=lines.append)
    assert "deleted gcp router/rubberband-run-q-nat (run run-q)" in lines
    assert "deleted gcp subnetwork/rubberband-run-q-workers (run run-q)" in lines
    assert list(gce_fake.routers) == [("us-central1", "vpn-router")] and not gce_fake.instances
    assert not gce_fake.subnetworks


def test_the_runs_nat_gives_egress_to_its_workers_alone(gce_fake):
    """A run's Cloud NAT serves the run's own subnetwork only: the project's other VMs without an external address in
    that region and network — the user's private VMs, another run's workers — get no internet through it."""
    users_vm = provider(gce_fake, worker_egress="existing").provision(InstanceRequest("mine", 1, V100))[0]
    other_run = provider(gce_fake).provision(InstanceRequest("run-o", 1, V100))[0]
    (worker,) = provider(gce_fake).provision(InstanceRequest("run-w", 1, V100))
    assert gce_fake.nat_serves(worker.id) and gce_fake.nat_serves(other_run.id)
    assert not gce_fake.nat_serves(users_vm.id)  # the user's private VM: no egress from the runs' NATs
    terminate_run(provider(gce_fake), "run-o")
    assert gce_fake.nat_serves(worker.id) and not gce_fake.nat_serves(users_vm.id)
    for run in ("run-w", "mine"):
        terminate_run(provider(gce_fake), run)
    assert not gce_fake.routers and not gce_fake.subnetworks and not gce_fake.instances


def test_worker_egress_existing_or_public_makes_no_nat(gce_fake):
    existing = provider(gce_fake, worker_egress="existing")
    (worker,) = existing.provision(InstanceRequest("run-e", 1, V100))
    assert not gce_fake.routers and not gce_fake.instances[("us-central1-a", worker.id)]["networkInterfaces"][0].get(
        "accessConfigs"
    )
    public = provider(gce_fake, worker_egress="public")
    (worker,) = public.provision(InstanceRequest("run-p", 1, V100))
    assert (
        not gce_fake.routers
        and gce_fake.instances[("us-central1-a", worker.id)]["networkInterfaces"][0]["accessConfigs"]
    )
    assert not gce_fake.subnetworks  # the network's own subnetwork: no run's
    with pytest.raises(InputError, match="--worker-egress 'open'"):
        provider(gce_fake, worker_egress="open")
    terminate_run(existing, "run-e")
    terminate_run(public, "run-p")


def test_a_nat_of_every_subnetwork_is_used_and_nats_of_chosen_subnetworks_stand_beside(gce_fake):
    """Compute Engine allows no NAT beside one that serves every subnetwork of a region and network: the user's such
    NAT serves the run's subnetwork too and is used as it is (nothing made but the subnetwork, nothing of the user's
    deleted); a NAT of chosen subnetworks (the user's) stands beside the run's own; a router named like the run's
    without its marker is never taken for it nor deleted."""
    from rubberband.cloud.gcp.names import router_name, subnet_name

    gce_fake.add_router("us-central1", "my-nat", nats=EVERY_SUBNETWORK)
    p = provider(gce_fake)
    assert p.ensure_worker_egress("run-u") == "my-nat"
    (worker,) = p.provision(InstanceRequest("run-u", 1, V100))
    assert list(gce_fake.routers) == [("us-central1", "my-nat")] and gce_fake.nat_serves(worker.id)
    assert list(gce_fake.subnetworks) == [("us-central1", subnet_name("run-u"))]
    assert terminate_run_detailed(p, "run-u").resources[-1:] == [f"subnetwork/{subnet_name('run-u')}"]
    assert list(gce_fake.routers) == [("us-central1", "my-nat")] and not gce_fake.subnetworks  # the user's NAT stays

    mine = gce_fake.add_subnetwork("us-central1", "mine", "10.0.0.0/24")
    gce_fake.routers[("us-central1", "my-nat")]["nats"] = [
        {
            "name": "mine",
            "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
            "natIpAllocateOption": "AUTO_ONLY",
            "subnetworks": [{"name": mine["selfLink"], "sourceIpRangesToNat": ["ALL_IP_RANGES"]}],
        }
    ]
    (worker,) = provider(gce_fake).provision(InstanceRequest("run-l", 1, V100))
    assert sorted(gce_fake.routers) == [("us-central1", "my-nat"), ("us-central1", router_name("run-l"))]
    assert gce_fake.nat_serves(worker.id)
    terminate_run(provider(gce_fake), "run-l")
    assert list(gce_fake.routers) == [("us-central1", "my-nat")] and list(gce_fake.subnetworks) == [
        ("us-central1", "mine")
    ]

    gce_fake.add_router("us-central1", router_name("run-c"), description="my own router")  # a look-alike, no NAT
    with pytest.raises(CloudError, match="rubberband did not create it") as info:
        provider(gce_fake).provision(InstanceRequest("run-c", 1, V100))
    assert info.value.kind == "fatal" and not gce_fake.instances
    assert provider(gce_fake).cleanup_run("run-c") == [
        f"firewall/{firewall_name('run-c', 'deny')}",
        f"firewall/{firewall_name('run-c')}",
        f"subnetwork/{subnet_name('run-c')}",
    ]
    assert provider(gce_fake).leftover_runs() == []
    assert (("us-central1", router_name("run-c"))) in gce_fake.routers


def test_an_earlier_rubberbands_nat_of_every_subnetwork_is_shared_until_its_users_are_gone(gce_fake):
    """A run of an earlier rubberband made a NAT of every subnetwork: a run now goes out through it, and that run's
    teardown keeps it while another run's private workers are in the region; the sweep deletes it once they are
    gone; the later run then makes its own."""
    from rubberband.cloud.gcp.names import owner_marker, router_name

    gce_fake.add_router(
        "us-central1",
        router_name("run-a"),
        description=f"rubberband run run-a: outbound internet {owner_marker('run-a')}",
        nats=EVERY_SUBNETWORK,
    )
    gce_fake.routers[("us-central1", router_name("run-a"))]["creationTimestamp"] = "2020-01-01T00:00:00.000+00:00"
    b = provider(gce_fake)
    b.provision(InstanceRequest("run-b", 0, V100, extra_tags={TAG_ROLE: "head"}))
    b_workers = b.provision(InstanceRequest("run-b", 1, V100, count=2))
    assert list(gce_fake.routers) == [("us-central1", router_name("run-a"))]
    assert all(gce_fake.nat_serves(w.id) for w in b_workers)
    assert terminate_run(provider(gce_fake), "run-a") == []
    assert list(gce_fake.routers) == [("us-central1", router_name("run-a"))]  # kept: run-b's workers use it
    assert cleanup_leftovers(b) == [] and b.leftover_runs() == ["run-a"]
    b.terminate([i.id for i in b_workers])  # run-b's workers are gone; its head (own address) needs no NAT
    assert cleanup_leftovers(b) == [f"router/{router_name('run-a')}"] and not gce_fake.routers
    b.provision(InstanceRequest("run-b", 2, V100))  # a later stage of run-b: a NAT of its own, made afresh
    assert list(gce_fake.routers) == [("us-central1", router_name("run-b"))]
    assert f"router/{router_name('run-b')}" in terminate_run_detailed(b, "run-b").resources
    assert not gce_fake.routers and not gce_fake.instances and not gce_fake.subnetworks


def test_a_runs_subnetwork_takes_a_free_block_of_the_network(gce_fake):
    """The run's /20 overlaps no subnetwork of the network, in any region (the user's, another run's), nor the
    default network's own 10.128.0.0/9; a block a peered network holds is refused by Compute Engine and the next one
    tried; a subnetwork named like the run's without its marker is a fatal one-line error."""
    import ipaddress

    from rubberband.cloud.gcp.names import subnet_name
    from rubberband.cloud.gcp.run_network import free_blocks

    first = next(free_blocks("run-s", []))
    gce_fake.add_subnetwork("us-east1", "mine", first)  # the user's, in another region: same network, same space
    second = next(free_blocks("run-s", [first]))
    gce_fake.peered_ranges = [second]
    provider(gce_fake).run_network.ensure_subnetwork("run-s")
    gce_fake.rejected.clear()  # the peered block's refusal is the point
    taken = gce_fake.subnetworks[("us-central1", subnet_name("run-s"))]["ipCidrRange"]
    assert taken not in (first, second) and taken == next(free_blocks("run-s", [first, second]))
    provider(gce_fake).run_network.ensure_subnetwork("run-t")
    other = gce_fake.subnetworks[("us-central1", subnet_name("run-t"))]["ipCidrRange"]
    assert not ipaddress.ip_network(other).overlaps(ipaddress.ip_network(taken))
    assert not any(ipaddress.ip_network(b).overlaps(ipaddress.ip_network("10.128.0.0/9")) for b in free_blocks("x", []))

    gce_fake.add_subnetwork("us-central1", subnet_name("run-x"), "10.1.0.0/24", description="my own")
    with pytest.raises(CloudError, match="rubberband did not create it") as info:
        provider(gce_fake).provision(InstanceRequest("run-x", 1, V100))
    assert info.value.kind == "fatal" and "\n" not in str(info.value) and not gce_fake.instances
    provider(gce_fake).cleanup_run("run-x")
    assert ("us-central1", subnet_name("run-x")) in gce_fake.subnetworks


def test_a_run_that_failed_over_leaves_a_nat_in_no_region(gce_fake):
    """Workers in a second region get a subnetwork and a NAT there; one teardown (any region's provider) deletes
    both, and the orphan sweep finds them when their run has no VM left in any region."""
    central, east = provider(gce_fake), GcpProvider("us-east1", endpoint=gce_fake.url, poll_s=0.01)
    central.ensure_nat("run-f")
    east.ensure_nat("run-f")
    assert sorted(gce_fake.routers) == [("us-central1", "rubberband-run-f-nat"), ("us-east1", "rubberband-run-f-nat")]
    assert sorted(gce_fake.subnetworks) == [
        ("us-central1", "rubberband-run-f-workers"),
        ("us-east1", "rubberband-run-f-workers"),
    ]
    assert central.leftover_runs() == ["run-f"]  # no VM: a leftover
    assert (
        sorted(cleanup_leftovers(central))
        == ["router/rubberband-run-f-nat"] * 2 + ["subnetwork/rubberband-run-f-workers"] * 2
    )
    assert not gce_fake.routers and not gce_fake.subnetworks


def test_two_runs_making_their_nat_at_once_each_get_their_own(gce_fake, monkeypatch):
    """Run B lists the region before run A's NAT lands: NATs of chosen subnetworks stand side by side, so B's insert
    goes through and each run's workers go out through their run's own NAT."""
    from rubberband.cloud.gcp.names import router_name

    a, b = provider(gce_fake), provider(gce_fake)
    real_list = b.api.routers.list
    calls = []

    def list_before_a(**kwargs):
        found = list(real_list(**kwargs))
        if not calls:
            a.ensure_nat("run-a")  # lands between B's listing and B's insert
        calls.append(1)
        return found

    monkeypatch.setattr(b.api.routers, "list", list_before_a)
    assert b.ensure_nat("run-b") == router_name("run-b") and len(calls) == 1
    assert sorted(gce_fake.routers) == [("us-central1", router_name("run-a")), ("us-central1", router_name("run-b"))]
