"""The full recorded-shaped history through botocore's Stubber, figures checked by hand."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.stub import Stubber
from report_fixtures import (
    ENV,
    INSTANCE,
    KNOBS_1B,
    KNOBS_1B_OOM,
    KNOBS_3B,
    NOW,
    PLAN_ARN,
    PROFILES,
    REGION,
    SINCE,
    FakePredictor,
    queue_history,
)

from btk.report.aws import SageMakerReader
from btk.report.collect import collect
from btk.report.economics import build_report
from btk.report.schema import Report


def make_report(
    sagemaker_and_stubber: tuple[Any, Stubber], predictor: FakePredictor | None = None
) -> tuple[Report, list[float], SageMakerReader]:
    client, stubber = sagemaker_and_stubber
    queue_history(stubber)
    sleeps: list[float] = []
    reader = SageMakerReader(client, sleep=sleeps.append)
    collection = collect(reader, environment=ENV, profiles=PROFILES, since=SINCE)
    stubber.assert_no_pending_responses()
    report = build_report(
        collection,
        environment=ENV,
        region=REGION,
        profiles=PROFILES,
        since=SINCE,
        now=NOW,
        predictor=predictor or FakePredictor(),
    )
    return report, sleeps, reader


def runs_by_suffix(report: Report) -> dict[str, Any]:
    return {run.name.rsplit("-", 1)[-1].upper(): run for run in report.runs}


def test_discovery_merges_pipelines_and_tags_and_survives_throttling(
    sagemaker_and_stubber: tuple[Any, Stubber],
) -> None:
    report, sleeps, reader = make_report(sagemaker_and_stubber)
    # 3 pages of executions + 5 step lists + 1 deleted pipeline + 3 search calls (one throttled)
    # + 11 describes + 1 plan = 24 calls; one throttled call retried after base_delay (1 s).
    assert reader.calls == 24
    assert reader.throttled == 1
    assert sleeps == [1.0]
    assert len(report.runs) == 11  # J1 found by both sources is counted once
    assert report.missing_pipelines == ["btk-dev-llama3-2-3b"]
    assert [run.name for run in report.runs][:3] == [
        "btk-dev-llama3-2-1b-j5",
        "manual-llama3-2-3b-j11",
        "btk-dev-llama3-2-3b-j10",
    ]  # newest first
    runs = runs_by_suffix(report)
    assert runs["J1"].pipeline_execution_arn is not None and runs["J1"].pipeline_execution_arn.endswith("/execution/e1")
    assert runs["J6"].pipeline_execution_arn is None  # found by tags only
    assert runs["J11"].profile == "llama3.2-3b"  # from the btk:profile tag: no job.profile hyperparameter


def test_outcomes_and_failure_causes(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    report, _, _ = make_report(sagemaker_and_stubber)
    runs = runs_by_suffix(report)
    assert {key: (run.outcome, run.failure_cause) for key, run in runs.items()} == {
        "J1": ("success", None),
        "J2": ("success", None),
        "J3": ("failed", "out_of_memory"),
        "J4": ("failed", "capacity"),
        "J5": ("running", None),
        "J6": ("success", None),
        "J7": ("failed", "nccl_efa"),
        "J8": ("failed", "user_error"),
        "J9": ("failed", "other"),
        "J10": ("stopped", None),
        "J11": ("success", None),
    }
    assert (
        runs["J4"].failure_reason == "CapacityError: Unable to provision requested ML compute capacity. "
        "Please retry using a different ML instance type."
    )
    assert runs["J3"].failure_reason == "AlgorithmError: ExecuteUserScriptError:"  # first line only


def test_per_run_figures(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    report, _, _ = make_report(sagemaker_and_stubber)
    runs = runs_by_suffix(report)
    # J1: on demand, 7200 s billable on 1 x 8 GPUs: 7200*1*8/3600 = 16 GPU-h; 113.93*1*7200/3600 = 227.86 USD.
    assert (runs["J1"].billable_gpu_hours, runs["J1"].cost_usd, runs["J1"].capacity) == (16.0, 227.86, "on_demand")
    assert runs["J1"].capacity_wait_seconds == 360.0  # Starting 08:00 -> 08:06
    # tokens/s: (30400 - 32000) / 32000 * 100 = -5.0 %; MFU: (0.41 - 0.44) / 0.44 * 100 = -6.818 -> -6.82 %
    assert (runs["J1"].tokens_per_second_error_pct, runs["J1"].mfu_error_pct) == (-5.0, -6.82)
    # J2: spot, 10800 s trained, 3600 s billed: 3600*8/3600 = 8 GPU-h; 113.93 USD;
    # savings 113.93 * (10800 - 3600) / 3600 = 227.86 USD. Waits: Starting 30 min + Starting again 60 min = 5400 s.
    assert (runs["J2"].billable_gpu_hours, runs["J2"].cost_usd, runs["J2"].spot_savings_usd) == (8.0, 113.93, 227.86)
    assert runs["J2"].capacity == "spot" and runs["J2"].capacity_wait_seconds == 5400.0
    # (31040 - 32000) / 32000 * 100 = -3.0 %; (0.40 - 0.44) / 0.44 * 100 = -9.09 %
    assert (runs["J2"].tokens_per_second_error_pct, runs["J2"].mfu_error_pct) == (-3.0, -9.09)
    # J3: OOM after 600 s: 600*8/3600 = 1.3333 GPU-h; 113.93 * 600 / 3600 = 18.988 -> 18.99 USD; no metrics.
    assert (runs["J3"].billable_gpu_hours, runs["J3"].cost_usd) == (1.3333, 18.99)
    assert runs["J3"].achieved_tokens_per_second_per_gpu is None and runs["J3"].tokens_per_second_error_pct is None
    assert runs["J3"].predicted_tokens_per_second_per_gpu == 32000.0  # still predicted from its knobs
    assert "no final metrics" in runs["J3"].notes
    # the (fake) planner said these knobs fit: an OOM run is flagged for the memory model
    assert runs["J3"].predicted_fits is True
    assert any("although the planner predicted the knobs fit" in note for note in runs["J3"].notes)
    assert (runs["J1"].achieved_peak_memory_gib, runs["J1"].predicted_peak_memory_gib) == (101.75, 96.5)
    # J4: never got instances: 0 billable, 0 USD, waited Starting 120 min = 7200 s.
    assert (runs["J4"].billable_gpu_hours, runs["J4"].cost_usd, runs["J4"].capacity_wait_seconds) == (0.0, 0.0, 7200.0)
    # J5: still Starting since 10:00, now is 12:00 -> 7200 s so far; no cost while running.
    assert (runs["J5"].capacity_wait_seconds, runs["J5"].cost_usd, runs["J5"].billable_gpu_hours) == (
        7200.0,
        None,
        None,
    )
    assert "still running: no cost until it ends" in runs["J5"].notes
    # J6: training plan 4800 USD / (24 h x 2 instances) = 100 USD per instance-hour; 10 h x 2 instances = 2000 USD.
    # GPU-h 36000*2*8/3600 = 160; waits Pending 60 min + Starting 10 min = 4200 s.
    assert (runs["J6"].capacity, runs["J6"].training_plan, runs["J6"].cost_usd) == (
        "training_plan",
        "dev-b200-june",
        2000.0,
    )
    assert (runs["J6"].billable_gpu_hours, runs["J6"].capacity_wait_seconds) == (160.0, 4200.0)
    # J7: 2 instances x 1800 s: 113.93 * 2 * 0.5 = 113.93 USD; 8 GPU-h; (12000-15000)/15000 = -20 %.
    assert (runs["J7"].cost_usd, runs["J7"].billable_gpu_hours, runs["J7"].tokens_per_second_error_pct) == (
        113.93,
        8.0,
        -20.0,
    )
    # J8: 113.93 * 120 / 3600 = 3.7977 -> 3.80 USD; J9: 113.93 * 300 / 3600 = 9.494 -> 9.49;
    # J10: 113.93 * 900 / 3600 = 28.4825 -> 28.48
    assert (runs["J8"].cost_usd, runs["J9"].cost_usd, runs["J10"].cost_usd) == (3.8, 9.49, 28.48)
    # J10: one instance: (16400 - 16000) / 16000 = +2.5 %; (0.483 - 0.46) / 0.46 = +5.0 %
    assert (runs["J10"].tokens_per_second_error_pct, runs["J10"].mfu_error_pct) == (2.5, 5.0)
    # J11: no btk hyperparameters: no knobs, no prediction, no metrics; still costed: 113.93 USD.
    assert runs["J11"].knobs is None and runs["J11"].predicted_tokens_per_second_per_gpu is None
    assert runs["J11"].cost_usd == 113.93
    assert any(note.startswith("no knobs in the hyperparameters") for note in runs["J11"].notes)


def test_predictor_receives_the_knobs_each_run_used(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    predictor = FakePredictor()
    report, _, _ = make_report(sagemaker_and_stubber, predictor)
    asked = {(profile, instance, nodes, knobs) for profile, instance, nodes, knobs, _ in predictor.calls}
    assert asked == {
        ("llama3.2-1b", INSTANCE, 1, KNOBS_1B),
        ("llama3.2-1b", INSTANCE, 1, KNOBS_1B_OOM),
        ("llama3.2-3b", INSTANCE, 2, KNOBS_3B),
        ("llama3.2-3b", INSTANCE, 1, KNOBS_3B),
    }
    assert len(predictor.calls) == 10  # every run but J11 (no knobs)
    assert all(architecture is not None for *_, architecture in predictor.calls)
    assert runs_by_suffix(report)["J3"].knobs == KNOBS_1B_OOM.model_dump(mode="json")


def test_profile_summaries(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    report, _, _ = make_report(sagemaker_and_stubber)
    one_b = report.by_profile["llama3.2-1b"]
    # runs J1..J5: 2 ok, 2 failed, 0 stopped, 1 running; failure rate 2 / (2 + 2 + 0) = 0.5
    assert (one_b.runs, one_b.successes, one_b.failed, one_b.stopped, one_b.running) == (5, 2, 2, 0, 1)
    assert one_b.failure_rate == 0.5
    assert one_b.failures_by_cause == {"capacity": 1, "out_of_memory": 1, "nccl_efa": 0, "user_error": 0, "other": 0}
    # waits 360 + 5400 + 300 + 7200 + 7200 = 20460 s = 5.6833 h; median of (0.0833, 0.1, 1.5, 2, 2) = 1.5; max 2
    assert (one_b.capacity_wait_hours_total, one_b.capacity_wait_hours_median, one_b.capacity_wait_hours_max) == (
        5.6833,
        1.5,
        2.0,
    )
    # GPU-h 16 + 8 + 1.3333 + 0 = 25.3333; cost 227.86 + 113.93 + 18.9883 + 0 = 360.7783 -> 360.78
    assert (one_b.billable_gpu_hours, one_b.cost_usd) == (25.3333, 360.78)
    # on demand 227.86 + 18.9883 = 246.8483 -> 246.85; spot 113.93
    assert one_b.cost_by_capacity_usd == {"on_demand": 246.85, "spot": 113.93, "training_plan": 0.0}
    assert one_b.spot_savings_usd == 227.86
    # 360.7783 / 2 successes = 180.389 -> 180.39 (the failed OOM run's cost is included)
    assert one_b.cost_per_successful_run_usd == 180.39
    # metrics: J1, J2. achieved (30400 + 31040) / 2 = 30720; predicted 32000; errors (-5 + -3) / 2 = -4.0
    assert (one_b.runs_with_metrics, one_b.achieved_tokens_per_second_per_gpu_mean) == (2, 30720.0)
    assert (one_b.predicted_tokens_per_second_per_gpu_mean, one_b.tokens_per_second_error_pct_mean) == (32000.0, -4.0)
    # MFU: achieved (0.41 + 0.40) / 2 = 0.405; errors (-6.8182 + -9.0909) / 2 = -7.9545 -> -7.95
    assert (one_b.achieved_mfu_mean, one_b.predicted_mfu_mean, one_b.mfu_error_pct_mean) == (0.405, 0.44, -7.95)

    three_b = report.by_profile["llama3.2-3b"]
    # J6..J11: ok J6, J11; failed J7, J8, J9; stopped J10 -> failure rate 3 / 6 = 0.5
    assert (three_b.runs, three_b.successes, three_b.failed, three_b.stopped, three_b.running) == (6, 2, 3, 1, 0)
    assert three_b.failures_by_cause == {"capacity": 0, "out_of_memory": 0, "nccl_efa": 1, "user_error": 1, "other": 1}
    # waits 4200 + 600 + 240 + 300 + 300 + 180 = 5820 s = 1.6167 h; median (300 + 300) / 2 s = 0.0833 h; max 4200 s
    assert (three_b.capacity_wait_hours_total, three_b.capacity_wait_hours_median, three_b.capacity_wait_hours_max) == (
        1.6167,
        0.0833,
        1.1667,
    )
    # GPU-h 160 + 8 + 0.2667 + 0.6667 + 2 + 8 = 178.9333
    # cost 2000 + 113.93 + 3.7977 + 9.4942 + 28.4825 + 113.93 = 2269.6343 -> 2269.63; per success / 2 = 1134.82
    assert (three_b.billable_gpu_hours, three_b.cost_usd, three_b.cost_per_successful_run_usd) == (
        178.9333,
        2269.63,
        1134.82,
    )
    assert three_b.cost_by_capacity_usd == {"on_demand": 269.63, "spot": 0.0, "training_plan": 2000.0}
    # metrics J6, J7, J10: achieved (14000 + 12000 + 16400) / 3 = 14133.3; predicted (15000 + 15000 + 16000) / 3
    # = 15333.3; errors (-6.6667 - 20 + 2.5) / 3 = -8.0556 -> -8.06; MFU errors (-6.6667 - 20 + 5) / 3 = -7.22
    assert (three_b.runs_with_metrics, three_b.achieved_tokens_per_second_per_gpu_mean) == (3, 14133.3)
    assert (three_b.predicted_tokens_per_second_per_gpu_mean, three_b.tokens_per_second_error_pct_mean) == (
        15333.3,
        -8.06,
    )
    # achieved MFU (0.42 + 0.36 + 0.483) / 3 = 0.421; predicted (0.45 + 0.45 + 0.46) / 3 = 0.4533
    assert (three_b.achieved_mfu_mean, three_b.predicted_mfu_mean, three_b.mfu_error_pct_mean) == (0.421, 0.4533, -7.22)


def test_overall_summary_and_training_plan(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    report, _, _ = make_report(sagemaker_and_stubber)
    overall = report.overall
    # 11 runs: 4 ok, 5 failed, 1 stopped, 1 running; failure rate 5 / 10 = 0.5
    assert (overall.runs, overall.successes, overall.failed, overall.stopped, overall.running) == (11, 4, 5, 1, 1)
    assert overall.failure_rate == 0.5
    assert overall.failures_by_cause == {"capacity": 1, "out_of_memory": 1, "nccl_efa": 1, "user_error": 1, "other": 1}
    # waits 20460 + 5820 = 26280 s = 7.3 h; median of 11 sorted waits is the 6th: J1's 360 s = 0.1 h; max 2 h
    assert (overall.capacity_wait_hours_total, overall.capacity_wait_hours_median, overall.capacity_wait_hours_max) == (
        7.3,
        0.1,
        2.0,
    )
    # GPU-h 25.3333 + 178.9333 = 204.2667; cost 360.7783 + 2269.6343 = 2630.4127 -> 2630.41; / 4 ok = 657.60
    assert (overall.billable_gpu_hours, overall.cost_usd, overall.cost_per_successful_run_usd) == (
        204.2667,
        2630.41,
        657.6,
    )
    assert overall.cost_by_capacity_usd == {"on_demand": 516.48, "spot": 113.93, "training_plan": 2000.0}
    # 5 runs with metrics: achieved (30400 + 31040 + 14000 + 12000 + 16400) / 5 = 20768;
    # predicted (32000 * 2 + 15000 * 2 + 16000) / 5 = 22000; errors (-5 - 3 - 6.6667 - 20 + 2.5) / 5 = -6.43
    assert (overall.achieved_tokens_per_second_per_gpu_mean, overall.predicted_tokens_per_second_per_gpu_mean) == (
        20768.0,
        22000.0,
    )
    assert overall.tokens_per_second_error_pct_mean == -6.43
    # MFU: achieved 2.073 / 5 = 0.4146; predicted 2.24 / 5 = 0.448;
    # errors (-6.8182 - 9.0909 - 6.6667 - 20 + 5) / 5 = -7.5152 -> -7.52
    assert (overall.achieved_mfu_mean, overall.predicted_mfu_mean, overall.mfu_error_pct_mean) == (0.4146, 0.448, -7.52)

    (plan,) = report.training_plans
    # 4800 USD over 24 h x 2 instances = 100 USD/instance-hour; J6 used 10 h x 2 = 20 instance-hours
    # -> 2000 USD charged to runs; utilisation 20 / 48 = 0.4167
    assert (plan.arn, plan.upfront_fee, plan.fee_per_instance_hour) == (PLAN_ARN, 4800.0, 100.0)
    assert (plan.used_instance_hours, plan.apportioned_fee, plan.utilisation) == (20.0, 2000.0, 0.4167)


def test_profile_filter_keeps_only_that_profile(sagemaker_and_stubber: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker_and_stubber
    queue_history(stubber)
    collection = collect(SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES, since=SINCE)
    report = build_report(
        collection,
        environment=ENV,
        region=REGION,
        profiles=["llama3.2-3b"],
        since=SINCE,
        now=NOW,
        predictor=FakePredictor(),
        only_profile="llama3.2-3b",
    )
    assert list(report.by_profile) == ["llama3.2-3b"]
    assert {run.profile for run in report.runs} == {"llama3.2-3b"}
    assert report.overall == report.by_profile["llama3.2-3b"]


@pytest.mark.parametrize("since_days, expected", [(30, 11), (5, 3)])
def test_window_drops_older_jobs(sagemaker_and_stubber: tuple[Any, Stubber], since_days: int, expected: int) -> None:
    """Jobs older than --since are dropped even if a source returned them."""
    from datetime import timedelta

    client, stubber = sagemaker_and_stubber
    queue_history(stubber)
    collection = collect(SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES, since=SINCE)
    report = build_report(
        collection,
        environment=ENV,
        region=REGION,
        profiles=PROFILES,
        since=NOW - timedelta(days=since_days),
        now=NOW,
        predictor=FakePredictor(),
    )
    # 5 days back from 2025-07-01 12:00 is 2025-06-26 12:00: J5 (07-01), J11 (06-29), J10 (06-28) remain
    assert len(report.runs) == expected
