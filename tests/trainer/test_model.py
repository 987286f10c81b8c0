"""The decoder's own initialisation: one rule, one path, the same weights whatever wraps the blocks."""

from __future__ import annotations

import math

import pytest
import torch
from btk_trainer.model import Decoder, rounded_to
from btk_trainer.parallelize import apply_activation_checkpointing
from trainer_fixtures import tiny_gemma2, tiny_llama

from btk.profile import ModelArchitecture


def _initialised(arch: ModelArchitecture, seed: int, std: float = 0.02) -> Decoder:
    model = Decoder(arch)
    model.init_weights(seed, std)
    return model


def test_one_seed_one_model(llama_arch: ModelArchitecture) -> None:
    first, again, other = (_initialised(llama_arch, seed).state_dict() for seed in (5, 5, 6))
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])


def test_init_rule(qwen_arch: ModelArchitecture) -> None:
    """Norms one, biases zero, matrices normal(0, std), residual-stream outputs std / sqrt(2 * layers)."""
    state = _initialised(tiny_llama(num_layers=2, hidden_size=256, ffn_hidden_size=512), seed=0, std=0.1).state_dict()
    assert torch.equal(state["model.norm.weight"], torch.ones(256))
    assert state["model.layers.0.mlp.up_proj.weight"].std().item() == pytest.approx(0.1, rel=0.02)
    depth_std = 0.1 / math.sqrt(2 * 2)
    for name in ("model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert state[name].std().item() == pytest.approx(depth_std, rel=0.02), name
    tied = _initialised(qwen_arch, seed=0)
    assert tied.weights_tied
    bias = tied.model.layers[0].self_attn.q_proj.bias
    assert torch.equal(bias, torch.zeros_like(bias))


def test_wrapped_blocks_initialise_alike(llama_arch: ModelArchitecture) -> None:
    """Activation checkpointing wraps every block; each still initialises its own parameters, to the same values."""
    wrapped = Decoder(llama_arch)
    apply_activation_checkpointing(wrapped, "full")
    wrapped.init_weights(3)
    plain = _initialised(llama_arch, 3).state_dict()
    state = {name.replace("_checkpoint_wrapped_module.", ""): value for name, value in wrapped.state_dict().items()}
    assert sorted(state) == sorted(plain)
    assert all(torch.equal(state[name], plain[name]) for name in plain)


def test_a_parameter_left_out_is_an_error(llama_arch: ModelArchitecture) -> None:
    model = Decoder(llama_arch)
    model.model.extra = torch.nn.Linear(4, 4)  # a parameter no block's init_weights knows about
    with pytest.raises(RuntimeError, match="left 2 parameter"):
        model.init_weights(0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_value_is_rounded_as_torch_rounds_it(dtype: torch.dtype) -> None:
    """Gemma's embedding scale is sqrt(hidden_size) in the compute dtype (transformers rounds it so); the dry run's
    fake tensors hold no value, so it is rounded without one, and must round as torch does, ties included."""
    values = [math.sqrt(width) for width in (1152, 2304, 2560, 3584, 3840, 4608, 5376)]
    values += [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, 65504.0, 1e-3, 123.456]
    for value in values:
        assert rounded_to(dtype, value) == torch.tensor(value, dtype=torch.float64).to(dtype).item(), value


def test_gemmas_blocks_start_as_the_identity_norm_and_scale_by_one_plus_the_weight() -> None:
    """Gemma's norms scale by 1 + weight: they start at zero (Gemma2RMSNorm's init), so the norm is plain RMS."""
    model = _initialised(tiny_gemma2(), seed=0)
    state = model.state_dict()
    assert torch.equal(state["model.layers.0.pre_feedforward_layernorm.weight"], torch.zeros(64))
    x = torch.randn(2, 3, 64)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(model.model.norm(x), expected)


def test_a_windowed_block_refuses_to_attend_without_its_mask() -> None:
    """Without its mask a windowed block would attend to the whole sequence: it says so instead."""
    model = _initialised(tiny_gemma2(), seed=0)
    block = model.model.layers[0]
    cos, sin = model.rope(8, torch.device("cpu"))
    with pytest.raises(ValueError, match="sliding window"):
        block(torch.randn(1, 8, 64), cos, sin, None)
