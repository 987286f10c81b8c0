"""Importing Hugging Face config.json files: real ones give their published parameter counts, unsupported ones one line.

The fixtures and their published counts are listed, with sources, in tests/hf_configs/SOURCES.md;
the expectations here are read from that table, so the test and the cited figures cannot drift.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from btk.errors import BtkError
from btk.hf_import import architecture_from_config, profile_from_config, profile_module, variable_name
from btk.profile import ModelProfile

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
ROW = re.compile(r"^\| (\S+\.json) \| (https://huggingface\.co/\S+) \| [^|]+ \| ([^|]+) \|$", re.M)


def _table(heading: str) -> dict[str, tuple[str, str]]:
    """{file: (model URL, last column)} of the table under ``## heading`` in SOURCES.md."""
    sections = {part.split("\n", 1)[0]: part for part in (CONFIGS / "SOURCES.md").read_text().split("\n## ")}
    return {name: (url, value.strip()) for name, url, value in ROW.findall(sections[heading])}


SUPPORTED = _table("Supported")
REFUSED = _table("Refused")


def _config(name: str) -> Any:
    return json.loads((CONFIGS / name).read_text())


def test_the_fixtures_cover_five_families_and_four_refusals() -> None:
    families = {_config(name)["model_type"] for name in SUPPORTED}
    assert len(SUPPORTED) >= 8 and families == {"llama", "mistral", "qwen2", "qwen3", "olmo2"}
    refused = {field for _url, field in REFUSED.values()}
    assert refused >= {"num_experts", "final_logit_softcapping", "sliding_window", "vision_config"}
    assert sorted(path.name for path in CONFIGS.glob("*.json")) == sorted([*SUPPORTED, *REFUSED])


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_imported_parameter_count_is_the_published_one(name: str) -> None:
    published = int(SUPPORTED[name][1].replace(",", ""))
    profile = profile_from_config(_config(name), "imported")
    assert profile.parameter_count == published
    assert profile.published_parameter_count == published


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_models_are_refused_naming_the_field(name: str) -> None:
    field = REFUSED[name][1]
    with pytest.raises(BtkError) as refused:
        architecture_from_config(_config(name))
    message = str(refused.value)
    assert message.startswith(f"config.json: {field}: ") and "not supported" in message and "\n" not in message


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
