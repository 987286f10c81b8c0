"""The architecture fields of the Qwen3 / Mistral NeMo / OLMo 2 / Granite / SmolLM3 / Phi-3 families: defaults,
validation, hyperparameters.

Their defaults must describe the block every earlier profile meant: stating them explicitly gives
the same architecture, the same plans and the same job hyperparameters as leaving them out, for
every profile of the user's catalog (whatever it holds). What the trainer does not implement is
refused at load in one line naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest
from architecture_defaults import with_explicit_defaults
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from btk.catalog import all_profiles
from btk.errors import BtkError, one_line
from btk.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type
from btk.hyperparameters import JobHyperparameters, JobSettings, from_hyperparameters, known_keys, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.planner.search import plan_profile
from btk.profile import HF_LAYOUTS, UNSUPPORTED_FEATURES, ModelArchitecture, ModelProfile, TrainingIntent

NEW_FIELDS = ModelArchitecture.LEFT_OUT_AT_DEFAULT


def _plan(profile: ModelProfile) -> Any:
    try:
        return plan_profile(profile, get_instance_type(DEFAULT_INSTANCE_TYPE), 1).to_json()
    except BtkError as error:  # a profile too big for one node fails the same way both times
        return str(error)


def _spec(profile: ModelProfile) -> JobHyperparameters:
    return JobHyperparameters(knobs=TrainingKnobs(micro_batch_size=1, seq_len=profile.training.seq_len),
                              architecture=profile.architecture, training=profile.training,
                              job=JobSettings(profile=profile.name))


@pytest.mark.parametrize("name", sorted(all_profiles()))
def test_explicit_defaults_plan_and_train_as_omitted_ones(name: str) -> None:
    profile = all_profiles()[name]
    explicit = with_explicit_defaults(profile)
    assert explicit == profile
    assert _plan(explicit) == _plan(profile)
    assert to_hyperparameters(_spec(explicit)) == to_hyperparameters(_spec(profile))


@pytest.mark.parametrize("name", sorted(all_profiles()))
def test_fields_at_their_default_are_left_out_of_the_job(name: str) -> None:
    profile = all_profiles()[name]
    encoded = to_hyperparameters(_spec(profile))
    for field in NEW_FIELDS:
        at_default = getattr(profile.architecture, field) == ModelArchitecture.model_fields[field].default
        assert (f"arch.{field}" not in encoded) == at_default
    assert from_hyperparameters(encoded) == _spec(profile)


layouts = st.sampled_from(sorted(HF_LAYOUTS))


@given(layouts, st.sampled_from([None, 8, 16, 32, 48]), st.booleans(), st.integers(1, 4))
def test_every_supported_layout_round_trips_through_hyperparameters(
    layout: tuple[str, str, bool, bool], head_dim: int | None, tied: bool, kv_heads: int
) -> None:
    qk_norm, placement, bias, output_bias = layout
    arch = ModelArchitecture(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=kv_heads if 4 % kv_heads == 0 else 1,
        ffn_hidden_size=96, vocab_size=128, max_context=256, tied_embeddings=tied, head_dim=head_dim,
        qk_norm=qk_norm, norm_placement=placement, attention_bias=bias, attention_output_bias=output_bias,
    )
    spec = JobHyperparameters(knobs=TrainingKnobs(micro_batch_size=1, seq_len=64), architecture=arch,
                              training=TrainingIntent(seq_len=64, global_batch_tokens=4096),
                              job=JobSettings(profile="layout"))
    encoded = to_hyperparameters(spec)
    assert set(encoded) <= set(known_keys())
    assert from_hyperparameters(encoded) == spec


def test_head_dim_is_honoured_in_the_count() -> None:
    """Mistral NeMo's shape: q and o are 5120 x 4096 (32 heads of 128), not 5120 x 5120."""
    wide = ModelArchitecture(num_layers=1, hidden_size=5120, num_attention_heads=32, num_kv_heads=8,
                             ffn_hidden_size=14336, vocab_size=1024, max_context=4096)
    nemo = wide.model_copy(update={"head_dim": 128})
    assert wide.parameters_per_layer - nemo.parameters_per_layer == 2 * 5120 * (5120 - 4096) + 2 * 5120 * 8 * 32


def _architecture(**changes: object) -> dict[str, object]:
    return {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 96,
            "vocab_size": 128, "max_context": 256, **changes}


def _profile_error(**changes: object) -> str:
    with pytest.raises(ValidationError) as caught:
        ModelProfile.model_validate({"name": "bad", "family": "t", "architecture": _architecture(**changes),
                                     "training": {"seq_len": 64, "global_batch_tokens": 4096}})
    return one_line(caught.value, root=ModelProfile)


@pytest.mark.parametrize("field", sorted(UNSUPPORTED_FEATURES))
def test_unsupported_features_are_refused_at_load_naming_the_field(field: str) -> None:
    message = _profile_error(**{field: 4096})
    assert message.startswith(f"architecture.{field}: ") and "is not supported by the trainer" in message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"norm_placement": "post"}, "architecture.norm_placement: "),
        ({"qk_norm": "projection"}, "architecture.qk_norm: "),
        ({"attention_output_bias": True}, "architecture.attention_output_bias: "),
        ({"qk_norm": "head", "attention_bias": True}, "architecture.attention_output_bias: "),
        ({"head_dim": 15}, "architecture.head_dim: "),
        ({"head_dim": 1}, "architecture.head_dim: "),
        ({"qk_norm": "both"}, "architecture.qk_norm: "),
        ({"hidden_size": 66}, "architecture.num_attention_heads: "),
        ({"embedding_multiplier": 12.0, "no_rope_interval": 4}, "architecture.no_rope_interval: "),
        ({"no_rope_interval": 4, "fused_projections": True}, "architecture.fused_projections: "),
        ({"logits_scaling": 16.0, "qk_norm": "head"}, "architecture.logits_scaling: "),
        ({"no_rope_interval": 4, "norm_placement": "post", "qk_norm": "projection"}, "architecture.no_rope_interval: "),
        ({"fused_projections": True, "attention_bias": True, "attention_output_bias": True},
         "architecture.fused_projections: "),
        ({"attention_multiplier": 0.0}, "architecture.attention_multiplier: "),
        ({"residual_multiplier": float("nan")}, "architecture.residual_multiplier: "),
        ({"no_rope_interval": 0}, "architecture.no_rope_interval: "),
        # Gemma's fields come with its block, and with each other as Gemma has them.
        ({"sliding_window": 4096}, "architecture.sliding_window: "),
        ({"attn_logit_softcapping": 50.0, "qk_norm": "head"}, "architecture.attn_logit_softcapping: "),
        ({"final_logit_softcapping": 30.0, "norm_placement": "post", "qk_norm": "projection"},
         "architecture.final_logit_softcapping: "),
        ({"norm_placement": "sandwich", "full_attention_interval": 2}, "architecture.full_attention_interval: "),
        ({"norm_placement": "sandwich", "sliding_window": 64, "local_rope_theta": 1e4},
         "architecture.local_rope_theta: "),
        ({"norm_placement": "sandwich", "qk_norm": "head", "local_rope_theta": 1e4}, "architecture.local_rope_theta: "),
        ({"norm_placement": "sandwich", "embedding_multiplier": 12.0}, "architecture.embedding_multiplier: "),
        ({"norm_placement": "sandwich", "qk_norm": "projection"}, "architecture.qk_norm: "),
        ({"norm_placement": "sandwich", "attn_logit_softcapping": 0.0}, "architecture.attn_logit_softcapping: "),
        ({"norm_placement": "sandwich", "sliding_window": 0}, "architecture.sliding_window: "),
        ({"norm_placement": "sandwich", "query_pre_attn_scalar": 1.5}, "architecture.query_pre_attn_scalar: "),
    ],
)
def test_layouts_no_family_has_are_refused_naming_the_field(changes: dict[str, object], field: str) -> None:
    message = _profile_error(**changes)
    assert message.startswith(field) and "\n" not in message


@given(st.sampled_from([None, 1, 2, 3, 4]), st.booleans(), st.sampled_from([1.0, 0.22]), st.integers(1, 12))
def test_the_added_fields_round_trip_through_hyperparameters(
    no_rope_interval: int | None, fused: bool, residual: float, layers: int
) -> None:
    """At most one family's additions at once (those are the architectures that exist); the job reads them back."""
    changes: dict[str, object] = ({"no_rope_interval": no_rope_interval} if no_rope_interval else
                                  {"fused_projections": True} if fused else {"residual_multiplier": residual})
    arch = ModelArchitecture.model_validate(_architecture(num_layers=layers, **changes))
    spec = JobHyperparameters(knobs=TrainingKnobs(micro_batch_size=1, seq_len=64), architecture=arch,
                              training=TrainingIntent(seq_len=64, global_batch_tokens=4096),
                              job=JobSettings(profile="added"))
    assert from_hyperparameters(to_hyperparameters(spec)) == spec
    blocks_without_rope = [index for index in range(layers) if not arch.uses_rope(index)]
    interval = arch.no_rope_interval
    assert blocks_without_rope == ([] if interval is None else list(range(interval - 1, layers, interval)))


def test_head_dim_frees_the_head_count_from_the_hidden_size() -> None:
    arch = ModelArchitecture.model_validate(_architecture(hidden_size=66, head_dim=16))
    assert arch.attention_width == 64 and arch.kv_dim == 32
