"""Tiny architectures shared by the trainer tests and their worker processes.

A uniquely named module rather than ``conftest``: ``from conftest import ...`` resolves to
whichever test folder's conftest was imported first when several folders run together.
"""

from __future__ import annotations

from btk.profile import ModelArchitecture, RopeScaling


def tiny_llama(**overrides: object) -> ModelArchitecture:
    """A Llama-3-like toy: GQA, llama3 rope scaling, untied head."""
    values: dict[str, object] = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 96,
        "vocab_size": 128,
        "tied_embeddings": False,
        "max_context": 256,
        "attention_bias": False,
        "rope_theta": 500000.0,
        "rope_scaling": RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
        ),
        "rms_norm_eps": 1e-5,
    }
    values.update(overrides)
    return ModelArchitecture.model_validate(values)


def tiny_qwen(**overrides: object) -> ModelArchitecture:
    """A Qwen2-like toy: qkv bias, tied embeddings, no rope scaling."""
    values: dict[str, object] = {
        "attention_bias": True,
        "tied_embeddings": True,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
    }
    values.update(overrides)
    return tiny_llama(**values)
