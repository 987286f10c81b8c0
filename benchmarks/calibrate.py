"""Fit the planner's throughput constants to the published runs and print every point's error.

For each point of ``btk/planner/calibration_points.json``: the published tokens/s per GPU,
the prediction of the fit to all points, the prediction of a fit *without* that point
(leave-one-out), and the memory model's error (leave-one-out too: only the reserve of runs
launched with the default CUDA allocator is fitted). Then the fitted constants, to be
copied into ``btk/hardware.py``, ``btk/planner/throughput.py`` and
``btk/planner/calibration.py``, and the error band per GPU family that ``btk plan`` shows.

Run: ``.venv/bin/python benchmarks/calibrate.py [--write]``; ``--write`` stores the band in
``btk/planner/calibration_band.json`` (the test suite checks that it matches this fit).
"""

from __future__ import annotations

import argparse
import json

from btk.planner.band import BAND_FILE, band_summary
from btk.planner.calibration import (
    NAMES,
    _to_vector,
    evaluate,
    fit,
    fit_default_allocator_reserve,
    leave_source_out,
    load_points,
    source_document,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the band in calibration_band.json")
    args = parser.parse_args()
    points = load_points()
    params = fit(points)
    results = evaluate(points, params)
    print(f"{'point':34} {'family':9} {'published':>9} {'fit':>7} {'LOO':>7} {'memory':>7}")
    for result in results:
        memory = "" if result.memory_error is None else f"{result.memory_error:+.1%}"
        print(
            f"{result.point.id:34} {result.point.family:9} {result.point.tokens_per_second_per_gpu:9,.0f} "
            f"{result.fitted_error:+7.1%} {result.left_out_error:+7.1%} {memory:>7}"
        )
    print("\nfitted constants:")
    for name, value in zip(NAMES, _to_vector(params), strict=True):
        print(f"  {name:26} {value:.4g}")
    print(f"  {'default_allocator_reserve':26} {fit_default_allocator_reserve(points):.4g}  (memory evidence only)")
    print("\nleave-source-out (every run of the point's source document left out of the fit):")
    by_source = leave_source_out(points, params)
    for point in points:
        print(f"  {point.id:34} {by_source[point.id]:+7.1%}  {source_document(point)}")
    summary = band_summary(results)
    print("\nband per GPU family (worst leave-one-out error):")
    print(json.dumps(summary, indent=2))
    if args.write:
        BAND_FILE.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {BAND_FILE}")


if __name__ == "__main__":
    main()
