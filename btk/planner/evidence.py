"""The planner's prediction corrected by the team's own measured runs (:mod:`btk.evidence`).

The published calibration is the prior: the prediction is unbiased with the spread its error
band states (``band`` at :data:`~btk.planner.band.TARGET_COVERAGE`, read as a normal spread of
the log error). Each measured run of the **same architecture on the same instance type** (any
knobs and node count: each is held against the planner's prediction for its own knobs) gives
the log ratio of measured to predicted tokens/s, which scatters around the setup's true ratio
by :data:`WITHIN_SETUP_SCATTER`. The correction is the normal-normal posterior of that ratio
(precision-weighted: one run moves a prediction whose band is wide a long way and one whose
band is narrow a little; many runs dominate any prior), and the corrected band is the
posterior predictive interval of a new run at the same coverage; runs that contradict the band
widen the prior to the spread that makes them most likely (:func:`posterior`). Assumptions: the
error of a setup is one factor shared by its knob sets, and runs scatter log-normally around it.

``tests/planner/test_evidence.py`` checks it on published runs standing in for the team's: a
run's leave-source-out prediction (made without its source), corrected by other runs of the
same model, GPU and engine, errs less on average the more runs it is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from btk.evidence import Evidence, MeasuredRun
from btk.planner.band import TARGET_COVERAGE, ErrorBand
from btk.profile import ModelArchitecture

if TYPE_CHECKING:
    from btk.hardware import InstanceType
    from btk.planner.search import Plan

WITHIN_SETUP_SCATTER = 0.095
"""Standard deviation of log(measured / predicted) between runs of one model on one GPU type with one engine, when
the prediction never saw that setup: 0.095 pooled over the leave-source-out errors of the 73 calibration runs that
share their setup with another (25 setups; ``tests/planner/test_evidence.py`` recomputes it). The errors are
heavy-tailed (1.4826 times their median absolute deviation gives 0.048): this spread keeps the corrected band's
coverage, not its typical width."""
OUTSIDE_EVIDENCE_SCATTER = 0.5
"""The prior spread of a prediction outside the published evidence (no band): its own runs decide."""
Z = NormalDist().inv_cdf(0.5 + TARGET_COVERAGE / 2)
"""The normal quantile of the band's two-sided coverage (1.28 at 80 %)."""


@dataclass(frozen=True)
class EvidenceCorrection:
    """A prediction corrected by measured runs."""

    runs: tuple[str, ...]
    ratios: tuple[float, ...]
    """Each run's measured / predicted tokens/s."""
    factor: float
    """What the prediction is multiplied by."""
    band: float
    """The corrected prediction's relative half-width at the band's coverage."""

    def describe(self, predicted: float) -> str:
        return (f"{len(self.runs)} measured run(s) of this model on this instance type (measured / predicted "
                f"{', '.join(f'{ratio:.2f}' for ratio in self.ratios[:5])}{' ...' if len(self.ratios) > 5 else ''}): "
                f"tokens/s x{self.factor:.3f} = {predicted * self.factor:,.0f} per GPU, "
                f"±{self.band:.1%} ({TARGET_COVERAGE:.0%} band)")

    def as_json(self, predicted: float) -> dict[str, Any]:
        return {"runs": list(self.runs), "measured_over_predicted": [round(r, 4) for r in self.ratios],
                "factor": round(self.factor, 4), "tokens_per_second_per_gpu": round(predicted * self.factor, 1),
                "tokens_per_second_relative": round(self.band, 4), "target_coverage": TARGET_COVERAGE}


def prior_scatter(band: ErrorBand) -> float:
    """The log-error spread the published band states (its half-width at the target coverage over ``Z``)."""
    if not band.measured or band.tokens_per_second is None:
        return OUTSIDE_EVIDENCE_SCATTER
    return math.log1p(band.tokens_per_second) / Z


def posterior(prior: float, log_ratios: Sequence[float], scatter: float = WITHIN_SETUP_SCATTER) -> tuple[
        float, float]:
    """(mean, variance) of the setup's log ratio after ``log_ratios``, from a zero-mean prior of spread ``prior``.

    The prior spread is the band's, or more where the runs say the band does not hold for this setup: the
    spread that makes their mean most likely (type-II maximum likelihood: the mean of n runs scatters by
    ``prior**2 + scatter**2 / n``), floored at the band's. Runs far outside a narrow band (a team's GPUs that
    run slower than any published setup, as torchao's power-limited B200s do) then move the prediction as far
    as they warrant instead of a band's width.
    """
    if log_ratios:
        mean = sum(log_ratios) / len(log_ratios)
        prior = math.sqrt(max(prior**2, mean**2 - scatter**2 / len(log_ratios)))
    precision = 1 / prior**2 + len(log_ratios) / scatter**2
    return sum(log_ratios) / scatter**2 / precision, 1 / precision


def correct(band: ErrorBand, pairs: Sequence[tuple[str, float, float]],
            scatter: float = WITHIN_SETUP_SCATTER) -> EvidenceCorrection | None:
    """The correction from ``(run id, measured, predicted)`` triples; None without any."""
    if not pairs:
        return None
    ratios = tuple(measured / predicted for _, measured, predicted in pairs)
    mean, variance = posterior(prior_scatter(band), [math.log(ratio) for ratio in ratios], scatter)
    return EvidenceCorrection(tuple(run for run, _, _ in pairs), ratios, math.exp(mean),
                              math.expm1(Z * math.sqrt(variance + scatter**2)))


def matching_runs(evidence: Evidence, architecture: ModelArchitecture, instance_type: str) -> list[MeasuredRun]:
    """The runs of this architecture on this instance type."""
    return [run for run in evidence.runs if run.instance_type == instance_type and run.architecture == architecture]


def runs_on_record(evidence: Evidence, architecture: ModelArchitecture, instance_type: str) -> tuple[str, ...]:
    """The ids of the evidence's runs of this architecture on this instance type: rehearsals, and runs that
    completed (a short on-demand run is a rehearsal by another name; ``btk report`` records completed jobs only)."""
    return tuple(run.id for run in matching_runs(evidence, architecture, instance_type))


def rehearsal_record_line(runs: Sequence[str], instance_type: str, store: object) -> str:
    """Whether the model ran on the instance type before (what to do before buying capacity if not)."""
    if runs:
        shown = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
        return f"rehearsed: {len(runs)} measured run(s) of this model on {instance_type} on record in {store} ({shown})"
    return (f"not rehearsed: no run of this model on {instance_type} on record in {store}; before buying capacity, "
            "rehearse on demand (a short pipeline run, or an environment with rehearsal=RehearsalConfig(enabled=True))"
            " and record it (btk report --record-evidence)")


def correct_prediction(architecture: ModelArchitecture, instance: InstanceType, band: ErrorBand,
                       evidence: Evidence) -> EvidenceCorrection | None:
    """A prediction for ``architecture`` on ``instance`` (published band ``band``) corrected by the evidence's runs
    of that architecture on that instance type; None without any."""
    from btk.planner.throughput import estimate_throughput

    pairs = [(run.id, run.tokens_per_second_per_gpu,
              estimate_throughput(architecture, run.knobs, instance, run.nodes).tokens_per_second_per_gpu)
             for run in matching_runs(evidence, architecture, instance.name)]
    return correct(band, pairs)


def correct_plan(plan: Plan, evidence: Evidence) -> EvidenceCorrection | None:
    """``plan``'s prediction corrected by the evidence's runs of its architecture on its instance type."""
    return correct_prediction(plan.profile.architecture, plan.instance, plan.band, evidence)


def refuse_unrehearsed_purchase(env_name: str, profiles: Sequence[tuple[str, ModelArchitecture]], instance_type: str,
                                evidence: Evidence, store: object) -> None:
    """One line (BtkError) naming every profile of an environment that buys a training plan at deploy and has no
    measured run of its model on ``instance_type`` in ``evidence`` (rehearsals and completed runs)."""
    from btk.errors import BtkError

    missing = [name for name, architecture in profiles if not runs_on_record(evidence, architecture, instance_type)]
    if missing:
        raise BtkError(
            f"-c require_rehearsal=true: environment {env_name} buys a training plan at deploy, and "
            f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no measured run on {instance_type} in "
            f"{store}: rehearse on demand first (btk rehearse PROFILE --env ENV), or bring the team's runs "
            f"(btk evidence pull --env {env_name})")
