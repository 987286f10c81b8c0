"""Our decoder equals Hugging Face transformers' Llama and Qwen2 on the same weights.

Tolerance: fp32 logits within atol 1e-5 / rtol 1e-5 (same math, different op order).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from btk_trainer.model import Decoder, export_hf, load_safetensors
from trainer_fixtures import tiny_llama, tiny_qwen

from btk.profile import ModelArchitecture

transformers = pytest.importorskip("transformers")


def _hf_model(directory: Path) -> torch.nn.Module:
    config = json.loads((directory / "config.json").read_text())
    cls = transformers.Qwen2ForCausalLM if config["model_type"] == "qwen2" else transformers.LlamaForCausalLM
    model = cls.from_pretrained(str(directory), torch_dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


@pytest.mark.parametrize("arch", [tiny_llama(), tiny_qwen(), tiny_llama(num_kv_heads=4, tied_embeddings=True)],
                         ids=["llama-gqa-rope-scaling", "qwen2-bias-tied", "llama-mha-tied"])
def test_logits_match_hugging_face(arch: ModelArchitecture, tmp_path: Path) -> None:
    ours = Decoder(arch)
    ours.init_weights(seed=7, std=0.1)
    with torch.no_grad():  # random norms and biases too, so every parameter matters
        for _name, parameter in ours.named_parameters():
            if parameter.ndim == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    export_hf(ours.state_dict(), arch, tmp_path / "ckpt", dtype=torch.float32)

    reloaded = Decoder(arch)
    load_safetensors(reloaded, tmp_path / "ckpt")
    hf = _hf_model(tmp_path / "ckpt")
    tokens = torch.randint(0, arch.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = reloaded.logits(tokens)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    # The test can fail: a perturbed weight changes the logits well beyond the tolerance.
    with torch.no_grad():
        reloaded.model.layers[1].mlp.up_proj.weight[0, 0] += 0.5
        assert not torch.allclose(reloaded.logits(tokens), expected, atol=1e-5, rtol=1e-5)


def test_hugging_face_names(llama_arch: ModelArchitecture) -> None:
    names = set(Decoder(llama_arch).state_dict())
    assert "model.embed_tokens.weight" in names
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert "model.layers.0.mlp.down_proj.weight" in names
    assert "model.norm.weight" in names and "lm_head.weight" in names


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
