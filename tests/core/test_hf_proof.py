"""An import proven on transformers' own model: full-size parameters on the meta device, logits of a scaled copy.

One real config of every supported ``model_type`` (tests/hf_configs, sources in SOURCES.md) passes with its
published count; the checks fail, in one line, where the architecture and transformers' model disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from btk.errors import BtkError
from btk.hf_import import FAMILIES, architecture_from_config
from btk.hf_proof import check_full_size, check_scaled_logits, prove_import, scaled_config

pytest.importorskip("transformers")
pytest.importorskip("torch")

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"


def _supported() -> dict[str, dict[str, Any]]:
    """The first fixture config (by file name) of each supported model type."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        if config.get("model_type") in FAMILIES and config["model_type"] not in found:
            try:
                architecture_from_config(config)
            except BtkError:
                continue
            found[config["model_type"]] = config
    return found


SUPPORTED = _supported()


def test_every_supported_model_type_has_a_fixture() -> None:
    assert set(SUPPORTED) == set(FAMILIES)


@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_each_model_type_is_proven_on_transformers_model(model_type: str) -> None:
    config = SUPPORTED[model_type]
    arch = architecture_from_config(config)
    proof = prove_import(config, arch)
    assert proof.parameter_count == arch.parameter_count
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert proof.model_class == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    assert proof.max_logit_gap <= 1e-4


@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_the_scaled_copy_keeps_the_structure(model_type: str) -> None:
    config = SUPPORTED[model_type]
    full = architecture_from_config(config)
    small = architecture_from_config(scaled_config(config, full))
    assert small.num_layers == 2 and small.parameter_count < 1_000_000
    for field in ("qk_norm", "norm_placement", "attention_bias", "attention_output_bias", "tied_embeddings",
                  "rope_theta", "rope_scaling", "rms_norm_eps"):
        assert getattr(small, field) == getattr(full, field), field
    assert (small.num_kv_heads < small.num_attention_heads) == (full.num_kv_heads < full.num_attention_heads)
    wide = full.effective_head_dim * full.num_attention_heads != full.hidden_size
    assert (small.effective_head_dim * small.num_attention_heads != small.hidden_size) == wide


def test_a_missing_parameter_is_named() -> None:
    """Qwen3 read without its per-head QK-norm: transformers' model has k_norm, the trainer's would not."""
    config = SUPPORTED["qwen3"]
    arch = architecture_from_config(config).model_copy(update={"qk_norm": "none"})
    with pytest.raises(BtkError, match=r"transformers' Qwen3ForCausalLM has model\.layers\.0\.self_attn\.k_norm"):
        check_full_size(config, arch)


def test_a_wrong_shape_is_named() -> None:
    config = SUPPORTED["llama"]
    arch = architecture_from_config(config)
    wider = arch.model_copy(update={"ffn_hidden_size": arch.ffn_hidden_size + 128})
    with pytest.raises(BtkError, match=r"model\.layers\.0\.mlp\.down_proj\.weight is \(\d+, \d+\) in transformers'"):
        check_full_size(config, wider)


def test_different_math_shows_in_the_logits() -> None:
    """Same parameters, another RoPE base: the shapes agree, the scaled copy's logits do not."""
    config = SUPPORTED["mistral"]
    small_config = scaled_config(config, architecture_from_config(config))
    small = architecture_from_config(small_config)
    with pytest.raises(BtkError, match=r"the trainer's logits differ from transformers' MistralForCausalLM by up to"):
        check_scaled_logits(small_config, small.model_copy(update={"rope_theta": small.rope_theta / 100}))


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_a_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """An install without the trainer's packages (`make synth` installs the CDK app's only)."""
    import sys

    config = SUPPORTED["llama"]
    arch = architecture_from_config(config)
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ImportError
    with pytest.raises(BtkError, match=rf"^btk profile import .*{missing}.* not installed"):
        check_full_size(config, arch)
