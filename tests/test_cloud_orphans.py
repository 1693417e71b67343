"""Orphans found by the cloud's truth (issue 17, item 4): `down --all-orphans` decides from tags / labels, launch
times and the runs' heartbeat (cloud/heartbeat.py), never from local files; it finds the instances, security groups,
firewall rules, disks and head roles rubberband created — by exact run tags / labels (a firewall rule by its
ownership marker) — and a user's own look-alike resources (same name shape, no tag) survive. moto server + the GCE
fake; the sweep runs in this process with an injected clock (the CLI's own flags are tested in test_cloud_cli.py)."""

from __future__ import annotations

import dataclasses
import time

import boto3
import pytest
from cloud_helpers import REGION, cloud_catalog, moto_ami, moto_env, moto_server  # noqa: F401  (fixtures)
from gce_fake import GceFake, gce_fake  # noqa: F401  (fixture)

from rubberband.cloud.aws.provider import AwsProvider, security_group_name
from rubberband.cloud.failover import RetryPolicy
from rubberband.cloud.gcp.names import firewall_name, owner_marker
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.heartbeat import Heartbeat, beat_labels, orphaned_runs
from rubberband.cloud.aws.identity import AwsIdentities
from rubberband.cloud.provider import TAG_HEARTBEAT, TAG_MANAGED, TAG_ROLE, TAG_RUN_ID, Instance, InstanceRequest
from rubberband.commands.down import down_orphans
from rubberband.errors import CloudError

CATALOG = cloud_catalog()
G4 = CATALOG.find("g4dn.xlarge", region=REGION)
V100 = dataclasses.replace(CATALOG.find("n1-standard-8+V100x1", region="us-central1"), zones=("us-central1-a",))
HOUR = 3600.0


def _inst(run: str, launched: float | None, beat: float | None = None) -> Instance:
    tags = {TAG_MANAGED: "true", TAG_RUN_ID: run, **({TAG_HEARTBEAT: str(int(beat))} if beat is not None else {})}
    return Instance(
        id=f"i-{run}-{launched}",
        cloud="aws",
        instance_type="t",
        zone="z",
        state="running",
        run_id=run,
        launched_at=launched,
        tags=tags,
    )


def test_a_run_is_orphaned_only_when_none_of_its_instances_showed_life_for_the_threshold():
    now = 100_000.0
    instances = [
        _inst("old", now - 2 * HOUR),
        _inst("old", now - 3 * HOUR),
        _inst("beating", now - 5 * HOUR, beat=now - 60),  # launched long ago, heartbeat a minute ago
        _inst("young", now - 60),  # no heartbeat yet: its launch counts
        _inst("mixed", now - 5 * HOUR),
        _inst("mixed", now - 120),  # one young worker keeps it alive
        _inst("stale", now - 5 * HOUR, beat=now - 2 * HOUR),
        _inst("timeless", None),
    ]
    assert orphaned_runs(instances, now=now, older_than_s=HOUR) == {"old", "stale", "timeless"}
    assert orphaned_runs(instances, now=now, older_than_s=HOUR, protected={"old"}) == {"stale", "timeless"}
    assert orphaned_runs(instances, now=now, older_than_s=10 * HOUR) == {"timeless"}


def test_the_heartbeat_beats_at_once_then_on_its_interval_and_survives_a_failing_write():
    written: list[float] = []
    clock = iter(range(1000, 2000))

    def beat(now: float) -> None:
        if len(written) == 1 and not getattr(beat, "failed", False):
            beat.failed = True  # type: ignore[attr-defined]
            raise CloudError("throttled", kind="transient")
        written.append(now)

    heartbeat = Heartbeat(beat, interval_s=0.01, clock=lambda: float(next(clock))).start()
    deadline = time.monotonic() + 10
    while len(written) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    heartbeat.stop()
    assert written[:3] == sorted(written[:3]) and len(written) >= 3 and heartbeat.beats == len(written)
    assert beat_labels(1234.9) == {TAG_HEARTBEAT: "1234"}


# -- AWS (moto) ------------------------------------------------------------------------------------------------


def _aws() -> AwsProvider:
    return AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01, retry=RetryPolicy(sleep=lambda s: None))


def test_aws_sweep_ends_dead_runs_by_tags_and_heartbeat_and_spares_live_runs_and_look_alikes(moto_env):
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam")
    p = _aws()
    dead = p.provision(InstanceRequest("run-dead", 0, G4, count=2))
    head = p.provision(InstanceRequest("run-live", 0, G4, extra_tags={TAG_ROLE: "head"}))
    AwsIdentities().create("run-dead", REGION)
    AwsIdentities().create("run-live", REGION)
    now = time.time() + 3 * HOUR  # three hours on: every launch is old, only a heartbeat keeps a run alive
    p.set_labels(head[0].id, beat_labels(now - 60))
    # the user's own look-alikes: same names as rubberband would give, no rubberband tag
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    user_sg = ec2.create_security_group(GroupName=security_group_name("run-mine"), Description="mine", VpcId=vpc)[
        "GroupId"
    ]
    user_vm = ec2.run_instances(
        ImageId=moto_ami(),
        MinCount=1,
        MaxCount=1,
        InstanceType="t3.micro",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "rb-run-mine-0"}]}],
    )["Instances"][0]["InstanceId"]
    user_volume = ec2.create_volume(
        AvailabilityZone="us-east-1a",
        Size=1,
        TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": "Name", "Value": "rb-run-mine-0"}]}],
    )["VolumeId"]
    iam.create_role(RoleName="rb-run-mine", AssumeRolePolicyDocument="{}", Path="/rubberband/")
    secrets = boto3.client("secretsmanager", region_name=REGION)
    secrets.create_secret(Name="rubberband-run-mine", SecretString="mine")  # the user's, no tag
    secrets.create_secret(
        Name="rb-run-dead-token",
        SecretString="t",
        Tags=[  # a secret of the dead run
            {"Key": TAG_MANAGED, "Value": "true"},
            {"Key": TAG_RUN_ID, "Value": "run-dead"},
        ],
    )
    # a detached volume of the dead run (its instance was gone, the volume kept): found by its tags
    stray = ec2.create_volume(
        AvailabilityZone="us-east-1a",
        Size=1,
        TagSpecifications=[
            {
                "ResourceType": "volume",
                "Tags": [{"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_RUN_ID, "Value": "run-dead"}],
            }
        ],
    )["VolumeId"]

    assert down_orphans("aws", [REGION], HOUR, now=now) == 2
    assert sorted(i.run_id for i in p.list()) == ["run-live"]
    groups = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    assert user_sg in groups and p.find_security_group("run-live") in groups
    assert p.find_security_group("run-dead") is None
    volumes = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert user_volume in volumes and stray not in volumes
    states = {
        i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
    }
    assert states[user_vm] == "running" and all(states[i.id] == "terminated" for i in dead)
    roles = sorted(r["RoleName"] for r in iam.list_roles()["Roles"])
    assert roles == ["rb-run-live", "rb-run-mine"]
    assert [s["Name"] for s in secrets.list_secrets()["SecretList"]] == ["rubberband-run-mine"]
    # the live run goes silent: the next sweep ends it too; the look-alikes still survive
    assert down_orphans("aws", [REGION], HOUR, now=now + 2 * HOUR) == 1
    assert p.list() == [] and sorted(r["RoleName"] for r in iam.list_roles()["Roles"]) == ["rb-run-mine"]
    assert user_sg in {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}


def test_a_young_group_of_a_run_being_started_is_left_alone(moto_env):
    """The CLI creates the run's group before its head: a sweep in between must not delete it (its created tag)."""
    p = _aws()
    group = p.ensure_security_group("run-starting")
    assert p.leftover_runs(older_than_s=HOUR) == [] and p.leftover_runs(older_than_s=0) == ["run-starting"]
    assert down_orphans("aws", [REGION], HOUR) == 0 and p.find_security_group("run-starting") == group


def test_aws_never_reuses_a_look_alike_group(moto_env):
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    ec2.create_security_group(GroupName=security_group_name("run-clash"), Description="mine", VpcId=vpc)
    with pytest.raises(CloudError, match="rubberband did not create it") as info:
        _aws().provision(InstanceRequest("run-clash", 0, G4))
    assert info.value.kind == "fatal"


def test_an_instance_profile_whose_role_is_gone_is_swept(moto_env):
    """A teardown cut off between deleting the role and its profile leaves the profile: found by its tags."""
    iam = boto3.client("iam")
    AwsIdentities().create("run-half", REGION)
    iam.remove_role_from_instance_profile(InstanceProfileName="rb-run-half", RoleName="rb-run-half")
    iam.delete_role_policy(RoleName="rb-run-half", PolicyName="rubberband-head")
    iam.delete_role(RoleName="rb-run-half")
    assert list(AwsIdentities().find_profiles()) == ["rb-run-half"]
    down_orphans("aws", [REGION], HOUR, now=time.time() + 2 * HOUR)
    assert iam.list_instance_profiles()["InstanceProfiles"] == []


# -- GCP (the GCE fake) ----------------------------------------------------------------------------------------


def _gcp(fake: GceFake) -> GcpProvider:
    return GcpProvider("us-central1", endpoint=fake.url, poll_s=0.01, retry=RetryPolicy(sleep=lambda s: None))


def test_gcp_sweep_ends_dead_runs_and_spares_live_runs_and_look_alikes(gce_fake, monkeypatch):
    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    p = _gcp(gce_fake)
    p.provision(InstanceRequest("run-dead", 0, V100, count=2))
    head = p.provision(InstanceRequest("run-live", 0, V100, extra_tags={TAG_ROLE: "head"}))
    now = time.time() + 3 * HOUR
    p.set_labels(head[0].id, beat_labels(now - 60))
    # the user's own look-alikes: a rule and a disk named as rubberband names its own, without its marker / labels
    gce_fake.firewalls[firewall_name("run-mine")] = {
        "name": firewall_name("run-mine"),
        "description": "my own rule",
        "network": "global/networks/default",
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
    }
    gce_fake.add_disk("us-central1-a", "rb-run-mine-0-abcdef")
    gce_fake.add_router(
        "us-east1",
        "rubberband-run-mine-nat",
        description="my own NAT",
        nats=[
            {
                "name": "nat",
                "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
                "natIpAllocateOption": "AUTO_ONLY",
            }
        ],
    )
    # a detached disk of the dead run (its VM was deleted without it): found by its labels
    gce_fake.add_disk("us-central1-a", "rb-run-dead-0-123456", labels={TAG_MANAGED: "true", TAG_RUN_ID: "run-dead"})

    assert sorted(gce_fake.routers) == [
        ("us-central1", "rubberband-run-dead-nat"),
        ("us-east1", "rubberband-run-mine-nat"),
    ]
    assert down_orphans("gcp", ["us-central1"], HOUR, now=now) == 2
    assert [i.run_id for i in p.list()] == ["run-live"]
    assert list(gce_fake.routers) == [("us-east1", "rubberband-run-mine-nat")]  # the dead run's NAT went
    assert sorted(gce_fake.firewalls) == sorted(
        [firewall_name("run-live", "deny"), firewall_name("run-live"), firewall_name("run-mine")]
    )
    assert sorted(name for _, name in gce_fake.disks) == sorted([head[0].id, "rb-run-mine-0-abcdef"])
    assert down_orphans("gcp", ["us-central1"], HOUR, now=now + 2 * HOUR) == 1
    assert not gce_fake.instances and list(gce_fake.firewalls) == [firewall_name("run-mine")]
    assert [name for _, name in gce_fake.disks] == ["rb-run-mine-0-abcdef"]
    assert list(gce_fake.routers) == [("us-east1", "rubberband-run-mine-nat")]


def test_gcp_sweep_deletes_a_leaked_nat_of_a_run_without_vms_and_only_it(gce_fake, monkeypatch):
    """A CLI killed right after it made the run's Cloud NAT (before the head existed) leaves a router and a
    subnetwork and nothing else: the sweep deletes them once they are older than the threshold (found by their marker,
    in any region), never young ones of a run being started, nor the user's router named like it."""
    from rubberband.cloud.gcp.names import router_name

    monkeypatch.setenv("RUBBERBAND_GCE_ENDPOINT", gce_fake.url)
    p = _gcp(gce_fake)
    p.ensure_nat("run-leak")
    GcpProvider("us-west1", endpoint=gce_fake.url, poll_s=0.01).ensure_nat("run-leak")
    gce_fake.add_router("us-central1", router_name("run-yours"), description="rubberband-looking, yours")
    assert down_orphans("gcp", ["us-central1"], HOUR) == 0  # young: a run being started keeps it
    assert len(gce_fake.routers) == 3
    assert len(gce_fake.subnetworks) == 2  # the run's subnetworks of its workers, in both regions
    assert down_orphans("gcp", ["us-central1"], HOUR, now=time.time() + 2 * HOUR) == 0  # no instance: 0 ended
    assert list(gce_fake.routers) == [("us-central1", router_name("run-yours"))] and not gce_fake.subnetworks


def test_gcp_never_reuses_nor_deletes_a_look_alike_firewall_rule(gce_fake):
    gce_fake.firewalls[firewall_name("run-clash")] = {
        "name": firewall_name("run-clash"),
        "description": "my own rule",
        "network": "global/networks/default",
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
    }
    p = _gcp(gce_fake)
    with pytest.raises(CloudError, match="rubberband did not create it") as info:
        p.provision(InstanceRequest("run-clash", 0, V100))
    assert info.value.kind == "fatal" and not gce_fake.instances
    # the run's own deny rule (created first, with its marker) goes; the user's look-alike stays
    assert p.cleanup_run("run-clash") == [f"firewall/{firewall_name('run-clash', 'deny')}"]
    assert firewall_name("run-clash") in gce_fake.firewalls
    assert p.leftover_runs() == []
    p.ensure_firewall("run-ours")
    assert gce_fake.firewalls[firewall_name("run-ours")]["description"].endswith(owner_marker("run-ours"))


# -- the executor writes the heartbeat -------------------------------------------------------------------------


def test_the_executor_on_the_head_writes_the_heartbeat_on_its_head_instance(moto_env, tmp_path):
    from rubberband.cloud.head_run import OnHeadCloudBackend

    p = _aws()
    (head,) = p.provision(InstanceRequest("run-hb", 0, G4, extra_tags={TAG_ROLE: "head"}))
    (head,) = p.wait([head.id], 10)
    backend = OnHeadCloudBackend(
        cloud="aws", run_dir=tmp_path, regions=[REGION], catalog=CATALOG, head_instance=head, heartbeat_s=0.05
    )
    backend.start_head("run-hb")
    try:
        deadline = time.monotonic() + 20
        while backend._heartbeat.beats < 2 and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.05)
    finally:
        backend.stop_head()
    (seen,) = p.list("run-hb")
    assert abs(float(seen.tags[TAG_HEARTBEAT]) - time.time()) < 30
    p.terminate([head.id])


def test_with_the_cli_machine_as_head_the_heartbeat_goes_on_the_runs_workers(moto_env, tmp_path):
    """`--head local`: the head has no instance, so the beat is written on the run's live workers (and on no other
    run's instance)."""
    from rubberband.cloud.heartbeat import beat_instances
    from rubberband.cloud.local_head import LocalHeadCloudBackend

    p = _aws()
    workers = p.provision(InstanceRequest("run-lh", 0, G4, count=2, extra_tags={TAG_ROLE: "worker"}))
    other = p.provision(InstanceRequest("run-other", 0, G4))
    backend = LocalHeadCloudBackend(cloud="aws", run_dir=tmp_path, regions=[REGION], catalog=CATALOG)
    backend.workers.head = dataclasses.replace(backend.workers.head, run_id="run-lh")  # as start_head sets it
    beat_instances(backend.heartbeat_targets)(1_700_000_000.0)
    beats = {i.id: i.tags.get(TAG_HEARTBEAT) for i in p.list()}
    assert {beats[w.id] for w in workers} == {"1700000000"} and beats[other[0].id] is None
