"""``btk report`` on SageMaker answers outside their documented shape, and on items that lack optional members.

A Stubber refuses to serve an answer outside the service model, so a stand-in client
(:class:`Answers`) serves exactly what each case gives. An answer outside the operation's shape
stops the report with one line naming the call and the member; an item without an optional member
(an execution without its ARN, a metric without its name) is reported without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from report_fixtures import (
    KNOBS_1B,
    NOW,
    SINCE,
    describe,
    execution_summary,
    june,
    plan_response,
    search_record,
    transitions,
)

from btk.errors import BtkError
from btk.report.aws import SageMakerReader
from btk.report.collect import Collection, JobOrigin, collect
from btk.report.economics import build_report
from btk.report.predict import PredictionUnavailableError

PROFILE = "llama3.2-1b"
START = june(10)


def job(name: str = "btk-dev-job-1", **overrides: Any) -> dict[str, Any]:
    record = describe(
        name,
        profile=PROFILE,
        status="Completed",
        secondary="Completed",
        created=START,
        knobs=KNOBS_1B,
        training_seconds=3600,
        billable_seconds=3600,
        phases=transitions(START, ("Starting", 5, "x"), ("Training", 60, "x"), ("Completed", None, "x")),
    )
    record.update(overrides)
    return record


@dataclass
class Answers:
    """A SageMaker stand-in: each operation answers with its function (empty listings otherwise)."""

    answers: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def __getattr__(self, operation: str) -> Any:
        if operation.startswith("_"):
            raise AttributeError(operation)
        empty: dict[str, Any] = {
            "list_pipeline_executions": {"PipelineExecutionSummaries": []},
            "list_pipeline_execution_steps": {"PipelineExecutionSteps": []},
            "search": {"Results": []},
        }
        return self.answers.get(operation, lambda **_: empty[operation])


def collected(client: Answers) -> Collection:
    return collect(SageMakerReader(client, sleep=lambda _: None), environment="dev", profiles=[PROFILE], since=SINCE)


def test_an_execution_listed_without_its_arn_is_skipped_with_a_note() -> None:
    """PipelineExecutionArn is optional in PipelineExecutionSummary: the report goes on without it."""
    summary = execution_summary(PROFILE, "e1", START, "Succeeded")
    del summary["PipelineExecutionArn"]
    client = Answers({"list_pipeline_executions": lambda **_: {"PipelineExecutionSummaries": [summary]}})
    collection = collected(client)
    assert collection.jobs == []
    assert collection.notes == [
        "an execution of btk-dev-llama3-2-1b is listed without its ARN: its jobs are found by their tags only"
    ]


@pytest.mark.parametrize(
    ("answers", "line"),
    [
        (
            {"search": lambda **_: {"Results": [{"TrainingJob": {"TrainingJobName": "j", "Tags": [{"Value": "x"}]}}]}},
            "sagemaker:Search answered outside its documented shape: Results[0].TrainingJob.Tags[0].Key is missing",
        ),
        (
            {
                "list_pipeline_executions": lambda **_: {
                    "PipelineExecutionSummaries": [execution_summary(PROFILE, "e1", START, "Succeeded")]
                },
                "list_pipeline_execution_steps": lambda **_: {
                    "PipelineExecutionSteps": [{"StepName": "Train", "Metadata": None}]
                },
            },
            "sagemaker:ListPipelineExecutionSteps answered outside its documented shape: "
            "PipelineExecutionSteps[0].Metadata is null",
        ),
        (
            {
                "search": lambda **_: {"Results": [search_record(job(), PROFILE)]},
                "describe_training_job": lambda **_: job(ResourceConfig=None),
            },
            "sagemaker:DescribeTrainingJob answered outside its documented shape: ResourceConfig is null",
        ),
        (
            {
                "search": lambda **_: {"Results": [search_record(job(), PROFILE)]},
                "describe_training_job": lambda **_: {k: v for k, v in job().items() if k != "CreationTime"},
            },
            "sagemaker:DescribeTrainingJob answered outside its documented shape: CreationTime is missing",
        ),
        (
            {
                "search": lambda **_: {"Results": [search_record(job(), PROFILE)]},
                "describe_training_job": lambda **_: job(SecondaryStatusTransitions=[{"Status": "Starting"}]),
            },
            "sagemaker:DescribeTrainingJob answered outside its documented shape: "
            "SecondaryStatusTransitions[0].StartTime is missing",
        ),
        (
            {
                "search": lambda **_: {"Results": [search_record(job(), PROFILE)]},
                "describe_training_job": lambda **_: job(BillableTimeInSeconds="3600"),
            },
            "sagemaker:DescribeTrainingJob answered outside its documented shape: "
            "BillableTimeInSeconds is text, not a whole number",
        ),
        (
            {
                "search": lambda **_: {"Results": [search_record(job(), PROFILE)]},
                "describe_training_job": lambda **_: job(
                    FinalMetricDataList=[{"MetricName": "train:mfu", "Value": float("nan")}]
                ),
            },
            "sagemaker:DescribeTrainingJob answered outside its documented shape: "
            "FinalMetricDataList[0].Value is nan, not a finite number",
        ),
        (
            {"list_pipeline_executions": lambda **_: {"PipelineExecutionSummaries": "none"}},
            "sagemaker:ListPipelineExecutions answered outside its documented shape: "
            "PipelineExecutionSummaries is text, not a list",
        ),
    ],
)
def test_an_answer_outside_its_shape_stops_the_report_with_one_line(
    answers: dict[str, Callable[..., Any]], line: str
) -> None:
    with pytest.raises(BtkError) as raised:
        collected(Answers(answers))
    assert str(raised.value) == line


def test_a_plan_answer_outside_its_shape_is_one_line() -> None:
    arn = plan_response()["TrainingPlanArn"]
    plan_job = job()
    plan_job["ResourceConfig"]["TrainingPlanArn"] = arn
    client = Answers(
        {
            "search": lambda **_: {"Results": [search_record(plan_job, PROFILE)]},
            "describe_training_job": lambda **_: plan_job,
            "describe_training_plan": lambda **_: {**plan_response(), "TotalInstanceCount": -1},
        }
    )
    with pytest.raises(BtkError) as raised:
        collected(client)
    assert str(raised.value) == (
        "sagemaker:DescribeTrainingPlan answered outside its documented shape: "
        "TotalInstanceCount -1 is below its documented minimum 0"
    )


def refuse(*_: Any) -> Any:
    raise PredictionUnavailableError("no prediction in this test")


def report_of(record: dict[str, Any], plans: dict[str, dict[str, Any]] | None = None) -> Any:
    collection = Collection(jobs=[(record, JobOrigin(pipeline_profile=PROFILE))], plans=plans or {},
                            missing_pipelines=[], notes=[])  # fmt: skip
    return build_report(
        collection, environment="dev", region="us-east-1", profiles=[PROFILE], since=SINCE, now=NOW, predictor=refuse
    )


def test_a_final_metric_without_its_name_or_value_is_left_out() -> None:
    """MetricData's members are all optional: a metric without a name or a value is no metric."""
    metrics = [{"Value": 123.0}, {"MetricName": "train:tokens_per_second_per_gpu"},
               {"MetricName": "train:mfu", "Value": 0.4}]  # fmt: skip
    run = report_of(job(FinalMetricDataList=metrics)).runs[0]
    assert (run.achieved_tokens_per_second_per_gpu, run.achieved_mfu) == (None, 0.4)


@pytest.mark.parametrize(
    ("changes", "note"),
    [
        ({"CurrencyCode": None}, "is priced in an unstated currency: its jobs are left out of the USD cost"),
        ({"UpfrontFee": "4.800,00"}, "has no fee, duration or instance count; its jobs have no cost"),
        ({"UpfrontFee": "inf"}, "has no fee, duration or instance count; its jobs have no cost"),
    ],
)
def test_a_plan_fee_is_read_strictly_and_only_usd_is_costed(changes: dict[str, Any], note: str) -> None:
    plan = {key: value for key, value in {**plan_response(), **changes}.items() if value is not None}
    record = job()
    record["ResourceConfig"]["TrainingPlanArn"] = plan["TrainingPlanArn"]
    report = report_of(record, {plan["TrainingPlanArn"]: plan})
    assert any(line.endswith(note) for line in report.notes), report.notes
    assert report.runs[0].cost_usd is None


def test_a_job_with_no_instances_gets_no_prediction() -> None:
    """InstanceCount 0 is inside ResourceConfig's documented range: the planner is not asked about 0 nodes."""
    asked: list[int] = []

    def predictor(profile: str, instance: str, nodes: int, *_: Any) -> Any:
        asked.append(nodes)
        raise PredictionUnavailableError("none")

    record = job()
    record["ResourceConfig"]["InstanceCount"] = 0
    collection = Collection(jobs=[(record, JobOrigin(pipeline_profile=PROFILE))], plans={},
                            missing_pipelines=[], notes=[])  # fmt: skip
    report = build_report(
        collection, environment="dev", region="us-east-1", profiles=[PROFILE], since=SINCE, now=NOW,
        predictor=predictor,
    )  # fmt: skip
    assert asked == [] and report.runs[0].predicted_tokens_per_second_per_gpu is None
