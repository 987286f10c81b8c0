"""Profiles: exact parameter counts and validation of bad profiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from btk.catalog import all_profiles, get_profile
from btk.errors import UnknownNameError
from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent


@pytest.mark.parametrize("name", sorted(all_profiles()))
def test_parameter_count_matches_published(name: str) -> None:
    profile = get_profile(name)
    assert profile.published_parameter_count is not None
    assert profile.parameter_count == profile.published_parameter_count


def test_catalog_spans_1b_to_64b() -> None:
    counts = sorted(p.parameter_count for p in all_profiles().values())
    assert len(counts) >= 6
    assert counts[0] < 1.5e9 and counts[-1] > 60e9


def test_unknown_profile_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError, match=r"did you mean llama3.1-8b"):
        get_profile("llama3.1-8")


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
    ],
)
def test_invalid_architecture_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace("(", r"\(").replace(")", r"\)")):
        ModelArchitecture.model_validate(_arch(**overrides))


def test_seq_len_above_max_context_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"training.seq_len \(1024\) exceeds architecture.max_context \(512\)"):
        ModelProfile(
            name="tiny",
            family="test",
            architecture=ModelArchitecture(**_arch()),  # type: ignore[arg-type]
            training=TrainingIntent(seq_len=1024, global_batch_tokens=4096),
        )


@settings(max_examples=200, deadline=None)
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
