"""AwsProvider against a moto EC2 server (server mode), with faults injected into the server."""

from __future__ import annotations

import boto3
import pytest
from cloud_helpers import (
    MOTO_ZONES,
    REGION,
    at_once,
    cloud_catalog,
    ec2_faults,  # noqa: F401
    moto_ami,
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
)

from rubberband.cloud.aws.provider import AwsProvider, security_group_name
from rubberband.cloud.failover import FailoverExhausted, FailoverPolicy, RetryPolicy, provision_with_failover
from rubberband.cloud.provider import TAG_MANAGED, TAG_RUN_ID, TAG_STAGE, TAG_VERSION, InstanceRequest
from rubberband.cloud.teardown import cleanup_leftovers, find_orphans, terminate_instances, terminate_run
from rubberband.errors import CatalogError, CleanupIncomplete, CloudError, InputError, RubberbandError

CATALOG = cloud_catalog()
P3 = CATALOG.find("p3.2xlarge", region=REGION)  # zone IDs use1-az1, use1-az2 (moto: us-east-1b, us-east-1c)
G4 = CATALOG.find("g4dn.xlarge", region=REGION)  # use1-az1


def provider(**kwargs) -> AwsProvider:
    delays: list[float] = []
    kwargs.setdefault("retry", RetryPolicy(max_tries=4, base_s=1.0, cap_s=8.0, sleep=delays.append))
    p = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01, **kwargs)
    p.delays = delays  # type: ignore[attr-defined]
    return p


def ec2():
    return boto3.client("ec2", region_name=REGION)


def live_instances() -> list[dict]:
    reservations = ec2().describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def test_provision_tags_imdsv2_spot_user_data_and_group(moto_env):
    p = provider(ssh_cidr="203.0.113.7/32")
    script = "#!/bin/bash\necho join the head\n"
    made = p.provision(InstanceRequest("run-a", 2, P3, count=2, spot=True, zone="use1-az2", startup_script=script))
    running = p.wait([i.id for i in made], timeout_s=10)
    assert [i.state for i in running] == ["running", "running"]
    assert {i.run_id for i in running} == {"run-a"} and {i.stage for i in running} == {2}

    raw = live_instances()
    assert len(raw) == 2
    for inst in raw:
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[TAG_MANAGED] == "true" and tags[TAG_RUN_ID] == "run-a" and tags[TAG_STAGE] == "2"
        assert tags[TAG_VERSION] == "0-1-0"
        assert inst["MetadataOptions"]["HttpTokens"] == "required"
        assert inst["InstanceLifecycle"] == "spot"
        assert inst["InstanceType"] == "p3.2xlarge"
        assert inst["Placement"]["AvailabilityZone"] == MOTO_ZONES["use1-az2"]  # zone ID → this account's name
        user_data = ec2().describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
        import base64

        assert base64.b64decode(user_data["UserData"]["Value"]).decode() == script
        behaviour = ec2().describe_instance_attribute(
            InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

    (group,) = ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [security_group_name("run-a")]}]
    )["SecurityGroups"]
    assert {g["GroupId"] for g in raw[0]["SecurityGroups"]} == {group["GroupId"]}
    rules = group["IpPermissions"]
    ray_rule = next(r for r in rules if r["UserIdGroupPairs"])
    assert [pair["GroupId"] for pair in ray_rule["UserIdGroupPairs"]] == [group["GroupId"]]  # self-referencing
    assert not ray_rule["IpRanges"]
    ssh_rule = next(r for r in rules if r.get("FromPort") == 22)
    assert [r["CidrIp"] for r in ssh_rule["IpRanges"]] == ["203.0.113.7/32"]
    assert all(r["CidrIp"] != "0.0.0.0/0" for rule in rules for r in rule["IpRanges"])
    # no path from outside the run to a Ray port: every rule is the group itself, or port 22 from the user's CIDR
    for rule in rules:
        assert not rule.get("Ipv6Ranges") and not rule.get("PrefixListIds")
        assert rule["UserIdGroupPairs"] or (rule["FromPort"], rule["ToPort"]) == (22, 22)

    assert sorted(i.id for i in p.list("run-a")) == sorted(i.id for i in made)
    assert terminate_run(p, "run-a", timeout_s=10) and not live_instances()
    assert not ec2().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [security_group_name("run-a")]}]
    )["SecurityGroups"]
    assert terminate_run(p, "run-a", timeout_s=10) == []  # idempotent


def test_the_metadata_token_does_not_leave_the_instance(moto_env):
    """Every node's metadata service takes IMDSv2 tokens only, with a PUT response hop limit of 1: the token that
    reads the head's role credentials reaches processes on the instance, never a container or a forwarded hop
    (issue 29: the limit was 2). Read back from EC2 (moto), as the instance was really launched."""
    p = provider()
    p.provision(InstanceRequest("run-imds", 0, G4))
    (inst,) = live_instances()
    options = inst["MetadataOptions"]
    assert options["HttpTokens"] == "required" and options["HttpEndpoint"] == "enabled"
    assert options["HttpPutResponseHopLimit"] == 1
    terminate_run(p, "run-imds", timeout_s=10)


def test_on_demand_and_no_ssh_unless_asked(moto_env):
    p = provider()
    made = p.provision(InstanceRequest("run-b", 0, G4))
    (inst,) = live_instances()
    assert inst.get("InstanceLifecycle") is None  # on-demand
    group = ec2().describe_security_groups(GroupIds=[inst["SecurityGroups"][0]["GroupId"]])["SecurityGroups"][0]
    assert [r.get("FromPort") for r in group["IpPermissions"]] == [0]
    p.terminate([made[0].id, made[0].id, "i-0123456789abcdef0"])  # duplicates and gone ids are fine
    assert not live_instances()


def test_capacity_fails_over_zone_then_alternative_type(moto_env, ec2_faults):
    p = provider()
    ec2_faults.capacity = {MOTO_ZONES["use1-az1"]}
    result = provision_with_failover(InstanceRequest("run-c", 0, P3), lambda t: p, alternatives=[G4])
    assert (result.instance_type.name, result.zone) == ("p3.2xlarge", "use1-az2")
    assert [(a.zone, a.outcome) for a in result.attempts] == [("use1-az1", "capacity"), ("use1-az2", "ok")]
    assert [call[0] for call in ec2_faults.calls] == [MOTO_ZONES["use1-az1"], MOTO_ZONES["use1-az2"]]

    policy = FailoverPolicy()
    ec2_faults.capacity, ec2_faults.capacity_types = {"*"}, {"p3.2xlarge"}
    result = provision_with_failover(
        InstanceRequest("run-c", 1, P3, zone="use1-az2"), lambda t: p, alternatives=[G4], policy=policy
    )
    assert [(a.instance_type, a.zone, a.outcome) for a in result.attempts] == [
        ("p3.2xlarge", "use1-az2", "capacity"),
        ("p3.2xlarge", "use1-az1", "capacity"),
        ("g4dn.xlarge", "use1-az1", "ok"),
    ]
    assert result.instances[0].instance_type == "g4dn.xlarge"
    assert ("aws", "p3.2xlarge", "use1-az1") in policy.blocked_zones
    assert len(live_instances()) == 2
    terminate_run(p, "run-c", timeout_s=10)
    assert not live_instances()


def test_quota_blocks_the_region_and_names_the_quota(moto_env, ec2_faults):
    p = provider()
    ec2_faults.quota = True
    policy = FailoverPolicy()
    with pytest.raises(FailoverExhausted) as info:
        provision_with_failover(InstanceRequest("run-d", 0, P3), lambda t: p, alternatives=[G4], policy=policy)
    err = info.value
    assert err.kind == "quota" and "\n" not in err.message
    assert "Running On-Demand P instances" in err.message
    assert [a.outcome for a in err.attempts] == ["quota", "skipped", "skipped"]  # no hammering (SkyPilot #1268)
    assert len(ec2_faults.calls) == 1 and ("aws", REGION) in policy.blocked_regions
    with pytest.raises(CloudError) as spot:
        p.provision(InstanceRequest("run-d", 0, P3, spot=True))
    assert spot.value.kind == "quota" and spot.value.code == "MaxSpotInstanceCountExceeded"
    assert "All P Spot Instance Requests" in spot.value.message
    assert not live_instances()


def test_throttling_is_retried_with_bounded_backoff(moto_env, ec2_faults):
    p = provider()
    ec2_faults.throttle = 2
    made = p.provision(InstanceRequest("run-e", 0, G4))
    assert len(made) == 1 and len(ec2_faults.calls) == 3
    assert len(p.delays) == 2 and p.delays[0] <= 1.0 < p.delays[1] <= 2.0
    ec2_faults.throttle = 10
    with pytest.raises(CloudError) as info:
        p.provision(InstanceRequest("run-e", 0, G4))
    assert info.value.kind == "transient" and info.value.code == "RequestLimitExceeded"
    assert len(ec2_faults.calls) == 3 + 4 and max(p.delays) <= 8.0
    assert len(live_instances()) == 1
    terminate_run(p, "run-e", timeout_s=10)


def test_bad_input_is_one_line_and_provisions_nothing(moto_env, ec2_faults, monkeypatch):
    with pytest.raises(CatalogError):
        CATALOG.find("p9.huge", cloud="aws")
    with pytest.raises(InputError, match="region 'us-nowhere-1' is unknown"):
        AwsProvider("us-nowhere-1")
    p = provider()
    with pytest.raises(InputError, match="listed for us-east-1"):
        AwsProvider("us-west-2", image_id="ami-1").provision(InstanceRequest("run-f", 0, P3))
    with pytest.raises(InputError, match="zone 'us-east-1z'"):
        p.provision(InstanceRequest("run-f", 0, P3, zone="us-east-1z"))
    with pytest.raises(InputError, match="run id"):
        p.provision(InstanceRequest("Run_F", 0, P3))
    with pytest.raises(InputError, match="whole internet"):
        provider(ssh_cidr="0.0.0.0/0")
    with pytest.raises(InputError, match="IPv6, but the run's head has only an IPv4"):
        provider(ssh_cidr="2001:db8::1/128")
    monkeypatch.delenv("RUBBERBAND_AWS_AMI")
    with pytest.raises(CloudError, match="set RUBBERBAND_AWS_AMI") as no_image:
        AwsProvider(REGION).provision(InstanceRequest("run-f", 0, P3))
    assert no_image.value.kind == "fatal"
    ec2_faults.denied = {"RunInstances"}
    with pytest.raises(CloudError) as denied:
        p.provision(InstanceRequest("run-f", 0, P3))
    assert denied.value.kind == "fatal" and "ec2:RunInstances" in denied.value.message
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    with pytest.raises(CloudError) as missing:
        AwsProvider(REGION)
    assert missing.value.kind == "fatal" and "credentials" in missing.value.message
    for err in (denied.value, missing.value):
        assert isinstance(err, RubberbandError) and "\n" not in str(err)
    assert not live_instances()
    p.cleanup_run("run-f", timeout_s=5)


def test_orphans_and_leftover_groups(moto_env):
    p = provider()
    old = p.provision(InstanceRequest("run-old", 0, G4, count=2))
    active = p.provision(InstanceRequest("run-active", 0, G4))
    headed = p.provision(InstanceRequest("run-headed", 0, G4, extra_tags={"rubberband-role": "head"}))
    launched = old[0].launched_at
    assert launched is not None
    assert find_orphans(p, 3600, now=launched + 10) == []  # nothing is old yet
    # An hour later: the head of run-headed is itself overdue, so its run counts as dead too.
    orphans = find_orphans(p, 3600, active_runs={"run-active"}, now=launched + 7200)
    assert sorted(i.run_id for i in orphans) == ["run-headed", "run-old", "run-old"]
    # a live, young head protects its run:
    assert "run-headed" not in {i.run_id for i in find_orphans(p, 3600, now=launched + 10)}
    lines: list[str] = []
    result = terminate_instances(p, orphans, timeout_s=10, echo=lines.append)
    assert len(result.instances) == 3 and sum(line.startswith("terminated") for line in lines) == 3
    assert sorted(i.run_id for i in p.list()) == ["run-active"]
    assert any(r.startswith("sg-") for r in result.resources)
    # A group whose instances vanished without cleanup (e.g. killed CLI) is found and deleted.
    p.terminate([active[0].id])
    assert p.leftover_runs() == ["run-active"]
    assert len(cleanup_leftovers(p, timeout_s=10)) == 1 and p.leftover_runs() == []
    assert not live_instances() and headed


def test_concurrent_launches_of_a_run_create_one_group_and_teardown_deletes_every_group_of_the_run(moto_env):
    """The run's launches come from several threads. Each found no group and called CreateSecurityGroup, and
    moto's name check is not atomic: once, in CI, it made two groups, and the run's teardown deleted only the
    first. Now one thread at a time finds or creates the group, and cleanup deletes every group of the run."""
    p = provider()
    creates: list[str] = []
    p.ec2.meta.events.register("before-call.ec2.CreateSecurityGroup", lambda **kwargs: creates.append("call"))
    got = at_once(lambda: p.ensure_security_group("run-g"), threads=6)
    assert len(creates) == 1 and len(set(got)) == 1 and len(got) == 6
    # a second group of the run, however it came to be (another VPC tool, a stand-in's race): teardown ends both
    tags = [{"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_RUN_ID, "Value": "run-g"}]
    other = ec2().create_security_group(
        GroupName="rubberband-run-g-second",
        Description="a second group of the run",
        VpcId=ec2().describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"],
        TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
    )["GroupId"]
    p.provision(InstanceRequest("run-g", 0, G4))
    lines: list[str] = []
    terminate_run(p, "run-g", timeout_s=10, echo=lines.append)
    assert {got[0], other} <= {line.split()[2] for line in lines if line.startswith("deleted")}
    assert p.find_security_group("run-g") is None and p.leftover_runs() == []


@pytest.fixture
def secrets_unlistable(moto_env, monkeypatch):
    """Credentials without ``secretsmanager:ListSecrets``: the moto server answers AccessDeniedException, as
    Secrets Manager does."""
    from moto.core.exceptions import JsonRESTError
    from moto.secretsmanager.responses import SecretsManagerResponse

    def denied(self):
        raise JsonRESTError("AccessDeniedException", "User is not authorized to perform: secretsmanager:ListSecrets")

    monkeypatch.setattr(SecretsManagerResponse, "list_secrets", denied)


def test_a_run_whose_secrets_cannot_be_listed_still_loses_its_group_and_volumes(moto_env, secrets_unlistable):
    """Issue 29: cleanup listed the run's secrets before its security group, so credentials without
    secretsmanager:ListSecrets (the permission is only for secrets) never deleted the group. Now the group goes once
    the run's instances are gone, then its detached volumes, and the secrets last; the error that follows names the
    missing permission and what did go, and teardown still reports each deleted resource."""
    p = provider()
    (inst,) = p.provision(InstanceRequest("run-s", 0, G4))
    group = p.find_security_group("run-s")
    tags = [{"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_RUN_ID, "Value": "run-s"}]
    volume = ec2().create_volume(
        AvailabilityZone="us-east-1a", Size=1, TagSpecifications=[{"ResourceType": "volume", "Tags": tags}]
    )["VolumeId"]
    lines: list[str] = []
    with pytest.raises(CleanupIncomplete, match="secretsmanager:ListSecrets") as raised:
        terminate_run(p, "run-s", timeout_s=10, echo=lines.append)
    assert group is not None and sorted(raised.value.deleted) == sorted([group, volume])
    assert p.find_security_group("run-s") is None and not live_instances()
    assert volume not in {v["VolumeId"] for v in ec2().describe_volumes()["Volumes"]}
    assert f"deleted aws {group} (run run-s)" in lines and f"terminated aws {inst.id}" in lines[0]
    assert group in raised.value.message and raised.value.kind == "fatal"
    # the orphan sweep finds leftovers by their groups and volumes all the same
    ec2().create_security_group(
        GroupName=security_group_name("run-t"),
        Description="left by a killed CLI",
        TagSpecifications=[
            {"ResourceType": "security-group", "Tags": [*tags[:1], {"Key": TAG_RUN_ID, "Value": "run-t"}]}
        ],
    )
    assert p.leftover_runs() == ["run-t"]


def test_sessions_share_the_service_models_and_keep_their_own_credentials(monkeypatch):
    """Each provider's session reads EC2's model from the one loader (not megabytes of JSON again); credentials are
    still each session's own, resolved as boto3 does (on first use)."""
    from rubberband.cloud.aws.session import new_session

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    first = new_session()
    assert first.get_credentials().access_key == "first"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    second = new_session()
    assert second.get_credentials().access_key == "second" and first.get_credentials().access_key == "first"
    assert second._session.get_component("data_loader") is first._session.get_component("data_loader")
    assert first.client("ec2", region_name="us-east-1").meta.service_model.service_name == "ec2"
