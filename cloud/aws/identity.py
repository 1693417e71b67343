"""The AWS head's identity: the IAM role and instance profile a run's head acts with, its policies, and the checks.

``--instance-profile NAME`` names an existing profile; without it rubberband creates, for the run, an IAM role and
instance profile ``rb-<run>`` under the path ``/rubberband/``, tagged with the run id like everything else, whose
only (inline) policy is :func:`aws_head_policy`: launch instances only with the run's tags (``aws:RequestTag``),
terminate and re-tag only the run's instances and touch only the run's security group (``ec2:ResourceTag``).
Workers get no identity, so the role needs no ``iam:PassRole``. The role is created under rubberband's permissions
boundary (:func:`aws_boundary_policy`, a managed policy an administrator creates once per account), and the CLI's
own IAM rights (:func:`aws_creator_policy`) allow creating a role only under it: holding them never lets anyone make
a role that does more than a run's head. :meth:`AwsIdentities.delete` removes it once the run's instances are gone
(``end_run``, ``rubberband down``, the orphan sweep), found by its path and tag, never by name alone. When the run's
own watchdog ends the run, the head ends what it can of its identity itself (:meth:`AwsIdentities.end_own`: the
instance profile, then the role's policy as its very last call; issue 29), leaving an empty role for the sweep: no
role can delete itself.

The dry run's checks (:meth:`AwsIdentities.check_profile`, :meth:`AwsIdentities.check_creator`): the named profile
exists and may do what the run needs (``iam:GetInstanceProfile`` + ``iam:SimulatePrincipalPolicy`` with the run's
tag context), or, when rubberband is to create the role, the CLI's credentials may create it under the boundary
(which exists and is rubberband's), and not around it. ``python -m rubberband.cloud.aws.identity boundary`` prints
the boundary policy as one line of JSON (for ``aws iam create-policy --policy-document``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rubberband.cloud.head_identity import HeadIdentity
from rubberband.cloud.provider import PermissionCheck, TAG_HEARTBEAT, TAG_MANAGED, TAG_ROLE, TAG_RUN_ID, TAG_STAGE
from rubberband.errors import CloudError, InputError, UnexpectedAnswer
from rubberband.cloud.failover import CallContext, classify


#: Path of every IAM role / instance profile rubberband creates (the orphan sweep lists only these).
IAM_PATH = "/rubberband/"
TAG_REGION = "rubberband-region"
#: The public SSM parameters the head reads to find the Deep Learning AMI (cloud/aws/provider.py).
SSM_PARAMETERS = "arn:aws:ssm:*::parameter/aws/service/deeplearning/*"
EC2_TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}
#: rubberband's permissions boundary: a managed policy your administrator creates once per account (path
#: :data:`IAM_PATH`, document :func:`aws_boundary_policy`). Every role rubberband creates carries it, and the CLI may
#: create or change a role only when it does (:func:`aws_creator_policy`): whoever holds the CLI's IAM rights can
#: never make a role that does more than a run's head.
BOUNDARY_NAME = "rubberband-boundary"
#: The request context key IAM fills with the permissions boundary a role is created with, or already carries.
BOUNDARY_KEY = "iam:PermissionsBoundary"
#: What the CLI itself needs to create and delete a run's head identity (besides its EC2 permissions); the first
#: two only for roles under rubberband's boundary, ``iam:PassRole`` only to EC2 (:func:`aws_creator_policy`).
AWS_CREATOR_ACTIONS = (
    "iam:CreateRole",
    "iam:PutRolePolicy",
    "iam:TagRole",
    "iam:CreateInstanceProfile",
    "iam:TagInstanceProfile",
    "iam:AddRoleToInstanceProfile",
    "iam:GetInstanceProfile",
    "iam:PassRole",
    "iam:ListRoles",
    "iam:ListRoleTags",
    "iam:ListInstanceProfiles",
    "iam:ListInstanceProfilesForRole",
    "iam:ListRolePolicies",
    "iam:RemoveRoleFromInstanceProfile",
    "iam:DeleteInstanceProfile",
    "iam:DeleteRolePolicy",
    "iam:DeleteRole",
    "iam:GetPolicy",
    "iam:GetPolicyVersion",
)
#: What the CLI must never be able to do to a run role's boundary, nor to the boundary policy itself: loosen it.
AWS_BOUNDARY_GUARDS = (
    "iam:DeleteRolePermissionsBoundary",
    "iam:PutRolePermissionsBoundary",
    "iam:AttachRolePolicy",
    "iam:CreatePolicy",
    "iam:CreatePolicyVersion",
    "iam:DeletePolicy",
    "iam:DeletePolicyVersion",
    "iam:SetDefaultPolicyVersion",
)
#: What the CLI's teardown and orphan sweep need besides the head's actions: a run's detached volumes and its
#: secrets (Secrets Manager), found by their exact run tag.
AWS_CLI_SWEEP_ACTIONS = (
    "ec2:DescribeVolumes",
    "ec2:DeleteVolume",
    "secretsmanager:ListSecrets",
    "secretsmanager:DeleteSecret",
)


#: What the CLI reads on AWS in head mode: the head's console, where its boot prints its SSH host keys, which the
#: CLI pins before its first connection (cloud/host_keys.py); without it a head-mode run stops with one line.
AWS_CLI_CONSOLE_ACTIONS = ("ec2:GetConsoleOutput",)


def identity_name(run_id: str) -> str:
    """The role and instance profile rubberband creates for a run (IAM role names: at most 64 characters)."""
    return f"rb-{run_id}"[:64]


#: The name of the inline policy (:func:`aws_head_policy`) of the role rubberband creates for a run.
HEAD_POLICY_NAME = "rubberband-head"
#: The only IAM actions a run's head is allowed, on its own run's role and instance profile alone, in this order: the
#: run's end from its head (:meth:`AwsIdentities.end_own`). Not ``iam:DeleteRole``: IAM refuses to delete a role
#: that still has an inline policy, and once the policy is gone the role may do nothing, so no role can ever
#: delete itself; the CLI (``rubberband down``, the orphan sweep) deletes the empty role the head leaves.
AWS_HEAD_END_ACTIONS = ("iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile", "iam:DeleteRolePolicy")
#: Every IAM action that creates, widens, re-tags or passes a role or instance profile (or deletes a role): denied
#: explicitly on rubberband's path by its boundary, whose IAM exception is :data:`AWS_HEAD_END_ACTIONS` alone.
AWS_ROLE_WIDENING = (
    "iam:Create*",
    "iam:Put*",
    "iam:Attach*",
    "iam:Detach*",
    "iam:Update*",
    "iam:Tag*",
    "iam:Untag*",
    "iam:PassRole",
    "iam:AddRoleToInstanceProfile",
    "iam:DeleteRole",
    "iam:DeleteRolePermissionsBoundary",
)
#: What the head's policy names as the group it parks its own instance in before it deletes the run's group, in
#: the policy the docs print: the run's VPC's default security group (rendered per run by :meth:`AwsIdentities.create`).
PARKING_PLACEHOLDER = "DEFAULT_GROUP"


def role_arn(run_id: str, account: str = "ACCOUNT", partition: str = "aws") -> str:
    """The ARN of the role rubberband creates for ``run_id`` (path :data:`IAM_PATH`)."""
    return f"arn:{partition}:iam::{account}:role{IAM_PATH}{identity_name(run_id)}"


def profile_arn(run_id: str, account: str = "ACCOUNT", partition: str = "aws") -> str:
    """The ARN of the instance profile rubberband creates for ``run_id`` (path :data:`IAM_PATH`)."""
    return f"arn:{partition}:iam::{account}:instance-profile{IAM_PATH}{identity_name(run_id)}"


def is_own_profile(arn: str, run_id: str) -> bool:
    """Whether an instance's profile ARN is the one rubberband created for ``run_id`` (not a ``--instance-profile``
    of the user's, which the head never touches)."""
    parts = arn.split(":")
    return len(parts) == 6 and parts[2] == "iam" and arn == profile_arn(run_id, parts[4], parts[1])


def aws_head_policy(
    run_id: str, *, account: str = "ACCOUNT", partition: str = "aws", parking_group: str | None = PARKING_PLACEHOLDER
) -> dict[str, Any]:
    """The head's least-privilege IAM policy for one run (pure; docs/clouds.md prints it for ``RUN``, ``ACCOUNT``
    and :data:`PARKING_PLACEHOLDER`; :meth:`AwsIdentities.create` renders it with the real ones).

    Launch: only instances and volumes tagged with the run id at creation, only into the run's
    own security group. Terminate / re-tag: only instances carrying the run id, and a re-tag may
    change the stage and heartbeat tags alone (never the run id or the managed marker). Security group: create it
    only with the run's tag, change and delete only the one carrying it. Reads (Describe*) cannot
    be narrowed by resource in EC2; the AMI lookup reads only the public Deep Learning parameters.

    The run's end from its head (issue 29): move only the run's own head (its run and role tags), and only into
    ``parking_group`` (the run's VPC's default group; None: the head may not leave the run's group), so that the
    run's group can go; then
    :data:`AWS_HEAD_END_ACTIONS` on this run's own role and instance profile alone, named by ARN (``account``,
    ``partition``): no other IAM action, no other role.
    """
    run = {f"aws:RequestTag/{TAG_RUN_ID}": run_id, f"aws:RequestTag/{TAG_MANAGED}": "true"}
    own = {f"ec2:ResourceTag/{TAG_RUN_ID}": run_id}
    parking = (
        [
            {
                "Sid": "OnlyTheRunsHeadLeavesTheRunsGroup",
                "Effect": "Allow",
                "Action": "ec2:ModifyInstanceAttribute",
                "Resource": "arn:aws:ec2:*:*:instance/*",
                "Condition": {"StringEquals": {**own, f"ec2:ResourceTag/{TAG_ROLE}": "head"}},
            },
            {
                "Sid": "ParkOnlyInTheVpcsDefaultGroup",
                "Effect": "Allow",
                "Action": "ec2:ModifyInstanceAttribute",
                "Resource": f"arn:aws:ec2:*:{account}:security-group/{parking_group}",
            },
        ]
        if parking_group
        else []
    )
    end = [
        {
            "Sid": "EndOnlyItsOwnInstanceProfile",
            "Effect": "Allow",
            "Action": ["iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
            "Resource": profile_arn(run_id, account, partition),
        },
        {
            "Sid": "EndOnlyItsOwnRolesPolicyLast",
            "Effect": "Allow",
            "Action": "iam:DeleteRolePolicy",
            "Resource": role_arn(run_id, account, partition),
        },
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Read",
                "Effect": "Allow",
                "Resource": "*",
                "Action": [
                    "ec2:DescribeInstances",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeAvailabilityZones",
                ],
            },
            {"Sid": "FindTheImage", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": SSM_PARAMETERS},
            {
                "Sid": "LaunchOnlyTheRunsInstances",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"],
                "Condition": {"StringEquals": run},
            },
            {
                "Sid": "LaunchOnlyIntoTheRunsGroup",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": "arn:aws:ec2:*:*:security-group/*",
                "Condition": {"StringEquals": own},
            },
            {
                "Sid": "LaunchFromImagesAndSubnets",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": [
                    "arn:aws:ec2:*::image/*",
                    "arn:aws:ec2:*:*:subnet/*",
                    "arn:aws:ec2:*:*:network-interface/*",
                ],
            },
            {
                "Sid": "TagInstancesOnlyAtLaunch",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"],
                "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}},
            },
            {
                "Sid": "TagTheGroupOnlyAtCreation",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": "arn:aws:ec2:*:*:security-group/*",
                "Condition": {"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup"}},
            },
            {
                "Sid": "RetagOnlyTheRunsInstancesStageAndHeartbeat",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": "arn:aws:ec2:*:*:instance/*",
                "Condition": {
                    "StringEquals": own,
                    "ForAllValues:StringEquals": {"aws:TagKeys": [TAG_STAGE, TAG_HEARTBEAT]},
                },
            },
            {
                "Sid": "TerminateOnlyTheRunsInstances",
                "Effect": "Allow",
                "Action": "ec2:TerminateInstances",
                "Resource": "arn:aws:ec2:*:*:instance/*",
                "Condition": {"StringEquals": own},
            },
            {
                "Sid": "CreateOnlyTheRunsGroup",
                "Effect": "Allow",
                "Action": "ec2:CreateSecurityGroup",
                "Resource": "arn:aws:ec2:*:*:security-group/*",
                "Condition": {"StringEquals": run},
            },
            {
                "Sid": "CreateTheGroupInAVpc",
                "Effect": "Allow",
                "Action": "ec2:CreateSecurityGroup",
                "Resource": "arn:aws:ec2:*:*:vpc/*",
            },
            {
                "Sid": "ChangeOnlyTheRunsGroup",
                "Effect": "Allow",
                "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:DeleteSecurityGroup"],
                "Resource": "arn:aws:ec2:*:*:security-group/*",
                "Condition": {"StringEquals": own},
            },
            *parking,
            *end,
        ],
    }


def boundary_arn(account: str = "ACCOUNT", partition: str = "aws") -> str:
    """The ARN of rubberband's permissions boundary (:data:`BOUNDARY_NAME`) in ``account``."""
    return f"arn:{partition}:iam::{account}:policy{IAM_PATH}{BOUNDARY_NAME}"


def aws_boundary_policy() -> dict[str, Any]:
    """rubberband's permissions boundary (pure; docs/clouds.md prints it): the most any role rubberband creates may
    do, whatever policy it is given.

    It is :func:`aws_head_policy` for the run the role is tagged with (``${aws:PrincipalTag/rubberband-run-id}``:
    one boundary serves every run), so a role under it acts on its own run's instances and group alone. Of IAM it
    allows only the head's own end (:data:`AWS_HEAD_END_ACTIONS`, on the role and instance profile named after the
    run it is tagged with) and nothing else; it denies outright any IAM action outside rubberband's path and, on it,
    :data:`AWS_ROLE_WIDENING`: no role under it can create, change, tag or pass a role, widen a policy, nor touch a
    boundary. A role not tagged with a run id matches no condition
    and names no role here, and may only read."""
    head = aws_head_policy(f"${{aws:PrincipalTag/{TAG_RUN_ID}}}", account="*", parking_group="*")
    ours = [f"arn:aws:iam::*:role{IAM_PATH}*", f"arn:aws:iam::*:instance-profile{IAM_PATH}*"]
    # on its roles and profiles the boundary allows the three deletions on the run's own ARNs and nothing else; the
    # ways to create or widen a role are denied there explicitly too, by name (a deny by NotAction would also hit
    # every EC2 action simulated on the resource ``*``, as the dry run does)
    deny = [
        {"Sid": "NoIamOutsideRubberbandsPath", "Effect": "Deny", "Action": "iam:*", "NotResource": ours},
        {"Sid": "NeverCreateOrWidenARole", "Effect": "Deny", "Action": list(AWS_ROLE_WIDENING), "Resource": ours},
    ]
    return {"Version": "2012-10-17", "Statement": [*head["Statement"], *deny]}


def aws_creator_policy(account: str = "ACCOUNT", partition: str = "aws") -> dict[str, Any]:
    """The IAM part of what the CLI's own credentials need (pure; docs/clouds.md prints it for ``ACCOUNT``).

    Roles can be created, and given an inline policy, only under rubberband's path and only with rubberband's
    boundary (``iam:PermissionsBoundary``); no managed policy can be attached; a role can be passed only to EC2;
    and whatever else the credentials hold, the boundary can never be removed from a role, swapped for another,
    nor the boundary policy itself created, changed or deleted. So these rights cannot make a role that does more
    than a run's head: without the boundary condition, ``iam:CreateRole`` + ``iam:PutRolePolicy`` + ``iam:PassRole``
    would let anyone holding them start an instance with a role allowed ``*:*``."""
    roles = f"arn:{partition}:iam::{account}:role{IAM_PATH}*"
    profiles = f"arn:{partition}:iam::{account}:instance-profile{IAM_PATH}*"
    boundary = boundary_arn(account, partition)
    under_boundary = {"StringEquals": {BOUNDARY_KEY: boundary}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "CreateRunRolesOnlyUnderTheBoundary",
                "Effect": "Allow",
                "Action": ["iam:CreateRole", "iam:PutRolePolicy"],
                "Resource": roles,
                "Condition": under_boundary,
            },
            {
                "Sid": "TagFindAndDeleteRunRoles",
                "Effect": "Allow",
                "Action": [
                    "iam:TagRole",
                    "iam:ListRoleTags",
                    "iam:ListRolePolicies",
                    "iam:ListInstanceProfilesForRole",
                    "iam:DeleteRolePolicy",
                    "iam:DeleteRole",
                ],
                "Resource": roles,
            },
            {
                "Sid": "RunInstanceProfiles",
                "Effect": "Allow",
                "Action": [
                    "iam:CreateInstanceProfile",
                    "iam:TagInstanceProfile",
                    "iam:GetInstanceProfile",
                    "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                ],
                "Resource": profiles,
            },
            {
                "Sid": "PassRunRolesToEc2Only",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": roles,
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            },
            {
                "Sid": "ListRunRoles",
                "Effect": "Allow",
                "Action": ["iam:ListRoles", "iam:ListInstanceProfiles"],
                "Resource": "*",
            },
            {
                "Sid": "ReadTheBoundary",
                "Effect": "Allow",
                "Action": ["iam:GetPolicy", "iam:GetPolicyVersion"],
                "Resource": boundary,
            },
            {
                "Sid": "NeverLoosenARunRolesBoundary",
                "Effect": "Deny",
                "Action": ["iam:DeleteRolePermissionsBoundary", "iam:AttachRolePolicy"],
                "Resource": roles,
            },
            {
                "Sid": "NeverSwapARunRolesBoundary",
                "Effect": "Deny",
                "Action": ["iam:CreateRole", "iam:PutRolePolicy", "iam:PutRolePermissionsBoundary"],
                "Resource": roles,
                "Condition": {"StringNotEquals": {BOUNDARY_KEY: boundary}},
            },
            {
                "Sid": "NeverChangeTheBoundary",
                "Effect": "Deny",
                "Action": [
                    "iam:CreatePolicy",
                    "iam:CreatePolicyVersion",
                    "iam:DeletePolicy",
                    "iam:DeletePolicyVersion",
                    "iam:SetDefaultPolicyVersion",
                ],
                "Resource": boundary,
            },
        ],
    }


def aws_creator_actions(account: str, partition: str = "aws") -> list[tuple[str, dict[str, str], str]]:
    """(action, context, resource) the CLI's credentials are simulated for when rubberband is to create the head's
    role: what :meth:`AwsIdentities.create` and :meth:`AwsIdentities.delete` call, with the boundary the role is
    created with and the service it is passed to."""
    role = f"arn:{partition}:iam::{account}:role{IAM_PATH}{identity_name('dry-run')}"
    profile = f"arn:{partition}:iam::{account}:instance-profile{IAM_PATH}{identity_name('dry-run')}"
    contexts = {
        "iam:CreateRole": {BOUNDARY_KEY: boundary_arn(account, partition)},
        "iam:PutRolePolicy": {BOUNDARY_KEY: boundary_arn(account, partition)},
        "iam:PassRole": {"iam:PassedToService": "ec2.amazonaws.com"},
    }
    resources = {"iam:ListRoles": "*", "iam:ListInstanceProfiles": "*"}
    out = []
    for action in AWS_CREATOR_ACTIONS:
        if action in ("iam:GetPolicy", "iam:GetPolicyVersion"):
            resource = boundary_arn(account, partition)
        elif "InstanceProfile" in action and action != "iam:ListInstanceProfilesForRole":
            resource = profile
        else:
            resource = resources.get(action, role)
        out.append((action, contexts.get(action, {}), resource))
    return out


def aws_creator_denials(account: str, partition: str = "aws") -> list[tuple[str, dict[str, str], str, str]]:
    """(action, context, resource, what) the CLI's credentials must NOT be allowed: the ways around the boundary.
    Checked by the dry run (a credential that could is reported as broader than rubberband needs) and by the tests
    against :func:`aws_creator_policy`."""
    role = f"arn:{partition}:iam::{account}:role{IAM_PATH}{identity_name('dry-run')}"
    boundary = boundary_arn(account, partition)
    other = f"arn:{partition}:iam::aws:policy/AdministratorAccess"
    return [
        ("iam:CreateRole", {}, role, "create a role without rubberband's boundary"),
        ("iam:CreateRole", {BOUNDARY_KEY: other}, role, "create a role under another boundary"),
        ("iam:PutRolePolicy", {}, role, "give a policy to a role without rubberband's boundary"),
        ("iam:AttachRolePolicy", {BOUNDARY_KEY: boundary}, role, "attach a managed policy to a run's role"),
        ("iam:DeleteRolePermissionsBoundary", {BOUNDARY_KEY: boundary}, role, "remove a run role's boundary"),
        ("iam:PutRolePermissionsBoundary", {BOUNDARY_KEY: other}, role, "swap a run role's boundary"),
        ("iam:CreatePolicyVersion", {}, boundary, "change rubberband's boundary"),
        ("iam:PassRole", {"iam:PassedToService": "lambda.amazonaws.com"}, role, "pass a run's role to another service"),
    ]


#: (action, tag context) the head's identity is simulated for: what provision / wait / teardown call.
def aws_head_actions(run_id: str) -> list[tuple[str, dict[str, str]]]:
    request = {
        f"aws:RequestTag/{TAG_RUN_ID}": run_id,
        f"aws:RequestTag/{TAG_MANAGED}": "true",
        "ec2:CreateAction": "RunInstances",
    }
    own = {f"ec2:ResourceTag/{TAG_RUN_ID}": run_id}
    return [
        ("ec2:DescribeInstances", {}),
        ("ec2:DescribeSecurityGroups", {}),
        ("ec2:DescribeVpcs", {}),
        ("ec2:DescribeAvailabilityZones", {}),
        ("ec2:RunInstances", {**request, **own}),
        ("ec2:CreateTags", request),
        ("ec2:CreateTags", {**own, "aws:TagKeys": TAG_HEARTBEAT}),
        ("ec2:TerminateInstances", own),
        ("ec2:AuthorizeSecurityGroupIngress", own),
        ("ec2:DeleteSecurityGroup", own),
    ]


def aws_head_denials(run_id: str) -> list[tuple[str, dict[str, str], str]]:
    """(action, tag context, what) the head's identity must NOT be allowed: least privilege, checked by the dry run
    against a named profile and by the tests against :func:`aws_head_policy`."""
    other = f"{run_id}-other"
    return [
        ("ec2:TerminateInstances", {f"ec2:ResourceTag/{TAG_RUN_ID}": other}, "terminate another run's instance"),
        (
            "ec2:CreateTags",
            {f"ec2:ResourceTag/{TAG_RUN_ID}": other, "aws:TagKeys": TAG_HEARTBEAT},
            "re-tag another run's instance",
        ),
        (
            "ec2:CreateTags",
            {f"ec2:ResourceTag/{TAG_RUN_ID}": run_id, "aws:TagKeys": TAG_RUN_ID},
            "change the run id of its own instance",
        ),
        (
            "ec2:AuthorizeSecurityGroupIngress",
            {f"ec2:ResourceTag/{TAG_RUN_ID}": other},
            "open another run's security group",
        ),
        ("ec2:DeleteSecurityGroup", {f"ec2:ResourceTag/{TAG_RUN_ID}": other}, "delete another run's security group"),
    ]


def default_group(call: Callable[[str, Callable[[], Any]], Any], ec2: Any, vpc_id: str) -> str | None:
    """The id of ``vpc_id``'s default security group (every VPC has one, named ``default``), through ``call`` (the
    caller's error classification); None when EC2 lists none."""
    groups = call(
        "ec2:DescribeSecurityGroups",
        lambda: ec2.describe_security_groups(
            Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "group-name", "Values": ["default"]}]
        ),
    )["SecurityGroups"]
    return groups[0]["GroupId"] if groups else None


def _tags(run_id: str, region: str) -> list[dict[str, str]]:
    return [
        {"Key": TAG_MANAGED, "Value": "true"},
        {"Key": TAG_RUN_ID, "Value": run_id},
        {"Key": TAG_REGION, "Value": region},
    ]


class AwsIdentities:
    """Create, check, find and delete the head identities of rubberband runs (IAM is global: no region)."""

    def __init__(
        self, *, session: Any = None, endpoint_url: str | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        from botocore.config import Config

        from rubberband.cloud.aws.session import new_session

        self.session = session or new_session()
        self.endpoint_url = endpoint_url
        config = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60)
        self.config = config
        self.iam = self.session.client("iam", endpoint_url=endpoint_url, config=config)
        # STS at its own endpoint (IAM's would not answer GetCallerIdentity), or at the one given for both (tests)
        self.sts = self.session.client("sts", endpoint_url=endpoint_url, config=config)
        self.sleep = sleep

    def _call(self, action: str, fn: Callable[[], Any]) -> Any:
        import botocore.exceptions
        import botocore.parsers

        try:
            return fn()
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.get("Code", "")
            if code in ("AccessDenied", "AccessDeniedException"):
                code = "UnauthorizedOperation"
            context = CallContext("aws", action=action if ":" in action else f"iam:{action}")
            raise classify(code, error.get("Message", ""), context, http_status=status) from None
        except botocore.exceptions.NoCredentialsError:
            raise classify("NoCredentials", "boto3 found no credentials", CallContext("aws")) from None
        except botocore.parsers.ResponseParserError as exc:  # XML that is no API answer
            raise UnexpectedAnswer(f"aws {action if ':' in action else f'iam:{action}'}", str(exc)) from None
        except botocore.exceptions.BotoCoreError as exc:  # a connection error, an unreadable answer
            name = action if ":" in action else f"iam:{action}"
            raise CloudError(f"aws {name}: {exc}", kind="transient", code=type(exc).__name__) from None

    def caller(self) -> tuple[str, str, str]:
        """(ARN, account, partition) of the credentials in use (``sts:GetCallerIdentity``, which needs no
        permission)."""
        arn = self._call("sts:GetCallerIdentity", self.sts.get_caller_identity)["Arn"]
        parts = arn.split(":")
        return arn, parts[4], parts[1]

    def boundary(self) -> str:
        """The ARN of rubberband's permissions boundary in this account (:func:`aws_boundary_policy`); an
        :class:`~rubberband.errors.InputError` saying how to create it when the account has none yet."""
        _, account, partition = self.caller()
        arn = boundary_arn(account, partition)
        try:
            self._call("GetPolicy", lambda: self.iam.get_policy(PolicyArn=arn))
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                raise InputError(BOUNDARY_MISSING.format(arn=arn)) from None
            raise
        return arn

    def boundary_document(self, arn: str) -> dict[str, Any]:
        """The document of the boundary policy's default version, as IAM holds it."""
        from urllib.parse import unquote

        version = self._call("GetPolicy", lambda: self.iam.get_policy(PolicyArn=arn))["Policy"]["DefaultVersionId"]
        document = self._call(
            "GetPolicyVersion", lambda: self.iam.get_policy_version(PolicyArn=arn, VersionId=version)
        )["PolicyVersion"]["Document"]
        return json.loads(unquote(document)) if isinstance(document, str) else document

    # -- a run's own identity -------------------------------------------------------------------

    def create(self, run_id: str, region: str) -> HeadIdentity:
        """The run's role (trusted by EC2 only, under rubberband's permissions boundary, :func:`aws_head_policy`
        inline) in an instance profile, both tagged.

        Idempotent: what an earlier try of the same run created is reused. On failure, whatever was
        created is deleted before the error propagates. An account without the boundary policy is an
        :class:`~rubberband.errors.InputError` before anything is created."""
        name = identity_name(run_id)
        boundary = self.boundary()
        _, account, partition = self.caller()
        policy = aws_head_policy(run_id, account=account, partition=partition, parking_group=self.parking_group(region))
        try:
            self._create_missing(name, run_id, region, boundary, policy)
        except BaseException:
            self.delete(run_id)
            raise
        return HeadIdentity("aws", name, created=True)

    def parking_group(self, region: str) -> str | None:
        """The default security group of ``region``'s default VPC (where the run's instances go): the one group the
        head may move its own instance into, to leave the run's group before deleting it; None: no default VPC
        (the head then leaves the run's group to the CLI)."""
        ec2 = self.session.client("ec2", region_name=region, endpoint_url=self.endpoint_url, config=self.config)
        vpcs = self._call(
            "ec2:DescribeVpcs", lambda: ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])
        )["Vpcs"]
        if not vpcs:
            return None
        return default_group(self._call, ec2, vpcs[0]["VpcId"])

    def _create_missing(self, name: str, run_id: str, region: str, boundary: str, policy: dict[str, Any]) -> None:
        try:
            self._call(
                "CreateRole",
                lambda: self.iam.create_role(
                    Path=IAM_PATH,
                    RoleName=name,
                    AssumeRolePolicyDocument=json.dumps(EC2_TRUST_POLICY),
                    Description=f"rubberband head of run {run_id}: its instances only",
                    MaxSessionDuration=3600,
                    PermissionsBoundary=boundary,
                    Tags=_tags(run_id, region),
                ),
            )
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        self._call(
            "PutRolePolicy",
            lambda: self.iam.put_role_policy(
                RoleName=name, PolicyName=HEAD_POLICY_NAME, PolicyDocument=json.dumps(policy)
            ),
        )
        try:
            self._call(
                "CreateInstanceProfile",
                lambda: self.iam.create_instance_profile(
                    Path=IAM_PATH, InstanceProfileName=name, Tags=_tags(run_id, region)
                ),
            )
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        profile = self._call("GetInstanceProfile", lambda: self.iam.get_instance_profile(InstanceProfileName=name))
        if not any(r["RoleName"] == name for r in profile["InstanceProfile"].get("Roles", [])):
            self._call(
                "AddRoleToInstanceProfile",
                lambda: self.iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name),
            )

    def find(self, run_id: str | None = None) -> dict[str, dict[str, str]]:
        """Roles rubberband created (path ``/rubberband/``, managed tag), by name -> their tags; one run's only
        when ``run_id`` is given (its exact tag, never a name pattern)."""
        found: dict[str, dict[str, str]] = {}
        for page in self._call(
            "ListRoles", lambda: list(self.iam.get_paginator("list_roles").paginate(PathPrefix=IAM_PATH))
        ):
            for role in page["Roles"]:
                tags = {
                    t["Key"]: t["Value"]
                    for t in self._call("ListRoleTags", lambda: self.iam.list_role_tags(RoleName=role["RoleName"]))[
                        "Tags"
                    ]
                }
                if tags.get(TAG_MANAGED) == "true" and (run_id is None or tags.get(TAG_RUN_ID) == run_id):
                    found[role["RoleName"]] = {**tags, "created": role["CreateDate"].isoformat()}
        return found

    def find_profiles(self, run_id: str | None = None) -> dict[str, dict[str, str]]:
        """Instance profiles rubberband created (path, managed tag), by name -> their tags (one run's when given):
        a profile can outlive its role when a teardown was cut off between the two deletes."""
        found: dict[str, dict[str, str]] = {}
        for page in self._call(
            "ListInstanceProfiles",
            lambda: list(self.iam.get_paginator("list_instance_profiles").paginate(PathPrefix=IAM_PATH)),
        ):
            for profile in page["InstanceProfiles"]:
                name = profile["InstanceProfileName"]
                try:
                    full = self._call(
                        "GetInstanceProfile", lambda: self.iam.get_instance_profile(InstanceProfileName=name)
                    )["InstanceProfile"]
                except CloudError as exc:
                    if exc.code == "NoSuchEntity":
                        continue
                    raise
                tags = {t["Key"]: t["Value"] for t in full.get("Tags", [])}
                if tags.get(TAG_MANAGED) == "true" and (run_id is None or tags.get(TAG_RUN_ID) == run_id):
                    found[name] = {**tags, "created": profile["CreateDate"].isoformat()}
        return found

    def delete(self, run_id: str) -> list[str]:
        """Delete the run's instance profile and role (found by tag); returns what was deleted. Idempotent."""
        deleted: list[str] = []
        for name in self.find(run_id):
            deleted += self._delete_one(name)
        for name in self.find_profiles(run_id):  # a profile whose role is gone already
            try:
                self._call("DeleteInstanceProfile", lambda: self.iam.delete_instance_profile(InstanceProfileName=name))
                deleted.append(f"instance-profile/{name}")
            except CloudError as exc:
                if exc.code != "NoSuchEntity":
                    raise
        return deleted

    def _delete_one(self, name: str) -> list[str]:
        deleted = []

        def gone(action: str, fn: Callable[[], Any]) -> bool:
            try:
                self._call(action, fn)
                return True
            except CloudError as exc:
                if exc.code != "NoSuchEntity":
                    raise
                return False

        profiles = self._call(
            "ListInstanceProfilesForRole", lambda: self.iam.list_instance_profiles_for_role(RoleName=name)
        )["InstanceProfiles"]
        for profile in profiles:
            pname = profile["InstanceProfileName"]
            gone(
                "RemoveRoleFromInstanceProfile",
                lambda: self.iam.remove_role_from_instance_profile(InstanceProfileName=pname, RoleName=name),
            )
            if pname == name and gone(
                "DeleteInstanceProfile", lambda: self.iam.delete_instance_profile(InstanceProfileName=pname)
            ):
                deleted.append(f"instance-profile/{pname}")
        if not any(p["InstanceProfileName"] == name for p in profiles):  # left alone by an earlier, cut-off try
            if gone("DeleteInstanceProfile", lambda: self.iam.delete_instance_profile(InstanceProfileName=name)):
                deleted.append(f"instance-profile/{name}")
        for policy in self._call("ListRolePolicies", lambda: self.iam.list_role_policies(RoleName=name))["PolicyNames"]:
            gone("DeleteRolePolicy", lambda: self.iam.delete_role_policy(RoleName=name, PolicyName=policy))
        if gone("DeleteRole", lambda: self.iam.delete_role(RoleName=name)):
            deleted.append(f"role/{name}")
        return deleted

    def end_own(self, run_id: str) -> list[str]:
        """The run's end of its own identity, called by its head with that identity (:data:`AWS_HEAD_END_ACTIONS`,
        in this order): take the role out of the run's instance profile, delete the profile, and as the very last
        call delete the role's inline policy, the one that allowed all of this, leaving a role that may do nothing.

        That role itself stays: IAM deletes no role that still has a policy, and without its policy a role may not
        delete anything, itself included; the CLI deletes it (``rubberband down``, the orphan sweep, which find it
        by its tag). What was already gone (the CLI ended the run meanwhile) is skipped; the first other error
        propagates, before the policy is deleted, so a head that could not finish keeps its rights."""
        name, deleted = identity_name(run_id), []
        steps: list[tuple[str, str, Callable[[], Any]]] = [
            (
                "RemoveRoleFromInstanceProfile",
                f"role/{name} from instance-profile/{name}",
                lambda: self.iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name),
            ),
            (
                "DeleteInstanceProfile",
                f"instance-profile/{name}",
                lambda: self.iam.delete_instance_profile(InstanceProfileName=name),
            ),
            (
                "DeleteRolePolicy",
                f"role-policy/{name}/{HEAD_POLICY_NAME}",
                lambda: self.iam.delete_role_policy(RoleName=name, PolicyName=HEAD_POLICY_NAME),
            ),
        ]
        for action, what, call in steps:
            try:
                self._call(action, call)
                deleted.append(what)
            except CloudError as exc:
                if exc.code != "NoSuchEntity":
                    raise
        return deleted

    def leftover_runs(
        self, live_runs: Iterable[str], regions: Iterable[str], *, older_than_s: float = 0.0, now: float | None = None
    ) -> list[str]:
        """Runs of ``regions`` whose head identity outlived their instances (none of them in ``live_runs``)."""
        from datetime import datetime

        now = time.time() if now is None else now
        live, wanted = set(live_runs), set(regions)
        runs = []
        for tags in [*self.find().values(), *self.find_profiles().values()]:
            age = now - datetime.fromisoformat(tags["created"]).timestamp()
            if (
                tags.get(TAG_RUN_ID)
                and tags[TAG_RUN_ID] not in live
                and tags.get(TAG_REGION) in wanted
                and age >= older_than_s
            ):
                runs.append(tags[TAG_RUN_ID])
        return sorted(set(runs))

    # -- checks (dry run) -----------------------------------------------------------------------

    def check_profile(self, profile: str, run_id: str) -> list[PermissionCheck]:
        """The named instance profile exists, holds a role, and that role may do what the head does."""
        what = f"head profile {profile}"
        try:
            found = self._call(
                "GetInstanceProfile", lambda: self.iam.get_instance_profile(InstanceProfileName=profile)
            )["InstanceProfile"]
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                raise InputError(
                    f"--instance-profile {profile}: no such IAM instance profile; create it (policy in "
                    f"docs/clouds.md) or leave the flag out to let rubberband create one for the run"
                ) from None
            if exc.code == "UnauthorizedOperation":
                return [PermissionCheck("aws", "global", "iam:GetInstanceProfile", False, what)]
            raise
        roles = found.get("Roles", [])
        if not roles:
            raise InputError(
                f"--instance-profile {profile} holds no role: add the head's role to it "
                f"(`aws iam add-role-to-instance-profile`)"
            )
        checks = [PermissionCheck("aws", "global", "iam:GetInstanceProfile", True, what)]
        role = f"{what} (role {roles[0]['RoleName']})"
        # the run tag a head's role carries (IAM's simulation fills no principal tag itself): rubberband's boundary
        # scopes a role to the run it is tagged with
        principal = {f"aws:PrincipalTag/{TAG_RUN_ID}": run_id}
        needed = [(a, {**principal, **c}, None) for a, c in aws_head_actions(run_id)]
        checks += self._simulate(roles[0]["Arn"], needed, role)
        for action, context, doing in aws_head_denials(run_id):
            (check,) = self._simulate(roles[0]["Arn"], [(action, {**principal, **context}, None)], role)
            if check.allowed is None:
                break  # simulation unavailable: already reported above
            checks.append(
                PermissionCheck(
                    "aws",
                    "global",
                    action,
                    check.allowed,
                    f"{role} must not {doing}"
                    + (": broader than rubberband needs (docs/clouds.md)" if check.allowed else ""),
                    expect="deny",
                )
            )
        return checks

    def check_creator(self) -> list[PermissionCheck]:
        """The CLI's own credentials may create (and delete) a run's head identity, under rubberband's boundary, which
        exists and is the one :func:`aws_boundary_policy` describes; and they cannot get around it
        (:func:`aws_creator_denials`: reported as broader than needed, not fatal)."""
        try:
            arn, account, partition = self.caller()
        except CloudError as exc:  # reported, not fatal: the launch checks it anyway
            return [PermissionCheck("aws", "global", "iam:*", None, f"caller unknown ({exc.code or 'error'})")]
        what = "to create the head's role"
        checks = [self._check_boundary(boundary_arn(account, partition))]
        checks += self._simulate(arn, [(a, c, r) for a, c, r in aws_creator_actions(account, partition)], what)
        for action, context, resource, doing in aws_creator_denials(account, partition):
            (check,) = self._simulate(arn, [(action, context, resource)], what)
            if check.allowed is None:
                break  # simulation unavailable: already reported above
            broader = ": broader than rubberband needs, a way around its boundary (docs/clouds.md)"
            checks.append(
                PermissionCheck(
                    "aws",
                    "global",
                    action,
                    check.allowed,
                    f"you must not {doing}" + (broader if check.allowed else ""),
                    expect="deny",
                )
            )
        return checks

    def _check_boundary(self, arn: str) -> PermissionCheck:
        """The dry run's row for rubberband's boundary policy: it exists and holds :func:`aws_boundary_policy`."""
        try:
            document = self.boundary_document(arn)
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                return PermissionCheck("aws", "global", "iam:GetPolicy", False, BOUNDARY_MISSING.format(arn=arn))
            if exc.code in ("UnauthorizedOperation", "AccessDenied"):
                return PermissionCheck("aws", "global", "iam:GetPolicy", False, f"you may not read {arn}")
            return PermissionCheck("aws", "global", "iam:GetPolicy", None, f"{arn}: not checked ({exc.code})")
        if document != aws_boundary_policy():
            return PermissionCheck(
                "aws",
                "global",
                "iam:GetPolicyVersion",
                False,
                f"{arn} is not rubberband's boundary (another version): update it (docs/clouds.md, "
                f"`python -m rubberband.cloud.aws.identity boundary`)",
            )
        return PermissionCheck("aws", "global", "iam:GetPolicyVersion", True, f"rubberband's boundary {arn}")

    def _simulate(
        self, arn: str, actions: Sequence[tuple[str, dict[str, str], str | None]], what: str
    ) -> list[PermissionCheck]:
        """``iam:SimulatePrincipalPolicy`` for each (action, context, resource) (no resource: IAM's default ``*``);
        unchecked where IAM cannot say."""
        checks: list[PermissionCheck] = []
        for action, context, resource in actions:
            entries = [
                {"ContextKeyName": k, "ContextKeyValues": [v], "ContextKeyType": "string"} for k, v in context.items()
            ]
            extra = {"ResourceArns": [resource]} if resource else {}
            try:
                result = self._call(
                    "SimulatePrincipalPolicy",
                    lambda: self.iam.simulate_principal_policy(
                        PolicySourceArn=arn, ActionNames=[action], ContextEntries=entries, **extra
                    ),
                )
            except CloudError as exc:
                detail = (
                    "the CLI may not simulate IAM policies (iam:SimulatePrincipalPolicy)"
                    if exc.code == "UnauthorizedOperation"
                    else f"IAM could not simulate it ({exc.code or 'error'})"
                )
                return checks + [
                    PermissionCheck("aws", "global", a, None, f"{what}: {detail}") for a, _, _ in actions[len(checks) :]
                ]
            decision = result["EvaluationResults"][0]["EvalDecision"]
            checks.append(
                PermissionCheck(
                    "aws",
                    "global",
                    action,
                    decision == "allowed",
                    what if decision == "allowed" else f"{what}: {decision}",
                )
            )
        return checks


def _policy_block(policy: dict[str, Any]) -> list[str]:
    """A policy as docs/clouds.md prints it: one statement a line."""
    statements = ",\n".join(f"  {json.dumps(st)}" for st in policy["Statement"])
    return ["```json", '{"Version": "2012-10-17", "Statement": [', statements, "]}", "```"]


BOUNDARY_MISSING = (
    "this AWS account has no rubberband permissions boundary {arn}: an administrator creates it once with "
    "`aws iam create-policy --path /rubberband/ --policy-name rubberband-boundary --policy-document "
    '"$(python -m rubberband.cloud.aws.identity boundary)"` (docs/clouds.md, Permissions), or pass '
    "--instance-profile NAME"
)


def policy_docs() -> str:
    """The AWS policies as docs/clouds.md prints them (between its ``policies`` markers; a test checks that the page
    holds this text, so the code and the page cannot drift)."""
    return "\n".join(
        [
            '#### AWS: the head\'s role (`aws_head_policy("RUN")`)',
            "",
            "Rendered per run with your account and, for `DEFAULT_GROUP`, the id of the default security group of "
            "the region's default VPC. When the run ends, its watchdog on the head leaves the run's security group "
            "for that group (`ec2:ModifyInstanceAttribute`, only on the run's own head), deletes the run's "
            "group once the workers are gone, then ends its own identity, as its very last API calls: "
            + ", ".join(f"`{a}`" for a in AWS_HEAD_END_ACTIONS)
            + ", only on this run's role and instance profile, named by ARN; then it powers off (its shutdown "
            "behaviour terminates it). Not `iam:DeleteRole`: IAM deletes no role that still has a policy, and "
            "without it a role may do nothing, so the empty role is left to `rubberband down` and the orphan sweep.",
            "",
            *_policy_block(aws_head_policy("RUN")),
            "",
            "#### AWS: rubberband's permissions boundary (`aws_boundary_policy()`)",
            "",
            f"The managed policy `{boundary_arn()}`, created once per account by an administrator "
            "(`python -m rubberband.cloud.aws.identity boundary` prints it as one line for `aws iam create-policy`); "
            "every role rubberband creates carries it. Of IAM it allows only the head's own end above, on the role "
            "and instance profile named after the run the role is tagged with (nothing else of IAM), and denies any "
            "IAM action outside rubberband's path outright:",
            "",
            *_policy_block(aws_boundary_policy()),
            "",
            "#### AWS: you (the CLI)",
            "",
            "The head's EC2 actions above for your run's resources, "
            + ", ".join(f"`{a}`" for a in AWS_CLI_SWEEP_ACTIONS)
            + " (teardown and the orphan sweep: detached volumes and secrets with the run's tags), "
            + ", ".join(f"`{a}`" for a in AWS_CLI_CONSOLE_ACTIONS)
            + " (head mode: the head's SSH host keys, read from its console before the first connection), "
            "`ssm:GetParameter`, "
            'and, to create, find and delete the head\'s role, this (`aws_creator_policy("ACCOUNT")`):',
            "",
            *_policy_block(aws_creator_policy()),
        ]
    )


def main(argv: list[str]) -> int:
    """``python -m rubberband.cloud.aws.identity boundary``: rubberband's boundary policy as one line of JSON (for
    ``aws iam create-policy --policy-document``)."""
    if argv == ["boundary"]:
        print(json.dumps(aws_boundary_policy()))
        return 0
    print("usage: python -m rubberband.cloud.aws.identity boundary", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
