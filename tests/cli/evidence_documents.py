"""Evidence documents for the ``btk evidence`` tests: rehearsals of a fixture profile at given speeds."""

from __future__ import annotations

from typing import Any

from fixture_catalog import PROFILES

from btk.hardware import get_instance_type
from btk.planner.search import plan_profile

B200 = "ml.p6-b200.48xlarge"


def runs_document(*speeds: float, profile: str = "llama3.1-8b", kind: str = "reh") -> dict[str, Any]:
    """One rehearsal per speed on one B200 node with the planned knobs; ids ``btk-prod-<profile>-<kind>-N``."""
    knobs = plan_profile(PROFILES[profile], get_instance_type(B200)).knobs
    return {"version": 1, "runs": [
        {"id": f"btk-prod-{profile}-{kind}-{index}", "kind": "rehearsal", "profile": profile,
         "architecture": PROFILES[profile].architecture.model_dump(mode="json"), "instance_type": B200, "nodes": 1,
         "knobs": knobs.model_dump(mode="json"), "tokens_per_second_per_gpu": speed, "source": "test"}
        for index, speed in enumerate(speeds)]}
