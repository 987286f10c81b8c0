"""When a run must stop early: SIGTERM, and the end of a SageMaker capacity block.

SageMaker stops a job (``StopTrainingJob``, a spot reclaim) with SIGTERM and kills it 120 s
later, so the flag is looked at between micro-batches, not once per optimizer step (which can
be 32-64 micro-batches, minutes on a large model). A job running on a training plan gets
``SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP``, the end of its current capacity
block as an epoch timestamp: its instances are terminated :data:`CAPACITY_BLOCK_TERMINATION_LEAD`
before the block ends, with no SIGTERM the trainer could wait for, so it stops by itself
:data:`CAPACITY_BLOCK_SAFETY_MARGIN` before that moment.

The timestamp's unit is not settled by what AWS publishes: the checkpointing example of AWS's
training-plan guide ("Training plans utilization for SageMaker training jobs",
https://docs.aws.amazon.com/sagemaker/latest/dg/training-plan-utilization-for-training-jobs.html)
has been published both reading it as epoch seconds and as milliseconds (the translated copies
of the page still carry ``timedelta(milliseconds=...)``), and open trainers that honour it read
it as seconds (verl's ``should_save_ckpt_esi``: ``datetime.fromtimestamp(int(value))``). Read in
the wrong unit, the deadline lands in 1970 (the job checkpoints after its first step and exits
0) or some 60,000 years ahead (the job never stops by itself). :func:`capacity_block` therefore
decides by magnitude, which is unambiguous: a value above :data:`MILLISECONDS_ABOVE` is
milliseconds (1e11 s is the year 5138; 1e11 ms is March 1973), anything else seconds. The
trainer prints the block's end, the unit it read and its own deadline when it starts, so a
wrong reading shows in the job's first log lines.

The final save of a stop has a deadline too (:meth:`StopFlag.save_deadline`): SageMaker kills the
job :data:`SIGTERM_GRACE_SECONDS` after its SIGTERM, and a capacity block's instances go at its
termination; :meth:`btk_trainer.checkpoint.Checkpointer.save_for_stop` skips a save its measured
duration says cannot finish by then, rather than start one the kill cuts short.

Every rank decides locally (its own signal, its own clock); :class:`StopAgreement` makes all
ranks act on the same micro-batch with MAX all-reduces on a CPU (gloo) group, so that on GPUs
the check does not wait for the queued CUDA work: a blocking one once per optimizer step and
non-blocking ones between micro-batches.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from btk.capacity import CAPACITY_STOP_MARGIN_SECONDS, CAPACITY_TERMINATION_LEAD_SECONDS
from btk.planner.stop_save import SAVE_EXIT_MARGIN_SECONDS, SIGTERM_GRACE_SECONDS

CAPACITY_BLOCK_ENV = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
# The rules live in btk.capacity: the planner's reservation pricing counts the same minutes.
CAPACITY_BLOCK_TERMINATION_LEAD = float(CAPACITY_TERMINATION_LEAD_SECONDS)
CAPACITY_BLOCK_SAFETY_MARGIN = float(CAPACITY_STOP_MARGIN_SECONDS)


# SIGTERM_GRACE_SECONDS: SageMaker's StopTrainingJob (and a spot reclaim) "sends the algorithm the SIGTERM signal,
# which delays job termination for 120 seconds" (SageMaker API reference, StopTrainingJob).
# SAVE_EXIT_MARGIN_SECONDS: left of a deadline after the final save (the log lines, the process group's teardown,
# torchrun's exit). Both live in btk.planner.stop_save, whose figure the plan prints.

#: An epoch timestamp above this is in milliseconds (1e11 seconds is the year 5138).
MILLISECONDS_ABOVE = 1e11
#: 9999-12-31T23:59:59Z: the last instant ``datetime`` can describe.
LAST_DATETIME_SECONDS = 253_402_300_799.0


class CapacityBlockValueError(ValueError):
    """The capacity block's timestamp is not an epoch time; the message is one line for the log."""


@dataclass(frozen=True)
class CapacityBlock:
    """The end of the job's current capacity block, as SageMaker announces it."""

    ends: float  # epoch seconds
    unit: str  # how the variable was written: "s" or "ms"

    @property
    def terminated(self) -> float:
        """When SageMaker starts terminating the block's instances (epoch seconds)."""
        return self.ends - CAPACITY_BLOCK_TERMINATION_LEAD

    @property
    def deadline(self) -> float:
        """By when the run must have stopped (epoch seconds): the termination less the safety margin."""
        return self.terminated - CAPACITY_BLOCK_SAFETY_MARGIN

    def line(self) -> str:
        return (f"btk: capacity block ends {describe_epoch(self.ends)} ({CAPACITY_BLOCK_ENV} read as epoch "
                f"{'milliseconds' if self.unit == 'ms' else 'seconds'}); its instances are terminated from "
                f"{describe_epoch(self.terminated)}, the run stops by {describe_epoch(self.deadline)}")


def capacity_block(env: Mapping[str, str]) -> CapacityBlock | None:
    """The job's capacity block from the environment; None without one; CapacityBlockValueError if unreadable."""
    raw = env.get(CAPACITY_BLOCK_ENV, "").strip()
    if not raw or raw == "0":  # AWS's own example treats "0" as "not set"
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise CapacityBlockValueError(f"{CAPACITY_BLOCK_ENV}={raw!r} is not an epoch timestamp")
    block = CapacityBlock(ends=value / 1000.0, unit="ms") if value > MILLISECONDS_ABOVE else CapacityBlock(value, "s")
    if block.ends > LAST_DATETIME_SECONDS:
        raise CapacityBlockValueError(f"{CAPACITY_BLOCK_ENV}={raw!r} is past the year 9999 in seconds and milliseconds")
    return block


def describe_epoch(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class StopReason:
    """Why this rank wants to stop: a SIGTERM, or the capacity block's deadline passed."""

    signalled: bool = False
    deadline_passed: bool = False

    @property
    def any(self) -> bool:
        return self.signalled or self.deadline_passed


class StopFlag:
    """SIGTERM sets the flag; a capacity-block deadline (epoch seconds) sets it when the clock passes it."""

    def __init__(self, deadline: float | None = None) -> None:
        self.signalled = False
        self.signalled_at: float | None = None  # epoch seconds of the first SIGTERM
        self.deadline = deadline
        self._previous: Any = None

    def __enter__(self) -> StopFlag:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.time()
        self.signalled = True

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def save_deadline(self) -> float | None:
        """By when (epoch seconds) this rank's final save must be done; None when nothing bounds it.

        After a SIGTERM: :data:`SIGTERM_GRACE_SECONDS` after it; on a capacity block: its
        termination; the earlier of the two, each less :data:`SAVE_EXIT_MARGIN_SECONDS`.
        """
        ends = []
        if self.signalled_at is not None:
            ends.append(self.signalled_at + SIGTERM_GRACE_SECONDS)
        if self.deadline is not None:
            ends.append(self.deadline + CAPACITY_BLOCK_SAFETY_MARGIN)  # the block's termination
        return min(ends) - SAVE_EXIT_MARGIN_SECONDS if ends else None

    def local(self) -> StopReason:
        passed = self.deadline is not None and time.time() >= self.deadline
        return StopReason(signalled=self.signalled, deadline_passed=passed)


class StopAgreement:
    """Whether any rank wants to stop, agreed by every rank at the same point; collective.

    Once per optimizer step (:meth:`agree`) the ranks wait for one MAX all-reduce of their
    flags. Between micro-batches (:meth:`poll`) nobody waits: each rank posts its flag as an
    asynchronous all-reduce and reads the one it posted at the previous poll, finished long
    since, so the training thread pays no round trip per micro-batch (128 ranks at 16 nodes
    would pay it up to 64 times a step) and a stop is seen one micro-batch later. Every rank
    posts and reads at the same points, so all see the same answer at the same micro-batch.
    Flags only ever turn on (a signal stays received, a deadline stays passed), so the latest
    agreement covers every earlier post.
    """

    def __init__(self, device: torch.device) -> None:
        # On GPUs a CPU-side gloo group: the check is a round trip between hosts, not a CUDA sync.
        self.group = dist.new_group(backend="gloo") if device.type == "cuda" else None
        self._posted: tuple[dist.Work, torch.Tensor] | None = None

    def _post(self, flag: StopFlag) -> tuple[dist.Work, torch.Tensor]:
        reason = flag.local()
        flags = torch.tensor([int(reason.signalled), int(reason.deadline_passed)])
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        assert work is not None  # async_op=True always returns the work
        return work, flags

    @staticmethod
    def _settle(posted: tuple[dist.Work, torch.Tensor]) -> StopReason:
        work, flags = posted
        work.wait()
        signalled, deadline_passed = flags.tolist()
        return StopReason(signalled=bool(signalled), deadline_passed=bool(deadline_passed))

    def poll(self, flag: StopFlag) -> StopReason:
        """Between micro-batches, without waiting: the ranks' agreement as of the previous poll."""
        previous, self._posted = self._posted, self._post(flag)
        return self._settle(previous) if previous is not None else StopReason()

    def agree(self, flag: StopFlag) -> StopReason:
        """Every rank's flag now (blocking: once per optimizer step)."""
        self.close()
        return self._settle(self._post(flag))

    def close(self) -> None:
        """Wait for a posted poll nobody read (the step ended first), so no collective is left in flight."""
        if self._posted is not None:
            self._settle(self._posted)
            self._posted = None
