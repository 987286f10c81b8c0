"""The metrics module: the regexes SageMaker uses parse the lines the trainer prints."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from btk.metrics import METRIC_DEFINITIONS, METRICS, format_metric_line, parse_metric_line

finite = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(st.integers(0, 10**9), finite, finite, finite, st.floats(0, 1), finite)
def test_every_regex_parses_the_printed_value(
    step: int, loss: float, tps: float, tflops: float, mfu: float, mem: float
) -> None:
    line = format_metric_line(
        step=step, loss=loss, tokens_per_second_per_gpu=tps, tflops_per_gpu=tflops, mfu=mfu, peak_memory_gib=mem
    )
    for definition, metric in zip(METRIC_DEFINITIONS, METRICS, strict=True):
        match = re.search(definition["Regex"], line)
        assert match is not None, definition
        printed = metric.fmt.format(
            step
            if metric.key == "step"
            else {
                "loss": loss,
                "tokens_per_second_per_gpu": tps,
                "tflops_per_gpu": tflops,
                "mfu": mfu,
                "peak_memory_gib": mem,
            }[metric.key]
        )
        assert float(match.group(1)) == float(printed)
    parsed = parse_metric_line(line)
    assert parsed is not None and parsed["step"] == step


def test_regexes_ignore_other_log_lines() -> None:
    noise = "NCCL INFO loss=1.0 tokens_per_second_per_gpu=5"
    assert all(re.search(d["Regex"], noise) is None for d in METRIC_DEFINITIONS)
    assert parse_metric_line(noise) is None


def test_metric_definitions_fit_sagemaker_limits() -> None:
    names = [d["Name"] for d in METRIC_DEFINITIONS]
    assert len(names) == len(set(names)) <= 40
    assert all(1 <= len(d["Name"]) <= 255 and 1 <= len(d["Regex"]) <= 500 for d in METRIC_DEFINITIONS)
