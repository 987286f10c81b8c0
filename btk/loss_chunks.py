"""How the trainer's chunked cross-entropy cuts a micro-batch, and the memory its loss holds at the peak.

One rule for the trainer (``containers/btk_trainer/model.py``, ``chunked_cross_entropy``) and the
planner's memory model (``btk/planner/memory.py``, its logits term).

The loss never holds a micro-batch's logits whole: the tokens are cut into chunks, and each
chunk's logits are computed, turned into its loss and the gradient of that loss, and freed
before the next chunk (torchtitan's ``ChunkedLossWrapper``,
https://github.com/pytorch/torchtitan/blob/main/torchtitan/components/loss.py, computes each
chunk's backward inside the forward the same way; so does Liger-Kernel's fused linear
cross-entropy). The chunk size is Liger-Kernel's rule
(https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/fused_linear_cross_entropy.py):
``ceil(vocab / hidden)`` chunks of a power-of-two number of tokens, so one chunk's logits take
about as many elements as the micro-batch's hidden states.
"""

from __future__ import annotations

import math

BF16 = 2
FP32 = 4
#: Bytes per logit of one chunk at its peak: the fused (compiled) kernel keeps the logits in the
#: compute dtype and writes their gradient in it (2 + 2); the eager one adds the fp32 upcast, the
#: fp32 softmax and a temporary of the log-sum-exp (2 + 4 + 4 + 4).
FUSED_BYTES_PER_LOGIT = 4
EAGER_BYTES_PER_LOGIT = 14


def loss_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Tokens per chunk: ``ceil(tokens / ceil(vocab / hidden))`` rounded up to a power of two, at most ``tokens``.

    ``vocab`` is the vocabulary this rank computes logits for (its shard under tensor parallelism).
    """
    if min(tokens, vocab, hidden) < 1:
        raise ValueError(f"tokens, vocab and hidden must be >= 1, got {tokens}, {vocab}, {hidden}")
    chunks = -(-vocab // hidden)
    per_chunk = -(-tokens // chunks)
    return min(tokens, 1 << math.ceil(math.log2(per_chunk)))


def loss_peak_bytes(tokens: int, vocab_size: int, hidden_size: int, *, tensor_parallel: int, fused: bool) -> float:
    """Bytes the loss holds at its peak on one rank, beyond the hidden states and the head weight.

    * one chunk's logits at their peak (:data:`FUSED_BYTES_PER_LOGIT` / :data:`EAGER_BYTES_PER_LOGIT`
      per logit; the vocabulary is sharded by tensor parallelism, the loss-parallel head);
    * the head weight's gradient, accumulated over the chunks in fp32 and handed to backward in
      the compute dtype (both exist when the last chunk is done): 6 bytes per head parameter of
      this rank;
    * the hidden states' gradient (bf16), written chunk by chunk (whole sequence on every TP rank:
      the head takes the gathered hidden states).
    """
    vocab = vocab_size // tensor_parallel
    chunk = loss_chunk_tokens(tokens, vocab, hidden_size)
    per_logit = FUSED_BYTES_PER_LOGIT if fused else EAGER_BYTES_PER_LOGIT
    return chunk * vocab * per_logit + vocab * hidden_size * (FP32 + BF16) + tokens * hidden_size * BF16


def whole_loss_peak_bytes(tokens: int, vocab_size: int, *, tensor_parallel: int, fused: bool) -> float:
    """Bytes a loss that holds the micro-batch's logits whole peaks at (the published torchtitan runs the memory
    model is calibrated on): the logits and their gradient, per logit as one chunk's above."""
    per_logit = FUSED_BYTES_PER_LOGIT if fused else EAGER_BYTES_PER_LOGIT
    return tokens * vocab_size / tensor_parallel * per_logit
