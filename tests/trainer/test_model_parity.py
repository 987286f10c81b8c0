"""Our decoder equals Hugging Face transformers' own implementation of each family on the same weights.

One tiny random configuration per family: Llama 3.x (GQA, llama3 RoPE scaling; and with
attention biases), Qwen2.5 (q/k/v biases, tied; and with YaRN RoPE scaling), Mistral NeMo (head_dim wider than
hidden / heads), Qwen3 (per-head QK-norm), OLMo 2 (QK-norm over the whole projections,
norms after each sublayer), Granite 3.x (embedding, attention, residual and logits multipliers),
SmolLM3 (a block without RoPE), Phi-3/Phi-4 (fused q/k/v and gate/up in the checkpoint), Gemma 2 (sandwich
norms scaling by 1 + w, GeGLU, scaled embeddings, a windowed and a full block, soft-capped scores and logits)
and Gemma 3 (per-head QK-norm, the windowed block's own RoPE base, linear RoPE scaling on its full blocks).
Our checkpoint is exported with :func:`export_hf`, and transformers builds its model from that
``config.json`` alone, so the exported config is checked too. Tolerance: fp32 logits within
atol 1e-5 / rtol 1e-5 (same math, different op order); gradients and the logits after one SGD
step within atol/rtol 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own spelling)
from btk_trainer.model import Decoder, export_hf, from_hf_state_dict, load_safetensors, to_hf_state_dict
from trainer_fixtures import (
    tiny_gemma2,
    tiny_gemma3,
    tiny_granite,
    tiny_llama,
    tiny_mistral_nemo,
    tiny_olmo2,
    tiny_phi3,
    tiny_qwen,
    tiny_qwen3,
    tiny_qwen_yarn,
    tiny_smollm3,
)

from btk.profile import LinearRopeScaling, ModelArchitecture, RopeScaling, YarnRopeScaling

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama-gqa-rope-scaling": tiny_llama(),
    "llama-mha-tied": tiny_llama(num_kv_heads=4, tied_embeddings=True),
    "llama-attention-biases": tiny_llama(attention_bias=True, attention_output_bias=True),
    "qwen2-bias-tied": tiny_qwen(),
    "qwen2-yarn": tiny_qwen_yarn(),
    # Every YaRN field transformers reads, away from its default: the ramp's bounds, no rounding, DeepSeek's
    # attention factor of two magnitudes; and an attention factor given outright.
    "llama-yarn-every-field": tiny_qwen_yarn(
        attention_bias=False, tied_embeddings=False, rope_scaling=YarnRopeScaling(
            factor=8.0, original_max_position_embeddings=2048, beta_fast=16.0, beta_slow=2.0, truncate=False,
            mscale=0.8, mscale_all_dim=0.6)),
    "llama-yarn-attention-factor": tiny_qwen_yarn(
        attention_bias=False, rope_scaling=YarnRopeScaling(
            factor=4.0, original_max_position_embeddings=4096, attention_factor=1.5)),
    "mistral-nemo-head-dim": tiny_mistral_nemo(),
    "qwen3-head-qk-norm": tiny_qwen3(),
    "olmo2-post-norm-projection-qk-norm": tiny_olmo2(),
    "granite-multipliers": tiny_granite(),
    "smollm3-no-rope-block": tiny_smollm3(),
    "phi3-fused-projections": tiny_phi3(),
    "gemma2-windows-soft-caps": tiny_gemma2(),
    "gemma3-qk-norm-local-rope": tiny_gemma3(),
    # Every block windowed, the window wider than the probe; and Gemma 3 with Llama 3's scaling on its full blocks.
    "gemma2-every-block-windowed": tiny_gemma2(full_attention_interval=None, sliding_window=64),
    "gemma3-scaled-full-blocks": tiny_gemma3(rope_scaling=RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)),
    # Linear scaling (position interpolation): Gemma 3 4B-27B's full blocks, by 8; and on Llama's block.
    "gemma3-linear-full-blocks": tiny_gemma3(rope_scaling=LinearRopeScaling(factor=8.0)),
    "llama-linear": tiny_llama(rope_scaling=LinearRopeScaling(factor=4.0)),
}
HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "olmo2": "Olmo2ForCausalLM", "granite": "GraniteForCausalLM", "smollm3": "SmolLM3ForCausalLM",
              "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def _hf_model(directory: Path) -> torch.nn.Module:
    config = json.loads((directory / "config.json").read_text())
    cls = getattr(transformers, HF_CLASSES[config["model_type"]])
    # Gemma 2's soft-capped scores: transformers refuses SDPA for it, and its eager attention is the reference.
    attention = "eager" if config["model_type"] == "gemma2" else "sdpa"
    model = cls.from_pretrained(str(directory), dtype=torch.float32, attn_implementation=attention)
    return model.eval()


def _random_model(arch: ModelArchitecture) -> Decoder:
    model = Decoder(arch)
    model.init_weights(seed=7, std=0.1)
    with torch.no_grad():  # random norms and biases too, so every parameter matters
        for _name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _pair(arch: ModelArchitecture, directory: Path) -> tuple[Decoder, torch.nn.Module]:
    """Our model reloaded from its exported checkpoint, and transformers' model of the same checkpoint."""
    export_hf(_random_model(arch).state_dict(), arch, directory, dtype=torch.float32)
    reloaded = Decoder(arch)
    load_safetensors(reloaded, directory)
    return reloaded, _hf_model(directory)


def _tokens(arch: ModelArchitecture, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, arch.vocab_size, (2, 40), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", FAMILIES.values(), ids=FAMILIES.keys())
def test_logits_match_hugging_face(arch: ModelArchitecture, tmp_path: Path) -> None:
    reloaded, hf = _pair(arch, tmp_path / "ckpt")
    assert sum(p.numel() for p in hf.parameters()) == arch.parameter_count
    tokens = _tokens(arch)
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = reloaded.logits(tokens)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    # The test can fail: a perturbed weight changes the logits well beyond the tolerance.
    with torch.no_grad():
        reloaded.model.layers[1].mlp.up_proj.weight[0, 0] += 0.5
        assert not torch.allclose(reloaded.logits(tokens), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", FAMILIES.values(), ids=FAMILIES.keys())
def test_one_training_step_matches_hugging_face(arch: ModelArchitecture, tmp_path: Path) -> None:
    """Same loss, the same gradient for every parameter, and the same logits after one optimizer step."""
    ours, hf = _pair(arch, tmp_path / "ckpt")
    hf.train()
    tokens, targets = _tokens(arch, 1), _tokens(arch, 2)
    our_loss = ours(tokens, targets)
    hf_logits = hf(input_ids=tokens).logits
    hf_loss = F.cross_entropy(hf_logits.float().flatten(0, 1), targets.flatten(0, 1))
    torch.testing.assert_close(our_loss, hf_loss, atol=1e-5, rtol=1e-5)
    our_loss.backward()
    hf_loss.backward()
    # In the trainer's names (Phi-3's fused gradients split as its weights are).
    hf_gradients = from_hf_state_dict({name: p.grad for name, p in hf.named_parameters() if p.grad is not None}, arch)
    for name, parameter in ours.named_parameters():
        assert parameter.grad is not None, name
        torch.testing.assert_close(parameter.grad, hf_gradients[name], atol=1e-5, rtol=1e-5, msg=name)
    for model in (ours, hf):  # SGD: the update is linear in the gradient (Adam's first step is its sign,
        torch.optim.SGD(model.parameters(), lr=0.5).step()  # which rounding flips where a gradient is ~0)
    probe = _tokens(arch, 3)
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(probe), hf.eval()(input_ids=probe).logits, atol=1e-5, rtol=1e-5)


def test_hugging_face_names(llama_arch: ModelArchitecture) -> None:
    names = set(Decoder(llama_arch).state_dict())
    assert "model.embed_tokens.weight" in names
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert "model.layers.0.mlp.down_proj.weight" in names
    assert "model.norm.weight" in names and "lm_head.weight" in names


def test_fused_checkpoints_hold_phi3s_names_and_split_back() -> None:
    """A Phi-3 checkpoint stores q/k/v and gate/up stacked in that order; loading splits them into the same tensors."""
    arch = tiny_phi3()
    state = Decoder(arch).state_dict()
    exported = to_hf_state_dict(state, arch)
    assert {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"} <= exported.keys()
    assert not any(name.endswith((".q_proj.weight", ".gate_proj.weight", ".up_proj.weight")) for name in exported)
    layer = "model.layers.0."
    torch.testing.assert_close(exported[f"{layer}self_attn.qkv_proj.weight"], torch.cat(
        [state[f"{layer}self_attn.{part}_proj.weight"] for part in "qkv"]), atol=0, rtol=0)
    back = from_hf_state_dict(exported, arch)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], state[name]) for name in state)
    truncated = {**exported, f"{layer}mlp.gate_up_proj.weight": exported[f"{layer}mlp.gate_up_proj.weight"][:-1]}
    assert f"{layer}mlp.gate_up_proj.weight" in from_hf_state_dict(truncated, arch)  # left as it is, to be named


def test_load_rejects_wrong_architecture(llama_arch: ModelArchitecture, tmp_path: Path) -> None:
    model = Decoder(llama_arch)
    export_hf(model.state_dict(), llama_arch, tmp_path, dtype=torch.float32)
    wider = Decoder(tiny_llama(ffn_hidden_size=128))
    with pytest.raises(ValueError, match=r"mlp.gate_proj.weight has shape"):
        load_safetensors(wider, tmp_path)
    deeper = Decoder(tiny_llama(num_layers=3))
    with pytest.raises(ValueError, match=r"missing"):
        load_safetensors(deeper, tmp_path)
    with pytest.raises(FileNotFoundError):
        load_safetensors(model, tmp_path / "nothing")
