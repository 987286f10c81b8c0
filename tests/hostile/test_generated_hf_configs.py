"""Configs generated from transformers' own config classes: every accepted one is transformers' model.

For each supported ``model_type`` the base is its config class's defaults (``to_dict()`` of the class built with
no arguments: transformers' idea of the model type). Drawn from there: keys the class declares removed, set to
other values of their kind (an integer halved, doubled or small, a flag flipped, ``None``), and conflicting RoPE
settings (``rope_scaling`` beside ``rope_parameters``). Each config is either refused in one line
(:class:`BtkError`, transformers' own refusal included) or accepted, and an accepted one passes
:func:`btk.hf_proof.prove_import`: transformers' model of it has the trainer's parameters shape by shape and the
imported count, and a 2-layer copy's logits agree.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from example_budget import capped
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from btk.errors import BtkError
from btk.hf_import import FAMILIES, architecture_from_config
from btk.hf_proof import prove_import

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

#: Keys whose drawn values would only make transformers allocate a huge list (one entry per layer) or a huge
#: embedding; their bounds are checked in tests/core and tests/hostile/test_profile_import.py.
SIZE_KEYS = {"num_hidden_layers", "vocab_size", "max_position_embeddings"}
#: transformers' ids and bookkeeping, which change no parameter.
INERT_KEYS = {"bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "return_dict",
              "output_hidden_states", "output_attentions", "dtype", "torch_dtype", "transformers_version"}


def _base(model_type: str) -> dict[str, Any]:
    config = transformers.CONFIG_MAPPING[model_type]().to_dict()
    return {key: value for key, value in config.items() if not key.startswith("_")}


def _declared(model_type: str) -> list[str]:
    parameters = inspect.signature(transformers.CONFIG_MAPPING[model_type].__init__).parameters
    return sorted(name for name in parameters if name not in {"self", "kwargs"} | SIZE_KEYS | INERT_KEYS)


def _other_values(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, bool):
        return st.sampled_from([not value, None])
    if isinstance(value, int):
        return st.sampled_from(sorted({value // 2, value * 2, 0, 1, 2, 8, value + 1})) | st.none()
    if isinstance(value, float):
        return st.sampled_from([value / 2, value * 2, 0.0, 1.0]) | st.none()
    if isinstance(value, str):
        return st.sampled_from(["gelu", "relu", "default", "llama3", "linear", "yarn", value])
    return st.none()


@st.composite
def generated_configs(draw: st.DrawFn) -> dict[str, Any]:
    model_type = draw(st.sampled_from(sorted(FAMILIES)))
    config = _base(model_type)
    declared = _declared(model_type)
    for key in draw(st.lists(st.sampled_from(declared), max_size=2, unique=True)):
        config.pop(key, None)
    for key in draw(st.lists(st.sampled_from(declared), max_size=3, unique=True)):
        config[key] = draw(_other_values(config.get(key, 1)))
    if draw(st.booleans()):  # RoPE read two ways at once
        theta = draw(st.sampled_from([10_000.0, 500_000.0, 1_000_000.0]))
        config["rope_scaling"] = draw(st.sampled_from([
            None,
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 1024},
            {"rope_type": "linear", "factor": 2.0},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
            {"type": "yarn", "factor": 2.0, "beta_fast": 16, "attention_factor": 1.2},
        ]))
        config["rope_theta"] = theta
    return config


def _proven(config: dict[str, Any]) -> bool:
    """Whether ``config`` was accepted and proven (False: refused in one line); a mismatch fails."""
    try:
        arch = architecture_from_config(config)
    except BtkError as error:
        assert "\n" not in str(error)
        return False
    try:
        proof = prove_import(config, arch)
    except BtkError as error:  # transformers itself cannot build or run it: refused in one line, never a mismatch
        assert ("transformers cannot build the model it describes" in str(error)
                or "a 2-layer copy of the model does not run" in str(error)), str(error)
        return False
    assert proof.parameter_count == arch.parameter_count
    return True


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_config_class_defaults_are_accepted_and_proven(model_type: str) -> None:
    """The suite's base configs: every supported model type's defaults import (Mistral's default window is
    switched off: transformers' MistralConfig defaults to a 4,096-token window, which the trainer refuses)."""
    config = _base(model_type)
    if model_type == "mistral":
        config["sliding_window"] = None
    assert _proven(config)


@example({**_base("mistral"), "sliding_window": 0})  # a window of 0 tokens is a window, not none
@settings(max_examples=capped(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_configs())
def test_an_accepted_config_is_transformers_model(config: dict[str, Any]) -> None:
    event("accepted and proven" if _proven(config) else "refused in one line")
