"""The planner's error band against alternatives, on the same leave-source-out residuals.

The planner's band (``btk.planner.band``) is *locally weighted* conformal (Lei, G'Sell, Rinaldo, Tibshirani and
Wasserman, "Distribution-free predictive inference for regression", JASA 2018, section 5.2): each residual is divided by
an estimate of its regime's error, the weighted mean absolute residual of the other sources' runs, and the band of a
question is the 80 % quantile of those scores times the error of the question's regime. The alternatives:

* the same band with the regime's error as the weighted median or root-mean-square of the residuals;
* the *pooled* weighted conformal quantile of the residuals themselves (Tibshirani, Barber, Candes and Ramdas,
  "Conformal prediction under covariate shift", NeurIPS 2019; :func:`pooled_band`): runs weighted as the planner
  weighs them, the band the smallest residual below which 80 % of the weight lies, the question weighing 1 at
  infinity; a family whose own runs cannot reach 80 % borrows the other families' at the least weight of the grid
  that does;
* a regression of the regime's error on its description: the logarithm of the absolute residual fitted by ridge least
  squares on the GPU family, the size bin, a long sequence and several nodes (:func:`covariate_scale`; the ridge
  shrinks every term but the intercept, so a regime with few runs stays near one pooled scale), which lets a regime
  borrow what a dimension does to the error from every family that has runs on both sides of it;
* not the regime's error at all but the question's own: the spread of the fits (:func:`fit_spreads`), how far its
  prediction moves between fits that each leave out one more source (a jackknife over sources), with a pooled floor
  beside it (from a grid, chosen as the weights are): wide where one source pins the prediction, narrow where many
  agree.

All are checked the same way: each source is left out in turn, its runs are scored against bands (and scales) built
without it, and the share inside is the coverage. The weights of each weighted method are chosen from the grid by
the planner's own rule (:func:`~btk.planner.band.narrowest_holding_target`: the narrowest median band among the
weights covering at least 80 % overall and 75 % in every regime of at least five runs), and, where they differ, by
coverage alone (closest to the target, overall plus the mean over those regimes) and by width alone (the least ratio
of median band to median error). Choosing on the runs that then check the choice flatters it, so the planner's band
and the root-mean-square variant are also checked *nested* (:func:`nested_calibration`): each source's runs against
bands whose weights, under each rule, were chosen without that source.

Run: ``.venv/bin/python benchmarks/band_methods.py`` (about a minute on one core). It prints, per method, the
coverage overall, its range over the regimes of at least five runs, the median band, the median error, their ratio,
and how closely the bands follow the errors (:func:`scale_tracking`: the rank correlation of each run's band with
its absolute error); ``docs/calibration.md`` quotes the table. Then two bounds on what any band can show on these
runs: the ratio of the narrowest band of one width for every run that holds the target share of them, set after the
fact (:func:`one_width_ratio`), and the chance that a band which holds exactly the target share of runs like each
question lands within five points of it in every regime of at least five runs (:func:`chance_every_regime_within`).
Whether the planner's count in each regime is consistent with the target (the exact binomial test) is a column of
the band's calibration table (``btk.planner.band.calibration_table``, printed by ``benchmarks/calibrate.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from btk.planner.band import (
    ERROR_FLOOR,
    NODE_BINS,
    OTHER_FAMILY_WEIGHTS,
    REPORTED_REGIME_RUNS,
    SEQUENCE_BINS,
    SIZE_BINS,
    TARGET_COVERAGE,
    WEIGHT_GRID,
    Regime,
    Residual,
    Statistic,
    Weights,
    band_calibration,
    binomial_chance,
    conformal_band,
    coverage_gaps,
    median_band,
    narrowest_holding_target,
    split_conformal_quantile,
    stored_residuals,
    stored_summary,
    stored_weights,
    weighted_mean,
    weights_closest_to_target,
)
from btk.planner.calibration import (
    CalibrationPoint,
    current_parameters,
    fit,
    load_points,
    predict_tokens_per_second,
    source_of,
)


def _rms(pairs: Sequence[tuple[float, float]]) -> float:
    return math.sqrt(sum(error * error * weight for error, weight in pairs) / sum(weight for _, weight in pairs))


def _median(pairs: Sequence[tuple[float, float]]) -> float:
    half, reached = sum(weight for _, weight in pairs) / 2, 0.0
    for error, weight in sorted(pairs):
        reached += weight
        if reached >= half:
            return error
    return max(error for error, _ in pairs)


STATISTICS: dict[str, Statistic] = {"mean": weighted_mean, "median": _median, "rms": _rms}
"""The regime errors tried: the planner's weighted mean, and the weighted median and root-mean-square."""


NESTED_STATISTICS = ("mean", "rms")
"""The regime errors whose whole procedure is checked nested: the planner's, and the narrowest alternative."""


def _pooled_quantile(question: Regime, residuals: Sequence[Residual], weights: Weights, target: float) -> float | None:
    weighted = sorted((abs(run.error), weights.of(question, run.regime)) for run in residuals)
    total = sum(weight for _, weight in weighted) + 1.0  # the question's own point, at infinity
    reached = 0.0
    for error, weight in weighted:
        reached += weight
        if reached / total >= target - 1e-12:
            return error
    return None


def pooled_band(question: Regime, residuals: Sequence[Residual], weights: Weights,
                target: float = TARGET_COVERAGE) -> float | None:
    """The pooled weighted conformal quantile of ``residuals`` for ``question`` (see the module docstring)."""
    band = _pooled_quantile(question, residuals, weights, target)
    for heavier in (weight for weight in OTHER_FAMILY_WEIGHTS if weight > weights.other_family):
        if band is not None:
            break
        band = _pooled_quantile(question, residuals, Weights(weights.neighbour, heavier), target)
    return band


def pooled_calibration(residuals: Sequence[Residual], weights: Weights,
                       target: float = TARGET_COVERAGE) -> list[tuple[Residual, float | None]]:
    """Each run against the pooled band of its regime, built without its source."""
    return [(run, pooled_band(run.regime, [r for r in residuals if r.source != run.source], weights, target))
            for run in residuals]


def _scaled(quantile: float | None, scale: float) -> float | None:
    return None if quantile is None else quantile * scale


COVARIATE_RIDGE = 1.0
"""The ridge penalty on the covariate scale's terms (the intercept is not shrunk)."""


def _covariates(regime: Regime, families: Sequence[str]) -> list[float]:
    """An intercept, then one indicator per family but the first, per size bin but the middle one, for a sequence
    over 8k and for several nodes."""
    return [1.0, *(float(regime.family == family) for family in families[1:]),
            *(float(regime.size == label) for _, label in (SIZE_BINS[0], SIZE_BINS[2])),
            float(regime.sequence == SEQUENCE_BINS[1][1]), float(regime.nodes == NODE_BINS[1][1])]


def covariate_scale(runs: Sequence[Residual], ridge: float = COVARIATE_RIDGE) -> Callable[[Regime], float]:
    """The error of any regime as a log-linear function of its description, fitted on ``runs`` (see the module
    docstring); never below :data:`ERROR_FLOOR`."""
    families = sorted({run.regime.family for run in runs})
    design = np.array([_covariates(run.regime, families) for run in runs])
    target = np.log(np.maximum(np.abs([run.error for run in runs]), ERROR_FLOOR))
    penalty = ridge * np.diag([0.0] + [1.0] * (design.shape[1] - 1))
    coefficients = np.linalg.solve(design.T @ design + penalty, design.T @ target)

    def scale(regime: Regime) -> float:
        known = regime.family in families
        covariates = _covariates(regime, families) if known else [1.0, *[0.0] * (design.shape[1] - 1)]
        return max(math.exp(float(np.dot(covariates, coefficients))), ERROR_FLOOR)

    return scale


def covariate_calibration(residuals: Sequence[Residual], target: float = TARGET_COVERAGE,
                          ridge: float = COVARIATE_RIDGE) -> list[tuple[Residual, float | None]]:
    """Each run against the band of its regime with the covariate scale, both the scale and every score built
    without its source (and each score's scale without the scored run's source as well)."""
    sources = sorted({run.source for run in residuals})
    scales = {frozenset((a, b)): covariate_scale([r for r in residuals if r.source not in (a, b)], ridge)
              for a in sources for b in sources}
    checked: list[tuple[Residual, float | None]] = []
    for run in residuals:
        others = [r for r in residuals if r.source != run.source]
        scores = [abs(r.error) / scales[frozenset((run.source, r.source))](r.regime) for r in others]
        checked.append((run, _scaled(split_conformal_quantile(scores, target),
                                     scales[frozenset((run.source,))](run.regime))))
    return checked


def jackknife_spread(predictions: Sequence[float]) -> float:
    """The jackknife's standard error from leave-one-out estimates (Efron and Stein 1981): sqrt((n - 1) / n x the sum
    of their squared deviations from their mean); 0 for fewer than two."""
    if len(predictions) < 2:
        return 0.0
    centre = statistics.fmean(predictions)
    return math.sqrt((len(predictions) - 1) / len(predictions) * sum((x - centre) ** 2 for x in predictions))


Fitted = TypeVar("Fitted")
"""What a fit gives the prediction (the calibration's :class:`~btk.planner.calibration.Parameters`)."""


def fit_spreads(points: Sequence[CalibrationPoint], fit_without: Callable[[Sequence[CalibrationPoint]], Fitted],
                predict: Callable[[CalibrationPoint, Fitted], float]) -> dict[str, float]:
    """Each run's spread of the fits: the jackknife standard error (:func:`jackknife_spread`) of its log tokens/s as
    predicted by the fits without its own source and, in turn, each other source: how much the prediction its band
    is checked against moves when one more source is taken away. A question's spread would be the same over the fits
    without each source. One fit per pair of sources: n (n - 1) / 2 fits for n sources."""
    sources = list(dict.fromkeys(source_of(point) for point in points))
    fits = {frozenset(pair): fit_without([point for point in points if source_of(point) not in pair])
            for pair in ((a, b) for i, a in enumerate(sources) for b in sources[i + 1:])}
    return {point.id: jackknife_spread([math.log(predict(point, fits[frozenset((source_of(point), other))]))
                                        for other in sources if other != source_of(point)])
            for point in points}


def stored_fit_spreads() -> dict[str, float]:
    """:func:`fit_spreads` of the calibration's runs, each fit started from the stored constants."""
    start = current_parameters()
    return fit_spreads(load_points(), lambda kept: fit(kept, start=start), predict_tokens_per_second)


SPREAD_FLOORS = (0.0, 0.01, 0.02, 0.04, 0.08, 0.16)
"""The pooled terms tried beside a run's spread: its scale is sqrt(floor^2 + spread^2)."""


def spread_calibration(residuals: Sequence[Residual], spreads: Mapping[str, float], floor: float,
                       target: float = TARGET_COVERAGE) -> list[tuple[Residual, float | None]]:
    """Each run against the locally weighted band scaled by the spread of the fits (:func:`fit_spreads`): the
    target quantile of the other sources' scores ``|error| / scale``, times the run's own scale. Every run's spread
    is built without its own source; the spreads of the runs scored for a band include fits that saw the banded
    run's source (the scores would otherwise need a fit per triple of sources)."""
    def scale(run: Residual) -> float:
        return max(math.hypot(floor, spreads[run.id]), ERROR_FLOOR)

    checked: list[tuple[Residual, float | None]] = []
    for run in residuals:
        scores = [abs(other.error) / scale(other) for other in residuals if other.source != run.source]
        checked.append((run, _scaled(split_conformal_quantile(scores, target), scale(run))))
    return checked


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``: ties get their mean rank); 0 where either side is one
    value throughout (it orders nothing, as a band of one width for every run), where SciPy gives NaN."""
    from scipy.stats import spearmanr

    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return 0.0
    return float(spearmanr(xs, ys).statistic)


def scale_tracking(checked: Sequence[tuple[Residual, float | None]]) -> float:
    """How closely a band's width follows the error it should cover: the rank correlation of each run's band with
    its absolute error. 1 where the widths rank the runs as their errors do; near 0 where they carry nothing of it."""
    runs = [(band, abs(run.error)) for run, band in checked if band is not None and math.isfinite(band)]
    return rank_correlation([band for band, _ in runs], [error for _, error in runs])


def summary(checked: Sequence[tuple[Residual, float | None]]) -> tuple[float, float, float, float, float]:
    """(coverage, lowest and highest regime coverage, median band, median error) of ``checked``."""
    overall, regimes = coverage_gaps(checked)
    return (overall, min(regimes.values()), max(regimes.values()), median_band(checked),
            statistics.median(abs(run.error) for run, _ in checked))


def named(weights: Weights) -> str:
    return f"neighbour {weights.neighbour}, other family {weights.other_family}"


def row(name: str, checked: Sequence[tuple[Residual, float | None]]) -> str:
    overall, low, high, band, error = summary(checked)
    return (f"| {name} | {overall:.0%} | {low:.0%}-{high:.0%} | ±{band:.1%} | {error:.1%} | {band / error:.2f} "
            f"| {scale_tracking(checked):+.2f} |")


def least_ratio_weights(checks: Mapping[Weights, Sequence[tuple[Residual, float | None]]]) -> Weights:
    """Of weights and their leave-source-out checks, those of the narrowest median band (the least ratio to the
    median error, the same for every weight), whatever their coverage."""
    return min(checks, key=lambda weights: median_band(checks[weights]))


Checked = list[tuple[Residual, float | None]]
RULES: dict[str, Callable[[Mapping[Weights, Checked]], Weights]] = {
    "the narrowest weights holding the target": narrowest_holding_target,
    "the weights closest to the target": weights_closest_to_target,
    "the weights of the least ratio": least_ratio_weights,
}
"""How a method's weights are chosen from the grid: the planner's rule, by coverage alone, by width alone."""


def nested_calibration(residuals: Sequence[Residual], statistic: Statistic = weighted_mean) -> dict[str, Checked]:
    """The whole procedure checked source by source, the choice of its weights included (nested leave-source-out),
    under each of :data:`RULES`: each source's runs against the bands of weights chosen, and scores taken, from the
    other sources' runs alone.

    A method checked with weights chosen on the same runs (:func:`main`'s first table) is flattered by the choice,
    the more so the more its rule looks at width; here no run's own source has a say in the weights of its band.
    """
    nested: dict[str, Checked] = {rule: [] for rule in RULES}
    for source in dict.fromkeys(run.source for run in residuals):
        others = [run for run in residuals if run.source != source]
        checks = {weights: band_calibration(others, weights, statistic=statistic) for weights in WEIGHT_GRID}
        for rule, choose in RULES.items():
            weights = choose(checks)
            nested[rule] += [(run, conformal_band(run.regime, others, weights, statistic=statistic).half_width)
                             for run in residuals if run.source == source]
    return nested


COVERAGE_TOLERANCE = 0.05
"""How far from the target a regime's coverage may lie and still count as on target (five points)."""


def one_width_ratio(residuals: Sequence[Residual], target: float = TARGET_COVERAGE) -> float:
    """The narrowest band of one width for every run that holds ``target`` of ``residuals`` (the
    ceil(target x n)-th smallest absolute error, chosen with every error known), over the median absolute error.

    A band whose width does not vary from run to run cannot have a lower ratio at that coverage of these runs.
    """
    errors = sorted(abs(run.error) for run in residuals)
    return errors[math.ceil(target * len(errors)) - 1] / statistics.median(errors)


def chance_within(runs: int, target: float = TARGET_COVERAGE, tolerance: float = COVERAGE_TOLERANCE) -> float:
    """The chance that ``runs`` independent runs, each inside a band with probability ``target``, give a coverage
    within ``tolerance`` of ``target`` (binomial)."""
    return sum(binomial_chance(inside, runs, target)
               for inside in range(runs + 1) if abs(inside / runs - target) <= tolerance + 1e-12)


def chance_every_regime_within(residuals: Sequence[Residual], target: float = TARGET_COVERAGE,
                               tolerance: float = COVERAGE_TOLERANCE) -> tuple[float, dict[str, float]]:
    """For a band that holds exactly ``target`` of the runs like each question, independently run by run: the
    chance that every regime of at least :data:`~btk.planner.band.REPORTED_REGIME_RUNS` runs lands within
    ``tolerance`` of ``target``, and each such regime's chance."""
    sizes: dict[str, int] = {}
    for run in residuals:
        sizes[run.regime.key] = sizes.get(run.regime.key, 0) + 1
    chances = {key: chance_within(size, target, tolerance) for key, size in sorted(sizes.items())
               if size >= REPORTED_REGIME_RUNS}
    return math.prod(chances.values()), chances


def main() -> None:
    residuals = list(stored_residuals())
    print(f"{len(residuals)} leave-source-out residuals; target coverage {TARGET_COVERAGE:.0%}; per method the "
          "weights of the grid chosen by the planner's rule (the narrowest holding the target) and, where they "
          "differ, by coverage alone (closest to the target) and by width alone (least ratio)")
    print("| method | coverage | regimes of 5+ runs | median band | median error | band / error | band ~ error |")
    print("|---|---|---|---|---|---|---|")
    planners = stored_weights(stored_summary())

    def best_of(name: str, calibrate: Callable[[Weights], list[tuple[Residual, float | None]]],
                chosen: Weights | None = None) -> None:
        """The method under the planner's rule (``chosen``: the planner's stored weights), then under the others
        where they choose other weights."""
        runs = {weights: calibrate(weights) for weights in WEIGHT_GRID}
        best = chosen or narrowest_holding_target(runs)
        planner = "the planner's: " if chosen else ""
        print(row(f"{planner}{name} ({named(best)})", runs[best]))
        shown = {best}
        for label, choose in (("closest to the target", weights_closest_to_target),
                              ("least ratio", least_ratio_weights)):
            if (weights := choose(runs)) not in shown:
                shown.add(weights)
                print(row(f"{name}, {label} ({named(weights)})", runs[weights]))

    def locally_weighted(statistic: Statistic) -> Callable[[Weights], list[tuple[Residual, float | None]]]:
        return lambda weights: band_calibration(residuals, weights, statistic=statistic)

    for statistic_name, statistic in STATISTICS.items():
        best_of(f"locally weighted, {statistic_name} error of the regime", locally_weighted(statistic),
                planners if statistic is weighted_mean else None)
    best_of("pooled: weighted conformal quantile of the residuals",
            lambda weights: pooled_calibration(residuals, weights))
    print(row(f"locally weighted, the error of the regime regressed on its description (ridge {COVARIATE_RIDGE:g})",
              covariate_calibration(residuals)))
    spreads = stored_fit_spreads()
    by_floor = {floor: spread_calibration(residuals, spreads, floor) for floor in SPREAD_FLOORS}
    floor = narrowest_holding_target(by_floor)
    print(row(f"locally weighted, the spread of the fits without one more source (jackknife; floor {floor:.0%})",
              by_floor[floor]))
    print("band ~ error: the rank correlation (Spearman) of each run's band with its absolute error")
    print("\nthe procedure, the choice of weights included, checked source by source (nested: each source's runs "
          "against bands whose weights were chosen without it)")
    print("| method | coverage | regimes of 5+ runs | median band | median error | band / error | band ~ error |")
    print("|---|---|---|---|---|---|---|")
    for statistic_name in NESTED_STATISTICS:
        for rule, checked in nested_calibration(residuals, STATISTICS[statistic_name]).items():
            print(row(f"locally weighted, {statistic_name} error of the regime, {rule}", checked))
    print(f"one width for every run, set after the fact to hold {TARGET_COVERAGE:.0%} of them: "
          f"{one_width_ratio(residuals):.2f}x the median error")
    joint, chances = chance_every_regime_within(residuals)
    print(f"a band holding exactly {TARGET_COVERAGE:.0%} of runs like each question lands within "
          f"{COVERAGE_TOLERANCE * 100:.0f} points of it in every regime of {REPORTED_REGIME_RUNS}+ runs with "
          f"probability {joint:.1%}:")
    for key, chance in chances.items():
        print(f"  {key}: {chance:.1%}")


if __name__ == "__main__":
    main()
