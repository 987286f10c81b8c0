"""What a billion tokens costs: the tokens a set of GPUs trains in some hours, and a price spread over them.

The planner prices on-demand instance-hours this way (``throughput``), and ``btk capacity
search`` prices a training plan's up-front fee the same way, so the two figures compare.
"""

from __future__ import annotations

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
