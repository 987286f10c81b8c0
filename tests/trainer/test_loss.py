"""The chunked cross-entropy: Liger-Kernel's chunk rule, the eager loss's values and gradients, and the memory
the planner charges for it, measured."""

from __future__ import annotations

import pytest
import torch
from btk_trainer.model import ChunkedCrossEntropy, Decoder, LossFn, eager_cross_entropy
from torch.distributed._tools.mem_tracker import MemTracker
from trainer_fixtures import tiny_llama

from btk.loss_chunks import loss_chunk_tokens, loss_peak_bytes, whole_loss_peak_bytes


def test_chunk_rule_is_ligers() -> None:
    """Liger-Kernel's worked example (fused_linear_cross_entropy.py): "BT = 4096*4, V = 32000, H = 4096 ==>
    inc_factor = 8, chunk_size = 2048"; a micro-batch smaller than one chunk is one chunk."""
    assert loss_chunk_tokens(4096 * 4, 32000, 4096) == 2048
    assert loss_chunk_tokens(100, 32000, 4096) == 16  # 100 / 8 = 12.5 -> 13 -> the next power of two
    assert loss_chunk_tokens(8, 128, 4096) == 8
    with pytest.raises(ValueError):
        loss_chunk_tokens(0, 128, 64)


def _loss_and_gradients(loss_fn: LossFn, dtype: torch.dtype, tokens: int, vocab: int = 300,
                        hidden: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, tokens // 2, hidden, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) * 0.2).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (2, tokens // 2), generator=generator)
    loss = loss_fn(states, weight, targets)
    (loss / 3).backward()  # a scaled loss, as with gradient accumulation
    assert states.grad is not None and weight.grad is not None
    return loss.detach(), states.grad, weight.grad


@pytest.mark.parametrize("tokens", [128, 126])  # 126: the last chunk is shorter
def test_chunked_loss_equals_the_whole_logits_loss_in_fp32(tokens: int) -> None:
    assert loss_chunk_tokens(tokens, 300, 32) < tokens  # really chunked
    whole = _loss_and_gradients(eager_cross_entropy, torch.float32, tokens)
    chunked = _loss_and_gradients(ChunkedCrossEntropy(), torch.float32, tokens)
    assert chunked[0].item() == pytest.approx(whole[0].item(), rel=1e-6)
    for mine, reference in zip(chunked[1:], whole[1:], strict=True):
        assert torch.allclose(mine, reference, rtol=1e-5, atol=1e-6 * reference.abs().max().item())


def test_chunked_loss_in_bf16_rounds_like_the_whole_logits_loss() -> None:
    """bf16 logits upcast to fp32 in both; the gradients differ by bf16 rounding (2^-8 relative) at most."""
    whole = _loss_and_gradients(eager_cross_entropy, torch.bfloat16, 128)
    chunked = _loss_and_gradients(ChunkedCrossEntropy(), torch.bfloat16, 128)
    assert chunked[0].item() == pytest.approx(whole[0].item(), rel=1e-6)
    for mine, reference in zip(chunked[1:], whole[1:], strict=True):
        scale = reference.float().abs().max().item()
        assert (mine.float() - reference.float()).abs().max().item() <= 2 * 2**-8 * scale


def test_the_decoder_trains_through_the_chunked_loss() -> None:
    """The model's own loss is the chunked one and gives the whole-logits loss's gradients to every parameter."""
    arch = tiny_llama()
    chunked, whole = Decoder(arch), Decoder(arch)
    chunked.init_weights(seed=3)
    whole.load_state_dict(chunked.state_dict())
    whole.loss_fn = eager_cross_entropy
    assert isinstance(chunked.loss_fn, ChunkedCrossEntropy)
    tokens = torch.randint(0, arch.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    assert loss_chunk_tokens(64, arch.vocab_size, arch.hidden_size) < 64
    for model in (chunked, whole):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    reference = dict(whole.named_parameters())
    for name, parameter in chunked.named_parameters():
        assert parameter.grad is not None and torch.allclose(parameter.grad, reference[name].grad, atol=1e-6), name


def _measured_peak(loss_fn: LossFn, tokens: int, vocab: int, hidden: int) -> int:
    """Bytes the loss's forward + backward allocate at their peak beyond its inputs (torch's MemTracker)."""
    states = torch.randn(4, tokens // 4, hidden, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (4, tokens // 4))
    tracker = MemTracker()
    tracker.track_external(states, weight, targets)
    with tracker:
        loss_fn(states, weight, targets).backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return sum(value for kind, value in peak.items() if str(kind) in ("_MemRefType.ACT", "_MemRefType.TEMP"))


def test_the_memory_model_bounds_the_measured_peak_of_either_loss() -> None:
    """The planner's figures (btk.loss_chunks, eager kernels) against what the losses really allocate in bf16:
    within a factor of 2 below the figure, never above it; the chunked loss holds a tenth of the whole one's."""
    tokens, vocab, hidden = 1024, 4096, 64
    whole = _measured_peak(eager_cross_entropy, tokens, vocab, hidden)
    chunked = _measured_peak(ChunkedCrossEntropy(), tokens, vocab, hidden)
    whole_model = whole_loss_peak_bytes(tokens, vocab, tensor_parallel=1, fused=False)
    chunked_model = loss_peak_bytes(tokens, vocab, hidden, tensor_parallel=1, fused=False)
    assert whole_model / 2 <= whole <= whole_model
    assert chunked_model / 2 <= chunked <= chunked_model
    assert chunked * 10 < whole
