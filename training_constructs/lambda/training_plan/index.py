"""Custom-resource handlers (CDK Provider framework ``onEvent`` and ``isComplete``) for a SageMaker training plan.

The asset holds this file plus a copy of the ``btk/capacity`` package and of ``btk/pagination.py``
(bundled at synth by ``training_constructs/training_plan.py``), so all training-plan logic has one
source; this module only maps CloudFormation lifecycle events onto it:

- ``existing`` mode: Create/Update verify the configured plan (exists, serves training jobs,
  instance type, AZ, instance count); the physical id is the plan ARN; complete at once.
- ``reserve`` mode: Create finds the plan by its deterministic name or buys the best eligible
  offering (fee <= ceiling, environment's AZ, purchase approved); otherwise the deploy fails
  with the offerings listed. ``onEvent`` returns as soon as the plan exists; ``isComplete``,
  called by the framework every query interval, answers complete once the plan is
  Scheduled/Active and fits the reservation, fails the deploy when it is Failed/Expired, and
  answers complete with ``Status`` Pending once ``WaitSeconds`` have passed since the purchase
  (a plan stays Pending until its payment clears): the bought plan is kept and nothing else of
  the stack rolls back; ``btk doctor`` reports when it is Scheduled.
- Update: a no-op (same physical id and ARN, no API call) unless the reservation inputs
  changed, in which case it behaves like Create for the new inputs.
- Delete: no API call. A plan has no delete API and expires on its own end date.

Custom-resource property values arrive as strings; ``Data.PlanArn`` is what the stack reads.
A failure is raised as one line, which the Provider framework reports to CloudFormation as the
resource's FAILED reason: every AWS answer is held to its documented shape and every listing is
bounded, so an odd answer fails the deploy at once with the call named instead of running the
function to its timeout.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from typing import Any

from btk import capacity

#: Properties whose change may lead to a different plan; anything else is never a reason to buy.
IDENTITY_PROPERTIES = (
    "Mode",
    "PlanArn",
    "Environment",
    "InstanceType",
    "InstanceCount",
    "StartAfter",
    "EndBefore",
    "DurationHours",
    "AvailabilityZone",
    "UltraServerType",
    "UltraServerCount",
)
#: ``Data`` key of the instant (epoch seconds) after which a plan still Pending completes the resource as Pending.
WAIT_UNTIL = "WaitUntil"


def sagemaker_client() -> Any:
    """The client the handlers use in Lambda (tests pass a stubbed one to :func:`handle`)."""
    import boto3

    return boto3.client("sagemaker")


def on_event(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point of ``onEvent``."""
    return _failing_in_one_line(lambda: handle(event, sagemaker_client()))


def is_complete(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point of ``isComplete``."""
    return _failing_in_one_line(lambda: check_complete(event, sagemaker_client()))


def _failing_in_one_line(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``step()``; an error the handlers did not foresee still fails the deploy with one readable line
    (its traceback goes to the function's log), never a bare ``KeyError: 'x'``."""
    try:
        return step()
    except capacity.CapacityError:
        raise
    except Exception as error:
        _log({"UnexpectedError": traceback.format_exc()})
        detail = " ".join(str(error).split())
        raise capacity.CapacityError(
            f"the training-plan handler failed: {type(error).__name__}: {detail} (see the function's log)"
        ) from None


def handle(event: dict[str, Any], client: Any, *, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Handle one ``onEvent`` with ``client``; returns the framework's response."""
    request_type = event["RequestType"]
    properties: dict[str, Any] = dict(event.get("ResourceProperties") or {})
    physical_id = event.get("PhysicalResourceId")
    _log({"RequestType": request_type, "LogicalResourceId": event.get("LogicalResourceId"), "Properties": properties})

    if request_type == "Delete":
        message = (
            f"training plan {physical_id} is left in place: a plan cannot be deleted or refunded and "
            "expires on its own end date"
        )
        _log({"Delete": message})
        return {"PhysicalResourceId": physical_id, "Data": {"Message": message}}

    old_properties = event.get("OldResourceProperties") or {}
    if request_type == "Update" and physical_id and _same_identity(old_properties, properties):
        _log({"Update": "reservation inputs unchanged: no API call", "PlanArn": physical_id})
        return _response(physical_id, name=str(physical_id).rsplit("/", 1)[-1], status="Unchanged", bought=False)

    if request_type not in ("Create", "Update"):
        raise capacity.CapacityError(f"unknown RequestType {request_type!r}")

    mode = properties.get("Mode")
    if mode == "existing":
        plan = capacity.verify_existing_plan(
            client,
            str(properties.get("PlanArn", "")),
            instance_type=str(properties.get("InstanceType", "")),
            availability_zone=str(properties.get("AvailabilityZone", "")),
            instance_count=int(properties.get("InstanceCount", 1)),
        )
        return _response(plan.arn, name=plan.name, status=plan.status, bought=False)
    if mode == "reserve":
        request = capacity.ReservationRequest.from_properties(properties)
        purchase = capacity.find_or_buy_plan(
            client,
            request,
            max_upfront_fee=_fee_ceiling(properties),
            purchase_approved=str(properties.get("PurchaseApproved", "")).lower() == "true",
        )
        _log(
            {
                "PlanArn": purchase.arn,
                "Bought": purchase.bought,
                "Offering": purchase.offering.to_json() if purchase.offering else None,
            }
        )
        response = _response(purchase.arn, name=purchase.name, status="Pending", bought=purchase.bought)
        response["Data"][WAIT_UNTIL] = str(int(clock() + _wait_seconds(properties)))
        return response
    raise capacity.CapacityError(f"Mode {mode!r} is not existing or reserve")


def check_complete(event: dict[str, Any], client: Any, *, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Handle one ``isComplete``: ``{"IsComplete": bool}``, with the plan's status once it may be used."""
    data: dict[str, Any] = dict(event.get("Data") or {})
    if event["RequestType"] == "Delete" or WAIT_UNTIL not in data:
        return {"IsComplete": True}
    properties: dict[str, Any] = dict(event.get("ResourceProperties") or {})
    request = capacity.ReservationRequest.from_properties(properties)
    plan = capacity.ready_plan(client, request)
    if plan is not None:
        _log({"PlanArn": plan.arn, "Status": plan.status})
        return {"IsComplete": True, "Data": {"Status": plan.status}}
    if clock() >= float(data[WAIT_UNTIL]):
        # The plan is bought; only its payment is still clearing. Failing here would roll back the whole
        # stack (on a first create, the file system and network too) for a plan that will be usable: the
        # deploy completes, the status says Pending, and `btk doctor` says when it is Scheduled.
        _log({"PlanName": request.plan_name(), "Status": "Pending", "Waited": _wait_seconds(properties),
              "Note": "the stack completes with the plan Pending; jobs can use it once it is Scheduled"})
        return {"IsComplete": True, "Data": {"Status": "Pending"}}
    _log({"PlanName": request.plan_name(), "Status": "Pending", WAIT_UNTIL: data[WAIT_UNTIL]})
    return {"IsComplete": False}


def _same_identity(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return all(str(old.get(key, "")) == str(new.get(key, "")) for key in IDENTITY_PROPERTIES)


def _fee_ceiling(properties: dict[str, Any]) -> float:
    fee = capacity.parse_fee(properties.get("MaxUpfrontFee"))
    if fee is None or fee <= 0:
        raise capacity.CapacityError("MaxUpfrontFee must be a positive number: set capacity.max_upfront_fee")
    return fee


def _wait_seconds(properties: dict[str, Any]) -> float:
    return float(properties.get("WaitSeconds") or capacity.DEFAULT_WAIT_SECONDS)


def _response(physical_id: str, *, name: str, status: str, bought: bool) -> dict[str, Any]:
    return {
        "PhysicalResourceId": physical_id,
        "Data": {"PlanArn": physical_id, "PlanName": name, "Status": status, "Bought": "true" if bought else "false"},
    }


def _log(record: dict[str, Any]) -> None:
    print(json.dumps(record, default=str, sort_keys=True))
