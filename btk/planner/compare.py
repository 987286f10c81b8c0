"""``btk compare``'s answer: the best plan of one profile on each of several instance types.

Figures are kept as the planner predicts them: the JSON rounds them as ``btk plan --format json``
does, and the text table formats them with the same functions as ``btk plan`` (``render``), so
one figure reads the same in every output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from btk.errors import InfeasiblePlanError
from btk.hardware import InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.band import ErrorBand, band_for
from btk.planner.cost import TrainingCost
from btk.planner.search import longest_sequence_one_node, plan_profile
from btk.profile import ModelProfile


@dataclass(frozen=True)
class PlannedFigures:
    """The best plan's knobs and figures on one instance type, unrounded."""

    knobs: TrainingKnobs
    tokens_per_second_per_gpu: float
    tokens_per_second_per_node: float
    mfu: float
    usd_per_billion_tokens: float
    memory_gib: float
    training_cost: TrainingCost | None
    """What the profile's ``training.total_tokens`` costs (None when it sets none)."""


@dataclass(frozen=True)
class InstanceComparison:
    """One instance type: its best plan, or why none fits, and the longest sequence one node trains."""

    instance_type: str
    longest_seq_len_one_node: int
    planned: PlannedFigures | None
    band: ErrorBand
    """How far this GPU family's predictions missed published runs (leave-one-out)."""
    reason: str | None = None
    """Why no knob set fits (only when ``planned`` is None)."""

    @property
    def fits(self) -> bool:
        return self.planned is not None

    def to_json(self) -> dict[str, Any]:
        """The documented ``btk compare --format json`` row."""
        if self.planned is None:
            return {
                "instance_type": self.instance_type,
                "fits": False,
                "reason": self.reason,
                "longest_seq_len_one_node": self.longest_seq_len_one_node,
                "error_band": self.band.as_json(),
            }
        planned = self.planned
        return {
            "instance_type": self.instance_type,
            "fits": True,
            "knobs": planned.knobs.model_dump(),
            "tokens_per_second_per_gpu": round(planned.tokens_per_second_per_gpu, 1),
            "tokens_per_second_per_node": round(planned.tokens_per_second_per_node, 1),
            "mfu": round(planned.mfu, 4),
            "usd_per_billion_tokens": round(planned.usd_per_billion_tokens, 2),
            "memory_gib": round(planned.memory_gib, 1),
            "training_cost": planned.training_cost.as_json() if planned.training_cost is not None else None,
            "longest_seq_len_one_node": self.longest_seq_len_one_node,
            "error_band": self.band.as_json(),
        }


def compare_instance(profile: ModelProfile, instance: InstanceType, nodes: int) -> InstanceComparison:
    """The best plan of ``profile`` on ``nodes`` x ``instance``, or the reason none fits."""
    longest = longest_sequence_one_node(profile, instance)
    try:
        plan = plan_profile(profile, instance, nodes)
    except InfeasiblePlanError as error:
        return InstanceComparison(instance.name, longest, None, band_for(instance), str(error))
    estimate = plan.evaluation.estimate
    planned = PlannedFigures(
        knobs=plan.knobs,
        tokens_per_second_per_gpu=estimate.tokens_per_second_per_gpu,
        tokens_per_second_per_node=estimate.tokens_per_second_per_gpu * instance.gpus_per_node,
        mfu=estimate.mfu,
        usd_per_billion_tokens=estimate.usd_per_billion_tokens,
        memory_gib=plan.evaluation.memory.total,
        training_cost=plan.training_cost(),
    )
    return InstanceComparison(instance.name, longest, planned, band_for(instance))


def compare_instances(profile: ModelProfile, instances: Sequence[InstanceType], nodes: int) -> list[InstanceComparison]:
    """One comparison per instance type, in the order given."""
    return [compare_instance(profile, instance, nodes) for instance in instances]
