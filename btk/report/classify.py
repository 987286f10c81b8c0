"""Failure causes from SageMaker's ``FailureReason`` text.

SageMaker prefixes the reason with an error class (``CapacityError:``, ``ClientError:``,
``AlgorithmError:``, ``InternalServerError:``) and, for ``AlgorithmError``, appends the
tail of the container's stderr. The rules below are checked in order; the first match
wins, so an ``AlgorithmError`` whose traceback ends in ``torch.OutOfMemoryError`` is an
out-of-memory failure, not a user error.
"""

from __future__ import annotations

import re

from btk.report.schema import FailureCause

_RULES: tuple[tuple[FailureCause, re.Pattern[str]], ...] = (
    (
        "capacity",
        re.compile(
            r"CapacityError|InsufficientCapacity|insufficient capacity|"
            r"unable to provision requested ML compute capacity|capacity is not available|"
            r"MaxWaitTimeExceeded|training plan .*(expired|capacity)",
            re.IGNORECASE,
        ),
    ),
    (
        "out_of_memory",
        re.compile(r"out of memory|OutOfMemoryError|\bOOM\b|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE),
    ),
    (
        "nccl_efa",
        re.compile(
            r"\bNCCL|\bEFA\b|libfabric|\bOFI\b|aws-ofi|\bfi_[a-z_]+|DistBackendError|"
            r"collective operation timeout|ProcessGroupNCCL|rdma",
            re.IGNORECASE,
        ),
    ),
    (
        "user_error",
        re.compile(
            r"^ClientError|ValidationException|\b(ValueError|KeyError|TypeError|AttributeError|NameError|"
            r"IndexError|AssertionError|FileNotFoundError|ModuleNotFoundError|ImportError|SyntaxError|"
            r"NotImplementedError|BtkError)\b|invalid (knobs|hyperparameters)|No such file or directory",
        ),
    ),
)


def classify_failure(reason: str | None) -> FailureCause:
    """The cause of a failed job from its ``FailureReason`` (``other`` when nothing matches)."""
    text = (reason or "").strip()
    for cause, pattern in _RULES:
        if pattern.search(text):
            return cause
    return "other"


def first_line(reason: str | None, limit: int = 300) -> str | None:
    """The failure reason shortened for a report cell: first non-empty line, at most ``limit`` chars."""
    if not reason:
        return None
    line = next((part.strip() for part in reason.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"
