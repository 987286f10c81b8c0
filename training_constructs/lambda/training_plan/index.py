"""Custom-resource handler (CDK Provider framework ``onEvent``) for a SageMaker training plan.

The asset holds this file plus a copy of ``btk/capacity.py`` (bundled at synth by
``training_constructs/training_plan.py``), so all training-plan logic has one source; this
module only maps CloudFormation lifecycle events onto it:

- ``existing`` mode: Create/Update verify the configured plan (exists, serves training jobs,
  instance type, AZ, instance count); the physical id is the plan ARN.
- ``reserve`` mode: Create finds the plan by its deterministic name or buys the best eligible
  offering (fee <= ceiling, environment's AZ, purchase approved); otherwise the deploy fails
  with the offerings listed.
- Update: a no-op (same physical id and ARN, no API call) unless the reservation inputs
  changed, in which case it behaves like Create for the new inputs.
- Delete: no API call. A plan has no delete API and expires on its own end date.

Custom-resource property values arrive as strings; ``Data.PlanArn`` is what the stack reads.
"""

from __future__ import annotations

import json
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
)
#: Seconds kept free at the end of the invocation to report back to CloudFormation.
RESPONSE_MARGIN_SECONDS = 30.0


def sagemaker_client() -> Any:
    """The client the handler uses in Lambda (tests pass a stubbed one to :func:`handle`)."""
    import boto3

    return boto3.client("sagemaker")


def on_event(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point."""
    remaining = _remaining_seconds(context)
    return handle(event, sagemaker_client(), remaining_seconds=remaining)


def handle(
    event: dict[str, Any],
    client: Any,
    *,
    remaining_seconds: float | None = None,
    sleep: Any = None,
    clock: Any = None,
) -> dict[str, Any]:
    """Handle one Provider-framework event with ``client``; returns the framework's response."""
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
        wait: dict[str, Any] = {"timeout_seconds": _wait_seconds(properties, remaining_seconds)}
        if sleep is not None:
            wait["sleep"] = sleep
        if clock is not None:
            wait["clock"] = clock
        reservation = capacity.ensure_reserved_plan(
            client,
            request,
            max_upfront_fee=_fee_ceiling(properties),
            purchase_approved=str(properties.get("PurchaseApproved", "")).lower() == "true",
            **wait,
        )
        _log(
            {
                "PlanArn": reservation.plan.arn,
                "Bought": reservation.bought,
                "Offering": reservation.offering.to_json() if reservation.offering else None,
            }
        )
        plan = reservation.plan
        return _response(plan.arn, name=plan.name, status=plan.status, bought=reservation.bought)
    raise capacity.CapacityError(f"Mode {mode!r} is not existing or reserve")


def _same_identity(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return all(str(old.get(key, "")) == str(new.get(key, "")) for key in IDENTITY_PROPERTIES)


def _fee_ceiling(properties: dict[str, Any]) -> float:
    fee = capacity.parse_fee(properties.get("MaxUpfrontFee"))
    if fee is None or fee <= 0:
        raise capacity.CapacityError("MaxUpfrontFee must be a positive number: set capacity.max_upfront_fee")
    return fee


def _wait_seconds(properties: dict[str, Any], remaining_seconds: float | None) -> float:
    wanted = float(properties.get("WaitSeconds") or capacity.DEFAULT_WAIT_SECONDS)
    if remaining_seconds is None:
        return wanted
    return max(0.0, min(wanted, remaining_seconds - RESPONSE_MARGIN_SECONDS))


def _remaining_seconds(context: Any) -> float | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000.0 if callable(remaining) else None


def _response(physical_id: str, *, name: str, status: str, bought: bool) -> dict[str, Any]:
    return {
        "PhysicalResourceId": physical_id,
        "Data": {"PlanArn": physical_id, "PlanName": name, "Status": status, "Bought": "true" if bought else "false"},
    }


def _log(record: dict[str, Any]) -> None:
    print(json.dumps(record, default=str, sort_keys=True))
