"""The money path: an offering is bought only when every field matches the request; otherwise the
purchase is refused with the mismatch named, and nothing is bought.

Each case serves one offering that differs from the request in one field (through a Stubber, so the
answer itself is inside SearchTrainingPlanOfferings' documented shape) and asserts that
CreateTrainingPlan is never called.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from capacity_fixtures import REQUEST, START, StubbedSageMaker, offering, plan_arn

from btk import capacity

NOW = START - timedelta(days=3)
NOT_FOUND = {"service_error_code": "ResourceNotFound", "service_message": "not found", "http_status_code": 400}
CEILING = 150_000.0


def buy(
    stubbed_sagemaker: StubbedSageMaker, items: list[dict[str, Any]], request: capacity.ReservationRequest = REQUEST
) -> capacity.Purchase:
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": []})
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": items})
    return capacity.find_or_buy_plan(
        stubbed_sagemaker.client, request, max_upfront_fee=CEILING, purchase_approved=True, now=lambda: NOW
    )


def _minutes(item: dict[str, Any], minutes: int) -> dict[str, Any]:
    item["DurationMinutes"] = minutes
    return item


def _block_without(item: dict[str, Any], key: str) -> dict[str, Any]:
    del item["ReservedCapacityOfferings"][0][key]
    return item


def _second_block(item: dict[str, Any], **changes: Any) -> dict[str, Any]:
    item["ReservedCapacityOfferings"].append({**item["ReservedCapacityOfferings"][0], **changes})
    return item


@pytest.mark.parametrize(
    ("item", "named"),
    [
        (offering("tpo-eur", currency="EUR"), "tpo-eur (100,000.00 EUR, us-east-1a, start 2026-03-02T00:00:00+00:00): "
         "priced in EUR, not USD"),
        (offering("tpo-usd-lower", currency="usd"), "priced in usd, not USD"),
        (offering("tpo-blank", currency=""), "priced in an unstated currency, not USD"),
        (offering("tpo-none", currency=None), "priced in an unstated currency, not USD"),
        (offering("tpo-longer", hours=192), "lasts 192 h, not 168 h"),
        (offering("tpo-shorter", hours=144), "lasts 144 h, not 168 h"),
        (_minutes(offering("tpo-minutes"), 30), "lasts 168.5 h, not 168 h"),
        (offering("tpo-early", start=START - timedelta(hours=1)),
         "starts 2026-03-01T23:00:00+00:00, before start_after 2026-03-02T00:00:00+00:00"),
        (offering("tpo-more", count=4), "4 instances, not 2"),
        (offering("tpo-fewer", count=1), "1 instances, not 2"),
        (_second_block(offering("tpo-mixed"), InstanceCount=1), "1+2 instances, not 2"),
        (offering("tpo-type", instance_type="ml.p5.48xlarge"), "instance type ml.p5.48xlarge, not ml.p6-b200.48xlarge"),
        (_second_block(offering("tpo-two-types"), InstanceType="ml.p5.48xlarge"),
         "instance type ml.p5.48xlarge+ml.p6-b200.48xlarge, not ml.p6-b200.48xlarge"),
        (_block_without(offering("tpo-no-start"), "StartTime"), "a capacity block states no start or end time"),
        (_block_without(offering("tpo-no-end"), "EndTime"), "a capacity block states no start or end time"),
    ],
)  # fmt: skip
def test_an_offering_that_differs_from_the_request_in_one_field_is_not_bought(
    stubbed_sagemaker: StubbedSageMaker, item: dict[str, Any], named: str
) -> None:
    with pytest.raises(capacity.CapacityError) as raised:
        buy(stubbed_sagemaker, [item])
    message = str(raised.value)
    assert "not bought: no offering in us-east-1a matches 2 x ml.p6-b200.48xlarge, 168 h" in message
    assert named in message and "\n" not in message
    assert "CreateTrainingPlan" not in stubbed_sagemaker.calls


def test_an_offering_ending_after_end_before_is_not_bought(stubbed_sagemaker: StubbedSageMaker) -> None:
    request = replace(REQUEST, end_before=START + timedelta(hours=167))
    with pytest.raises(capacity.CapacityError) as raised:
        buy(stubbed_sagemaker, [offering("tpo-late-end")], request)
    assert "ends 2026-03-09T00:00:00+00:00, after end_before 2026-03-08T23:00:00+00:00" in str(raised.value)
    assert "CreateTrainingPlan" not in stubbed_sagemaker.calls


def test_an_offering_id_listed_twice_is_not_bought(stubbed_sagemaker: StubbedSageMaker) -> None:
    twins = [offering("tpo-twin", fee="90000.00"), offering("tpo-twin", fee="140000.00")]
    with pytest.raises(capacity.CapacityError) as raised:
        buy(stubbed_sagemaker, twins)
    assert "offering id tpo-twin is listed more than once in one answer" in str(raised.value)
    assert "CreateTrainingPlan" not in stubbed_sagemaker.calls


def test_a_unique_matching_offering_is_bought_beside_twins_and_mismatches(stubbed_sagemaker: StubbedSageMaker) -> None:
    """The guard refuses what differs and still buys what matches (it does not refuse everything)."""
    items = [
        offering("tpo-twin", fee="10.00"),
        offering("tpo-twin", fee="10.00"),
        offering("tpo-eur", fee="10.00", currency="EUR"),
        offering("tpo-early", fee="10.00", start=START - timedelta(days=1)),
        offering("tpo-good", fee="120000.00", start=START + timedelta(days=1)),
    ]
    name = REQUEST.plan_name()
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": []})
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": items})
    stubbed_sagemaker.stubber.add_response(
        "create_training_plan",
        {"TrainingPlanArn": plan_arn(name)},
        {"TrainingPlanName": name, "TrainingPlanOfferingId": "tpo-good"},
    )
    purchase = capacity.find_or_buy_plan(
        stubbed_sagemaker.client, REQUEST, max_upfront_fee=CEILING, purchase_approved=True, now=lambda: NOW
    )
    assert purchase.bought and purchase.offering is not None and purchase.offering.offering_id == "tpo-good"
    stubbed_sagemaker.done()


def test_an_offering_starting_later_and_ending_inside_the_window_matches() -> None:
    request = replace(REQUEST, end_before=START + timedelta(days=30))
    item = capacity.Offering.from_api(offering("tpo-later", start=START + timedelta(days=5)))
    assert capacity.rejection(item, request, CEILING) is None
