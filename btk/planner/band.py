"""The error band a prediction carries: how far the calibration's leave-source-out predictions
missed the published runs in the *regime* of the question, and whether the question lies
inside the published evidence at all.

A regime is a GPU family, a model size (under 5B, 5-20B, 20B and over), a sequence length (up
to 8k, over 8k) and a node count (one, several). Each published run is predicted by a fit
that never saw its source (``calibration.leave_source_out``); a regime's band is the worst
of those errors among its runs. Where the question's own regime holds fewer than
:data:`MIN_POINTS` runs, the band is that of the nearest coarser regime that holds enough
(any node count, then any sequence length, then the whole GPU family), and the output names
the regime it used.

A question outside the evidence gets no band: a GPU family without a published run, or a
model size, sequence length or node count beyond the published runs' range (all families
together: the terms those describe are fitted across families). The output then says
"outside the published evidence" and by how far.

``benchmarks/calibrate.py --write`` computes the bands from ``calibration_points.json`` and
stores them in ``calibration_band.json``; ``tests/planner/test_calibration.py`` checks the
stored bands against a fresh fit, and ``docs/calibration.md``'s table against the stored bands.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from btk.hardware import InstanceType

if TYPE_CHECKING:
    from btk.planner.calibration import CalibrationPoint, PointResult

BAND_FILE = Path(__file__).with_name("calibration_band.json")
SIZE_BINS = ((5e9, "under 5B"), (20e9, "5-20B"), (math.inf, "20B and over"))
"""Upper bounds (exclusive) of the model-size bins, in parameters."""
SEQUENCE_BINS = ((8192, "seq up to 8k"), (math.inf, "seq over 8k"))
"""Upper bounds (inclusive) of the sequence-length bins, in tokens."""
NODE_BINS = ((1, "1 node"), (math.inf, "2+ nodes"))
MIN_POINTS = 3
"""Fewer runs than this in a regime do not make a band: the next coarser regime's is used."""
ANY = "any"
METHOD = "worst leave-source-out error of the published runs in the regime (docs/calibration.md)"


def _bin(value: float, bins: Sequence[tuple[float, str]], inclusive: bool) -> str:
    return next(label for bound, label in bins if (value <= bound if inclusive else value < bound))


@dataclass(frozen=True)
class Regime:
    """A class of questions: GPU family, model size, sequence length and node count (``any`` where left open)."""

    family: str
    size: str = ANY
    sequence: str = ANY
    nodes: str = ANY

    @property
    def key(self) -> str:
        return " / ".join((self.family, self.size, self.sequence, self.nodes))

    def widening(self) -> list[Regime]:
        """This regime, then coarser ones: any node count, then any sequence length, then the whole family."""
        return [
            self,
            Regime(self.family, self.size, self.sequence),
            Regime(self.family, self.size),
            Regime(self.family),
        ]


def regime_of(family: str, parameters: float, seq_len: int, nodes: int) -> Regime:
    return Regime(
        family,
        _bin(parameters, SIZE_BINS, inclusive=False),
        _bin(seq_len, SEQUENCE_BINS, inclusive=True),
        _bin(nodes, NODE_BINS, inclusive=True),
    )


def _point_regime(point: CalibrationPoint) -> Regime:
    return regime_of(point.family, point.parameters, point.knobs.seq_len, point.nodes)


def band_summary(points: Sequence[CalibrationPoint], left_out: Mapping[str, float],
                 memory: Sequence[PointResult]) -> dict[str, Any]:
    """What ``calibration_band.json`` stores: per regime (every level of every run's widening) the worst
    leave-source-out error and its runs; per family the worst memory error; the evidence's range."""
    regimes: dict[str, dict[str, Any]] = {}
    for point in points:
        for regime in _point_regime(point).widening():
            entry = regimes.setdefault(regime.key, {"tokens_per_second": 0.0, "points": 0, "evidence": []})
            entry["tokens_per_second"] = round(max(entry["tokens_per_second"], abs(left_out[point.id])), 3)
            entry["points"] += 1
            entry["evidence"].append(point.id)
    memories: dict[str, dict[str, Any]] = {}
    for result in memory:
        if result.memory_error is None:
            continue
        entry = memories.setdefault(result.point.family, {"memory": 0.0, "points": 0})
        entry["memory"] = round(max(entry["memory"], abs(result.memory_error)), 3)
        entry["points"] += 1
    return {
        "regimes": dict(sorted(regimes.items())),
        "memory": dict(sorted(memories.items())),
        "envelope": {
            "families": sorted({point.family for point in points}),
            "parameters": [min(p.parameters for p in points), max(p.parameters for p in points)],
            "seq_len": [min(p.knobs.seq_len for p in points), max(p.knobs.seq_len for p in points)],
            "nodes": [min(p.nodes for p in points), max(p.nodes for p in points)],
        },
    }


def regime_table(summary: Mapping[str, Any]) -> list[str]:
    """The Markdown table of bands per regime (``benchmarks/calibrate.py`` prints it, ``docs/calibration.md`` too)."""
    lines = ["| regime (GPU family / size / sequence / nodes) | runs | tokens/s band |", "|---|---|---|"]
    for key, entry in summary["regimes"].items():
        enough = entry["points"] >= MIN_POINTS
        band = f"±{entry['tokens_per_second']:.1%}" if enough else "too few runs: a coarser regime's"
        lines.append(f"| {key} | {entry['points']} | {band} |")
    return lines


@dataclass(frozen=True)
class ErrorBand:
    """The band of one question (GPU family, model size, sequence length, nodes), or why it has none."""

    family: str
    regime: str | None
    """The regime whose runs made the band (the question's own or a coarser one); None outside the evidence."""
    tokens_per_second: float | None
    memory: float | None
    points: int
    memory_points: int
    evidence: tuple[str, ...]
    outside: tuple[str, ...] = ()
    """How the question lies outside the published evidence, one phrase per way (empty inside)."""

    @property
    def measured(self) -> bool:
        """Whether published runs bound the question (its band is then ``tokens_per_second``)."""
        return not self.outside and self.tokens_per_second is not None

    def describe(self) -> str:
        """One line for the text output."""
        if not self.measured or self.tokens_per_second is None:
            return f"outside the published evidence: {'; '.join(self.outside)}; the speed figures are unverified"
        memory = "; memory unverified"
        if self.memory is not None:
            memory = f"; memory ±{self.memory:.0%} ({self.memory_points} runs)"
        return (
            f"tokens/s ±{self.tokens_per_second:.1%} (leave-source-out, worst of {self.points} published runs: "
            f"{self.regime}){memory}; evidence: docs/calibration.md"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_family": self.family,
            "measured": self.measured,
            "regime": self.regime,
            "tokens_per_second_relative": self.tokens_per_second if self.measured else None,
            "memory_relative": self.memory,
            "points": self.points,
            "memory_points": self.memory_points,
            "outside_evidence": list(self.outside),
            "method": METHOD,
            "evidence": list(self.evidence),
        }


@cache
def _stored() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BAND_FILE.read_text())
    return data


def _beyond(name: str, value: float, bounds: Sequence[float], show: Callable[[float], str]) -> str | None:
    """How far ``value`` lies outside the published ``bounds`` (low, high), or None inside."""
    low, high = bounds
    if value < low:
        return f"{name} {show(value)} is below the smallest published run's {show(low)} ({low / value:.2g}x smaller)"
    if value > high:
        return f"{name} {show(value)} is above the largest published run's {show(high)} ({value / high:.2g}x larger)"
    return None


def outside_evidence(family: str, parameters: float, seq_len: int, nodes: int,
                     stored: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Each way the question lies outside the published runs, with how far (empty when inside)."""
    envelope = (stored or _stored())["envelope"]
    ways = [
        None if family in envelope["families"] else f"no published run on {family} GPUs",
        _beyond("model size", parameters, envelope["parameters"], lambda value: f"{value / 1e9:.2f}B"),
        _beyond("seq_len", seq_len, envelope["seq_len"], lambda value: f"{value:,.0f}"),
        _beyond("node count", nodes, envelope["nodes"], lambda value: f"{value:,.0f}"),
    ]
    return tuple(way for way in ways if way is not None)


def band_for_question(family: str, parameters: float, seq_len: int, nodes: int,
                      stored: Mapping[str, Any] | None = None) -> ErrorBand:
    """The band of a question, from the stored leave-source-out errors (:func:`band_summary`)."""
    data = stored or _stored()
    memory = data["memory"].get(family, {})
    memory_band, memory_points = memory.get("memory"), memory.get("points", 0)
    outside = outside_evidence(family, parameters, seq_len, nodes, data)
    if outside:
        return ErrorBand(family, None, None, memory_band, 0, memory_points, (), outside)
    for regime in regime_of(family, parameters, seq_len, nodes).widening():
        entry = data["regimes"].get(regime.key)
        if entry is not None and entry["points"] >= MIN_POINTS:
            return ErrorBand(family, regime.key, entry["tokens_per_second"], memory_band, entry["points"],
                             memory_points, tuple(entry["evidence"]))
    family_runs = data["regimes"].get(Regime(family).key, {"points": 0})["points"]
    reason = f"only {family_runs} published run(s) on {family} GPUs, fewer than the {MIN_POINTS} a band needs"
    return ErrorBand(family, None, None, memory_band, 0, memory_points, (), (reason,))


OUTSIDE = "outside the published evidence"


def coverage_table(points: Sequence[CalibrationPoint], errors: Sequence[float],
                   stored: Mapping[str, Any] | None = None) -> list[str]:
    """How runs no fit saw fall against the bands the planner prints for them: per regime whose band answered
    (and overall), the runs, how many landed inside it, that share, and the band's median width (a Markdown
    table; ``benchmarks/calibrate.py`` prints it for the held-out runs, ``docs/calibration.md`` too).

    ``errors``: each run's relative error, ``predicted / published - 1``. A run whose question gets no band
    counts under "outside the published evidence" and in no coverage."""
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for point, error in zip(points, errors, strict=True):
        band = band_for_question(point.family, point.parameters, point.knobs.seq_len, point.nodes, stored)
        width = band.tokens_per_second if band.measured else None
        groups.setdefault(band.regime if band.measured and band.regime else OUTSIDE, []).append((error, width))

    def row(name: str, runs: list[tuple[float, float | None]]) -> str:
        banded = [(error, width) for error, width in runs if width is not None]
        if not banded:
            return f"| {name} | {len(runs)} | - | - | - |"
        inside = sum(abs(error) <= width for error, width in banded)
        median = sorted(width for _, width in banded)[(len(banded) - 1) // 2:len(banded) // 2 + 1]
        return (f"| {name} | {len(runs)} | {inside} | {inside / len(banded):.0%} | "
                f"±{sum(median) / len(median):.1%} |")

    lines = ["| band's regime | runs | inside the band | coverage | median band |", "|---|---|---|---|---|"]
    lines.extend(row(name, groups[name]) for name in sorted(groups) if name != OUTSIDE)
    if OUTSIDE in groups:
        lines.append(row(OUTSIDE, groups[OUTSIDE]))
    lines.append(row("all runs with a band", [run for name, runs in groups.items() if name != OUTSIDE
                                              for run in runs]))
    return lines


def band_for(instance: InstanceType, parameters: float, seq_len: int, nodes: int) -> ErrorBand:
    """The band of ``parameters`` at ``seq_len`` on ``nodes`` x ``instance``."""
    return band_for_question(instance.gpu.architecture, parameters, seq_len, nodes)
