"""Peak memory of the loss on the 3B planned case, before (logits held whole) and after (chunked): the memory model.

Run: ``.venv/bin/python benchmarks/loss_memory.py [--profile llama3.2-3b] [--instance ml.p6-b200.48xlarge]``.

The planned case is the plan ``btk plan llama3.2-3b`` gave for one ml.p6-b200.48xlarge before the
loss was chunked: micro-batch 4 of 8192 tokens, fp8_tensorwise, no activation checkpointing,
full shard, compiled blocks and fused loss. The script prints the loss's terms as
:mod:`btk.loss_chunks` derives them (the same rule the trainer cuts its chunks by), then the
per-GPU totals of :func:`btk.planner.memory.estimate_memory` with the logits held whole and
chunked, for that micro-batch and the next larger ones, against the planner's memory budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from btk.catalog import get_profile
from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.loss_chunks import (
    BF16,
    FP32,
    FUSED_BYTES_PER_LOGIT,
    loss_chunk_tokens,
    loss_peak_bytes,
    whole_loss_peak_bytes,
)
from btk.planner.memory import estimate_memory
from btk.planner.search import memory_budget_gib

GIB = 1024**3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="llama3.2-3b")
    parser.add_argument("--instance", default="ml.p6-b200.48xlarge")
    args = parser.parse_args()
    profile, instance = get_profile(args.profile), get_instance_type(args.instance)
    arch = profile.architecture
    knobs = TrainingKnobs(micro_batch_size=4, seq_len=8192, precision="fp8_tensorwise", activation_checkpointing="none",
                          sharding="full_shard", tensor_parallel=1, compile=True, fused_loss=True)
    tokens, vocab, hidden = knobs.micro_batch_size * knobs.seq_len, arch.vocab_size, arch.hidden_size
    chunk = loss_chunk_tokens(tokens, vocab, hidden)
    print(f"{args.profile}: vocabulary V = {vocab:,}, hidden H = {hidden:,}; micro-batch {knobs.micro_batch_size} x "
          f"{knobs.seq_len} = T = {tokens:,} tokens, tensor_parallel 1, fused loss")
    before = whole_loss_peak_bytes(tokens, vocab, tensor_parallel=1, fused=True)
    print(f"before (logits whole): T x V x {FUSED_BYTES_PER_LOGIT} B (bf16 logits + their bf16 gradient) = "
          f"{tokens:,} x {vocab:,} x {FUSED_BYTES_PER_LOGIT} = {before / GIB:.2f} GiB")
    print(f"after (chunked): ceil(V / H) = {-(-vocab // hidden)} chunks -> ceil(T / {-(-vocab // hidden)}) = "
          f"{-(-tokens // -(-vocab // hidden)):,} -> next power of two: {chunk:,} tokens per chunk")
    terms = {
        f"one chunk's logits, C x V x {FUSED_BYTES_PER_LOGIT} B": chunk * vocab * FUSED_BYTES_PER_LOGIT,
        f"head gradient, V x H x ({FP32} B fp32 sum + {BF16} B bf16 result)": vocab * hidden * (FP32 + BF16),
        f"hidden-state gradient, T x H x {BF16} B": tokens * hidden * BF16,
    }
    for name, value in terms.items():
        print(f"  {name:<58} {value / GIB:6.2f} GiB")
    after = loss_peak_bytes(tokens, vocab, hidden, tensor_parallel=1, fused=True)
    assert abs(after - sum(terms.values())) < 1
    print(f"  {'total':<58} {after / GIB:6.2f} GiB  ({before / after:.1f}x less than before)")
    budget = memory_budget_gib(instance)
    print(f"\nper-GPU peak on 1 x {args.instance} (budget {budget:.0f} GiB, the planner's 90 % of HBM):")
    print(f"{'knobs':<34} {'logits whole':>14} {'chunked':>10}")
    for micro_batch, checkpointing in ((4, "none"), (8, "none"), (8, "selective"), (16, "selective")):
        candidate = knobs.model_copy(update={"micro_batch_size": micro_batch,
                                             "activation_checkpointing": checkpointing})
        whole, chunked = (estimate_memory(arch, candidate, instance.gpus_per_node, 1, instance.hbm_gib,
                                          whole_logits=held).total for held in (True, False))

        def fits(gib: float) -> str:
            return f"{gib:8.1f}{' ' if gib <= budget else '!'}"

        print(f"{f'mb={micro_batch} ac={checkpointing}':<34} {fits(whole):>14} {fits(chunked):>10}")
    print("(! over the budget)")


if __name__ == "__main__":
    main()
