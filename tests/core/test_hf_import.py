"""Importing Hugging Face config.json files: real ones give their published parameter counts, unsupported ones one line.

The fixtures and their published counts are listed, with sources, in tests/hf_configs/SOURCES.md;
the expectations here are read from that table, so the test and the cited figures cannot drift.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from btk.errors import BtkError
from btk.hf_import import (
    FAMILIES,
    architecture_from_config,
    dropout_left_out,
    language_model_config,
    profile_from_config,
    profile_module,
    published_count_from_index,
    variable_name,
)
from btk.hf_proof import check_full_size, prove_import
from btk.profile import LinearRopeScaling, ModelProfile

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
ROW = re.compile(r"^\| (\S+\.json) \| (https://huggingface\.co/\S+) \| [^|]+ \| ([^|]+) \|$", re.M)


def _table(heading: str) -> dict[str, tuple[str, str]]:
    """{file: (model URL, last column)} of the table under ``## heading`` in SOURCES.md."""
    sections = {part.split("\n", 1)[0]: part for part in (CONFIGS / "SOURCES.md").read_text().split("\n## ")}
    return {name: (url, value.strip()) for name, url, value in ROW.findall(sections[heading])}


SUPPORTED = _table("Supported")
WITHOUT_DROPOUT = _table("Supported with --without-dropout")
REFUSED = _table("Refused")


def _config(name: str) -> Any:
    return json.loads((CONFIGS / name).read_text())


def test_the_fixtures_cover_every_supported_model_type_and_three_refusals() -> None:
    families = {_config(name)["model_type"] for name in SUPPORTED}
    assert len(SUPPORTED) >= 8 and families == set(FAMILIES)
    refused = {field for _url, field in REFUSED.values()}
    assert refused >= {"num_experts", "sliding_window", "vision_config"}
    multimodal = _table("Language model of a multimodal config")
    assert sorted(path.name for path in CONFIGS.glob("*.json")) == sorted([*SUPPORTED, *WITHOUT_DROPOUT, *multimodal,
                                                                           *REFUSED])


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_imported_parameter_count_is_the_published_one(name: str) -> None:
    published = int(SUPPORTED[name][1].replace(",", ""))
    profile = profile_from_config(_config(name), "imported")
    assert profile.parameter_count == published
    assert profile.published_parameter_count is None  # no checkpoint index read: the count is unverified
    assert profile_from_config(_config(name), "imported", published).published_parameter_count == published


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_a_checkpoint_index_gives_the_published_count(name: str) -> None:
    """An index whose total_size is the published count in the config's dtype (SOURCES.md's figure)."""
    published = int(SUPPORTED[name][1].replace(",", ""))
    config = _config(name)
    dtype = config.get("dtype", config.get("torch_dtype"))
    size = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    assert published_count_from_index({"metadata": {"total_size": published * size}}, config) == published
    with pytest.raises(BtkError, match=rf"^model.safetensors.index.json: the checkpoint holds {published + 1:,} "):
        profile_from_config(config, "imported", published + 1)


@pytest.mark.parametrize("index", [{}, {"metadata": {}}, {"metadata": {"total_size": "16"}}, [],
                                   {"metadata": {"total_size": True}}, {"metadata": {"total_size": -2}},
                                   {"metadata": {"total_size": 3}}])
def test_a_bad_index_is_one_line_naming_it(index: Any) -> None:
    with pytest.raises(BtkError, match=r"^model.safetensors.index.json: metadata.total_size: ") as raised:
        published_count_from_index(index, {"torch_dtype": "bfloat16"})
    assert "\n" not in str(raised.value)


def test_an_index_needs_the_configs_dtype() -> None:
    with pytest.raises(BtkError, match=r"^config.json: torch_dtype: 'int4' does not give the bytes per parameter"):
        published_count_from_index({"metadata": {"total_size": 16}}, {"torch_dtype": "int4"})


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_models_are_refused_naming_the_field(name: str) -> None:
    field = REFUSED[name][1]
    with pytest.raises(BtkError) as refused:
        architecture_from_config(_config(name))
    message = str(refused.value)
    assert message.startswith("config.json: ") and "\n" not in message
    reasons = message.removeprefix("config.json: ").split("; ")
    assert any(reason.startswith(f"{field}: ") and "not supported" in reason for reason in reasons), message


def test_the_new_fields_come_from_the_families_that_need_them() -> None:
    """Qwen3-4B: heads 128 wide against a 2560 residual (32 x 128 = 4096), per-head QK-norm; Mistral NeMo: 128
    against 5120 / 32 = 160; OLMo 2: QK-norm over the projections, norms after the sublayers; Qwen2.5: q/k/v
    biases without an output bias."""
    qwen3 = architecture_from_config(_config("qwen3-4b.json"))
    assert (qwen3.head_dim, qwen3.attention_width, qwen3.qk_norm, qwen3.tied_embeddings) == (128, 4096, "head", True)
    nemo = architecture_from_config(_config("mistral-nemo-base-2407.json"))
    assert (nemo.head_dim, nemo.attention_width, nemo.qk_norm, nemo.attention_bias) == (128, 4096, "none", False)
    olmo = architecture_from_config(_config("olmo-2-1124-7b.json"))
    assert (olmo.qk_norm, olmo.norm_placement, olmo.hf_model_type) == ("projection", "post", "olmo2")
    qwen25 = architecture_from_config(_config("qwen2.5-7b.json"))
    assert (qwen25.attention_bias, qwen25.attention_output_bias, qwen25.hf_model_type) == (True, False, "qwen2")
    llama = architecture_from_config(_config("llama-3.1-8b.json"))
    assert llama.rope_scaling is not None and llama.rope_scaling.factor == 8.0 and llama.head_dim is None


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_the_printed_module_defines_the_same_profile(name: str) -> None:
    """What ``btk profile import`` prints is a module that builds exactly the imported profile."""
    profile = profile_from_config(_config(name), "imported-model")
    namespace: dict[str, Any] = {}
    exec(compile(profile_module(profile), "<imported>", "exec"), namespace)
    assert namespace["PROFILES"] == (profile,)
    assert namespace[variable_name("imported-model")] == profile


def test_the_model_id_and_source_come_from_the_config_when_it_names_one() -> None:
    profile = profile_from_config(_config("mistral-nemo-base-2407.json"), "mistral-nemo-12b")
    assert profile.hf_model_id == "mistralai/Mistral-Nemo-Base-2407"
    assert profile.source == "huggingface.co/mistralai/Mistral-Nemo-Base-2407 config.json"
    assert profile_from_config(_config("qwen3-8b.json"), "qwen3-8b").hf_model_id is None


def test_the_training_intent_fits_the_model() -> None:
    """A 4096-token model starts at 4096 tokens; a long-context one at 8192; both plan as they are."""
    assert profile_from_config(_config("olmo-2-1124-7b.json"), "olmo").training.seq_len == 4096
    assert profile_from_config(_config("qwen3-8b.json"), "qwen").training.seq_len == 8192


@pytest.mark.parametrize("name", ["ok-name", "qwen3-8b", "a.b-c"])
def test_variable_names_are_python_names(name: str) -> None:
    assert variable_name(name).isidentifier() and variable_name(name).isupper()


def test_qwen_window_counts_only_when_it_applies() -> None:
    """Qwen2.5 configs carry sliding_window with use_sliding_window false: full attention, imported; turned on
    for layers from max_window_layers on, refused naming use_sliding_window."""
    config = _config("qwen2.5-7b.json")
    assert config["sliding_window"] and not config["use_sliding_window"]
    architecture_from_config(config)
    with pytest.raises(BtkError, match=r"^config.json: use_sliding_window: sliding-window"):
        architecture_from_config({**config, "use_sliding_window": True, "max_window_layers": 20})
    architecture_from_config({**config, "use_sliding_window": True, "max_window_layers": 28})  # no layer slides


def test_a_published_count_that_differs_is_refused_at_load() -> None:
    profile = profile_from_config(_config("qwen3-8b.json"), "qwen3-8b")
    values = profile.model_dump() | {"published_parameter_count": profile.parameter_count + 1}
    with pytest.raises(ValueError, match=r"published_parameter_count \(8,190,735,361\) differs"):
        ModelProfile.model_validate(values)


def _transformers(config: dict[str, Any]) -> Any:
    """transformers' own reading of ``config``: the external truth the importer must agree with."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[config["model_type"]](**copy.deepcopy(config))


def _without(config: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in keys}


def test_a_key_left_out_takes_the_model_types_default_not_the_kits() -> None:
    """Qwen3 without head_dim is 128 wide in transformers (not hidden / heads: 4,096 / 32 = 128 here, so the 4B's
    2,560 / 32 = 80 shows it); Mistral without num_key_value_heads has 8 (not one per query head)."""
    qwen = _without(_config("qwen3-4b.json"), "head_dim")
    assert _transformers(qwen).head_dim != qwen["hidden_size"] // qwen["num_attention_heads"]
    assert architecture_from_config(qwen).head_dim == _transformers(qwen).head_dim
    mistral = _without(_config("mistral-7b-v0.3.json"), "num_key_value_heads")
    assert architecture_from_config(mistral).num_kv_heads == _transformers(mistral).num_key_value_heads


def test_mistral_without_a_window_key_has_transformers_window_and_is_refused() -> None:
    mistral = _without(_config("mistral-7b-v0.3.json"), "sliding_window")
    window = _transformers(mistral).sliding_window
    with pytest.raises(BtkError, match=rf"^config.json: sliding_window: sliding-window attention \({window} tokens"):
        architecture_from_config(mistral)


def test_a_field_the_model_type_never_reads_changes_nothing() -> None:
    """transformers' Mistral builds no attention biases whatever the config says (its class has no such field)."""
    mistral = _config("mistral-7b-v0.3.json")
    assert architecture_from_config({**mistral, "attention_bias": True}) == architecture_from_config(mistral)


def test_fields_that_change_the_math_are_read_as_transformers_reads_them() -> None:
    llama = _config("llama-3.1-8b.json")
    with pytest.raises(BtkError, match=r"partial_rotary_factor: 0.5: rotary embeddings on part of each head"):
        architecture_from_config({**llama, "partial_rotary_factor": 0.5})
    both = {**llama, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    applied = _transformers(both).rope_parameters
    expected = LinearRopeScaling(factor=applied["factor"]) if applied["rope_type"] == "linear" else None
    assert architecture_from_config(both).rope_scaling == expected  # what transformers applies, not the other
    dynamic = {**both, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    applied_type = _transformers(dynamic).rope_parameters["rope_type"]
    if applied_type != "default":
        with pytest.raises(BtkError, match=rf"rope_type '{applied_type}' is not supported"):
            architecture_from_config(dynamic)
    with pytest.raises(BtkError, match=r"num_key_value_heads: 0"):
        architecture_from_config({**llama, "num_key_value_heads": 0})
    qwen = _without(_config("qwen2.5-7b.json"), "use_sliding_window")
    assert all(kind == "full_attention" for kind in _transformers(qwen).layer_types)
    architecture_from_config(qwen)  # a window given, never switched on: full attention, as transformers has it


QWEN_YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
"""The block Qwen2.5's model cards tell users to add to config.json for 131,072 tokens (huggingface.co/Qwen/Qwen2.5-32B,
"Processing Long Texts"; the old ``type`` spelling, as the card writes it)."""


def test_yarn_as_qwens_model_card_sets_it_extends_the_context_and_is_proven_on_transformers() -> None:
    config = {**_config("qwen2.5-32b.json"), "rope_scaling": QWEN_YARN}
    arch = architecture_from_config(config)
    assert arch.max_context == 4 * 32768 and arch.rope_scaling is not None
    assert arch.rope_scaling.rope_type == "yarn" and arch.parameter_count == architecture_from_config(
        _config("qwen2.5-32b.json")).parameter_count
    proof = prove_import(config, arch)
    assert proof.parameter_count == arch.parameter_count
    # YaRN changes every position's table: the architecture without it is a different model.
    assert arch.model_copy(update={"rope_scaling": None}) != arch


def test_yarn_fields_are_read_as_transformers_reads_them() -> None:
    """``factor`` left out is the ratio of the contexts; ``original_max_position_embeddings`` left out is
    ``max_position_embeddings``; a bad field is named by its key."""
    qwen = _config("qwen2.5-7b.json")
    derived = {**qwen, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 32768}}
    scaling = architecture_from_config(derived).rope_scaling
    assert scaling is not None and scaling.factor == 4.0
    assert _transformers({**qwen, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}).rope_parameters[
        "original_max_position_embeddings"] == qwen["max_position_embeddings"]
    with pytest.raises(BtkError, match=r"^config.json: rope_scaling.beta_fast: .*at least beta_slow"):
        architecture_from_config({**qwen, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.5}})
    with pytest.raises(BtkError, match=r"^config.json: rope_scaling.factor: "):
        architecture_from_config({**qwen, "rope_scaling": {"rope_type": "yarn", "factor": 0.5}})


def test_every_reason_is_named_at_once() -> None:
    config = {**_config("llama-3.1-8b.json"), "num_experts": 8, "hidden_act": "gelu", "partial_rotary_factor": 0.5}
    with pytest.raises(BtkError) as refused:
        architecture_from_config(config)
    reasons = str(refused.value).removeprefix("config.json: ").split("; ")
    assert {reason.split(":", 1)[0] for reason in reasons} == {"num_experts", "hidden_act", "partial_rotary_factor"}
    assert "\n" not in str(refused.value)


def test_a_window_of_zero_tokens_is_a_window() -> None:
    """transformers' Mistral masks with any sliding_window that is not None (0 included): refused, not read as off."""
    config = _config("mistral-7b-v0.3.json")
    assert config["sliding_window"] is None
    with pytest.raises(BtkError, match=r"^config.json: sliding_window: sliding-window attention \(0 tokens"):
        architecture_from_config({**config, "sliding_window": 0})


def test_granite_phi3_and_smollm3_add_their_fields_to_llamas_block() -> None:
    granite = architecture_from_config(_config("granite-3.3-8b-instruct.json"))
    assert (granite.embedding_multiplier, granite.attention_multiplier, granite.residual_multiplier,
            granite.logits_scaling, granite.hf_model_type) == (12.0, 0.0078125, 0.22, 16.0, "granite")
    smollm3 = architecture_from_config(_config("smollm3-3b.json"))
    assert (smollm3.no_rope_interval, smollm3.tied_embeddings, smollm3.hf_model_type) == (4, True, "smollm3")
    assert [smollm3.uses_rope(index) for index in range(8)] == [True, True, True, False] * 2
    phi4 = architecture_from_config(_config("phi-4.json"))
    assert (phi4.fused_projections, phi4.attention_bias, phi4.hf_model_type) == (True, False, "phi3")


def test_granites_multipliers_left_out_are_transformers_defaults() -> None:
    """GraniteConfig's attention_multiplier default is 1.0 (not 1/sqrt(head_dim)): the kit reads it, not its own."""
    config = _without(_config("granite-3.3-8b-instruct.json"), "attention_multiplier", "logits_scaling")
    arch = architecture_from_config(config)
    defaults = _transformers(config)
    assert (arch.attention_multiplier, arch.logits_scaling) == (defaults.attention_multiplier, defaults.logits_scaling)
    assert arch.attention_multiplier == 1.0


def test_a_head_dim_the_class_does_not_declare_is_read_as_the_model_reads_it() -> None:
    """GraniteConfig, Phi3Config and Olmo2Config do not declare head_dim, but their modelling code reads it."""
    for name in ("granite-3.3-8b-instruct.json", "phi-4.json", "olmo-2-1124-7b.json"):
        config = {**_config(name), "head_dim": 64}
        arch = architecture_from_config(config)
        assert arch.effective_head_dim == 64
        assert check_full_size(config, arch)[1] == arch.parameter_count  # transformers' model has 64-wide heads


def test_smollm3s_blocks_without_rope_are_read_from_transformers_list() -> None:
    base = _config("smollm3-3b.json")
    interval_only = _without(base, "no_rope_layers")
    assert architecture_from_config({**interval_only, "no_rope_layer_interval": 3}).no_rope_interval == 3
    assert architecture_from_config({**base, "no_rope_layers": [1] * 36}).no_rope_interval is None
    irregular = [1, 0, 0, 1] * 9
    with pytest.raises(BtkError, match=r"^config.json: no_rope_layers: blocks without RoPE other than every n-th"):
        architecture_from_config({**base, "no_rope_layers": irregular})
    with pytest.raises(BtkError, match=r"^config.json: no_rope_layers: expected one 0 or 1 per layer \(36\)"):
        architecture_from_config({**base, "no_rope_layers": [1, 1, 1, 0]})


def test_phi3s_dropouts_and_partial_rotary_are_refused_at_once() -> None:
    config = {**_config("phi-4.json"), "resid_pdrop": 0.1, "embd_pdrop": 0.1, "partial_rotary_factor": 0.75}
    with pytest.raises(BtkError) as refused:
        architecture_from_config(config)
    reasons = str(refused.value).removeprefix("config.json: ").split("; ")
    assert {reason.split(":", 1)[0] for reason in reasons} == {"resid_pdrop", "embd_pdrop", "partial_rotary_factor"}


def test_gemma3_27bs_language_model_imports_with_linear_scaling_and_is_proven() -> None:
    """Gemma 3 27B's language model (the text_config of its multimodal config.json, as TensorRT-LLM's Gemma 3 test
    copies it, at its 62 layers and 1,024-token window: transformers' conversion script's ``gemma3_27b``) as a
    gemma3_text config: linear RoPE scaling by 8 on the full blocks, the windowed ones at 10,000 unscaled, the
    query scale of 168 beside heads of 128, transformers' defaults for every key it leaves out but the vocabulary
    (this command asks for it: 262,208, the default the released text_config leaves it to)."""
    config = {"model_type": "gemma3_text", "vocab_size": 262_208, "head_dim": 128, "hidden_size": 5376,
              "intermediate_size": 21504,
              "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
              "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
              "sliding_window": 1024, "sliding_window_pattern": 6, "max_position_embeddings": 131072}
    arch = architecture_from_config(config)
    assert arch.rope_scaling == LinearRopeScaling(factor=8.0) and arch.rope_theta == 1_000_000.0
    assert (arch.local_rope_theta, arch.sliding_window, arch.full_attention_interval) == (10_000.0, 1024, 6)
    assert arch.query_pre_attn_scalar == 168 and arch.rms_norm_eps == 1e-6 and arch.tied_embeddings  # defaults
    proof = prove_import(config, arch)
    assert proof.model_class == "Gemma3ForCausalLM" and proof.parameter_count == arch.parameter_count


@pytest.mark.parametrize("name", sorted(WITHOUT_DROPOUT))
def test_a_config_asking_for_dropout_imports_only_without_it_and_is_proven(name: str) -> None:
    """Granite 3.1 8B's config asks for attention dropout 0.1: refused by default, naming the key and the way out;
    imported ``without_dropout`` to its published count, proven on transformers' model (dropout acts in training
    only: the logits are the same), and the module says what was left out."""
    config = _config(name)
    published = int(WITHOUT_DROPOUT[name][1].replace(",", ""))
    with pytest.raises(BtkError, match=r"attention_dropout: attention dropout is not supported .*--without-dropout"):
        profile_from_config(config, "imported", published)
    profile = profile_from_config(config, "imported", published, without_dropout=True)
    assert profile.parameter_count == published == profile.published_parameter_count
    left_out = dropout_left_out(config)
    assert left_out == ["attention_dropout 0.1"]
    proof = prove_import(config, profile.architecture)
    text = profile_module(profile, proof.summary(), left_out)
    assert "Imported with --without-dropout: the config's attention_dropout 0.1 is left out" in " ".join(text.split())
    namespace: dict[str, Any] = {}
    exec(compile(text, name, "exec"), namespace)
    assert namespace["PROFILES"] == (profile,)


GEMMA3_27B_MULTIMODAL = _config("gemma-3-27b-it.json")
"""Gemma 3 27B's multimodal config.json (tests/hf_configs/SOURCES.md)."""
GEMMA3_27B_PUBLISHED = int(_table("Language model of a multimodal config")["gemma-3-27b-it.json"][1].replace(",", ""))
"""The whole checkpoint's published count, vision tower included (SOURCES.md)."""


def test_a_multimodal_config_imports_its_language_model_when_asked() -> None:
    """Refused as a whole naming text_config and the way out; ``language_model_config`` reads the text model as
    transformers' Gemma3Config does, and its count is the published checkpoint's less the vision tower and the
    projector, as transformers builds them."""
    with pytest.raises(BtkError, match=r"text_config: .* \(--language-model imports its language model alone\)"):
        architecture_from_config(GEMMA3_27B_MULTIMODAL)
    config = language_model_config(GEMMA3_27B_MULTIMODAL)
    assert config["model_type"] == "gemma3_text"
    profile = profile_from_config(config, "gemma-3-27b-language-model")
    arch = profile.architecture
    assert arch.rope_scaling == LinearRopeScaling(factor=8.0) and arch.full_attention_interval == 6
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        whole = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            **{key: value for key, value in GEMMA3_27B_MULTIMODAL.items() if key != "model_type"}))
    counts: dict[str, int] = {}
    for name, parameter in whole.named_parameters():
        part = "vision" if "vision_tower" in name or "multi_modal_projector" in name else "language"
        counts[part] = counts.get(part, 0) + parameter.numel()
    assert counts["language"] + counts["vision"] == GEMMA3_27B_PUBLISHED
    assert profile.parameter_count == GEMMA3_27B_PUBLISHED - counts["vision"]
    with pytest.raises(BtkError, match=r"^config.json: text_config: --language-model reads the text_config"):
        language_model_config(_config("llama-3.1-8b.json"))
