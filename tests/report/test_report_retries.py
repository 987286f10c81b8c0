"""A retried pipeline execution is one run: its last job's outcome, every job's cost and wait."""

from __future__ import annotations

import pytest
from retry_fixtures import retry_report

from btk.report.render import render_markdown, render_text
from btk.report.schema import Report


@pytest.fixture
def report() -> Report:
    return retry_report()


def test_retried_then_successful_execution_is_one_successful_run_with_every_jobs_cost(report: Report) -> None:
    runs = {run.pipeline_execution_arn.rsplit("/", 1)[-1]: run for run in report.runs if run.pipeline_execution_arn}
    assert len(report.runs) == 2 and set(runs) == {"r1", "r2"}
    r1 = runs["r1"]
    assert (r1.name, r1.outcome, r1.failure_cause, r1.retries) == ("pipelines-r1-train-a3", "success", None, 2)
    assert r1.created == report.runs[1].created and r1.created.hour == 8  # when A1, the first job, was created
    # GPU-hours (0 + 1200 + 7200) s x 8 GPUs / 3600 = 18.6667; cost 113.93 x 8400 / 3600 = 265.84 USD
    assert (r1.billable_gpu_hours, r1.cost_usd, r1.billable_seconds, r1.training_seconds) == (
        18.6667,
        265.84,
        8400,
        8400,
    )
    assert r1.capacity_wait_seconds == 3600 + 600 + 360
    assert [(a.name, a.failure_cause) for a in r1.retried_attempts] == [
        ("pipelines-r1-train-a1", "capacity"),
        ("pipelines-r1-train-a2", "other"),
    ]
    assert r1.retried_attempts[1].cost_usd == 37.98  # 113.93 x 1200 / 3600
    assert r1.achieved_tokens_per_second_per_gpu == 30400.0  # the last job's metrics


def test_failed_after_retries_is_one_failed_run(report: Report) -> None:
    (r2,) = [run for run in report.runs if run.outcome == "failed"]
    assert (r2.name, r2.failure_cause, r2.retries, r2.capacity_wait_seconds) == (
        "pipelines-r2-train-f2",
        "capacity",
        1,
        14400.0,
    )


def test_summary_counts_runs_not_jobs_and_retried_causes_apart(report: Report) -> None:
    overall = report.overall
    assert (overall.runs, overall.successes, overall.failed, overall.failure_rate) == (2, 1, 1, 0.5)
    assert overall.failures_by_cause["capacity"] == 1 and sum(overall.failures_by_cause.values()) == 1
    assert overall.retried_attempts == 3
    assert overall.retried_attempts_by_cause == {
        "capacity": 2,
        "out_of_memory": 0,
        "nccl_efa": 0,
        "user_error": 0,
        "other": 1,
    }
    assert (overall.cost_usd, overall.cost_per_successful_run_usd, overall.billable_gpu_hours) == (
        265.84,
        265.84,
        18.6667,
    )
    assert overall.capacity_wait_hours_total == round((4560 + 14400) / 3600, 4)


def test_retries_show_in_text_and_markdown(report: Report) -> None:
    text = render_text(report)
    assert "Retried jobs by cause (the pipeline retried them: counted in their run, not as failures)" in text
    assert " retries " in text.splitlines()[text.splitlines().index("Runs (newest first)") + 1]
    markdown = render_markdown(report)
    assert "**Retried jobs by cause" in markdown and "| retries |" in markdown


def test_no_retry_section_without_retries() -> None:
    from report_fixtures import fixture_report

    sample = fixture_report()
    assert sample.overall.retried_attempts == 0
    assert "Retried jobs by cause" not in render_text(sample)
    assert all(run.retries == 0 and run.retried_attempts == [] for run in sample.runs)
