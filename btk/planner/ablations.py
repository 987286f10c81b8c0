"""The published ablations of the calibration set: a low-precision or ``torch.compile`` gain as each source
measured it, beside the gain the throughput model predicts.

An ablation is two runs of one source on the same model, system, node count and knobs that differ in one of
:data:`ABLATED_KNOBS` only: precision against bf16 (tensorwise or rowwise float8, MXFP8) or compile against
eager. Its gain is the variant's tokens/s over the baseline's. The model's gain is shown twice: by the fit to
every run, and by the fit that never saw the source (leave-source-out, ``calibration.leave_source_out``): the
second is the test of the model's shape-dependent float8 and compile terms (``throughput``: float8 GEMMs need
larger outputs to reach the calibrated rate, casts cost by ``in + out`` per token against the GEMM's ``in x out``;
eager adds element-wise traffic).
``benchmarks/calibrate.py`` prints the table and ``docs/calibration.md`` holds it (tested).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from btk.planner.calibration import PointResult, source_of

ABLATED_KNOBS = ("precision", "compile")
"""The knobs whose published gain is set beside the model's: what differs between an ablation's two runs."""

BASELINES = {"precision": "bf16", "compile": False}
"""The value each ablated knob is measured against."""


@dataclass(frozen=True)
class Ablation:
    """Two runs of one source differing in one knob: its baseline value (``baseline``) and another (``variant``)."""

    knob: str
    baseline: PointResult
    variant: PointResult

    @property
    def label(self) -> str:
        value = getattr(self.variant.point.knobs, self.knob)
        return f"{self.knob} {'on' if value is True else value}"

    @property
    def published(self) -> float:
        return self.variant.point.tokens_per_second_per_gpu / self.baseline.point.tokens_per_second_per_gpu

    @property
    def fitted(self) -> float:
        return self.variant.fitted_tokens / self.baseline.fitted_tokens

    @property
    def left_out(self) -> float:
        return self.variant.left_out_tokens / self.baseline.left_out_tokens


def _setup(result: PointResult) -> tuple[object, ...]:
    """Everything of a run but the ablated knobs: runs with the same setup differ in those only."""
    point = result.point
    knobs = point.knobs.model_dump(exclude=set(ABLATED_KNOBS))
    return (source_of(point), point.model, point.system.name, point.nodes, point.engine, point.power_limited,
            tuple(sorted(knobs.items())))


def ablations(results: Sequence[PointResult]) -> list[Ablation]:
    """Every published ablation: per setup, each run whose one ablated knob is off its baseline against the run
    of the setup at the baseline and otherwise the same knobs."""
    found: list[Ablation] = []
    by_setup: dict[tuple[object, ...], list[PointResult]] = {}
    for result in results:
        by_setup.setdefault(_setup(result), []).append(result)
    for runs in by_setup.values():
        for knob, baseline_value in BASELINES.items():
            others = [name for name in ABLATED_KNOBS if name != knob]
            for variant in runs:
                if getattr(variant.point.knobs, knob) == baseline_value:
                    continue
                found.extend(Ablation(knob, baseline, variant) for baseline in runs
                             if getattr(baseline.point.knobs, knob) == baseline_value
                             and all(getattr(baseline.point.knobs, name) == getattr(variant.point.knobs, name)
                                     for name in others))
    return found


def ablation_table(found: Sequence[Ablation]) -> list[str]:
    """Markdown: each ablation's published gain beside the model's (full fit, and without its source)."""
    lines = ["| ablation | baseline run | published gain | model, full fit | model, source left out |",
             "|---|---|---|---|---|"]
    for item in sorted(found, key=lambda a: (a.knob, a.variant.point.id)):
        lines.append(f"| {item.label} ({item.variant.point.id}) | {item.baseline.point.id} | "
                     f"{item.published:.2f}x | {item.fitted:.2f}x | {item.left_out:.2f}x |")
    for knob in ABLATED_KNOBS:
        misses = [abs(a.left_out / a.published - 1) for a in found if a.knob == knob]
        if misses:
            lines.append(f"| {knob}: median miss of the gain, source left out | | | | "
                         f"{statistics.median(misses):.1%} ({len(misses)} ablations) |")
    return lines
