"""Reading a training plan's capacity block end: either unit SageMaker may write, never a 1970 deadline."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from btk_trainer.stopping import (
    CAPACITY_BLOCK_ENV,
    CAPACITY_BLOCK_SAFETY_MARGIN,
    CAPACITY_BLOCK_TERMINATION_LEAD,
    MILLISECONDS_ABOVE,
    CapacityBlockValueError,
    capacity_block,
)
from hypothesis import given
from hypothesis import strategies as st

# 2026-12-01T12:00:00Z, and the same instant in milliseconds.
NOON = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()


def _block(value: str) -> object:
    return capacity_block({CAPACITY_BLOCK_ENV: value})


@pytest.mark.parametrize("value", [f"{NOON:.0f}", f"{NOON * 1000:.0f}", f"{NOON:.3f}", f" {NOON * 1000:.0f}\n"])
def test_seconds_and_milliseconds_give_the_same_end(value: str) -> None:
    block = capacity_block({CAPACITY_BLOCK_ENV: value})
    assert block is not None and block.ends == pytest.approx(NOON)
    assert block.deadline == pytest.approx(NOON - CAPACITY_BLOCK_TERMINATION_LEAD - CAPACITY_BLOCK_SAFETY_MARGIN)
    assert CAPACITY_BLOCK_SAFETY_MARGIN > 0 and CAPACITY_BLOCK_TERMINATION_LEAD == 30 * 60  # AWS: 30 min before the end


def test_the_log_line_says_the_unit_it_read_and_the_deadline() -> None:
    seconds, millis = capacity_block({CAPACITY_BLOCK_ENV: f"{NOON:.0f}"}), _block(f"{NOON * 1000:.0f}")
    assert seconds is not None and "read as epoch seconds" in seconds.line()
    assert "2026-12-01T12:00:00Z" in seconds.line() and "the run stops by 2026-12-01T11:15:00Z" in seconds.line()
    assert "read as epoch milliseconds" in millis.line()  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["", "0", "  "])
def test_no_block(value: str) -> None:
    assert capacity_block({CAPACITY_BLOCK_ENV: value}) is None
    assert capacity_block({}) is None


@pytest.mark.parametrize("value", ["soon", "nan", "inf", "-1700000000", "1e400", "1e30", "0x10", "-0.0"])
def test_unreadable_values_are_one_line_errors(value: str) -> None:
    with pytest.raises(CapacityBlockValueError) as error:
        capacity_block({CAPACITY_BLOCK_ENV: value})
    assert "\n" not in str(error.value) and CAPACITY_BLOCK_ENV in str(error.value)


@given(st.datetimes(min_value=datetime(1974, 1, 1), max_value=datetime(5000, 1, 1), timezones=st.just(UTC)))
def test_any_instant_from_1974_to_5000_reads_the_same_in_either_unit(instant: datetime) -> None:
    epoch = instant.timestamp()
    seconds = capacity_block({CAPACITY_BLOCK_ENV: repr(epoch)})
    millis = capacity_block({CAPACITY_BLOCK_ENV: repr(epoch * 1000)})
    assert seconds is not None and millis is not None
    assert seconds.ends == pytest.approx(epoch) and millis.ends == pytest.approx(epoch)
    assert epoch < MILLISECONDS_ABOVE < epoch * 1000


@given(st.text(max_size=30))
def test_any_text_is_a_block_none_or_one_line(text: str) -> None:
    try:
        block = capacity_block({CAPACITY_BLOCK_ENV: text})
    except CapacityBlockValueError as error:
        assert "\n" not in str(error)
    else:
        assert block is None or block.line().startswith("btk: capacity block ends ")


def _agreement_rank(rank: int, port: int, answers: dict[int, list[tuple[str, bool]]]) -> None:
    """Rank 0 is signalled just before its 4th poll; both ranks record every answer they get."""
    import os

    import torch
    import torch.distributed as dist
    from btk_trainer.stopping import StopAgreement, StopFlag

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    agreement, flag, seen = StopAgreement(torch.device("cpu")), StopFlag(), []
    for step in range(2):
        for poll in range(1, 6):
            if rank == 0 and (step, poll) == (1, 3):
                flag.signalled = True
            seen.append(("poll", agreement.poll(flag).any))
        seen.append(("agree", agreement.agree(flag).any))
    agreement.close()
    answers[rank] = seen
    dist.barrier()
    dist.destroy_process_group()


def test_ranks_see_a_stop_at_the_same_poll_one_micro_batch_later_and_at_the_step_end() -> None:
    """Between micro-batches nobody waits for the round trip: a stop posted at one poll is read at the next."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    answers = mp.Manager().dict()
    mp.start_processes(_agreement_rank, args=(port, answers), nprocs=2, start_method="spawn")
    assert answers[0] == answers[1]
    quiet = [("poll", False)] * 5 + [("agree", False)]
    assert answers[0] == quiet + [("poll", False)] * 3 + [("poll", True), ("poll", True), ("agree", True)]
