"""Training plans for P6e-GB200: searched and bought by UltraServer type and count, as SageMaker sells them.

The requests go through a Stubber, which validates them against botocore's SageMaker model (where
``UltraServerType`` and ``UltraServerCount`` are SearchTrainingPlanOfferings parameters).
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from capacity_fixtures import AZ, REQUEST, START, StubbedSageMaker, load_handler, offering, plan_arn
from pydantic import ValidationError

from btk import capacity
from btk.environment import EnvironmentConfig, ReservePlanCapacity
from btk.errors import one_line

GB200 = "ml.p6e-gb200.36xlarge"
NOW = START - timedelta(days=3)
CEILING = 900_000.0
NOT_FOUND = {"service_error_code": "ResourceNotFound", "service_message": "not found", "http_status_code": 400}


def gb200_environment(instance_count: int = 16, ultraserver_type: str | None = None,
                      instance_type: str = GB200) -> EnvironmentConfig:
    return EnvironmentConfig(
        name="ultra",
        availability_zone=AZ,
        profiles=("llama3.1-8b",),
        instance_type=instance_type,
        instance_count=instance_count,
        capacity=ReservePlanCapacity(
            start_after=START, duration_hours=168, instance_count=instance_count, ultraserver_type=ultraserver_type,
            max_upfront_fee=CEILING, purchase_approved=True,
        ),
    )


def ultraserver_offering(offering_id: str, ultraserver_type: str = "ml.u-p6e-gb200x72", count: int = 1,
                         instances: int = 18) -> dict[str, Any]:
    item = offering(offering_id, fee="800000.00", count=instances, instance_type=GB200)
    item["ReservedCapacityOfferings"][0].update(UltraServerType=ultraserver_type, UltraServerCount=count)
    return item


@pytest.mark.parametrize(
    ("instances", "ultraserver_type", "booked"),
    [(16, None, ("ml.u-p6e-gb200x72", 1)), (32, None, ("ml.u-p6e-gb200x72", 2)),
     (16, "ml.u-p6e-gb200x36", ("ml.u-p6e-gb200x36", 2)), (8, "ml.u-p6e-gb200x36", ("ml.u-p6e-gb200x36", 1))],
)
def test_the_plan_books_as_many_ultraservers_as_the_instances_need(
    instances: int, ultraserver_type: str | None, booked: tuple[str, int]
) -> None:
    request = capacity.reservation_request(gb200_environment(instances, ultraserver_type))
    assert (request.ultraserver_type, request.ultraserver_count) == booked
    assert request.describe_window().startswith(f"{booked[1]} x {booked[0]} ({instances} x {GB200}), ")


def test_an_ultraserver_plan_is_searched_by_ultraserver_type_and_bought(stubbed_sagemaker: StubbedSageMaker) -> None:
    request = capacity.reservation_request(gb200_environment())
    name = request.plan_name()
    stubbed = stubbed_sagemaker.stubber
    stubbed.add_client_error("describe_training_plan", **NOT_FOUND)
    stubbed.add_response("list_training_plans", {"TrainingPlanSummaries": []})
    stubbed.add_response(
        "search_training_plan_offerings",
        {"TrainingPlanOfferings": [ultraserver_offering("tpo-x36", "ml.u-p6e-gb200x36", 2),
                                   ultraserver_offering("tpo-two", count=2, instances=36),
                                   ultraserver_offering("tpo-x72")]},
        {"TargetResources": ["training-job"], "InstanceType": GB200, "UltraServerType": "ml.u-p6e-gb200x72",
         "UltraServerCount": 1, "StartTimeAfter": START, "DurationHours": 168},
    )
    stubbed.add_response("create_training_plan", {"TrainingPlanArn": plan_arn(name)},
                         {"TrainingPlanName": name, "TrainingPlanOfferingId": "tpo-x72"})
    purchase = capacity.find_or_buy_plan(stubbed_sagemaker.client, request, max_upfront_fee=CEILING,
                                         purchase_approved=True, now=lambda: NOW)
    assert purchase.bought and purchase.offering is not None and purchase.offering.offering_id == "tpo-x72"
    stubbed_sagemaker.done()


@pytest.mark.parametrize(
    ("item", "named"),
    [(ultraserver_offering("tpo-x36", "ml.u-p6e-gb200x36"),
      "UltraServer type ml.u-p6e-gb200x36, not ml.u-p6e-gb200x72"),
     (ultraserver_offering("tpo-two", count=2), "2 UltraServers, not 1"),
     (offering("tpo-instances", fee="800000.00", count=16, instance_type=GB200),
      "UltraServer type none, not ml.u-p6e-gb200x72")],
)
def test_an_offering_of_other_ultraservers_is_refused_with_the_difference_named(item: dict[str, Any],
                                                                                named: str) -> None:
    request = capacity.reservation_request(gb200_environment())
    assert capacity.rejection(capacity.Offering.from_api(item), request, CEILING) == named


def test_the_reservation_properties_carry_the_ultraserver_to_the_handler_and_back() -> None:
    request = capacity.reservation_request(gb200_environment(32))
    properties = request.to_properties()
    assert properties["UltraServerType"] == "ml.u-p6e-gb200x72" and properties["UltraServerCount"] == "2"
    assert capacity.ReservationRequest.from_properties(properties) == request
    plain = REQUEST.to_properties()
    assert "UltraServerType" not in plain and capacity.ReservationRequest.from_properties(plain) == REQUEST
    assert request.plan_name() != capacity.reservation_request(gb200_environment(32, "ml.u-p6e-gb200x36")).plan_name()


def test_plans_booked_by_instance_keep_the_names_they_were_bought_under() -> None:
    """The name of an instance booking hashes the seven inputs it always did (a plan already bought is found)."""
    fields = ("prod", "ml.p6-b200.48xlarge", "2", "2026-03-02T00:00:00+00:00", "", "168", AZ)
    assert REQUEST.plan_name() == "btk-prod-" + hashlib.sha256("|".join(fields).encode()).hexdigest()[:8]


@pytest.mark.parametrize(
    ("instance_type", "ultraserver_type", "message"),
    [("ml.p6-b200.48xlarge", "ml.u-p6e-gb200x72",
      "capacity.ultraserver_type: ml.p6-b200.48xlarge is not sold in UltraServers: remove it"),
     (GB200, "ml.u-p6e-gb200x12", "capacity.ultraserver_type: ml.p6e-gb200.36xlarge is not sold in UltraServer type "
      "'ml.u-p6e-gb200x12'; its UltraServer types: ml.u-p6e-gb200x72, ml.u-p6e-gb200x36")],
)
def test_an_ultraserver_type_that_does_not_suit_the_instance_type_is_one_line_naming_the_field(
    instance_type: str, ultraserver_type: str, message: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        gb200_environment(16, ultraserver_type, instance_type)
    line = one_line(raised.value, root=EnvironmentConfig)
    assert line.startswith(message) and "\n" not in line


def test_a_change_of_any_reservation_input_is_a_reason_for_the_handler_to_look_again() -> None:
    """Every property a reservation sends the handler (UltraServer ones included) is one of its identity properties:
    an update that changes the UltraServer type is not answered 'unchanged'."""
    handler = load_handler()
    sent = capacity.reservation_request(gb200_environment()).to_properties()
    assert set(sent) <= set(handler.IDENTITY_PROPERTIES)
