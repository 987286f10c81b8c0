"""When a run must stop early: SIGTERM, and the end of a SageMaker capacity block.

SageMaker stops a job (``StopTrainingJob``, a spot reclaim) with SIGTERM and kills it 120 s
later, so the flag is looked at between micro-batches, not once per optimizer step (which can
be 32-64 micro-batches, minutes on a large model). A job running on a training plan gets
``SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP`` (epoch milliseconds): its
instances are terminated :data:`CAPACITY_BLOCK_TERMINATION_LEAD` before the block ends, with
no SIGTERM the trainer could wait for, so it stops by itself :data:`CAPACITY_BLOCK_SAFETY_MARGIN`
before that moment.

Every rank decides locally (its own signal, its own clock); :class:`StopAgreement` makes all
ranks act on the same micro-batch with one MAX all-reduce, on a CPU (gloo) group so that on
GPUs the check does not wait for the queued CUDA work.
"""

from __future__ import annotations

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

CAPACITY_BLOCK_ENV = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
# The rules live in btk.capacity: the planner's reservation pricing counts the same minutes.
CAPACITY_BLOCK_TERMINATION_LEAD = float(CAPACITY_TERMINATION_LEAD_SECONDS)
CAPACITY_BLOCK_SAFETY_MARGIN = float(CAPACITY_STOP_MARGIN_SECONDS)


def capacity_block_deadline(env: Mapping[str, str]) -> float | None:
    """Epoch seconds by which the run must have stopped, from the capacity block's end; None without one."""
    raw = env.get(CAPACITY_BLOCK_ENV, "").strip()
    if not raw:
        return None
    try:
        expires = float(raw) / 1000.0
    except ValueError:
        return None  # not ours to fail a job over; the instance termination still applies
    return expires - CAPACITY_BLOCK_TERMINATION_LEAD - CAPACITY_BLOCK_SAFETY_MARGIN


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
        self.deadline = deadline
        self._previous: Any = None

    def __enter__(self) -> StopFlag:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def local(self) -> StopReason:
        passed = self.deadline is not None and time.time() >= self.deadline
        return StopReason(signalled=self.signalled, deadline_passed=passed)


class StopAgreement:
    """Whether any rank wants to stop, agreed by every rank at the same point; collective."""

    def __init__(self, device: torch.device) -> None:
        # On GPUs a CPU-side gloo group: the check is a round trip between hosts, not a CUDA sync.
        self.group = dist.new_group(backend="gloo") if device.type == "cuda" else None

    def agree(self, flag: StopFlag) -> StopReason:
        reason = flag.local()
        flags = torch.tensor([int(reason.signalled), int(reason.deadline_passed)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return StopReason(signalled=bool(flags[0]), deadline_passed=bool(flags[1]))
