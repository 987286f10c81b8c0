"""Context parallelism in the planner: what sharing a sequence between GPUs does to memory, time and the search.

Machinery on the fixture catalog (tests/fixture_catalog.py): Llama 3.1 8B's shape at 131,072 tokens, its
published maximum context. The published context-parallel runs the model is checked against are held out in
btk/planner/calibration_points.json (tests/planner/test_calibration.py).
"""

from __future__ import annotations

import fixture_catalog
import pytest

from btk.errors import InfeasiblePlanError
from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.planner.memory import estimate_memory, gathered_key_value_bytes_per_layer, parallelism_for
from btk.planner.render import render_evaluation
from btk.planner.search import check_runnable, enumerate_candidates, evaluate_knobs, plan_profile
from btk.planner.throughput import context_parallel_seconds_per_step, estimate_throughput
from btk.profile import ModelProfile

B200 = get_instance_type("ml.p6-b200.48xlarge")
GIB = 1024**3
LONG = 131_072


def at_length(profile: ModelProfile, seq_len: int) -> ModelProfile:
    return profile.model_copy(update={"training": profile.training.model_copy(update={"seq_len": seq_len})})


LONG_8B = at_length(fixture_catalog.LLAMA_8B, LONG)


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


def knobs(**values: object) -> TrainingKnobs:
    return TrainingKnobs.model_validate({"micro_batch_size": 1, "seq_len": LONG, "precision": "bf16", **values})


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("degree", [2, 4, 8])
def test_each_gpu_holds_its_share_of_the_sequence_and_the_gathered_keys_and_values(mode: str, degree: int) -> None:
    arch = LONG_8B.architecture
    alone = estimate_memory(arch, knobs(activation_checkpointing=mode), 8, 1, B200.hbm_gib)
    shared = estimate_memory(arch, knobs(activation_checkpointing=mode, context_parallel=degree), 8, 1, B200.hbm_gib)
    gathered = gathered_key_value_bytes_per_layer(arch, knobs(context_parallel=degree)) / GIB
    # K and V of the other ranks' (degree-1)/degree of the sequence, bf16: 2 x kv_dim x 2 bytes a token
    assert gathered == pytest.approx(LONG * (degree - 1) / degree * 2 * arch.kv_dim * 2 / GIB)
    if mode == "none":  # every layer's gathered keys and values are saved for its backward
        assert shared.activations == pytest.approx(alone.activations / degree + gathered * arch.num_layers, rel=1e-9)
    else:  # only the recomputed layer's are live: sharing the sequence more always needs less
        half = estimate_memory(arch, knobs(activation_checkpointing=mode, context_parallel=degree // 2), 8, 1,
                               B200.hbm_gib)
        assert shared.total < half.total
    # the model state is sharded over the same 8 GPUs either way (FSDP over data x context parallel)
    assert shared.parameters == pytest.approx(alone.parameters)


def test_the_ranks_of_a_sequence_read_one_sequence_and_the_global_batch_is_kept() -> None:
    for degree in (1, 2, 4, 8):
        par = parallelism_for(knobs(context_parallel=degree), 8, 2)
        assert par.data_parallel == 16 // degree and par.fsdp_ranks == 16 and par.shard_degree == 16
    plain = estimate_throughput(LONG_8B.architecture, knobs(gradient_accumulation_steps=4), B200, 1)
    shared = estimate_throughput(LONG_8B.architecture, knobs(gradient_accumulation_steps=32, context_parallel=8),
                                 B200, 1)
    assert plain.global_batch_tokens == shared.global_batch_tokens == 4 * 8 * LONG


def test_the_gathers_cost_nvlink_time_that_grows_with_the_recompute() -> None:
    arch = LONG_8B.architecture
    assert context_parallel_seconds_per_step(arch, knobs(), B200) == 0.0
    none = context_parallel_seconds_per_step(arch, knobs(context_parallel=4), B200)
    full = context_parallel_seconds_per_step(arch, knobs(context_parallel=4, activation_checkpointing="full"), B200)
    assert 0 < none < full == pytest.approx(none * 3 / 2)  # gather + reduce-scatter, and the recompute's gather
    # a few per cent of a 131k-token step on NVLink, not its bulk
    step = estimate_throughput(arch, knobs(context_parallel=4), B200, 1).step_seconds
    assert none < 0.05 * step


def test_the_search_weighs_context_parallelism_only_where_it_can_win() -> None:
    candidates = enumerate_candidates(LONG_8B, B200, 1)
    shared = [c.knobs for c in candidates if c.knobs.context_parallel > 1]
    assert {k.context_parallel for k in shared} == {2, 4, 8}
    assert all(k.micro_batch_size == 1 and k.sharding != "no_shard" for k in shared)
    assert all(k.tensor_parallel * k.context_parallel <= B200.gpus_per_node for k in shared)
    plan = plan_profile(LONG_8B, B200, 1)
    assert plan.evaluation.fits
    best_unshared = max((c for c in candidates if c.fits and c.knobs.context_parallel == 1),
                        key=lambda c: c.estimate.tokens_per_second_per_gpu)
    assert plan.evaluation.estimate.tokens_per_second_per_gpu >= best_unshared.estimate.tokens_per_second_per_gpu
    if plan.knobs.context_parallel > 1:
        assert f" cp={plan.knobs.context_parallel} " in render_evaluation(plan.evaluation)
        assert any(line.startswith("context_parallel ") for line in plan.explanations)
        assert plan.hyperparameters()["context_parallel"] == str(plan.knobs.context_parallel)


def test_at_the_profiles_own_length_context_parallelism_leaves_the_plan_alone() -> None:
    """At 8k tokens every sequence fits one GPU with room to spare: no plan shares one."""
    for profile in fixture_catalog.PROFILES.values():
        assert plan_profile(profile, B200, 1).knobs.context_parallel == 1, profile.name


def test_knobs_a_node_cannot_hold_are_one_line_naming_both_degrees() -> None:
    with pytest.raises(InfeasiblePlanError, match="tensor_parallel 4 x context_parallel 4 exceeds the 8 GPUs"):
        check_runnable(LONG_8B, B200, 1, knobs(tensor_parallel=4, context_parallel=4))
    gb200 = get_instance_type("ml.p6e-gb200.36xlarge")
    with pytest.raises(InfeasiblePlanError, match="exceeds the 4 GPUs of a node"):
        evaluate_knobs(LONG_8B, gb200, 1, knobs(context_parallel=8))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["context_parallel=3"], "context_parallel: must be one of 1, 2, 4, 8"),
        (["context_parallel=8", "tensor_parallel=2"], "tensor_parallel 2 x context_parallel 8 exceeds the 8 GPUs"),
        (["context_parallel=2", "sharding=no_shard"], "context_parallel 2 needs sharding full_shard or hybrid_shard"),
    ],
)
def test_btk_estimate_refuses_a_context_parallel_degree_in_one_line(
    capsys: pytest.CaptureFixture[str], settings: list[str], message: str
) -> None:
    from btk.cli import main

    arguments = [word for setting in ["seq_len=131072", *settings] for word in ("--set", setting)]
    try:
        code = main(["estimate", "llama3.1-8b", *arguments])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
