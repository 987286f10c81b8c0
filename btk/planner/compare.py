"""``btk compare``'s answer: the best plan of one profile on each of several instance types.

Figures are rounded here, once, to what the JSON documents (README, "plan JSON"); the text
table prints the same rounded values, so both outputs agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from btk.errors import InfeasiblePlanError
from btk.hardware import InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.band import ErrorBand, band_for
from btk.planner.search import longest_sequence_one_node, plan_profile
from btk.profile import ModelProfile


@dataclass(frozen=True)
class PlannedFigures:
    """The best plan's knobs and figures on one instance type, rounded as printed."""

    knobs: TrainingKnobs
    tokens_per_second_per_gpu: float
    tokens_per_second_per_node: float
    mfu: float
    usd_per_billion_tokens: float
    memory_gib: float


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
            "tokens_per_second_per_gpu": planned.tokens_per_second_per_gpu,
            "tokens_per_second_per_node": planned.tokens_per_second_per_node,
            "mfu": planned.mfu,
            "usd_per_billion_tokens": planned.usd_per_billion_tokens,
            "memory_gib": planned.memory_gib,
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
        tokens_per_second_per_gpu=round(estimate.tokens_per_second_per_gpu, 1),
        tokens_per_second_per_node=round(estimate.tokens_per_second_per_gpu * instance.gpus_per_node, 1),
        mfu=round(estimate.mfu, 4),
        usd_per_billion_tokens=round(estimate.usd_per_billion_tokens, 2),
        memory_gib=round(plan.evaluation.memory.total, 1),
    )
    return InstanceComparison(instance.name, longest, planned, band_for(instance))


def compare_instances(profile: ModelProfile, instances: Sequence[InstanceType], nodes: int) -> list[InstanceComparison]:
    """One comparison per instance type, in the order given."""
    return [compare_instance(profile, instance, nodes) for instance in instances]
