"""Find an environment's training jobs and read their details from SageMaker.

Discovery uses two sources and merges them by job name:

1. the pipelines ``btk-<env>-<profile>`` (``ListPipelineExecutions`` for the window, then
   ``ListPipelineExecutionSteps`` for the training steps' job ARNs);
2. the tags the pipeline sets on every training job (``Search`` over ``TrainingJob`` with
   ``Tags.btk:environment`` = env). This still finds the jobs of a deleted pipeline, and
   jobs started by hand with the same tags.

Each job is then read with ``DescribeTrainingJob`` (the authoritative record: status,
billable seconds, transitions, final metrics, hyperparameters) and each training plan the
jobs ran on with ``DescribeTrainingPlan``. Every list call is paginated, and every answer has its
operation's documented shape (:class:`~btk.report.aws.SageMakerReader` checks it): required
members are read directly, optional ones with a default, and an item without what is needed to
follow it (an execution without its ARN, a step whose job ARN names no job) is skipped with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from btk.naming import TAG_ENVIRONMENT, TAG_PROFILE, pipeline_name
from btk.report.aws import ResourceMissingError, SageMakerReader
from btk.report.progress import Progress

PAGE_SIZE = 100
ISO_UTC = "%Y-%m-%dT%H:%M:%SZ"


@dataclass
class JobOrigin:
    """How a job was found."""

    pipeline_profile: str | None = None
    pipeline_execution_arn: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Collection:
    """Everything read from SageMaker for one report."""

    jobs: list[tuple[dict[str, Any], JobOrigin]]
    plans: dict[str, dict[str, Any]]
    missing_pipelines: list[str]
    notes: list[str]


def _job_name_from_arn(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


def _discover_from_pipelines(
    reader: SageMakerReader,
    environment: str,
    profiles: Sequence[str],
    since: datetime,
    origins: dict[str, JobOrigin],
    missing: list[str],
    notes: list[str],
) -> None:
    for profile in profiles:
        name = pipeline_name(environment, profile)
        try:
            executions = list(
                reader.pages(
                    "list_pipeline_executions",
                    "PipelineExecutionSummaries",
                    PipelineName=name,
                    CreatedAfter=since,
                    SortBy="CreationTime",
                    SortOrder="Descending",
                    MaxResults=PAGE_SIZE,
                )
            )
        except ResourceMissingError:
            missing.append(name)
            continue
        for execution in executions:
            execution_arn = execution.get("PipelineExecutionArn")
            if not execution_arn:  # optional in the API's shape: without it the steps cannot be listed
                notes.append(f"an execution of {name} is listed without its ARN: its jobs are found by their tags only")
                continue
            steps = reader.pages(
                "list_pipeline_execution_steps",
                "PipelineExecutionSteps",
                PipelineExecutionArn=execution_arn,
                MaxResults=PAGE_SIZE,
            )
            for step in steps:
                job_name = _job_name_from_arn(step.get("Metadata", {}).get("TrainingJob", {}).get("Arn", ""))
                if job_name:
                    origins.setdefault(job_name, JobOrigin(profile, execution_arn))


def search_expression(environment: str, since: datetime, profile: str | None) -> dict[str, Any]:
    """The ``Search`` filter: jobs tagged with the environment (and profile), created since."""
    filters = [
        {"Name": f"Tags.{TAG_ENVIRONMENT}", "Operator": "Equals", "Value": environment},
        {"Name": "CreationTime", "Operator": "GreaterThanOrEqualTo", "Value": since.astimezone(UTC).strftime(ISO_UTC)},
    ]
    if profile is not None:
        filters.append({"Name": f"Tags.{TAG_PROFILE}", "Operator": "Equals", "Value": profile})
    return {"Filters": filters, "Operator": "And"}


def _discover_from_tags(
    reader: SageMakerReader, environment: str, since: datetime, profile: str | None, origins: dict[str, JobOrigin]
) -> None:
    records = reader.pages(
        "search",
        "Results",
        Resource="TrainingJob",
        SearchExpression=search_expression(environment, since, profile),
        SortBy="CreationTime",
        SortOrder="Descending",
        MaxResults=PAGE_SIZE,
    )
    for record in records:
        job = record.get("TrainingJob", {})
        name = job.get("TrainingJobName")
        if not name:
            continue
        tags = {tag["Key"]: tag["Value"] for tag in job.get("Tags", [])}
        origins.setdefault(name, JobOrigin()).tags.update(tags)


def collect(
    reader: SageMakerReader,
    *,
    environment: str,
    profiles: Sequence[str],
    since: datetime,
    only_profile: str | None = None,
    progress_stream: TextIO | None = None,
) -> Collection:
    """Discover the jobs of ``environment`` created since ``since`` and describe them.

    Args:
        profiles: the profiles whose pipelines to read (the environment's, or the one
            asked for with ``--profile``).
        only_profile: also narrow the tag search to this profile.
    """
    origins: dict[str, JobOrigin] = {}
    missing: list[str] = []
    notes: list[str] = []
    _discover_from_pipelines(reader, environment, profiles, since, origins, missing, notes)
    _discover_from_tags(reader, environment, since, only_profile, origins)

    progress = Progress(len(origins), "describing training jobs", stream=progress_stream)
    jobs: list[tuple[dict[str, Any], JobOrigin]] = []
    for name, origin in origins.items():
        try:
            job = reader.call("describe_training_job", TrainingJobName=name)
        except ResourceMissingError:
            notes.append(f"training job {name} is listed by its pipeline but no longer exists; skipped")
            job = None
        progress.advance()
        if job is not None:
            jobs.append((job, origin))

    plans: dict[str, dict[str, Any]] = {}
    plan_arns = sorted({arn for job, _ in jobs if (arn := job.get("ResourceConfig", {}).get("TrainingPlanArn"))})
    for arn in plan_arns:
        try:
            plans[arn] = reader.call("describe_training_plan", TrainingPlanName=_job_name_from_arn(arn))
        except ResourceMissingError:
            notes.append(f"training plan {arn} could not be read; its jobs have no cost")
    return Collection(jobs=jobs, plans=plans, missing_pipelines=missing, notes=notes)
