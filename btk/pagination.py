"""Reading AWS answers safely: bounded pagination, and answers checked against their documented shape.

An AWS list call returns a page and, while more remain, a token for the next one. A service
(or a proxy, or a stub) that answers with a token it already gave, or with pages that never
run out, would keep a plain ``while token:`` loop going forever: ``btk`` would hang, a Lambda
would run to its timeout. :func:`paginate` follows the tokens but stops at the first token seen
before, a token that is not text, a page that is not an object, a page whose items are not a
list, or more than ``max_pages`` pages, and raises one line naming the operation and what went
wrong. Nothing is returned from a loop cut short: a partial list would read as the whole one.

An answer outside its API's documented shape (a required member missing, a null, a list where
an object belongs, text where a number belongs, a number beyond its range) would otherwise surface
far from the call as a KeyError or TypeError. :func:`check_answer` holds each answer to botocore's
service model, the machine-readable form of the API reference, and raises one line naming the
operation and the first member that differs; callers then read required members directly and
optional ones with a default.

Standard library only at import (botocore is imported inside the functions that read its model),
importing no other ``btk`` module, so the training-plan Lambda bundles it beside ``btk/capacity/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any

MAX_PAGES = 1000
"""Pages one listing may take. SageMaker's list calls return up to 100 items a page
(``MaxResults``, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ListTrainingPlans.html),
so this is 100,000 items: far beyond what one environment's listings hold, while a looping
answer is stopped after at most this many calls."""


class PaginationError(Exception):
    """An AWS listing that did not end (a repeated or malformed token, too many pages), or an answer
    outside its documented shape."""


def paginate(
    fetch: Callable[[str | None], Mapping[str, Any]],
    *,
    operation: str,
    result_key: str,
    token_key: str = "NextToken",
    max_pages: int = MAX_PAGES,
    error: Callable[[str], Exception] = PaginationError,
) -> Iterator[Any]:
    """Every item under ``result_key`` across the pages ``fetch`` returns, at most ``max_pages`` of them.

    Args:
        fetch: makes one call: given ``None`` for the first page, then each page's token.
        operation: the call's name in the error line (``sagemaker:ListTrainingPlans``).
        result_key: the key of each page's list of items; a page without it (or with null) has none.
        token_key: the key of the next page's token (``NextToken``; ``nextToken`` for ECR).
        max_pages: more pages than this is an error.
        error: builds the exception raised with the one-line message (the caller's own error
            type); :class:`PaginationError` by default.

    Raises:
        whatever ``error`` builds: a token seen before, a token that is not a string, a page
        that is not an object, items that are not a list, or more than ``max_pages`` pages.
    """
    if max_pages < 1:
        raise ValueError("max_pages must be at least 1")
    seen: set[str] = set()
    token: str | None = None
    for page_number in range(1, max_pages + 1):
        page = fetch(token)
        if not isinstance(page, Mapping):
            raise error(f"{operation} answered page {page_number} with {type(page).__name__}, not an object")
        items = page.get(result_key)
        if items is not None and not isinstance(items, list):
            raise error(f"{operation} answered page {page_number} with {result_key} of type {type(items).__name__}")
        yield from items or ()
        following = page.get(token_key)
        if following is None or following == "":
            return
        if not isinstance(following, str):
            raise error(f"{operation} answered page {page_number} with a {token_key} that is not text")
        if following in seen:
            raise error(
                f"{operation} repeated a page token after {page_number} pages (the listing would never end); "
                "retry later"
            )
        seen.add(following)
        token = following
    raise error(f"{operation} gave more than {max_pages} pages (the listing would never end); retry later")


INTEGER_BITS = {"integer": 32, "long": 64}
"""Bits of the model's whole-number types (Smithy's ``integer`` and ``long``,
https://smithy.io/2.0/spec/simple-types.html): a number beyond them is no answer the API gives."""


def output_shape(client: Any, service: str, operation: str) -> Any:
    """The documented output shape of ``operation`` (``ListTrainingPlans``), a botocore ``Shape``.

    From the client's own service model when ``client`` is a botocore client; otherwise (a stand-in)
    from botocore's model of ``service``, read offline once per process.
    """
    from botocore.client import BaseClient

    model = client.meta.service_model if isinstance(client, BaseClient) else _service_model(service)
    return model.operation_model(operation).output_shape


def method_output_shape(client: Any, service: str, method: str) -> Any:
    """:func:`output_shape` of a boto3 method name (``list_aws_default_service_quotas``): the model's own
    operation of that name, as botocore maps them (``ListAWSDefaultServiceQuotas``)."""
    from botocore import xform_name

    model = _service_model(service)
    names = {xform_name(name): name for name in model.operation_names}
    if method not in names:
        raise KeyError(f"{service} has no operation {method}")
    return output_shape(client, service, names[method])


@cache
def _service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def check_answer(
    answer: Any, shape: Any, *, operation: str, error: Callable[[str], Exception] = PaginationError
) -> Any:
    """``answer`` itself when it has the documented ``shape``; otherwise raise one line naming what differs.

    The documented shape is botocore's service model, read as botocore's own parser delivers an
    answer: an object for a structure (members the model does not name are ignored), every required
    member present, no member null (the parser drops JSON nulls), a list for a list, text for a
    string, a whole number within the model's range and its type's bits for an integer, a finite
    number for a float, a datetime with its time zone for a timestamp.

    Raises:
        whatever ``error`` builds, with ``operation`` and the first member outside the shape.
    """
    problem = shape_problem(answer, shape)
    if problem is not None:
        raise error(f"{operation} answered outside its documented shape: {problem}")
    return answer


def shape_problem(value: Any, shape: Any, path: str = "") -> str | None:
    """What makes ``value`` differ from ``shape`` (a botocore ``Shape``), with its path; None when nothing does."""
    where = path or "the answer"
    if value is None:
        return f"{where} is null"
    kind = shape.type_name
    if kind == "structure":
        return _structure_problem(value, shape, path)
    if kind == "list":
        if not isinstance(value, list):
            return f"{where} is {_described(value)}, not a list"
        for index, item in enumerate(value):
            if (problem := shape_problem(item, shape.member, f"{path}[{index}]")) is not None:
                return problem
        return None
    if kind == "map":
        if not isinstance(value, Mapping):
            return f"{where} is {_described(value)}, not an object"
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has a key that is not text"
            if (problem := shape_problem(item, shape.value, f"{path}[{key!r}]")) is not None:
                return problem
        return None
    return _scalar_problem(value, kind, shape.metadata, where)


def _structure_problem(value: Any, shape: Any, path: str) -> str | None:
    where = path or "the answer"
    if not isinstance(value, Mapping):
        return f"{where} is {_described(value)}, not an object"
    prefix = f"{path}." if path else ""
    for name in shape.required_members:
        if name not in value:
            return f"{prefix}{name} is missing"
    for name, member in shape.members.items():
        if name in value and (problem := shape_problem(value[name], member, prefix + name)) is not None:
            return problem
    return None


def _scalar_problem(value: Any, kind: str, metadata: Mapping[str, Any], where: str) -> str | None:
    if kind == "string":
        return None if isinstance(value, str) else f"{where} is {_described(value)}, not text"
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{where} is {_described(value)}, not a boolean"
    if kind == "timestamp":
        return _timestamp_problem(value, where)
    if kind == "blob":
        return None if isinstance(value, bytes | bytearray) else f"{where} is {_described(value)}, not bytes"
    if kind in INTEGER_BITS:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{where} is {_described(value)}, not a whole number"
        bound = 2 ** (INTEGER_BITS[kind] - 1)
        if not -bound <= value < bound:
            return f"{where} {value} is beyond a {INTEGER_BITS[kind]}-bit {kind}"
        return _range_problem(value, metadata, where)
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{where} is {_described(value)}, not a number"
        if not math.isfinite(value):
            return f"{where} is {value}, not a finite number"
        return _range_problem(value, metadata, where)
    return None


def _range_problem(value: float, metadata: Mapping[str, Any], where: str) -> str | None:
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and value < low:
        return f"{where} {value} is below its documented minimum {low}"
    if high is not None and value > high:
        return f"{where} {value} is above its documented maximum {high}"
    return None


def _timestamp_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, datetime):
        return f"{where} is {_described(value)}, not a time"
    if value.utcoffset() is None:
        return f"{where} is a time without a time zone"
    try:
        value.astimezone(UTC)
    except OverflowError:
        return f"{where} is a time outside years 1 to 9999 in UTC"
    return None


def _described(value: Any) -> str:
    """A value's kind in an error line (never the value itself: it may be long or hold line breaks)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "text"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__
