"""The error band a prediction carries: an interval meant to hold the measured tokens/s of
:data:`TARGET_COVERAGE` of runs like the question, built from how far the calibration's
leave-source-out predictions missed the published runs, and whether the question lies inside
the published evidence at all.

A regime is a GPU family, a model size (under 5B, 5-20B, 20B and over), a sequence length (up
to 8k, over 8k) and a node count (one, several). Each published run is predicted by a fit that
never saw its source (``calibration.leave_source_out``); its absolute relative error is its
*residual*. The band is a **locally weighted conformal band** (Lei, G'Sell, Rinaldo, Tibshirani
and Wasserman, "Distribution-free predictive inference for regression", JASA 2018, section 5.2):

* the *error of a regime* is the weighted mean absolute residual of the runs (the paper's mean
  absolute deviation), a run weighing 1 when it is of the regime itself, ``neighbour_weight **
  level`` when it first shares a coarser regime of the same GPU family (level 1: any node count,
  2: any sequence length, 3: the family) and ``other_family_weight`` when it is of another family
  (:func:`regime_error`);
* each run's *score* is its residual over the error of its regime estimated from the other
  sources' runs (its own source left out, so that a source cannot vouch for itself);
* the band of a question is the split-conformal quantile of the scores (the ceil((n + 1) x
  target)-th smallest of n) times the error of the question's regime.

Where the scores are exchangeable (the method's assumption: a run's miss, measured in its
regime's error, says nothing about which regime it came from), the band covers a new run with at
least the target probability, and its width follows the regime's error: narrow where the model
predicts the regime's runs well, wide where it does not. A regime with few runs has its error
shrunk towards its neighbours'; a regime with none borrows it from them entirely, and the output
says how many runs are its own and how many runs' worth of weight the others add. Runs on
power-limited GPUs are not residuals (:func:`residuals_of`). The two weights are those of
:data:`NEIGHBOUR_WEIGHTS` x :data:`OTHER_FAMILY_WEIGHTS` of the narrowest bands that, rebuilt
without each source in turn, hold the target on that source's runs, overall and, within
:data:`REGIME_TOLERANCE`, in every regime of :data:`REPORTED_REGIME_RUNS` or more runs
(:func:`band_calibration`, :func:`narrowest_holding_target`; ``docs/calibration.md`` prints that check
per regime, and ``benchmarks/band_methods.py`` the same check with the choice of the weights left to the
other sources too).

A question outside the evidence gets no band: a GPU family without a published run, or a
model size, sequence length or node count beyond the published runs' range (all families
together: the terms those describe are fitted across families). The output then says
"outside the published evidence" and by how far.

``benchmarks/calibrate.py --write`` stores the residuals, the chosen weights and the bands per
regime in ``calibration_band.json``; ``tests/planner/test_calibration.py`` checks the stored
file against a fresh fit, and ``docs/calibration.md``'s tables against it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from btk.hardware import InstanceType

if TYPE_CHECKING:
    from btk.planner.calibration import CalibrationPoint, PointResult

BAND_FILE = Path(__file__).with_name("calibration_band.json")
SIZE_BINS = ((5e9, "under 5B"), (20e9, "5-20B"), (math.inf, "20B and over"))
"""Upper bounds (exclusive) of the model-size bins, in parameters."""
SEQUENCE_BINS = ((8192, "seq up to 8k"), (math.inf, "seq over 8k"))
"""Upper bounds (inclusive) of the sequence-length bins, in tokens."""
NODE_BINS = ((1, "1 node"), (math.inf, "2+ nodes"))
ANY = "any"
TARGET_COVERAGE = 0.80
"""The share of runs like the question the band is built to hold."""
NEIGHBOUR_WEIGHTS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
"""The per-level weights of the same family's coarser regimes chosen from (1.0: the whole family alike)."""
OTHER_FAMILY_WEIGHTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
"""The weights of another GPU family's runs chosen from."""
REPORTED_REGIME_RUNS = 5
"""Regimes with at least this many runs get their own row in the band's calibration table."""
REGIME_TOLERANCE = 0.05
"""How far under the target such a regime may cover, on runs its bands never saw, for the weights to hold it."""
METHOD = ("locally weighted conformal band of leave-source-out errors at 80 % coverage: the regime's mean error, "
          "neighbouring regimes weighted in, times the quantile of every run's error over its regime's "
          "(docs/calibration.md)")


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

    def holds(self, other: Regime) -> bool:
        """Whether ``other`` (a run's regime) lies inside this one."""
        return all(mine in (ANY, theirs) for mine, theirs in zip(
            (self.family, self.size, self.sequence, self.nodes),
            (other.family, other.size, other.sequence, other.nodes), strict=True))

    @classmethod
    def from_key(cls, key: str) -> Regime:
        family, size, sequence, nodes = key.split(" / ")
        return cls(family, size, sequence, nodes)


def regime_of(family: str, parameters: float, seq_len: int, nodes: int) -> Regime:
    return Regime(
        family,
        _bin(parameters, SIZE_BINS, inclusive=False),
        _bin(seq_len, SEQUENCE_BINS, inclusive=True),
        _bin(nodes, NODE_BINS, inclusive=True),
    )


def _point_regime(point: CalibrationPoint) -> Regime:
    return regime_of(point.family, point.parameters, point.knobs.seq_len, point.nodes)


@dataclass(frozen=True)
class Residual:
    """One published run's leave-source-out error, with its regime and source."""

    id: str
    source: str
    regime: Regime
    error: float  # predicted / published - 1, by a fit without the run's source

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "regime": self.regime.key, "error": round(self.error, 5)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Residual:
        return cls(data["id"], data["source"], Regime.from_key(data["regime"]), float(data["error"]))


@cache
def distance(question: Regime, run: Regime) -> int:
    """How far a run's regime is from the question's: 0 the same, 1-3 the first coarser regime holding both, 4 none."""
    return next((level for level, wider in enumerate(question.widening()) if wider.holds(run)), 4)


@dataclass(frozen=True)
class Weights:
    """How much a run of another regime counts towards a question's regime error (its own regime's runs count 1)."""

    neighbour: float  # per level of the same family's coarser regimes
    other_family: float

    def of(self, question: Regime, run: Regime) -> float:
        level = distance(question, run)
        return self.neighbour ** level if level < 4 else self.other_family


Statistic = Callable[[Sequence[tuple[float, float]]], float]
"""A regime's error from (absolute residual, weight) pairs whose weights sum above zero."""


def weighted_mean(pairs: Sequence[tuple[float, float]]) -> float:
    """The weighted mean absolute residual: the regime error of the planner's band (Lei et al.'s mean absolute
    deviation)."""
    return sum(error * weight for error, weight in pairs) / sum(weight for _, weight in pairs)


ERROR_FLOOR = 0.005
"""The least regime error (0.5 %): a regime whose runs were all predicted exactly still gets a band."""


def regime_error(question: Regime, runs: Sequence[Residual], weights: Weights,
                 statistic: Statistic = weighted_mean) -> float | None:
    """The error of runs like ``question``: ``statistic`` of the absolute residuals of ``runs``, each weighing
    ``weights.of(question, its regime)``, never below :data:`ERROR_FLOOR`; None where no run weighs anything."""
    weight_of: dict[Regime, float] = {}  # runs share a few regimes: each regime's weight is worked out once
    pairs = []
    for run in runs:
        if (weight := weight_of.get(run.regime)) is None:
            weight = weight_of[run.regime] = weights.of(question, run.regime)
        if weight > 0:
            pairs.append((abs(run.error), weight))
    return max(statistic(pairs), ERROR_FLOOR) if pairs else None


def split_conformal_quantile(scores: Sequence[float], target: float = TARGET_COVERAGE) -> float | None:
    """The ceil((n + 1) x ``target``)-th smallest of n scores (Vovk; Lei et al. 2018); None where that exceeds n
    (fewer than 4 scores cannot make an 80 % band)."""
    rank = math.ceil((len(scores) + 1) * target - 1e-9)
    return sorted(scores)[rank - 1] if rank <= len(scores) else None


def score_quantile(residuals: Sequence[Residual], weights: Weights, target: float = TARGET_COVERAGE,
                   statistic: Statistic = weighted_mean) -> float | None:
    """The split-conformal quantile of the runs' scores: each run's residual over the error of its regime estimated
    from the runs of the *other* sources (a run whose regime no other source's run weighs on has no score)."""
    errors: dict[tuple[Regime, str], float | None] = {}
    scores = []
    for run in residuals:
        key = (run.regime, run.source)
        if key not in errors:
            errors[key] = regime_error(run.regime, [other for other in residuals if other.source != run.source],
                                       weights, statistic)
        if (error := errors[key]) is not None:
            scores.append(abs(run.error) / error)
    return split_conformal_quantile(scores, target)


@dataclass(frozen=True)
class ConformalBand:
    """The band of one regime: the half-width (None without a regime error or enough scores) and its evidence."""

    half_width: float | None
    own_runs: tuple[str, ...]
    """The runs of the question's own regime."""
    borrowed: float
    """How many runs' worth of weight the other regimes add to the regime's error."""
    error: float | None
    """The error of the question's regime (:func:`regime_error`)."""
    quantile: float | None
    """The split-conformal quantile of the scores (:func:`score_quantile`): the band over the regime's error."""


def _band(question: Regime, residuals: Sequence[Residual], weights: Weights, quantile: float | None,
          statistic: Statistic) -> ConformalBand:
    own = tuple(run.id for run in residuals if distance(question, run.regime) == 0)
    borrowed = sum(weights.of(question, run.regime) for run in residuals) - len(own)
    error = regime_error(question, residuals, weights, statistic)
    half_width = None if error is None or quantile is None else quantile * error
    return ConformalBand(half_width, own, borrowed, error, quantile)


def conformal_band(question: Regime, residuals: Sequence[Residual], weights: Weights,
                   target: float = TARGET_COVERAGE, statistic: Statistic = weighted_mean) -> ConformalBand:
    """The locally weighted conformal band of ``question`` from ``residuals`` (see the module docstring)."""
    return _band(question, residuals, weights, score_quantile(residuals, weights, target, statistic), statistic)


def band_calibration(residuals: Sequence[Residual], weights: Weights, target: float = TARGET_COVERAGE,
                     statistic: Statistic = weighted_mean) -> list[tuple[Residual, float | None]]:
    """Each run against the band built for its regime *without its source* (:func:`conformal_band` of the other
    sources' runs): (the run, that band or None)."""
    without: dict[str, tuple[list[Residual], float | None]] = {}
    for source in dict.fromkeys(run.source for run in residuals):
        others = [run for run in residuals if run.source != source]
        without[source] = others, score_quantile(others, weights, target, statistic)
    checked = []
    for run in residuals:
        others, quantile = without[run.source]
        checked.append((run, _band(run.regime, others, weights, quantile, statistic).half_width))
    return checked


def coverage_gaps(checked: Sequence[tuple[Residual, float | None]], target: float = TARGET_COVERAGE) -> tuple[
        float, dict[str, float]]:
    """The coverage of ``checked`` (:func:`band_calibration`) overall and per regime with at least
    :data:`REPORTED_REGIME_RUNS` runs."""
    groups: dict[str, list[bool]] = {}
    for run, band in checked:
        groups.setdefault(run.regime.key, []).append(band is not None and abs(run.error) <= band)
    overall = sum(sum(inside) for inside in groups.values()) / len(checked)
    return overall, {key: sum(inside) / len(inside) for key, inside in sorted(groups.items())
                     if len(inside) >= REPORTED_REGIME_RUNS}


def median_band(checked: Sequence[tuple[Residual, float | None]]) -> float:
    """The median band of a leave-source-out check, a run without a band counting as infinitely wide."""
    return statistics.median(math.inf if band is None else band for _, band in checked)


Choice = TypeVar("Choice")
"""What a rule chooses between: the weights of the grid (or another method's setting), each with its check."""


def weights_closest_to_target(checks: Mapping[Choice, Sequence[tuple[Residual, float | None]]],
                              target: float = TARGET_COVERAGE) -> Choice:
    """Of weights and their leave-source-out checks (:func:`band_calibration`), those covering closest to
    ``target``: the least overall gap plus mean gap of the reported regimes; ties go to the narrower median band,
    then to the earlier weights."""
    def score(weights: Choice) -> tuple[float, float]:
        checked = checks[weights]
        overall, regimes = coverage_gaps(checked, target)
        gap = abs(overall - target) + (statistics.mean(abs(c - target) for c in regimes.values()) if regimes else 0)
        return round(gap, 9), median_band(checked)

    return min(checks, key=score)


def holds_target(checked: Sequence[tuple[Residual, float | None]], target: float = TARGET_COVERAGE) -> bool:
    """Whether a leave-source-out check holds ``target``: at least that share of all its runs inside their bands,
    and no regime of :data:`REPORTED_REGIME_RUNS` or more runs more than :data:`REGIME_TOLERANCE` under it."""
    overall, regimes = coverage_gaps(checked, target)
    return overall >= target - 1e-9 and all(coverage >= target - REGIME_TOLERANCE - 1e-9
                                            for coverage in regimes.values())


def narrowest_holding_target(checks: Mapping[Choice, Sequence[tuple[Residual, float | None]]],
                             target: float = TARGET_COVERAGE) -> Choice:
    """Of weights and their leave-source-out checks (:func:`band_calibration`), those of the narrowest median band
    among the weights that hold ``target`` (:func:`holds_target`), ties to the earlier weights; where none holds
    it, those closest to it (:func:`weights_closest_to_target`)."""
    holding = {weights: checked for weights, checked in checks.items() if holds_target(checked, target)}
    if not holding:
        return weights_closest_to_target(checks, target)
    return min(holding, key=lambda weights: median_band(holding[weights]))


WEIGHT_GRID = tuple(Weights(n, o) for n in NEIGHBOUR_WEIGHTS for o in OTHER_FAMILY_WEIGHTS)
"""The weights chosen from."""


def choose_weights(residuals: Sequence[Residual], target: float = TARGET_COVERAGE) -> Weights:
    """The weights of :data:`WEIGHT_GRID` of the narrowest leave-source-out bands that hold ``target``
    (:func:`narrowest_holding_target`)."""
    return narrowest_holding_target({weights: band_calibration(residuals, weights, target)
                                      for weights in WEIGHT_GRID}, target)


def residuals_of(points: Sequence[CalibrationPoint], left_out: Mapping[str, float]) -> list[Residual]:
    """The residual of every published run a question can be like: runs on power-limited GPUs are left out.

    Every instance type the planner answers for runs its GPUs at full power. The power-limit factor
    (``calibration.power_limit``) is pinned by those runs' source alone, so a fit without that source cannot
    know it and misses them by the factor (+69 % to +98 % on torchao's B200s): their leave-source-out error
    measures the factor's absence, not the error of any question asked. They stay in the fit.
    """
    from btk.planner.calibration import source_of

    return [Residual(point.id, source_of(point), _point_regime(point), left_out[point.id]) for point in points
            if not point.power_limited]


def band_summary(points: Sequence[CalibrationPoint], left_out: Mapping[str, float],
                 memory: Sequence[PointResult]) -> dict[str, Any]:
    """What ``calibration_band.json`` stores: every run's residual, the chosen weights and the scores' quantile, the
    band of every regime a run lies in with its error; per family the worst memory error; the evidence's range."""
    residuals = residuals_of(points, left_out)
    weights = choose_weights(residuals)
    quantile = score_quantile(residuals, weights)
    regimes: dict[str, dict[str, Any]] = {}
    for key in sorted({r.regime.key for r in residuals}):
        band = conformal_band(Regime.from_key(key), residuals, weights)
        regimes[key] = {"tokens_per_second": None if band.half_width is None else round(band.half_width, 3),
                        "error": None if band.error is None else round(band.error, 4),
                        "points": len(band.own_runs), "borrowed": round(band.borrowed, 2),
                        "evidence": list(band.own_runs)}
    memories: dict[str, dict[str, Any]] = {}
    for result in memory:
        if result.memory_error is None:
            continue
        entry = memories.setdefault(result.point.family, {"memory": 0.0, "points": 0})
        entry["memory"] = round(max(entry["memory"], abs(result.memory_error)), 3)
        entry["points"] += 1
    return {
        "target_coverage": TARGET_COVERAGE,
        "neighbour_weight": weights.neighbour,
        "other_family_weight": weights.other_family,
        "score_quantile": None if quantile is None else round(quantile, 4),
        "residuals": [r.as_json() for r in residuals],
        "regimes": regimes,
        "memory": dict(sorted(memories.items())),
        "envelope": {
            "families": sorted({point.family for point in points}),
            "parameters": [min(p.parameters for p in points), max(p.parameters for p in points)],
            "seq_len": [min(p.knobs.seq_len for p in points), max(p.knobs.seq_len for p in points)],
            "nodes": [min(p.nodes for p in points), max(p.nodes for p in points)],
        },
    }


def stored_weights(summary: Mapping[str, Any]) -> Weights:
    return Weights(float(summary["neighbour_weight"]), float(summary["other_family_weight"]))


def regime_table(summary: Mapping[str, Any]) -> list[str]:
    """The Markdown table of bands per regime (``benchmarks/calibrate.py`` prints it, ``docs/calibration.md`` too)."""
    lines = ["| regime (GPU family / size / sequence / nodes) | own runs | other regimes' weight (runs) "
             "| regime's mean error | tokens/s band |", "|---|---|---|---|---|"]
    for key, entry in summary["regimes"].items():
        band = "none: too few runs" if entry["tokens_per_second"] is None else f"±{entry['tokens_per_second']:.1%}"
        error = "-" if entry["error"] is None else f"{entry['error']:.1%}"
        lines.append(f"| {key} | {entry['points']} | {entry['borrowed']:.1f} | {error} | {band} |")
    return lines


def binomial_chance(inside: int, runs: int, target: float = TARGET_COVERAGE) -> float:
    """The chance that exactly ``inside`` of ``runs`` independent runs fall inside a band that holds each with
    probability ``target`` (the binomial distribution)."""
    return math.comb(runs, inside) * target ** inside * (1 - target) ** (runs - inside)


def binomial_p_value(inside: int, runs: int, target: float = TARGET_COVERAGE) -> float:
    """The exact two-sided binomial test of ``inside`` of ``runs`` against ``target``: the chance, for a band that
    holds exactly ``target`` of runs like these (each independently), of a count no likelier than the one seen.
    Under 0.05 the count is evidence that the band's coverage is not ``target``."""
    seen = binomial_chance(inside, runs, target)
    return min(1.0, sum(chance for count in range(runs + 1)
                        if (chance := binomial_chance(count, runs, target)) <= seen * (1 + 1e-9)))


def calibration_table(summary: Mapping[str, Any]) -> list[str]:
    """How the bands, rebuilt without each source in turn, cover that source's runs: per regime with at least
    :data:`REPORTED_REGIME_RUNS` runs and overall, with the exact binomial test of the count against the target
    (:func:`binomial_p_value`), the median band and the median error (Markdown)."""
    residuals = [Residual.from_json(entry) for entry in summary["residuals"]]
    checked = band_calibration(residuals, stored_weights(summary), summary["target_coverage"])
    groups: dict[str, list[tuple[Residual, float | None]]] = {}
    for run, band in checked:
        groups.setdefault(run.regime.key, []).append((run, band))

    def row(name: str, runs: list[tuple[Residual, float | None]]) -> str:
        inside = sum(band is not None and abs(run.error) <= band for run, band in runs)
        median = median_band(runs)
        width = "none (too few runs)" if math.isinf(median) else f"±{median:.1%}"
        error = statistics.median(abs(run.error) for run, _ in runs)
        p_value = binomial_p_value(inside, len(runs), summary["target_coverage"])
        return (f"| {name} | {len(runs)} | {inside} | {inside / len(runs):.0%} | {p_value:.2f} | {width} | "
                f"{error:.1%} |")

    lines = ["| regime | runs | inside the band | coverage | p (binomial) | median band | median error |",
             "|---|---|---|---|---|---|---|"]
    lines.extend(row(key, runs) for key, runs in sorted(groups.items()) if len(runs) >= REPORTED_REGIME_RUNS)
    lines.append(row(f"all {len(checked)} runs", checked))
    return lines


@dataclass(frozen=True)
class ErrorBand:
    """The band of one question (GPU family, model size, sequence length, nodes), or why it has none."""

    family: str
    regime: str | None
    """The question's regime; None outside the evidence."""
    tokens_per_second: float | None
    memory: float | None
    points: int
    """The published runs of the question's own regime."""
    memory_points: int
    evidence: tuple[str, ...]
    outside: tuple[str, ...] = ()
    """How the question lies outside the published evidence, one phrase per way (empty inside)."""
    borrowed: float = 0.0
    """How many runs' worth of weight the other regimes add to the error of the question's regime."""
    regime_error: float | None = None
    """The error of the question's regime, which the band scales (:func:`regime_error`)."""

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
        own = (f"{self.points} published runs of its regime" if self.points
               else "no published run of its own regime")
        lent = f", {self.borrowed:.1f} runs' weight from other regimes" if self.borrowed >= 0.05 else ""
        scaled = "" if self.regime_error is None else f"runs like it miss by {self.regime_error:.1%} on average; "
        return (
            f"tokens/s ±{self.tokens_per_second:.1%} ({TARGET_COVERAGE:.0%} band: {scaled}{own}{lent}; {self.regime})"
            f"{memory}; evidence: docs/calibration.md"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_family": self.family,
            "measured": self.measured,
            "regime": self.regime,
            "tokens_per_second_relative": self.tokens_per_second if self.measured else None,
            "target_coverage": TARGET_COVERAGE,
            "memory_relative": self.memory,
            "points": self.points,
            "borrowed_weight": round(self.borrowed, 2),
            "regime_error": self.regime_error,
            "memory_points": self.memory_points,
            "outside_evidence": list(self.outside),
            "method": METHOD,
            "evidence": list(self.evidence),
        }


@cache
def stored_summary() -> dict[str, Any]:
    """What ``calibration_band.json`` holds (:func:`band_summary` wrote it)."""
    data: dict[str, Any] = json.loads(BAND_FILE.read_text())
    return data


@cache
def stored_residuals() -> tuple[Residual, ...]:
    """The stored leave-source-out residual of every published run."""
    return tuple(Residual.from_json(entry) for entry in stored_summary()["residuals"])


@cache
def stored_quantile() -> float | None:
    """The scores' quantile of the stored residuals and weights (the same for every question)."""
    summary = stored_summary()
    return score_quantile(stored_residuals(), stored_weights(summary), summary["target_coverage"])


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
    envelope = (stored or stored_summary())["envelope"]
    ways = [
        None if family in envelope["families"] else f"no published run on {family} GPUs is fitted",
        _beyond("model size", parameters, envelope["parameters"], lambda value: f"{value / 1e9:.2f}B"),
        _beyond("seq_len", seq_len, envelope["seq_len"], lambda value: f"{value:,.0f}"),
        _beyond("node count", nodes, envelope["nodes"], lambda value: f"{value:,.0f}"),
    ]
    return tuple(way for way in ways if way is not None)


def band_for_question(family: str, parameters: float, seq_len: int, nodes: int,
                      stored: Mapping[str, Any] | None = None) -> ErrorBand:
    """The band of a question from the stored residuals and neighbour weight (:func:`band_summary`)."""
    data = stored or stored_summary()
    memory = data["memory"].get(family, {})
    memory_band, memory_points = memory.get("memory"), memory.get("points", 0)
    outside = outside_evidence(family, parameters, seq_len, nodes, data)
    if outside:
        return ErrorBand(family, None, None, memory_band, 0, memory_points, (), outside)
    regime = regime_of(family, parameters, seq_len, nodes)
    residuals = stored_residuals() if stored is None else tuple(Residual.from_json(r) for r in data["residuals"])
    weights = stored_weights(data)
    quantile = stored_quantile() if stored is None else score_quantile(residuals, weights, data["target_coverage"])
    band = _band(regime, residuals, weights, quantile, weighted_mean)
    if band.half_width is None or band.error is None:
        reason = (f"too few published runs near {regime.key} for a {data['target_coverage']:.0%} band "
                  f"({len(band.own_runs)} of its own, {band.borrowed:.1f} runs' weight from other regimes)")
        return ErrorBand(family, None, None, memory_band, 0, memory_points, (), (reason,))
    return ErrorBand(family, regime.key, round(band.half_width, 3), memory_band, len(band.own_runs), memory_points,
                     band.own_runs, borrowed=band.borrowed, regime_error=round(band.error, 4))


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
    return band_for_question(instance.gpu.family, parameters, seq_len, nodes)
