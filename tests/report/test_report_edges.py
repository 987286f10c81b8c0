"""Economics on hand-built records: odd but real data shapes, and the real planner predictor."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from report_fixtures import (
    INSTANCE,
    KNOBS_1B,
    NOW,
    PLAN_ARN,
    SINCE,
    FakePredictor,
    describe,
    plan_response,
    transitions,
)

from btk.catalog import get_profile
from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.planner.search import evaluate_knobs
from btk.report.collect import Collection, JobOrigin
from btk.report.economics import build_report, capacity_wait_seconds
from btk.report.predict import PredictionUnavailableError, planner_predictor
from btk.report.render import render_text

T0 = datetime(2025, 6, 10, tzinfo=UTC)


def report_of(jobs: list[dict[str, Any]], plans: dict[str, dict[str, Any]] | None = None) -> Any:
    collection = Collection(
        jobs=[(job, JobOrigin(pipeline_profile="llama3.2-1b")) for job in jobs],
        plans=plans or {},
        missing_pipelines=[],
        notes=[],
    )
    return build_report(
        collection,
        environment="dev",
        region="us-east-1",
        profiles=["llama3.2-1b"],
        since=SINCE,
        now=NOW,
        predictor=FakePredictor(),
    )


def completed(name: str = "job", **overrides: Any) -> dict[str, Any]:
    job = describe(
        name,
        profile="llama3.2-1b",
        status="Completed",
        secondary="Completed",
        created=T0,
        knobs=KNOBS_1B,
        training_seconds=3600,
        billable_seconds=3600,
        phases=transitions(T0, ("Starting", 5, "x"), ("Training", 60, "x"), ("Completed", None, "x")),
    )
    job.update(overrides)
    return job


def test_plan_priced_in_another_currency_is_left_out_of_usd_cost() -> None:
    plan = {**plan_response(), "CurrencyCode": "EUR"}
    job = completed(ResourceConfig={"InstanceType": INSTANCE, "InstanceCount": 2, "TrainingPlanArn": PLAN_ARN})
    report = report_of([job], {PLAN_ARN: plan})
    (run,) = report.runs
    assert run.cost_usd is None and "training plan fee unknown or not in USD: no cost" in run.notes
    assert report.overall.cost_usd == 0.0 and report.overall.cost_per_successful_run_usd == 0.0
    assert "training plan dev-b200-june is priced in EUR: its jobs are left out of the USD cost" in report.notes
    assert "1 ended run(s) have no cost (see their notes) and are left out of the cost figures" in report.notes
    # the plan itself is still reported in EUR: 1 h x 2 instances at 4800 / 48 = 100 EUR per instance-hour
    (plan_report,) = report.training_plans
    assert (plan_report.currency, plan_report.used_instance_hours, plan_report.apportioned_fee) == ("EUR", 2.0, 200.0)


def test_plan_that_could_not_be_read_gives_no_cost() -> None:
    job = completed(ResourceConfig={"InstanceType": INSTANCE, "InstanceCount": 1, "TrainingPlanArn": PLAN_ARN})
    (run,) = report_of([job]).runs
    assert run.capacity == "training_plan" and run.cost_usd is None


def test_unknown_instance_type_has_no_cost_but_is_counted() -> None:
    job = completed(ResourceConfig={"InstanceType": "ml.g5.48xlarge", "InstanceCount": 1})
    report = report_of([job])
    (run,) = report.runs
    assert (run.cost_usd, run.billable_gpu_hours) == (None, None)
    assert "instance type ml.g5.48xlarge is not in the hardware catalog: no GPU-hours or price" in run.notes
    assert (report.overall.runs, report.overall.successes, report.overall.cost_usd) == (1, 1, 0.0)


def test_heterogeneous_instance_groups_are_priced_per_group() -> None:
    job = completed(
        ResourceConfig={
            "InstanceGroups": [
                {"InstanceType": INSTANCE, "InstanceCount": 1, "InstanceGroupName": "b200"},
                {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "InstanceGroupName": "h100"},
            ]
        }
    )
    (run,) = report_of([job]).runs
    # 1 h: 113.93 x 1 + 55.04 x 2 = 224.01 USD; (1 + 2) instances x 8 GPUs = 24 GPU-h; no prediction for mixed groups
    assert (run.cost_usd, run.billable_gpu_hours, run.instance_count) == (224.01, 24.0, 3)
    assert run.instance_type == "ml.p6-b200.48xlarge+ml.p5.48xlarge"
    assert run.predicted_tokens_per_second_per_gpu is None


def test_json_quoted_hyperparameters_are_understood() -> None:
    job = completed()
    job["HyperParameters"] = {key: json.dumps(value) for key, value in job["HyperParameters"].items()}
    (run,) = report_of([job]).runs
    assert run.knobs == KNOBS_1B.model_dump(mode="json")


def test_no_jobs_gives_empty_figures_not_errors() -> None:
    report = report_of([])
    overall = report.overall
    assert (overall.runs, overall.failure_rate, overall.cost_per_successful_run_usd) == (0, None, None)
    assert (overall.capacity_wait_hours_median, overall.achieved_tokens_per_second_per_gpu_mean) == (None, None)
    assert "no training jobs found in this window" in render_text(report)


def test_capacity_wait_uses_next_phase_when_end_time_is_missing() -> None:
    phases = [
        {"Status": "Starting", "StartTime": T0},
        {"Status": "Downloading", "StartTime": T0 + timedelta(minutes=7), "EndTime": T0 + timedelta(minutes=9)},
        {"Status": "Training", "StartTime": T0 + timedelta(minutes=9)},
    ]
    assert (
        capacity_wait_seconds({"TrainingJobStatus": "InProgress", "SecondaryStatusTransitions": phases}, NOW) == 420.0
    )
    assert capacity_wait_seconds({"TrainingJobStatus": "InProgress"}, NOW) is None
    # a job that ended while still Starting: waits until its end, not until now
    ended = {
        "TrainingJobStatus": "Failed",
        "TrainingEndTime": T0 + timedelta(hours=3),
        "SecondaryStatusTransitions": [{"Status": "Starting", "StartTime": T0}],
    }
    assert capacity_wait_seconds(ended, NOW) == 3 * 3600.0


def test_jobs_without_any_btk_profile_are_grouped_as_unknown() -> None:
    job = completed()
    job["HyperParameters"] = {}
    collection = Collection(jobs=[(job, JobOrigin())], plans={}, missing_pipelines=[], notes=[])
    report = build_report(
        collection,
        environment="dev",
        region="us-east-1",
        profiles=["llama3.2-1b"],
        since=SINCE,
        now=NOW,
        predictor=FakePredictor(),
    )
    assert list(report.by_profile) == ["llama3.2-1b", "unknown"]
    assert report.by_profile["unknown"].runs == 1 and report.by_profile["llama3.2-1b"].runs == 0


def test_planner_predictor_asks_the_planner_for_the_run_knobs() -> None:
    profile, instance = get_profile("llama3.2-1b"), get_instance_type(INSTANCE)
    expected = evaluate_knobs(profile, instance, 1, KNOBS_1B)
    prediction = planner_predictor("llama3.2-1b", INSTANCE, 1, KNOBS_1B, None)
    assert prediction.tokens_per_second_per_gpu == expected.estimate.tokens_per_second_per_gpu
    assert prediction.mfu == expected.estimate.mfu
    assert (prediction.peak_memory_gib, prediction.fits) == (expected.memory.total, expected.fits)


def test_planner_predictor_uses_the_architecture_the_run_trained() -> None:
    profile, instance = get_profile("llama3.2-1b"), get_instance_type(INSTANCE)
    deeper = profile.architecture.model_copy(update={"num_layers": profile.architecture.num_layers * 2})
    expected = evaluate_knobs(profile.model_copy(update={"architecture": deeper}), instance, 1, KNOBS_1B)
    prediction = planner_predictor("llama3.2-1b", INSTANCE, 1, KNOBS_1B, deeper)
    assert prediction.tokens_per_second_per_gpu == expected.estimate.tokens_per_second_per_gpu
    assert (
        prediction.tokens_per_second_per_gpu
        < planner_predictor("llama3.2-1b", INSTANCE, 1, KNOBS_1B, None).tokens_per_second_per_gpu
    )


@pytest.mark.parametrize(
    "profile, instance, knobs, message",
    [
        ("no-such-profile", INSTANCE, KNOBS_1B, "unknown profile"),
        ("llama3.2-1b", "ml.p5.48xlarge", TrainingKnobs(micro_batch_size=1, seq_len=2048, precision="mxfp8"), "mxfp8"),
    ],
)
def test_planner_predictor_explains_when_it_cannot_predict(
    profile: str, instance: str, knobs: TrainingKnobs, message: str
) -> None:
    with pytest.raises(PredictionUnavailableError, match=message):
        planner_predictor(profile, instance, 1, knobs, None)
