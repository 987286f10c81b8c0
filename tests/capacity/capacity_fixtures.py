"""Shared values and builders of the training-plan tests (the ``stubbed_sagemaker`` fixture is in conftest.py).

moto does not implement the training-plan APIs, so every test queues the exact responses with
``botocore.stub.Stubber`` (which also validates each request against botocore's service model)
and asserts the list of operations actually called.

A uniquely named module, not ``conftest``: ``from conftest import ...`` picks whichever
folder's conftest was loaded first when several test folders run in one pytest session.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from botocore.stub import Stubber

from btk import capacity

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ACCOUNT = "123456789012"
REGION = "us-east-1"
AZ = "us-east-1a"
INSTANCE = "ml.p6-b200.48xlarge"
START = datetime(2026, 3, 2, tzinfo=UTC)
#: The reservation most tests ask for: 2 instances for a week from START in the environment's AZ.
REQUEST = capacity.ReservationRequest(
    environment="prod",
    instance_type=INSTANCE,
    instance_count=2,
    start_after=START,
    duration_hours=168,
    availability_zone=AZ,
)


@dataclass
class StubbedSageMaker:
    """A real botocore SageMaker client, its Stubber, and the operations called, in order."""

    client: Any
    stubber: Stubber
    calls: list[str] = field(default_factory=list)

    def done(self) -> None:
        self.stubber.assert_no_pending_responses()


def load_handler() -> ModuleType:
    """``training_constructs/lambda/training_plan/index.py`` (``lambda`` is a keyword: no import)."""
    path = REPO / "training_constructs" / "lambda" / "training_plan" / "index.py"
    spec = importlib.util.spec_from_file_location("training_plan_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan_arn(name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/{name}"


def offering(
    offering_id: str,
    *,
    fee: str | None = "100000.00",
    az: str = AZ,
    start: datetime = START,
    hours: int = 168,
    count: int = 2,
    instance_type: str = INSTANCE,
    targets: tuple[str, ...] = ("training-job",),
    currency: str | None = "USD",
) -> dict[str, Any]:
    """One SearchTrainingPlanOfferings item, as the API returns it."""
    item: dict[str, Any] = {
        "TrainingPlanOfferingId": offering_id,
        "TargetResources": list(targets),
        "DurationHours": hours,
        "DurationMinutes": 0,
        "ReservedCapacityOfferings": [
            {
                "InstanceType": instance_type,
                "InstanceCount": count,
                "AvailabilityZone": az,
                "DurationHours": hours,
                "DurationMinutes": 0,
                "StartTime": start,
                "EndTime": start + timedelta(hours=hours),
            }
        ],
    }
    if fee is not None:
        item["UpfrontFee"] = fee
    if currency is not None:
        item["CurrencyCode"] = currency
    return item


def described_plan(
    name: str,
    *,
    status: str = "Scheduled",
    az: str = AZ,
    instance_type: str = INSTANCE,
    count: int = 2,
    targets: tuple[str, ...] = ("training-job",),
) -> dict[str, Any]:
    """A DescribeTrainingPlan response."""
    return {
        "TrainingPlanArn": plan_arn(name),
        "TrainingPlanName": name,
        "Status": status,
        "DurationHours": 168,
        "StartTime": START,
        "EndTime": START + timedelta(hours=168),
        "UpfrontFee": "100000.00",
        "CurrencyCode": "USD",
        "TotalInstanceCount": count,
        "TargetResources": list(targets),
        "ReservedCapacitySummaries": [
            {
                "ReservedCapacityArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:reserved-capacity/{name}-rc",
                "InstanceType": instance_type,
                "TotalInstanceCount": count,
                "Status": status,
                "AvailabilityZone": az,
                "StartTime": START,
                "EndTime": START + timedelta(hours=168),
            }
        ],
    }


class FakeClock:
    """Injectable clock and sleep: sleeping advances the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
