"""AWS answers generated from botocore's service models, inside their documented shape or corrupted out of it.

:func:`answers` walks an operation's output shape in botocore's model of its service (SageMaker unless
said otherwise; the machine-readable API reference) and builds a value of that shape: every required
member, optional scalar members at random (up to three of them), optional nested members when they
are among the members ``btk`` reads (:data:`NESTED`), each value drawn within the model's type and
documented range. A caller's ``hints`` give the values of named members (an instance type, a fee, a
window, a quota's name), so that a generated answer can match the request or differ from it in a known
field, or lead the code down the path that reads deeper.

A generated answer is then, at random, corrupted at one node, which takes it outside the documented
shape in a way known without asking the code under test: the node made null, a required member
deleted, a value of another type (text for a number, a number for text, an object for a list, a
time without a zone, NaN), or a number beyond its documented range or its type's bits. The
:class:`Generated` value says which, so a test knows what to expect: a corrupted answer must end
in one line naming the operation; an answer inside the shape must never be called outside it.

Test machinery only: the shape rules here are written from botocore's model and Smithy's type
definitions (https://smithy.io/2.0/spec/simple-types.html), not from ``btk.pagination``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from typing import Any

import botocore.session
from hypothesis import strategies as st

#: Nested members (structures, lists, maps) the generator fills when optional: those ``btk`` reads.
#: Every other optional nested member is left out; required ones are always built.
NESTED = frozenset(
    {
        "TrainingPlanOfferings", "ReservedCapacityOfferings", "TargetResources", "TrainingPlanSummaries",
        "ReservedCapacitySummaries", "PipelineExecutionSummaries", "PipelineExecutionSteps", "Metadata",
        "TrainingJob", "Results", "Tags", "HyperParameters", "ResourceConfig", "InstanceGroups",
        "SecondaryStatusTransitions", "FinalMetricDataList", "CheckpointConfig",
        # btk doctor's reads (FSx, Service Quotas, SSM, CloudFormation, ECR, SNS, STS)
        "FileSystems", "LustreConfiguration", "Quotas", "Parameter", "Stacks", "Outputs", "imageDetails",
        "Subscriptions", "Credentials",
    }
)  # fmt: skip
#: Bits of Smithy's whole-number types (https://smithy.io/2.0/spec/simple-types.html).
BITS = {"integer": 32, "long": 64}
#: The deepest level the generator descends to; deeper nested members are left out (or empty).
MAX_DEPTH = 6
#: Texts a string member is often given: empty, blank, a line break, non-ASCII, long, ARN- and number-like.
TEXTS = ("", " ", "x", "a\nb", "ü-名", "x" * 300, "arn:aws:sagemaker:us-east-1:123456789012:thing/x", "12", "null")


@cache
def model(service: str = "sagemaker") -> Any:
    """botocore's model of ``service`` (a boto3 service name), read offline once."""
    return botocore.session.get_session().get_service_model(service)


def api_name(operation: str, service: str = "sagemaker") -> str:
    """The model's name of a boto3 method: ``list_training_plans`` → ``ListTrainingPlans``,
    ``list_aws_default_service_quotas`` → ``ListAWSDefaultServiceQuotas``."""
    names = {botocore.xform_name(name): name for name in model(service).operation_names}
    return names[operation]


def output_shape(operation: str, service: str = "sagemaker") -> Any:
    return model(service).operation_model(api_name(operation, service)).output_shape


@dataclass(frozen=True)
class Generated:
    """One generated answer and, when it was corrupted out of the documented shape, how."""

    value: Any
    corruption: str | None = None
    kind: str | None = None
    """Which of :data:`CORRUPTIONS` made ``corruption`` (a wrong value may itself be ``None``)."""

    @property
    def outside(self) -> bool:
        return self.corruption is not None


Hints = Mapping[str, st.SearchStrategy[Any]]


def valid(shape: Any, hints: Hints, name: str = "", depth: int = 0) -> st.SearchStrategy[Any]:
    """A value of ``shape`` (a botocore Shape) inside its documented shape; ``hints`` by member name first."""
    if name in hints:
        return hints[name]
    kind = shape.type_name
    if kind == "structure":
        return _structure(shape, hints, depth)
    if kind == "list":
        size = 3 if depth < MAX_DEPTH else 0
        return st.lists(valid(shape.member, hints, f"{name}[]", depth + 1), max_size=size)
    if kind == "map":
        size = 3 if depth < MAX_DEPTH else 0
        return st.dictionaries(st.text(max_size=8), valid(shape.value, hints, f"{name}{{}}", depth + 1), max_size=size)
    return scalar(shape)


def scalar(shape: Any) -> st.SearchStrategy[Any]:
    kind, metadata = shape.type_name, shape.metadata
    if kind == "string":
        text = st.sampled_from(TEXTS) | st.text(max_size=6)
        return st.one_of(st.sampled_from(shape.enum), text) if shape.enum else text
    if kind in BITS:
        bound = 2 ** (BITS[kind] - 1)
        low, high = metadata.get("min", -bound), metadata.get("max", bound - 1)
        return st.one_of(st.integers(low, min(high, low + 10)), st.integers(low, high))
    if kind in ("float", "double"):
        return st.floats(
            min_value=metadata.get("min"), max_value=metadata.get("max"), allow_nan=False, allow_infinity=False
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "timestamp":
        zones = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])
        return st.datetimes(datetime(2015, 1, 1), datetime(2045, 1, 1), timezones=zones)
    if kind == "blob":
        return st.binary(max_size=8)
    raise AssertionError(f"shape type {kind} is not generated")  # pragma: no cover


def _structure(shape: Any, hints: Hints, depth: int) -> st.SearchStrategy[dict[str, Any]]:
    required = set(shape.required_members)
    others = [
        name
        for name, member in shape.members.items()
        if name not in required
        and name not in hints
        and (member.type_name not in ("structure", "list", "map") or (name in NESTED and depth < MAX_DEPTH))
    ]
    extra = st.sets(st.sampled_from(others), max_size=3) if others else st.just(set())

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        chosen = draw(extra)
        value: dict[str, Any] = {}
        for name, member in shape.members.items():
            if name in hints and name not in required:  # a member the caller cares about: usually there
                present = draw(st.integers(0, 19)) > 0
            else:
                present = name in required or name in chosen
            if present:
                value[name] = draw(valid(member, hints, name, depth + 1))
        return value

    return build()


def nodes(value: Any, shape: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any, Any]]:
    """Every (path, value, shape) in ``value``, the root first."""
    yield path, value, shape
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                yield from nodes(value[name], member, (*path, name))
    elif kind == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            yield from nodes(item, shape.member, (*path, index))
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from nodes(item, shape.value, (*path, key))


def wrong_values(shape: Any) -> list[Any]:
    """Values of another type than ``shape``'s, or beyond its range: each outside the documented shape."""
    kind, metadata = shape.type_name, shape.metadata
    if kind == "structure":
        return ["text", [], 7]
    if kind == "list":
        return ["text", {}, 7, ("tuple",)]
    if kind == "map":
        return [[], "text", 7]
    if kind == "string":
        return [7, 1.5, True, [], {"a": 1}, b"bytes"]
    if kind in BITS:
        beyond = [2 ** (BITS[kind] - 1), -(2 ** (BITS[kind] - 1)) - 1]
        if "min" in metadata:
            beyond.append(metadata["min"] - 1)
        if "max" in metadata:
            beyond.append(metadata["max"] + 1)
        return ["7", 1.5, True, float("nan"), *beyond]
    if kind in ("float", "double"):
        beyond = [metadata["min"] - 1.0] if "min" in metadata else []
        return ["1.5", True, float("nan"), float("inf"), float("-inf"), *beyond]
    if kind == "boolean":
        return ["true", 1, 0, None]
    if kind == "timestamp":
        return ["2031-01-06T00:00:00Z", 1925164800, datetime(2031, 1, 6), datetime(2031, 1, 6).date()]
    return ["text", 7]


#: The ways :func:`corrupted` takes an answer outside its shape.
CORRUPTIONS = ("null", "wrong", "missing")


@st.composite
def corrupted(draw: st.DrawFn, value: Any, shape: Any, kind: str | None = None) -> Generated:
    """``value`` with one node taken outside ``shape``: null, a required member deleted, or a wrong value
    (``kind``, one of :data:`CORRUPTIONS`, forces one way; a node with no required member present is
    nulled where ``missing`` is forced)."""
    path, node, node_shape = draw(st.sampled_from(list(nodes(value, shape))))
    missing = [name for name in node_shape.required_members if isinstance(node, dict) and name in node] if (
        node_shape.type_name == "structure"
    ) else []  # fmt: skip
    if kind == "missing" and not missing:
        structures = [(p, n, s) for p, n, s in nodes(value, shape) if s.type_name == "structure" and isinstance(n, dict)
                      and any(name in n for name in s.required_members)]  # fmt: skip
        if structures:
            path, node, node_shape = draw(st.sampled_from(structures))
            missing = [name for name in node_shape.required_members if name in node]
    allowed = ["null", "wrong", "missing"] if missing else ["null", "wrong"]
    how = draw(st.sampled_from([kind] if kind in allowed else allowed))
    where = ".".join(map(str, path)) or "the answer"
    if how == "missing":
        name = draw(st.sampled_from(missing))
        return Generated(_without(value, (*path, name)), f"required {where}.{name} deleted", how)
    replacement = None if how == "null" else draw(st.sampled_from(wrong_values(node_shape)))
    return Generated(_replaced(value, path, replacement), f"{where} set to {replacement!r}", how)


def _replaced(value: Any, path: tuple[Any, ...], replacement: Any) -> Any:
    if not path:
        return replacement
    copied = copy.deepcopy(value)
    parent = copied
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = replacement
    return copied


def _without(value: Any, path: tuple[Any, ...]) -> Any:
    copied = copy.deepcopy(value)
    parent = copied
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return copied


def answers(
    operation: str, hints: Hints | None = None, corrupt: int = 4, always: str | None = None,
    service: str = "sagemaker",
) -> st.SearchStrategy[Generated]:
    """Answers of ``operation`` (a boto3 method name of ``service``): inside the shape, or (one in ``corrupt``)
    outside it; ``corrupt`` 0 never corrupts; ``always`` (one of :data:`CORRUPTIONS`) corrupts every answer
    that way."""
    shape = output_shape(operation, service)

    @st.composite
    def build(draw: st.DrawFn) -> Generated:
        value = draw(valid(shape, hints or {}))
        if always is not None:
            return draw(corrupted(value, shape, always))
        if corrupt > 0 and draw(st.sampled_from([False] * (corrupt - 1) + [True])):  # simplest: not corrupted
            return draw(corrupted(value, shape))
        return Generated(value)

    return build()
