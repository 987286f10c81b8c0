"""A global batch that no micro-batch reaches within the accumulation bound is a one-line planner error."""

from __future__ import annotations

import pytest

from btk.catalog import all_profiles
from btk.errors import InfeasiblePlanError
from btk.hardware import get_instance_type
from btk.knobs import MAX_GRADIENT_ACCUMULATION_STEPS
from btk.planner.search import MAX_MICRO_BATCH, plan_profile
from btk.profile import MAX_GLOBAL_BATCH_TOKENS, KnobPins, ModelProfile, TrainingIntent

B200 = get_instance_type("ml.p6-b200.48xlarge")


def _any_profile(**changes: object) -> ModelProfile:
    """The user's smallest profile with ``training``/``pinned`` fields replaced."""
    profile = min(all_profiles().values(), key=lambda candidate: candidate.parameter_count)
    training = {k: v for k, v in changes.items() if k in TrainingIntent.model_fields}
    pinned = {k: v for k, v in changes.items() if k in KnobPins.model_fields}
    return profile.model_copy(
        update={
            "training": profile.training.model_copy(update=training),
            "pinned": profile.pinned.model_copy(update=pinned),
        }
    )


def test_a_huge_global_batch_names_the_profile_and_the_field() -> None:
    seq_len = 16
    assert MAX_GRADIENT_ACCUMULATION_STEPS * MAX_MICRO_BATCH * seq_len * B200.gpus_per_node < MAX_GLOBAL_BATCH_TOKENS
    profile = _any_profile(seq_len=seq_len, global_batch_tokens=MAX_GLOBAL_BATCH_TOKENS)
    with pytest.raises(InfeasiblePlanError) as caught:
        plan_profile(profile, B200, 1)
    message = str(caught.value)
    assert message.startswith(f"profile {profile.name!r}: training.global_batch_tokens (")
    assert f"more than the {MAX_GRADIENT_ACCUMULATION_STEPS:,} allowed" in message and "\n" not in message


def test_a_pinned_micro_batch_that_forces_too_many_steps_names_the_pin() -> None:
    profile = _any_profile(seq_len=512, global_batch_tokens=MAX_GLOBAL_BATCH_TOKENS, micro_batch_size=1)
    with pytest.raises(InfeasiblePlanError, match=rf"^profile {profile.name!r}: pinned\.micro_batch_size \(1\): "):
        plan_profile(profile, B200, 1)


def test_candidates_beyond_the_bound_are_skipped_not_fatal() -> None:
    """Micro-batch 1 overflows the bound here but larger ones do not: the plan uses those, no baseline."""
    seq_len = 1024
    per_step = seq_len * B200.gpus_per_node
    batch = per_step * MAX_GRADIENT_ACCUMULATION_STEPS * 2
    profile = _any_profile(seq_len=seq_len, global_batch_tokens=min(batch, MAX_GLOBAL_BATCH_TOKENS))
    try:
        plan = plan_profile(profile, B200, 1)
    except InfeasiblePlanError as error:
        assert "GiB" in str(error)  # the profile does not fit this GPU at all: nothing to show here
        return
    assert plan.knobs.gradient_accumulation_steps <= MAX_GRADIENT_ACCUMULATION_STEPS
    assert plan.baseline is None
