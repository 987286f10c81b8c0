"""The planner corrected by measured runs, checked on published runs standing in for a team's own.

Every calibration run's leave-source-out prediction (by a fit that never saw its source) plays
the planner's prediction for a team that has just started measuring; the other runs of the same
model on the same GPU type with the same engine play the team's earlier runs.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from functools import cache

import pytest

from btk.evidence import Evidence, MeasuredRun
from btk.planner.band import TARGET_COVERAGE, ErrorBand, band_for_question
from btk.planner.calibration import evaluate, fit, load_points
from btk.planner.evidence import (
    WITHIN_SETUP_SCATTER,
    Z,
    correct,
    correct_plan,
    matching_runs,
    posterior,
)


@cache
def _setups() -> dict[tuple[str, str, str], list[tuple[str, float, float, ErrorBand]]]:
    """(model, GPU, engine) -> each run's (id, published, leave-source-out prediction, its band): every run left out
    by source once per test process (some 5 CPU-seconds), shared by the tests that read it and not changed by them."""
    points = load_points()
    setups: dict[tuple[str, str, str], list[tuple[str, float, float, ErrorBand]]] = defaultdict(list)
    for result in evaluate(points, fit(points)):
        point = result.point
        band = band_for_question(point.family, point.parameters, point.knobs.seq_len, point.nodes)
        setups[(point.model, point.system.name, point.engine)].append(
            (point.id, point.tokens_per_second_per_gpu, result.left_out_tokens, band))
    return setups


def test_the_teams_runs_bring_the_prediction_closer_the_more_there_are() -> None:
    """Over the runs of setups with at least four published runs, each predicted from 0, 1, 2 and 3 others of its
    setup (every choice of them, averaged): the mean error falls with each run added, by a third with the first;
    the corrected band still holds at least 70 % of them at every count (its target is 80 %)."""
    errors: dict[int, list[float]] = defaultdict(list)
    covered: dict[int, list[bool]] = defaultdict(list)
    for runs in _setups().values():
        if len(runs) < 4:
            continue
        for index, (_, published, predicted, band) in enumerate(runs):
            others = runs[:index] + runs[index + 1:]
            for count in range(4):
                draws = []
                for chosen in itertools.combinations(others, count):
                    fixed = correct(band, [(other, measured, guess) for other, measured, guess, _ in chosen])
                    factor, width = (1.0, band.tokens_per_second) if fixed is None else (fixed.factor, fixed.band)
                    error = predicted * factor / published - 1
                    draws.append(abs(error))
                    covered[count].append(width is not None and abs(error) <= width)
                errors[count].append(statistics.mean(draws))
    means = [statistics.mean(errors[count]) for count in range(4)]
    assert len(errors[0]) >= 20
    assert means[1] <= means[0] * 2 / 3 and means[2] <= means[1] and means[3] <= means[2] * 1.02
    for count in range(1, 4):
        assert sum(covered[count]) / len(covered[count]) >= 0.70, count


def test_the_within_setup_scatter_is_the_published_runs() -> None:
    """The constant is the pooled standard deviation of the leave-source-out log errors inside setups with several
    calibration runs: how a setup's runs scatter around its shared error when the prediction never saw the setup."""
    setups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for runs_key, runs in _setups().items():
        setups[runs_key] = [math.log(predicted / published) for _, published, predicted, _ in runs]
    several = [values for values in setups.values() if len(values) > 1]
    deviations = [value - statistics.mean(values) for values in several for value in values]
    pooled = math.sqrt(sum(d * d for d in deviations) / (len(deviations) - len(several)))
    assert pooled == pytest.approx(WITHIN_SETUP_SCATTER, abs=0.005)


def test_the_posterior_weighs_the_prior_against_the_runs() -> None:
    ratios = [math.log(0.8), math.log(0.9)]
    wide, _ = posterior(10.0, ratios)
    assert math.exp(wide) == pytest.approx(math.sqrt(0.8 * 0.9), rel=1e-3)  # no prior: the runs' geometric mean
    agreeing = [math.log(0.99), math.log(1.01)]
    narrow, _ = posterior(1e-4, agreeing)
    assert math.exp(narrow) == pytest.approx(1.0, abs=1e-4)  # runs within their scatter of a certain prior: unmoved
    # Runs that contradict a narrow prior widen it to the spread that makes their mean most likely.
    mean = sum(ratios) / 2
    widened = math.sqrt(mean**2 - WITHIN_SETUP_SCATTER**2 / 2)
    moved, _ = posterior(1e-4, ratios)
    assert moved == pytest.approx(mean * widened**2 / (widened**2 + WITHIN_SETUP_SCATTER**2 / 2), rel=1e-9)
    assert mean < moved < 0
    halfway, variance = posterior(WITHIN_SETUP_SCATTER, [math.log(0.95)])
    assert math.exp(halfway) == pytest.approx(math.sqrt(0.95), rel=1e-9) and variance == pytest.approx(
        WITHIN_SETUP_SCATTER**2 / 2)
    assert pytest.approx(1.2816, abs=1e-4) == Z and TARGET_COVERAGE == 0.8


def test_only_runs_of_the_same_architecture_and_instance_type_count() -> None:
    from fixture_catalog import PROFILES

    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    b200 = get_instance_type("ml.p6-b200.48xlarge")
    plan = plan_profile(PROFILES["llama3.1-8b"], b200)

    def run(run_id: str, profile: str, instance: str) -> MeasuredRun:
        return MeasuredRun(id=run_id, kind="run", profile=profile, architecture=PROFILES[profile].architecture,
                           instance_type=instance, nodes=1, knobs=plan.knobs, tokens_per_second_per_gpu=1000.0)

    evidence = Evidence(runs=(run("a", "llama3.1-8b", "ml.p5.48xlarge"), run("b", "llama3.2-3b", b200.name)))
    assert matching_runs(evidence, plan.profile.architecture, b200.name) == [] and correct_plan(plan, evidence) is None
    evidence = Evidence(runs=(*evidence.runs, run("c", "llama3.1-8b", b200.name)))
    correction = correct_plan(plan, evidence)
    assert correction is not None and correction.runs == ("c",) and correction.factor < 1
