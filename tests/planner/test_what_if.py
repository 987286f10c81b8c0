"""``btk estimate``'s knobs: the plan's, changed by ``--set``, keeping the profile's global batch."""

from __future__ import annotations

import pytest
from fixture_catalog import PROFILES

from btk.errors import InfeasiblePlanError
from btk.hardware import get_instance_type
from btk.planner.search import Evaluation, plan_profile, what_if
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


def test_knobs_that_do_not_fit_have_no_speed_or_price_but_the_nearest_knobs_that_fit() -> None:
    """qwen2.5-32b at micro-batch 8 overflows an H100: no price, but the shortfall and a fitting neighbour."""
    from btk.planner.render import render_what_if
    from btk.planner.search import NEAREST_KNOBS, enumerate_candidates

    profile = PROFILES["qwen2.5-32b"]
    result = what_if(profile, P5, 1, {"micro_batch_size": "8"})
    evaluation = result.evaluation
    assert not evaluation.fits and evaluation.shortfall_gib == pytest.approx(evaluation.memory.total -
                                                                             evaluation.budget_gib)
    assert evaluation.as_json()["estimate"] is None
    nearest = result.nearest
    assert nearest is not None and nearest.fits
    changes = result.changed_to_fit()
    # no fitting candidate changes fewer knobs; among those with as few changes none is faster
    fitting = [c for c in enumerate_candidates(profile, P5, 1) if c.fits]

    def changed(candidate: Evaluation) -> int:
        return sum(getattr(candidate.knobs, n) != getattr(evaluation.knobs, n) for n in NEAREST_KNOBS)

    assert min(changed(c) for c in fitting) == len(changes) == changed(nearest)
    assert max(c.estimate.tokens_per_second_per_gpu for c in fitting if changed(c) == len(changes)) == \
        nearest.estimate.tokens_per_second_per_gpu
    text = render_what_if(result)
    before, after = text.split("nearest knobs that fit")
    assert "per billion tokens" not in before and "tokens/s/GPU" not in before
    assert f"{evaluation.shortfall_gib:.1f} GiB over the" in before
    assert "per billion tokens" in after and ", ".join(changes) in after


def test_knobs_that_fit_have_no_nearest() -> None:
    result = what_if(PROFILES["llama3.1-8b"], P5, 1, {})
    assert result.evaluation.fits and result.nearest is None and result.changed_to_fit() == []
