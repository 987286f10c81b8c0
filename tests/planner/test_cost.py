"""Tokens per hour and a fee per billion tokens: the arithmetic the planner and ``btk capacity`` share."""

from __future__ import annotations

import pytest
from fixture_catalog import PROFILES

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
    estimate = plan_profile(PROFILES["llama3.1-8b"], instance, 2).evaluation.estimate
    hourly = instance.usd_per_hour.value * 2
    expected = fee_per_billion_tokens(hourly, estimate.tokens_per_second_per_gpu, 2 * instance.gpus_per_node, 1.0)
    assert estimate.usd_per_billion_tokens == pytest.approx(expected)


def test_a_plan_trains_only_until_its_instances_are_terminated_less_the_final_checkpoint() -> None:
    from btk.capacity import CAPACITY_STOP_MARGIN_SECONDS, CAPACITY_TERMINATION_LEAD_SECONDS
    from btk.planner.cost import plan_fee_per_billion_tokens, plan_tokens_billion, usable_plan_hours

    lost_hours = (CAPACITY_TERMINATION_LEAD_SECONDS + CAPACITY_STOP_MARGIN_SECONDS) / 3600
    assert lost_hours == 0.75  # 30 min termination lead + 15 min to write and upload the last checkpoint
    assert usable_plan_hours(24) == pytest.approx(23.25)
    assert usable_plan_hours(0.5) == 0.0
    assert plan_tokens_billion(10_000, 16, 168) == pytest.approx(tokens_billion(10_000, 16, 167.25))
    # a one-day plan pays for 24 h and trains 23.25: its fee per trained token is 24/23.25 higher
    assert plan_fee_per_billion_tokens(100_000, 10_000, 16, 24) == pytest.approx(
        fee_per_billion_tokens(100_000, 10_000, 16, 24) * 24 / 23.25
    )
