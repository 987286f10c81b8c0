"""Calibration against published measurements (docs/calibration.md).

Every point of ``btk/planner/calibration_points.json`` is predicted by a fit to all the
*other* points (leave-one-out). Asserted bounds, and why they are what they are:

* tokens/s within 15 % for every point the leave-one-out fit can predict: every torchtitan
  run (FSDP2 and TP 8, Hopper and power-limited B200) and both B200 Megatron runs;
* Megatron's DGX-H100 run is evidence, not predicted (``pins`` in the file): it alone
  separates the Megatron engine factor from Blackwell's speed and the B200 power limit, so
  its leave-one-out error measures the prior; the test checks that it is marked so and
  that the fit to all points reproduces it;
* peak memory within 10 % for every point with a published peak; the memory model has no
  fitted constant, and the evidence one (the reserve of runs launched with the default CUDA
  allocator) is fitted without the point it predicts.
"""

from __future__ import annotations

import pytest

from btk.planner.band import BAND_FILE, band_summary
from btk.planner.calibration import (
    NAMES,
    PointResult,
    _to_vector,
    current_parameters,
    evaluate,
    fit,
    fit_default_allocator_reserve,
    load_points,
    predict_allocated_gib,
    predict_memory_gib,
)

TOKENS_BOUND = 0.15
FITTED_BOUND = 0.15
MEMORY_BOUND = 0.10


@pytest.fixture(scope="module")
def results() -> list[PointResult]:
    return evaluate(load_points(), fit(load_points()))


def test_every_point_cites_its_source_and_differences() -> None:
    for point in load_points():
        assert point.source.startswith("github:"), point.id
        assert point.differs, point.id


def test_leave_one_out_tokens_per_second(results: list[PointResult]) -> None:
    for result in results:
        if result.predicted:
            assert abs(result.left_out_error) <= TOKENS_BOUND, (result.point.id, result.left_out_error)


def test_only_the_engine_evidence_is_not_predicted(results: list[PointResult]) -> None:
    """The one point left out of the band pins megatron_engine, and the full fit still matches it."""
    unpredicted = [result for result in results if not result.predicted]
    assert [result.point.id for result in unpredicted] == ["megatron-2511-dgx-h100-fp8"]
    for result in unpredicted:
        assert result.point.pins is not None and result.point.pins.startswith("megatron_engine")
        assert abs(result.fitted_error) <= FITTED_BOUND, (result.point.id, result.fitted_error)


def test_memory_against_published_peaks(results: list[PointResult]) -> None:
    checked = [result for result in results if result.memory_error is not None]
    assert len(checked) >= 15
    for result in checked:
        assert result.memory_error is not None
        assert abs(result.memory_error) <= MEMORY_BOUND, (result.point.id, result.memory_error)


def test_default_allocator_reserve_is_fitted_without_the_point_it_predicts(results: list[PointResult]) -> None:
    """A default-allocator run is predicted with the reserve of the *other* such runs; the rest get none."""
    points = load_points()
    default = [point for point in points if point.allocator == "default"]
    assert len(default) >= 2  # each predicts the other: a reserve fitted to one run alone would predict nothing
    for result in results:
        point = result.point
        if point.memory_gib is None:
            continue
        assert result.memory_gib is not None
        if point.allocator != "default":
            assert result.memory_gib == pytest.approx(predict_allocated_gib(point))
            continue
        others = [p for p in points if p is not point]
        reserve = fit_default_allocator_reserve(others)
        assert 0 < reserve < 0.25
        assert result.memory_gib == pytest.approx(predict_allocated_gib(point) * (1 + reserve))
        assert reserve != pytest.approx(fit_default_allocator_reserve(points))


def test_default_allocator_reserve_needs_default_allocator_runs() -> None:
    expandable = [point for point in load_points() if point.allocator != "default"]
    assert fit_default_allocator_reserve(expandable) == 0.0
    for point in expandable:
        assert predict_memory_gib(point, 0.5) == predict_allocated_gib(point)


def test_planner_constants_are_the_fit() -> None:
    """hardware.py, throughput.py and calibration.py hold what benchmarks/calibrate.py fits."""
    fitted = _to_vector(fit(load_points()))
    used = _to_vector(current_parameters())
    for name, got, want in zip(NAMES, used, fitted, strict=True):
        assert got == pytest.approx(want, rel=0.01), name


def test_stored_band_matches_the_fit(results: list[PointResult]) -> None:
    import json

    assert json.loads(BAND_FILE.read_text()) == band_summary(results)


def test_b200_outpaces_h100_as_published() -> None:
    """Megatron's DGX-B200 runs Llama 3 8B 2.1x faster per GPU than its DGX-H100 (FP8-CS)."""
    from fixture_catalog import PROFILES

    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    profile = PROFILES["llama3.1-8b"]
    h100 = plan_profile(profile, get_instance_type("ml.p5.48xlarge")).evaluation.estimate
    b200 = plan_profile(profile, get_instance_type("ml.p6-b200.48xlarge")).evaluation.estimate
    assert 1.7 <= b200.tokens_per_second_per_gpu / h100.tokens_per_second_per_gpu <= 2.6
