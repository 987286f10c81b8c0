"""Profiles imported from real config.json files plan, train and export without hand edits (CPU, one rank).

Qwen3-4B (heads 128 wide against a 2560 residual, per-head QK-norm, tied), Mistral NeMo 12B
(heads 128 wide against 5120 / 32 = 160), Granite 3.3 8B (multipliers), SmolLM3-3B (every fourth
block without RoPE), Phi-4 (fused checkpoint projections), Gemma 2 9B (windowed and full blocks, soft caps) and
Gemma 3 1B (windowed blocks with their own RoPE base) are imported from tests/hf_configs as
they are and planned. Training them needs GPUs, so the job trains each one's block layout at toy size: the
same fields with the widths scaled down (head_dim kept apart from hidden / heads), written to a
hyperparameters.json and run through the trainer's own entry point. The exported checkpoint is
then loaded by transformers from its config.json alone and gives the trained model's logits.
Export and import are each other's inverse for every supported layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer.model import Decoder, hf_config, load_safetensors
from btk_trainer.train import main
from test_model_parity import FAMILIES, HF_CLASSES

from btk.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type
from btk.hf_import import FAMILIES as HF_FAMILIES
from btk.hf_import import architecture_from_config, profile_from_config
from btk.hyperparameters import JobHyperparameters, JobSettings, from_hyperparameters, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.planner.search import plan_profile
from btk.planner.throughput import model_flops_per_token
from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent

transformers = pytest.importorskip("transformers")

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"
IMPORTED = {"qwen3-4b": "qwen3-4b.json", "mistral-nemo-12b": "mistral-nemo-base-2407.json"}
ADDED_TO_LLAMA = {"granite-3.3-8b": "granite-3.3-8b-instruct.json", "smollm3-3b": "smollm3-3b.json",
                  "phi-4": "phi-4.json"}
"""Families whose block is Llama's plus multipliers (Granite), blocks without RoPE (SmolLM3) or a fused
checkpoint layout (Phi-4)."""
GEMMA = {"gemma-2-9b": "gemma-2-9b-it.json", "gemma-3-1b": "gemma-3-1b-it.json"}
"""Gemma's block: four norms, GeGLU, windowed blocks beside full ones, Gemma 2's soft caps."""
SUPPORTED = sorted(path.name for path in CONFIGS.glob("*.json")
                   if json.loads(path.read_text()).get("model_type") in HF_FAMILIES)


def imported(name: str) -> ModelProfile:
    return profile_from_config(json.loads((CONFIGS / {**IMPORTED, **ADDED_TO_LLAMA, **GEMMA}[name]).read_text()), name)


def at_toy_size(arch: ModelArchitecture) -> ModelArchitecture:
    """The same block layout and options at toy widths; a head width apart from hidden / heads stays apart."""
    changes: dict[str, Any] = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                               "num_kv_heads": 2 if arch.num_kv_heads < arch.num_attention_heads else 4,
                               "ffn_hidden_size": 96, "vocab_size": 128, "max_context": 256,
                               "head_dim": None if arch.head_dim is None else 32,
                               # one of the two blocks without RoPE, where the model has such blocks
                               "no_rope_interval": None if arch.no_rope_interval is None else 2,
                               # a window the 32-token windows outgrow, on the first of the two blocks
                               "sliding_window": None if arch.sliding_window is None else 7,
                               "full_attention_interval": None if arch.full_attention_interval is None else 2}
    return ModelArchitecture.model_validate(arch.model_dump() | changes)


@pytest.mark.parametrize("name", sorted(IMPORTED))
def test_imported_profiles_plan_with_their_attention_width(name: str) -> None:
    profile = imported(name)
    arch = profile.architecture
    assert arch.head_dim == 128 and arch.attention_width == 4096 != arch.hidden_size
    plan = plan_profile(profile, get_instance_type(DEFAULT_INSTANCE_TYPE), 1)
    assert plan.evaluation.fits
    # The MFU convention's attention term counts 32 heads of 128, not the residual width.
    attention = model_flops_per_token(arch, 4096) - 6.0 * arch.matmul_parameters
    assert attention == 12.0 * arch.num_layers * 32 * 128 * 4096


@pytest.mark.parametrize("name", sorted(ADDED_TO_LLAMA))
def test_added_families_plan_and_their_jobs_carry_the_block(name: str) -> None:
    """The plan fits one B200 node with Llama's FLOPs rule (the multipliers, a block without RoPE and fused storage
    add no matmul), and the job's hyperparameters carry every field that makes the block what it is."""
    profile = imported(name)
    arch = profile.architecture
    plan = plan_profile(profile, get_instance_type(DEFAULT_INSTANCE_TYPE), 1)
    assert plan.evaluation.fits
    llama = arch.model_copy(update={"embedding_multiplier": 1.0, "attention_multiplier": None,
                                    "residual_multiplier": 1.0, "logits_scaling": 1.0, "no_rope_interval": None,
                                    "fused_projections": False})
    assert model_flops_per_token(arch, 8192) == model_flops_per_token(llama, 8192)
    spec = JobHyperparameters(knobs=plan.knobs, architecture=arch, training=profile.training,
                              job=JobSettings(profile=name))
    written = to_hyperparameters(spec)
    changed = {key for key in ModelArchitecture.LEFT_OUT_AT_DEFAULT if getattr(arch, key) != getattr(llama, key)}
    assert changed and {f"arch.{key}" for key in changed} <= written.keys()
    assert from_hyperparameters(written).architecture == arch


@pytest.mark.parametrize("name", sorted(GEMMA))
def test_gemma_plans_count_its_windows_and_its_jobs_carry_the_block(name: str) -> None:
    """The plan fits one B200 node; the windowed blocks' attention is counted over their window only (the MFU
    convention's ``12·a·s`` per full block, the window's mean keys per windowed one); the job carries the block."""
    profile = imported(name)
    arch = profile.architecture
    assert arch.sliding_window is not None and arch.full_attention_interval is not None
    plan = plan_profile(profile, get_instance_type(DEFAULT_INSTANCE_TYPE), 1)
    assert plan.evaluation.fits
    seq, window = 8192, arch.sliding_window
    full_blocks = arch.num_layers // arch.full_attention_interval
    windowed_keys = (window * (window + 1) / 2 + (seq - window) * window) / seq  # mean keys of a windowed query
    causal_keys = (seq + 1) / 2
    expected = 12.0 * arch.attention_width * (full_blocks * seq
                                               + (arch.num_layers - full_blocks) * seq * windowed_keys / causal_keys)
    assert model_flops_per_token(arch, seq) - 6.0 * arch.matmul_parameters == pytest.approx(expected, rel=1e-12)
    spec = JobHyperparameters(knobs=plan.knobs, architecture=arch, training=profile.training,
                              job=JobSettings(profile=name))
    written = to_hyperparameters(spec)
    assert {"arch.norm_placement", "arch.sliding_window", "arch.full_attention_interval"} <= written.keys()
    assert from_hyperparameters(written).architecture == arch


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("name", sorted([*IMPORTED, *ADDED_TO_LLAMA, *GEMMA]))
def test_imported_layouts_train_export_and_load_in_transformers(name: str, tmp_path: Path) -> None:
    arch = at_toy_size(imported(name).architecture)
    spec = JobHyperparameters(
        knobs=TrainingKnobs(micro_batch_size=2, seq_len=32, compile=False, fused_loss=False),
        architecture=arch,
        training=TrainingIntent(seq_len=32, global_batch_tokens=64, learning_rate=3e-3, warmup_steps=1),
        job=JobSettings(profile=name, max_steps=3, log_interval_steps=1),
    )
    (tmp_path / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    code = main(["--hyperparameters", str(tmp_path / "hyperparameters.json"), "--model-dir", str(tmp_path / "model")])
    assert code == 0
    exported = json.loads((tmp_path / "model" / "config.json").read_text())
    assert architecture_from_config(exported) == arch
    trained = Decoder(arch)
    load_safetensors(trained, tmp_path / "model")
    attention = "eager" if exported["model_type"] == "gemma2" else "sdpa"  # transformers' Gemma 2: eager only
    hf = getattr(transformers, HF_CLASSES[exported["model_type"]]).from_pretrained(
        str(tmp_path / "model"), dtype=torch.float32, attn_implementation=attention).eval()
    tokens = torch.randint(0, arch.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        # bf16 export of fp32 training weights, read back the same way by both: same math.
        torch.testing.assert_close(trained.float().logits(tokens), hf(input_ids=tokens).logits, atol=1e-4, rtol=1e-4)
        initial = Decoder(arch)
        initial.init_weights(spec.job.seed)
        assert not torch.allclose(initial.logits(tokens), trained.logits(tokens), atol=1e-3)  # it trained


@pytest.mark.parametrize("arch", FAMILIES.values(), ids=FAMILIES.keys())
def test_exported_config_imports_to_the_same_architecture(arch: ModelArchitecture) -> None:
    assert architecture_from_config(hf_config(arch)) == arch


@pytest.mark.parametrize("name", SUPPORTED)
def test_real_configs_survive_an_export_round_trip(name: str) -> None:
    # Granite 3.1's config asks for attention dropout, which acts in training only: the architecture is read alike.
    arch = architecture_from_config(json.loads((CONFIGS / name).read_text()), without_dropout=True)
    assert architecture_from_config(hf_config(arch)) == arch
    built = transformers.AutoConfig.for_model(**{k: v for k, v in hf_config(arch).items() if k != "architectures"})
    head_dim = getattr(built, "head_dim", None) or built.hidden_size // built.num_attention_heads
    assert head_dim == arch.effective_head_dim
