"""What a billion tokens costs: the tokens a set of GPUs trains in some hours, and a price spread over them.

The planner prices on-demand instance-hours this way (``throughput``), and ``btk capacity
search`` prices a training plan's up-front fee the same way, so the two figures compare.
"""

from __future__ import annotations

from btk.capacity import CAPACITY_STOP_MARGIN_SECONDS, CAPACITY_TERMINATION_LEAD_SECONDS
from btk.units import SECONDS_PER_HOUR

TOKENS_PER_BILLION = 1e9


def tokens_billion(tokens_per_second_per_gpu: float, gpus: int, hours: float) -> float:
    """Billions of tokens ``gpus`` GPUs train in ``hours`` at ``tokens_per_second_per_gpu`` each."""
    return tokens_per_second_per_gpu * gpus * hours * SECONDS_PER_HOUR / TOKENS_PER_BILLION


def fee_per_billion_tokens(
    fee: float | None, tokens_per_second_per_gpu: float, gpus: int, hours: float
) -> float | None:
    """``fee`` divided by the billions of tokens trained in ``hours``; None without a fee or without tokens."""
    billions = tokens_billion(tokens_per_second_per_gpu, gpus, hours)
    if fee is None or billions <= 0:
        return None
    return fee / billions


def usable_plan_hours(duration_hours: float) -> float:
    """Hours of a training plan that train: its duration less the termination lead and the final checkpoint.

    SageMaker terminates a plan's instances :data:`~btk.capacity.CAPACITY_TERMINATION_LEAD_SECONDS`
    before the capacity ends, and the trainer stops
    :data:`~btk.capacity.CAPACITY_STOP_MARGIN_SECONDS` before that to write and upload its last
    checkpoint; neither stretch trains tokens, and a plan's fee pays for both.
    """
    overhead = (CAPACITY_TERMINATION_LEAD_SECONDS + CAPACITY_STOP_MARGIN_SECONDS) / SECONDS_PER_HOUR
    return max(0.0, duration_hours - overhead)


def plan_tokens_billion(tokens_per_second_per_gpu: float, gpus: int, duration_hours: float) -> float:
    """Billions of tokens a training plan of ``duration_hours`` trains (its usable hours only)."""
    return tokens_billion(tokens_per_second_per_gpu, gpus, usable_plan_hours(duration_hours))


def plan_fee_per_billion_tokens(
    fee: float | None, tokens_per_second_per_gpu: float, gpus: int, duration_hours: float
) -> float | None:
    """A training plan's up-front fee per billion tokens it can actually train."""
    return fee_per_billion_tokens(fee, tokens_per_second_per_gpu, gpus, usable_plan_hours(duration_hours))
