"""Render a :class:`~btk.report.schema.Report` as a text table, Markdown or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from btk.report.schema import FAILURE_CAUSES, FailureCause, GroupSummary, PlanReport, Report, RunReport
from btk.table import Column, Table
from btk.units import SECONDS_PER_HOUR

Format = Literal["table", "markdown", "json"]
CAUSE_LABELS = {
    "capacity": "capacity",
    "out_of_memory": "out of memory",
    "nccl_efa": "NCCL/EFA",
    "user_error": "user error",
    "other": "other",
}
_RowT = TypeVar("_RowT")


def _num(value: float | int | None, fmt: str = "{:,.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _pair(achieved: float | None, predicted: float | None, fmt: str) -> str:
    return f"{_num(achieved, fmt)} ({_num(predicted, fmt)})"


def _signed_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


Group = tuple[str, GroupSummary]
"""A profile's name (or ``all``) and its figures: one row of the per-group tables."""


def _groups(report: Report) -> list[Group]:
    return [*report.by_profile.items(), ("all", report.overall)]


def _left(header: str, cell: Callable[[_RowT], str]) -> Column[_RowT]:
    return Column(header, cell, "left")


def _right(header: str, cell: Callable[[_RowT], str]) -> Column[_RowT]:
    return Column(header, cell, "right")


def _group_name(group: Group) -> str:
    return group[0]


SUMMARY: Table[Group] = Table(
    [
        _left("profile", _group_name),
        _right("runs", lambda g: str(g[1].runs)),
        _right("ok", lambda g: str(g[1].successes)),
        _right("failed", lambda g: str(g[1].failed)),
        _right("stopped", lambda g: str(g[1].stopped)),
        _right("running", lambda g: str(g[1].running)),
        _right("failure rate", lambda g: _pct(g[1].failure_rate)),
        _right(
            "capacity wait h (median)",
            lambda g: f"{g[1].capacity_wait_hours_total:,.2f} ({_num(g[1].capacity_wait_hours_median)})",
        ),
        _right("GPU-hours", lambda g: _num(g[1].billable_gpu_hours)),
        _right("cost $", lambda g: _num(g[1].cost_usd)),
        _right("spot saved $", lambda g: _num(g[1].spot_savings_usd)),
        _right("$ per successful run", lambda g: _num(g[1].cost_per_successful_run_usd)),
    ]
)


def _cause_column(cause: FailureCause) -> Column[Group]:
    return _right(CAUSE_LABELS[cause], lambda g: str(g[1].failures_by_cause[cause]))


CAUSES: Table[Group] = Table([_left("profile", _group_name), *(_cause_column(cause) for cause in FAILURE_CAUSES)])


def _retried_cause_column(cause: FailureCause) -> Column[Group]:
    return _right(CAUSE_LABELS[cause], lambda g: str(g[1].retried_attempts_by_cause[cause]))


RETRIED: Table[Group] = Table(
    [
        _left("profile", _group_name),
        _right("retried jobs", lambda g: str(g[1].retried_attempts)),
        *(_retried_cause_column(cause) for cause in FAILURE_CAUSES),
    ]
)

PREDICTION: Table[Group] = Table(
    [
        _left("profile", _group_name),
        _right("runs with metrics", lambda g: str(g[1].runs_with_metrics)),
        _right("tokens/s/GPU achieved", lambda g: _num(g[1].achieved_tokens_per_second_per_gpu_mean, "{:,.0f}")),
        _right("predicted", lambda g: _num(g[1].predicted_tokens_per_second_per_gpu_mean, "{:,.0f}")),
        _right("error", lambda g: _signed_pct(g[1].tokens_per_second_error_pct_mean)),
        _right("MFU achieved", lambda g: _num(g[1].achieved_mfu_mean, "{:.3f}")),
        _right("predicted", lambda g: _num(g[1].predicted_mfu_mean, "{:.3f}")),
        _right("error", lambda g: _signed_pct(g[1].mfu_error_pct_mean)),
    ]
)

PLANS: Table[PlanReport] = Table(
    [
        _left("training plan", lambda p: p.name),
        _right("fee", lambda p: f"{p.upfront_fee:,.2f} {p.currency}"),
        _right("hours x instances", lambda p: f"{p.duration_hours:g} x {p.instance_count}"),
        _right("per instance-hour", lambda p: _num(p.fee_per_instance_hour)),
        _right("used instance-hours", lambda p: _num(p.used_instance_hours)),
        _right("charged to runs", lambda p: _num(p.apportioned_fee)),
        _right("utilisation", lambda p: _pct(p.utilisation)),
    ]
)


def _outcome(run: RunReport) -> str:
    if run.outcome == "failed" and run.failure_cause:
        return f"failed: {CAUSE_LABELS[run.failure_cause]}"
    return run.outcome


def _wait_hours(run: RunReport) -> str:
    return _num(None if run.capacity_wait_seconds is None else run.capacity_wait_seconds / SECONDS_PER_HOUR)


RUNS: Table[RunReport] = Table(
    [
        _left("job", lambda r: r.name),
        _left("profile", lambda r: r.profile),
        _left("created (UTC)", lambda r: r.created.strftime("%Y-%m-%d %H:%M")),
        _left("outcome", _outcome),
        _right("retries", lambda r: str(r.retries)),
        _left("capacity", lambda r: r.capacity.replace("_", " ")),
        _left("instances", lambda r: f"{r.instance_count} x {r.instance_type.removeprefix('ml.')}"),
        _right("wait h", _wait_hours),
        _right("GPU-hours", lambda r: _num(r.billable_gpu_hours)),
        _right("cost $", lambda r: _num(r.cost_usd)),
        _right(
            "tokens/s/GPU (pred.)",
            lambda r: _pair(r.achieved_tokens_per_second_per_gpu, r.predicted_tokens_per_second_per_gpu, "{:,.0f}"),
        ),
        _right("MFU (pred.)", lambda r: _pair(r.achieved_mfu, r.predicted_mfu, "{:.3f}")),
    ]
)


@dataclass(frozen=True)
class _Section:
    """A titled table and the rows it shows; a section without rows is left out."""

    title: str
    text: list[str]
    markdown: list[str]
    empty: bool


def _section(title: str, table: Table[_RowT], rows: Sequence[_RowT]) -> _Section:
    return _Section(title, table.text(rows), table.markdown(rows), not rows)


def _sections(report: Report) -> list[_Section]:
    groups = _groups(report)
    return [
        _section("Summary", SUMMARY, groups),
        _section("Failures by cause (failed runs, by their last job)", CAUSES, groups),
        _section(
            "Retried jobs by cause (the pipeline retried them: counted in their run, not as failures)",
            RETRIED,
            groups if report.overall.retried_attempts else [],
        ),
        _section("Achieved vs predicted (planner)", PREDICTION, groups),
        _section("Training plans", PLANS, report.training_plans),
        _section("Runs (newest first)", RUNS, report.runs),
    ]


def _title(report: Report) -> str:
    return (
        f"btk report: environment {report.environment} ({report.region}), "
        f"jobs created since {report.since:%Y-%m-%d %H:%M} UTC, generated {report.generated_at:%Y-%m-%d %H:%M} UTC"
    )


def _footer(report: Report) -> list[str]:
    lines = [f"pipeline not found (deleted?), jobs found by tags: {name}" for name in report.missing_pipelines]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def render_text(report: Report) -> str:
    out = [_title(report)]
    for section in _sections(report):
        if not section.empty:
            out += ["", section.title, *section.text]
    if not report.runs:
        out += ["", "no training jobs found in this window"]
    footer = _footer(report)
    return "\n".join(out + (["", *footer] if footer else [])) + "\n"


def render_markdown(report: Report) -> str:
    out = [f"### {_title(report)}"]
    for section in _sections(report):
        if not section.empty:
            out += ["", f"**{section.title}**", "", *section.markdown]
    if not report.runs:
        out += ["", "_no training jobs found in this window_"]
    footer = _footer(report)
    if footer:
        out += ["", *(f"- {line}" for line in footer)]
    return "\n".join(out) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2) + "\n"


def render(report: Report, fmt: Format) -> str:
    """The report in ``fmt`` (``table``, ``markdown`` or ``json``)."""
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    return render_text(report)
