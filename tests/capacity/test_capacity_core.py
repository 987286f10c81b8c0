"""btk.capacity: names, ranking, pagination, waiting, and one-line AWS errors."""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import NoCredentialsError
from capacity_fixtures import (
    AZ,
    INSTANCE,
    REQUEST,
    START,
    FakeClock,
    StubbedSageMaker,
    described_plan,
    offering,
    plan_arn,
)
from hypothesis import given
from hypothesis import strategies as st

from btk import capacity, pagination

NAME_PATTERN = (
    botocore.session.get_session().get_service_model("sagemaker").shape_for("TrainingPlanName").metadata["pattern"]
)


def test_plan_name_is_deterministic_and_valid_for_the_api() -> None:
    name = REQUEST.plan_name()
    assert re.fullmatch(r"btk-prod-[0-9a-f]{8}", name)
    assert name == replace(REQUEST).plan_name()
    assert re.fullmatch(NAME_PATTERN, name)


@pytest.mark.parametrize(
    "change",
    [
        {"environment": "staging"},
        {"instance_type": "ml.p5.48xlarge"},
        {"instance_count": 4},
        {"start_after": START + timedelta(days=1)},
        {"end_before": START + timedelta(days=30)},
        {"duration_hours": 336},
        {"availability_zone": "us-east-1b"},
    ],
)
def test_every_reservation_input_changes_the_name(change: dict[str, Any]) -> None:
    assert replace(REQUEST, **change).plan_name() != REQUEST.plan_name()


def test_the_same_instant_in_another_zone_gives_the_same_name() -> None:
    shifted = START.astimezone(__import__("zoneinfo").ZoneInfo("America/New_York"))
    naive = START.replace(tzinfo=None)
    assert replace(REQUEST, start_after=shifted).plan_name() == REQUEST.plan_name()
    assert replace(REQUEST, start_after=naive).plan_name() == REQUEST.plan_name()


@given(st.from_regex(r"[a-z][a-z0-9-]{1,20}", fullmatch=True))
def test_any_environment_name_yields_a_valid_name_of_at_most_63_characters(environment: str) -> None:
    name = replace(REQUEST, environment=environment).plan_name()
    assert len(name) <= capacity.PLAN_NAME_MAX
    assert re.fullmatch(NAME_PATTERN, name), name


@given(st.from_regex(r"[a-z][a-z0-9-]{1,20}", fullmatch=True), st.from_regex(r"[a-z0-9-]{1,8}", fullmatch=True))
def test_a_plan_name_belongs_to_exactly_its_environment(environment: str, suffix: str) -> None:
    """Names of env ``dev`` never pass for env ``dev-<suffix>``'s and back (IAM and ``show`` rely on it)."""
    name = replace(REQUEST, environment=environment).plan_name()
    assert name.startswith(capacity.plan_name_prefix(environment))
    assert capacity.is_environment_plan(name, environment)
    longer = f"{environment}-{suffix}"
    other = replace(REQUEST, environment=longer).plan_name()
    if capacity.plan_name_prefix(longer) != capacity.plan_name_prefix(environment):
        assert not capacity.is_environment_plan(other, environment)
        assert not capacity.is_environment_plan(name, longer)


@pytest.mark.parametrize(
    ("name", "environment", "mine"),
    [
        ("btk-dev-0a1b2c3d", "dev", True),
        ("btk-dev-eu-0a1b2c3d", "dev", False),
        ("btk-dev-0a1b2c3", "dev", False),
        ("btk-dev-0a1b2c3dd", "dev", False),
        ("btk-dev-0A1B2C3D", "dev", False),
        ("btk-a-b-0a1b2c3d", "a--b", True),
        ("team-plan", "dev", False),
    ],
)
def test_is_environment_plan(name: str, environment: str, mine: bool) -> None:
    assert capacity.is_environment_plan(name, environment) is mine


def test_properties_round_trip_and_are_all_strings() -> None:
    request = replace(REQUEST, end_before=START + timedelta(days=20))
    properties = request.to_properties()
    assert all(isinstance(value, str) for value in properties.values())
    assert capacity.ReservationRequest.from_properties(properties) == request


def test_search_parameters_match_the_api() -> None:
    request = replace(REQUEST, end_before=START + timedelta(days=20))
    assert request.search_parameters() == {
        "TargetResources": ["training-job"],
        "InstanceType": INSTANCE,
        "InstanceCount": 2,
        "StartTimeAfter": START,
        "EndTimeBefore": START + timedelta(days=20),
        "DurationHours": 168,
    }


def test_ranking_puts_the_az_first_then_earliest_start_then_lowest_fee_then_id() -> None:
    later = START + timedelta(days=3)
    items = [
        capacity.Offering.from_api(offering("b-cheap-other-az", fee="10.00", az="us-east-1b")),
        capacity.Offering.from_api(offering("z-late", fee="10.00", start=later)),
        capacity.Offering.from_api(offering("y-dear", fee="300.00")),
        capacity.Offering.from_api(offering("x-cheap", fee="200.00")),
        capacity.Offering.from_api(offering("w-cheap-twin", fee="200.00")),
        capacity.Offering.from_api(offering("v-no-fee", fee=None)),
    ]
    expected = ["w-cheap-twin", "x-cheap", "y-dear", "v-no-fee", "z-late", "b-cheap-other-az"]
    for order in itertools.permutations(items):
        assert [item.offering_id for item in capacity.rank_offerings(order, AZ)] == expected


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (offering("ok", fee="100.00"), None),
        (offering("hp", targets=("hyperpod-cluster",)), "targets hyperpod-cluster, not training-job"),
        (offering("az", az="us-east-1d"), "AZ us-east-1d is not the environment's us-east-1a"),
        (offering("type", instance_type="ml.p5.48xlarge"), "instance type ml.p5.48xlarge, not ml.p6-b200.48xlarge"),
        (offering("few", count=1), "1 instances, not 2"),
        (offering("nofee", fee=None), "the offering states no up-front fee"),
        (offering("badfee", fee="call us"), "the offering states no up-front fee"),
        (offering("dear", fee="1,000.01"), "fee 1,000.01 USD > max_upfront_fee 1,000.00"),
    ],
)
def test_rejection_names_the_reason(item: dict[str, object], reason: str | None) -> None:
    assert capacity.rejection(capacity.Offering.from_api(item), REQUEST, 1000.0) == reason


def test_list_plans_follows_every_page_and_filters_by_prefix(stubbed_sagemaker: StubbedSageMaker) -> None:
    def summary(name: str) -> dict[str, object]:
        plan = described_plan(name)
        return {key: plan[key] for key in ("TrainingPlanArn", "TrainingPlanName", "Status", "TotalInstanceCount")}

    base = {"MaxResults": 100, "SortBy": "StartTime", "SortOrder": "Ascending"}
    stubbed_sagemaker.stubber.add_response(
        "list_training_plans",
        {"TrainingPlanSummaries": [summary("btk-prod-00000001"), summary("team-plan")], "NextToken": "p2"},
        base,
    )
    stubbed_sagemaker.stubber.add_response(
        "list_training_plans", {"TrainingPlanSummaries": [summary("btk-prod-00000002")]}, {**base, "NextToken": "p2"}
    )

    plans = capacity.list_plans(stubbed_sagemaker.client, "btk-prod-")

    assert [plan.name for plan in plans] == ["btk-prod-00000001", "btk-prod-00000002"]
    assert stubbed_sagemaker.calls == ["ListTrainingPlans", "ListTrainingPlans"]
    stubbed_sagemaker.done()


def test_wait_polls_until_scheduled_with_the_injected_clock(stubbed_sagemaker: StubbedSageMaker) -> None:
    for status in ("Pending", "Pending", "Active"):
        stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan("p", status=status))
    clock = FakeClock()

    plan = capacity.wait_for_plan(
        stubbed_sagemaker.client, "p", timeout_seconds=100, poll_seconds=20, sleep=clock.sleep, clock=clock.clock
    )

    assert plan.status == "Active" and plan.arn == plan_arn("p")
    assert clock.sleeps == [20, 20]
    stubbed_sagemaker.done()


def test_wait_stops_at_the_deadline_with_a_retry_hint(stubbed_sagemaker: StubbedSageMaker) -> None:
    for _ in range(4):  # t = 0, 20, 40, 50 (last sleep is cut to the deadline)
        stubbed_sagemaker.stubber.add_response("describe_training_plan", described_plan("p", status="Pending"))
    clock = FakeClock()

    with pytest.raises(capacity.PlanNotReadyError, match="still Pending after 50s"):
        capacity.wait_for_plan(
            stubbed_sagemaker.client, "p", timeout_seconds=50, poll_seconds=20, sleep=clock.sleep, clock=clock.clock
        )

    assert clock.sleeps == [20, 20, 10]
    stubbed_sagemaker.done()


def test_wait_fails_at_once_on_a_failed_plan(stubbed_sagemaker: StubbedSageMaker) -> None:
    failed = {**described_plan("p", status="Failed"), "StatusMessage": "payment declined"}
    stubbed_sagemaker.stubber.add_response("describe_training_plan", failed)
    clock = FakeClock()

    with pytest.raises(capacity.CapacityError, match="training plan p is Failed: payment declined"):
        capacity.wait_for_plan(stubbed_sagemaker.client, "p", sleep=clock.sleep, clock=clock.clock)

    assert clock.sleeps == []


def test_missing_credentials_are_one_line() -> None:
    class NoCredentials:
        def search_training_plan_offerings(self, **_: object) -> None:
            raise NoCredentialsError()

    with pytest.raises(capacity.CapacityError) as raised:
        capacity.search_offerings(NoCredentials(), REQUEST)

    assert str(raised.value) == (
        "SearchTrainingPlanOfferings failed: Unable to locate credentials (configure AWS credentials and region)"
    )


@pytest.mark.parametrize(("page", "named"), [
    ("<!doctype html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>",
     "502 Bad Gateway"),
    ("<html><body><h1>Service Unavailable</h1></body></html>", "no title"),
])
def test_an_error_page_instead_of_an_aws_answer_is_named_not_pasted(page: str, named: str) -> None:
    """A proxy or an emulator answers with an HTML page where AWS would answer JSON: the line names the page
    and what to check, not its markup."""
    from botocore.exceptions import ClientError

    class Proxy:
        def search_training_plan_offerings(self, **_: object) -> None:
            raise ClientError({"Error": {"Code": "502", "Message": page}}, "SearchTrainingPlanOfferings")

    with pytest.raises(capacity.CapacityError) as raised:
        capacity.search_offerings(Proxy(), REQUEST)

    assert str(raised.value) == (f"SearchTrainingPlanOfferings failed: 502: an HTML page ({named}), not an AWS "
                                 "answer (check AWS_ENDPOINT_URL and any HTTPS_PROXY)")


@pytest.mark.parametrize(
    "text", ["2026-03-02T00:00:00Z", "2026-03-02T00:00:00+00:00", "2026-03-02T01:00:00+01:00", "2026-03-02"]
)
def test_iso_times_are_parsed_as_utc(text: str) -> None:
    assert capacity.parse_iso(text, "--start-after") == datetime(2026, 3, 2, tzinfo=UTC)


def test_the_package_runs_on_lambda_with_only_the_standard_library_and_boto3() -> None:
    """The handler asset bundles this package and btk/pagination.py alone: their top-level imports are
    the standard library, the package's own modules and btk.pagination."""
    package = Path(capacity.__file__).parent
    assert sorted(path.name for path in package.glob("*.py")) == [
        "__init__.py", "aws.py", "model.py", "offerings.py", "plans.py", "pricing.py", "purchase.py",
    ]
    standard = {
        "__future__", "hashlib", "math", "re", "time", "collections", "dataclasses", "datetime", "typing", "functools",
    }
    for path in [*package.glob("*.py"), Path(pagination.__file__)]:
        top_level: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                top_level.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                top_level.add(node.module)
        foreign = {
            name for name in top_level
            if name.split(".")[0] not in standard and not name.startswith("btk.capacity.") and name != "btk.pagination"
        }
        assert foreign == set(), f"{path.name} imports {sorted(foreign)}"
