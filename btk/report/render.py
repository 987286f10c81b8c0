"""Render a :class:`~btk.report.schema.Report` as a text table, Markdown or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from btk.report.schema import FAILURE_CAUSES, GroupSummary, Report, RunReport

Format = Literal["table", "markdown", "json"]
FORMATS: tuple[Format, ...] = ("table", "markdown", "json")
CAUSE_LABELS = {
    "capacity": "capacity",
    "out_of_memory": "out of memory",
    "nccl_efa": "NCCL/EFA",
    "user_error": "user error",
    "other": "other",
}
Row = Sequence[str]


def _num(value: float | int | None, fmt: str = "{:,.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _pair(achieved: float | None, predicted: float | None, fmt: str) -> str:
    return f"{_num(achieved, fmt)} ({_num(predicted, fmt)})"


def _signed_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _summary_rows(report: Report) -> tuple[Row, Sequence[Row]]:
    headers = (
        "profile",
        "runs",
        "ok",
        "failed",
        "stopped",
        "running",
        "failure rate",
        "capacity wait h (median)",
        "GPU-hours",
        "cost $",
        "spot saved $",
        "$ per successful run",
    )
    groups: list[tuple[str, GroupSummary]] = [*report.by_profile.items(), ("all", report.overall)]
    rows = [
        (
            name,
            str(g.runs),
            str(g.successes),
            str(g.failed),
            str(g.stopped),
            str(g.running),
            _pct(g.failure_rate),
            f"{g.capacity_wait_hours_total:,.2f} ({_num(g.capacity_wait_hours_median)})",
            _num(g.billable_gpu_hours),
            _num(g.cost_usd),
            _num(g.spot_savings_usd),
            _num(g.cost_per_successful_run_usd),
        )
        for name, g in groups
    ]
    return headers, rows


def _cause_rows(report: Report) -> tuple[Row, Sequence[Row]]:
    headers = ("profile", *(CAUSE_LABELS[cause] for cause in FAILURE_CAUSES))
    groups = [*report.by_profile.items(), ("all", report.overall)]
    return headers, [(name, *(str(g.failures_by_cause[c]) for c in FAILURE_CAUSES)) for name, g in groups]


def _prediction_rows(report: Report) -> tuple[Row, Sequence[Row]]:
    headers = (
        "profile",
        "runs with metrics",
        "tokens/s/GPU achieved",
        "predicted",
        "error",
        "MFU achieved",
        "predicted",
        "error",
    )
    groups = [*report.by_profile.items(), ("all", report.overall)]
    rows = [
        (
            name,
            str(g.runs_with_metrics),
            _num(g.achieved_tokens_per_second_per_gpu_mean, "{:,.0f}"),
            _num(g.predicted_tokens_per_second_per_gpu_mean, "{:,.0f}"),
            _signed_pct(g.tokens_per_second_error_pct_mean),
            _num(g.achieved_mfu_mean, "{:.3f}"),
            _num(g.predicted_mfu_mean, "{:.3f}"),
            _signed_pct(g.mfu_error_pct_mean),
        )
        for name, g in groups
    ]
    return headers, rows


def _plan_rows(report: Report) -> tuple[Row, Sequence[Row]]:
    headers = (
        "training plan",
        "fee",
        "hours x instances",
        "per instance-hour",
        "used instance-hours",
        "charged to runs",
        "utilisation",
    )
    rows = [
        (
            p.name,
            f"{p.upfront_fee:,.2f} {p.currency}",
            f"{p.duration_hours:g} x {p.instance_count}",
            _num(p.fee_per_instance_hour),
            _num(p.used_instance_hours),
            _num(p.apportioned_fee),
            _pct(p.utilisation),
        )
        for p in report.training_plans
    ]
    return headers, rows


def _outcome(run: RunReport) -> str:
    if run.outcome == "failed" and run.failure_cause:
        return f"failed: {CAUSE_LABELS[run.failure_cause]}"
    return run.outcome


def _run_rows(report: Report) -> tuple[Row, Sequence[Row]]:
    headers = (
        "job",
        "profile",
        "created (UTC)",
        "outcome",
        "capacity",
        "instances",
        "wait h",
        "GPU-hours",
        "cost $",
        "tokens/s/GPU (pred.)",
        "MFU (pred.)",
    )
    rows = [
        (
            r.name,
            r.profile,
            r.created.strftime("%Y-%m-%d %H:%M"),
            _outcome(r),
            r.capacity.replace("_", " "),
            f"{r.instance_count} x {r.instance_type.removeprefix('ml.')}",
            _num(None if r.capacity_wait_seconds is None else r.capacity_wait_seconds / 3600),
            _num(r.billable_gpu_hours),
            _num(r.cost_usd),
            _pair(r.achieved_tokens_per_second_per_gpu, r.predicted_tokens_per_second_per_gpu, "{:,.0f}"),
            _pair(r.achieved_mfu, r.predicted_mfu, "{:.3f}"),
        )
        for r in report.runs
    ]
    return headers, rows


def _text_table(headers: Row, rows: Sequence[Row], left: int) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]

    def line(cells: Row) -> str:
        return "  ".join(
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


def _markdown_table(headers: Row, rows: Sequence[Row], left: int) -> list[str]:
    def line(cells: Row) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = "|" + "|".join("---" if index < left else "---:" for index in range(len(headers))) + "|"
    return [line(headers), rule, *(line(row) for row in rows)]


def _title(report: Report) -> str:
    return (
        f"btk report: environment {report.environment} ({report.region}), "
        f"jobs created since {report.since:%Y-%m-%d %H:%M} UTC, generated {report.generated_at:%Y-%m-%d %H:%M} UTC"
    )


# (title, rows, number of leading text columns, which are left-aligned)
_SECTIONS = (
    ("Summary", _summary_rows, 1),
    ("Failures by cause", _cause_rows, 1),
    ("Achieved vs predicted (planner)", _prediction_rows, 1),
    ("Training plans", _plan_rows, 1),
    ("Runs (newest first)", _run_rows, 6),
)


def _footer(report: Report) -> list[str]:
    lines = [f"pipeline not found (deleted?), jobs found by tags: {name}" for name in report.missing_pipelines]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def render_text(report: Report) -> str:
    out = [_title(report)]
    for title, rows_of, left in _SECTIONS:
        headers, rows = rows_of(report)
        if rows:
            out += ["", title, *_text_table(headers, rows, left)]
    if not report.runs:
        out += ["", "no training jobs found in this window"]
    footer = _footer(report)
    return "\n".join(out + (["", *footer] if footer else [])) + "\n"


def render_markdown(report: Report) -> str:
    out = [f"### {_title(report)}"]
    for title, rows_of, left in _SECTIONS:
        headers, rows = rows_of(report)
        if rows:
            out += ["", f"**{title}**", "", *_markdown_table(headers, rows, left)]
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
