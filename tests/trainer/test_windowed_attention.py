"""Gemma's attention on the CUDA path against the CPU path: flex_attention with the block mask of a sliding window
(and of the documents) and the soft cap as a ``score_mod``, against the dense window mask and the soft cap written
out (:func:`btk_trainer.model.soft_capped_attention`). flex_attention runs here eagerly on the CPU, forward only
(torch 2.13 has no CPU backward for it); the CPU path's backward is proven against transformers' Gemma models
(tests/trainer/test_model_parity.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from btk_trainer.data import document_ids
from btk_trainer.model import (
    additive_mask,
    dense_positioned_mask,
    positioned_causal,
    soft_cap_score,
    soft_capped_attention,
)

EOS = 3
WINDOW = 5


def _documents() -> torch.Tensor:
    tokens = torch.tensor([[5, 9, 11, 7, 8, 6, 4, 9, EOS, 12, 13, EOS, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
                           [40 + i for i in range(24)]])
    return document_ids(tokens, EOS)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # on purpose: eager, on CPU
@pytest.mark.parametrize("documents", [False, True], ids=["window", "window-and-documents"])
def test_flex_with_the_window_and_the_soft_cap_equals_the_cpu_path(documents: bool) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(4)
    ids = _documents() if documents else None
    batch, seq, heads, kv_heads, width = 2, 24, 4, 2, 16
    q = torch.randn(batch, heads, seq, width) * 3  # scores large enough for the cap to bend them
    k, v = torch.randn(batch, kv_heads, seq, width) * 3, torch.randn(batch, kv_heads, seq, width)
    positions = torch.arange(seq)
    rule = positioned_causal(positions, positions, ids, WINDOW)
    block_mask = create_block_mask(rule, batch if documents else None, None, seq, seq, device="cpu")
    scale, cap = 24 ** -0.5, 5.0
    flex: Any = flex_attention(q, k, v, block_mask=block_mask, score_mod=soft_cap_score(cap), scale=scale,
                               enable_gqa=True)
    dense = additive_mask(dense_positioned_mask(positions, positions, ids, WINDOW), q.dtype)
    written_out = soft_capped_attention(q, k, v, dense, scale, cap)
    torch.testing.assert_close(flex, written_out, rtol=1e-5, atol=1e-5)
    # Both can fail: without the cap, or with a window one wider, the outputs move well beyond the tolerance.
    uncapped = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    assert not torch.allclose(uncapped, written_out, rtol=1e-3, atol=1e-3)
    wider = additive_mask(dense_positioned_mask(positions, positions, ids, WINDOW + 1), q.dtype)
    assert not torch.allclose(soft_capped_attention(q, k, v, wider, scale, cap), written_out, rtol=1e-3, atol=1e-3)
