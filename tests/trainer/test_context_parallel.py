"""Context parallelism (``context_parallel``): the ranks of a sequence together train exactly what one rank
holding the whole sequence trains.

The gloo runs (tests/trainer/dist_worker.py, scenario ``context_parallel``) train the tiny Llama for four whole
steps (clipping, AdamW) with each sequence shared by 2 and 4 ranks, with document masking, under selective and
full activation checkpointing, the Gemma 2 toy (windowed blocks, soft caps) and the Gemma 3 toy with document
masking (the windowed blocks' own RoPE read at each rank's positions), composed with tensor parallelism (2 x 2)
and with HSDP (4 ranks as 2 nodes), against the run that does not share sequences on the same windows; and
resume a run stopped under one degree under another. Tolerance: fp32, 1e-5 (the ranks' partial sums only reorder
additions).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from btk.errors import BtkError
from btk.knobs import TrainingKnobs, knobs_from_hyperparameters, knobs_to_hyperparameters, parse_knobs

WORKER = Path(__file__).with_name("dist_worker.py")
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def runs(request: pytest.FixtureRequest, dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    world = int(request.param)
    workdir = tmp_path_factory.mktemp(f"context_parallel_{world}")
    command = [sys.executable, str(WORKER), "context_parallel", str(workdir), str(dataset), str(world)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    result["world"] = world
    return result


@pytest.mark.slow
def test_sharing_each_sequence_trains_what_one_rank_holding_it_trains(runs: dict[str, Any]) -> None:
    expected = {f"cp{cp}{variant}" for cp in (2, 4) if cp <= runs["world"]
                for variant in ("", "_masked", "_selective_checkpointing", "_full_checkpointing", "_gemma2",
                                "_gemma3_masked")}
    if runs["world"] >= 4:
        expected |= {"cp2_tp2", "cp2_tp2_masked", "cp2_hybrid_2_nodes"}
    assert expected <= set(runs["cases"])
    for name in expected:
        case = runs["cases"][name]
        assert case["keys_match"] and case["steps"] == [4, 4], name
        assert case["loss_diff"] <= TOLERANCE, (name, case)
        assert case["grad_norm_diff"] <= TOLERANCE, (name, case)
        assert case["max_weight_diff"] <= TOLERANCE, (name, case)


@pytest.mark.slow
def test_a_run_resumes_under_another_context_parallel_degree(runs: dict[str, Any]) -> None:
    resumed = [case for name, case in runs["cases"].items() if name.startswith("resume_")]
    assert len(resumed) == 2  # from the largest degree to none, and back
    for case in resumed:
        assert case["resumed_from"] == 2 and case["steps"] == [4, 4]
        assert case["loss_diff"] <= TOLERANCE and case["max_weight_diff"] <= TOLERANCE, case


@pytest.mark.parametrize("degree", [1, 2, 4, 8])
def test_every_position_is_one_ranks_and_every_rank_does_the_same_causal_work(degree: int) -> None:
    from btk_trainer.context_parallel import SequenceChunks

    seq = 64
    cpu = torch.device("cpu")
    per_rank = [SequenceChunks(degree, rank).positions(seq, cpu) for rank in range(degree)]
    assert sorted(torch.cat(per_rank).tolist()) == list(range(seq))
    assert all(len(positions) == seq // degree for positions in per_rank)
    # causal attention's work of a query is its position + 1 keys: equal on every rank
    assert len({int((positions + 1).sum()) for positions in per_rank}) == 1
    assert torch.equal(SequenceChunks(degree, 0).key_positions(seq, cpu), torch.cat(per_rank))


def test_the_positioned_mask_is_the_causal_document_mask_read_at_the_ranks_positions() -> None:
    from btk_trainer.context_parallel import SequenceChunks
    from btk_trainer.model import dense_document_mask, dense_positioned_mask

    documents = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4]])
    whole = dense_document_mask(documents)
    cpu = torch.device("cpu")
    for rank in range(2):
        chunks = SequenceChunks(2, rank)
        queries, keys = chunks.positions(16, cpu), chunks.key_positions(16, cpu)
        expected = whole[:, :, queries][:, :, :, keys]
        assert torch.equal(dense_positioned_mask(queries, keys, documents), expected)
        causal_only = dense_positioned_mask(queries, keys, None)
        assert torch.equal(causal_only[0, 0], queries[:, None] >= keys[None, :])
        windowed = dense_positioned_mask(queries, keys, documents, window=3)
        positions = torch.arange(16)
        whole_windowed = dense_positioned_mask(positions, positions, documents, window=3)
        assert torch.equal(windowed, whole_windowed[:, :, queries][:, :, :, keys])
        assert int(whole_windowed.sum(-1).max()) == 3  # no query attends to more than the window


def test_the_knob_is_left_out_of_a_jobs_hyperparameters_at_its_default() -> None:
    plain = TrainingKnobs(micro_batch_size=1, seq_len=128)
    assert "context_parallel" not in knobs_to_hyperparameters(plain)
    shared = plain.model_copy(update={"context_parallel": 4})
    encoded = knobs_to_hyperparameters(TrainingKnobs.model_validate(shared.model_dump()))
    assert encoded["context_parallel"] == "4"
    assert knobs_from_hyperparameters(encoded).context_parallel == 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"context_parallel": 3}, "context_parallel: must be one of 1, 2, 4, 8"),
        ({"context_parallel": 4, "seq_len": 100}, "seq_len 100 must be a multiple of 8"),
        ({"context_parallel": 2, "sharding": "no_shard"},
         "context_parallel 2 needs sharding full_shard or hybrid_shard"),
    ],
)
def test_a_context_parallel_degree_the_trainer_cannot_run_is_one_line_naming_it(values: dict[str, Any],
                                                                                message: str) -> None:
    with pytest.raises(BtkError) as error:
        parse_knobs({"micro_batch_size": 1, "seq_len": 128, **values})
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("world", "nnodes", "tp", "cp", "message"),
    [
        (6, 1, 1, 4, "context_parallel=4 must divide the 6 GPUs of the job"),
        (16, 2, 2, 8, "tensor_parallel=2 x context_parallel=8 must divide the 8 GPUs of one node"),
    ],
)
def test_a_degree_the_job_cannot_hold_is_one_line(world: int, nnodes: int, tp: int, cp: int, message: str) -> None:
    from btk_trainer.layout import mesh_shape

    knobs = TrainingKnobs(micro_batch_size=1, seq_len=128, tensor_parallel=tp, context_parallel=cp)
    with pytest.raises(BtkError, match=message):
        mesh_shape(world, nnodes, knobs)


def test_the_mesh_gives_the_sequences_ranks_to_fsdp_as_shards() -> None:
    from btk_trainer.layout import mesh_shape

    shape = mesh_shape(16, 2, TrainingKnobs(micro_batch_size=1, seq_len=128, context_parallel=4,
                                            sharding="hybrid_shard"))
    assert (shape.dp_replicate, shape.dp_shard, shape.cp, shape.tp) == (2, 2, 4, 1)
    assert shape.dp == 4  # data-parallel ranks: each reads its own sequences; the four of a sequence read the same
