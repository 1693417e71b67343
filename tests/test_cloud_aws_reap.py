"""Issue 29: the AWS run watchdog ends what only the head can — the run's security group and its per-run role.

Against the moto server, through the real watchdog (:func:`rubberband.cloud.head.watch` →
:func:`~rubberband.cloud.head.self_terminate` → :meth:`AwsProvider.reap_from_head`, every call a real boto3 call):
the head leaves the run's group for its VPC's default one, deletes the group, ends its own instance profile and, as
its very last API call, its role's policy, then powers off (played here by terminating it, as EC2 does for an
instance-initiated shutdown). Another run's group and role are spared. The head's policy and rubberband's boundary
are evaluated as IAM does (tests/iam_eval.py; moto enforces no IAM policy): they allow exactly these deletions on the
run's own ARNs, and nothing that could create or widen a role.
"""

from __future__ import annotations

import time

import boto3
import pytest
from cloud_helpers import REGION, cloud_catalog, moto_ami, moto_env, moto_server  # noqa: F401  (fixtures)

from rubberband.cloud.aws.identity import (
    AWS_HEAD_END_ACTIONS,
    HEAD_POLICY_NAME,
    IAM_PATH,
    AwsIdentities,
    aws_boundary_policy,
    aws_head_policy,
    profile_arn,
    role_arn,
)
from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.aws.session import new_session
from rubberband.cloud.bootstrap import WatchdogSettings
from rubberband.cloud.head import HeadBoot, WatchedRun, provision_head, watch
from rubberband.cloud.provider import TAG_ROLE, TAG_RUN_ID, Instance, InstanceRequest

SETTINGS = WatchdogSettings(submit_timeout_s=60, stall_timeout_s=900, done_grace_s=300, max_lifetime_s=86400)
G4 = cloud_catalog().find("g4dn.xlarge", region=REGION)
ACCOUNT = "123456789012"  # moto's


def _start_run(run_id: str, profile: str) -> tuple[Instance, list[Instance]]:
    """A run's head (with ``profile``) and two workers (without), as head mode starts them."""
    head = provision_head(
        AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01, instance_profile=profile),
        run_id,
        REGION,
        G4.zones,
        HeadBoot(SETTINGS, timeout_s=10),
    )
    workers = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01).provision(
        InstanceRequest(run_id, 0, G4, count=2, extra_tags={TAG_ROLE: "worker"})
    )
    return head, workers


def _recording_provider(calls: list[str]) -> AwsProvider:
    """The watchdog's provider (as the registry builds it), whose session records every API call it makes."""
    session = new_session()
    session.events.register("before-call.*.*", lambda model, **_: calls.append(model.name))
    return AwsProvider(REGION, session=session, poll_s=0.01)


def _powered_off(head_id: str, shutdowns: list[str]):
    """The head's power-off: EC2 terminates an instance whose shutdown behaviour is ``terminate``."""

    def shutdown() -> None:
        shutdowns.append(head_id)
        boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[head_id])

    return shutdown


def _watch_until_ended(provider: AwsProvider, run_id: str, head_id: str, tmp_path, shutdown) -> None:
    start = time.time()
    ticks = iter(range(1000))
    decision = watch(
        WatchedRun(provider, run_id, head_id, tmp_path / "never-submitted"),
        SETTINGS,
        clock=lambda: start + 30 * next(ticks),
        sleep=lambda s: None,
        shutdown=shutdown,
    )
    assert decision.terminate and "no run was submitted" in decision.reason


def _states() -> dict[str, str]:
    reservations = boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}


def _run_groups(run_id: str) -> list[str]:
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups(
        Filters=[{"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]}]
    )["SecurityGroups"]
    return [g["GroupId"] for g in groups]


def test_the_heads_watchdog_ends_its_runs_group_and_role_and_spares_another_run(moto_env, tmp_path):
    identities = AwsIdentities()
    identities.create("run-a", REGION)
    identities.create("run-b", REGION)
    head, workers = _start_run("run-a", "rb-run-a")
    other_head, other_workers = _start_run("run-b", "rb-run-b")
    (group,) = _run_groups("run-a")
    (other_group,) = _run_groups("run-b")

    calls: list[str] = []
    shutdowns: list[str] = []
    _watch_until_ended(_recording_provider(calls), "run-a", head.id, tmp_path, _powered_off(head.id, shutdowns))

    # nothing of run-a is left but its role, now empty: no instance, no group, no instance profile, no policy
    states = _states()
    assert {states[i.id] for i in [head, *workers]} == {"terminated"} and shutdowns == [head.id]
    assert _run_groups("run-a") == []
    iam = boto3.client("iam")
    assert "rb-run-a" not in {p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]}
    assert iam.list_role_policies(RoleName="rb-run-a")["PolicyNames"] == []
    assert iam.list_instance_profiles_for_role(RoleName="rb-run-a")["InstanceProfiles"] == []
    # the order: workers first, out of the group, the group, then the identity, its policy the very last call,
    # and the head never terminated itself through the API (it powered off)
    assert (
        calls.index("TerminateInstances") < calls.index("ModifyInstanceAttribute") < calls.index("DeleteSecurityGroup")
    )
    assert calls[-3:] == ["RemoveRoleFromInstanceProfile", "DeleteInstanceProfile", "DeleteRolePolicy"]
    assert calls.count("TerminateInstances") == 1
    # the empty role is what `rubberband down` / the orphan sweep finds by its tag and deletes
    assert identities.leftover_runs(["run-b"], [REGION]) == ["run-a"]
    assert identities.delete("run-a") == ["role/rb-run-a"]

    # run-b is untouched: its instances, its group, its role with its policy and profile
    states = _states()
    assert {states[i.id] for i in [other_head, *other_workers]} == {"running"}
    assert _run_groups("run-b") == [other_group] and group != other_group
    assert iam.list_role_policies(RoleName="rb-run-b")["PolicyNames"] == [HEAD_POLICY_NAME]
    profile = iam.get_instance_profile(InstanceProfileName="rb-run-b")["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["rb-run-b"]
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[other_head.id])
    AwsProvider(REGION, poll_s=0.01).terminate([w.id for w in other_workers])
    assert AwsProvider(REGION, poll_s=0.01).cleanup_run("run-b", timeout_s=10) == [other_group]
    identities.delete("run-b")


def test_a_head_with_the_users_own_profile_ends_the_group_and_leaves_the_profile_alone(moto_env, tmp_path):
    """``--instance-profile NAME``: the profile is the user's, never deleted; the head keeps its rights and
    terminates itself through the API as before."""
    iam = boto3.client("iam")
    iam.create_role(RoleName="my-head", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="my-head")
    iam.add_role_to_instance_profile(InstanceProfileName="my-head", RoleName="my-head")
    head, workers = _start_run("run-u", "my-head")
    calls: list[str] = []
    shutdowns: list[str] = []
    _watch_until_ended(_recording_provider(calls), "run-u", head.id, tmp_path, _powered_off(head.id, shutdowns))
    states = _states()
    assert {states[i.id] for i in [head, *workers]} == {"terminated"} and shutdowns == []
    assert _run_groups("run-u") == [] and calls[-1] == "TerminateInstances"
    assert not any(c.startswith(("Remove", "DeleteInstanceProfile", "DeleteRole")) for c in calls)
    assert [r["RoleName"] for r in iam.get_instance_profile(InstanceProfileName="my-head")["InstanceProfile"]["Roles"]]


def test_a_head_that_may_not_end_its_identity_keeps_its_rights_and_terminates_itself(moto_env, tmp_path, monkeypatch):
    """An account whose boundary is an older version (it denies every IAM action): the first IAM call fails, the
    head keeps its policy and profile and terminates itself through the API; the role is left to `down`."""
    from rubberband.errors import CloudError

    AwsIdentities().create("run-o", REGION)
    head, workers = _start_run("run-o", "rb-run-o")

    def denied(self, run_id):
        raise CloudError("aws iam:RemoveRoleFromInstanceProfile: AccessDenied", code="UnauthorizedOperation")

    monkeypatch.setattr(AwsIdentities, "end_own", denied)
    shutdowns: list[str] = []
    _watch_until_ended(AwsProvider(REGION, poll_s=0.01), "run-o", head.id, tmp_path, _powered_off(head.id, shutdowns))
    assert shutdowns == [] and {_states()[i.id] for i in [head, *workers]} == {"terminated"}
    assert _run_groups("run-o") == []
    assert boto3.client("iam").list_role_policies(RoleName="rb-run-o")["PolicyNames"] == [HEAD_POLICY_NAME]
    assert AwsIdentities().delete("run-o") == ["instance-profile/rb-run-o", "role/rb-run-o"]


# -- the policies, evaluated as IAM does ----------------------------------------------------------------------

GROUP = "sg-0123456789abcdef0"
OTHER_GROUP = "sg-0fedcba9876543210"
#: Everything IAM could do to a role or profile that is not ending it: creating, widening, passing, re-tagging.
WIDENING = (
    "iam:CreateRole",
    "iam:PutRolePolicy",
    "iam:AttachRolePolicy",
    "iam:UpdateAssumeRolePolicy",
    "iam:PutRolePermissionsBoundary",
    "iam:DeleteRolePermissionsBoundary",
    "iam:TagRole",
    "iam:UntagRole",
    "iam:UpdateRole",
    "iam:PassRole",
    "iam:CreateInstanceProfile",
    "iam:AddRoleToInstanceProfile",
    "iam:CreatePolicyVersion",
    "iam:DeleteRole",  # no role can delete itself (its policy must go first): never needed, never allowed
)


def _iam_statements(policy: dict) -> list[dict]:
    def actions(st: dict) -> list[str]:
        return st["Action"] if isinstance(st.get("Action"), list) else [st.get("Action", "")]

    return [
        st for st in policy["Statement"] if st["Effect"] == "Allow" and any(a.startswith("iam:") for a in actions(st))
    ]


def test_the_heads_policy_allows_exactly_ending_its_own_role_and_profile():
    policy = aws_head_policy("run-a", account=ACCOUNT, parking_group=GROUP)
    own_role, own_profile = role_arn("run-a", ACCOUNT), profile_arn("run-a", ACCOUNT)
    assert own_role == f"arn:aws:iam::{ACCOUNT}:role{IAM_PATH}rb-run-a"
    # structurally: the IAM statements name exactly the end actions, on exactly the run's own two ARNs
    granted = {
        (a, st["Resource"])
        for st in _iam_statements(policy)
        for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    }
    assert granted == {
        ("iam:RemoveRoleFromInstanceProfile", own_profile),
        ("iam:DeleteInstanceProfile", own_profile),
        ("iam:DeleteRolePolicy", own_role),
    }
    assert {a for a, _ in granted} == set(AWS_HEAD_END_ACTIONS)
    assert not any("*" in resource for _, resource in granted)
    # the head may move its run's own instances, into the VPC's default group alone
    by_sid = {st["Sid"]: st for st in policy["Statement"]}
    assert by_sid["OnlyTheRunsHeadLeavesTheRunsGroup"]["Condition"] == {
        "StringEquals": {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-a", f"ec2:ResourceTag/{TAG_ROLE}": "head"}
    }
    assert by_sid["ParkOnlyInTheVpcsDefaultGroup"]["Resource"] == f"arn:aws:ec2:*:{ACCOUNT}:security-group/{GROUP}"
    assert "ParkOnlyInTheVpcsDefaultGroup" not in {
        st["Sid"] for st in aws_head_policy("run-a", account=ACCOUNT, parking_group=None)["Statement"]
    }


@pytest.mark.parametrize("holder", ["head", "everything"])
def test_under_the_boundary_a_role_may_end_only_its_own_identity_and_widen_nothing(holder):
    """Whatever policy a run's role holds under rubberband's boundary (its own, or ``*:*``): of IAM only the three
    deletions, on its own run's role and profile; nothing on another run's, nothing outside rubberband's path, and
    no action that creates or widens a role (explicitly denied on rubberband's path, and every IAM action outside
    it, so no allow anywhere reverses it)."""
    from iam_eval import evaluate

    boundary = aws_boundary_policy()
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    policies = [aws_head_policy("run-a", account=ACCOUNT, parking_group=GROUP)] if holder == "head" else [everything]
    tagged = {f"aws:PrincipalTag/{TAG_RUN_ID}": "run-a"}
    own = {"role": role_arn("run-a", ACCOUNT), "profile": profile_arn("run-a", ACCOUNT)}
    other = {"role": role_arn("run-b", ACCOUNT), "profile": profile_arn("run-b", ACCOUNT)}
    outside = {
        "role": f"arn:aws:iam::{ACCOUNT}:role/rb-run-a",
        "profile": f"arn:aws:iam::{ACCOUNT}:instance-profile/rb-run-a",
    }
    on = {
        "iam:RemoveRoleFromInstanceProfile": "profile",
        "iam:DeleteInstanceProfile": "profile",
        "iam:DeleteRolePolicy": "role",
    }

    def decide(action: str, resource: str, context: dict | None = None) -> str:
        return evaluate(action, resource, {**tagged, **(context or {})}, policies=policies, boundary=boundary)

    for action, kind in on.items():
        assert decide(action, own[kind]) == "allowed", action
        assert decide(action, other[kind]) != "allowed", f"{action} on another run's {kind}"
        assert decide(action, outside[kind]) == "explicitDeny", f"{action} outside {IAM_PATH}"
        # a role tagged with another run (or none) may not end run-a's identity
        assert evaluate(action, own[kind], {}, policies=policies, boundary=boundary) != "allowed"
    for action in WIDENING:
        for arn in [*own.values(), *other.values()]:
            assert decide(action, arn) == "explicitDeny", f"{action} on {arn}"
        assert decide(action, outside["role"]) == "explicitDeny", action
    # and none of the head's EC2 work is denied by the IAM exception (the dry run simulates on the resource `*`)
    from rubberband.cloud.aws.identity import aws_head_actions

    for action, context in aws_head_actions("run-a"):
        assert decide(action, "*", context) == "allowed", action
    from rubberband.cloud.aws.identity import boundary_arn

    for change in ("iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"):
        assert decide(change, boundary_arn(ACCOUNT)) == "explicitDeny", change
    # leaving the group: only the run's own instance; with its own policy, only into the VPC's default group
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123456789abcdef0"
    mine = {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-a", f"ec2:ResourceTag/{TAG_ROLE}": "head"}
    theirs = {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-b", f"ec2:ResourceTag/{TAG_ROLE}": "head"}
    worker = {f"ec2:ResourceTag/{TAG_RUN_ID}": "run-a", f"ec2:ResourceTag/{TAG_ROLE}": "worker"}
    group = f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/{GROUP}"
    assert decide("ec2:ModifyInstanceAttribute", instance, mine) == "allowed"
    assert decide("ec2:ModifyInstanceAttribute", group) == "allowed"
    assert decide("ec2:ModifyInstanceAttribute", instance, theirs) != "allowed"
    assert decide("ec2:ModifyInstanceAttribute", instance, worker) != "allowed"
    if holder == "head":
        other_group = f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/{OTHER_GROUP}"
        assert decide("ec2:ModifyInstanceAttribute", other_group) != "allowed"


def test_the_boundarys_iam_exception_is_only_the_end_actions_under_rubberbands_path():
    """Structurally: the boundary allows no IAM action but the three, only on the role and profile named after the
    run the role is tagged with, and denies every IAM action outside rubberband's path."""
    boundary = aws_boundary_policy()
    variable = f"rb-${{aws:PrincipalTag/{TAG_RUN_ID}}}"
    for st in _iam_statements(boundary):
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert set(actions) <= set(AWS_HEAD_END_ACTIONS), st["Sid"]
        assert st["Resource"].endswith(f"{IAM_PATH}{variable}"), st["Sid"]
    denies = {st["Sid"]: st for st in boundary["Statement"] if st["Effect"] == "Deny"}
    ours = [f"arn:aws:iam::*:role{IAM_PATH}*", f"arn:aws:iam::*:instance-profile{IAM_PATH}*"]
    from rubberband.cloud.aws.identity import AWS_ROLE_WIDENING

    assert denies["NeverCreateOrWidenARole"]["Resource"] == ours
    assert not set(AWS_ROLE_WIDENING) & set(AWS_HEAD_END_ACTIONS)
    assert denies["NoIamOutsideRubberbandsPath"] == {
        "Sid": "NoIamOutsideRubberbandsPath",
        "Effect": "Deny",
        "Action": "iam:*",
        "NotResource": ours,
    }
