"""The metrics module: the regexes SageMaker uses parse the lines the trainer prints."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from btk.metrics import (
    METRIC_DEFINITIONS,
    METRICS,
    TRAINING_METRICS,
    format_knob_rung_line,
    format_loss_drop_line,
    format_metric_line,
    format_preflight_line,
    parse_metric_line,
)

finite = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(
    st.integers(0, 10**9), finite, finite, finite, st.floats(0, 1), finite, st.integers(0, 10**6), st.booleans()
)
def test_every_regex_parses_the_printed_value(
    step: int, loss: float, tps: float, tflops: float, mfu: float, mem: float, nonfinite: int, rank_tag: bool
) -> None:
    line = format_metric_line(
        step=step,
        loss=loss,
        tokens_per_second_per_gpu=tps,
        tflops_per_gpu=tflops,
        mfu=mfu,
        peak_memory_gib=mem,
        nonfinite_steps=nonfinite,
    )
    if rank_tag:  # torchrun's per-rank prefix: SageMaker and our parser must agree on it
        line = "[rank0]:" + line
    training = [d for d, m in zip(METRIC_DEFINITIONS, METRICS, strict=True) if m in TRAINING_METRICS]
    for definition, metric in zip(training, TRAINING_METRICS, strict=True):
        match = re.search(definition["Regex"], line)
        assert match is not None, definition
        printed = metric.fmt.format(
            {
                "step": step,
                "loss": loss,
                "tokens_per_second_per_gpu": tps,
                "tflops_per_gpu": tflops,
                "mfu": mfu,
                "peak_memory_gib": mem,
                "nonfinite_steps": nonfinite,
            }[metric.key]
        )
        assert float(match.group(1)) == float(printed)
    parsed = parse_metric_line(line)
    assert parsed is not None and parsed["step"] == step


@given(st.floats(0, 10**5), st.booleans())
def test_preflight_line_parses(busbw: float, rank_tag: bool) -> None:
    line = ("[rank0]:" if rank_tag else "") + format_preflight_line(allreduce_busbw_gbps=busbw)
    parsed = parse_metric_line(line)
    assert parsed is not None and parsed == {"allreduce_busbw_gbps": float(f"{busbw:.1f}")}


@given(st.floats(-20, 20, allow_nan=False), st.floats(-20, 20, allow_nan=False), st.booleans())
def test_loss_drop_line_parses_with_its_sign(first: float, last: float, rank_tag: bool) -> None:
    """A loss that rose prints a negative drop: SageMaker's regex and our parser read the sign (the gate needs it)."""
    line = ("[rank0]:" if rank_tag else "") + format_loss_drop_line(first_loss=first, last_loss=last)
    printed = float(f"{first - last:.6f}")
    assert parse_metric_line(line) == {"loss_drop": printed}
    definition = next(d for d, m in zip(METRIC_DEFINITIONS, METRICS, strict=True) if m.key == "loss_drop")
    match = re.search(definition["Regex"], line)
    assert match is not None and float(match.group(1)) == printed
    assert all(re.search(d["Regex"], line) is None for d, m in zip(METRIC_DEFINITIONS, METRICS, strict=True)
               if m.key != "loss_drop")


@given(st.integers(0, 4), st.booleans())
def test_knob_rung_line_parses(rung: int, rank_tag: bool) -> None:
    line = ("[rank0]:" if rank_tag else "") + format_knob_rung_line(rung=rung)
    assert parse_metric_line(line) == {"knob_rung": rung}


def test_regexes_ignore_other_log_lines() -> None:
    noise = "NCCL INFO loss=1.0 tokens_per_second_per_gpu=5"
    assert all(re.search(d["Regex"], noise) is None for d in METRIC_DEFINITIONS)
    assert parse_metric_line(noise) is None


def test_metric_definitions_fit_sagemaker_limits() -> None:
    names = [d["Name"] for d in METRIC_DEFINITIONS]
    assert len(names) == len(set(names)) <= 40
    assert all(1 <= len(d["Name"]) <= 255 and 1 <= len(d["Regex"]) <= 500 for d in METRIC_DEFINITIONS)


def test_sagemaker_regexes_and_our_parser_agree_on_every_line() -> None:
    lines = [
        "btk_metric step=3 loss=2.5",
        "[rank0]:btk_metric step=3 loss=2.5",
        "[default1]:btk_metric step=3 loss=2.5",
        "x btk_metric step=3 loss=2.5",
        "btk_metric step=3 loss=nan",
        "btk_metric step=3 loss=2.5abc",
        "btk_metricstep=3",
    ]
    for line in lines:
        ours = parse_metric_line(line) or {}
        theirs = {
            metric.key: float(match.group(1))
            for metric, definition in zip(METRICS, METRIC_DEFINITIONS, strict=True)
            if (match := re.search(definition["Regex"], line))
        }
        assert ours == theirs, line


def test_regexes_cannot_backtrack_over_the_line() -> None:
    # SageMaker runs these regexes on every log line: an unanchored ".*" made them quadratic
    # (a 44 kB line of repeated prefixes took seconds). Anchored, with only bounded tokens
    # before the field, each regex has one start position and no ambiguous repetition.
    for definition in METRIC_DEFINITIONS:
        regex = definition["Regex"]
        assert regex.startswith("^"), regex
        assert ".*" not in regex and ".+" not in regex, regex
    hostile = ["btk_metric " * 4000, "x=btk_metric " * 4000, "[rank0]:" * 5000 + "btk_metric step=1"]
    for line in hostile:
        assert all(re.search(d["Regex"], line) is None for d in METRIC_DEFINITIONS[1:])
