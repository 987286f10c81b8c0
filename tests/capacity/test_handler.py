"""The custom-resource handler, every path of issue 6, against a Stubber-backed client.

Each test asserts the exact list of SageMaker operations called: no stray CreateTrainingPlan.
"""

from __future__ import annotations

from typing import Any

import pytest
from capacity_fixtures import (
    AZ,
    INSTANCE,
    START,
    FakeClock,
    StubbedSageMaker,
    described_plan,
    load_handler,
    offering,
    plan_arn,
)

from btk import capacity
from training_constructs.training_plan import QUERY_INTERVAL

handler = load_handler()

RESERVE: dict[str, str] = {
    "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:framework",
    "Mode": "reserve",
    "Environment": "prod",
    "InstanceType": INSTANCE,
    "InstanceCount": "2",
    "StartAfter": capacity.iso(START),
    "EndBefore": "",
    "DurationHours": "168",
    "AvailabilityZone": AZ,
    "MaxUpfrontFee": "150000.0",
    "PurchaseApproved": "true",
    "WaitSeconds": "600",
}
NAME = capacity.ReservationRequest.from_properties(RESERVE).plan_name()
SEARCH = {
    "TargetResources": ["training-job"],
    "InstanceType": INSTANCE,
    "InstanceCount": 2,
    "StartTimeAfter": START,
    "DurationHours": 168,
}
NOT_FOUND = {
    "service_error_code": "ResourceNotFound",
    "service_message": "Training plan not found",
    "http_status_code": 400,
}


def event(request_type: str, properties: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "LogicalResourceId": "PlanResource",
        "ResourceType": "Custom::TrainingPlan",
        "ResourceProperties": properties,
        **extra,
    }


def expect_not_bought_yet(stubbed_sagemaker: StubbedSageMaker, name: str = NAME, held: list[Any] | None = None) -> None:
    """No plan of ``name`` yet; the environment holds the plans ``held`` (none by default)."""
    stubbed_sagemaker.stubber.add_client_error(
        "describe_training_plan", expected_params={"TrainingPlanName": name}, **NOT_FOUND
    )
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": held or []})


#: The construct's query interval: how long the Provider framework's waiter sleeps between isComplete calls.
QUERY_SECONDS = QUERY_INTERVAL.to_seconds()


def run(stubbed_sagemaker: StubbedSageMaker, evt: dict[str, Any], clock: FakeClock | None = None) -> dict[str, Any]:
    """What the CDK Provider framework does: onEvent once, then isComplete every query interval until
    it answers complete (or raises); the two answers' ``Data`` are merged, isComplete's last."""
    clock = clock or FakeClock()
    client = stubbed_sagemaker.client
    response: dict[str, Any] = handler.handle(evt, client, clock=clock.clock)
    data = dict(response.get("Data") or {})
    while True:
        check = handler.check_complete(
            {**evt, "PhysicalResourceId": response["PhysicalResourceId"], "Data": data}, client, clock=clock.clock
        )
        if check["IsComplete"]:
            result: dict[str, Any] = {**response, "Data": {**data, **check.get("Data", {})}}
            break
        clock.sleep(QUERY_SECONDS)
    return result


def test_create_with_approval_and_fee_in_range_buys_the_best_offering_in_the_az(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    offerings = [
        offering("tpo-later", fee="90000.00", start=START.replace(day=9)),
        offering("tpo-other-az", fee="50000.00", az="us-east-1b"),
        offering("tpo-best", fee="120000.00"),
        offering("tpo-too-dear", fee="200000.00"),
    ]
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": offerings}, SEARCH
    )
    stubbed_sagemaker.stubber.add_response(
        "create_training_plan",
        {"TrainingPlanArn": plan_arn(NAME)},
        {"TrainingPlanName": NAME, "TrainingPlanOfferingId": "tpo-best"},
    )
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(NAME, status="Pending"), {"TrainingPlanName": NAME}
    )
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME), {"TrainingPlanName": NAME})
    clock = FakeClock()

    result = run(stubbed_sagemaker, event("Create", RESERVE), clock)

    assert stubbed_sagemaker.calls == [
        "DescribeTrainingPlan",
        "ListTrainingPlans",
        "SearchTrainingPlanOfferings",
        "CreateTrainingPlan",
        "DescribeTrainingPlan",
        "DescribeTrainingPlan",
    ]
    stubbed_sagemaker.done()
    assert result == {
        "PhysicalResourceId": plan_arn(NAME),
        "Data": {
            "PlanArn": plan_arn(NAME),
            "PlanName": NAME,
            "Status": "Scheduled",
            "Bought": "true",
            "WaitUntil": RESERVE["WaitSeconds"],  # the purchase at t=0, plus WaitSeconds
        },
    }
    assert clock.sleeps == [QUERY_SECONDS]  # one isComplete saw Pending, the next Scheduled


def test_fee_over_the_ceiling_fails_listing_the_offerings_and_buys_nothing(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    offerings = [offering("tpo-dear", fee="180000.00"), offering("tpo-dearer", fee="260000.00")]
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": offerings}, SEARCH
    )

    with pytest.raises(capacity.CapacityError) as raised:
        run(stubbed_sagemaker, event("Create", RESERVE))

    message = str(raised.value)
    assert "\n" not in message
    assert "within max_upfront_fee 150,000.00" in message
    assert "tpo-dear (180,000.00 USD, us-east-1a" in message and "tpo-dearer" in message
    assert "fee 180,000.00 USD > max_upfront_fee 150,000.00" in message
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans", "SearchTrainingPlanOfferings"]
    stubbed_sagemaker.done()


def test_without_approval_nothing_is_bought_even_in_range(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": [offering("tpo-fine", fee="1000.00")]}, SEARCH
    )
    unapproved = {**RESERVE, "PurchaseApproved": "false"}

    with pytest.raises(capacity.CapacityError, match=r"set capacity.purchase_approved to buy; offerings: tpo-fine"):
        run(stubbed_sagemaker, event("Create", unapproved))

    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans", "SearchTrainingPlanOfferings"]
    stubbed_sagemaker.done()


def test_offerings_only_in_another_az_are_never_bought(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    offerings = [offering("tpo-b", fee="1000.00", az="us-east-1b"), offering("tpo-c", fee="900.00", az="us-east-1c")]
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": offerings}, SEARCH
    )

    with pytest.raises(capacity.CapacityError) as raised:
        run(stubbed_sagemaker, event("Create", RESERVE))

    assert "no offering in us-east-1a" in str(raised.value)
    assert "AZ us-east-1c is not the environment's us-east-1a" in str(raised.value)
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans", "SearchTrainingPlanOfferings"]
    stubbed_sagemaker.done()


def test_empty_offering_list_fails_with_the_window(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, SEARCH)

    with pytest.raises(capacity.CapacityError, match=r"no training-plan offerings for 2 x ml.p6-b200.48xlarge, 168 h"):
        run(stubbed_sagemaker, event("Create", RESERVE))

    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans", "SearchTrainingPlanOfferings"]
    stubbed_sagemaker.done()


def test_a_plan_still_pending_past_the_wait_completes_the_create_and_is_not_bought_again(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    # First deploy: buys, then the plan stays Pending past WaitSeconds -> the resource completes as
    # Pending (failing would roll back a first create, file system and network included).
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": [offering("tpo-1")]}, SEARCH
    )
    stubbed_sagemaker.stubber.add_response(
        "create_training_plan",
        {"TrainingPlanArn": plan_arn(NAME)},
        {"TrainingPlanName": NAME, "TrainingPlanOfferingId": "tpo-1"},
    )
    short_wait = {**RESERVE, "WaitSeconds": "30"}
    for _ in range(2):  # isComplete at t=0 and t=60 (past the 30 s) -> complete, Pending
        stubbed_sagemaker.stubber.add_response(
            "describe_training_plan", described_plan(NAME, status="Pending"), {"TrainingPlanName": NAME}
        )

    first = run(stubbed_sagemaker, event("Create", short_wait))
    assert (first["PhysicalResourceId"], first["Data"]["Status"], first["Data"]["Bought"]) == (
        plan_arn(NAME), "Pending", "true")

    # A deploy of a new stack with the same reservation (the first one destroyed): the name finds the
    # plan; nothing is bought again.
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(NAME, status="Pending"), {"TrainingPlanName": NAME}
    )
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(NAME, status="Pending"), {"TrainingPlanName": NAME}
    )
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(NAME, status="Scheduled"), {"TrainingPlanName": NAME}
    )

    result = run(stubbed_sagemaker, event("Create", RESERVE))

    assert stubbed_sagemaker.calls.count("CreateTrainingPlan") == 1
    assert stubbed_sagemaker.calls == [
        "DescribeTrainingPlan",
        "ListTrainingPlans",
        "SearchTrainingPlanOfferings",
        "CreateTrainingPlan",
        *["DescribeTrainingPlan"] * 2,
        *["DescribeTrainingPlan"] * 3,
    ]
    stubbed_sagemaker.done()
    assert result["PhysicalResourceId"] == plan_arn(NAME)
    assert (result["Data"]["Bought"], result["Data"]["Status"]) == ("false", "Scheduled")


def test_a_lost_create_response_retried_into_resource_in_use_is_the_plan_bought_once(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    # botocore retries CreateTrainingPlan after a read timeout; the first attempt had bought the plan,
    # so the retry finds the name taken. The handler takes the plan of that name, buying nothing more.
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": [offering("tpo-1")]}, SEARCH
    )
    stubbed_sagemaker.stubber.add_client_error(
        "create_training_plan",
        service_error_code="ResourceInUse",
        service_message=f"Training plan {NAME} already exists",
        http_status_code=400,
        expected_params={"TrainingPlanName": NAME, "TrainingPlanOfferingId": "tpo-1"},
    )
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(NAME, status="Pending"), {"TrainingPlanName": NAME}
    )
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME), {"TrainingPlanName": NAME})

    result = run(stubbed_sagemaker, event("Create", RESERVE))

    assert stubbed_sagemaker.calls == [
        "DescribeTrainingPlan",
        "ListTrainingPlans",
        "SearchTrainingPlanOfferings",
        "CreateTrainingPlan",
        "DescribeTrainingPlan",
        "DescribeTrainingPlan",
    ]
    stubbed_sagemaker.done()
    assert result["PhysicalResourceId"] == plan_arn(NAME)
    assert result["Data"]["Status"] == "Scheduled"


def test_resource_in_use_without_a_plan_of_that_name_fails_with_one_line(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": [offering("tpo-1")]}, SEARCH
    )
    stubbed_sagemaker.stubber.add_client_error(
        "create_training_plan", service_error_code="ResourceInUse", service_message="offering\nis taken"
    )
    stubbed_sagemaker.stubber.add_client_error(
        "describe_training_plan", expected_params={"TrainingPlanName": NAME}, **NOT_FOUND
    )

    with pytest.raises(capacity.CapacityError) as raised:
        run(stubbed_sagemaker, event("Create", RESERVE))

    assert str(raised.value) == "CreateTrainingPlan failed: ResourceInUse: offering is taken"
    assert stubbed_sagemaker.calls == [
        "DescribeTrainingPlan",
        "ListTrainingPlans",
        "SearchTrainingPlanOfferings",
        "CreateTrainingPlan",
        "DescribeTrainingPlan",
    ]
    stubbed_sagemaker.done()


def test_update_with_unchanged_inputs_is_a_no_op(stubbed_sagemaker: StubbedSageMaker) -> None:
    # Raising the fee ceiling or re-approving is not a reason to buy: only the identity counts.
    new = {**RESERVE, "MaxUpfrontFee": "999999.0", "WaitSeconds": "300"}

    result = run(
        stubbed_sagemaker, event("Update", new, PhysicalResourceId=plan_arn(NAME), OldResourceProperties=RESERVE)
    )

    assert stubbed_sagemaker.calls == []
    stubbed_sagemaker.done()
    assert result["PhysicalResourceId"] == plan_arn(NAME)
    assert result["Data"]["PlanArn"] == plan_arn(NAME)
    assert result["Data"]["PlanName"] == NAME
    assert result["Data"]["Bought"] == "false"


def test_update_with_a_new_window_looks_for_the_new_name_first(stubbed_sagemaker: StubbedSageMaker) -> None:
    new = {**RESERVE, "DurationHours": "336"}
    new_name = capacity.ReservationRequest.from_properties(new).plan_name()
    assert new_name != NAME
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(new_name), {"TrainingPlanName": new_name}
    )
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan", described_plan(new_name), {"TrainingPlanName": new_name}
    )

    result = run(
        stubbed_sagemaker, event("Update", new, PhysicalResourceId=plan_arn(NAME), OldResourceProperties=RESERVE)
    )

    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "DescribeTrainingPlan"]
    stubbed_sagemaker.done()
    assert result["PhysicalResourceId"] == plan_arn(new_name)


def test_update_with_changed_unapproved_inputs_buys_nothing(stubbed_sagemaker: StubbedSageMaker) -> None:
    new = {**RESERVE, "InstanceCount": "4", "PurchaseApproved": "false"}
    new_name = capacity.ReservationRequest.from_properties(new).plan_name()
    expect_not_bought_yet(stubbed_sagemaker, new_name)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings",
        {"TrainingPlanOfferings": [offering("tpo-4", count=4)]},
        {**SEARCH, "InstanceCount": 4},
    )

    with pytest.raises(capacity.CapacityError, match="purchase_approved"):
        run(stubbed_sagemaker, event("Update", new, PhysicalResourceId=plan_arn(NAME), OldResourceProperties=RESERVE))

    assert "CreateTrainingPlan" not in stubbed_sagemaker.calls
    stubbed_sagemaker.done()


def test_delete_calls_nothing_and_says_the_plan_expires(stubbed_sagemaker: StubbedSageMaker) -> None:
    result = run(stubbed_sagemaker, event("Delete", RESERVE, PhysicalResourceId=plan_arn(NAME)))

    assert stubbed_sagemaker.calls == []
    stubbed_sagemaker.done()
    assert result["PhysicalResourceId"] == plan_arn(NAME)
    assert "expires on its own end date" in result["Data"]["Message"]


EXISTING = {
    "Mode": "existing",
    "PlanArn": plan_arn("team-plan"),
    "InstanceType": INSTANCE,
    "InstanceCount": "2",
    "AvailabilityZone": AZ,
}


def test_existing_plan_of_the_wrong_instance_type_fails(stubbed_sagemaker: StubbedSageMaker) -> None:
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan",
        described_plan("team-plan", instance_type="ml.p5.48xlarge"),
        {"TrainingPlanName": plan_arn("team-plan")},
    )

    with pytest.raises(capacity.CapacityError) as raised:
        run(stubbed_sagemaker, event("Create", EXISTING))

    assert str(raised.value) == (
        "capacity.plan_arn team-plan does not fit the environment: instance type ml.p5.48xlarge, not "
        "ml.p6-b200.48xlarge: use a matching plan or change the environment"
    )
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]
    stubbed_sagemaker.done()


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"az": "us-east-1b"}, "AZ us-east-1b, not us-east-1a"),
        ({"targets": ("hyperpod-cluster",)}, "targets hyperpod-cluster, not training-job"),
        ({"count": 1}, "1 instances < instance_count 2"),
        ({"status": "Expired"}, "status Expired"),
    ],
)
def test_existing_plan_mismatches_are_named(
    stubbed_sagemaker: StubbedSageMaker, overrides: dict[str, Any], problem: str
) -> None:
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan("team-plan", **overrides))

    with pytest.raises(capacity.CapacityError, match=problem):
        run(stubbed_sagemaker, event("Create", EXISTING))

    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]


def test_existing_plan_that_fits_returns_its_arn_without_buying(stubbed_sagemaker: StubbedSageMaker) -> None:
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan("team-plan", status="Active"))

    result = run(stubbed_sagemaker, event("Create", EXISTING))

    assert result["PhysicalResourceId"] == plan_arn("team-plan")
    assert result["Data"]["Status"] == "Active"
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]


def test_existing_plan_that_does_not_exist_fails(stubbed_sagemaker: StubbedSageMaker) -> None:
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", **NOT_FOUND)

    with pytest.raises(capacity.CapacityError, match="does not exist in this account/region: fix the ARN"):
        run(stubbed_sagemaker, event("Create", EXISTING))


def test_access_denied_is_one_line(stubbed_sagemaker: StubbedSageMaker) -> None:
    stubbed_sagemaker.stubber.add_client_error(
        "describe_training_plan",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized\nto perform sagemaker:DescribeTrainingPlan",
        http_status_code=403,
    )

    with pytest.raises(capacity.CapacityError) as raised:
        run(stubbed_sagemaker, event("Create", RESERVE))

    assert str(raised.value) == (
        "DescribeTrainingPlan failed: AccessDeniedException: User is not authorized to perform "
        "sagemaker:DescribeTrainingPlan"
    )
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({**RESERVE, "MaxUpfrontFee": ""}, "MaxUpfrontFee must be a positive number"),
        ({**RESERVE, "MaxUpfrontFee": "-5"}, "MaxUpfrontFee must be a positive number"),
        ({k: v for k, v in RESERVE.items() if k != "DurationHours"}, "reservation property DurationHours is missing"),
        ({**RESERVE, "StartAfter": "next monday"}, "StartAfter 'next monday' is not an ISO-8601 time"),
        ({**RESERVE, "Mode": "buy"}, "Mode 'buy' is not existing or reserve"),
    ],
)
def test_bad_properties_fail_before_any_call(
    stubbed_sagemaker: StubbedSageMaker, properties: dict[str, str], message: str
) -> None:
    with pytest.raises(capacity.CapacityError, match=message):
        run(stubbed_sagemaker, event("Create", properties))

    assert stubbed_sagemaker.calls == []


def test_a_plan_whose_payment_fails_fails_the_deploy_while_waiting(stubbed_sagemaker: StubbedSageMaker) -> None:
    expect_not_bought_yet(stubbed_sagemaker)
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": [offering("tpo-1")]}, SEARCH
    )
    stubbed_sagemaker.stubber.add_response(
        "create_training_plan",
        {"TrainingPlanArn": plan_arn(NAME)},
        {"TrainingPlanName": NAME, "TrainingPlanOfferingId": "tpo-1"},
    )
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME, status="Pending"))
    failed = {**described_plan(NAME, status="Failed"), "StatusMessage": "Payment declined"}
    stubbed_sagemaker.stubber.add_response("describe_training_plan", failed)

    with pytest.raises(capacity.CapacityError, match=f"training plan {NAME} is Failed: Payment declined"):
        run(stubbed_sagemaker, event("Create", RESERVE))

    assert stubbed_sagemaker.calls.count("CreateTrainingPlan") == 1
    stubbed_sagemaker.done()


def test_on_event_returns_without_waiting_and_is_complete_reports_pending_until_the_deadline(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    """onEvent never polls (the framework does); isComplete says not complete, then complete as Pending
    past WaitUntil."""
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME, status="Pending"))
    clock = FakeClock()
    clock.now = 1000.0

    response = handler.handle(event("Create", RESERVE), stubbed_sagemaker.client, clock=clock.clock)

    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]
    assert response["Data"]["WaitUntil"] == "1600"
    check_event = {**event("Create", RESERVE), "PhysicalResourceId": plan_arn(NAME), "Data": response["Data"]}
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME, status="Pending"))
    clock.now = 1599.0
    assert handler.check_complete(check_event, stubbed_sagemaker.client, clock=clock.clock) == {"IsComplete": False}
    stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan(NAME, status="Pending"))
    clock.now = 1600.0
    assert handler.check_complete(check_event, stubbed_sagemaker.client, clock=clock.clock) == {
        "IsComplete": True, "Data": {"Status": "Pending"}}
