"""The memory model under tensor parallelism: sequence parallelism and a loss-parallel head (as the trainer runs)."""

from __future__ import annotations

import pytest

from btk.knobs import TrainingKnobs
from btk.planner.memory import MemoryBreakdown, estimate_memory
from btk.profile import ModelArchitecture

ARCH = ModelArchitecture(num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=4,
                         ffn_hidden_size=2816, vocab_size=32000, tied_embeddings=False, max_context=4096,
                         attention_bias=False, rope_theta=10000.0)


def _breakdown(tp: int, activation_checkpointing: str = "selective", fused_loss: bool = True,
               whole_logits: bool = False) -> MemoryBreakdown:
    knobs = TrainingKnobs(micro_batch_size=2, seq_len=2048, tensor_parallel=tp, fused_loss=fused_loss,
                          activation_checkpointing=activation_checkpointing)
    return estimate_memory(ARCH, knobs, gpus_per_node=8, nodes=1, capacity_gib=80.0, whole_logits=whole_logits)


@pytest.mark.parametrize("fused_loss", [True, False])
def test_tensor_parallel_two_halves_the_logits(fused_loss: bool) -> None:
    """The head's logits are vocabulary-sharded (loss-parallel head): TP=2 holds half of them (held whole here;
    the chunked loss's own split is tested with the trainer, tests/trainer/test_loss.py)."""
    one, two = _breakdown(1, fused_loss=fused_loss, whole_logits=True), _breakdown(2, fused_loss=fused_loss,
                                                                                    whole_logits=True)
    assert one.peak_phase == two.peak_phase == "loss"
    assert two.logits == pytest.approx(one.logits / 2)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_sequence_parallel_shards_every_saved_activation(mode: str) -> None:
    """Norm inputs/outputs and block inputs between the blocks are sequence-sharded: nothing stays replicated."""
    from btk.planner.memory import saved_activation_bytes_per_token_per_layer

    def saved(tp: int) -> float:
        knobs = TrainingKnobs(micro_batch_size=2, seq_len=2048, tensor_parallel=tp, activation_checkpointing=mode)
        return saved_activation_bytes_per_token_per_layer(ARCH, knobs)

    assert saved(2) == pytest.approx(saved(1) / 2)
