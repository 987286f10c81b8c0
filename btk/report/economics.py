"""From SageMaker's job records to the report's figures.

Definitions (also in ``docs/report.md``):

* **outcome**: ``Completed`` = success, ``Failed`` = failed, ``Stopped`` = stopped,
  ``InProgress``/``Stopping`` = running. Running jobs are counted in ``runs`` and their
  capacity wait so far is shown, but they carry no GPU-hours and no cost until they end
  (SageMaker only finalises ``BillableTimeInSeconds`` at the end).
* **failure rate** = failed / (successes + failed + stopped).
* **capacity wait** = time spent in the ``Starting``, ``Pending`` and
  ``LaunchingMLInstances`` secondary statuses (each phase until its ``EndTime``, else the
  next phase's start, else the job's end, else now), summed, so a spot job that is
  interrupted and waits again counts both waits.
* **billable GPU-hours** = ``BillableTimeInSeconds`` x instances x GPUs per node / 3600
  (``BillableTimeInSeconds`` is per instance and already net of spot savings).
* **cost**: on-demand and spot: the catalog's on-demand price per instance-hour x
  instances x billable hours; spot savings = the same price x instances x
  (``TrainingTimeInSeconds`` - ``BillableTimeInSeconds``) / 3600. Training plan: the
  up-front fee is spread evenly over the plan's instance-hours,
  fee / (plan hours x plan instances) x job hours x job instances; plan hours no job used
  are reported per plan (``utilisation``), not charged to any run.
* **cost per successful run** = cost of all ended runs (failed and stopped included) /
  successes.
* **prediction error** = (achieved - predicted) / predicted x 100, per run; groups show
  the mean of the per-run errors.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from btk.errors import BtkError, UnknownNameError
from btk.hardware import get_instance_type
from btk.hyperparameters import from_hyperparameters
from btk.knobs import TrainingKnobs, knobs_from_hyperparameters
from btk.metrics import METRICS_BY_KEY
from btk.naming import TAG_PROFILE
from btk.profile import ModelArchitecture
from btk.report.classify import classify_failure, first_line
from btk.report.collect import Collection, JobOrigin
from btk.report.predict import PredictionUnavailableError, Predictor
from btk.report.schema import (
    CAPACITY_KINDS,
    FAILURE_CAUSES,
    CapacityKind,
    GroupSummary,
    Outcome,
    PlanReport,
    Report,
    RunReport,
)

WAIT_STATUSES = frozenset({"Starting", "Pending", "LaunchingMLInstances"})
OUTCOMES: dict[str, Outcome] = {
    "Completed": "success",
    "Failed": "failed",
    "Stopped": "stopped",
    "Deleting": "stopped",
    "InProgress": "running",
    "Stopping": "running",
}
TOKENS_METRIC = METRICS_BY_KEY["tokens_per_second_per_gpu"].sagemaker_name
MFU_METRIC = METRICS_BY_KEY["mfu"].sagemaker_name
MEMORY_METRIC = METRICS_BY_KEY["peak_memory_gib"].sagemaker_name
UNKNOWN_PROFILE = "unknown"


def _money(value: float) -> float:
    return round(value, 2)


def _hours(value: float) -> float:
    return round(value, 4)


def _pct(value: float) -> float:
    return round(value, 2)


@dataclass(frozen=True)
class _Plan:
    report: PlanReport
    usd_per_instance_hour: float | None  # None when the fee is not in USD


@dataclass
class _Run:
    """A run's exact (unrounded) figures, kept for the group sums."""

    report: RunReport
    wait_seconds: float | None
    gpu_hours: float | None
    cost: float | None
    spot_savings: float
    plan_arn: str | None
    plan_instance_hours: float = 0.0
    predicted_tps: float | None = None
    predicted_mfu: float | None = None
    tps_error: float | None = None
    mfu_error: float | None = None


def _unquote(value: str) -> str:
    """Undo the JSON quoting some SDKs apply to string hyperparameters (``'"bf16"'``)."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return value
        return decoded if isinstance(decoded, str) else value
    return value


def capacity_wait_seconds(job: dict[str, Any], now: datetime) -> float | None:
    """Seconds the job spent waiting for instances (see the module docstring)."""
    transitions = sorted(job.get("SecondaryStatusTransitions", []), key=lambda item: item["StartTime"])
    if not transitions:
        return None
    job_end = job.get("TrainingEndTime") or (
        job.get("LastModifiedTime") if OUTCOMES.get(job.get("TrainingJobStatus", "")) != "running" else None
    )
    total = 0.0
    for index, transition in enumerate(transitions):
        if transition["Status"] not in WAIT_STATUSES:
            continue
        end = transition.get("EndTime")
        if end is None and index + 1 < len(transitions):
            end = transitions[index + 1]["StartTime"]
        if end is None:
            end = job_end or now
        total += max(0.0, (end - transition["StartTime"]).total_seconds())
    return total


def _resources(job: dict[str, Any]) -> list[tuple[str, int]]:
    config = job.get("ResourceConfig", {})
    if config.get("InstanceGroups"):
        return [(group["InstanceType"], int(group["InstanceCount"])) for group in config["InstanceGroups"]]
    return [(config.get("InstanceType", "unknown"), int(config.get("InstanceCount", 0)))]


def _profile_of(job: dict[str, Any], origin: JobOrigin, hyperparameters: dict[str, str]) -> str:
    return (
        origin.tags.get(TAG_PROFILE) or hyperparameters.get("job.profile") or origin.pipeline_profile or UNKNOWN_PROFILE
    )


def _parse_knobs(
    hyperparameters: dict[str, str], notes: list[str]
) -> tuple[TrainingKnobs | None, ModelArchitecture | None]:
    try:
        spec = from_hyperparameters(hyperparameters)
        return spec.knobs, spec.architecture
    except BtkError:
        pass
    try:
        return knobs_from_hyperparameters(hyperparameters), None
    except BtkError as error:
        notes.append(f"no knobs in the hyperparameters ({error}); no prediction")
        return None, None


def _final_metrics(job: dict[str, Any]) -> dict[str, float]:
    return {item["MetricName"]: float(item["Value"]) for item in job.get("FinalMetricDataList", [])}


def _error_pct(achieved: float | None, predicted: float | None) -> float | None:
    if achieved is None or predicted is None or predicted == 0:
        return None
    return (achieved - predicted) / predicted * 100.0


def _plans(collection: Collection, notes: list[str]) -> dict[str, _Plan]:
    plans: dict[str, _Plan] = {}
    for arn, plan in collection.plans.items():
        name = plan.get("TrainingPlanName", arn.rsplit("/", 1)[-1])
        hours = float(plan.get("DurationHours", 0)) + float(plan.get("DurationMinutes", 0)) / 60.0
        count = int(plan.get("TotalInstanceCount", 0))
        try:
            fee = float(plan.get("UpfrontFee", "nan"))
        except ValueError:
            fee = float("nan")
        if hours <= 0 or count <= 0 or fee != fee:
            notes.append(f"training plan {name} has no fee, duration or instance count; its jobs have no cost")
            continue
        currency = str(plan.get("CurrencyCode", "USD"))
        per_hour = fee / (hours * count)
        if currency != "USD":
            notes.append(f"training plan {name} is priced in {currency}: its jobs are left out of the USD cost")
        plans[arn] = _Plan(
            PlanReport(
                name=name,
                arn=arn,
                status=plan.get("Status"),
                upfront_fee=_money(fee),
                currency=currency,
                duration_hours=_hours(hours),
                instance_count=count,
                fee_per_instance_hour=_money(per_hour),
                used_instance_hours=0.0,
                apportioned_fee=0.0,
                utilisation=0.0,
            ),
            per_hour if currency == "USD" else None,
        )
    return plans


def _run(job: dict[str, Any], origin: JobOrigin, now: datetime, plans: dict[str, _Plan], predictor: Predictor) -> _Run:
    notes: list[str] = []
    hyperparameters = {key: _unquote(str(value)) for key, value in job.get("HyperParameters", {}).items()}
    status = job.get("TrainingJobStatus", "Unknown")
    outcome = OUTCOMES.get(status, "running")
    resources = _resources(job)
    instance_count = sum(count for _, count in resources)
    plan_arn = job.get("ResourceConfig", {}).get("TrainingPlanArn")
    capacity: CapacityKind = (
        "training_plan" if plan_arn else "spot" if job.get("EnableManagedSpotTraining") else "on_demand"
    )
    training_seconds = job.get("TrainingTimeInSeconds")
    billable_seconds = job.get("BillableTimeInSeconds")
    ended = outcome != "running"

    gpu_hours: float | None = None
    cost: float | None = None
    spot_savings = 0.0
    plan_instance_hours = 0.0
    if ended:
        billed = float(billable_seconds if billable_seconds is not None else 0)
        if plan_arn and billable_seconds is None and training_seconds is not None:
            billed = float(training_seconds)
        gpu_hours = 0.0
        cost = 0.0
        for instance_name, count in resources:
            try:
                instance = get_instance_type(instance_name)
            except UnknownNameError:
                notes.append(f"instance type {instance_name} is not in the hardware catalog: no GPU-hours or price")
                gpu_hours = cost = None
                break
            gpu_hours += billed * count * instance.gpus_per_node / 3600.0
            price = instance.usd_per_hour.value
            if capacity == "spot" and training_seconds is not None and training_seconds > billed:
                spot_savings += price * count * (training_seconds - billed) / 3600.0
            cost += price * count * billed / 3600.0
        plan_instance_hours = billed * instance_count / 3600.0
        if plan_arn:
            plan = plans.get(plan_arn)
            if plan is None or plan.usd_per_instance_hour is None:
                cost = None
                notes.append("training plan fee unknown or not in USD: no cost")
            else:
                cost = plan.usd_per_instance_hour * plan_instance_hours
    else:
        notes.append("still running: no cost until it ends")

    knobs, architecture = _parse_knobs(hyperparameters, notes)
    metrics = _final_metrics(job)
    achieved_tps = metrics.get(TOKENS_METRIC)
    achieved_mfu = metrics.get(MFU_METRIC)
    if achieved_tps is None and outcome != "running":
        notes.append("no final metrics")
    profile = _profile_of(job, origin, hyperparameters)
    predicted_tps: float | None = None
    predicted_mfu: float | None = None
    predicted_memory: float | None = None
    predicted_fits: bool | None = None
    if knobs is not None and len(resources) == 1:
        try:
            prediction = predictor(profile, resources[0][0], instance_count, knobs, architecture)
            predicted_tps, predicted_mfu = prediction.tokens_per_second_per_gpu, prediction.mfu
            predicted_memory, predicted_fits = prediction.peak_memory_gib, prediction.fits
        except PredictionUnavailableError as error:
            notes.append(str(error))

    wait = capacity_wait_seconds(job, now)
    failure = classify_failure(job.get("FailureReason")) if outcome == "failed" else None
    if failure == "out_of_memory" and predicted_fits:
        notes.append("ran out of memory although the planner predicted the knobs fit: check the memory model")
    tps_error = _error_pct(achieved_tps, predicted_tps)
    mfu_error = _error_pct(achieved_mfu, predicted_mfu)
    report = RunReport(
        name=job["TrainingJobName"],
        profile=profile,
        status=status,
        outcome=outcome,
        failure_cause=failure,
        failure_reason=first_line(job.get("FailureReason")) if outcome == "failed" else None,
        created=job["CreationTime"],
        instance_type="+".join(name for name, _ in resources),
        instance_count=instance_count,
        capacity=capacity,
        training_plan=plan_arn.rsplit("/", 1)[-1] if plan_arn else None,
        pipeline_execution_arn=origin.pipeline_execution_arn,
        capacity_wait_seconds=None if wait is None else round(wait, 1),
        training_seconds=training_seconds,
        billable_seconds=billable_seconds,
        billable_gpu_hours=None if gpu_hours is None else _hours(gpu_hours),
        cost_usd=None if cost is None else _money(cost),
        spot_savings_usd=_money(spot_savings),
        achieved_tokens_per_second_per_gpu=achieved_tps,
        achieved_mfu=achieved_mfu,
        predicted_tokens_per_second_per_gpu=None if predicted_tps is None else round(predicted_tps, 1),
        predicted_mfu=None if predicted_mfu is None else round(predicted_mfu, 4),
        tokens_per_second_error_pct=None if tps_error is None else _pct(tps_error),
        mfu_error_pct=None if mfu_error is None else _pct(mfu_error),
        achieved_peak_memory_gib=metrics.get(MEMORY_METRIC),
        predicted_peak_memory_gib=None if predicted_memory is None else round(predicted_memory, 2),
        predicted_fits=predicted_fits,
        knobs=None if knobs is None else knobs.model_dump(mode="json"),
        notes=notes,
    )
    return _Run(
        report,
        wait,
        gpu_hours,
        cost,
        spot_savings,
        plan_arn,
        plan_instance_hours if ended else 0.0,
        predicted_tps,
        predicted_mfu,
        tps_error,
        mfu_error,
    )


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(runs: Sequence[_Run]) -> GroupSummary:
    """The figures over ``runs``."""
    reports = [run.report for run in runs]
    successes = sum(report.outcome == "success" for report in reports)
    failed = sum(report.outcome == "failed" for report in reports)
    stopped = sum(report.outcome == "stopped" for report in reports)
    ended = successes + failed + stopped
    waits = [run.wait_seconds / 3600.0 for run in runs if run.wait_seconds is not None]
    costed = [run for run in runs if run.cost is not None]
    cost = sum(run.cost for run in costed if run.cost is not None)
    by_capacity = {
        kind: sum(run.cost or 0.0 for run in costed if run.report.capacity == kind) for kind in CAPACITY_KINDS
    }
    measured = [run for run in runs if run.report.achieved_tokens_per_second_per_gpu is not None]
    achieved_tps = [run.report.achieved_tokens_per_second_per_gpu or 0.0 for run in measured]
    predicted_tps = [run.predicted_tps for run in measured if run.predicted_tps is not None]
    achieved_mfu = [run.report.achieved_mfu for run in measured if run.report.achieved_mfu is not None]
    predicted_mfu = [run.predicted_mfu for run in measured if run.predicted_mfu is not None]
    tps_errors = [run.tps_error for run in runs if run.tps_error is not None]
    mfu_errors = [run.mfu_error for run in runs if run.mfu_error is not None]

    def rounded(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    return GroupSummary(
        runs=len(reports),
        successes=successes,
        failed=failed,
        stopped=stopped,
        running=len(reports) - ended,
        failure_rate=rounded(failed / ended if ended else None, 4),
        failures_by_cause={cause: sum(r.failure_cause == cause for r in reports) for cause in FAILURE_CAUSES},
        capacity_wait_hours_total=_hours(sum(waits)),
        capacity_wait_hours_median=rounded(statistics.median(waits) if waits else None, 4),
        capacity_wait_hours_max=rounded(max(waits) if waits else None, 4),
        billable_gpu_hours=_hours(sum(run.gpu_hours or 0.0 for run in runs)),
        cost_usd=_money(cost),
        cost_by_capacity_usd={kind: _money(value) for kind, value in by_capacity.items()},
        spot_savings_usd=_money(sum(run.spot_savings for run in runs)),
        cost_per_successful_run_usd=rounded(cost / successes if successes else None, 2),
        runs_with_metrics=len(measured),
        achieved_tokens_per_second_per_gpu_mean=rounded(_mean(achieved_tps), 1),
        predicted_tokens_per_second_per_gpu_mean=rounded(_mean(predicted_tps), 1),
        tokens_per_second_error_pct_mean=rounded(_mean(tps_errors), 2),
        achieved_mfu_mean=rounded(_mean(achieved_mfu), 4),
        predicted_mfu_mean=rounded(_mean(predicted_mfu), 4),
        mfu_error_pct_mean=rounded(_mean(mfu_errors), 2),
    )


def build_report(
    collection: Collection,
    *,
    environment: str,
    region: str,
    profiles: Sequence[str],
    since: datetime,
    now: datetime,
    predictor: Predictor,
    only_profile: str | None = None,
) -> Report:
    """The report over the collected jobs (newest first), per profile and overall."""
    notes = list(collection.notes)
    plans = _plans(collection, notes)
    runs = [_run(job, origin, now, plans, predictor) for job, origin in collection.jobs]
    runs = [run for run in runs if run.report.created >= since]
    if only_profile is not None:
        runs = [run for run in runs if run.report.profile == only_profile]
    runs.sort(key=lambda run: (run.report.created, run.report.name), reverse=True)

    order = list(profiles) + sorted({run.report.profile for run in runs} - set(profiles))
    by_profile = {name: summarise([run for run in runs if run.report.profile == name]) for name in order}
    uncosted = sum(run.report.outcome != "running" and run.cost is None for run in runs)
    if uncosted:
        notes.append(f"{uncosted} ended run(s) have no cost (see their notes) and are left out of the cost figures")

    plan_reports = []
    for arn, plan in sorted(plans.items(), key=lambda item: item[1].report.name):
        used = sum(run.plan_instance_hours for run in runs if run.plan_arn == arn)
        capacity_hours = plan.report.duration_hours * plan.report.instance_count
        per_hour = plan.usd_per_instance_hour
        if per_hour is None:  # not USD: apportion in the plan's own currency
            per_hour = plan.report.fee_per_instance_hour
        plan_reports.append(
            plan.report.model_copy(
                update={
                    "used_instance_hours": _hours(used),
                    "apportioned_fee": _money(used * per_hour),
                    "utilisation": round(used / capacity_hours, 4),
                }
            )
        )
    return Report(
        environment=environment,
        region=region,
        generated_at=now,
        since=since,
        profiles=order,
        overall=summarise(runs),
        by_profile=by_profile,
        runs=[run.report for run in runs],
        training_plans=plan_reports,
        missing_pipelines=list(collection.missing_pipelines),
        notes=notes,
    )
