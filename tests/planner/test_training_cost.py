"""What training a profile's ``training.total_tokens`` takes: days and dollars on demand, days booked on plans."""

from __future__ import annotations

import pytest
from fixture_catalog import PROFILES

from btk.environment import OnDemandCapacity, ReservePlanCapacity
from btk.hardware import get_instance_type
from btk.planner.cost import (
    TrainingCost,
    reserved_plan_hours,
    shortest_covering_plan_hours,
    training_cost,
    usable_plan_hours,
)
from btk.planner.render import render_global_batch, render_plan, render_training_cost
from btk.planner.search import GlobalBatch, plan_profile
from btk.profile import TrainingIntent


def test_on_demand_days_and_dollars_follow_from_speed_and_price() -> None:
    # 10,000 tok/s/GPU x 16 GPUs = 576 M tokens an hour: 57.6 B tokens take 100 h
    cost = training_cost(57_600_000_000, 10_000, 16, 100.0)
    assert cost.training_hours == pytest.approx(100)
    assert cost.on_demand_days == pytest.approx(100 / 24)
    assert cost.on_demand_usd == pytest.approx(10_000)


def test_the_default_plan_is_the_shortest_whole_day_plan_whose_usable_hours_cover_the_run() -> None:
    cost = training_cost(57_600_000_000, 10_000, 16, 100.0)
    assert cost.plan_duration_hours == 120 and cost.plans == 1  # 100 h + 0.75 h lost fits in 5 days
    assert usable_plan_hours(cost.plan_duration_hours) >= cost.training_hours
    assert shortest_covering_plan_hours(23.25) == 24 and shortest_covering_plan_hours(23.3) == 48


def test_plans_of_a_given_length_train_only_their_usable_hours() -> None:
    # 167.25 usable hours a week: 335 hours of training need three one-week plans, 21 days booked
    cost = training_cost(int(335 * 576e6), 10_000, 16, 100.0, plan_duration_hours=168)
    assert cost.plans == 3 and cost.plan_days_booked == 21
    document = cost.as_json()
    assert (
        document["training_plan"]["fee_usd"] is None and "not in the catalog" in document["training_plan"]["fee_note"]
    )
    assert document["on_demand"]["usd"] == round(cost.on_demand_usd)


def test_an_environment_reserving_plans_sets_their_length() -> None:
    reserve = ReservePlanCapacity.model_construct(duration_hours=336)
    assert reserved_plan_hours(reserve) == 336
    assert reserved_plan_hours(OnDemandCapacity()) is None


def test_plan_carries_the_cost_of_its_total_tokens_or_says_there_is_none() -> None:
    profile, instance = PROFILES["llama3.1-8b"], get_instance_type("ml.p6-b200.48xlarge")
    plan = plan_profile(profile, instance, 2)
    cost = plan.training_cost()
    if profile.training.total_tokens is None:
        assert cost is None and plan.to_json()["training_cost"] is None
        return
    assert isinstance(cost, TrainingCost) and cost.total_tokens == profile.training.total_tokens
    assert cost.on_demand_usd == pytest.approx(cost.training_hours * instance.usd_per_hour.value * 2)
    assert plan.to_json()["training_cost"] == cost.as_json()
    assert plan.to_json(168)["training_cost"]["training_plan"]["duration_hours"] == 168
    text = render_plan(plan)
    assert all(line in text for line in render_training_cost(cost))


def test_without_total_tokens_the_plan_says_so() -> None:
    profile = PROFILES["llama3.2-1b"]
    training = TrainingIntent(
        seq_len=profile.training.seq_len, global_batch_tokens=profile.training.global_batch_tokens
    )
    plan = plan_profile(profile.model_copy(update={"training": training}), get_instance_type("ml.p5.48xlarge"), 1)
    assert plan.training_cost() is None and plan.to_json()["training_cost"] is None
    assert "the profile sets no training.total_tokens" in render_plan(plan)


def test_a_rounded_global_batch_is_said_in_the_text_and_the_json() -> None:
    profile = PROFILES["llama3.1-8b"]
    training = profile.training.model_copy(update={"global_batch_tokens": 4_000_000})
    plan = plan_profile(profile.model_copy(update={"training": training}), get_instance_type("ml.p5.48xlarge"), 1)
    batch = plan.global_batch
    assert batch.requested_tokens == 4_000_000 and batch.planned_tokens > 4_000_000 and batch.rounded
    assert plan.to_json()["global_batch_tokens"] == {
        "requested": 4_000_000,
        "planned": plan.evaluation.estimate.global_batch_tokens,
        "rounded": True,
    }
    (note,) = render_global_batch(batch)
    assert note in render_plan(plan) and "4,000,000" in note and f"{batch.planned_tokens:,}" in note
    assert render_global_batch(GlobalBatch(4_194_304, 4_194_304)) == []
