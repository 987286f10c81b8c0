"""Failure classification, the --since window and the progress indicator."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from btk.errors import BtkError
from btk.report.classify import classify_failure, first_line
from btk.report.progress import Progress
from btk.report.window import parse_since

NOW = datetime(2025, 7, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "reason, cause",
    [
        (
            "CapacityError: Unable to provision requested ML compute capacity. "
            "Please retry using a different ML instance type.",
            "capacity",
        ),
        ("InsufficientCapacityError: We currently do not have sufficient p6-b200.48xlarge capacity", "capacity"),
        ("Training job stopped: MaxWaitTimeExceeded while waiting for spot capacity", "capacity"),
        ("AlgorithmError: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
        ("AlgorithmError: RuntimeError: CUDA error: out of memory", "out_of_memory"),
        ("AlgorithmError: process 3 was killed (OOM) by the kernel", "out_of_memory"),
        ("AlgorithmError: torch.distributed.DistBackendError: NCCL error in ProcessGroupNCCL.cpp", "nccl_efa"),
        ("AlgorithmError: [rank12]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", "nccl_efa"),
        ("AlgorithmError: libfabric:efa:ep_ctrl: fi_enable failed", "nccl_efa"),
        ("AlgorithmError: NET/OFI Request completed with error. Error: 12 (Cannot allocate memory)", "nccl_efa"),
        ("ClientError: Data download failed: NoSuchKey", "user_error"),
        ("ClientError: Please ensure the channel 'train' exists", "user_error"),
        ("AlgorithmError: ExecuteUserScriptError: KeyError: 'arch.num_layers'", "user_error"),
        ("AlgorithmError: ValueError: seq_len 131072 exceeds max_context", "user_error"),
        ("AlgorithmError: btk.errors.BtkError: invalid knobs: precision: Input should be 'bf16'", "user_error"),
        ("AlgorithmError: ModuleNotFoundError: No module named 'flash_attn'", "user_error"),
        ("InternalServerError: We encountered an internal error. Please try again.", "other"),
        ("AlgorithmError: Segmentation fault (core dumped)", "other"),
        ("", "other"),
        (None, "other"),
    ],
)
def test_failure_causes(reason: str | None, cause: str) -> None:
    assert classify_failure(reason) == cause


def test_order_decides_between_causes() -> None:
    # An NCCL error caused by an OOM is an OOM; a capacity error mentioning NCCL is capacity.
    assert classify_failure("NCCL error: ncclUnhandledCudaError: CUDA out of memory") == "out_of_memory"
    assert classify_failure("CapacityError: insufficient capacity for EFA-enabled instances") == "capacity"
    # "room" is not "OOM"
    assert classify_failure("AlgorithmError: no room left on device") == "other"


def test_first_line_shortens() -> None:
    assert first_line("\n  first  \nsecond") == "first"
    assert first_line("x" * 400, limit=10) == "x" * 9 + "…"
    assert first_line(None) is None and first_line("") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("30d", NOW - timedelta(days=30)),
        ("12h", NOW - timedelta(hours=12)),
        ("2w", NOW - timedelta(weeks=2)),
        (" 7D ", NOW - timedelta(days=7)),
        ("2025-06-01", datetime(2025, 6, 1, tzinfo=UTC)),
        ("2025-06-01T08:30:00+02:00", datetime(2025, 6, 1, 6, 30, tzinfo=UTC)),
    ],
)
def test_since(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("abc", "--since 'abc' is not a duration or a date: use e.g. 30d, 12h, 2w or 2025-06-01"),
        ("30m", "--since '30m' is not a duration or a date: use e.g. 30d, 12h, 2w or 2025-06-01"),
        ("0d", "--since '0d' is an empty window: use a positive duration like 30d"),
        ("2030-01-01", "--since '2030-01-01' is in the future: give a date before now"),
    ],
)
def test_bad_since(text: str, message: str) -> None:
    with pytest.raises(BtkError) as caught:
        parse_since(text, NOW)
    assert str(caught.value) == message


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_redraws_one_line() -> None:
    stream = Terminal()
    progress = Progress(4, "describing", stream=stream, width=4)
    for _ in range(4):
        progress.advance()
    assert stream.getvalue() == (
        "\rdescribing [#---] 1/4\rdescribing [##--] 2/4\rdescribing [###-] 3/4\rdescribing [####] 4/4\n"
    )


def test_progress_in_a_log_prints_a_counter_for_long_histories_only() -> None:
    long, short = io.StringIO(), io.StringIO()
    progress = Progress(120, "describing training jobs", stream=long, every=50)
    for _ in range(120):
        progress.advance()
    assert long.getvalue().splitlines() == [
        "btk report: describing training jobs 50/120",
        "btk report: describing training jobs 100/120",
        "btk report: describing training jobs 120/120",
    ]
    small = Progress(10, "describing", stream=short, every=50)
    for _ in range(10):
        small.advance()
    assert short.getvalue() == ""
