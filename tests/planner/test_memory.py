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


def _saved(tp: int, mode: str, *, compile: bool = True) -> float:
    from btk.planner.memory import saved_activation_bytes_per_token_per_layer

    knobs = TrainingKnobs(micro_batch_size=2, seq_len=2048, tensor_parallel=tp, activation_checkpointing=mode,
                          compile=compile)
    return saved_activation_bytes_per_token_per_layer(ARCH, knobs)


H = ARCH.hidden_size


@pytest.mark.parametrize("compile", [True, False])
def test_sequence_parallel_shards_all_but_the_gathered_inputs_without_checkpointing(compile: bool) -> None:
    """Under TP with sequence parallelism every saved tensor is sharded except the two all-gathered inputs of the
    column-parallel linears (q/k/v and gate/up), which hold the full sequence on every rank."""
    gathered = 2 * H * 2
    assert _saved(2, "none", compile=compile) - gathered == pytest.approx((_saved(1, "none", compile=compile)
                                                                           - gathered) / 2)


def test_eager_selective_checkpointing_under_tp_keeps_the_partial_sums_of_the_down_projection() -> None:
    """Eagerly the per-op policy keeps the down projection's output: under TP its full-sequence partial sums (bf16,
    not divided by TP), and both reduce-scatters' sharded outputs; compiled, backward never reads them."""
    partial_sums, reduce_scatters = H * 2, 2 * H * 2
    eager_one, eager_two = _saved(1, "selective", compile=False), _saved(2, "selective", compile=False)
    assert eager_two == pytest.approx((eager_one - partial_sums + reduce_scatters) / 2 + partial_sums)
    assert _saved(2, "selective") == pytest.approx(_saved(1, "selective") / 2)
    assert _saved(1, "selective") == pytest.approx(eager_one - partial_sums)


def test_full_checkpointing_keeps_the_block_input_sequence_sharded() -> None:
    assert _saved(1, "full") == H * 2
    assert _saved(2, "full") == pytest.approx(_saved(1, "full") / 2)
