"""The typed output of ``btk report``: what ``--format json`` prints, validated by pydantic.

These models are the documented contract of the JSON report (``docs/report.md`` embeds
:func:`report_json_schema`, and a test checks the two agree). Money is in USD, time in
seconds or hours as each field's name says, rates are fractions (0.25 = 25 %), prediction
errors are percentages of the prediction (``(achieved - predicted) / predicted * 100``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1"] = "1"

Outcome = Literal["success", "failed", "stopped", "running"]
FailureCause = Literal["capacity", "out_of_memory", "nccl_efa", "user_error", "other"]
FAILURE_CAUSES: tuple[FailureCause, ...] = ("capacity", "out_of_memory", "nccl_efa", "user_error", "other")
CapacityKind = Literal["on_demand", "spot", "training_plan"]
CAPACITY_KINDS: tuple[CapacityKind, ...] = ("on_demand", "spot", "training_plan")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetriedAttempt(_Model):
    """An earlier job of a run's pipeline execution that ended and was retried; its cost,
    GPU-hours and wait are included in the run's."""

    name: str = Field(description="TrainingJobName")
    status: str = Field(description="TrainingJobStatus as SageMaker reports it")
    failure_cause: FailureCause | None = Field(default=None, description="only for status Failed")
    failure_reason: str | None = Field(default=None, description="FailureReason, first line, at most 300 characters")
    created: datetime
    capacity_wait_seconds: float | None = None
    billable_gpu_hours: float | None = None
    cost_usd: float | None = None


class RunReport(_Model):
    """One experiment: a pipeline execution (its retried jobs included), or a job outside one.

    Outcome, failure, metrics and prediction are those of the execution's last job; cost,
    GPU-hours, billable and training seconds and capacity wait are summed over all its jobs.
    """

    name: str = Field(description="TrainingJobName of the execution's last job")
    profile: str = Field(description="btk profile (tag btk:profile, else hyperparameter job.profile, else pipeline)")
    status: str = Field(description="TrainingJobStatus as SageMaker reports it")
    outcome: Outcome
    failure_cause: FailureCause | None = Field(default=None, description="only for outcome=failed")
    failure_reason: str | None = Field(default=None, description="FailureReason, first line, at most 300 characters")
    created: datetime = Field(description="CreationTime of the execution's first job")
    retries: int = Field(default=0, description="jobs of this execution that ended and were retried (retried_attempts)")
    retried_attempts: list[RetriedAttempt] = Field(default_factory=list, description="oldest first")
    instance_type: str
    instance_count: int
    capacity: CapacityKind
    training_plan: str | None = Field(default=None, description="training plan name, for capacity=training_plan")
    pipeline_execution_arn: str | None = None
    capacity_wait_seconds: float | None = Field(
        default=None, description="time in SageMaker's Starting/Pending/LaunchingMLInstances phases"
    )
    training_seconds: int | None = Field(default=None, description="TrainingTimeInSeconds")
    billable_seconds: int | None = Field(default=None, description="BillableTimeInSeconds (per instance)")
    billable_gpu_hours: float | None = Field(default=None, description="None while running")
    cost_usd: float | None = Field(default=None, description="None while running or when the price is unknown")
    spot_savings_usd: float = 0.0
    achieved_tokens_per_second_per_gpu: float | None = None
    achieved_mfu: float | None = None
    predicted_tokens_per_second_per_gpu: float | None = None
    predicted_mfu: float | None = None
    tokens_per_second_error_pct: float | None = None
    mfu_error_pct: float | None = None
    achieved_peak_memory_gib: float | None = Field(default=None, description="final train:peak_memory_gib")
    predicted_peak_memory_gib: float | None = None
    predicted_fits: bool | None = Field(
        default=None, description="the planner's memory verdict for these knobs (an OOM run predicted to fit is news)"
    )
    knobs: dict[str, Any] | None = Field(default=None, description="TrainingKnobs parsed from the hyperparameters")
    notes: list[str] = Field(default_factory=list)


class GroupSummary(_Model):
    """Figures over a set of runs (one profile, or all)."""

    runs: int = Field(
        description="every experiment found in the window, running ones included: a pipeline execution counts "
        "once however often its job was retried"
    )
    successes: int = Field(description="the last job's TrainingJobStatus is Completed")
    failed: int
    stopped: int
    running: int = Field(description="InProgress or Stopping: counted, but no cost until they end")
    failure_rate: float | None = Field(description="failed / (successes + failed + stopped); None if none ended")
    failures_by_cause: dict[FailureCause, int] = Field(description="failed runs, by their last job's cause")
    retried_attempts: int = Field(description="jobs retried within a run: counted in their run, not as failures")
    retried_attempts_by_cause: dict[FailureCause, int] = Field(description="retried jobs that failed, by cause")
    capacity_wait_hours_total: float
    capacity_wait_hours_median: float | None
    capacity_wait_hours_max: float | None
    billable_gpu_hours: float = Field(description="ended runs: billable seconds x instances x GPUs per node / 3600")
    cost_usd: float = Field(description="ended runs, failed and stopped included")
    cost_by_capacity_usd: dict[CapacityKind, float]
    spot_savings_usd: float
    cost_per_successful_run_usd: float | None = Field(description="cost_usd / successes; None without a success")
    runs_with_metrics: int
    achieved_tokens_per_second_per_gpu_mean: float | None
    predicted_tokens_per_second_per_gpu_mean: float | None
    tokens_per_second_error_pct_mean: float | None = Field(description="mean of the per-run errors")
    achieved_mfu_mean: float | None
    predicted_mfu_mean: float | None
    mfu_error_pct_mean: float | None


class PlanReport(_Model):
    """A training plan the reported jobs ran on, and how its fee was apportioned."""

    name: str
    arn: str
    status: str | None
    upfront_fee: float
    currency: str
    duration_hours: float
    instance_count: int
    fee_per_instance_hour: float = Field(description="upfront_fee / (duration_hours x instance_count)")
    used_instance_hours: float = Field(description="sum over reported jobs of billable hours x instances")
    apportioned_fee: float = Field(description="fee_per_instance_hour x used_instance_hours")
    utilisation: float = Field(description="used_instance_hours / (duration_hours x instance_count)")


class Report(_Model):
    """The whole ``btk report`` output."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    environment: str
    region: str
    generated_at: datetime
    since: datetime
    profiles: list[str] = Field(description="profiles reported on, in order")
    overall: GroupSummary
    by_profile: dict[str, GroupSummary]
    runs: list[RunReport] = Field(description="newest first")
    training_plans: list[PlanReport]
    missing_pipelines: list[str] = Field(
        description="pipelines that no longer exist; their jobs were found by tags instead"
    )
    notes: list[str] = Field(default_factory=list)


def report_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of :class:`Report`, as documented in ``docs/report.md``."""
    return Report.model_json_schema(mode="serialization")
