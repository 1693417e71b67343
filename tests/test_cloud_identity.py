"""The head's cloud identity (cloud/identity.py): the least-privilege policy, the role and instance profile created
for a run (moto server) and deleted with it, the head launched with it, and the dry run's identity checks (moto
plus a policy simulator, the GCE fake's IAM endpoints)."""

from __future__ import annotations

import json

import boto3
import pytest
from cloud_helpers import (
    REGION,
    cloud_catalog,
    ec2_faults,  # noqa: F401
    iam_simulator,  # noqa: F401
    moto_env,  # noqa: F401  (fixtures)
    moto_server,  # noqa: F401
    no_played_head_left,  # noqa: F401
)
from gce_fake import gce_fake  # noqa: F401

from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.head import HeadBoot, provision_head
from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS, GcpIdentities
from rubberband.cloud.aws.identity import (
    AWS_HEAD_END_ACTIONS,
    IAM_PATH,
    AwsIdentities,
    aws_head_actions,
    aws_head_denials,
    aws_head_policy,
)
from rubberband.cloud.head_identity import launch_with_new_identity
from rubberband.cloud.head_session import HeadOptions
from rubberband.cloud.registry import head_mode
from rubberband.cloud.provider import TAG_RUN_ID
from rubberband.errors import CloudError, InputError


def test_the_head_policy_is_least_privilege():
    """Every action that creates, changes or ends something is conditioned on the run's own tag; reads are the only
    unconditioned EC2 actions; of IAM only the head's end of its own role and profile, named by ARN
    (tests/test_cloud_aws_reap.py), and no iam:PassRole (workers get no identity)."""
    policy = aws_head_policy("run-a")
    statements = policy["Statement"]
    for st in statements:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert st["Effect"] == "Allow" and not any(a.endswith("*") for a in actions)
        if st["Sid"] in ("EndOnlyItsOwnInstanceProfile", "EndOnlyItsOwnRolesPolicyLast"):
            assert set(actions) <= set(AWS_HEAD_END_ACTIONS) and st["Resource"].endswith("/rubberband/rb-run-a")
            continue
        assert not any(a.startswith("iam:") for a in actions)
        if st["Sid"] == "ParkOnlyInTheVpcsDefaultGroup":  # the VPC's default group, by id (rendered per run)
            assert actions == ["ec2:ModifyInstanceAttribute"] and st["Resource"].endswith(
                "security-group/DEFAULT_GROUP"
            )
            continue
        if st["Sid"] in ("Read", "FindTheImage", "LaunchFromImagesAndSubnets", "CreateTheGroupInAVpc"):
            assert all(
                a.startswith(("ec2:Describe", "ssm:Get", "ec2:RunInstances", "ec2:CreateSecurityGroup"))
                for a in actions
            )
            assert st["Sid"] != "LaunchFromImagesAndSubnets" or not any(
                ":instance/" in r or ":security-group/" in r for r in st["Resource"]
            )
            continue
        values = [v for terms in st["Condition"].values() for v in terms.values()]
        assert "run-a" in values or st["Sid"] in ("TagInstancesOnlyAtLaunch", "TagTheGroupOnlyAtCreation"), st
    by_sid = {st["Sid"]: st for st in statements}
    assert by_sid["TerminateOnlyTheRunsInstances"]["Condition"] == {
        "StringEquals": {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-a"}
    }
    assert by_sid["LaunchOnlyTheRunsInstances"]["Condition"]["StringEquals"][f"aws:RequestTag/{TAG_RUN_ID}"] == "run-a"
    # a re-tag may change the stage and the heartbeat alone: never the run id (which would hand another run's
    # instance over); tags are otherwise written only by the call that creates the resource
    assert by_sid["RetagOnlyTheRunsInstancesStageAndHeartbeat"]["Condition"]["ForAllValues:StringEquals"] == {
        "aws:TagKeys": ["rubberband-stage", "rubberband-heartbeat"]
    }
    assert by_sid["TagInstancesOnlyAtLaunch"]["Condition"] == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}


ACCOUNT = "123456789012"  # moto's


def _wildcard_in(action: str, patterns: list[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)


def test_the_cli_may_create_roles_only_under_rubberbands_boundary():
    """Issue 29: the documented CLI policy let whoever holds it create a role under /rubberband/ with any inline
    policy (`*:*`), and pass it to an instance. Evaluated as IAM does (tests/iam_eval.py): the CLI's policy allows
    what creating, finding and deleting a run's role calls, with the boundary the role is created with; it never
    allows a role without rubberband's boundary or under another one, nor removing, swapping or changing the
    boundary — explicitly denied, so not even broad IAM rights held beside it allow them."""
    from iam_eval import evaluate

    from rubberband.cloud.aws.identity import (
        BOUNDARY_KEY,
        aws_creator_actions,
        aws_creator_denials,
        aws_creator_policy,
        boundary_arn,
    )

    creator = [aws_creator_policy(ACCOUNT)]
    for action, context, resource in aws_creator_actions(ACCOUNT):
        assert evaluate(action, resource, context, policies=creator) == "allowed", action
    for action, context, resource, doing in aws_creator_denials(ACCOUNT):
        assert evaluate(action, resource, context, policies=creator) != "allowed", doing
    role = f"arn:aws:iam::{ACCOUNT}:role/rubberband/rb-evil"
    ours = {BOUNDARY_KEY: boundary_arn(ACCOUNT)}
    assert evaluate("iam:CreateRole", role, ours, policies=creator) == "allowed"
    # the escalation: a role without the boundary (or outside rubberband's path) cannot be made
    assert evaluate("iam:CreateRole", role, {}, policies=creator) == "explicitDeny"
    assert evaluate("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/evil", ours, policies=creator) == "implicitDeny"
    # the deny statements hold against broad IAM rights held beside the policy (say, IAMFullAccess)
    iam_full = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "iam:*", "Resource": "*"}]}
    both = [*creator, iam_full]
    assert evaluate("iam:CreateRole", role, {}, policies=both) == "explicitDeny"
    assert evaluate("iam:PutRolePolicy", role, {}, policies=both) == "explicitDeny"
    assert evaluate("iam:DeleteRolePermissionsBoundary", role, ours, policies=both) == "explicitDeny"
    assert evaluate("iam:PutRolePermissionsBoundary", role, {BOUNDARY_KEY: "arn:x"}, policies=both) == "explicitDeny"
    for change in ("iam:CreatePolicy", "iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"):
        assert evaluate(change, boundary_arn(ACCOUNT), {}, policies=both) == "explicitDeny", change
    # a run's role is passed to EC2 only
    assert evaluate("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}, policies=creator) == "allowed"
    assert evaluate("iam:PassRole", role, {}, policies=creator) == "implicitDeny"


def test_a_role_under_the_boundary_can_do_no_more_than_its_runs_head():
    """Whatever policy a role under rubberband's boundary is given (`*:*` here), it may do only what a head does, for
    the run it is tagged with, and no IAM action at all: it cannot make, change or pass a role, nor touch a
    boundary. The head's own policy under the boundary keeps every action a head needs."""
    from iam_eval import evaluate

    from rubberband.cloud.aws.identity import TAG_RUN_ID, aws_boundary_policy, boundary_arn

    boundary = aws_boundary_policy()
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    tagged = {f"aws:PrincipalTag/{TAG_RUN_ID}": "run-a"}
    role = f"arn:aws:iam::{ACCOUNT}:role/rubberband/rb-other"
    for action, resource in [
        ("iam:CreateRole", role),
        ("iam:PutRolePolicy", role),
        ("iam:AttachRolePolicy", role),
        ("iam:PassRole", role),
        ("iam:DeleteRolePermissionsBoundary", role),
        ("iam:CreatePolicyVersion", boundary_arn(ACCOUNT)),
    ]:
        assert evaluate(action, resource, tagged, policies=[everything], boundary=boundary) == "explicitDeny"
    for action in ("s3:GetObject", "sts:AssumeRole", "secretsmanager:GetSecretValue"):
        assert evaluate(action, "*", tagged, policies=[everything], boundary=boundary) == "implicitDeny", action
    # moving instances between groups: only the run's own head (it leaves its run's group at the end, issue 29)
    instance = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-0123456789abcdef0"
    for on in ({}, {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-b"}):
        decision = evaluate(
            "ec2:ModifyInstanceAttribute", instance, {**tagged, **on}, policies=[everything], boundary=boundary
        )
        assert decision == "implicitDeny", on
    for policies in ([everything], [aws_head_policy("run-a")]):
        for action, context in aws_head_actions("run-a"):
            assert evaluate(action, "*", {**tagged, **context}, policies=policies, boundary=boundary) == "allowed"
        for action, context, doing in aws_head_denials("run-a"):
            decision = evaluate(action, "*", {**tagged, **context}, policies=policies, boundary=boundary)
            assert decision != "allowed", doing
    # a role of another run (or of none) may not end run-a's instances
    own = {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-a"}
    other = {f"aws:PrincipalTag/{TAG_RUN_ID}": "run-b", **own}
    assert evaluate("ec2:TerminateInstances", "*", other, policies=[everything], boundary=boundary) == "implicitDeny"
    assert evaluate("ec2:TerminateInstances", "*", own, policies=[everything], boundary=boundary) == "implicitDeny"
    # the boundary allows nothing a head's policy does not: the same actions, no wildcard
    head_actions = {
        a for st in aws_head_policy("RUN")["Statement"] for a in st["Action"] if isinstance(st["Action"], list)
    }
    head_actions |= {st["Action"] for st in aws_head_policy("RUN")["Statement"] if isinstance(st["Action"], str)}
    for st in boundary["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert st["Effect"] == "Deny" or set(actions) <= head_actions, st["Sid"]
    assert not _wildcard_in("iam:PassRole", [a for a in head_actions])


def test_run_roles_carry_the_boundary_and_an_account_without_it_is_told_how_to_make_it(moto_env):
    """Every role rubberband creates carries the boundary (IAM then caps it, whatever its policy); an account whose
    administrator has not created the boundary gets one line saying how, before anything is made. `down` still
    deletes a role with its boundary."""
    from rubberband.cloud.aws.identity import BOUNDARY_NAME, boundary_arn

    identities = AwsIdentities()
    identities.create("run-bound", REGION)
    iam = boto3.client("iam")
    role = iam.get_role(RoleName="rb-run-bound")["Role"]
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == boundary_arn(ACCOUNT)
    assert boundary_arn(ACCOUNT).endswith(f"policy{IAM_PATH}{BOUNDARY_NAME}")
    assert sorted(identities.delete("run-bound")) == ["instance-profile/rb-run-bound", "role/rb-run-bound"]
    iam.delete_policy(PolicyArn=boundary_arn(ACCOUNT))
    with pytest.raises(InputError, match="no rubberband permissions boundary .*`aws iam create-policy"):
        identities.create("run-unbound", REGION)
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()["InstanceProfiles"] == []


def test_dry_run_checks_the_cli_may_create_roles_under_the_boundary_and_not_around_it(moto_env, iam_simulator):
    """With the documented CLI policy the dry run's creator rows all pass: each action is simulated with the boundary
    the role is created with (a simulation without it would be denied), the boundary exists and is rubberband's, and
    every way around it is denied. A credential without the boundary condition is reported as broader than needed;
    a stale boundary fails the dry run."""
    from rubberband.cloud.aws.identity import AWS_CREATOR_ACTIONS, aws_creator_policy, boundary_arn

    iam_simulator.user_policies = [aws_creator_policy(ACCOUNT)]
    checks = head_mode("aws").check_identity(HeadOptions(), "dry-run")
    assert checks and all(c.allowed for c in checks if c.expect == "allow"), checks
    assert {c.action for c in checks if c.expect == "allow"} >= set(AWS_CREATOR_ACTIONS)
    must_not = [c for c in checks if c.expect == "deny"]
    assert len(must_not) == 8 and all(c.allowed is False for c in must_not), must_not
    # credentials as the CLI's policy was documented before: the same IAM actions, no boundary condition
    unconditioned = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": list(AWS_CREATOR_ACTIONS),
                "Resource": f"arn:aws:iam::{ACCOUNT}:role/rubberband/*",
            }
        ],
    }
    iam_simulator.user_policies = [unconditioned]
    broader = [c for c in head_mode("aws").check_identity(HeadOptions(), "dry-run") if c.expect == "deny" and c.allowed]
    assert broader and "without rubberband's boundary" in broader[0].detail and "broader" in broader[0].detail
    # a boundary that is not rubberband's (another version made default) fails the dry run, naming the fix
    iam_simulator.user_policies = [aws_creator_policy(ACCOUNT)]
    loose = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    boto3.client("iam").create_policy_version(
        PolicyArn=boundary_arn(ACCOUNT), PolicyDocument=json.dumps(loose), SetAsDefault=True
    )
    (stale,) = [
        c
        for c in head_mode("aws").check_identity(HeadOptions(), "dry-run")
        if c.allowed is False and c.expect == "allow"
    ]
    assert stale.action == "iam:GetPolicyVersion" and "not rubberband's boundary" in stale.detail


def test_a_role_is_created_for_the_run_found_by_its_tag_and_deleted(moto_env):
    identities = AwsIdentities()
    made = identities.create("run-b", REGION)
    assert made.name == "rb-run-b" and made.created
    assert identities.create("run-b", REGION) == made  # a retried start reuses it
    iam = boto3.client("iam")
    role = iam.get_role(RoleName="rb-run-b")["Role"]
    assert role["Path"] == IAM_PATH and role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "ec2.amazonaws.com"
    }
    assert iam.get_role_policy(RoleName="rb-run-b", PolicyName="rubberband-head")["PolicyDocument"] == aws_head_policy(
        "run-b", account=ACCOUNT, parking_group=identities.parking_group(REGION)
    )
    assert identities.parking_group(REGION)  # the region's default VPC's default group, named by its id
    profile = iam.get_instance_profile(InstanceProfileName="rb-run-b")["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["rb-run-b"]
    assert {t["Key"]: t["Value"] for t in profile["Tags"]}[TAG_RUN_ID] == "run-b"
    # a role of the user's own, even with a rubberband-like name, is never found or touched
    iam.create_role(RoleName="rb-run-c", AssumeRolePolicyDocument="{}", Path=IAM_PATH)
    assert list(identities.find()) == ["rb-run-b"]
    assert identities.leftover_runs([], [REGION]) == ["run-b"]
    assert identities.leftover_runs(["run-b"], [REGION]) == [] and identities.leftover_runs([], ["eu-west-1"]) == []
    assert sorted(identities.delete("run-b")) == ["instance-profile/rb-run-b", "role/rb-run-b"]
    assert identities.delete("run-b") == [] and identities.find() == {}
    assert [r["RoleName"] for r in iam.list_roles()["Roles"]] == ["rb-run-c"]


def test_the_head_starts_with_its_profile_and_workers_without(moto_env):
    """The provider that starts the head gives it the instance profile; the head's own providers (the executor's,
    the watchdog's) give workers none. moto records the association."""
    identities = AwsIdentities()
    identity = identities.create("run-d", REGION)
    p3 = cloud_catalog().find("p3.2xlarge", region=REGION)
    head = provision_head(
        AwsProvider(REGION, poll_s=0.01, instance_profile=identity.name),
        "run-d",
        REGION,
        p3.zones,
        HeadBoot(timeout_s=10),
    )
    assert head.identity.endswith(f":instance-profile{IAM_PATH}rb-run-d")
    from rubberband.cloud.provider import InstanceRequest

    (worker,) = AwsProvider(REGION, poll_s=0.01).provision(InstanceRequest("run-d", 0, p3, zone="use1-az1"))
    assert worker.identity == ""
    ec2 = boto3.client("ec2", region_name=REGION)
    described = {i["InstanceId"]: i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert "IamInstanceProfile" in described[head.id] and "IamInstanceProfile" not in described[worker.id]
    ec2.terminate_instances(InstanceIds=[head.id, worker.id])
    identities.delete("run-d")


def test_a_new_profile_is_retried_while_ec2_does_not_know_it_yet():
    calls, slept = [], []

    def launch():
        calls.append(1)
        if len(calls) < 3:
            raise CloudError(
                "aws InvalidParameterValue: Value (rb-x) for parameter iamInstanceProfile.name is "
                "invalid. Invalid IAM Instance Profile name",
                kind="fatal",
                code="InvalidParameterValue",
            )
        return "head"

    assert launch_with_new_identity(launch, new=True, sleep=slept.append) == "head" and len(slept) == 2
    calls.clear()
    with pytest.raises(CloudError):  # a profile the user named is not "still propagating": fail at once
        launch_with_new_identity(launch, new=False, sleep=slept.append)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "cloud,profile,account,fix",
    [
        ("aws", None, "sa@p.iam.gserviceaccount.com", "--service-account is for --cloud gcp"),
        ("gcp", "prof", "sa@p.iam.gserviceaccount.com", "--instance-profile is for --cloud aws"),
        ("gcp", None, None, "pass --service-account EMAIL"),
        ("gcp", None, "not-an-email", "is not an email"),
    ],
)
def test_identity_flags_that_do_not_fit_are_one_line_errors(cloud, profile, account, fix):
    with pytest.raises(InputError, match=fix):
        head_mode(cloud).check_flags(HeadOptions(instance_profile=profile, service_account=account), over_ssh=False)


def test_dry_run_checks_a_named_profile_and_names_the_missing_permission(moto_env, iam_simulator):
    iam = boto3.client("iam")
    identities = AwsIdentities()
    identities.create("dry-run", REGION)  # a profile holding exactly the head's policy for the dry run's tags
    checks = head_mode("aws").check_identity(HeadOptions(instance_profile="rb-dry-run"), "dry-run")
    needed = [c for c in checks if c.expect == "allow"]
    assert [c.action for c in needed][1:] == [a for a, _ in aws_head_actions("dry-run")]
    assert all(c.allowed for c in needed), checks
    # least privilege: what the head must never do is denied by the per-run policy (simulated, not assumed)
    must_not = [c for c in checks if c.expect == "deny"]
    assert [(c.action, c.detail.split(" must not ")[1]) for c in must_not] == [
        (a, doing) for a, _, doing in aws_head_denials("dry-run")
    ]
    assert all(c.allowed is False for c in must_not), must_not
    # the same role with the TerminateInstances statement removed: the check names it, and only it
    import json

    policy = aws_head_policy("dry-run")
    policy["Statement"] = [s for s in policy["Statement"] if s["Sid"] != "TerminateOnlyTheRunsInstances"]
    iam.put_role_policy(RoleName="rb-dry-run", PolicyName="rubberband-head", PolicyDocument=json.dumps(policy))
    denied = [
        c
        for c in head_mode("aws").check_identity(HeadOptions(instance_profile="rb-dry-run"), "dry-run")
        if c.allowed is False and c.expect == "allow"
    ]
    assert [c.action for c in denied] == ["ec2:TerminateInstances"] and "rb-dry-run" in denied[0].detail
    # a role that may do anything on EC2: under rubberband's boundary it still can do no more than the run's head
    # (the boundary is the head's policy for the run the role is tagged with) ...
    broad = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}
    iam.put_role_policy(RoleName="rb-dry-run", PolicyName="rubberband-head", PolicyDocument=json.dumps(broad))
    rows = head_mode("aws").check_identity(HeadOptions(instance_profile="rb-dry-run"), "dry-run")
    assert all(c.allowed for c in rows if c.expect == "allow")
    assert all(c.allowed is False for c in rows if c.expect == "deny"), rows
    # ... and without a boundary (a profile of your own) every "must not" row says it is broader than needed
    iam.delete_role_permissions_boundary(RoleName="rb-dry-run")
    rows = head_mode("aws").check_identity(HeadOptions(instance_profile="rb-dry-run"), "dry-run")
    assert all(c.allowed for c in rows if c.expect == "deny") and "broader" in rows[-1].detail
    iam.put_role_policy(RoleName="rb-dry-run", PolicyName="rubberband-head", PolicyDocument=json.dumps(policy))
    with pytest.raises(InputError, match="no such IAM instance profile"):
        head_mode("aws").check_identity(HeadOptions(instance_profile="nope"), "dry-run")
    identities.delete("dry-run")
    # no profile named: the CLI's credentials must be able to create one
    iam_simulator.denied = {"iam:CreateRole"}
    creator = head_mode("aws").check_identity(HeadOptions(), "dry-run")
    assert [c.action for c in creator if c.allowed is False and c.expect == "allow"] == ["iam:CreateRole"]


def test_gcp_dry_run_checks_the_service_account_through_the_iam_api(gce_fake):
    email = "head@rubberband-test.iam.gserviceaccount.com"
    with pytest.raises(InputError, match="no such service account"):
        GcpIdentities(endpoint=gce_fake.url).check_service_account(email)
    gce_fake.add_service_account(email, permissions=list(GCP_HEAD_PERMISSIONS))
    checks = GcpIdentities(endpoint=gce_fake.url).check_service_account(email)
    assert checks[0].action == "iam.serviceAccounts.actAs" and all(c.allowed for c in checks), checks
    gce_fake.add_service_account(
        email, permissions=[p for p in GCP_HEAD_PERMISSIONS if p != "compute.instances.delete"]
    )
    denied = [c.action for c in GcpIdentities(endpoint=gce_fake.url).check_service_account(email) if c.allowed is False]
    assert denied == ["compute.instances.delete"]


def test_a_head_that_cannot_start_leaves_no_role_behind(tmp_path, moto_env, ec2_faults):
    """No vCPU quota for the head: start_head fails, and the role and instance profile it made for the run are gone
    with the security group (nothing left half-made)."""
    from test_cloud_cli import Offer, cloud_job, cloud_plan

    from rubberband.cloud.head_session import HeadOptions, NewRun, start_head
    from rubberband.plan import load_plan

    ec2_faults.quota = True
    plan = load_plan(cloud_plan(tmp_path, cloud_job(tmp_path, ["aws"]), Offer("aws", REGION, "p3.2xlarge")))
    key = tmp_path / "key"
    key.write_text("not a key\n")
    with pytest.raises(CloudError, match="VcpuLimitExceeded"):
        start_head(
            run=NewRun("quota-run", tmp_path / "run", metric="loss"),
            plan=plan,
            catalog=cloud_catalog(),
            options=HeadOptions(ssh_cidr="203.0.113.9/32", ssh_key=key, key_name="rb"),
            boots=None,
        )
    assert ec2_faults.calls  # it did try, with the role it made
    iam = boto3.client("iam")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()["InstanceProfiles"] == []
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []


@pytest.mark.e2e
def test_a_played_head_without_an_identity_fails_its_boot_saying_so(moto_env):
    """The test harness's played head acts with the test's credentials only when its instance was started with an
    identity: one started without (as the head was before) fails its boot with one clear line, as a real one could
    not call the cloud API."""
    from rubberband.cloud.bootstrap import WatchdogSettings
    from played_boots import head_disk, head_url, play_head, wait_head_gone

    p3 = cloud_catalog().find("p3.2xlarge", region=REGION)
    provider = AwsProvider(REGION, poll_s=0.01)
    head = provision_head(provider, "bare-head", REGION, p3.zones, HeadBoot(timeout_s=10))
    assert head.identity == ""
    try:
        play_head("aws", REGION, "bare-head", head.id, WatchdogSettings())
        with pytest.raises(CloudError, match="has no identity: it cannot call the aws API"):
            head_url(head.id, timeout_s=60)
    finally:
        provider.terminate([head.id])
        assert wait_head_gone(head.id)
    assert not head_disk(head.id).exists()


def test_docs_hold_the_generated_policies():
    """docs/clouds.md holds, between its policies markers, exactly the text generated from the code's policy objects
    (the AWS head policy, the CLI's actions, the GCP permissions and condition): one source of truth."""
    import re

    from conftest import REPO

    from rubberband.cloud.identity import policy_docs

    docs = (REPO / "docs" / "clouds.md").read_text()
    block = re.search(r"<!-- policies:begin[^>]*-->\n(.*)\n<!-- policies:end -->", docs, re.S)
    assert block is not None and block.group(1) == policy_docs(), (
        "docs/clouds.md is out of date: paste `python -m rubberband.cloud.identity` between its policies markers"
    )
    for statement in aws_head_policy("RUN")["Statement"]:
        assert json.dumps(statement) in docs, statement["Sid"]
    assert all(f"`{p}`" in docs for p in GCP_HEAD_PERMISSIONS)


def test_the_head_may_make_and_delete_the_workers_nat_and_nothing_more_of_routers():
    """The head's role holds exactly what the run's Cloud NAT needs — routers create (insert), get (a router the
    run made already), list (the region's NATs before making one; every region's at teardown), delete — and the
    region operations it waits on; never routers.update / setIamPolicy, nor any address permission (AUTO_ONLY: Google
    allocates the NAT's addresses)."""
    routers = sorted(p for p in GCP_HEAD_PERMISSIONS if p.startswith("compute.routers."))
    assert routers == [
        "compute.routers.create",
        "compute.routers.delete",
        "compute.routers.get",
        "compute.routers.list",
    ]
    assert "compute.regionOperations.get" in GCP_HEAD_PERMISSIONS
    assert not [p for p in GCP_HEAD_PERMISSIONS if p.startswith("compute.addresses.")]


@pytest.mark.e2e
def test_down_all_orphans_deletes_head_roles_whose_run_left_nothing(cli, tmp_path, moto_env):
    """A detached run whose head ended itself leaves its role behind (the head cannot delete the role it acts
    with): `down --all-orphans` deletes the roles of runs with no instance left in the regions it sweeps (after
    ending orphaned instances), older than --older-than; a run with an instance left keeps its role."""
    import time

    from test_cloud_cli import _launch_aws, cloud_env

    identities = AwsIdentities()
    identities.create("run-gone", REGION)
    identities.create("run-live", REGION)
    _launch_aws("run-live", count=1)
    env = cloud_env(tmp_path, moto_env)
    result = cli("down", "--all-orphans", "--cloud", "aws", "--older-than", "1h", "--region", REGION, env=env)
    assert result.returncode == 0, result.stderr
    assert "role/" not in result.stdout and sorted(identities.find()) == ["rb-run-gone", "rb-run-live"]
    time.sleep(1.1)
    result = cli("down", "--all-orphans", "--cloud", "aws", "--older-than", "1s", "--region", "eu-west-1", env=env)
    assert result.returncode == 0 and "role/" not in result.stdout  # another region's sweep never touches them
    result = cli("down", "--all-orphans", "--cloud", "aws", "--older-than", "1s", "--region", REGION, env=env)
    assert result.returncode == 0, result.stderr
    assert "deleted aws role/rb-run-gone (run run-gone)" in result.stdout
    # the live run's instance is an orphan too at --older-than 1s (no head protects it): ended, then its role
    assert "terminated aws" in result.stdout and "deleted aws role/rb-run-live (run run-live)" in result.stdout
    assert identities.find() == {}
