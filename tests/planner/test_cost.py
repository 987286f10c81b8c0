"""Tokens per hour and a fee per billion tokens: the arithmetic the planner and ``btk capacity`` share."""

from __future__ import annotations

import pytest

from btk.catalog import get_profile
from btk.hardware import get_instance_type
from btk.planner.cost import fee_per_billion_tokens, tokens_billion
from btk.planner.search import plan_profile


def test_fee_per_billion_tokens_arithmetic() -> None:
    # 10,000 tok/s/GPU x 16 GPUs x 168 h = 96.768 B tokens
    assert tokens_billion(10_000, 16, 168) == pytest.approx(96.768)
    assert fee_per_billion_tokens(100_000, 10_000, 16, 168) == pytest.approx(1033.39, abs=0.01)
    assert fee_per_billion_tokens(None, 10_000, 16, 168) is None
    assert fee_per_billion_tokens(100_000, 0, 16, 168) is None


def test_on_demand_price_per_billion_tokens_is_an_hour_of_the_cluster_over_its_tokens() -> None:
    instance = get_instance_type("ml.p5.48xlarge")
    estimate = plan_profile(get_profile("llama3.1-8b"), instance, 2).evaluation.estimate
    hourly = instance.usd_per_hour.value * 2
    expected = fee_per_billion_tokens(hourly, estimate.tokens_per_second_per_gpu, 2 * instance.gpus_per_node, 1.0)
    assert estimate.usd_per_billion_tokens == pytest.approx(expected)
