"""Context parallelism: the ranks of one ``cp`` mesh group share each sequence.

Each rank computes ``seq_len / cp`` positions of every sequence: two chunks of ``seq_len / (2 cp)``,
chunk ``r`` and chunk ``2 cp - 1 - r``, one from each end, so every rank does the same share of
the causal attention's work. Every other layer is per position and runs on the rank's own
tokens. Each attention layer gathers the keys and values of the whole sequence from the group
(an all-gather, its backward a reduce-scatter) and attends its queries to them under the causal
rule by position, within documents when the run masks documents: Llama 3's all-gather context
parallelism (Llama Team, "The Llama 3 Herd of Models", 2024, section 3.3.2), which keeps every
attention mask exact, document masks included. Keys and values are ``kv_heads x head_dim`` wide,
a fraction of the hidden size under grouped-query attention, so the gather moves less than a
ring of both would.

Why not PyTorch's ``context_parallel`` API (torchtitan's): in the pinned torch it dispatches
``scaled_dot_product_attention`` only through the CUDA kernels (flash, memory-efficient, cuDNN);
the CPU kernel has no sharding strategy (``aten._scaled_dot_product_flash_attention_for_cpu``),
so it cannot be tested against the unsharded model on CPU processes, and its causal load
balancer and document masks are a separate flex-attention path. The gather here is the same code
on both devices: the parity tests run what the GPUs run.

The model holds the rule of its positions (:class:`btk_trainer.model.SequenceShard`) and each
attention layer a ``gather_keys`` hook; :func:`apply_context_parallel` sets both. The loss of a
rank is the mean over its own positions: equal for every rank, so the mean over the group (FSDP
reduces gradients over ``dp_shard x cp``) is the sequence's mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from btk_trainer.model import Attention, Decoder


@dataclass(frozen=True)
class SequenceChunks:
    """The positions of rank ``rank`` of ``degree`` ranks sharing each sequence."""

    degree: int
    rank: int

    def chunks(self, rank: int) -> tuple[int, int]:
        """The two chunks (of ``2 x degree``) rank ``rank`` computes: one from each end of the sequence."""
        return rank, 2 * self.degree - 1 - rank

    def positions_of(self, rank: int, seq_len: int, device: torch.device) -> torch.Tensor:
        chunk = seq_len // (2 * self.degree)
        if chunk * 2 * self.degree != seq_len:
            raise ValueError(f"seq_len {seq_len} does not split into {2 * self.degree} equal chunks")
        return torch.cat([torch.arange(index * chunk, (index + 1) * chunk, device=device)
                          for index in self.chunks(rank)])

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self.positions_of(self.rank, seq_len, device)

    def key_positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """Positions of the gathered keys: every rank's positions, in rank order (the all-gather's order)."""
        return torch.cat([self.positions_of(rank, seq_len, device) for rank in range(self.degree)])


@dataclass(frozen=True)
class ContextParallelShard(SequenceChunks):
    """:class:`SequenceChunks` with the process group whose ranks gather each other's keys and values."""

    group: Any = None

    def gather(self, heads: torch.Tensor) -> torch.Tensor:
        """Every rank's ``heads`` (batch, heads, positions, head_dim) along the positions, in rank order;
        differentiable (backward reduce-scatters the gradient to each rank's own positions)."""
        from torch.distributed._functional_collectives import all_gather_single_autograd

        gathered: torch.Tensor = all_gather_single_autograd(heads.contiguous(), gather_dim=2, group=self.group)
        return gathered


def apply_context_parallel(model: Decoder, cp_mesh: Any) -> None:
    """Make ``model`` compute this rank's positions of each sequence and gather keys and values over ``cp_mesh``."""
    shard = ContextParallelShard(degree=cp_mesh.size(), rank=cp_mesh.get_local_rank(), group=cp_mesh.get_group())
    model.sequence_shard = shard
    for module in model.modules():
        if isinstance(module, Attention):
            module.gather_keys = shard.gather
