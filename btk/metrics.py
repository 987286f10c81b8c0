"""The training metric lines: one format, printed by the trainer, parsed by the pipeline.

The trainer prints one line per logged step with :func:`format_metric_line`; the SageMaker
pipeline's ``MetricDefinitions`` come from :data:`METRIC_DEFINITIONS`. Both derive from
:data:`METRICS`, so the format and the regexes cannot drift apart (tested).

Example line::

    btk_metric step=20 loss=2.734100 tokens_per_second_per_gpu=9123.4 tflops_per_gpu=512.7
        mfu=0.4321 peak_memory_gib=71.25

(printed as one line; wrapped here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE_PREFIX = "btk_metric"
LINE_START = r"^(?:\[[A-Za-z0-9_]{1,32}\]:)?"
"""Start of a metric line: optionally torchrun's per-rank tag (``[rank0]:``, ``[default0]:``)."""
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_FIELD = r"[a-z_]{1,64}=[^ =]{1,64}"


@dataclass(frozen=True)
class Metric:
    """One metric: its key in the line, its CloudWatch/SageMaker name and print format."""

    key: str
    sagemaker_name: str
    fmt: str
    unit: str

    @property
    def regex(self) -> str:
        """Regex with one capture group, as SageMaker ``MetricDefinitions`` expects.

        Linear on any line: anchored at the line start, and every field before this one is
        a bounded ``name=value`` token, so no input makes the engine backtrack over the line
        once per ``btk_metric`` it contains (an unanchored ``.*`` did: quadratic).
        """
        return rf"{LINE_START}{LINE_PREFIX}(?: {_FIELD})*? {self.key}={_NUMBER}(?: |$)"


METRICS: tuple[Metric, ...] = (
    Metric("step", "train:step", "{:d}", "count"),
    Metric("loss", "train:loss", "{:.6f}", "none"),
    Metric("tokens_per_second_per_gpu", "train:tokens_per_second_per_gpu", "{:.1f}", "tokens/s"),
    Metric("tflops_per_gpu", "train:tflops_per_gpu", "{:.1f}", "TFLOP/s"),
    Metric("mfu", "train:mfu", "{:.4f}", "fraction"),
    Metric("peak_memory_gib", "train:peak_memory_gib", "{:.2f}", "GiB"),
    # Steps skipped so far for a NaN/inf loss or gradient norm: a NaN loss prints as "nan",
    # which no number regex matches, so divergence shows here instead.
    Metric("nonfinite_steps", "train:nonfinite_steps", "{:d}", "count"),
    # Printed once per job by the network pre-flight (btk_trainer.preflight), on a line of its
    # own (format_preflight_line): NCCL all-reduce bus bandwidth across all nodes, GB/s (1e9).
    Metric("allreduce_busbw_gbps", "train:allreduce_busbw_gbps", "{:.1f}", "GB/s"),
    # Printed once per run that reaches its last step, on a line of its own (format_loss_drop_line): the loss of
    # the run's first metric line minus its last's; above 0 when the loss fell. A rehearsal's gate reads it.
    Metric("loss_drop", "train:loss_drop", "{:.6f}", "none"),
    # Printed once at the start of a job that stepped down its knob ladder (format_knob_rung_line): the rung it
    # trains on, 1 for the ladder's first; absent on the plan's own knobs (rung 0).
    Metric("knob_rung", "train:knob_rung", "{:d}", "count"),
    # Printed once at the end of a run that reached its last step (format_own_line): seconds from the trainer's
    # start to the end of its first step (model build, data check and compilation included); the spread of the
    # step time over the metric windows after the first ((max - min) / median); peak memory reserved per GPU.
    Metric("first_step_seconds", "train:first_step_seconds", "{:.3f}", "s"),
    Metric("step_time_spread", "train:step_time_spread", "{:.4f}", "fraction"),
    Metric("peak_reserved_gib", "train:peak_reserved_gib", "{:.2f}", "GiB"),
)
OWN_LINE_METRICS = ("allreduce_busbw_gbps", "loss_drop", "knob_rung", "first_step_seconds", "step_time_spread",
                    "peak_reserved_gib")
"""Metrics printed once, each on a line of its own, not on the per-step training line."""
#: The metrics of the per-step training line (format_metric_line); the rest have lines of their own.
TRAINING_METRICS: tuple[Metric, ...] = tuple(metric for metric in METRICS if metric.key not in OWN_LINE_METRICS)
METRICS_BY_KEY: dict[str, Metric] = {metric.key: metric for metric in METRICS}

METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": metric.sagemaker_name, "Regex": metric.regex} for metric in METRICS
]


def format_metric_line(
    *,
    step: int,
    loss: float,
    tokens_per_second_per_gpu: float,
    tflops_per_gpu: float,
    mfu: float,
    peak_memory_gib: float,
    nonfinite_steps: int = 0,
) -> str:
    """Format one metric line (what the trainer prints to stdout)."""
    values: dict[str, float | int] = {
        "step": step,
        "loss": loss,
        "tokens_per_second_per_gpu": tokens_per_second_per_gpu,
        "tflops_per_gpu": tflops_per_gpu,
        "mfu": mfu,
        "peak_memory_gib": peak_memory_gib,
        "nonfinite_steps": nonfinite_steps,
    }
    fields = " ".join(f"{m.key}={m.fmt.format(values[m.key])}" for m in TRAINING_METRICS)
    return f"{LINE_PREFIX} {fields}"


def format_own_line(key: str, value: float) -> str:
    """Format a metric printed on a line of its own (:data:`OWN_LINE_METRICS`)."""
    metric = METRICS_BY_KEY[key]
    return f"{LINE_PREFIX} {metric.key}={metric.fmt.format(value)}"


def format_preflight_line(*, allreduce_busbw_gbps: float) -> str:
    """Format the network pre-flight's metric line (printed once per job, before training)."""
    return format_own_line("allreduce_busbw_gbps", allreduce_busbw_gbps)


def format_knob_rung_line(*, rung: int) -> str:
    """Format the line of a job that trains on rung ``rung`` of its knob ladder."""
    return format_own_line("knob_rung", rung)


def format_loss_drop_line(*, first_loss: float, last_loss: float) -> str:
    """Format the end-of-run line: how far the loss fell from the run's first metric line to its last."""
    return format_own_line("loss_drop", first_loss - last_loss)


def parse_metric_line(line: str) -> dict[str, float] | None:
    """Parse a line with exactly the regexes SageMaker uses; ``None`` if it is no metric line."""
    if not _LINE.match(line):
        return None
    parsed: dict[str, float] = {}
    for metric in METRICS:
        match = _COMPILED[metric.key].search(line)
        if match:
            parsed[metric.key] = float(match.group(1))
    return parsed


_LINE = re.compile(rf"{LINE_START}{LINE_PREFIX} ")
_COMPILED: dict[str, re.Pattern[str]] = {metric.key: re.compile(metric.regex) for metric in METRICS}
