"""benchmarks/band_methods.py: the locally weighted band it compares the planner's with follows each regime's error.

Fixture residuals, one source per run: a GPU family whose small models are predicted within 1-2 % and whose large
ones miss by 8-16 %. The planner's band, pooling the family whole, gives both regimes one width; the locally
weighted band, scaling each residual by its regime's error, gives the small models a narrower band than the large
ones and still holds the target share of the runs it never saw.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from script_module import load_script

from btk.planner.band import Regime, Residual, Weights, band_calibration, coverage_gaps

SMALL = Regime("hopper", "under 5B", "seq up to 8k", "1 node")
LARGE = Regime("hopper", "20B and over", "seq up to 8k", "1 node")


def band_methods() -> ModuleType:
    return load_script("benchmarks/band_methods.py")


def residuals() -> list[Residual]:
    small = [0.010, -0.012, 0.014, -0.016, 0.011, 0.018, -0.013, 0.015, 0.012, -0.017]
    large = [0.08, -0.10, 0.12, -0.14, 0.09, 0.16, -0.11, 0.13, 0.10, -0.15]
    return [Residual(f"{regime.size}-{i}", f"source {regime.size} {i}", regime, error)
            for regime, errors in ((SMALL, small), (LARGE, large)) for i, error in enumerate(errors)]


def test_the_locally_weighted_band_follows_each_regimes_error() -> None:
    module = band_methods()
    runs, weights = residuals(), Weights(1.0, 0.0)
    pooled = dict((run.id, band) for run, band in band_calibration(runs, weights))
    local = dict((run.id, band) for run, band in module.locally_weighted_calibration(runs, weights, module._median))
    small = [run.id for run in runs if run.regime == SMALL]
    large = [run.id for run in runs if run.regime == LARGE]
    # pooled: one family, one band (each left-out run's own residual aside)
    assert max(pooled[i] for i in small) >= min(pooled[i] for i in large)
    # locally weighted, the family whole weighed alike: the scale is still the same for both regimes
    assert max(local[i] for i in small) >= min(local[i] for i in large)
    local = dict((run.id, band) for run, band in module.locally_weighted_calibration(runs, Weights(0.1, 0.0),
                                                                                     module._median))
    assert max(local[i] for i in small) < 0.05 < min(local[i] for i in large)
    overall, _ = coverage_gaps(module.locally_weighted_calibration(runs, Weights(0.1, 0.0), module._median))
    assert overall >= 0.8


def test_a_scale_never_falls_below_its_floor() -> None:
    module = band_methods()
    exact = [Residual(f"r{i}", f"s{i}", SMALL, 0.0) for i in range(6)]
    for scale in module.SCALES.values():
        assert module.regime_scale(SMALL, exact, Weights(0.5, 0.0), scale) == module.SCALE_FLOOR


def test_the_covariate_scale_follows_each_regimes_error_and_holds_the_target() -> None:
    """Regressed on the regime's description, the scale of the small models is below the large ones'; their bands,
    every score and scale built without the run's source, are narrower and hold the target share."""
    module = band_methods()
    runs = residuals()
    scale = module.covariate_scale(runs)
    assert scale(SMALL) < 0.05 < scale(LARGE)
    checked = module.covariate_calibration(runs)
    bands = {run.id: band for run, band in checked}
    assert max(bands[run.id] for run in runs if run.regime == SMALL) < min(
        bands[run.id] for run in runs if run.regime == LARGE)
    overall, _ = coverage_gaps(checked)
    assert overall >= 0.8


def test_a_covariate_scale_never_falls_below_its_floor() -> None:
    module = band_methods()
    exact = [Residual(f"r{i}", f"s{i}", regime, 0.0) for i in range(6) for regime in (SMALL, LARGE)]
    scale = module.covariate_scale(exact)
    for regime in (SMALL, LARGE):
        assert module.SCALE_FLOOR <= scale(regime) == pytest.approx(module.SCALE_FLOOR)
