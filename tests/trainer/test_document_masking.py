"""Document masking: attention within each packed document equals each document attended alone.

The reference is the unpacked computation: every document's tokens run through the same
attention (or the same model) on their own, positions counted from 0, and the packed, masked
result at that document's positions must equal it. RoPE makes attention depend on relative
positions only, so the only difference is the rounding of the position tables (fp32 here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer.data import document_ids
from btk_trainer.model import Attention, Decoder, dense_document_mask, same_document_causal
from btk_trainer.train import RunConfig, train
from trainer_fixtures import masked, tiny_qwen, tiny_spec

EOS = 3
# Two windows of 24 tokens: a long, a one-token and a mid-length document then an unfinished one; one document.
WINDOWS = [[5, 9, 11, 7, 8, EOS, EOS, 12, 13, 14, 15, EOS, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
           [40 + i for i in range(24)]]


def _documents() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor(WINDOWS)
    return tokens, document_ids(tokens, EOS)


def _spans(documents: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(window, positions) of every document."""
    return [(b, (documents[b] == d).nonzero().squeeze(1)) for b in range(documents.shape[0])
            for d in documents[b].unique().tolist()]


def test_the_windows_hold_the_documents_the_test_means() -> None:
    _, documents = _documents()
    assert [len(positions) for _, positions in _spans(documents)] == [6, 1, 5, 12, 24]


def test_masked_attention_equals_each_document_attended_alone_forward_and_backward() -> None:
    """Outputs and every gradient (input, projections) of one packed, masked call against per-document calls."""
    torch.manual_seed(0)
    arch = tiny_qwen()  # grouped-query attention with biases
    attention = Attention(arch)
    model = Decoder(arch)
    tokens, documents = _documents()
    x = torch.randn(*tokens.shape, arch.hidden_size, requires_grad=True)
    cos, sin = model.rope(tokens.shape[1], torch.device("cpu"))
    weights = torch.randn(*tokens.shape, arch.hidden_size)

    packed = attention(x, cos, sin, model.attention_mask(documents))
    (packed * weights).sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in attention.named_parameters() if p.grad is not None}
    packed_x_grad = x.grad.clone() if x.grad is not None else None
    attention.zero_grad()

    alone_x = x.detach().clone().requires_grad_(True)
    total = torch.zeros(())
    for b, positions in _spans(documents):
        length = len(positions)
        out = attention(alone_x[b:b + 1, positions], cos[:length], sin[:length])
        torch.testing.assert_close(packed[b:b + 1, positions], out, rtol=1e-5, atol=1e-6)
        total = total + (out * weights[b:b + 1, positions]).sum()
    total.backward()
    assert packed_x_grad is not None and alone_x.grad is not None
    torch.testing.assert_close(packed_x_grad, alone_x.grad, rtol=1e-5, atol=1e-6)
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None
        torch.testing.assert_close(packed_grads[name], parameter.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_a_masked_model_gives_each_document_the_logits_it_has_alone() -> None:
    torch.manual_seed(1)
    model = Decoder(tiny_qwen())
    model.init_weights(1)
    tokens, documents = _documents()
    with torch.no_grad():
        packed = model(tokens, documents=documents)
        unmasked = model(tokens)
        for b, positions in _spans(documents):
            alone = model(tokens[b:b + 1, positions])
            torch.testing.assert_close(packed[b:b + 1, positions], alone, rtol=1e-5, atol=1e-5)
    # Without the mask the second and later documents of the first window see the ones before: different logits.
    assert not torch.allclose(packed[0, 6:], unmasked[0, 6:], atol=1e-3)
    torch.testing.assert_close(packed[1], unmasked[1])  # a window that is one document: the mask changes nothing


def test_the_flex_attention_rule_is_the_dense_masks() -> None:
    """The CUDA path's mask_mod, evaluated by flex_attention's own mask builder, marks the dense mask's pairs."""
    from torch.nn.attention.flex_attention import create_mask

    _, documents = _documents()
    batch, seq = documents.shape
    built = create_mask(same_document_causal(documents), batch, None, seq, seq, device="cpu")
    assert torch.equal(built, dense_document_mask(documents))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # on purpose: eager, on CPU
def test_flex_attention_with_the_block_mask_equals_the_dense_path_forward() -> None:
    """flex_attention (forward: torch has no CPU backward for it) with the block mask the CUDA path builds, against
    SDPA with the dense mask: the same attention."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(2)
    _, documents = _documents()
    batch, seq = documents.shape
    q, k, v = (torch.randn(batch, 4, seq, 16) for _ in range(3))
    block_mask = create_block_mask(same_document_causal(documents), batch, None, seq, seq, device="cpu")
    flex: Any = flex_attention(q, k, v, block_mask=block_mask)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(documents))
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("one_rank")
def test_a_run_with_document_masking_trains_and_says_so(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = train(RunConfig(spec=tiny_spec(), data_dir=dataset, max_steps=2, device="cpu"))
    out = capsys.readouterr().out
    assert "attention is causal over the whole window" in out
    result = train(RunConfig(spec=masked(tiny_spec()), data_dir=dataset, max_steps=2, device="cpu"))
    assert "attention stays within each document" in capsys.readouterr().out
    assert all(torch.isfinite(torch.tensor(loss)) for loss in result.losses.values())
    assert abs(result.losses[1] - plain.losses[1]) > 1e-3  # the same weights and windows, masked: another loss


def test_compiled_blocks_take_the_mask_whole_graph() -> None:
    """Blocks compiled as the trainer compiles them (fullgraph; AOT autograd here, Inductor on GPUs) take the mask as
    an input and give the eager logits and gradients."""
    from btk_trainer.parallelize import apply_compile

    torch.manual_seed(3)
    eager = Decoder(tiny_qwen())
    eager.init_weights(3)
    compiled = Decoder(tiny_qwen())
    compiled.load_state_dict(eager.state_dict())
    apply_compile(compiled, backend="aot_eager")
    tokens, documents = _documents()
    targets = torch.roll(tokens, -1, dims=1)
    losses = [model(tokens, targets, documents) for model in (eager, compiled)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-6)
    for (name, reference), (_, found) in zip(eager.named_parameters(), compiled.named_parameters(), strict=True):
        assert reference.grad is not None and found.grad is not None
        torch.testing.assert_close(reference.grad, found.grad, rtol=1e-5, atol=1e-6, msg=name)
