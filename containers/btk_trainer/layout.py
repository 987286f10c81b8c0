"""The parallel layout of a job (no torch import: the entrypoint validates it before launching).

Device mesh dimensions ``(dp_replicate, dp_shard, tp)``: see :mod:`btk_trainer.parallelize`.
"""

from __future__ import annotations

from dataclasses import dataclass

from btk.errors import BtkError
from btk.knobs import TrainingKnobs


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the three mesh dimensions."""

    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


def mesh_shape(world_size: int, nnodes: int, knobs: TrainingKnobs) -> MeshShape:
    """The mesh for ``world_size`` ranks on ``nnodes`` nodes under ``knobs``; one-line errors."""
    tp = knobs.tensor_parallel
    if world_size % tp:
        raise BtkError(f"tensor_parallel={tp} must divide the {world_size} GPUs of the job")
    if nnodes > 1 and (world_size // nnodes) % tp:
        raise BtkError(f"tensor_parallel={tp} must divide the {world_size // nnodes} GPUs of one node")
    dp = world_size // tp
    if knobs.sharding == "no_shard":
        return MeshShape(dp_replicate=dp, dp_shard=1, tp=tp)
    if knobs.sharding == "hybrid_shard" and nnodes > 1:
        if dp % nnodes:
            raise BtkError(f"sharding=hybrid_shard needs the {dp} data-parallel ranks to divide over {nnodes} nodes")
        return MeshShape(dp_replicate=nnodes, dp_shard=dp // nnodes, tp=tp)
    return MeshShape(dp_replicate=1, dp_shard=dp, tp=tp)
