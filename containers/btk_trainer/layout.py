"""The parallel layout of a job (no torch import: the entrypoint validates it before launching).

Device mesh dimensions ``(dp_replicate, dp_shard, cp, tp)``: see :mod:`btk_trainer.parallelize`.
"""

from __future__ import annotations

from dataclasses import dataclass

from btk.errors import BtkError
from btk.knobs import TrainingKnobs
from btk.planner.throughput import gradient_accumulation_for


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the mesh dimensions; ``cp``: context parallelism (ranks sharing each sequence)."""

    dp_replicate: int
    dp_shard: int
    tp: int
    cp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


def mesh_shape(world_size: int, nnodes: int, knobs: TrainingKnobs) -> MeshShape:
    """The mesh for ``world_size`` ranks on ``nnodes`` nodes under ``knobs``; one-line errors."""
    tp, cp = knobs.tensor_parallel, knobs.context_parallel
    within = " x ".join([*([f"tensor_parallel={tp}"] if tp > 1 or cp == 1 else []),
                         *([f"context_parallel={cp}"] if cp > 1 else [])])
    if world_size % (tp * cp):
        raise BtkError(f"{within} must divide the {world_size} GPUs of the job")
    if nnodes > 1 and (world_size // nnodes) % (tp * cp):
        raise BtkError(f"{within} must divide the {world_size // nnodes} GPUs of one node")
    dp = world_size // (tp * cp)
    if knobs.sharding == "no_shard":
        return MeshShape(dp_replicate=dp, dp_shard=1, tp=tp)
    if knobs.sharding == "hybrid_shard" and nnodes > 1:
        if dp % nnodes:
            raise BtkError(f"sharding=hybrid_shard needs the {dp} data-parallel ranks to divide over {nnodes} nodes")
        return MeshShape(dp_replicate=nnodes, dp_shard=dp // nnodes, tp=tp, cp=cp)
    return MeshShape(dp_replicate=1, dp_shard=dp, tp=tp, cp=cp)


@dataclass(frozen=True)
class Accumulation:
    """Micro-batches per optimizer step for the job's real data-parallel size."""

    steps: int
    planned_steps: int  # the knobs' gradient_accumulation_steps
    planned_global_batch: int | None  # sequences per optimizer step the knobs were planned for
    global_batch: int  # sequences per optimizer step this job runs

    @property
    def rescaled(self) -> bool:
        return self.steps != self.planned_steps


def accumulation_for(knobs: TrainingKnobs, planned_data_parallel: int | None, data_parallel: int) -> Accumulation:
    """Keep the planned global batch when the job has another data-parallel size than planned.

    The knobs' ``gradient_accumulation_steps`` was planned for ``planned_data_parallel`` ranks
    (the environment's node count). Run on more or fewer nodes (the pipeline's
    ``InstanceCount``), the same accumulation would change the global batch, and with it the
    learning-rate schedule's meaning and the number of steps. Rounded up when the planned batch
    does not divide evenly (never a smaller batch than planned); ``None``: use the knobs as given.
    """
    micro, planned_steps = knobs.micro_batch_size, knobs.gradient_accumulation_steps
    if planned_data_parallel is None:
        return Accumulation(planned_steps, planned_steps, None, micro * planned_steps * data_parallel)
    planned = micro * planned_steps * planned_data_parallel
    # The planner's own rule (btk.planner.throughput), in tokens: at least one micro-batch, rounded up.
    steps = gradient_accumulation_for(planned * knobs.seq_len, micro, knobs.seq_len, data_parallel)
    return Accumulation(steps, planned_steps, planned, steps * micro * data_parallel)
