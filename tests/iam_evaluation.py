"""Evaluate IAM identity policies offline, as AWS's policy evaluation logic describes.

https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html

A request is allowed when some identity-policy statement allows it, no statement denies it,
and, when the principal has a permissions boundary, the boundary allows it too. A statement
applies when its ``Action``/``NotAction`` matches the action (case-insensitive, ``*`` and ``?``),
its ``Resource``/``NotResource`` matches the resource ARN (case-sensitive) and every condition
holds for the request context. Condition operators outside :data:`OPERATORS` raise, so an
unknown condition can never be read as met or unmet by accident. Context keys are
case-insensitive; a key absent from the context fails every operator but the ``IfExists``
forms and ``Null``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM's ``*`` (any run, ``:`` and ``/`` included) and ``?`` (one character); nothing else is special."""
    return _wildcard_regex(pattern, case_sensitive).fullmatch(value) is not None


@functools.cache  # a policy's few patterns are matched against every action and resource probed
def _wildcard_regex(pattern: str, case_sensitive: bool) -> re.Pattern[str]:
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile(regex, 0 if case_sensitive else re.IGNORECASE)


def _string_like(expected: str, actual: str) -> bool:
    return wildcard_match(expected, actual)


OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda expected, actual: expected == actual,
    "StringNotEquals": lambda expected, actual: expected != actual,
    "StringEqualsIgnoreCase": lambda expected, actual: expected.lower() == actual.lower(),
    "StringLike": _string_like,
    "StringNotLike": lambda expected, actual: not _string_like(expected, actual),
    "ArnEquals": _string_like,
    "ArnLike": _string_like,
    "ArnNotEquals": lambda expected, actual: not _string_like(expected, actual),
    "ArnNotLike": lambda expected, actual: not _string_like(expected, actual),
    "Bool": lambda expected, actual: str(expected).lower() == str(actual).lower(),
}
_NEGATED = {"StringNotEquals", "StringNotLike", "ArnNotEquals", "ArnNotLike"}


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, Any]) -> bool:
    values = {k.lower(): v for k, v in context.items()}
    if operator == "Null":
        return (key.lower() not in values) == (str(expected).lower() == "true")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    qualifier, _, base = base.rpartition(":")
    if base not in OPERATORS:
        raise ValueError(f"condition operator {operator} is not evaluated here")
    if key.lower() not in values:
        return if_exists
    actual = [str(v) for v in _as_list(values[key.lower()])]
    expected_values = [str(v) for v in _as_list(expected)]
    test = OPERATORS[base]
    if base in _NEGATED:  # every expected value must fail to match (AWS: "not any")
        matches = [all(test(e, a) for e in expected_values) for a in actual]
    else:
        matches = [any(test(e, a) for e in expected_values) for a in actual]
    return all(matches) if qualifier == "ForAllValues" else any(matches)


def _applies(statement: Mapping[str, Any], action: str, resource: str, context: Mapping[str, Any]) -> bool:
    if "Action" in statement:
        if not any(wildcard_match(p, action, case_sensitive=False) for p in _as_list(statement["Action"])):
            return False
    elif any(wildcard_match(p, action, case_sensitive=False) for p in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement:
        if not any(wildcard_match(p, resource) for p in _as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement and any(wildcard_match(p, resource) for p in _as_list(statement["NotResource"])):
        return False
    for operator, entries in (statement.get("Condition") or {}).items():
        for key, expected in entries.items():
            if not _condition_holds(operator, key, expected, context):
                return False
    return True


@dataclass(frozen=True)
class Principal:
    """A role's identity-policy statements (inline and managed, already resolved) and its boundary.

    :param statements: every statement of every policy attached to the role.
    :param boundary: the statements of its permissions boundary; None when it has none.
    """

    statements: Sequence[Mapping[str, Any]]
    boundary: Sequence[Mapping[str, Any]] | None = None
    name: str = ""

    def allows(self, action: str, resource: str, context: Mapping[str, Any] | None = None) -> bool:
        """True when AWS would allow ``action`` on ``resource`` for this role (same account)."""
        context = context or {}
        if not _decide(self.statements, action, resource, context):
            return False
        return self.boundary is None or _decide(self.boundary, action, resource, context)


def _decide(statements: Iterable[Mapping[str, Any]], action: str, resource: str, context: Mapping[str, Any]) -> bool:
    allowed = False
    for statement in statements:
        if _applies(statement, action, resource, context):
            if statement["Effect"] == "Deny":
                return False
            allowed = True
    return allowed


@functools.cache  # pure, and asked again for every role and probe of an isolation check
def globs_intersect(first: str, second: str) -> bool:
    """Whether some string matches both IAM patterns (``*`` any run, ``?`` one character)."""

    @functools.cache
    def meet(i: int, j: int) -> bool:
        a = first[i] if i < len(first) else None
        b = second[j] if j < len(second) else None
        if a is None and b is None:
            return True
        if a == "*":
            return meet(i + 1, j) or (b is not None and meet(i, j + 1))
        if b == "*":
            return meet(i, j + 1) or (a is not None and meet(i + 1, j))
        if a is None or b is None:
            return False
        return (a == b or a == "?" or b == "?") and meet(i + 1, j + 1)

    return meet(0, 0)


@functools.cache
def glob_overlaps(pattern: str, arn_template: str) -> bool:
    """Whether an IAM resource pattern can name a resource of the type whose ARN is ``arn_template``.

    ``arn_template`` is the Service Authorization Reference's format, ``${Name}`` for each part
    (e.g. ``arn:${Partition}:sagemaker:${Region}:${Account}:training-plan/${TrainingPlanName}``);
    each part stands for any text.
    """
    template = re.sub(r"\$\{[^}]+\}", "*", arn_template)
    # arn:partition:service:region:account:resource — a wildcard in one of the first five fields
    # never spans a colon in an ARN of that type; the resource part may hold colons and slashes.
    pattern_fields, template_fields = pattern.split(":", 5), template.split(":", 5)
    if len(pattern_fields) < 6:
        return len(pattern_fields) == 1 and globs_intersect(pattern, template)
    return all(globs_intersect(a, b) for a, b in zip(pattern_fields, template_fields, strict=True))
