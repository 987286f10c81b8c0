"""Profiles: exact parameter counts and validation of bad profiles."""

from __future__ import annotations

import re

import pytest
from example_budget import capped
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from btk.catalog import all_profiles, get_profile
from btk.errors import UnknownNameError, one_line
from btk.hardware import get_instance_type
from btk.knobs import TENSOR_PARALLEL_DEGREES, TrainingKnobs
from btk.planner.search import evaluate_knobs, plan_profile
from btk.profile import MIN_VOCAB_SIZE, ModelArchitecture, ModelProfile, TrainingIntent

PUBLISHED = sorted(name for name, profile in all_profiles().items() if profile.published_parameter_count is not None)


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_count_matches_published(name: str) -> None:
    """Profiles that state a published parameter count match it exactly (the others state none)."""
    profile = get_profile(name)
    assert profile.parameter_count == profile.published_parameter_count


def test_unknown_profile_suggests_close_names() -> None:
    known = sorted(all_profiles())[0]
    with pytest.raises(UnknownNameError, match=rf"did you mean .*{re.escape(known)}"):
        get_profile(known[:-1])


def _arch(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=128,
        vocab_size=256,
        max_context=512,
    )
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_attention_heads": 5}, "num_attention_heads (5) must divide hidden_size"),
        ({"num_kv_heads": 3}, "num_kv_heads (3) must divide num_attention_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"vocab_size": MIN_VOCAB_SIZE - 1}, "vocab_size"),
    ],
)
def test_invalid_architecture_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace("(", r"\(").replace(")", r"\)")):
        ModelArchitecture.model_validate(_arch(**overrides))


@pytest.mark.parametrize("tensor_parallel", TENSOR_PARALLEL_DEGREES)
def test_the_smallest_vocabulary_plans_at_every_tensor_parallel_degree(tensor_parallel: int) -> None:
    """The loss-parallel head gives each rank ``vocab // tp`` tokens: at the smallest valid vocabulary every degree the
    planner may choose still leaves each rank one (a vocabulary of 2-7 once passed validation and crashed the plan)."""
    arch = ModelArchitecture.model_validate(_arch(vocab_size=MIN_VOCAB_SIZE, num_attention_heads=8, num_kv_heads=8))
    profile = ModelProfile(name="tiny", family="test", architecture=arch,
                           training=TrainingIntent(seq_len=128, global_batch_tokens=1 << 15))
    instance = get_instance_type("ml.p6-b200.48xlarge")
    assert plan_profile(profile, instance, 1).knobs is not None
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=128, gradient_accumulation_steps=4,
                          tensor_parallel=tensor_parallel)
    assert evaluate_knobs(profile, instance, 1, knobs).memory.total > 0


def test_seq_len_above_max_context_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"training.seq_len \(1024\) exceeds architecture.max_context \(512\)"):
        ModelProfile(
            name="tiny",
            family="test",
            architecture=ModelArchitecture(**_arch()),  # type: ignore[arg-type]
            training=TrainingIntent(seq_len=1024, global_batch_tokens=4096),
        )


@settings(max_examples=capped(200), deadline=None)
@given(
    layers=st.integers(-2, 40),
    hidden=st.integers(-8, 4096),
    heads=st.integers(-1, 64),
    kv=st.integers(-1, 64),
    ffn=st.integers(-8, 20000),
    vocab=st.integers(-2, 200000),
    context=st.integers(-16, 200000),
    seq=st.integers(-16, 300000),
    batch=st.integers(-16, 10**7),
    name=st.text(max_size=12),
)
def test_random_profiles_validate_or_raise_validation_error(
    layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, context: int, seq: int, batch: int, name: str
) -> None:
    """Whatever the numbers, construction either succeeds or raises ValidationError — never
    ZeroDivisionError, TypeError or anything else."""
    try:
        profile = ModelProfile.model_validate(
            {
                "name": name,
                "family": "random",
                "architecture": _arch(
                    num_layers=layers,
                    hidden_size=hidden,
                    num_attention_heads=heads,
                    num_kv_heads=kv,
                    ffn_hidden_size=ffn,
                    vocab_size=vocab,
                    max_context=context,
                ),
                "training": {"seq_len": seq, "global_batch_tokens": batch},
            }
        )
    except ValidationError:
        return
    assert profile.parameter_count > 0
    assert profile.training.seq_len <= profile.architecture.max_context


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"architecture": _arch(num_attention_heads=5)}, "architecture.num_attention_heads: "),
        ({"architecture": _arch(num_kv_heads=3)}, "architecture.num_kv_heads: "),
        ({"training": {"seq_len": 1024, "global_batch_tokens": 4096}}, "training.seq_len: "),
        ({"training": {"seq_len": 256, "global_batch_tokens": 128}}, "training.global_batch_tokens: "),
        ({"pinned": {"tensor_parallel": 3}}, "pinned.tensor_parallel: "),
        ({"pinned": {"context_parallel": 3}}, "pinned.context_parallel: "),
        ({"pinned": {"context_parallel": 8}, "training": {"seq_len": 200, "global_batch_tokens": 4000}},
         "pinned.context_parallel: "),
        ({"pinned": {"context_parallel": 2, "sharding": "no_shard"}}, "pinned.context_parallel: "),
        ({"name": "tiny\n"}, "name: "),
    ],
)
def test_profile_errors_name_the_field_path_not_the_root(overrides: dict[str, object], field: str) -> None:
    values: dict[str, object] = {
        "name": "tiny", "family": "test", "architecture": _arch(),
        "training": {"seq_len": 256, "global_batch_tokens": 4096},
    }
    with pytest.raises(ValidationError) as caught:
        ModelProfile.model_validate({**values, **overrides})
    message = one_line(caught.value, root=ModelProfile)
    assert message.startswith(field) and "(root)" not in message


def test_a_nested_model_built_on_its_own_is_named_by_its_place_in_the_profile() -> None:
    with pytest.raises(ValidationError) as caught:
        ModelArchitecture.model_validate(_arch(num_attention_heads=5))
    assert one_line(caught.value, root=ModelProfile).startswith("architecture.num_attention_heads: ")
