"""Retries, pagination and one-line errors of the SageMaker reader (through the Stubber)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import NoCredentialsError
from botocore.stub import Stubber
from report_fixtures import ENV, PROFILES, SINCE, jobs

from btk.errors import BtkError
from btk.report.aws import PermissionDeniedError, ResourceMissingError, SageMakerReader
from btk.report.collect import collect, pipeline_name

DENIED = (
    "User: arn:aws:sts::123456789012:assumed-role/ReadOnly/alice is not authorized to perform: "
    "sagemaker:ListPipelineExecutions on resource: "
    "arn:aws:sagemaker:us-east-1:123456789012:pipeline/btk-dev-llama3-2-1b "
    "because no identity-based policy allows the sagemaker:ListPipelineExecutions action"
)


def throttle(stubber: Stubber, operation: str = "describe_training_job") -> None:
    stubber.add_client_error(operation, service_error_code="ThrottlingException", service_message="Rate exceeded")


def test_throttling_then_success_backs_off_exponentially(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    job = jobs()["J1"]
    throttle(stubber)
    throttle(stubber)
    stubber.add_response("describe_training_job", job, {"TrainingJobName": job["TrainingJobName"]})
    sleeps: list[float] = []
    reader = SageMakerReader(client, sleep=sleeps.append, max_attempts=4)
    assert (
        reader.call("describe_training_job", TrainingJobName=job["TrainingJobName"])["TrainingJobStatus"] == "Completed"
    )
    assert sleeps == [1.0, 2.0]
    assert (reader.calls, reader.throttled) == (3, 2)


def test_throttling_that_never_ends_is_one_line_error(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    for _ in range(3):
        throttle(stubber)
    sleeps: list[float] = []
    reader = SageMakerReader(client, sleep=sleeps.append, max_attempts=3, base_delay=10.0, max_delay=15.0)
    with pytest.raises(BtkError) as caught:
        reader.call("describe_training_job", TrainingJobName="x")
    assert str(caught.value) == (
        "sagemaker:DescribeTrainingJob is still throttled after 3 attempts: "
        "retry later or narrow the window with --since/--profile"
    )
    assert sleeps == [10.0, 15.0]  # 10, then 20 capped at 15


def test_access_denied_names_the_missing_permission(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_client_error(
        "list_pipeline_executions",
        service_error_code="AccessDeniedException",
        service_message=DENIED,
        http_status_code=400,
    )
    with pytest.raises(PermissionDeniedError) as caught:
        collect(SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES, since=SINCE)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("AWS denied sagemaker:ListPipelineExecutions (AccessDeniedException): grant the caller")


def test_access_denied_on_search_also_stops_the_report(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    for profile in PROFILES:
        stubber.add_response(
            "list_pipeline_executions",
            {"PipelineExecutionSummaries": []},
            {
                "PipelineName": pipeline_name(ENV, profile),
                "CreatedAfter": SINCE,
                "SortBy": "CreationTime",
                "SortOrder": "Descending",
                "MaxResults": 100,
            },
        )
    stubber.add_client_error("search", service_error_code="AccessDeniedException", service_message="denied")
    with pytest.raises(PermissionDeniedError, match=r"sagemaker:Search \(AccessDeniedException\)"):
        collect(SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES, since=SINCE)


def test_other_service_errors_are_one_line_with_the_code(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_client_error(
        "describe_training_job",
        service_error_code="ValidationException",
        service_message="1 validation error detected\nsecond line",
        http_status_code=400,
    )
    with pytest.raises(BtkError) as caught:
        SageMakerReader(client, sleep=lambda _: None).call("describe_training_job", TrainingJobName="x")
    assert (
        str(caught.value) == "sagemaker:DescribeTrainingJob failed (ValidationException): 1 validation error detected"
    )


def test_missing_resource_is_its_own_error(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_client_error("describe_training_plan", service_error_code="ResourceNotFound", service_message="gone")
    with pytest.raises(ResourceMissingError):
        SageMakerReader(client, sleep=lambda _: None).call("describe_training_plan", TrainingPlanName="x")


def test_no_credentials_is_one_line() -> None:
    class NoCredentialsClient:
        def describe_training_job(self, **_: Any) -> dict[str, Any]:
            raise NoCredentialsError()

    with pytest.raises(BtkError, match=r"^sagemaker:DescribeTrainingJob failed: no AWS credentials found: set "):
        SageMakerReader(NoCredentialsClient()).call("describe_training_job", TrainingJobName="x")


def test_job_listed_by_pipeline_but_gone_is_skipped_with_a_note(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    job = jobs()["J1"]
    arn = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/btk-dev-llama3-2-1b/execution/e1"
    stubber.add_response(
        "list_pipeline_executions",
        {"PipelineExecutionSummaries": [{"PipelineExecutionArn": arn, "PipelineExecutionStatus": "Succeeded"}]},
    )
    stubber.add_response(
        "list_pipeline_execution_steps",
        {
            "PipelineExecutionSteps": [
                {"StepName": "Train", "Metadata": {"TrainingJob": {"Arn": job["TrainingJobArn"]}}}
            ]
        },
    )
    stubber.add_response("search", {"Results": []})
    stubber.add_client_error("describe_training_job", service_error_code="ResourceNotFound", service_message="gone")
    collection = collect(
        SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES[:1], since=SINCE
    )
    assert collection.jobs == []
    assert collection.notes == [
        f"training job {job['TrainingJobName']} is listed by its pipeline but no longer exists; skipped"
    ]


def test_invalid_max_attempts_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        SageMakerReader(object(), max_attempts=0)


def test_search_expression_filters_by_tags_and_time() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from btk.report.collect import search_expression

    since = datetime(2025, 6, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert search_expression("prod", since, "qwen2.5-32b") == {
        "Filters": [
            {"Name": "Tags.btk:environment", "Operator": "Equals", "Value": "prod"},
            {"Name": "CreationTime", "Operator": "GreaterThanOrEqualTo", "Value": "2025-06-01T12:00:00Z"},
            {"Name": "Tags.btk:profile", "Operator": "Equals", "Value": "qwen2.5-32b"},
        ],
        "Operator": "And",
    }
    assert len(search_expression("dev", since.astimezone(UTC), None)["Filters"]) == 2


def test_report_looks_for_the_pipeline_names_the_stack_creates() -> None:
    """One definition (btk.naming) serves both; SageMaker forbids '.' in pipeline names."""
    assert pipeline_name("dev", "llama3.2-1b") == "btk-dev-llama3-2-1b"
    assert pipeline_name("prod", "qwen2.5-32b") == "btk-prod-qwen2-5-32b"


def test_a_repeated_page_token_stops_the_report_with_one_line(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    """SageMaker answering page 2 with page 1's token again: one line, not a report that never ends."""
    client, stubber = sagemaker_and_stubber
    params = {
        "PipelineName": pipeline_name(ENV, PROFILES[0]),
        "CreatedAfter": SINCE,
        "SortBy": "CreationTime",
        "SortOrder": "Descending",
        "MaxResults": 100,
    }
    stubber.add_response("list_pipeline_executions", {"PipelineExecutionSummaries": [], "NextToken": "p2"}, params)
    stubber.add_response(
        "list_pipeline_executions", {"PipelineExecutionSummaries": [], "NextToken": "p2"}, {**params, "NextToken": "p2"}
    )
    with pytest.raises(BtkError) as caught:
        collect(SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES[:1], since=SINCE)
    assert str(caught.value) == (
        "sagemaker:ListPipelineExecutions repeated a page token after 2 pages (the listing would never end); "
        "retry later"
    )
    stubber.assert_no_pending_responses()


def test_pages_that_never_end_stop_at_the_page_limit() -> None:
    """A listing whose every page names a new next page is cut at MAX_PAGES calls, not followed forever."""
    from btk.pagination import MAX_PAGES

    class Endless:
        calls = 0

        def search(self, **params: Any) -> dict[str, Any]:
            self.calls += 1
            assert self.calls <= 10 * MAX_PAGES, "the listing was followed without bound"
            return {"Results": [], "NextToken": f"page-{self.calls + 1}"}

    client = Endless()
    reader = SageMakerReader(client, sleep=lambda _: None)
    with pytest.raises(BtkError, match=rf"^sagemaker:Search gave more than {MAX_PAGES} pages"):
        list(reader.pages("search", "Results", Resource="TrainingJob"))
    assert client.calls == MAX_PAGES
