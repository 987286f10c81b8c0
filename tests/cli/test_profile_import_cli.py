"""``btk profile import``: the module it prints, its JSON, --output, and the refusals (exit 2, one line)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_run import run

from btk.hf_import import profile_from_config
from btk.profile import ModelProfile

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
NEMO = CONFIGS / "mistral-nemo-base-2407.json"


def _load_module(text: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(text, "<printed>", "exec"), namespace)
    return namespace


def test_prints_a_module_that_defines_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "profile", "import", str(NEMO), "--name", "mistral-nemo-12b")
    assert code == 0 and err == ""
    (profile,) = _load_module(out)["PROFILES"]
    assert profile.name == "mistral-nemo-12b" and profile.architecture.head_dim == 128
    assert profile.parameter_count == 12_247_782_400 and profile.published_parameter_count is None
    assert "# Unverified: no model.safetensors.index.json" in out and "head_dim=128" in out


def test_a_checkpoint_index_beside_the_config_gives_the_published_count(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    """Mistral NeMo's published count (tests/hf_configs/SOURCES.md) as its index's total_size in bf16."""
    shutil.copy(NEMO, tmp_path / "config.json")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * 12_247_782_400}}))
    code, out, err = run(capsys, "profile", "import", str(tmp_path), "--name", "mistral-nemo-12b")
    assert code == 0 and err == ""
    (profile,) = _load_module(out)["PROFILES"]
    assert profile.published_parameter_count == 12_247_782_400
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * 12_000_000_000}}))
    code, out, err = run(capsys, "profile", "import", str(tmp_path / "config.json"), "--name", "mistral-nemo-12b")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"btk: error: {tmp_path}/model.safetensors.index.json: the checkpoint holds 12,000,000,000 ")


def test_json_is_the_profile_with_its_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profile", "import", str(NEMO), "--name", "mistral-nemo-12b", "--format", "json")
    assert code == 0
    printed = json.loads(out)
    assert printed["parameter_count"] == 12_247_782_400
    printed.pop("parameter_count")
    proof = printed.pop("proof")  # checked on transformers' model of the same config
    assert proof["model_class"] == "MistralForCausalLM" and proof["parameter_count"] == 12_247_782_400
    assert proof["max_logit_gap"] <= proof["logits_tolerance"]["atol"]
    expected = profile_from_config(json.loads(NEMO.read_text()), "mistral-nemo-12b")
    assert ModelProfile.model_validate(printed) == expected


def test_a_model_directory_is_read_for_its_config_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "qwen3-4b.json", tmp_path / "config.json")
    code, out, _ = run(capsys, "profile", "import", str(tmp_path), "--name", "qwen3-4b", "--format", "json")
    assert code == 0 and json.loads(out)["architecture"]["qk_norm"] == "head"


def test_output_writes_a_new_file_and_never_overwrites(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "mistral.py"
    code, out, _ = run(capsys, "profile", "import", str(NEMO), "--name", "mistral-nemo-12b", "--output", str(target))
    assert code == 0 and out.startswith(f"wrote {target}: profile mistral-nemo-12b (12,247,782,400 parameters)")
    assert _load_module(target.read_text())["MISTRAL_NEMO_12B"].architecture.head_dim == 128
    before = target.read_text()
    code, out, err = run(capsys, "profile", "import", str(NEMO), "--name", "other", "--output", str(target))
    assert code == 2 and out == "" and "already exists" in err and err.count("\n") == 1
    assert target.read_text() == before


@pytest.mark.parametrize(("config", "field"), [("qwen3-30b-a3b.json", "num_experts"),
                                               ("starcoder2-7b.json", "sliding_window"),
                                               ("llava-1.5-7b-hf.json", "vision_config")])
def test_unsupported_configs_are_one_line_naming_the_field(
    capsys: pytest.CaptureFixture[str], config: str, field: str
) -> None:
    code, out, err = run(capsys, "profile", "import", str(CONFIGS / config), "--name", "refused")
    assert code == 2 and out == ""
    reasons = err.removeprefix(f"btk: error: {CONFIGS / config}: ").split("; ")
    assert any(reason.startswith(f"{field}: ") and "not supported" in reason for reason in reasons), err
    assert err.startswith("btk: error: ") and err.count("\n") == 1


def test_a_name_profiles_already_has_is_refused_naming_its_module(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The catalog refuses a name defined twice: the import refuses to write one, and says where it is."""
    from btk.catalog import all_profiles

    name = next(iter(all_profiles()))
    repo = Path(__file__).resolve().parents[2]
    # Where it is, found independently: the family module whose source spells the name.
    modules = [path for path in sorted((repo / "profiles").glob("*.py"))
               if path.name != "__init__.py" and f'"{name}"' in path.read_text()]
    target = tmp_path / "new_family.py"
    code, out, err = run(capsys, "profile", "import", str(CONFIGS / "qwen3-8b.json"), "--name", name,
                         "--output", str(target))
    assert (code, out) == (2, "")
    assert err.startswith(f"btk: error: --name {name}: profile {name!r} is already defined in profiles/")
    assert err.endswith("; give the import another name\n") and err.count("\n") == 1
    if len(modules) == 1:
        assert f"defined in profiles/{modules[0].name};" in err
    assert not target.exists()


def test_transformers_notes_on_old_keys_are_not_printed(tmp_path: Path) -> None:
    """A config with transformers 4's rope_scaling, of a model type refused: the refusal is all stderr holds
    (transformers' FutureWarning about the key speaks to code that writes configs)."""
    config = {**json.loads((CONFIGS / "llama-3.1-8b.json").read_text()), "model_type": "gpt2"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "btk.cli", "profile", "import", str(path), "--name", "x-test"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("btk: error: ") and done.stderr.count("\n") == 1, done.stderr


def test_an_import_transformers_model_disagrees_with_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof on transformers' model runs in the command: a failing one (here: a trainer model whose norms
    use another epsilon) refuses the import in one line naming the file, and prints no module."""
    from types import SimpleNamespace

    import btk.hf_proof

    trainer_model = btk.hf_proof._trainer_model

    def skewed() -> Any:
        model = trainer_model()
        return SimpleNamespace(Decoder=lambda arch: model.Decoder(arch.model_copy(update={"rms_norm_eps": 0.5})),
                               from_hf_state_dict=model.from_hf_state_dict)

    monkeypatch.setattr(btk.hf_proof, "_trainer_model", skewed)
    code, out, err = run(capsys, "profile", "import", str(NEMO), "--name", "mistral-nemo-12b")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{NEMO}: on a 2-layer copy with the same weights" in err


def test_without_dropout_imports_a_config_that_asks_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Granite 3.1 8B's attention dropout: one line naming it and the flag; with the flag, the module says so."""
    granite = CONFIGS / "granite-3.1-8b-instruct.json"
    code, out, err = run(capsys, "profile", "import", str(granite), "--name", "granite-3.1-8b")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "attention_dropout: attention dropout is not supported" in err and "--without-dropout" in err
    code, out, err = run(capsys, "profile", "import", str(granite), "--name", "granite-3.1-8b", "--without-dropout")
    assert code == 0 and err == ""
    (profile,) = _load_module(out)["PROFILES"]
    assert profile.parameter_count == 8_170_848_256
    assert "attention_dropout 0.1 is left out" in " ".join(out.split())
    code, out, _ = run(capsys, "profile", "import", str(granite), "--name", "granite-3.1-8b", "--without-dropout",
                       "--format", "json")
    assert code == 0 and json.loads(out)["left_out"] == ["attention_dropout 0.1"]


def test_language_model_imports_a_multimodal_configs_text_model(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    """Gemma 3 27B's multimodal config.json: refused whole naming --language-model; with it, the text model's
    profile, the module saying the vision tower and the checkpoint's index (which counts it) are left out."""
    shutil.copy(CONFIGS / "gemma-3-27b-it.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 54_864_813_280}}))
    code, out, err = run(capsys, "profile", "import", str(tmp_path), "--name", "gemma-3-27b-lm")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--language-model" in err
    code, out, err = run(capsys, "profile", "import", str(tmp_path), "--name", "gemma-3-27b-lm", "--language-model")
    assert code == 0 and err == ""
    (profile,) = _load_module(out)["PROFILES"]
    assert profile.family == "gemma" and profile.architecture.hf_model_type == "gemma3_text"
    assert profile.published_parameter_count is None  # the index counts the vision tower: not read
    assert "Imported with --language-model" in out and "vision tower is left out" in " ".join(out.split())
