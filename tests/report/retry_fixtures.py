"""Pipeline executions whose training job was retried, queued on a botocore Stubber.

Environment ``dev``, profile ``llama3.2-1b`` only, on ml.p6-b200.48xlarge (8 GPUs, 113.93 USD
per instance-hour). ``ListPipelineExecutionSteps`` names only the step's latest job (its
``AttemptCount`` says how many there were); the tag search finds every attempt; all attempts
of an execution share its checkpoint prefix.

| execution | job | what happens                                   | billable s | wait s |
|-----------|-----|------------------------------------------------|------------|--------|
| r1        | A1  | failed: CapacityError, never started (retried) | (none)     | 3600   |
| r1        | A2  | failed: InternalServerError (retried)          | 1200       | 600    |
| r1        | A3  | completed                                      | 7200       | 360    |
| r2        | F1  | failed: CapacityError (retried)                | (none)     | 7200   |
| r2        | F2  | failed: CapacityError, retries exhausted       | (none)     | 7200   |
"""

from __future__ import annotations

from typing import Any

from report_fixtures import (
    CAPACITY_REASON,
    DOWNLOADING,
    ENV,
    KNOBS_1B,
    NOW,
    OTHER_REASON,
    REGION,
    SINCE,
    STARTING,
    TRAINING,
    UPLOADING,
    FakePredictor,
    describe,
    execution_arn,
    execution_summary,
    june,
    metrics,
    search_record,
    stubbed_client,
    training_step,
    transitions,
)

from btk.report.collect import pipeline_name, search_expression

PROFILE = "llama3.2-1b"


def _job(key: str, execution: str, **fields: Any) -> dict[str, Any]:
    return describe(
        f"pipelines-{execution}-train-{key.lower()}", profile=PROFILE, knobs=KNOBS_1B, execution=execution, **fields
    )


def _capacity_failure(key: str, execution: str, start: Any, minutes: int) -> dict[str, Any]:
    return _job(
        key,
        execution,
        status="Failed",
        secondary="Failed",
        created=start,
        failure_reason=CAPACITY_REASON,
        phases=transitions(start, ("Starting", minutes, STARTING), ("Failed", None, CAPACITY_REASON)),
    )


def retry_jobs() -> dict[str, dict[str, Any]]:
    """The five DescribeTrainingJob responses, by key (A1..A3, F1, F2 of the module table)."""
    j = {"A1": _capacity_failure("A1", "r1", june(10, 8), 60)}
    j["A2"] = _job(
        "A2",
        "r1",
        status="Failed",
        secondary="Failed",
        created=june(10, 9, 10),
        training_seconds=1200,
        billable_seconds=1200,
        failure_reason=OTHER_REASON,
        phases=transitions(
            june(10, 9, 10),
            ("Starting", 10, STARTING),
            ("Downloading", 2, DOWNLOADING),
            ("Training", 20, TRAINING),
            ("Failed", None, "Training job failed"),
        ),
    )
    j["A3"] = _job(
        "A3",
        "r1",
        status="Completed",
        secondary="Completed",
        created=june(10, 10, 0),
        training_seconds=7200,
        billable_seconds=7200,
        phases=transitions(
            june(10, 10, 0),
            ("Starting", 6, STARTING),
            ("Downloading", 4, DOWNLOADING),
            ("Training", 120, TRAINING),
            ("Uploading", 2, UPLOADING),
            ("Completed", None, "Training job completed"),
        ),
        final_metrics=metrics(30400.0, 0.41, june(10, 12, 10)),
    )
    j["F1"] = _capacity_failure("F1", "r2", june(20, 0), 120)
    j["F2"] = _capacity_failure("F2", "r2", june(20, 2, 10), 120)
    return j


def _step(job: dict[str, Any], status: str, attempts: int) -> dict[str, Any]:
    return {**training_step(job, status), "AttemptCount": attempts}


def queue_retries(stubber: Any) -> dict[str, dict[str, Any]]:
    """Queue the scenario in the order ``collect`` makes its calls."""
    j = retry_jobs()
    stubber.add_response(
        "list_pipeline_executions",
        {
            "PipelineExecutionSummaries": [
                execution_summary(PROFILE, "r2", j["F1"]["CreationTime"], "Failed"),
                execution_summary(PROFILE, "r1", j["A1"]["CreationTime"], "Succeeded"),
            ]
        },
        {
            "PipelineName": pipeline_name(ENV, PROFILE),
            "CreatedAfter": SINCE,
            "SortBy": "CreationTime",
            "SortOrder": "Descending",
            "MaxResults": 100,
        },
    )
    for execution, step in (("r2", _step(j["F2"], "Failed", 2)), ("r1", _step(j["A3"], "Succeeded", 3))):
        stubber.add_response(
            "list_pipeline_execution_steps",
            {"PipelineExecutionSteps": [step]},
            {"PipelineExecutionArn": execution_arn(PROFILE, execution), "MaxResults": 100},
        )
    stubber.add_response(
        "search",
        {"Results": [search_record(j[key], PROFILE) for key in ("F2", "F1", "A3", "A2", "A1")]},
        {
            "Resource": "TrainingJob",
            "SearchExpression": search_expression(ENV, SINCE, None),
            "SortBy": "CreationTime",
            "SortOrder": "Descending",
            "MaxResults": 100,
        },
    )
    for key in ("F2", "A3", "F1", "A2", "A1"):  # pipeline-found first, then tag-only ones
        stubber.add_response("describe_training_job", j[key], {"TrainingJobName": j[key]["TrainingJobName"]})
    return j


def retry_report() -> Any:
    """The report of the retry scenario (docs/report.md shows it as its retry sample)."""
    from botocore.stub import Stubber

    from btk.report.aws import SageMakerReader
    from btk.report.collect import collect
    from btk.report.economics import build_report

    client = stubbed_client()
    with Stubber(client) as stubber:
        queue_retries(stubber)
        collection = collect(
            SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=(PROFILE,), since=SINCE
        )
        stubber.assert_no_pending_responses()
    return build_report(
        collection, environment=ENV, region=REGION, profiles=(PROFILE,), since=SINCE, now=NOW, predictor=FakePredictor()
    )
