"""The training plan of an ``existing`` or ``reserve`` environment: status, fit, and hours left."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import fixture_catalog
import pytest
from doctor_fixtures import ACCOUNT, NOW, REGION, Error, doctor, findings_of, healthy_account, jobs_of, variant

from btk import capacity
from btk.catalog import get_environment
from btk.environment import EnvironmentConfig

PLAN_NAME = "btk-prod-plan"
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/{PLAN_NAME}"
#: The hours of a plan that do not train: SageMaker's termination lead (30 min) and the trainer's
#: final checkpoint margin (15 min), both stated with their sources in btk/capacity.py.
OVERHEAD_HOURS = (capacity.CAPACITY_TERMINATION_LEAD_SECONDS + capacity.CAPACITY_STOP_MARGIN_SECONDS) / 3600


def described_plan(
    env: EnvironmentConfig, *, name: str = PLAN_NAME, status: str = "Active", zone: str | None = None,
    count: int | None = None, start: datetime | None = None, hours: float = 24 * 14,
) -> dict[str, Any]:  # fmt: skip
    """DescribeTrainingPlan of a plan of ``env``'s instance type (by default one that fits it)."""
    count = count if count is not None else max(job.instance_count for job in jobs_of(env))
    start = start or NOW - timedelta(days=1)
    end = start + timedelta(hours=hours)
    return {
        "TrainingPlanArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/{name}",
        "TrainingPlanName": name,
        "Status": status,
        "DurationHours": int(hours),
        "DurationMinutes": 0,
        "StartTime": start,
        "EndTime": end,
        "UpfrontFee": "123456.78",
        "CurrencyCode": "USD",
        "TotalInstanceCount": count,
        "AvailableInstanceCount": count,
        "InUseInstanceCount": 0,
        "TargetResources": ["training-job"],
        "ReservedCapacitySummaries": [
            {
                "ReservedCapacityArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:reserved-capacity/{name}-rc",
                "InstanceType": env.instance_type,
                "TotalInstanceCount": count,
                "Status": status,
                "AvailabilityZone": zone or env.availability_zone,
                "StartTime": start,
                "EndTime": end,
            }
        ],
    }


def existing() -> EnvironmentConfig:
    return variant(get_environment("prod"), name="planned", capacity={"mode": "existing", "plan_arn": PLAN_ARN})


def reserving() -> EnvironmentConfig:
    return variant(
        get_environment("prod"), name="reserving",
        capacity={"mode": "reserve", "start_after": "2026-07-06T00:00:00Z", "duration_hours": 24 * 7,
                  "instance_count": 2, "max_upfront_fee": 500_000, "purchase_approved": True},
    )  # fmt: skip


def run(env: EnvironmentConfig, plan: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> tuple[int, dict[str, str]]:
    fixture_catalog.install(monkeypatch, env)
    aws = healthy_account(env, jobs_of(env))
    asked: list[str] = []

    def answer(params: dict[str, Any]) -> Any:
        asked.append(params["TrainingPlanName"])
        return plan

    aws.answers[("sagemaker", "DescribeTrainingPlan")] = answer
    code, lines = doctor(env.name, aws, capsys)
    aws.done()
    assert len(set(asked)) == 1
    return code, findings_of(lines)


def test_an_active_plan_that_fits_with_room_for_a_full_run_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = existing()
    code, found = run(env, described_plan(env), monkeypatch, capsys)
    assert code == 0
    assert found[f"training plan {PLAN_ARN}"].startswith(
        f"PASS training plan {PLAN_ARN}: Active, 2 x {env.instance_type} in {env.availability_zone}, ends "
    )
    left = 24 * 14 - 24 - OVERHEAD_HOURS
    assert found["training plan hours left"].startswith(f"PASS training plan hours left: {left:,.1f} usable hours left")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"zone": "us-east-1b"}, "AZ us-east-1b, not us-east-1a"),
        ({"count": 1}, "1 instances < instance_count 2"),
        ({"status": "Expired"}, "status Expired"),
    ],
)
def test_a_plan_that_does_not_fit_fails_with_why(
    change: dict[str, Any], problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = existing()
    code, found = run(env, described_plan(env, **change), monkeypatch, capsys)
    assert code == 1
    line = found[f"training plan {PLAN_ARN}"]
    assert line.startswith(f"FAIL training plan {PLAN_ARN}: ")
    assert f"does not fit: {problem}" in line
    assert line.endswith(
        "-> use a plan that fits or change the environment; btk capacity show --env planned explains it"
    )


def test_a_plan_arn_that_does_not_exist_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, found = run(existing(), Error("ResourceNotFound", "Training plan not found"), monkeypatch, capsys)
    assert code == 1
    assert found[f"training plan {PLAN_ARN}"].startswith(f"FAIL training plan {PLAN_ARN}: does not exist in {REGION}")
    assert found["training plan hours left"].startswith("WARN training plan hours left: no plan end to read")


def test_a_pending_plan_warns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env = existing()
    code, found = run(env, described_plan(env, status="Pending"), monkeypatch, capsys)
    assert code == 0
    assert found[f"training plan {PLAN_ARN}"].endswith("-> its payment is pending: wait until it is Scheduled")


def test_fewer_hours_left_than_a_job_may_run_warns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = existing()
    plan = described_plan(env, start=NOW - timedelta(hours=14), hours=24)  # ends in 10 hours
    code, found = run(env, plan, monkeypatch, capsys)
    assert code == 0
    assert found["training plan hours left"].startswith(
        f"WARN training plan hours left: {10 - OVERHEAD_HOURS:,.1f} usable hours left"
    )
    assert f"less than max_runtime_hours {env.max_runtime_hours}" in found["training plan hours left"]


def test_a_scheduled_plan_counts_its_hours_from_its_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = existing()
    plan = described_plan(env, status="Scheduled", start=NOW + timedelta(days=3), hours=24 * 7)
    code, found = run(env, plan, monkeypatch, capsys)
    assert code == 0
    assert found["training plan hours left"].startswith(
        f"PASS training plan hours left: {24 * 7 - OVERHEAD_HOURS:,.1f} usable hours left"
    )


def test_an_ended_plan_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env = existing()
    code, found = run(env, described_plan(env, start=NOW - timedelta(days=8), hours=24 * 7), monkeypatch, capsys)
    assert code == 1
    assert found["training plan hours left"].startswith("FAIL training plan hours left: the plan ended at ")


def test_a_reservation_not_bought_yet_warns_and_prices_its_hours(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = reserving()
    name = capacity.reservation_request(env).plan_name()
    code, found = run(env, Error("ResourceNotFound", f"{name} not found"), monkeypatch, capsys)
    assert code == 0
    assert found[f"training plan {name}"] == (
        f"WARN training plan {name}: not bought yet -> the next cdk deploy buys it within max_upfront_fee; "
        "btk capacity search --env reserving shows the offerings"
    )
    assert found["training plan hours left"].startswith(
        f"PASS training plan hours left: {24 * 7 - OVERHEAD_HOURS:,.1f} usable hours once bought (duration_hours 168)"
    )


def test_a_bought_reservation_is_read_by_its_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = reserving()
    name = capacity.reservation_request(env).plan_name()
    code, found = run(env, described_plan(env, name=name, status="Scheduled"), monkeypatch, capsys)
    assert code == 0
    assert found[f"training plan {name}"].startswith(f"PASS training plan {name}: Scheduled")


def test_on_demand_environments_have_no_plan_lines(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment("prod")
    _, lines = doctor(env.name, healthy_account(env, jobs_of(env)), capsys)
    assert not [check for check in findings_of(lines) if check.startswith("training plan")]
