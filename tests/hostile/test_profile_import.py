"""``btk profile import`` on hostile input: every bad file, value or option is one line on stderr, exit 2.

Explicit cases for each way a config.json or an argument can be wrong, and a property test that
mutates real configs (any key to any JSON value, keys dropped, junk added): the command either
imports a valid profile (exit 0, the printed module builds it) or refuses in one line, never a
traceback and never a profile of something else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_fixtures import Outcome, assert_one_line_error, btk
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
VALID = json.loads((CONFIGS / "qwen3-8b.json").read_text())


def _import(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> Outcome:
    return btk(capsys, ["profile", "import", str(path), "--name", "hostile", *extra])


def _write(tmp_path: Path, content: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("null", "expected a JSON object"),
        ("[" * 5000 + "]" * 5000, "nested"),
        ('{"model_type": 1' + "0" * 5000 + "}", "unreadable JSON value"),
        ({}, "model_type"),
        ({**VALID, "model_type": "llama\nx"}, "model_type"),
        ({**VALID, "model_type": "gpt2"}, "model_type"),
        ({k: v for k, v in VALID.items() if k != "hidden_size"}, "hidden_size: missing"),
        ({**VALID, "num_hidden_layers": True}, "num_hidden_layers"),
        ({**VALID, "num_hidden_layers": "36"}, "num_hidden_layers"),
        ({**VALID, "num_hidden_layers": 36.5}, "num_hidden_layers"),
        ({**VALID, "num_hidden_layers": -1}, "num_hidden_layers"),
        ({**VALID, "num_hidden_layers": 10**30}, "num_hidden_layers"),
        ({**VALID, "vocab_size": None}, "vocab_size"),
        ({**VALID, "num_attention_heads": 0}, "num_attention_heads"),
        ({**VALID, "num_key_value_heads": 7}, "num_key_value_heads"),
        ({**VALID, "head_dim": 127}, "head_dim"),
        ({**VALID, "head_dim": "128"}, "head_dim"),
        ({**VALID, "rms_norm_eps": 2}, "rms_norm_eps"),
        ({**VALID, "rope_theta": -1}, "rope_theta"),
        # rope_scaling is read as transformers reads it: into rope_parameters
        ({**VALID, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_parameters: rope_type 'dynamic'"),
        ({**VALID, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.1}}, "rope_scaling.beta_fast"),
        ({**VALID, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": -1.0}},
         "rope_scaling.attention_factor"),
        ({**VALID, "rope_scaling": {"type": "linear", "factor": 0.5}}, "rope_scaling.factor"),
        ({**VALID, "rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_parameters"),
        ({**VALID, "rope_scaling": {"rope_type": "llama3"}}, "rope_parameters"),
        ({**VALID, "rope_scaling": "llama3"}, "rope_parameters"),
        ({**VALID, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1.0}}, "rope_parameters"),
        ({**VALID, "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({**VALID, "attention_bias": 1}, "attention_bias"),
        ({**VALID, "hidden_act": "gelu"}, "hidden_act"),
        ({**VALID, "attention_dropout": 0.1}, "attention_dropout"),
        ({**VALID, "model_type": "llama", "mlp_bias": True}, "mlp_bias"),
        ({**VALID, "quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({**VALID, "num_experts": 8}, "num_experts"),
        ({**VALID, "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({**VALID, "text_config": {"model_type": "qwen3"}}, "text_config"),
        ({**VALID, "max_position_embeddings": 8}, "max_position_embeddings"),
    ],
)
def test_bad_config_files_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: Any, named: str
) -> None:
    outcome = _import(capsys, _write(tmp_path, content))
    assert_one_line_error(outcome)
    assert named in outcome.err


def test_unreadable_paths_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for path in (tmp_path / "missing.json", tmp_path, tmp_path / "sub" / "config.json", Path("/dev/zero")):
        assert_one_line_error(_import(capsys, path))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    assert_one_line_error(_import(capsys, tmp_path / "binary.json"))
    big = tmp_path / "big.json"
    with big.open("wb") as file:
        file.truncate(17 * 1024 * 1024)
    outcome = _import(capsys, big)
    assert_one_line_error(outcome)
    assert "bytes" in outcome.err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_a_file_without_read_permission_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    path.chmod(0)
    assert_one_line_error(_import(capsys, path))


@pytest.mark.parametrize("name", ["", " ", "Qwen3", "-x", "a", "a" * 64, "bad\nname", "x y", "ünï"])
def test_bad_names_are_one_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    outcome = btk(capsys, ["profile", "import", str(CONFIGS / "qwen3-8b.json"), "--name", name])
    assert_one_line_error(outcome)


def test_bad_outputs_are_one_line_and_write_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    existing = _write(tmp_path, "keep", "existing.py")
    link = tmp_path / "link.py"
    link.symlink_to(tmp_path / "nowhere.py")
    for target in (existing, link, tmp_path / "no-dir" / "x.py", tmp_path):
        assert_one_line_error(_import(capsys, CONFIGS / "qwen3-8b.json", "--output", str(target)))
    assert existing.read_text() == "keep" and not (tmp_path / "nowhere.py").exists()
    assert_one_line_error(_import(capsys, CONFIGS / "qwen3-8b.json", "--output", ""))
    assert_one_line_error(_import(capsys, CONFIGS / "qwen3-8b.json", "--format", "table"))
    assert_one_line_error(btk(capsys, ["profile", "import", str(CONFIGS / "qwen3-8b.json")]))
    assert_one_line_error(btk(capsys, ["profile"]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)
configs = st.sampled_from(sorted(CONFIGS.glob("*.json"))).flatmap(
    lambda path: st.tuples(
        st.just(json.loads(path.read_text())),
        st.dictionaries(st.sampled_from(sorted(json.loads(path.read_text()))), json_values, max_size=3),
        st.lists(st.sampled_from(sorted(json.loads(path.read_text()))), max_size=2),
        st.dictionaries(st.text(max_size=12), json_values, max_size=2),
    )
)


@settings(max_examples=capped(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs)
def test_mutated_real_configs_import_or_refuse_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: tuple[dict[str, Any], dict[str, Any], list[str],
                                                                  dict[str, Any]]
) -> None:
    base, changed, dropped, added = case
    config = {key: value for key, value in {**base, **changed, **added}.items() if key not in dropped}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    outcome = _import(capsys, path)
    if outcome.code == 0:
        namespace: dict[str, Any] = {}
        exec(compile(outcome.out, "<printed>", "exec"), namespace)
        (profile,) = namespace["PROFILES"]
        assert profile.published_parameter_count is None  # no checkpoint index beside the config: unverified
    else:
        assert_one_line_error(outcome)
