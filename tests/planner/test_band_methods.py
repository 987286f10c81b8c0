"""benchmarks/band_methods.py: the alternatives it compares the planner's band with.

Fixture residuals, one source per run: a GPU family whose small models are predicted within 1-2 % and whose large
ones miss by 8-16 %. The pooled band, a quantile of the family's residuals, gives both regimes one width; the locally
weighted bands (the planner's mean regime error and the median and root-mean-square variants), scaling each residual
by its regime's error, give the small models a narrower band than the large ones and still hold the target share of
the runs they never saw. The bounds every band meets on given runs: a band
of one width cannot be narrower than the share's quantile of the errors, and a band holding exactly the target share
lands within five points of it in a regime of n runs with the binomial chance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType

import pytest
from script_module import ROOT, load_script

from btk.planner import band as planner_band
from btk.planner.band import Regime, Residual, Weights, band_calibration, coverage_gaps
from btk.planner.calibration import CalibrationPoint, load_points, source_of

SMALL = Regime("hopper", "under 5B", "seq up to 8k", "1 node")
LARGE = Regime("hopper", "20B and over", "seq up to 8k", "1 node")


def band_methods() -> ModuleType:
    return load_script("benchmarks/band_methods.py")


def residuals() -> list[Residual]:
    small = [0.010, -0.012, 0.014, -0.016, 0.011, 0.018, -0.013, 0.015, 0.012, -0.017]
    large = [0.08, -0.10, 0.12, -0.14, 0.09, 0.16, -0.11, 0.13, 0.10, -0.15]
    return [Residual(f"{regime.size}-{i}", f"source {regime.size} {i}", regime, error)
            for regime, errors in ((SMALL, small), (LARGE, large)) for i, error in enumerate(errors)]


def bands_by_run(checked: Sequence[tuple[Residual, float | None]]) -> dict[str, float]:
    """Each run's band; every band of these fixtures has one."""
    bands = {run.id: band for run, band in checked}
    assert all(band is not None for band in bands.values())
    return {run_id: band for run_id, band in bands.items() if band is not None}


def test_the_locally_weighted_bands_follow_each_regimes_error_where_the_pooled_one_does_not() -> None:
    module = band_methods()
    runs = residuals()
    pooled = bands_by_run(module.pooled_calibration(runs, Weights(1.0, 0.0)))
    small = [run.id for run in runs if run.regime == SMALL]
    large = [run.id for run in runs if run.regime == LARGE]
    # pooled, the family whole weighed alike: one band (each left-out run's own residual aside)
    assert max(pooled[i] for i in small) >= min(pooled[i] for i in large)
    for statistic in module.STATISTICS.values():
        checked = band_calibration(runs, Weights(0.1, 0.0), statistic=statistic)
        local = bands_by_run(checked)
        assert max(local[i] for i in small) < 0.05 < min(local[i] for i in large)
        assert coverage_gaps(checked)[0] >= 0.8
        # the family whole weighed alike: one regime error for both, so one band
        alike = bands_by_run(band_calibration(runs, Weights(1.0, 0.0), statistic=statistic))
        assert max(alike[i] for i in small) >= min(alike[i] for i in large)


def test_the_pooled_band_lends_a_thin_family_the_other_families_at_the_least_weight_that_reaches_the_target() -> None:
    """Two runs of its own and the question's 1 at infinity cannot make 80 %; Hopper's 40 runs lent at 0.05 each
    (the least of the grid: 0.02 gives (2 + 0.8) / 3.8 = 74 %) reach (2 + 2) / 5 = 80 %, and the band is their 10 %.
    """
    module = band_methods()
    question = Regime("blackwell", "5-20B", "seq up to 8k", "1 node")
    own = [Residual(f"own{i}", f"own{i}", question, error) for i, error in enumerate((0.03, 0.06))]
    hopper = [Residual(f"hop{i}", f"hop{i}", SMALL, 0.10) for i in range(40)]
    assert module.pooled_band(question, own + hopper, Weights(1.0, 0.0)) == 0.10
    assert module.pooled_band(question, own, Weights(1.0, 0.0)) is None  # nothing to borrow: no band


def test_the_nested_check_chooses_the_weights_of_each_sources_bands_without_that_source(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rule sees only the other sources' checks when it chooses the weights of a source's bands, and each run's
    band is the one built from the other sources' runs at the weights chosen for it."""
    module = band_methods()
    runs = residuals()
    seen: list[set[str]] = []
    choice = Weights(0.1, 0.0)
    monkeypatch.setattr(module, "WEIGHT_GRID", (choice, Weights(1.0, 0.0)))  # two are enough to choose between

    def spy(checks: dict[Weights, list[tuple[Residual, float | None]]]) -> Weights:
        assert set(checks) == set(module.WEIGHT_GRID)
        seen.append({run.source for checked in checks.values() for run, _ in checked})
        return choice

    monkeypatch.setattr(module, "RULES", {"spy": spy})
    nested = module.nested_calibration(runs)["spy"]
    sources = {run.source for run in runs}
    assert sorted(len(sources - chosen_from) for chosen_from in seen) == [1] * len(sources)
    assert {next(iter(sources - chosen_from)) for chosen_from in seen} == sources
    assert len(nested) == len(runs)
    for run, band in nested:
        others = [other for other in runs if other.source != run.source]
        assert band == planner_band.conformal_band(run.regime, others, choice).half_width


def test_a_regime_error_never_falls_below_its_floor() -> None:
    module = band_methods()
    exact = [Residual(f"r{i}", f"s{i}", SMALL, 0.0) for i in range(6)]
    for statistic in module.STATISTICS.values():
        assert planner_band.regime_error(SMALL, exact, Weights(0.5, 0.0), statistic) == planner_band.ERROR_FLOOR


def test_the_covariate_scale_follows_each_regimes_error_and_holds_the_target() -> None:
    """Regressed on the regime's description, the scale of the small models is below the large ones'; their bands,
    every score and scale built without the run's source, are narrower and hold the target share."""
    module = band_methods()
    runs = residuals()
    scale = module.covariate_scale(runs)
    assert scale(SMALL) < 0.05 < scale(LARGE)
    checked = module.covariate_calibration(runs)
    bands = bands_by_run(checked)
    assert max(bands[run.id] for run in runs if run.regime == SMALL) < min(
        bands[run.id] for run in runs if run.regime == LARGE)
    overall, _ = coverage_gaps(checked)
    assert overall >= 0.8


def test_a_covariate_scale_never_falls_below_its_floor() -> None:
    module = band_methods()
    exact = [Residual(f"r{i}", f"s{i}", regime, 0.0) for i in range(6) for regime in (SMALL, LARGE)]
    scale = module.covariate_scale(exact)
    for regime in (SMALL, LARGE):
        assert planner_band.ERROR_FLOOR <= scale(regime) == pytest.approx(planner_band.ERROR_FLOOR)


def test_one_width_for_every_run_is_no_narrower_than_the_targets_quantile() -> None:
    """Errors of 1 % to 10 %: the narrowest width holding 80 % of them is the 8th smallest, 8 %, and one step
    narrower holds 70 %; the median error is 5.5 %."""
    module = band_methods()
    runs = [Residual(f"r{i}", f"s{i}", SMALL, (-1) ** i * i / 100) for i in range(1, 11)]
    assert module.one_width_ratio(runs) == pytest.approx(0.08 / 0.055)
    assert sum(abs(run.error) <= 0.07 for run in runs) / len(runs) < 0.8 <= sum(
        abs(run.error) <= 0.08 for run in runs) / len(runs)


def test_the_chance_of_landing_within_five_points_is_the_binomials() -> None:
    """Five runs: only 4 of 5 (80 %) is within five points, 5 x 0.8^4 x 0.2 = 0.4096; ten runs: only 8 of 10,
    45 x 0.8^8 x 0.2^2; a thousand runs land within five points almost surely (the binomial's standard deviation is
    1.3 points). Regimes of fewer than five runs are not counted; the chance of all is the product."""
    module = band_methods()
    assert module.chance_within(5) == pytest.approx(0.4096)
    assert module.chance_within(10) == pytest.approx(45 * 0.8 ** 8 * 0.2 ** 2)
    assert module.chance_within(1000) > 0.99
    runs = [*residuals(), Residual("lone", "lone source", Regime("ampere"), 0.01)]
    joint, chances = module.chance_every_regime_within(runs)
    assert set(chances) == {SMALL.key, LARGE.key}
    assert joint == pytest.approx(module.chance_within(10) ** 2)


def test_docs_quote_the_bounds_of_the_stored_residuals() -> None:
    """docs/calibration.md's two bounds are what the functions give on the stored residuals."""
    module = band_methods()
    runs = planner_band.stored_residuals()
    doc = " ".join((ROOT / "docs" / "calibration.md").read_text().split())
    errors = sorted(abs(run.error) for run in runs)
    width = errors[math.ceil(0.8 * len(errors)) - 1]
    joint, chances = module.chance_every_regime_within(runs)
    sizes = {key: sum(run.regime.key == key for run in runs) for key in chances}
    quoted = [f"is ±{width:.1%}".replace("%", " %"), f"**{module.one_width_ratio(runs):.2f} times** the median error",
              f"probability **{joint:.1%}**".replace("%", " %"),
              f"in a regime of five runs with probability {module.chance_within(5):.0%}".replace("%", " %"),
              f"all {len(runs)} runs the same band lands within five points with probability "
              f"{module.chance_within(len(runs)):.0%}".replace("%", " %"),
              *(f"{size}-run regime {chances[key]:.0%}".replace("%", " %") for key, size in sizes.items()
                if list(sizes.values()).count(size) == 1 and size != 6)]
    for text in quoted:
        assert text in doc, text


def test_the_binomial_test_is_the_exact_two_sided_one() -> None:
    """Five runs at 80 %: P(4) = 0.4096 is the likeliest count (p = 1); 5 of 5 (P = 0.32768) is as likely as no
    count but 4, so p = 1 - 0.4096; none of 5 (P = 0.2^5) is the least likely alone."""
    assert planner_band.binomial_p_value(4, 5) == pytest.approx(1.0)
    assert planner_band.binomial_p_value(5, 5) == pytest.approx(1 - 0.4096)
    assert planner_band.binomial_p_value(0, 5) == pytest.approx(0.2 ** 5)


def test_the_binomial_test_is_scipys() -> None:
    """Every count of up to 30 runs, at the target and at two other coverages: the same p as SciPy's exact test."""
    from scipy.stats import binomtest

    for target in (0.8, 0.5, 0.9):
        for runs in range(1, 31):
            for inside in range(runs + 1):
                expected = binomtest(inside, runs, target).pvalue
                assert planner_band.binomial_p_value(inside, runs, target) == pytest.approx(expected, rel=1e-9), (
                    inside, runs, target)


def test_docs_quote_the_planners_binomial_tests() -> None:
    """docs/calibration.md's p-values are the calibration table's on the planner's stored band."""
    doc = " ".join((ROOT / "docs" / "calibration.md").read_text().split())
    for line in planner_band.calibration_table(planner_band.stored_summary())[2:]:
        name, runs, inside, _, p_value = (cell.strip() for cell in line.strip("|").split("|")[:5])
        assert float(p_value) >= 0.05, name
        of = f"{inside} of all {runs}" if name.startswith("all ") else f"{inside} of {runs}"
        assert f"{of}: p = {p_value}" in doc, (name, of, p_value)


def test_the_jackknife_spread_is_efron_and_steins() -> None:
    """Leave-one-out estimates 1, 2, 3: sqrt(2/3 x (1 + 0 + 1)); one estimate has no spread."""
    module = band_methods()
    assert module.jackknife_spread([1.0, 2.0, 3.0]) == pytest.approx(math.sqrt(4 / 3))
    assert module.jackknife_spread([5.0]) == 0.0


def test_each_runs_spread_comes_from_fits_that_never_saw_its_source() -> None:
    """On the calibration's real runs with a stand-in fit (the set of sources it kept) and prediction (e to the
    number of sources kept that sort before the run's own): one fit per pair of sources, each run predicted only by
    fits without its source and one other, and its spread the jackknife of those predictions."""
    module = band_methods()
    points = load_points()[:24]
    sources = sorted({source_of(point) for point in points})
    fitted: list[frozenset[str]] = []

    def stand_in_fit(kept: Sequence[CalibrationPoint]) -> frozenset[str]:
        fitted.append(frozenset(source_of(point) for point in kept))
        return fitted[-1]

    predicted: list[tuple[str, frozenset[str]]] = []

    def stand_in_predict(point: CalibrationPoint, kept: frozenset[str]) -> float:
        predicted.append((source_of(point), kept))
        return math.exp(sum(source < source_of(point) for source in kept))

    spreads = module.fit_spreads(points, stand_in_fit, stand_in_predict)
    assert len(sources) >= 3 and len(fitted) == len(set(fitted)) == math.comb(len(sources), 2)
    assert all(own not in kept and len(kept) == len(sources) - 2 for own, kept in predicted)
    for point in points:
        own = source_of(point)
        expected = [sum(source < own for source in sources if source not in (own, other))
                    for other in sources if other != own]
        assert spreads[point.id] == pytest.approx(module.jackknife_spread(expected))


def test_a_band_scaled_by_a_spread_that_follows_the_error_follows_it_too() -> None:
    """Spreads of 1 % for the small models and 10 % for the large: their bands differ tenfold and hold the target;
    a floor far above both spreads gives every run nearly the same band."""
    module = band_methods()
    runs = residuals()
    spreads = {run.id: 0.01 if run.regime == SMALL else 0.10 for run in runs}
    checked = module.spread_calibration(runs, spreads, floor=0.0)
    bands = bands_by_run(checked)
    assert max(bands[run.id] for run in runs if run.regime == SMALL) < 0.05 < min(
        bands[run.id] for run in runs if run.regime == LARGE)
    assert coverage_gaps(checked)[0] >= 0.8
    # two widths for two groups of errors that do not overlap: the ranks agree but for the order within each group
    assert module.scale_tracking(checked) > 0.5
    flat = bands_by_run(module.spread_calibration(runs, spreads, floor=10.0))
    assert max(flat.values()) / min(flat.values()) < 1.1


def test_rank_correlation_is_spearmans_with_ties_averaged() -> None:
    """Same order 1, reversed -1; x = 1, 1, 2 ranks 1.5, 1.5, 3 against 1, 2, 3: 1.5 / sqrt(1.5 x 2). A band's
    widths against the errors: in their order 1, against it -1, one width for all 0."""
    module = band_methods()
    assert module.rank_correlation([1, 2, 3], [10, 40, 90]) == pytest.approx(1.0)
    assert module.rank_correlation([1, 2, 3], [9, 4, 1]) == pytest.approx(-1.0)
    assert module.rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    runs = residuals()
    assert module.scale_tracking([(run, 2 * abs(run.error)) for run in runs]) == pytest.approx(1.0)
    assert module.scale_tracking([(run, 1 / abs(run.error)) for run in runs]) == pytest.approx(-1.0)
    assert module.scale_tracking([(run, 0.1) for run in runs]) == 0.0  # one width orders nothing
