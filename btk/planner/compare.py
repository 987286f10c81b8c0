"""``btk compare``'s answer: the best plan of one profile on each of several instance types,
cheapest first, with the instances whose costs the models cannot tell apart marked as such.

Figures are kept as the planner predicts them: the JSON rounds them as ``btk plan --format json``
does, and the text table formats them with the same functions as ``btk plan`` (``render``), so
one figure reads the same in every output.

**Ranking.** Rows are sorted by dollars per billion tokens (the order of "$ to train" too: every
row trains the same tokens). A row's cost is a prediction with an error band (cost is price
over speed, so the speed's band is the cost's): two rows whose costs differ by no more than
the wider of their two bands are *indistinguishable*. A row's rank is the range of places it
can take: from one more than the rows cheaper by more than that, to that plus the rows it
cannot be told apart from (``1-3``; a single number where the place is certain). Rows that
cannot be told apart always have overlapping ranges. A row whose band is unknown (the
question lies outside the published evidence) is not ranked at all.

**The team's evidence.** Where the team measured the profile's model on an instance type
(:mod:`btk.planner.evidence`), that row's speed, MFU and costs are the corrected prediction and
its band the one those runs support, so the ranking uses what the team measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from btk.errors import InfeasiblePlanError
from btk.evidence import Evidence
from btk.hardware import InstanceType
from btk.knobs import TrainingKnobs
from btk.planner.band import ErrorBand, band_for
from btk.planner.cost import TrainingCost, training_cost
from btk.planner.evidence import EvidenceCorrection, correct_plan
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
    """What the profile's ``training.total_tokens`` (or ``--total-tokens``) costs (None when neither is set)."""


@dataclass(frozen=True)
class CostRank:
    """Where one fitting row stands by cost: the places it can take, and the rows it cannot be told apart from.

    ``rank`` counts the rows that are surely cheaper (by more than the wider of the two bands),
    ``worst`` adds those that cannot be told apart from it: within the error bands the row
    finishes anywhere from ``rank`` to ``worst``. Two rows that cannot be told apart always have
    overlapping places, so the labels and the list of indistinguishable rows never disagree.
    """

    rank: int
    """1 + the rows whose cost is lower by more than the error band: the best place the row can take."""
    indistinguishable_from: tuple[str, ...] = ()
    """The instance types whose cost differs from this row's by less than the wider of the two bands."""

    @property
    def worst(self) -> int:
        """The worst place the row can take: ``rank`` + the rows it cannot be told apart from."""
        return self.rank + len(self.indistinguishable_from)

    def label(self) -> str:
        """``2`` where the place is certain, ``1-3`` where the error bands leave it anywhere from 1 to 3."""
        return str(self.rank) if self.worst == self.rank else f"{self.rank}-{self.worst}"


@dataclass(frozen=True)
class InstanceComparison:
    """One instance type: its best plan, or why none fits, and the longest sequence one node trains."""

    instance_type: str
    gpu: str
    longest_seq_len_one_node: int
    planned: PlannedFigures | None
    band: ErrorBand
    """How far predictions for this question missed published runs (leave-source-out)."""
    reason: str | None = None
    """Why no knob set fits (only when ``planned`` is None)."""
    cost_rank: CostRank | None = None
    """Set by :func:`rank_by_cost`; None where the row does not fit or its band is unknown."""
    correction: EvidenceCorrection | None = None
    """The team's measured runs of the model on this instance type, which ``planned`` is corrected by."""
    predicted_tokens_per_second_per_gpu: float | None = None
    """The planner's own figure, before the team's evidence (set with ``correction``)."""

    @property
    def fits(self) -> bool:
        return self.planned is not None

    @property
    def speed_band(self) -> float | None:
        """The relative half-width of the row's tokens/s: the team's evidence's where it has some, else the
        published band's (None outside the published evidence)."""
        return self.correction.band if self.correction is not None else self.band.tokens_per_second

    def describe_band(self) -> str:
        if self.correction is not None and self.predicted_tokens_per_second_per_gpu is not None:
            return f"team's evidence: {self.correction.describe(self.predicted_tokens_per_second_per_gpu)}"
        return self.band.describe()

    def to_json(self) -> dict[str, Any]:
        """The documented ``btk compare --format json`` row."""
        head = {"instance_type": self.instance_type, "gpu": self.gpu}
        if self.planned is None:
            return head | {
                "fits": False,
                "reason": self.reason,
                "longest_seq_len_one_node": self.longest_seq_len_one_node,
                "error_band": self.band.as_json(),
            }
        planned, rank = self.planned, self.cost_rank
        return head | {
            "fits": True,
            "knobs": planned.knobs.model_dump(),
            "tokens_per_second_per_gpu": round(planned.tokens_per_second_per_gpu, 1),
            "tokens_per_second_per_node": round(planned.tokens_per_second_per_node, 1),
            "mfu": round(planned.mfu, 4),
            "usd_per_billion_tokens": round(planned.usd_per_billion_tokens, 2),
            "memory_gib": round(planned.memory_gib, 1),
            "training_cost": planned.training_cost.as_json() if planned.training_cost is not None else None,
            "longest_seq_len_one_node": self.longest_seq_len_one_node,
            "cost_rank": rank.rank if rank is not None else None,
            "cost_rank_worst": rank.worst if rank is not None else None,
            "indistinguishable_from": list(rank.indistinguishable_from) if rank is not None else None,
            "error_band": self.band.as_json(),
            "evidence": self.correction.as_json(self.predicted_tokens_per_second_per_gpu)
            if self.correction is not None and self.predicted_tokens_per_second_per_gpu is not None else None,
        }


def with_total_tokens(profile: ModelProfile, total_tokens: int | None) -> ModelProfile:
    """``profile`` with ``training.total_tokens`` replaced (unchanged when ``total_tokens`` is None)."""
    if total_tokens is None:
        return profile
    return profile.model_copy(update={"training": profile.training.model_copy(update={"total_tokens": total_tokens})})


def compare_instance(profile: ModelProfile, instance: InstanceType, nodes: int,
                     evidence: Evidence | None = None) -> InstanceComparison:
    """The best plan of ``profile`` on ``nodes`` x ``instance``, or the reason none fits; corrected by the team's
    runs of the model on the instance type in ``evidence`` where there are some."""
    longest = longest_sequence_one_node(profile, instance)
    gpu = instance.gpu.name
    band = band_for(instance, profile.parameter_count, profile.training.seq_len, nodes)
    try:
        plan = plan_profile(profile, instance, nodes)
    except InfeasiblePlanError as error:
        return InstanceComparison(instance.name, gpu, longest, None, band, str(error))
    estimate = plan.evaluation.estimate
    correction = correct_plan(plan, evidence) if evidence is not None else None
    factor = correction.factor if correction is not None else 1.0
    cost = plan.training_cost()
    if cost is not None and correction is not None:
        cost = training_cost(cost.total_tokens, estimate.tokens_per_second_per_gpu * factor,
                             nodes * instance.gpus_per_node, cost.on_demand_usd / cost.training_hours)
    planned = PlannedFigures(
        knobs=plan.knobs,
        tokens_per_second_per_gpu=estimate.tokens_per_second_per_gpu * factor,
        tokens_per_second_per_node=estimate.tokens_per_second_per_gpu * factor * instance.gpus_per_node,
        mfu=estimate.mfu * factor,
        usd_per_billion_tokens=estimate.usd_per_billion_tokens / factor,
        memory_gib=plan.evaluation.memory.total,
        training_cost=cost,
    )
    return InstanceComparison(instance.name, gpu, longest, planned, band, correction=correction,
                              predicted_tokens_per_second_per_gpu=estimate.tokens_per_second_per_gpu
                              if correction is not None else None)


def _cost(row: InstanceComparison) -> float:
    assert row.planned is not None
    return row.planned.usd_per_billion_tokens


def distinguishable(cheaper: InstanceComparison, costlier: InstanceComparison) -> bool:
    """Whether ``costlier`` costs more than ``cheaper`` by more than the wider of their tokens/s bands."""
    band = max(cheaper.speed_band or 0.0, costlier.speed_band or 0.0)
    return _cost(costlier) / _cost(cheaper) - 1 > band


def rank_by_cost(rows: Sequence[InstanceComparison]) -> list[InstanceComparison]:
    """Fitting rows cheapest first with their :class:`CostRank`, then rows outside the evidence, then misfits.

    A row's best place is one more than the number of rows distinguishably cheaper than it;
    rows whose costs differ by no more than the wider of their bands are indistinguishable,
    and each pushes the row's worst place back by one (:class:`CostRank`).
    """
    fitting = sorted((row for row in rows if row.planned is not None), key=lambda row: (_cost(row), row.instance_type))
    banded = [row for row in fitting if row.speed_band is not None]
    ranked = []
    for row in banded:
        cheaper = [other for other in banded if _cost(other) < _cost(row) and distinguishable(other, row)]
        same = tuple(
            other.instance_type
            for other in banded
            if other is not row
            and not distinguishable(*sorted((other, row), key=lambda r: (_cost(r), r.instance_type)))
        )
        ranked.append(replace(row, cost_rank=CostRank(1 + len(cheaper), same)))
    unbanded = [row for row in fitting if row.speed_band is None]
    return ranked + unbanded + [row for row in rows if row.planned is None]


def compare_instances(
    profile: ModelProfile, instances: Sequence[InstanceType], nodes: int, total_tokens: int | None = None,
    evidence: Evidence | None = None,
) -> list[InstanceComparison]:
    """One comparison per instance type, ranked by cost (:func:`rank_by_cost`).

    ``total_tokens`` replaces the profile's ``training.total_tokens`` in the cost to train; ``evidence``: the
    team's measured runs, which correct the rows of the instance types they ran on.
    """
    profile = with_total_tokens(profile, total_tokens)
    return rank_by_cost([compare_instance(profile, instance, nodes, evidence) for instance in instances])
