"""A Hugging Face ``config.json`` as a model profile (``btk profile import``).

Reads the dense decoders the trainer implements — ``model_type`` llama, mistral, qwen2, qwen3
and olmo2, the way transformers' own config classes read them (defaults included) — into a
:class:`~btk.profile.ModelArchitecture`, and writes the profile out as a Python module to
commit or as JSON. Anything the trainer does not implement is refused in one line naming the
``config.json`` field: mixture-of-experts, sliding-window attention, logit soft-capping,
vision/audio towers, RoPE scaling other than Llama 3's, activations other than SiLU, MLP
biases, attention dropout, quantised checkpoints. The inverse, the ``config.json`` the trainer
exports, is ``btk_trainer.model.hf_config``; importing what it writes gives the same
architecture back (tested).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from btk.errors import BtkError, FieldError, printable
from btk.knobs import MAX_SEQ_LEN
from btk.profile import (
    PROFILE_NAME,
    UNSUPPORTED_FEATURES,
    ModelArchitecture,
    ModelProfile,
    RopeScaling,
    TrainingIntent,
)

FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen", "qwen3": "qwen", "olmo2": "olmo"}
"""The ``model_type`` values imported, with the profile ``family`` each gets."""

CONFIG_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "ffn_hidden_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_context": "max_position_embeddings",
    "tied_embeddings": "tie_word_embeddings",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "head_dim": "head_dim",
    "rope_scaling": "rope_scaling",
}
"""The ``config.json`` key each architecture field is read from (errors name the key)."""

REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings")

DEFAULT_ROPE_THETA = 10000.0
"""RoPE base when a config gives none: the default of every imported family's config class in transformers."""

DEFAULT_RMS_NORM_EPS = {"llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6, "qwen3": 1e-6, "olmo2": 1e-5}
"""``rms_norm_eps`` when a config gives none: the config classes' defaults (transformers 5.x)."""

DEFAULT_SEQ_LEN = 8192
"""Training sequence length an imported profile starts with (capped at the model's context)."""

DEFAULT_GLOBAL_BATCH_TOKENS = 4_194_304
"""Tokens per optimizer step an imported profile starts with (4M, as Llama 3.1 8B's profile)."""

DEFAULT_TOTAL_TOKENS = 100_000_000_000
"""Token budget an imported profile starts with (100B): edit it to the team's."""

_HF_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _present(value: Any) -> bool:
    """Whether a config value turns its feature on (``null``, ``false``, ``0``, empty containers do not)."""
    return value not in (None, False, 0, "", [], {})


def _refuse(key: str, why: str) -> BtkError:
    return BtkError(f"config.json: {key}: {why}")


def _check_features(config: Mapping[str, Any], model_type: str) -> None:
    """Refuse what the trainer does not implement, naming the config.json key."""
    for key, feature in UNSUPPORTED_FEATURES.items():
        if key in ("sliding_window", "layer_types"):
            continue  # present in many dense configs, switched off: checked per family below
        if _present(config.get(key)):
            raise _refuse(key, f"{feature} is not supported by the trainer")
    if _present(config.get("quantization_config")):
        raise _refuse("quantization_config", "quantized checkpoints are not supported; import the bf16 model's config")
    _check_sliding_window(config)
    if model_type not in FAMILIES:
        raise _refuse("model_type", f"{printable(repr(model_type))[:60]} is not supported; "
                      f"supported: {', '.join(FAMILIES)}")
    if config.get("hidden_act", "silu") != "silu":
        shown = printable(repr(config.get("hidden_act")))[:60]
        raise _refuse("hidden_act", f"{shown} is not supported (SwiGLU with silu only)")
    if _present(config.get("mlp_bias")):
        raise _refuse("mlp_bias", "MLP biases are not supported")
    if _present(config.get("attention_dropout")):
        raise _refuse("attention_dropout", "attention dropout is not supported; the trainer trains without dropout")
    if _present(config.get("clip_qkv")):
        raise _refuse("clip_qkv", "clipping q/k/v is not supported")
    if _present(config.get("use_mrope")):
        raise _refuse("use_mrope", "multimodal rotary embeddings are not supported")


def _check_sliding_window(config: Mapping[str, Any]) -> None:
    """Refuse a sliding window that applies to any layer, as transformers' config classes decide it."""
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and any(kind != "full_attention" for kind in layer_types):
        raise _refuse("layer_types", f"{UNSUPPORTED_FEATURES['layer_types']} is not supported by the trainer")
    window = config.get("sliding_window")
    if "use_sliding_window" in config:
        # Qwen2/Qwen3: the window is off unless use_sliding_window, and then only from layer max_window_layers on.
        layers = config.get("num_hidden_layers")
        first = config.get("max_window_layers", 28)
        slides = _present(config.get("use_sliding_window")) and _present(window)
        if slides and isinstance(layers, int) and isinstance(first, int) and first < layers:
            raise _refuse("use_sliding_window", "sliding-window attention is not supported by the trainer")
    elif _present(window):
        raise _refuse("sliding_window", "sliding-window attention is not supported by the trainer")


def _rope(config: Mapping[str, Any], model_type: str) -> tuple[Any, Any]:
    """(rope_theta, rope_scaling) from ``rope_theta``/``rope_scaling`` (transformers 4) or ``rope_parameters`` (5)."""
    parameters = config.get("rope_parameters")
    key = "rope_parameters" if isinstance(parameters, dict) else "rope_scaling"
    scaling = parameters if isinstance(parameters, dict) else config.get("rope_scaling")
    theta = config.get("rope_theta", DEFAULT_ROPE_THETA)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        theta = parameters["rope_theta"]
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise _refuse(key, f"expected an object or null, got {printable(repr(scaling))[:60]}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise _refuse(key, f"rope_type {printable(repr(kind))[:40]} is not supported (Llama 3 scaling only)")
    fields = {name: scaling.get(name) for name in RopeScaling.model_fields if name != "rope_type"}
    return theta, fields


def architecture_from_config(config: Any) -> ModelArchitecture:
    """The architecture a ``config.json`` describes; :class:`BtkError` naming the key on anything else."""
    if not isinstance(config, dict):
        raise BtkError(f"config.json: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise _refuse("model_type", "missing or not a string; a Hugging Face config.json names its model_type")
    _check_features(config, model_type)
    for key in REQUIRED_KEYS:
        if key not in config:
            raise _refuse(key, "missing")
    theta, scaling = _rope(config, model_type)
    bias = config.get("attention_bias", False)
    values: dict[str, Any] = {
        "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "num_attention_heads": config["num_attention_heads"],
        "num_kv_heads": config.get("num_key_value_heads") or config["num_attention_heads"],
        "ffn_hidden_size": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "max_context": config["max_position_embeddings"],
        "tied_embeddings": config.get("tie_word_embeddings", False),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS[model_type]),
        "head_dim": config.get("head_dim"),
        # Qwen2 builds q/k/v biases in and no output bias; the others put attention_bias on all four.
        "attention_bias": True if model_type == "qwen2" else bias,
        "attention_output_bias": False if model_type == "qwen2" else bias,
        "qk_norm": {"qwen3": "head", "olmo2": "projection"}.get(model_type, "none"),
        "norm_placement": "post" if model_type == "olmo2" else "pre",
    }
    try:
        # Strict: a JSON true is not 1 layer, a string is not a number.
        return ModelArchitecture.model_validate(values, strict=True)
    except ValidationError as error:
        raise BtkError(_config_error(error)) from None


def _config_error(error: ValidationError) -> str:
    """A ``ModelArchitecture`` validation error, each part named by the config.json key it was read from."""
    parts = []
    for item in error.errors():
        cause = item.get("ctx", {}).get("error")
        loc = [str(part) for part in item["loc"]] or ([cause.field] if isinstance(cause, FieldError) else [])
        if loc:
            loc[0] = CONFIG_KEYS.get(loc[0], loc[0])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc)}: {message}" if loc else message)
    return printable("config.json: " + "; ".join(parts))


def profile_from_config(config: Any, name: str) -> ModelProfile:
    """A profile of the ``config.json``'s model: its architecture, its parameter count, a training intent to edit."""
    if not PROFILE_NAME.fullmatch(name):
        raise BtkError(f"--name {printable(repr(name))}: a profile name is a lower-case slug of 2-63 characters "
                       "(letters, digits, '.', '-')")
    arch = architecture_from_config(config)
    seq_len = min(DEFAULT_SEQ_LEN, arch.max_context, MAX_SEQ_LEN)
    if seq_len < 16:
        raise _refuse("max_position_embeddings", f"{arch.max_context} leaves no room to train (16 tokens at least)")
    model_id = config.get("_name_or_path")
    hf_id = model_id if isinstance(model_id, str) and _HF_MODEL_ID.fullmatch(model_id) else None
    return ModelProfile(
        name=name,
        family=FAMILIES[config["model_type"]],
        architecture=arch,
        training=TrainingIntent(seq_len=seq_len, global_batch_tokens=max(DEFAULT_GLOBAL_BATCH_TOKENS, seq_len),
                                total_tokens=DEFAULT_TOTAL_TOKENS),
        published_parameter_count=arch.parameter_count,
        source=f"huggingface.co/{hf_id} config.json" if hf_id else "a Hugging Face config.json",
        hf_model_id=hf_id,
    )


def _python(value: Any) -> str:
    """A literal for the generated module: big integers with underscores, floats as ``repr`` (exact), strings in
    double quotes (JSON's escapes are Python's)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    return repr(value)


def _arguments(values: Mapping[str, Any], indent: str) -> str:
    return "".join(f"{indent}{key}={text},\n" for key, text in values.items())


def _architecture_source(arch: ModelArchitecture) -> str:
    """``ModelArchitecture(...)`` with every field but those at their default."""
    fields = ModelArchitecture.model_fields
    values: dict[str, str] = {}
    for key in fields:
        value = getattr(arch, key)
        if not fields[key].is_required() and value == fields[key].default:
            continue
        if isinstance(value, RopeScaling):
            inner = _arguments({k: _python(v) for k, v in value.model_dump().items() if k != "rope_type"}, " " * 12)
            values[key] = f"RopeScaling(\n{inner}        )"
        else:
            values[key] = _python(value)
    return f"ModelArchitecture(\n{_arguments(values, ' ' * 8)}    )"


def variable_name(profile_name: str) -> str:
    """The module-level name of a profile: ``qwen3-8b`` -> ``QWEN3_8B``."""
    name = re.sub(r"[^A-Z0-9]+", "_", profile_name.upper()).strip("_")
    return name if name[:1].isalpha() else f"PROFILE_{name}"


def profile_module(profile: ModelProfile) -> str:
    """Python source of a profiles/ module holding ``profile`` (what ``btk profile import`` prints)."""
    variable = variable_name(profile.name)
    arch = profile.architecture
    imports = ["ModelArchitecture", "ModelProfile", "TrainingIntent"] + (["RopeScaling"] if arch.rope_scaling else [])
    training = profile.training
    hf_id = f"    hf_model_id={_python(profile.hf_model_id)},\n" if profile.hf_model_id else ""
    return (
        f'"""{profile.name}: imported from a Hugging Face config.json with `btk profile import`.\n'
        "\n"
        "The architecture and its parameter count come from the config; the training intent is a\n"
        "starting point to edit. Save this module in profiles/ and list it in FAMILY_MODULES\n"
        '(profiles/__init__.py), or move the profile into a family module\'s PROFILES tuple.\n"""\n'
        "\n"
        "from __future__ import annotations\n"
        "\n"
        f"from btk.profile import {', '.join(sorted(imports))}\n"
        "\n"
        f"{variable} = ModelProfile(\n"
        f"    name={_python(profile.name)},\n"
        f"    family={_python(profile.family)},\n"
        f"    architecture={_architecture_source(arch)},\n"
        "    training=TrainingIntent(  # what you want to train: edit to the run you plan\n"
        f"        seq_len={_python(training.seq_len)},\n"
        f"        global_batch_tokens={_python(training.global_batch_tokens)},\n"
        f"        total_tokens={_python(training.total_tokens)},\n"
        "    ),\n"
        "    # Counted from the config: check it against the count the model card or its safetensors index gives.\n"
        f"    published_parameter_count={_python(profile.published_parameter_count)},\n"
        f"    source={_python(profile.source)},\n"
        f"{hf_id}"
        ")\n"
        "\n"
        f"PROFILES = ({variable},)\n"
    )
