"""The planner's prediction for the knobs a run used, to compare with what it achieved.

:data:`Predictor` is the seam between the report and the planner: the default,
:func:`planner_predictor`, asks ``btk.planner.search.evaluate_knobs`` with the run's profile
(architecture taken from the run's own ``arch.*`` hyperparameters when present, so a
profile edited after the run does not skew the comparison), instance type, node count
and knobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from btk.errors import BtkError
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture


@dataclass(frozen=True)
class Prediction:
    """What the planner expects a run to reach."""

    tokens_per_second_per_gpu: float
    mfu: float
    peak_memory_gib: float | None = None
    fits: bool | None = None


class PredictionUnavailableError(Exception):
    """The planner cannot predict this run; the message says why (becomes a run note)."""


Predictor = Callable[[str, str, int, TrainingKnobs, ModelArchitecture | None], Prediction]
"""``(profile, instance_type, nodes, knobs, architecture) -> Prediction``; raises
:class:`PredictionUnavailableError` when there is no prediction."""


def planner_predictor(
    profile_name: str, instance_type: str, nodes: int, knobs: TrainingKnobs, architecture: ModelArchitecture | None
) -> Prediction:
    """Ask ``btk.planner.search.evaluate_knobs`` (imported lazily: ``btk report`` works without it)."""
    try:
        from btk.planner.search import evaluate_knobs
    except ImportError as error:
        raise PredictionUnavailableError(f"the planner is not available ({error})") from None
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type

    try:
        profile = get_profile(profile_name)
        if architecture is not None and architecture != profile.architecture:
            profile = profile.model_copy(update={"architecture": architecture})
        evaluation = evaluate_knobs(profile, get_instance_type(instance_type), nodes, knobs)
    except BtkError as error:
        raise PredictionUnavailableError(f"no prediction: {error}") from None
    estimate = evaluation.estimate
    return Prediction(
        tokens_per_second_per_gpu=float(estimate.tokens_per_second_per_gpu),
        mfu=float(estimate.mfu),
        peak_memory_gib=float(evaluation.memory.total),
        fits=bool(evaluation.fits),
    )
