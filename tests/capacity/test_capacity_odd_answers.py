"""Money is guarded even when AWS answers in an unexpected form: each odd answer buys nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from capacity_fixtures import AZ, INSTANCE, REQUEST, START, FakeClock, StubbedSageMaker, described_plan, offering

from btk import capacity

NAME = REQUEST.plan_name()
NOW = START - timedelta(days=3)
NOT_FOUND = {"service_error_code": "ResourceNotFound", "service_message": "not found", "http_status_code": 400}


def _without_az(block: dict[str, Any]) -> dict[str, Any]:
    """A capacity block as the API may return it: AvailabilityZone is optional in its model."""
    return {key: value for key, value in block.items() if key != "AvailabilityZone"}


def ensure(stubbed_sagemaker: StubbedSageMaker, *, approved: bool = True) -> capacity.Reservation:
    clock = FakeClock()
    return capacity.ensure_reserved_plan(
        stubbed_sagemaker.client,
        REQUEST,
        max_upfront_fee=150_000.0,
        purchase_approved=approved,
        sleep=clock.sleep,
        clock=clock.clock,
        now=lambda: NOW,
    )


@pytest.mark.parametrize(
    ("text", "fee"),
    [
        ("150000.50", 150000.5),
        ("150,000.50", 150000.5),
        (" 1,234 ", 1234.0),
        ("0", 0.0),
        ("150.000,50", None),  # a decimal comma: ambiguous, never 150.0005
        ("1,2,3", None),
        ("12,34.5", None),
        ("1e5", None),
        ("inf", None),
        ("NaN", None),
        ("-5", None),
        ("", None),
        ("$100", None),
        (None, None),
        (True, None),
        (100, 100.0),
    ],
)
def test_fees_are_parsed_strictly(text: Any, fee: float | None) -> None:
    assert capacity.parse_fee(text) == fee


def test_an_offering_with_a_block_that_states_no_az_is_never_bought() -> None:
    item = offering("tpo-split")
    item["ReservedCapacityOfferings"].append(_without_az(item["ReservedCapacityOfferings"][0]))
    parsed = capacity.Offering.from_api(item)
    assert not parsed.in_zone(AZ)
    reason = capacity.rejection(parsed, REQUEST, 150_000.0)
    assert reason is not None and "states no AZ" in reason


def test_a_plan_with_a_block_that_states_no_az_does_not_fit() -> None:
    item = described_plan("team-plan")
    item["ReservedCapacitySummaries"].append(_without_az(item["ReservedCapacitySummaries"][0]))
    plan = capacity.TrainingPlan.from_api(item)
    problems = capacity.plan_problems(plan, instance_type=INSTANCE, availability_zone=AZ)
    assert any("states no AZ" in problem for problem in problems)


def test_a_split_offering_fails_the_purchase_and_buys_nothing(stubbed_sagemaker: StubbedSageMaker) -> None:
    item = offering("tpo-split")
    item["ReservedCapacityOfferings"].append(_without_az(item["ReservedCapacityOfferings"][0]))
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": []})
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": [item]})
    with pytest.raises(capacity.CapacityError, match="no offering in us-east-1a"):
        ensure(stubbed_sagemaker)
    assert "CreateTrainingPlan" not in stubbed_sagemaker.calls


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("instance_type", "ml.p5.48xlarge", "instance type ml.p5.48xlarge"),
        ("az", "us-east-1b", "AZ us-east-1b"),
        ("count", 1, "1 instances < instance_count 2"),
        ("targets", ("hyperpod-cluster",), "targets hyperpod-cluster"),
    ],
)
def test_a_plan_found_by_our_name_is_verified_before_use(
    stubbed_sagemaker: StubbedSageMaker, field: str, value: Any, words: str
) -> None:
    found = described_plan(NAME, **{field: value})
    stubbed_sagemaker.stubber.add_response("describe_training_plan", found)
    stubbed_sagemaker.stubber.add_response("describe_training_plan", found)
    with pytest.raises(capacity.CapacityError) as raised:
        ensure(stubbed_sagemaker)
    assert words in str(raised.value) and "does not fit the reservation" in str(raised.value)
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "DescribeTrainingPlan"]


def _summary(name: str, status: str, end_offset_days: int) -> dict[str, Any]:
    plan = described_plan(name, status=status)
    plan["EndTime"] = NOW + timedelta(days=end_offset_days)
    return plan


def test_a_live_plan_of_the_environment_under_another_name_blocks_a_second_purchase(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    # what a start_after computed from the clock does: the same reservation under a new name
    held = _summary("btk-prod-0badc0de", "Scheduled", 10)
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": [held]})
    with pytest.raises(capacity.CapacityError) as raised:
        ensure(stubbed_sagemaker)
    message = str(raised.value)
    assert "already holds btk-prod-0badc0de (Scheduled)" in message and "fixed dates" in message
    assert "\n" not in message
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans"]


@pytest.mark.parametrize(
    ("name", "status", "end_offset_days"),
    [
        ("btk-prod-0badc0de", "Expired", 10),
        ("btk-prod-0badc0de", "Failed", 10),
        ("btk-prod-0badc0de", "Active", -1),  # ended
        ("btk-prod-eu-0badc0de", "Active", 10),  # another environment's plan
        ("team-plan", "Active", 10),  # not ours
    ],
)
def test_dead_ended_or_foreign_plans_do_not_block(
    stubbed_sagemaker: StubbedSageMaker, name: str, status: str, end_offset_days: int
) -> None:
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed_sagemaker.stubber.add_response(
        "list_training_plans", {"TrainingPlanSummaries": [_summary(name, status, end_offset_days)]}
    )
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []})
    with pytest.raises(capacity.CapacityError, match="no training-plan offerings"):
        ensure(stubbed_sagemaker)


@pytest.mark.parametrize("message", ["\n", "capacity\nwithdrawn\tby AWS\r\n", "bell\x07 and escape\x1b"])
def test_a_dead_plans_status_message_is_one_line(message: str) -> None:
    """AWS's free-text StatusMessage is reported, but never breaks the one-line error (nor hides the status)."""
    plan = capacity.TrainingPlan.from_api({**described_plan(NAME, status="Expired"), "StatusMessage": message})
    with pytest.raises(capacity.CapacityError) as raised:
        capacity.usable(plan)
    text = str(raised.value)
    assert "\n" not in text and "\r" not in text and text.isprintable()
    assert text.startswith(f"training plan {NAME} is Expired") and text.endswith("buy a new one")
