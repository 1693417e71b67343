"""The tests' IAM policy evaluator (tests/iam_eval.py) decides as AWS documents its evaluation logic: the door-closing
tests of the permissions boundary (test_cloud_identity.py) are only as honest as it is."""

from __future__ import annotations

import pytest
from iam_eval import evaluate


def _policy(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


ALLOW_ALL = _policy({"Effect": "Allow", "Action": "*", "Resource": "*"})


def test_an_explicit_deny_wins_and_nothing_allowed_is_denied_implicitly():
    deny = _policy({"Effect": "Deny", "Action": "iam:*", "Resource": "*"})
    assert evaluate("iam:CreateRole", policies=[ALLOW_ALL, deny]) == "explicitDeny"
    assert evaluate("s3:GetObject", policies=[ALLOW_ALL, deny]) == "allowed"
    assert evaluate("s3:GetObject", policies=[deny]) == "implicitDeny"
    assert evaluate("s3:GetObject", policies=[]) == "implicitDeny"


def test_a_boundary_only_caps_what_the_identity_policies_allow():
    s3_only = _policy({"Effect": "Allow", "Action": "s3:*", "Resource": "*"})
    assert evaluate("s3:GetObject", policies=[ALLOW_ALL], boundary=s3_only) == "allowed"
    assert evaluate("ec2:RunInstances", policies=[ALLOW_ALL], boundary=s3_only) == "implicitDeny"
    assert evaluate("s3:GetObject", policies=[], boundary=s3_only) == "implicitDeny"  # a boundary grants nothing
    boundary_deny = _policy(
        {"Effect": "Allow", "Action": "*", "Resource": "*"}, {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    )
    assert evaluate("s3:GetObject", policies=[ALLOW_ALL], boundary=boundary_deny) == "explicitDeny"


def test_actions_and_resources_match_with_wildcards():
    policy = _policy(
        {"Effect": "Allow", "Action": "iam:Create*", "Resource": "arn:aws:iam::1:role/rubberband/*"},
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
    )
    assert evaluate("IAM:createrole", "arn:aws:iam::1:role/rubberband/rb-x", policies=[policy]) == "allowed"
    assert evaluate("iam:CreateRole", "arn:aws:iam::1:role/other", policies=[policy]) == "implicitDeny"
    assert evaluate("iam:CreateRole", "arn:aws:iam::1:role/Rubberband/rb-x", policies=[policy]) == "implicitDeny"
    assert evaluate("iam:DeleteRole", "arn:aws:iam::1:role/rubberband/rb-x", policies=[policy]) == "implicitDeny"
    assert evaluate("ec2:RunInstances", "arn:aws:ec2:r:1:instance/*", policies=[policy]) == "allowed"  # NotAction
    # a simulation that names no resource ("*") matches every statement's resource
    assert evaluate("iam:CreateRole", "*", policies=[policy]) == "allowed"


def test_conditions_on_missing_keys_follow_aws():
    """A key missing from the request makes a positive operator false and a negated one true; ForAllValues is true and
    ForAnyValue false on a missing key; IfExists is true on one."""

    def decide(operator: str, context: dict) -> str:
        policy = _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {operator: {"k": "v"}}})
        return evaluate("s3:GetObject", "*", context, policies=[policy])

    assert decide("StringEquals", {}) == "implicitDeny" and decide("StringEquals", {"k": "v"}) == "allowed"
    assert decide("StringNotEquals", {}) == "allowed" and decide("StringNotEquals", {"k": "v"}) == "implicitDeny"
    assert decide("ForAllValues:StringEquals", {}) == "allowed"
    assert decide("ForAllValues:StringEquals", {"k": ["v", "w"]}) == "implicitDeny"
    assert decide("ForAnyValue:StringEquals", {}) == "implicitDeny"
    assert decide("ForAnyValue:StringEquals", {"k": ["v", "w"]}) == "allowed"
    assert (
        decide("StringEqualsIfExists", {}) == "allowed" and decide("StringEqualsIfExists", {"k": "w"}) == "implicitDeny"
    )
    assert decide("StringLike", {"k": "v"}) == "allowed" and decide("ArnLike", {}) == "implicitDeny"
    null = _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"Null": {"k": "true"}}})
    assert evaluate("s3:GetObject", "*", {}, policies=[null]) == "allowed"
    assert evaluate("s3:GetObject", "*", {"k": "v"}, policies=[null]) == "implicitDeny"


def test_keys_and_values_combine_as_aws_documents():
    """Across keys (and operators) every condition must hold; across one key's values any may match."""
    policy = _policy(
        {
            "Effect": "Allow",
            "Action": "*",
            "Resource": "*",
            "Condition": {"StringEquals": {"a": ["1", "2"], "b": "x"}, "StringLike": {"c": "run-*"}},
        }
    )
    assert evaluate("s3:GetObject", "*", {"a": "2", "b": "x", "c": "run-7"}, policies=[policy]) == "allowed"
    assert evaluate("s3:GetObject", "*", {"a": "3", "b": "x", "c": "run-7"}, policies=[policy]) == "implicitDeny"
    assert evaluate("s3:GetObject", "*", {"a": "1", "b": "x"}, policies=[policy]) == "implicitDeny"


def test_policy_variables_come_from_the_request_and_a_missing_one_matches_nothing():
    policy = _policy(
        {
            "Effect": "Allow",
            "Action": "ec2:TerminateInstances",
            "Resource": "*",
            "Condition": {"StringEquals": {"ec2:ResourceTag/run": "${aws:PrincipalTag/run}"}},
        }
    )
    mine = {"aws:PrincipalTag/run": "a", "ec2:ResourceTag/run": "a"}
    assert evaluate("ec2:TerminateInstances", "*", mine, policies=[policy]) == "allowed"
    theirs = {"aws:PrincipalTag/run": "a", "ec2:ResourceTag/run": "b"}
    assert evaluate("ec2:TerminateInstances", "*", theirs, policies=[policy]) == "implicitDeny"
    untagged = {"ec2:ResourceTag/run": "${aws:PrincipalTag/run}"}  # the literal text is no match either
    assert evaluate("ec2:TerminateInstances", "*", untagged, policies=[policy]) == "implicitDeny"


def test_an_operator_it_does_not_know_fails_loudly():
    policy = _policy({"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"NumericLessThan": {"k": "1"}}})
    with pytest.raises(NotImplementedError, match="NumericLessThan"):
        evaluate("s3:GetObject", "*", {"k": "0"}, policies=[policy])
