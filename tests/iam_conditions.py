"""Evaluate an IAM condition (the CEL subset IAM conditions offer on resources) as IAM would, for tests.

IAM conditions on a role binding see ``resource.type`` and ``resource.name`` (e.g.
``projects/P/zones/Z/instances/NAME``); on names they offer ``startsWith``, ``endsWith`` and ``extract`` (whose
template ``/instances/{name}`` yields what follows ``/instances/``, or "" when the name has no such part), ``==`` and
``!=``, joined with ``&&``, ``||`` and parentheses. :func:`allows` parses exactly that and nothing more, so a
condition that leans on anything else (``matches``, ``contains``, ``in``) fails to parse here as it would fail to
save on IAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r'\s*(?:(?P<str>"[^"]*")|(?P<op>&&|\|\||==|!=|[().])|(?P<name>[A-Za-z_][A-Za-z_0-9]*))')
_METHODS = ("startsWith", "endsWith", "extract")


def _tokens(expression: str) -> list[str]:
    found, at = [], 0
    while at < len(expression.rstrip()):
        match = _TOKEN.match(expression, at)
        if match is None:
            raise ValueError(f"cannot parse the condition at {expression[at : at + 30]!r}")
        found.append(match.group(match.lastgroup or "op"))
        at = match.end()
    return found


def _extract(value: str, template: str) -> str:
    """IAM's ``extract``: the part of ``value`` where ``{…}`` stands in ``template``, or ""."""
    before, _, rest = template.partition("{")
    after = rest.partition("}")[2]
    start = value.find(before)
    if start < 0:
        return ""
    tail = value[start + len(before) :]
    if not after:
        return tail
    end = tail.find(after)
    return tail[:end] if end >= 0 else ""


@dataclass
class _Parser:
    tokens: list[str]
    resource: dict[str, str]
    at: int = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'more'} at token {self.at}, found {token!r}")
        self.at += 1
        return token

    def either(self) -> object:
        value = self.both()
        while self.peek() == "||":
            self.take()
            right = self.both()
            value = bool(value) or bool(right)
        return value

    def both(self) -> object:
        value = self.compared()
        while self.peek() == "&&":
            self.take()
            right = self.compared()
            value = bool(value) and bool(right)
        return value

    def compared(self) -> object:
        left = self.called()
        if self.peek() in ("==", "!="):
            op = self.take()
            right = self.called()
            return (left == right) if op == "==" else (left != right)
        return left

    def called(self) -> object:
        value = self.atom()
        while self.peek() == ".":
            self.take(".")
            method = self.take()
            if method not in _METHODS:
                raise ValueError(f"IAM conditions offer no {method}() on names")
            self.take("(")
            argument = self.atom()
            self.take(")")
            if not isinstance(value, str) or not isinstance(argument, str):
                raise ValueError(f"{method}() takes and applies to strings")
            if method == "extract":
                value = _extract(value, argument)
            else:
                value = value.startswith(argument) if method == "startsWith" else value.endswith(argument)
        return value

    def atom(self) -> object:
        token = self.take()
        if token == "(":
            value = self.either()
            self.take(")")
            return value
        if token.startswith('"'):
            return token[1:-1]
        if token == "resource":
            self.take(".")
            attribute = self.take()
            if attribute not in self.resource:
                raise ValueError(f"no attribute resource.{attribute}")
            return self.resource[attribute]
        raise ValueError(f"unexpected {token!r}")


def allows(expression: str, resource_type: str, resource_name: str) -> bool:
    """Whether a binding with this condition applies to the resource (``type``: ``compute.googleapis.com/Instance``,
    ``name``: its full resource name)."""
    parser = _Parser(_tokens(expression), {"type": resource_type, "name": resource_name})
    value = parser.either()
    if parser.peek() is not None:
        raise ValueError(f"unparsed rest: {parser.tokens[parser.at :]}")
    return bool(value)
