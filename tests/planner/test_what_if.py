"""``btk estimate``'s knobs: the plan's, changed by ``--set``, keeping the profile's global batch."""

from __future__ import annotations

import pytest
from fixture_catalog import PROFILES

from btk.errors import InfeasiblePlanError
from btk.hardware import get_instance_type
from btk.planner.search import plan_profile, what_if
from btk.profile import KnobPins

P5 = get_instance_type("ml.p5.48xlarge")


def test_no_change_is_the_plan() -> None:
    profile = PROFILES["llama3.1-8b"]
    result = what_if(profile, P5, 2, {})
    plan = plan_profile(profile, P5, 2)
    assert result.start == "plan" and not result.accumulation_recomputed
    assert result.evaluation == plan.evaluation and result.global_batch == plan.global_batch


def test_where_no_plan_fits_it_starts_from_micro_batch_one_with_the_pins() -> None:
    pins = KnobPins(activation_checkpointing="none", micro_batch_size=64)
    profile = PROFILES["llama3.1-8b"].model_copy(update={"pinned": pins})
    with pytest.raises(InfeasiblePlanError):
        plan_profile(profile, P5, 1)
    result = what_if(profile, P5, 1, {})
    assert result.start == "micro-batch 1" and result.evaluation.knobs.micro_batch_size == 64
    assert result.accumulation_recomputed and not result.evaluation.fits
    assert result.global_batch.planned_tokens >= profile.training.global_batch_tokens


def test_an_unreachable_global_batch_is_one_line_naming_the_fix() -> None:
    base = PROFILES["llama3.1-8b"]
    training = base.training.model_copy(update={"global_batch_tokens": 16_777_216})
    profile = base.model_copy(update={"training": training})
    # 16 Mi tokens in micro-batches of 1 x 16 tokens on 8 GPUs: 131,072 steps
    with pytest.raises(InfeasiblePlanError, match="131,072 gradient accumulation steps, more than the 65,536 allowed"):
        what_if(profile, P5, 1, {"seq_len": "16", "micro_batch_size": "1"})
