"""The error band a prediction carries: how far the calibration's leave-one-out predictions
missed the published runs on the same GPU family.

``benchmarks/calibrate.py --write`` computes it from ``calibration_points.json`` and stores
it in ``calibration_band.json``; ``tests/planner/test_calibration.py`` checks the stored band
against a fresh fit. A GPU family with no published point has no band, and says so. A point
that alone pins a constant (``PointResult.predicted`` false) has no meaningful leave-one-out
error: it counts among the evidence and is listed under ``not_predicted``, outside the worst case.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from btk.hardware import InstanceType

if TYPE_CHECKING:
    from btk.planner.calibration import PointResult

BAND_FILE = Path(__file__).with_name("calibration_band.json")
FAMILY_BY_ARCHITECTURE = {"hopper": "hopper", "blackwell": "blackwell", "ampere": "ampere"}


@dataclass(frozen=True)
class ErrorBand:
    """The worst leave-one-out errors on one GPU family, and how many points back them."""

    family: str
    tokens_per_second: float | None
    memory: float | None
    points: int
    memory_points: int
    evidence: tuple[str, ...]

    @property
    def measured(self) -> bool:
        return self.points > 0

    def describe(self) -> str:
        """One line for the text output."""
        if not self.measured or self.tokens_per_second is None:
            return f"no published measurement on {self.family} GPUs: the speed figures are unverified estimates"
        memory = (
            f"; memory ±{self.memory:.0%} ({self.memory_points} points)"
            if self.memory is not None
            else "; memory unverified"
        )
        return (
            f"tokens/s ±{self.tokens_per_second:.0%} (leave-one-out, {self.points} points on {self.family} GPUs)"
            f"{memory}; evidence: docs/calibration.md"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_family": self.family,
            "measured": self.measured,
            "tokens_per_second_relative": self.tokens_per_second,
            "memory_relative": self.memory,
            "points": self.points,
            "memory_points": self.memory_points,
            "method": "worst leave-one-out error on published runs (docs/calibration.md)",
            "evidence": list(self.evidence),
        }


def band_summary(results: Sequence[PointResult]) -> dict[str, dict[str, Any]]:
    """Per family: worst |leave-one-out| tokens/s error of the predictable points, worst |memory| error,
    counts, point ids (all, and those not predictable)."""
    summary: dict[str, dict[str, Any]] = {}
    for result in results:
        entry = summary.setdefault(
            result.point.family,
            {
                "tokens_per_second": 0.0,
                "memory": None,
                "points": 0,
                "memory_points": 0,
                "evidence": [],
                "not_predicted": [],
            },
        )
        if result.predicted:
            entry["tokens_per_second"] = round(max(entry["tokens_per_second"], abs(result.left_out_error)), 3)
        else:
            entry["not_predicted"].append(result.point.id)
        entry["points"] += 1
        entry["evidence"].append(result.point.id)
        if result.memory_error is not None:
            entry["memory"] = round(max(entry["memory"] or 0.0, abs(result.memory_error)), 3)
            entry["memory_points"] += 1
    return summary


@cache
def _stored() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(BAND_FILE.read_text())
    return data


def band_for(instance: InstanceType) -> ErrorBand:
    """The band of ``instance``'s GPU family, or an empty band where nothing was measured."""
    family = FAMILY_BY_ARCHITECTURE.get(instance.gpu.architecture, instance.gpu.architecture)
    entry = _stored().get(family)
    if entry is None:
        return ErrorBand(family, None, None, 0, 0, ())
    return ErrorBand(
        family=family,
        tokens_per_second=entry["tokens_per_second"],
        memory=entry["memory"],
        points=entry["points"],
        memory_points=entry["memory_points"],
        evidence=tuple(entry["evidence"]),
    )
