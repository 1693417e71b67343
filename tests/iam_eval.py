"""A small IAM policy evaluator for the tests: what AWS decides for one request, from the principal's identity policies
and its permissions boundary (moto enforces no IAM policy, and has no ``iam:SimulatePrincipalPolicy``).

It follows AWS's evaluation logic for one account without organizations, session or resource policies:

1. an explicit ``Deny`` that applies, in an identity policy or in the boundary, denies (``explicitDeny``);
2. else the request is allowed when an identity policy allows it **and**, where the principal has a boundary, the
   boundary allows it too (``allowed``);
3. else it is denied implicitly (``implicitDeny``).

A statement applies when its ``Action`` (or ``NotAction``) and ``Resource`` (or ``NotResource``) match — ``*`` and ``?``
wildcards; actions case-insensitive, resources case-sensitive — and every condition holds. Conditions: the
``String*`` and ``Arn*`` operators (``Equals``, ``NotEquals``, ``Like``, ``NotLike``; ``ArnEquals`` is matched as
``ArnLike``), ``Bool`` and ``Null``, with the ``ForAllValues:`` / ``ForAnyValue:`` set prefixes and the ``IfExists``
suffix; keys and values are ANDed across keys and ORed across values; a key missing from the request makes a
positive operator false and a negated one true (as AWS documents). Policy variables (``${aws:PrincipalTag/k}``) are
filled from the request context; one that is not there matches nothing. A request on the resource ``*`` (a
simulation that names no resource, as rubberband's dry run does for the head) matches every statement's resource.
Numeric, date and IP operators are not implemented: a policy using one fails loudly here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Context = Mapping[str, str | Sequence[str]]
_VARIABLE = re.compile(r"\$\{([^}]+)\}")
_MISSING = object()


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _pattern(text: str, *, ignore_case: bool) -> re.Pattern[str]:
    """An IAM wildcard pattern (``*``: any run of characters, ``?``: one) as a regular expression."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)
    return re.compile(f"^{body}$", re.IGNORECASE if ignore_case else 0)


def _substitute(value: str, context: Context) -> str | None:
    """``value`` with its policy variables filled from ``context``; None when one of them is not there."""
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        found = context.get(match.group(1))
        if found is None or not isinstance(found, str):
            missing = True
            return ""
        return found

    filled = _VARIABLE.sub(fill, value)
    return None if missing else filled


def _matches_action(statement: Mapping[str, Any], action: str) -> bool:
    key = "Action" if "Action" in statement else "NotAction"
    hit = any(_pattern(a, ignore_case=True).match(action) for a in _list(statement[key]))
    return hit if key == "Action" else not hit


def _matches_resource(statement: Mapping[str, Any], resource: str, context: Context) -> bool:
    key = "Resource" if "Resource" in statement else "NotResource"
    if resource == "*":
        return key == "Resource"
    patterns = [_substitute(r, context) for r in _list(statement[key])]
    hit = any(p is not None and _pattern(p, ignore_case=False).match(resource) for p in patterns)
    return hit if key == "Resource" else not hit


def _compare(base: str, wanted: str, value: str) -> bool:
    """One value against one policy value, by the operator's base name (without Not / set / IfExists parts)."""
    if base == "StringEquals":
        return value == wanted
    if base == "StringEqualsIgnoreCase":
        return value.lower() == wanted.lower()
    if base in ("StringLike", "ArnLike", "ArnEquals"):
        return bool(_pattern(wanted, ignore_case=False).match(value))
    if base == "Bool":
        return value.lower() == wanted.lower()
    raise NotImplementedError(f"condition operator {base} is not implemented by tests/iam_eval.py")


def _condition_holds(operator: str, key: str, wanted_values: Any, context: Context) -> bool:
    """One condition operator on one key, against the request context."""
    present = context.get(key, _MISSING)
    if operator == "Null":
        return (present is _MISSING) == (str(_list(wanted_values)[0]).lower() == "true")
    qualifier, _, name = operator.rpartition(":")
    if_exists = name.endswith("IfExists")
    name = name.removesuffix("IfExists")
    negated = "Not" in name
    base = name.replace("Not", "", 1) if negated else name
    if present is _MISSING:
        if if_exists or qualifier == "ForAllValues":
            return True
        return negated and qualifier != "ForAnyValue"
    wanted = [w for w in (_substitute(str(v), context) for v in _list(wanted_values)) if w is not None]
    values = [str(v) for v in _list(present)]

    def one(value: str) -> bool:
        hit = any(_compare(base, w, value) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    if qualifier == "ForAnyValue":
        return any(one(v) for v in values)
    if negated:
        return all(one(v) for v in values)
    return any(one(v) for v in values)


def _applies(statement: Mapping[str, Any], action: str, resource: str, context: Context) -> bool:
    return (
        _matches_action(statement, action)
        and _matches_resource(statement, resource, context)
        and all(
            _condition_holds(operator, key, wanted, context)
            for operator, terms in statement.get("Condition", {}).items()
            for key, wanted in terms.items()
        )
    )


def _effects(policies: Sequence[Mapping[str, Any]], action: str, resource: str, context: Context) -> set[str]:
    """The effects ("Allow", "Deny") of every statement of ``policies`` that applies to the request."""
    return {
        st["Effect"]
        for policy in policies
        for st in _list(policy["Statement"])
        if _applies(st, action, resource, context)
    }


def evaluate(
    action: str,
    resource: str = "*",
    context: Context | None = None,
    *,
    policies: Sequence[Mapping[str, Any]],
    boundary: Mapping[str, Any] | None = None,
) -> str:
    """AWS's decision for ``action`` on ``resource`` with ``context``, for a principal holding the identity
    ``policies`` under ``boundary`` (None: no boundary): ``allowed``, ``explicitDeny`` or ``implicitDeny``."""
    context = context or {}
    identity = _effects(policies, action, resource, context)
    bounded = _effects([boundary], action, resource, context) if boundary is not None else {"Allow"}
    if "Deny" in identity or "Deny" in bounded:
        return "explicitDeny"
    if "Allow" in identity and "Allow" in bounded:
        return "allowed"
    return "implicitDeny"
