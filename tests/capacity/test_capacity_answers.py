"""AWS answers outside their documented shape, and listings that never end: one line, nothing bought.

A Stubber refuses to serve an answer outside the service model, so these cases answer from a
stand-in client (:class:`Answers`) that serves exactly what it is given. The library raises one
``CapacityError`` line naming the call, the reservation handler fails the deploy with that line
(the Provider framework reports it as the resource's FAILED reason), and ``btk capacity`` exits 2
with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import fixture_catalog
import pytest
from botocore.exceptions import ClientError
from capacity_fixtures import AZ, INSTANCE, REQUEST, START, described_plan, load_handler, offering

from btk import capacity
from btk.cli import main
from btk.environment import EnvironmentConfig, ReservePlanCapacity
from btk.pagination import MAX_PAGES

handler = load_handler()
NOW = START - timedelta(days=3)
RESERVE_PROPERTIES: dict[str, str] = {
    "Mode": "reserve",
    "Environment": REQUEST.environment,
    "InstanceType": INSTANCE,
    "InstanceCount": str(REQUEST.instance_count),
    "StartAfter": capacity.iso(START),
    "EndBefore": "",
    "DurationHours": str(REQUEST.duration_hours),
    "AvailabilityZone": AZ,
    "MaxUpfrontFee": "150000",
    "PurchaseApproved": "true",
}
CREATE = {"RequestType": "Create", "LogicalResourceId": "Plan", "ResourceProperties": RESERVE_PROPERTIES}
RESERVE_ENV = EnvironmentConfig(
    name=REQUEST.environment,
    availability_zone=AZ,
    profiles=("llama3.1-8b",),
    instance_count=2,
    capacity=ReservePlanCapacity(
        start_after=START, duration_hours=168, instance_count=2, max_upfront_fee=150000, purchase_approved=True
    ),
)


def not_found(**_: Any) -> Any:
    raise ClientError({"Error": {"Code": "ResourceNotFound", "Message": "no such plan"}}, "DescribeTrainingPlan")


@dataclass
class Answers:
    """A SageMaker stand-in: each operation answers with its function; the calls are recorded."""

    answers: dict[str, Callable[..., Any]]
    calls: list[str] = field(default_factory=list)

    def __getattr__(self, operation: str) -> Any:
        if operation.startswith("_") or operation not in self.answers:
            raise AttributeError(operation)

        def answer(**parameters: Any) -> Any:
            self.calls.append(operation)
            assert len(self.calls) < 2 * MAX_PAGES, "the listing was followed without end"
            return self.answers[operation](**parameters)

        return answer


def for_purchase(offerings: Any, plans: Any = None) -> Answers:
    """No plan of the reservation's name, ``plans`` as the ListTrainingPlans answer, ``offerings`` found."""
    return Answers(
        {
            "describe_training_plan": not_found,
            "list_training_plans": lambda **_: {"TrainingPlanSummaries": []} if plans is None else plans,
            "search_training_plan_offerings": lambda **_: offerings,
            "create_training_plan": lambda **_: {"TrainingPlanArn": "arn:aws:sagemaker:::training-plan/x"},
        }
    )


def with_(item: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    target: Any = item
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return item


def without(item: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    target: Any = item
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return item


SEARCH_OUTSIDE = "sagemaker:SearchTrainingPlanOfferings answered outside its documented shape"
OFF_SHAPE_OFFERINGS = [
    ({"TrainingPlanOfferings": None}, "TrainingPlanOfferings is null"),
    ({}, "TrainingPlanOfferings is missing"),
    ({"TrainingPlanOfferings": {"a": 1}}, "TrainingPlanOfferings is an object, not a list"),
    ({"TrainingPlanOfferings": [None]}, "TrainingPlanOfferings[0] is null"),
    ({"TrainingPlanOfferings": [without(offering("t"), ("TrainingPlanOfferingId",))]},
     "TrainingPlanOfferings[0].TrainingPlanOfferingId is missing"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("UpfrontFee",), None)]},
     "TrainingPlanOfferings[0].UpfrontFee is null"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("UpfrontFee",), 100)]},
     "TrainingPlanOfferings[0].UpfrontFee is a number, not text"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("CurrencyCode",), None)]},
     "TrainingPlanOfferings[0].CurrencyCode is null"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("DurationHours",), "168")]},
     "TrainingPlanOfferings[0].DurationHours is text, not a whole number"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("DurationHours",), -168)]},
     "TrainingPlanOfferings[0].DurationHours -168 is below its documented minimum 0"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("ReservedCapacityOfferings",), None)]},
     "TrainingPlanOfferings[0].ReservedCapacityOfferings is null"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("ReservedCapacityOfferings", 0, "InstanceCount"), True)]},
     "TrainingPlanOfferings[0].ReservedCapacityOfferings[0].InstanceCount is a boolean, not a whole number"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("ReservedCapacityOfferings", 0, "StartTime"), "2026-03-02")]},
     "TrainingPlanOfferings[0].ReservedCapacityOfferings[0].StartTime is text, not a time"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("ReservedCapacityOfferings", 0, "StartTime"),
                                      START.replace(tzinfo=None))]},
     "TrainingPlanOfferings[0].ReservedCapacityOfferings[0].StartTime is a time without a time zone"),
    ({"TrainingPlanOfferings": [with_(offering("t"), ("TargetResources",), "training-job")]},
     "TrainingPlanOfferings[0].TargetResources is text, not a list"),
    ("not an answer", "the answer is text, not an object"),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "problem"), OFF_SHAPE_OFFERINGS)
def test_an_offering_answer_outside_its_shape_is_one_line_and_buys_nothing(answer: Any, problem: str) -> None:
    client = for_purchase(answer)
    with pytest.raises(capacity.CapacityError) as raised:
        capacity.find_or_buy_plan(client, REQUEST, max_upfront_fee=150_000.0, purchase_approved=True, now=lambda: NOW)
    assert str(raised.value) == f"{SEARCH_OUTSIDE}: {problem}"
    assert "create_training_plan" not in client.calls


@pytest.mark.parametrize(("answer", "problem"), OFF_SHAPE_OFFERINGS[:6])
def test_the_handler_fails_the_deploy_with_the_line(answer: Any, problem: str) -> None:
    client = for_purchase(answer)
    with pytest.raises(capacity.CapacityError) as raised:
        handler.handle(CREATE, client)
    assert str(raised.value) == f"{SEARCH_OUTSIDE}: {problem}"
    assert "create_training_plan" not in client.calls


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({}, "TrainingPlanArn is missing"),
        ({"TrainingPlanArn": None}, "TrainingPlanArn is null"),
        ({"TrainingPlanArn": ["arn"]}, "TrainingPlanArn is a list, not text"),
    ],
)
def test_a_purchase_answer_outside_its_shape_is_one_line(answer: Any, problem: str) -> None:
    client = for_purchase({"TrainingPlanOfferings": [offering("tpo-ok")]})
    client.answers["create_training_plan"] = lambda **_: answer
    with pytest.raises(capacity.CapacityError) as raised:
        handler.handle(CREATE, client)
    assert str(raised.value) == f"sagemaker:CreateTrainingPlan answered outside its documented shape: {problem}"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda plan: plan.pop("Status"), "Status is missing"),
        (lambda plan: plan.update(TotalInstanceCount=None), "TotalInstanceCount is null"),
        (lambda plan: plan.update(ReservedCapacitySummaries=[None]), "ReservedCapacitySummaries[0] is null"),
        (lambda plan: plan.update(EndTime="soon"), "EndTime is text, not a time"),
        (lambda plan: plan.update(TotalInstanceCount=2**40),
         "TotalInstanceCount 1099511627776 is beyond a 32-bit integer"),
    ],
)  # fmt: skip
def test_a_described_plan_outside_its_shape_is_one_line(change: Callable[[dict[str, Any]], Any], problem: str) -> None:
    plan = described_plan(REQUEST.plan_name())
    change(plan)
    client = Answers({"describe_training_plan": lambda **_: plan})
    with pytest.raises(capacity.CapacityError) as raised:
        handler.handle(CREATE, client)
    assert str(raised.value) == f"sagemaker:DescribeTrainingPlan answered outside its documented shape: {problem}"


def summary(name: str) -> dict[str, Any]:
    plan = described_plan(name)
    return {key: plan[key] for key in ("TrainingPlanArn", "TrainingPlanName", "Status")}


def repeating(**parameters: Any) -> dict[str, Any]:
    """ListTrainingPlans that names the same next page on every page: a plain ``while token`` never ends."""
    return {"TrainingPlanSummaries": [summary("team-plan")], "NextToken": "again"}


def endless(**parameters: Any) -> dict[str, Any]:
    """ListTrainingPlans with a new next page on every page, forever."""
    page = int(parameters.get("NextToken", "0")) + 1
    return {"TrainingPlanSummaries": [], "NextToken": str(page)}


@pytest.mark.parametrize(
    ("listing", "problem"),
    [
        (repeating, "sagemaker:ListTrainingPlans repeated a page token after 2 pages"),
        (endless, f"sagemaker:ListTrainingPlans gave more than {capacity.LIST_PLANS_MAX_PAGES} pages"),
        (lambda **_: {"TrainingPlanSummaries": [summary("x")], "NextToken": 7},
         "sagemaker:ListTrainingPlans answered outside its documented shape: NextToken is a number, not text"),
        (lambda **_: {"TrainingPlanSummaries": [{"TrainingPlanName": "x"}]},
         "sagemaker:ListTrainingPlans answered outside its documented shape: "
         "TrainingPlanSummaries[0].TrainingPlanArn is missing"),
    ],
)  # fmt: skip
def test_a_plan_listing_that_never_ends_or_is_malformed_fails_the_deploy_in_one_line(
    listing: Callable[..., Any], problem: str
) -> None:
    client = for_purchase({"TrainingPlanOfferings": [offering("tpo-ok")]})
    client.answers["list_training_plans"] = listing
    with pytest.raises(capacity.CapacityError) as raised:
        handler.handle(CREATE, client)
    assert str(raised.value).startswith(problem) and "\n" not in str(raised.value)
    assert "create_training_plan" not in client.calls
    assert client.calls.count("list_training_plans") <= capacity.LIST_PLANS_MAX_PAGES


def test_the_lambda_entry_point_fails_an_unforeseen_error_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_: Any) -> Any:
        raise KeyError("TrainingPlanArn")

    monkeypatch.setattr(handler, "sagemaker_client", lambda: Answers({"describe_training_plan": broken}))
    with pytest.raises(capacity.CapacityError) as raised:
        handler.on_event(CREATE, None)
    assert str(raised.value) == (
        "the training-plan handler failed: KeyError: 'TrainingPlanArn' (see the function's log)"
    )


@pytest.mark.parametrize("command", ["show", "search"])
def test_btk_capacity_exits_2_with_one_line_on_a_looping_or_malformed_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    fixture_catalog.install(monkeypatch, RESERVE_ENV)
    client = Answers(
        {
            "describe_training_plan": not_found,
            "list_training_plans": repeating,
            "search_training_plan_offerings": lambda **_: {"TrainingPlanOfferings": [{"TargetResources": None}]},
        }
    )
    monkeypatch.setattr("btk.cli.capacity.sagemaker_client", lambda region: client)
    argv = ["capacity", command, "--env", RESERVE_ENV.name]
    code = main(argv if command == "show" else [*argv, "--profile", "llama3.1-8b"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    expected = {
        "show": "btk: error: sagemaker:ListTrainingPlans repeated a page token after 2 pages",
        "search": "btk: error: sagemaker:SearchTrainingPlanOfferings answered outside its documented shape: "
        "TrainingPlanOfferings[0].TrainingPlanOfferingId is missing",
    }[command]
    assert err.startswith(expected) and err.count("\n") == 1
