"""From SageMaker's job records to the report's figures.

Definitions (also in ``docs/report.md``):

* **run** (experiment): one pipeline execution, or a job outside one. The pipeline retries a
  job that failed for want of capacity or inside SageMaker as a new job of the same
  execution (:mod:`btk.report.executions` finds them); the run takes its outcome, failure
  cause, metrics and prediction from the last job, and its cost, GPU-hours, billable time and
  capacity wait from all of them. The retried jobs are listed with the run and counted
  per cause as retried attempts, not as failed runs.
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
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from btk.capacity.pricing import parse_fee
from btk.errors import BtkError, UnknownNameError
from btk.hardware import get_instance_type
from btk.hyperparameters import from_hyperparameters
from btk.knobs import TrainingKnobs, knobs_from_hyperparameters
from btk.metrics import METRICS_BY_KEY
from btk.naming import TAG_PROFILE
from btk.profile import ModelArchitecture
from btk.report.classify import classify_failure, first_line
from btk.report.collect import Collection, JobOrigin
from btk.report.executions import experiment_key, group_attempts
from btk.report.predict import PredictionUnavailableError, Predictor
from btk.report.schema import (
    CAPACITY_KINDS,
    FAILURE_CAUSES,
    CapacityKind,
    GroupSummary,
    Outcome,
    PlanReport,
    Report,
    RetriedAttempt,
    RunReport,
)
from btk.units import SECONDS_PER_HOUR

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
RUNG_METRIC = METRICS_BY_KEY["knob_rung"].sagemaker_name
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


@dataclass(frozen=True)
class _Outcome:
    """How the job ended (or that it has not) and on what capacity it ran."""

    status: str
    outcome: Outcome
    resources: list[tuple[str, int]]
    capacity: CapacityKind
    plan_arn: str | None

    @property
    def ended(self) -> bool:
        return self.outcome != "running"

    @property
    def instance_count(self) -> int:
        return sum(count for _, count in self.resources)


@dataclass(frozen=True)
class _Cost:
    """A run's exact (unrounded) GPU-hours and cost; None where unknown, zero while running."""

    gpu_hours: float | None = None
    usd: float | None = None
    spot_savings: float = 0.0
    plan_instance_hours: float = 0.0
    """Instance-hours charged to the run's training plan."""


@dataclass(frozen=True)
class _Prediction:
    """The run's knobs, what it achieved, and what the planner predicted for those knobs."""

    knobs: TrainingKnobs | None = None
    achieved_tps: float | None = None
    achieved_mfu: float | None = None
    achieved_memory: float | None = None
    predicted_tps: float | None = None
    predicted_mfu: float | None = None
    predicted_memory: float | None = None
    predicted_fits: bool | None = None

    @property
    def tps_error(self) -> float | None:
        return _error_pct(self.achieved_tps, self.predicted_tps)

    @property
    def mfu_error(self) -> float | None:
        return _error_pct(self.achieved_mfu, self.predicted_mfu)


@dataclass(frozen=True)
class _Run:
    """A run's report plus its exact (unrounded) figures, kept for the group sums."""

    report: RunReport
    wait_seconds: float | None
    cost: _Cost
    prediction: _Prediction
    plan_arn: str | None


def unquoted_hyperparameters(job: dict[str, Any]) -> dict[str, str]:
    """A job's hyperparameters with the JSON quoting some SDKs add removed."""
    return {key: _unquote(str(value)) for key, value in job.get("HyperParameters", {}).items()}


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


def job_profile(job: dict[str, Any], origin: JobOrigin, hyperparameters: dict[str, str]) -> str:
    return (
        origin.tags.get(TAG_PROFILE) or hyperparameters.get("job.profile") or origin.pipeline_profile or UNKNOWN_PROFILE
    )


def parse_job_knobs(
    hyperparameters: dict[str, str], notes: list[str], rung: int = 0
) -> tuple[TrainingKnobs | None, ModelArchitecture | None]:
    """The knobs the job trained on and its architecture, from its hyperparameters: rung ``rung`` of its knob ladder
    (its ``train:knob_rung`` metric; 0: the plan's own knobs). The knobs alone from an older job; a note, and None,
    where there are none."""
    try:
        spec = from_hyperparameters(hyperparameters)
        ladder = (spec.knobs, *(spec.job.knob_ladder.rungs if spec.job.knob_ladder is not None else ()))
        if not 0 <= rung < len(ladder):
            notes.append(f"trained on knob rung {rung}, which its knob ladder does not have; no prediction")
            return None, spec.architecture
        return ladder[rung], spec.architecture
    except BtkError:
        pass
    try:
        return knobs_from_hyperparameters(hyperparameters), None
    except BtkError as error:
        notes.append(f"no knobs in the hyperparameters ({error}); no prediction")
        return None, None


def knob_rung(metrics: dict[str, float]) -> int:
    """The knob-ladder rung a job trained on, from its final metrics (absent: the plan's knobs, rung 0)."""
    value = metrics.get(RUNG_METRIC, 0.0)
    return int(value) if math.isfinite(value) and value == int(value) else -1


def final_metrics(job: dict[str, Any]) -> dict[str, float]:
    """The job's final metrics by name (a metric's name and value are optional in the API's shape)."""
    return {
        item["MetricName"]: float(item["Value"])
        for item in job.get("FinalMetricDataList", [])
        if "MetricName" in item and "Value" in item
    }


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
        fee = parse_fee(plan.get("UpfrontFee"))
        if hours <= 0 or count <= 0 or fee is None:
            notes.append(f"training plan {name} has no fee, duration or instance count; its jobs have no cost")
            continue
        currency = str(plan.get("CurrencyCode", ""))
        per_hour = fee / (hours * count)
        if currency != "USD":
            notes.append(
                f"training plan {name} is priced in {currency or 'an unstated currency'}: "
                "its jobs are left out of the USD cost"
            )
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


def _outcome_of(job: dict[str, Any]) -> _Outcome:
    status = job.get("TrainingJobStatus", "Unknown")
    plan_arn = job.get("ResourceConfig", {}).get("TrainingPlanArn")
    capacity: CapacityKind = (
        "training_plan" if plan_arn else "spot" if job.get("EnableManagedSpotTraining") else "on_demand"
    )
    return _Outcome(
        status=status,
        outcome=OUTCOMES.get(status, "running"),
        resources=_resources(job),
        capacity=capacity,
        plan_arn=plan_arn,
    )


def _cost_of(job: dict[str, Any], outcome: _Outcome, plans: dict[str, _Plan], notes: list[str]) -> _Cost:
    """GPU-hours, cost and spot savings of an ended run (see the module docstring)."""
    if not outcome.ended:
        notes.append("still running: no cost until it ends")
        return _Cost()
    training_seconds = job.get("TrainingTimeInSeconds")
    billable_seconds = job.get("BillableTimeInSeconds")
    billed = float(billable_seconds if billable_seconds is not None else 0)
    if outcome.plan_arn and billable_seconds is None and training_seconds is not None:
        billed = float(training_seconds)
    gpu_total = cost_total = spot_savings = 0.0
    priced = True
    for instance_name, count in outcome.resources:
        try:
            instance = get_instance_type(instance_name)
        except UnknownNameError:
            notes.append(f"instance type {instance_name} is not in the hardware catalog: no GPU-hours or price")
            priced = False
            break
        gpu_total += billed * count * instance.gpus_per_node / SECONDS_PER_HOUR
        price = instance.usd_per_hour.value
        if outcome.capacity == "spot" and training_seconds is not None and training_seconds > billed:
            spot_savings += price * count * (training_seconds - billed) / SECONDS_PER_HOUR
        cost_total += price * count * billed / SECONDS_PER_HOUR
    gpu_hours = gpu_total if priced else None
    cost = cost_total if priced else None
    plan_instance_hours = billed * outcome.instance_count / SECONDS_PER_HOUR
    if outcome.plan_arn:
        plan = plans.get(outcome.plan_arn)
        if plan is None or plan.usd_per_instance_hour is None:
            cost = None
            notes.append("training plan fee unknown or not in USD: no cost")
        else:
            cost = plan.usd_per_instance_hour * plan_instance_hours
    return _Cost(gpu_hours=gpu_hours, usd=cost, spot_savings=spot_savings, plan_instance_hours=plan_instance_hours)


def _prediction_of(
    job: dict[str, Any],
    outcome: _Outcome,
    profile: str,
    hyperparameters: dict[str, str],
    predictor: Predictor,
    notes: list[str],
) -> _Prediction:
    """The final metrics the run reported and the planner's prediction for the knobs it used."""
    metrics = final_metrics(job)
    knobs, architecture = parse_job_knobs(hyperparameters, notes, knob_rung(metrics))
    achieved = _Prediction(
        knobs=knobs,
        achieved_tps=metrics.get(TOKENS_METRIC),
        achieved_mfu=metrics.get(MFU_METRIC),
        achieved_memory=metrics.get(MEMORY_METRIC),
    )
    if achieved.achieved_tps is None and outcome.ended:
        notes.append("no final metrics")
    if knobs is None or len(outcome.resources) != 1 or outcome.instance_count < 1:
        return achieved
    try:
        prediction = predictor(profile, outcome.resources[0][0], outcome.instance_count, knobs, architecture)
    except PredictionUnavailableError as error:
        notes.append(str(error))
        return achieved
    return replace(
        achieved,
        predicted_tps=prediction.tokens_per_second_per_gpu,
        predicted_mfu=prediction.mfu,
        predicted_memory=prediction.peak_memory_gib,
        predicted_fits=prediction.fits,
    )


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _run(job: dict[str, Any], origin: JobOrigin, now: datetime, plans: dict[str, _Plan], predictor: Predictor) -> _Run:
    """One job's figures: its outcome, cost, prediction and capacity wait, in that order of notes."""
    notes: list[str] = []
    hyperparameters = unquoted_hyperparameters(job)
    outcome = _outcome_of(job)
    cost = _cost_of(job, outcome, plans, notes)
    profile = job_profile(job, origin, hyperparameters)
    prediction = _prediction_of(job, outcome, profile, hyperparameters, predictor, notes)
    wait = capacity_wait_seconds(job, now)
    failed = outcome.outcome == "failed"
    failure = classify_failure(job.get("FailureReason")) if failed else None
    if failure == "out_of_memory" and prediction.predicted_fits:
        notes.append("ran out of memory although the planner predicted the knobs fit: check the memory model")
    tps_error, mfu_error = prediction.tps_error, prediction.mfu_error
    report = RunReport(
        name=job["TrainingJobName"],
        profile=profile,
        status=outcome.status,
        outcome=outcome.outcome,
        failure_cause=failure,
        failure_reason=first_line(job.get("FailureReason")) if failed else None,
        created=job["CreationTime"],
        instance_type="+".join(name for name, _ in outcome.resources),
        instance_count=outcome.instance_count,
        capacity=outcome.capacity,
        training_plan=outcome.plan_arn.rsplit("/", 1)[-1] if outcome.plan_arn else None,
        pipeline_execution_arn=origin.pipeline_execution_arn,
        capacity_wait_seconds=_rounded(wait, 1),
        training_seconds=job.get("TrainingTimeInSeconds"),
        billable_seconds=job.get("BillableTimeInSeconds"),
        billable_gpu_hours=None if cost.gpu_hours is None else _hours(cost.gpu_hours),
        cost_usd=None if cost.usd is None else _money(cost.usd),
        spot_savings_usd=_money(cost.spot_savings),
        achieved_tokens_per_second_per_gpu=prediction.achieved_tps,
        achieved_mfu=prediction.achieved_mfu,
        predicted_tokens_per_second_per_gpu=_rounded(prediction.predicted_tps, 1),
        predicted_mfu=_rounded(prediction.predicted_mfu, 4),
        tokens_per_second_error_pct=None if tps_error is None else _pct(tps_error),
        mfu_error_pct=None if mfu_error is None else _pct(mfu_error),
        achieved_peak_memory_gib=prediction.achieved_memory,
        predicted_peak_memory_gib=_rounded(prediction.predicted_memory, 2),
        predicted_fits=prediction.predicted_fits,
        knobs=None if prediction.knobs is None else prediction.knobs.model_dump(mode="json"),
        notes=notes,
    )
    return _Run(report=report, wait_seconds=wait, cost=cost, prediction=prediction, plan_arn=outcome.plan_arn)


def _total(values: Sequence[float | None]) -> float | None:
    """The sum, or None when any value is unknown."""
    return None if any(value is None for value in values) else sum(value or 0.0 for value in values)


def _known_total(values: Sequence[float | int | None]) -> float | None:
    """The sum of the known values, or None when none is known."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _retried(run: _Run) -> RetriedAttempt:
    report = run.report
    return RetriedAttempt(
        name=report.name,
        status=report.status,
        failure_cause=report.failure_cause,
        failure_reason=report.failure_reason,
        created=report.created,
        capacity_wait_seconds=report.capacity_wait_seconds,
        billable_gpu_hours=report.billable_gpu_hours,
        cost_usd=report.cost_usd,
    )


def _experiment(attempts: Sequence[_Run]) -> _Run:
    """One execution's jobs (oldest first) as one run: the last job decides the outcome and
    carries the metrics; cost, GPU-hours, billable time and wait are every job's."""
    *retried, last = attempts
    if not retried:
        return last
    cost = _Cost(
        gpu_hours=_total([run.cost.gpu_hours for run in attempts]),
        usd=_total([run.cost.usd for run in attempts]),
        spot_savings=sum(run.cost.spot_savings for run in attempts),
        plan_instance_hours=sum(run.cost.plan_instance_hours for run in attempts),
    )
    wait = _known_total([run.wait_seconds for run in attempts])
    training = _known_total([run.report.training_seconds for run in attempts])
    billable = _known_total([run.report.billable_seconds for run in attempts])
    execution = next(
        (run.report.pipeline_execution_arn for run in reversed(attempts) if run.report.pipeline_execution_arn), None
    )
    report = last.report.model_copy(
        update={
            "created": retried[0].report.created,
            "retries": len(retried),
            "retried_attempts": [_retried(run) for run in retried],
            "pipeline_execution_arn": execution,
            "capacity_wait_seconds": _rounded(wait, 1),
            "training_seconds": None if training is None else int(training),
            "billable_seconds": None if billable is None else int(billable),
            "billable_gpu_hours": None if cost.gpu_hours is None else _hours(cost.gpu_hours),
            "cost_usd": None if cost.usd is None else _money(cost.usd),
            "spot_savings_usd": _money(cost.spot_savings),
        }
    )
    return replace(last, report=report, wait_seconds=wait, cost=cost)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(runs: Sequence[_Run]) -> GroupSummary:
    """The figures over ``runs``."""
    reports = [run.report for run in runs]
    successes = sum(report.outcome == "success" for report in reports)
    failed = sum(report.outcome == "failed" for report in reports)
    stopped = sum(report.outcome == "stopped" for report in reports)
    ended = successes + failed + stopped
    waits = [run.wait_seconds / SECONDS_PER_HOUR for run in runs if run.wait_seconds is not None]
    costed = [run for run in runs if run.cost.usd is not None]
    cost = sum(run.cost.usd for run in costed if run.cost.usd is not None)
    by_capacity = {
        kind: sum(run.cost.usd or 0.0 for run in costed if run.report.capacity == kind) for kind in CAPACITY_KINDS
    }
    measured = [run for run in runs if run.report.achieved_tokens_per_second_per_gpu is not None]
    achieved_tps = [run.report.achieved_tokens_per_second_per_gpu or 0.0 for run in measured]
    predicted_tps = [run.prediction.predicted_tps for run in measured if run.prediction.predicted_tps is not None]
    achieved_mfu = [run.report.achieved_mfu for run in measured if run.report.achieved_mfu is not None]
    predicted_mfu = [run.prediction.predicted_mfu for run in measured if run.prediction.predicted_mfu is not None]
    tps_errors = [error for error in (run.prediction.tps_error for run in runs) if error is not None]
    mfu_errors = [error for error in (run.prediction.mfu_error for run in runs) if error is not None]

    return GroupSummary(
        runs=len(reports),
        successes=successes,
        failed=failed,
        stopped=stopped,
        running=len(reports) - ended,
        failure_rate=_rounded(failed / ended if ended else None, 4),
        failures_by_cause={cause: sum(r.failure_cause == cause for r in reports) for cause in FAILURE_CAUSES},
        retried_attempts=sum(r.retries for r in reports),
        retried_attempts_by_cause={
            cause: sum(a.failure_cause == cause for r in reports for a in r.retried_attempts)
            for cause in FAILURE_CAUSES
        },
        capacity_wait_hours_total=_hours(sum(waits)),
        capacity_wait_hours_median=_rounded(statistics.median(waits) if waits else None, 4),
        capacity_wait_hours_max=_rounded(max(waits) if waits else None, 4),
        billable_gpu_hours=_hours(sum(run.cost.gpu_hours or 0.0 for run in runs)),
        cost_usd=_money(cost),
        cost_by_capacity_usd={kind: _money(value) for kind, value in by_capacity.items()},
        spot_savings_usd=_money(sum(run.cost.spot_savings for run in runs)),
        cost_per_successful_run_usd=_rounded(cost / successes if successes else None, 2),
        runs_with_metrics=len(measured),
        achieved_tokens_per_second_per_gpu_mean=_rounded(_mean(achieved_tps), 1),
        predicted_tokens_per_second_per_gpu_mean=_rounded(_mean(predicted_tps), 1),
        tokens_per_second_error_pct_mean=_rounded(_mean(tps_errors), 2),
        achieved_mfu_mean=_rounded(_mean(achieved_mfu), 4),
        predicted_mfu_mean=_rounded(_mean(predicted_mfu), 4),
        mfu_error_pct_mean=_rounded(_mean(mfu_errors), 2),
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
    jobs = [(_run(job, origin, now, plans, predictor), experiment_key(job, origin)) for job, origin in collection.jobs]
    jobs = [(run, key) for run, key in jobs if run.report.created >= since]
    if only_profile is not None:
        jobs = [(run, key) for run, key in jobs if run.report.profile == only_profile]
    groups = group_attempts(
        jobs, key=lambda item: item[1], order=lambda item: (item[0].report.created, item[0].report.name)
    )
    runs = [_experiment([run for run, _ in group]) for group in groups]
    runs.sort(key=lambda run: (run.report.created, run.report.name), reverse=True)

    order = list(profiles) + sorted({run.report.profile for run in runs} - set(profiles))
    by_profile = {name: summarise([run for run in runs if run.report.profile == name]) for name in order}
    uncosted = sum(run.report.outcome != "running" and run.cost.usd is None for run in runs)
    if uncosted:
        notes.append(f"{uncosted} ended run(s) have no cost (see their notes) and are left out of the cost figures")

    plan_reports = []
    for arn, plan in sorted(plans.items(), key=lambda item: item[1].report.name):
        used = sum(run.cost.plan_instance_hours for run, _ in jobs if run.plan_arn == arn)
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
