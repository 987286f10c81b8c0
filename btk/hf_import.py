"""A Hugging Face ``config.json`` as a model profile (``btk profile import``).

Reads the dense decoders the trainer implements — ``model_type`` llama, mistral, qwen2, qwen3, olmo2, granite,
smollm3, phi3, gemma2 and gemma3_text — into a :class:`~btk.profile.ModelArchitecture` through transformers' own
config class for the model type (the pinned release, :data:`TRANSFORMERS_PIN`): every default, alias
(``rope_scaling`` read into ``rope_parameters``) and validation is transformers', and a key the class does not
declare is never read (Mistral's ``attention_bias``). What stays written here is the modelling code's structure
per model type (Qwen2's q/k/v biases, Qwen3's per-head and OLMo 2's per-projection QK-norm, OLMo 2's norms after
the sublayers, Phi-3's fused projections, Gemma's four norms per block); what the families add to Llama's block
is read from their own config keys (Granite's four multipliers, SmolLM3's ``no_rope_layers`` as every n-th
block, Gemma's windows from ``layer_types`` as every n-th block full, its soft caps, query scale and Gemma 3's
RoPE per attention type). ``head_dim`` is read as every family's modelling code reads it, whether the config
class declares it or not. The profile is written out as a Python module to commit or as JSON. Anything the
trainer does not implement is refused naming every ``config.json`` field at fault in one line:
mixture-of-experts, sliding-window attention outside Gemma (as transformers decides it: Mistral's default
window, Qwen's ``use_sliding_window``), Gemma's windows in any pattern but every n-th block full, bidirectional
attention, vision/audio towers, RoPE scaling other than Llama 3's, YaRN and linear, RoPE on part of a head,
activations other than SiLU (Gemma's: its tanh GELU), MLP biases, attention, residual or embedding dropout,
blocks without RoPE in any pattern but every n-th, quantised checkpoints. The inverse, the ``config.json`` the
trainer exports, is ``btk_trainer.model.hf_config``; importing what it writes gives the same architecture back
(tested).
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import re
import textwrap
import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from btk.errors import BtkError, FieldError, field_path, printable
from btk.knobs import MAX_SEQ_LEN
from btk.profile import (
    PROFILE_NAME,
    UNSUPPORTED_FEATURES,
    LinearRopeScaling,
    ModelArchitecture,
    ModelProfile,
    RopeScaling,
    TrainingIntent,
    YarnRopeScaling,
)

FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen", "qwen3": "qwen", "olmo2": "olmo",
            "granite": "granite", "smollm3": "smollm", "phi3": "phi", "gemma2": "gemma", "gemma3_text": "gemma"}
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
    "embedding_multiplier": "embedding_multiplier",
    "attention_multiplier": "attention_multiplier",
    "residual_multiplier": "residual_multiplier",
    "logits_scaling": "logits_scaling",
    "no_rope_interval": "no_rope_layers",
    "sliding_window": "sliding_window",
    "full_attention_interval": "layer_types",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "local_rope_theta": "rope_local_base_freq",
}
"""The ``config.json`` key each architecture field is read from (errors name the key)."""

GEMMA_TYPES = ("gemma2", "gemma3_text")
"""The model types whose block is Gemma's (``norm_placement`` ``sandwich``)."""

GEMMA_ACTIVATION = "gelu_pytorch_tanh"
"""Gemma's GeGLU activation as transformers names it (``F.gelu(..., approximate="tanh")``)."""

REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings")

TRANSFORMERS_PIN = "5.23.0"
"""The transformers release whose config classes read the files (pyproject.toml pins the same)."""

DEFAULT_SEQ_LEN = 8192
"""Training sequence length an imported profile starts with (capped at the model's context)."""

DEFAULT_GLOBAL_BATCH_TOKENS = 4_194_304
"""Tokens per optimizer step an imported profile starts with (4M, as Llama 3.1 8B's profile)."""

DEFAULT_TOTAL_TOKENS = 100_000_000_000
"""Token budget an imported profile starts with (100B): edit it to the team's."""

SAFETENSORS_INDEX = "model.safetensors.index.json"
"""A sharded checkpoint's index beside ``config.json``: its ``metadata.total_size`` gives the published count."""

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

_HF_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _present(value: Any) -> bool:
    """Whether a config value turns its feature on (``null``, ``false``, ``0``, empty containers do not)."""
    return value not in (None, False, 0, "", [], {})


def _refusal(key: str, why: str) -> str:
    return f"{key}: {why}"


def _refuse(key: str, why: str) -> BtkError:
    return BtkError(printable(f"config.json: {key}: {why}"))


def _unsupported_keys(config: Mapping[str, Any], model_type: Any) -> list[str]:
    """What the trainer does not implement, read from the file's own keys (each as ``key: why``)."""
    problems = []
    for key, feature in UNSUPPORTED_FEATURES.items():
        if key in ("sliding_window", "layer_types"):
            continue  # present in many dense configs, switched off: transformers' config class decides
        if _present(config.get(key)):
            hint = " (--language-model imports its language model alone)" if key == "text_config" else ""
            problems.append(_refusal(key, f"{feature} is not supported by the trainer{hint}"))
    if _present(config.get("quantization_config")):
        problems.append(_refusal("quantization_config",
                                 "quantized checkpoints are not supported; import the bf16 model's config"))
    if model_type not in FAMILIES:
        problems.append(_refusal("model_type", f"{printable(repr(model_type))[:60]} is not supported; "
                                 f"supported: {', '.join(FAMILIES)}"))
    return problems


def import_transformers() -> Any:
    """The transformers package, its log quieted; :class:`BtkError` in one line when it is not installed."""
    try:
        import transformers
    except ImportError:
        raise BtkError("btk profile import reads configs with transformers, which is not installed: "
                       f"pip install transformers=={TRANSFORMERS_PIN} (make setup installs it)") from None
    # After the import, which sets its library logger's level: its notes on keys it keeps unread (a model type's
    # config class given another type's keys) speak to code that writes configs, not to this command's user.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers


def said(error: BaseException) -> str:
    """What a third-party exception says, on one line and at most 240 characters."""
    return " ".join(str(error).split())[:240]


def _transformers_config(config: Mapping[str, Any], model_type: str) -> Any:
    """The config as transformers' own config class for ``model_type`` reads it (its defaults, its aliases, its
    validation), None for a model type transformers does not know; :class:`BtkError` when transformers is
    missing or its class refuses the file."""
    CONFIG_MAPPING = import_transformers().CONFIG_MAPPING  # noqa: N806 (transformers' own name)
    if model_type not in CONFIG_MAPPING:
        return None
    config_class = CONFIG_MAPPING[model_type]
    try:
        with warnings.catch_warnings():  # its deprecation notes (rope_scaling) speak to code writing configs
            warnings.simplefilter("ignore")
            return config_class(**copy.deepcopy(dict(config)))  # the class edits nested values in place
    except Exception as error:  # transformers' validation of the user's file: whatever it raises is its refusal
        raise BtkError(printable(f"config.json: transformers' {config_class.__name__} refuses it: {said(error)}")
                       ) from None


def language_model_config(config: Any) -> dict[str, Any]:
    """The language model's ``config.json`` inside a multimodal one (its ``text_config``), as transformers' config
    class of the wrapper reads it: every default of the text model filled in (Gemma 3 4B-27B leave most keys to
    them), for ``btk profile import --language-model``. The vision tower is left out."""
    if not isinstance(config, dict):
        raise BtkError(f"config.json: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(config.get("text_config"), dict) or not isinstance(model_type, str):
        raise _refuse("text_config", "--language-model reads the text_config of a multimodal model's config; "
                      "this one has none (import it without --language-model)")
    CONFIG_MAPPING = import_transformers().CONFIG_MAPPING  # noqa: N806 (transformers' own name)
    if model_type not in CONFIG_MAPPING:
        raise _refuse("model_type", f"{printable(repr(model_type))[:60]} is not a model type transformers knows")
    config_class = CONFIG_MAPPING[model_type]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            given = {key: value for key, value in config.items() if key != "model_type"}
            wrapper = config_class(**copy.deepcopy(given))
            text = wrapper.text_config.to_dict()
    except Exception as error:  # transformers' validation of the user's file: whatever it raises is its refusal
        raise BtkError(printable(f"config.json: transformers' {config_class.__name__} refuses it: {said(error)}")
                       ) from None
    language_model = {key: value for key, value in text.items() if not key.startswith("_")}
    if isinstance(config.get("_name_or_path"), str):
        language_model["_name_or_path"] = config["_name_or_path"]
    return language_model


def _declares(hf: Any, field: str) -> bool:
    """Whether the model type's config class has ``field`` (a key it does not declare is kept but never read)."""
    return field in inspect.signature(type(hf).__init__).parameters


DROPOUT_KEYS = {"attention_dropout": "attention dropout", "resid_pdrop": "residual dropout",
                "embd_pdrop": "embedding dropout"}
"""The dropout a config may ask for. The trainer trains without dropout: a config that asks for some is refused,
unless the import is told to leave it out (``btk profile import --without-dropout``); the architecture, its
parameters and its logits are the same either way (dropout acts in training only)."""


def dropout_left_out(config: Mapping[str, Any]) -> list[str]:
    """The dropout ``config`` asks for, as transformers' config class reads it (``key value``), which an import
    ``without_dropout`` leaves out."""
    model_type = config.get("model_type")
    hf = _transformers_config(config, model_type) if isinstance(model_type, str) else None
    if hf is None:
        return []
    return [f"{key} {getattr(hf, key)!r}" for key in DROPOUT_KEYS
            if _declares(hf, key) and _present(getattr(hf, key, None))]


def _unsupported_readings(hf: Any, model_type: str, without_dropout: bool = False) -> list[str]:
    """What the trainer does not implement, as transformers reads the config (windows, RoPE, activation)."""
    problems = []
    layer_types = getattr(hf, "layer_types", None) if _declares(hf, "layer_types") else None
    if model_type in GEMMA_TYPES:
        problems += _gemma_problems(hf)
    elif isinstance(layer_types, list):
        if any(kind != "full_attention" for kind in layer_types):
            key = "use_sliding_window" if _declares(hf, "use_sliding_window") else "layer_types"
            problems.append(_refusal(key, "sliding-window attention is not supported by the trainer"))
    elif _declares(hf, "sliding_window") and getattr(hf, "sliding_window", None) is not None:  # 0 is a window
        problems.append(_refusal("sliding_window", f"sliding-window attention ({hf.sliding_window} tokens, as "
                                 f"transformers' {type(hf).__name__} reads it) is not supported by the trainer"))
    rope = _full_attention_rope(hf)
    kind = rope.get("rope_type", "default")
    if kind not in ("default", "llama3", "yarn", "linear"):
        problems.append(_refusal("rope_parameters", f"rope_type {printable(repr(kind))[:40]} is not supported "
                                 "(Llama 3's scaling, YaRN and linear only)"))
    factor = rope.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))
    if factor not in (None, 1, 1.0):
        problems.append(_refusal("partial_rotary_factor", f"{printable(repr(factor))[:40]}: rotary embeddings on "
                                 "part of each head are not supported"))
    if model_type not in GEMMA_TYPES and getattr(hf, "hidden_act", "silu") != "silu":
        shown = printable(repr(hf.hidden_act))[:60]
        problems.append(_refusal("hidden_act", f"{shown} is not supported (SwiGLU with silu only)"))
    if model_type == "smollm3":
        flags = getattr(hf, "no_rope_layers", None)
        if not isinstance(flags, list) or len(flags) != hf.num_hidden_layers or any(f not in (0, 1) for f in flags):
            problems.append(_refusal("no_rope_layers", f"expected one 0 or 1 per layer ({hf.num_hidden_layers})"))
        elif _no_rope_interval(hf) == 0:
            problems.append(_refusal("no_rope_layers", "blocks without RoPE other than every n-th block are not "
                                     "supported"))
    refused = {"mlp_bias": "MLP biases are not supported", "clip_qkv": "clipping q/k/v is not supported",
               "use_mrope": "multimodal rotary embeddings are not supported"}
    if not without_dropout:
        refused |= {key: f"{what} is not supported (the trainer trains without dropout: --without-dropout imports "
                    "the model to train without it)" for key, what in DROPOUT_KEYS.items()}
    for key, why in refused.items():
        if _declares(hf, key) and _present(getattr(hf, key, None)):
            problems.append(_refusal(key, why))
    return problems


def _gemma_problems(hf: Any) -> list[str]:
    """What a Gemma 2/3 config asks for that the trainer does not implement: another activation, bidirectional
    attention, windows in another pattern than every n-th block full, a windowed block without a window, RoPE
    scaling on the windowed blocks."""
    problems = []
    activation = getattr(hf, "hidden_activation", None)
    if activation != GEMMA_ACTIVATION:
        problems.append(_refusal("hidden_activation", f"{printable(repr(activation))[:60]} is not supported (Gemma's "
                                 f"GeGLU with {GEMMA_ACTIVATION} only)"))
    if _present(getattr(hf, "use_bidirectional_attention", None)):
        problems.append(_refusal("use_bidirectional_attention", "bidirectional attention is not supported (a causal "
                                 "language model attends to earlier positions only)"))
    interval = _full_attention_interval(hf)
    if interval == 0:
        problems.append(_refusal("layer_types", "windowed and full blocks in any pattern but every n-th block full "
                                 "are not supported"))
    elif interval != "full" and getattr(hf, "sliding_window", None) is None:
        problems.append(_refusal("sliding_window", "null, while layer_types has windowed blocks"))
    local = (getattr(hf, "rope_parameters", None) or {}).get("sliding_attention")
    if isinstance(local, dict) and local.get("rope_type", "default") != "default":
        problems.append(_refusal("rope_parameters", f"sliding_attention: rope_type "
                                 f"{printable(repr(local.get('rope_type')))[:40]} is not supported (the windowed "
                                 "blocks rotate unscaled)"))
    return problems


def _full_attention_interval(hf: Any) -> int | str | None:
    """Gemma's ``layer_types`` as the trainer reads them: ``"full"`` when no block is windowed, None when every block
    is, n when every n-th block is full and the others windowed, 0 for any other pattern."""
    kinds = list(getattr(hf, "layer_types", None) or [])
    if all(kind == "full_attention" for kind in kinds):
        return "full"
    if all(kind == "sliding_attention" for kind in kinds):
        return None
    if any(kind not in ("full_attention", "sliding_attention") for kind in kinds):
        return 0
    interval = kinds.index("full_attention") + 1
    expected = ["full_attention" if (index + 1) % interval == 0 else "sliding_attention" for index in range(len(kinds))]
    return interval if kinds == expected else 0


def _gemma_fields(hf: Any, model_type: str) -> dict[str, Any]:
    """The Gemma fields of the architecture (none for other model types)."""
    if model_type not in GEMMA_TYPES:
        return {}
    interval = _full_attention_interval(hf)
    windowed = interval != "full"
    local = (getattr(hf, "rope_parameters", None) or {}).get("sliding_attention")
    local_theta = local.get("rope_theta") if isinstance(local, dict) and model_type == "gemma3_text" else None
    return {
        "sliding_window": hf.sliding_window if windowed else None,
        "full_attention_interval": interval if windowed else None,
        "attn_logit_softcapping": hf.attn_logit_softcapping,
        "final_logit_softcapping": hf.final_logit_softcapping,
        "query_pre_attn_scalar": hf.query_pre_attn_scalar,
        "local_rope_theta": local_theta if windowed else None,
    }


def _full_attention_rope(hf: Any) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of the blocks that attend to the whole context (Gemma 3 keeps one per
    attention type; every other model type one for all)."""
    rope = getattr(hf, "rope_parameters", None) or {}
    full = rope.get("full_attention")
    return dict(full) if isinstance(full, dict) else dict(rope)


def _no_rope_interval(hf: Any) -> int | None:
    """The n of SmolLM3's ``no_rope_layers`` (0 marks a block without RoPE) when it is every n-th block, None when
    every block has RoPE, 0 for any other pattern."""
    flags = list(getattr(hf, "no_rope_layers", None) or [])
    if all(flags):
        return None
    interval = next(index for index, flag in enumerate(flags) if not flag) + 1
    return interval if flags == [int((index + 1) % interval != 0) for index in range(len(flags))] else 0


def _granite_scalars(hf: Any, model_type: str) -> dict[str, Any]:
    """Granite's four multipliers as architecture fields (transformers' defaults when the file leaves them out)."""
    if model_type != "granite":
        return {}
    return {"embedding_multiplier": hf.embedding_multiplier, "attention_multiplier": hf.attention_multiplier,
            "residual_multiplier": hf.residual_multiplier, "logits_scaling": hf.logits_scaling}


def _rope(hf: Any) -> tuple[Any, Any]:
    """(rope_theta, rope_scaling fields or None) of transformers' ``rope_parameters``; YaRN's ``factor`` left
    out is the ratio of the two contexts, as transformers computes it."""
    rope = _full_attention_rope(hf)
    theta = rope.get("rope_theta")
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, {name: rope.get(name) for name in LinearRopeScaling.model_fields}
    if kind != "yarn":
        return theta, {name: rope.get(name) for name in RopeScaling.model_fields}
    fields = {name: rope[name] for name in YarnRopeScaling.model_fields if rope.get(name) is not None}
    original = rope.get("original_max_position_embeddings")
    if fields.get("factor") is None and isinstance(original, int) and original > 0:
        fields["factor"] = hf.max_position_embeddings / original
    return theta, fields


def _max_context(hf: Any, scaling: Any) -> Any:
    """The longest sequence the model is built for: ``max_position_embeddings``, or the context YaRN scales to when
    longer (Qwen2.5's model cards keep 32,768 beside a factor of 4 for 131,072)."""
    if not isinstance(scaling, dict) or scaling.get("rope_type") != "yarn":
        return hf.max_position_embeddings
    try:
        return max(hf.max_position_embeddings, YarnRopeScaling.model_validate(scaling).scaled_context)
    except (ValidationError, TypeError):  # the architecture's validation names the field
        return hf.max_position_embeddings


def architecture_from_config(config: Any, *, without_dropout: bool = False) -> ModelArchitecture:
    """The architecture a ``config.json`` describes, read by transformers' config class for its ``model_type``.

    Every default (a key the file leaves out) is that class's: Qwen3's ``head_dim`` 128, Mistral's 8 key/value
    heads and 4,096-token window. Every reason the trainer cannot take the model is named at once, in one line
    (:class:`BtkError`); dropout among them unless ``without_dropout`` (:data:`DROPOUT_KEYS`).
    """
    if not isinstance(config, dict):
        raise BtkError(f"config.json: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise _refuse("model_type", "missing or not a string; a Hugging Face config.json names its model_type")
    problems = _unsupported_keys(config, model_type)
    problems += [_refusal(key, "missing") for key in REQUIRED_KEYS if key not in config]
    depth = _depth_problem(config.get("num_hidden_layers"))
    if depth is not None:  # config classes build a list per layer: a depth past the bound is not handed over
        raise _refusals([*problems, depth])
    hf = _transformers_config(config, model_type)  # any model type transformers knows, to name every reason
    if hf is not None:
        problems += _unsupported_readings(hf, model_type, without_dropout)
    if problems or hf is None:
        raise _refusals(problems)
    theta, scaling = _rope(hf)
    bias = bool(getattr(hf, "attention_bias", False)) if _declares(hf, "attention_bias") else False
    values: dict[str, Any] = {
        "num_layers": hf.num_hidden_layers,
        "hidden_size": hf.hidden_size,
        "num_attention_heads": hf.num_attention_heads,
        "num_kv_heads": getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        "ffn_hidden_size": hf.intermediate_size,
        "vocab_size": hf.vocab_size,
        "max_context": _max_context(hf, scaling),
        "tied_embeddings": hf.tie_word_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": hf.rms_norm_eps,
        # Read as every supported family's modelling code reads it, declared by the class or not (None: derived).
        "head_dim": getattr(hf, "head_dim", None),
        # The modelling code's structure (not a default): Qwen2 builds q/k/v biases and no output bias whatever
        # the config says; the others put attention_bias on all four, where their config class declares it.
        "attention_bias": True if model_type == "qwen2" else bias,
        "attention_output_bias": False if model_type == "qwen2" else bias,
        "qk_norm": {"qwen3": "head", "olmo2": "projection", "gemma3_text": "head"}.get(model_type, "none"),
        "norm_placement": {"olmo2": "post", "gemma2": "sandwich", "gemma3_text": "sandwich"}.get(model_type, "pre"),
        **_granite_scalars(hf, model_type),
        **_gemma_fields(hf, model_type),
        "no_rope_interval": _no_rope_interval(hf) if model_type == "smollm3" else None,
        "fused_projections": model_type == "phi3",
    }
    if values["num_kv_heads"] == 0 or getattr(hf, "num_key_value_heads", 1) == 0:
        raise _refuse("num_key_value_heads", "0: a model has at least one key/value head")
    try:
        # Strict: a JSON true is not 1 layer, a string is not a number.
        return ModelArchitecture.model_validate(values, strict=True)
    except ValidationError as error:
        raise BtkError(_config_error(error)) from None


def _depth_problem(layers: Any) -> str | None:
    """``num_hidden_layers`` outside the whole numbers :class:`ModelArchitecture` takes (absent: already said)."""
    bounds = {type(item).__name__: item for item in ModelArchitecture.model_fields["num_layers"].metadata}
    low, high = bounds["Ge"].ge, bounds["Le"].le
    if layers is None or (isinstance(layers, int) and not isinstance(layers, bool) and low <= layers <= high):
        return None
    return _refusal("num_hidden_layers", f"{printable(repr(layers))[:40]}: a whole number from {low} to {high}")


def _refusals(problems: list[str]) -> BtkError:
    """Every reason at once, in one line."""
    return BtkError(printable("config.json: " + "; ".join(problems)))


def _config_error(error: ValidationError) -> str:
    """A ``ModelArchitecture`` validation error, each part named by the config.json key it was read from."""
    parts = []
    for item in error.errors():
        cause = item.get("ctx", {}).get("error")
        path = field_path(ModelArchitecture, tuple(item["loc"]))  # without a discriminated union's tag
        loc = [*(path.split(".") if path else []), *([cause.field] if isinstance(cause, FieldError) else [])]
        if loc:
            loc[0] = CONFIG_KEYS.get(loc[0], loc[0])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc)}: {message}" if loc else message)
    return printable("config.json: " + "; ".join(parts))


def published_count_from_index(index: Any, config: Mapping[str, Any]) -> int:
    """The parameter count a checkpoint's ``model.safetensors.index.json`` gives: ``metadata.total_size`` (the bytes
    of every tensor it stores, a tied head once) over the bytes per parameter of the config's ``dtype``."""
    metadata = index.get("metadata") if isinstance(index, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise BtkError(f"{SAFETENSORS_INDEX}: metadata.total_size: expected the checkpoint's size, a positive whole "
                       f"number of bytes; got {printable(repr(total))[:40]}")
    key = "dtype" if "dtype" in config else "torch_dtype"
    dtype = config.get(key)
    if dtype not in _DTYPE_BYTES:
        raise BtkError(printable(f"config.json: {key}: {repr(dtype)[:40]} does not give the bytes per parameter that "
                                 f"{SAFETENSORS_INDEX}'s total_size is counted in; expected one of "
                                 f"{', '.join(_DTYPE_BYTES)}"))
    if total % _DTYPE_BYTES[dtype]:
        raise BtkError(f"{SAFETENSORS_INDEX}: metadata.total_size: {total:,} bytes is not a whole number of {dtype} "
                       "parameters")
    return total // _DTYPE_BYTES[dtype]


def profile_from_config(config: Any, name: str, published: int | None = None, *,
                        without_dropout: bool = False) -> ModelProfile:
    """A profile of the ``config.json``'s model: its architecture, a training intent to edit, and ``published``
    (the count the checkpoint's index gives: :func:`published_count_from_index`) as its published count, which
    the architecture must give; without one the count is unverified (``published_parameter_count`` None)."""
    if not PROFILE_NAME.fullmatch(name):
        raise BtkError(f"--name {printable(repr(name))}: a profile name is a lower-case slug of 2-63 characters "
                       "(letters, digits, '.', '-')")
    arch = architecture_from_config(config, without_dropout=without_dropout)
    seq_len = min(DEFAULT_SEQ_LEN, arch.max_context, MAX_SEQ_LEN)
    if seq_len < 16:
        raise _refuse("max_position_embeddings", f"{arch.max_context} leaves no room to train (16 tokens at least)")
    if published is not None and published != arch.parameter_count:
        raise BtkError(f"{SAFETENSORS_INDEX}: the checkpoint holds {published:,} parameters, the config's "
                       f"architecture {arch.parameter_count:,} ({arch.parameter_count - published:+,}): the config is "
                       "not the checkpoint's, or the trainer reads it differently")
    model_id = config.get("_name_or_path")
    hf_id = model_id if isinstance(model_id, str) and _HF_MODEL_ID.fullmatch(model_id) else None
    return ModelProfile(
        name=name,
        family=FAMILIES[config["model_type"]],
        architecture=arch,
        training=TrainingIntent(seq_len=seq_len, global_batch_tokens=max(DEFAULT_GLOBAL_BATCH_TOKENS, seq_len),
                                total_tokens=DEFAULT_TOTAL_TOKENS),
        published_parameter_count=published,
        source=f"huggingface.co/{hf_id} config.json" if hf_id else "a Hugging Face config.json",
        hf_model_id=hf_id,
    )


LANGUAGE_MODEL_NOTE = ("Imported with --language-model: the language model of a multimodal model's config.json (its "
                       "text_config); the vision tower is left out, and so is the checkpoint's index, which counts it. "
                       "The trainer's job.init_from loads a text-only checkpoint of it.")


def _left_out_note(left_out: list[str]) -> str:
    return (f"Imported with --without-dropout: the config's {', '.join(left_out)} is left out; the trainer trains "
            "without dropout (the architecture, its parameters and its logits are the same).")


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
        if isinstance(value, RopeScaling | YarnRopeScaling | LinearRopeScaling):
            given = value.model_dump(exclude_defaults=True, exclude={"rope_type"})
            inner = _arguments({k: _python(v) for k, v in given.items()}, " " * 12)
            values[key] = f"{type(value).__name__}(\n{inner}        )"
        else:
            values[key] = _python(value)
    return f"ModelArchitecture(\n{_arguments(values, ' ' * 8)}    )"


def _published_count_source(profile: ModelProfile) -> str:
    """The ``published_parameter_count`` line of a generated module, with where the count comes from."""
    if profile.published_parameter_count is None:
        return ("    # Unverified: no model.safetensors.index.json was read beside config.json. Give the count\n"
                "    # the model card or the checkpoint's index states: a profile whose architecture does not\n"
                "    # give it is refused.\n"
                "    published_parameter_count=None,\n")
    return ("    # The checkpoint's model.safetensors.index.json (metadata.total_size): the architecture gives it.\n"
            f"    published_parameter_count={_python(profile.published_parameter_count)},\n")


def _wrapped(text: str, width: int = 100) -> str:
    """``text`` as docstring lines of at most ``width`` characters, after an empty line."""
    return "\n" + "\n".join(textwrap.wrap(text, width)) + "\n"


def variable_name(profile_name: str) -> str:
    """The module-level name of a profile: ``qwen3-8b`` -> ``QWEN3_8B``."""
    name = re.sub(r"[^A-Z0-9]+", "_", profile_name.upper()).strip("_")
    return name if name[:1].isalpha() else f"PROFILE_{name}"


def profile_module(profile: ModelProfile, proof: str | None = None, left_out: list[str] | None = None,
                   language_model: bool = False) -> str:
    """Python source of a profiles/ module holding ``profile`` (what ``btk profile import`` prints), with the
    import's proof on transformers' model (:mod:`btk.hf_proof`) in its docstring when given."""
    variable = variable_name(profile.name)
    arch = profile.architecture
    imports = ["ModelArchitecture", "ModelProfile", "TrainingIntent"] + (
        [type(arch.rope_scaling).__name__] if arch.rope_scaling else [])
    training = profile.training
    hf_id = f"    hf_model_id={_python(profile.hf_model_id)},\n" if profile.hf_model_id else ""
    return (
        f'"""{profile.name}: imported from a Hugging Face config.json with `btk profile import`.\n'
        "\n"
        "The architecture and its parameter count come from the config; the training intent is a\n"
        "starting point to edit. Save this module in profiles/ and list it in FAMILY_MODULES\n"
        '(profiles/__init__.py), or move the profile into a family module\'s PROFILES tuple.\n'
        f"{_wrapped(proof[:1].upper() + proof[1:] + '.') if proof else ''}"
        f"{_wrapped(_left_out_note(left_out)) if left_out else ''}"
        f"{_wrapped(LANGUAGE_MODEL_NOTE) if language_model else ''}"
        '"""\n'
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
        f"{_published_count_source(profile)}"
        f"    source={_python(profile.source)},\n"
        f"{hf_id}"
        ")\n"
        "\n"
        f"PROFILES = ({variable},)\n"
    )
