"""A global batch that no micro-batch reaches within the accumulation bound is a one-line planner error."""

from __future__ import annotations

import dataclasses

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


# ---------------------------------------------------------------------------- the global batch is kept

NODE_COUNTS = (1, 2, 8, 16, 64)


def _catalogs() -> list[tuple[str, ModelProfile]]:
    from fixture_catalog import PROFILES

    return sorted({**{f"fixture:{k}": v for k, v in PROFILES.items()},
                   **{f"user:{k}": v for k, v in all_profiles().items()}}.items())


@pytest.mark.parametrize("nodes", NODE_COUNTS)
@pytest.mark.parametrize(("label", "profile"), _catalogs())
def test_plans_keep_the_profiles_global_batch(label: str, profile: ModelProfile, nodes: int) -> None:
    """At any node count the plan trains the profile's global batch, or the smallest batch the cluster can reach."""
    from btk.planner.search import enumerate_candidates

    try:
        plan = plan_profile(profile, B200, nodes)
    except InfeasiblePlanError as error:
        assert "\n" not in str(error)
        return
    target = profile.training.global_batch_tokens
    planned = plan.global_batch.planned_tokens
    if planned != target:  # only where no knob set this hardware runs reaches the target exactly
        reached = {candidate.estimate.global_batch_tokens for candidate in enumerate_candidates(profile, B200, nodes)}
        assert target not in reached and planned == min(tokens for tokens in reached if tokens > target)
    assert all(alternative.estimate.global_batch_tokens == planned for alternative in plan.alternatives)
    # the "why" lines compare with knob sets that train the same batch: none of them is faster than the plan
    assert not [line for line in plan.explanations if " is -" in line], plan.explanations


def test_more_nodes_do_not_grow_the_batch_when_a_smaller_micro_batch_reaches_it() -> None:
    """2,097,152 tokens of 8,192 on 16 nodes of 8 GPUs: micro-batch 2 reaches it exactly; 8 would train 4x as many."""
    profile = _any_profile(seq_len=8192, global_batch_tokens=2_097_152)
    try:
        plan = plan_profile(profile, B200, 16)
    except InfeasiblePlanError:
        pytest.skip("the user's smallest profile does not fit at seq_len 8192")
    assert plan.global_batch.planned_tokens == 2_097_152 and not plan.global_batch.rounded
    assert plan.knobs.micro_batch_size * plan.knobs.gradient_accumulation_steps * 128 // plan.knobs.tensor_parallel \
        == 256


def test_no_fitting_knob_set_at_the_batch_is_one_line_with_the_nearest_batches() -> None:
    """Micro-batches 1 and 2 (which reach 6 sequences per rank) made not to fit: 4 and 8 reach 4 or 8 sequences."""
    from btk.planner.search import InfeasiblePlanError as Infeasible
    from btk.planner.search import batch_constrained, enumerate_candidates

    profile = _any_profile(seq_len=1024, global_batch_tokens=1024 * 8 * 6)  # 6 sequences per rank on one node
    candidates = enumerate_candidates(profile, B200, 1)
    target = profile.training.global_batch_tokens
    crippled = [dataclasses.replace(c, budget_gib=0.0) if c.estimate.global_batch_tokens == target else c
                for c in candidates]
    with pytest.raises(Infeasible) as caught:
        batch_constrained(profile, B200, 1, crippled)
    message = str(caught.value)
    assert message.startswith(f"profile {profile.name!r}: training.global_batch_tokens (49,152) cannot be trained")
    assert "nearest global batches that fit are 32,768 or 65,536 tokens" in message and "\n" not in message
