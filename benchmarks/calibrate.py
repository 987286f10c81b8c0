"""Fit the planner's throughput constants to the published runs and print every run's error.

For each run of ``btk/planner/calibration_points.json``: the published tokens/s per GPU, the
prediction of the fit to all runs, the prediction of a fit *without every run of its source*
(leave-source-out), and the memory model's error (leave-one-out: only the reserve of runs
launched with the default CUDA allocator is fitted). Then the fitted constants, to be copied
into ``btk/hardware.py``, ``btk/planner/throughput.py`` and ``btk/planner/calibration.py``;
the weights of the error bands' regime errors and how the bands, rebuilt without each source, cover
that source's runs; the error band per regime that ``btk plan``, ``estimate`` and ``compare`` print (the
tables of ``docs/calibration.md``); and the held-out runs, which no fit sees, predicted by the full fit, with how
many of them the printed bands cover.

Run: ``.venv/bin/python benchmarks/calibrate.py [--write]``; ``--write`` stores the bands in
``btk/planner/calibration_band.json`` (the test suite checks that it matches this fit).
"""

from __future__ import annotations

import argparse
import json
import statistics

from btk.planner.ablations import ablation_table, ablations
from btk.planner.band import (
    BAND_FILE,
    NEIGHBOUR_WEIGHTS,
    OTHER_FAMILY_WEIGHTS,
    REGIME_TOLERANCE,
    REPORTED_REGIME_RUNS,
    Weights,
    band_calibration,
    band_summary,
    calibration_table,
    coverage_gaps,
    coverage_table,
    median_band,
    regime_table,
    residuals_of,
    stored_weights,
)
from btk.planner.calibration import (
    NAMES,
    _to_vector,
    evaluate,
    fit,
    fit_default_allocator_reserve,
    load_held_out,
    load_points,
    predict_tokens_per_second,
    source_of,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the bands in calibration_band.json")
    args = parser.parse_args()
    points = load_points()
    params = fit(points)
    results = evaluate(points, params)
    print(f"{'run':38} {'family':9} {'size':>6} {'seq':>6} {'nodes':>5} {'published':>9} {'fit':>7} {'LSO':>7} "
          f"{'memory':>7}")
    for result in results:
        point = result.point
        memory = "" if result.memory_error is None else f"{result.memory_error:+.1%}"
        print(
            f"{point.id:38} {point.family:9} {point.parameters / 1e9:5.1f}B {point.knobs.seq_len:6} {point.nodes:5} "
            f"{point.tokens_per_second_per_gpu:9,.0f} {result.fitted_error:+7.1%} {result.left_out_error:+7.1%} "
            f"{memory:>7}"
        )
    print("\nfitted constants:")
    for name, value in zip(NAMES, _to_vector(params), strict=True):
        print(f"  {name:26} {value:.4g}")
    print(f"  {'default_allocator_reserve':26} {fit_default_allocator_reserve(points):.4g}  (memory evidence only)")
    print("\nthe published float8, MXFP8 and compile ablations, their gains beside the model's:")
    print("\n".join(ablation_table(ablations(results))))
    print("\nsources (leave-source-out leaves each out whole):")
    for source in dict.fromkeys(source_of(point) for point in points):
        runs = [result for result in results if source_of(result.point) == source]
        worst = max(abs(result.left_out_error) for result in runs)
        print(f"  {len(runs):3} runs, worst {worst:6.1%}  {source}")
    left_out = {r.point.id: r.left_out_error for r in results}
    summary = band_summary(points, left_out, results)
    residuals = residuals_of(points, left_out)
    chosen = stored_weights(summary)
    target = summary["target_coverage"]
    print(f"\nweights of the regime errors (bands rebuilt without each source, covering its runs: overall, the "
          f"regimes of {REPORTED_REGIME_RUNS}+ runs, median band; the narrowest holding {target:.0%} overall and "
          f"{target - REGIME_TOLERANCE:.0%} in every such regime is chosen, *):")
    for neighbour in NEIGHBOUR_WEIGHTS:
        cells = []
        for other in OTHER_FAMILY_WEIGHTS:
            checked = band_calibration(residuals, Weights(neighbour, other))
            overall, regimes = coverage_gaps(checked)
            median = median_band(checked)
            mark = "*" if Weights(neighbour, other) == chosen else " "
            cells.append(f"{other:4}: {overall:4.0%} ({min(regimes.values()):.0%}-{max(regimes.values()):.0%}) "
                         f"±{median:5.1%}{mark}")
        print(f"  same family {neighbour:3}, other family " + "  ".join(cells))
    print("\nthe bands' own calibration (each source's runs against bands built without it):")
    print("\n".join(calibration_table(summary)))
    print(f"\nband per regime ({summary['target_coverage']:.0%} locally weighted conformal band of leave-source-out "
          f"errors: {summary['score_quantile']:.3f} x the regime's mean error):")
    print("\n".join(regime_table(summary)))
    held = load_held_out()
    errors = [predict_tokens_per_second(point, params) / point.tokens_per_second_per_gpu - 1 for point in held]
    print(f"\nheld out ({len(held)} published runs no fit sees), predicted by the fit to all runs:")
    for point, error in zip(held, errors, strict=True):
        print(f"  {point.id:38} {point.tokens_per_second_per_gpu:9,.0f} {error:+7.1%}")
    if errors:
        absolute = [abs(error) for error in errors]
        print(f"  median |error| {statistics.median(absolute):.1%}, worst {max(absolute):.1%}")
        print("\nthe held-out runs against the bands the planner prints for them (the stored bands):")
        print("\n".join(coverage_table(held, errors, summary)))
    if args.write:
        BAND_FILE.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {BAND_FILE}")


if __name__ == "__main__":
    main()
