"""The device-mesh shape and the global-batch rescaling, decided before any GPU work."""

from __future__ import annotations

import pytest
from btk_trainer.layout import accumulation_for, mesh_shape

from btk.errors import BtkError
from btk.knobs import TrainingKnobs


def knobs(**values: object) -> TrainingKnobs:
    return TrainingKnobs.model_validate({"micro_batch_size": 1, "seq_len": 128, **values})


def test_mesh_shapes() -> None:
    assert mesh_shape(16, 2, knobs()) == mesh_shape(16, 2, knobs(sharding="full_shard"))
    full = mesh_shape(16, 2, knobs())
    assert (full.dp_replicate, full.dp_shard, full.tp) == (1, 16, 1)
    hybrid = mesh_shape(32, 4, knobs(sharding="hybrid_shard", tensor_parallel=2))
    assert (hybrid.dp_replicate, hybrid.dp_shard, hybrid.tp, hybrid.dp) == (4, 4, 2, 16)
    plain = mesh_shape(8, 1, knobs(sharding="no_shard"))
    assert (plain.dp_replicate, plain.dp_shard) == (8, 1)
    with pytest.raises(BtkError, match="tensor_parallel=4 must divide the 6 GPUs"):
        mesh_shape(6, 1, knobs(tensor_parallel=4))
    with pytest.raises(BtkError, match="hybrid_shard needs the 9 data-parallel ranks"):
        mesh_shape(9, 2, knobs(sharding="hybrid_shard"))


@pytest.mark.parametrize(
    ("planned", "actual", "steps", "global_batch"),
    [
        (None, 16, 16, 512),  # no plan recorded: the knobs as given
        (32, 32, 16, 1024),  # the planned size
        (32, 16, 32, 1024),  # half the nodes: twice the accumulation, same global batch
        (32, 64, 8, 1024),  # twice the nodes: half
        (32, 1024, 1, 2048),  # more ranks than the batch needs: one micro-batch each, the batch grows
        (32, 24, 22, 1056),  # 1024 over 48 per micro-step does not divide: rounded up, never smaller
    ],
)
def test_accumulation_keeps_the_planned_global_batch(
    planned: int | None, actual: int, steps: int, global_batch: int
) -> None:
    result = accumulation_for(knobs(micro_batch_size=2, gradient_accumulation_steps=16), planned, actual)
    assert (result.steps, result.global_batch) == (steps, global_batch)
    assert result.rescaled == (steps != 16)
    assert result.planned_global_batch == (None if planned is None else 2 * 16 * planned)
