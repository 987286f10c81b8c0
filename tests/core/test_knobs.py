"""TrainingKnobs and job hyperparameters: lossless round trip through SageMaker strings."""

from __future__ import annotations

import json

import fixture_catalog
import pytest
from hypothesis import given
from hypothesis import strategies as st

from btk.catalog import all_profiles
from btk.errors import BtkError
from btk.hyperparameters import JobHyperparameters, JobSettings, KnobLadder, from_hyperparameters, to_hyperparameters
from btk.knobs import (
    CHECKPOINTING_MODES,
    CONTEXT_PARALLEL_DEGREES,
    PRECISIONS,
    SHARDING_MODES,
    TENSOR_PARALLEL_DEGREES,
    TrainingKnobs,
    knob_combination_problem,
    knobs_from_hyperparameters,
    knobs_to_hyperparameters,
    parse_knobs,
)

RUNNABLE_PAIRS = [
    (precision, tp)
    for precision in PRECISIONS
    for tp in TENSOR_PARALLEL_DEGREES
    if knob_combination_problem(precision, tp) is None
]

def _runnable_knobs(pair: tuple[str, int], context_parallel: int) -> st.SearchStrategy[TrainingKnobs]:
    """Knobs of a runnable precision/TP pair; with context parallelism, a shard group and a sequence of whole chunks."""
    chunks = 2 * context_parallel if context_parallel > 1 else 1
    return st.builds(
        TrainingKnobs,
        micro_batch_size=st.integers(1, 4096),
        gradient_accumulation_steps=st.integers(1, 65536),
        seq_len=st.integers(-(-16 // chunks), 1_048_576 // chunks).map(lambda n: n * chunks),
        precision=st.just(pair[0]),
        activation_checkpointing=st.sampled_from(CHECKPOINTING_MODES),
        sharding=st.sampled_from([s for s in SHARDING_MODES if context_parallel == 1 or s != "no_shard"]),
        tensor_parallel=st.just(pair[1]),
        compile=st.booleans(),
        fused_loss=st.booleans(),
        context_parallel=st.just(context_parallel),
    )


knobs_strategy = st.tuples(st.sampled_from(RUNNABLE_PAIRS), st.sampled_from(CONTEXT_PARALLEL_DEGREES)).flatmap(
    lambda choice: _runnable_knobs(*choice))


@pytest.mark.parametrize("precision", ["fp8_rowwise", "mxfp8"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_precisions_without_a_tensor_parallel_layout_are_refused_naming_both_knobs(precision: str, tp: int) -> None:
    with pytest.raises(BtkError) as raised:
        parse_knobs({"micro_batch_size": 1, "seq_len": 128, "precision": precision, "tensor_parallel": tp})
    message = str(raised.value)
    assert f"precision {precision} with tensor_parallel {tp}" in message and "\n" not in message


def test_the_combination_rule_allows_every_precision_without_tensor_parallel() -> None:
    assert all(knob_combination_problem(precision, 1) is None for precision in PRECISIONS)


@given(knobs_strategy)
def test_knobs_round_trip_through_string_hyperparameters(knobs: TrainingKnobs) -> None:
    encoded = knobs_to_hyperparameters(knobs)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in encoded.items())
    assert knobs_from_hyperparameters(encoded) == knobs


@given(knobs_strategy, st.sampled_from(sorted(all_profiles())), st.integers(0, 2**31))
def test_job_hyperparameters_round_trip(knobs: TrainingKnobs, profile_name: str, seed: int) -> None:
    profile = all_profiles()[profile_name]
    knobs = knobs.model_copy(update={"seq_len": min(knobs.seq_len, profile.architecture.max_context)})
    spec = JobHyperparameters(
        knobs=knobs,
        architecture=profile.architecture,
        training=profile.training,
        job=JobSettings(profile=profile.name, seed=seed),
    )
    encoded = to_hyperparameters(spec)
    assert all(isinstance(v, str) and len(v) <= 2500 for v in encoded.values())
    assert from_hyperparameters(encoded) == spec


def test_bool_encoding_is_lowercase_true_false() -> None:
    encoded = knobs_to_hyperparameters(TrainingKnobs(micro_batch_size=1, seq_len=128, compile=False))
    assert encoded["compile"] == "false" and encoded["fused_loss"] == "true"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("precision", "fp4", "precision"),
        ("micro_batch_size", "zero", "micro_batch_size"),
        ("tensor_parallel", "3", "tensor_parallel: must be one of 1, 2, 4, 8"),
        ("seq_len", "-5", "seq_len"),
    ],
)
def test_malformed_hyperparameters_give_one_line_naming_the_field(key: str, value: str, message: str) -> None:
    encoded = knobs_to_hyperparameters(TrainingKnobs(micro_batch_size=1, seq_len=128))
    encoded[key] = value
    with pytest.raises(BtkError) as error:
        knobs_from_hyperparameters(encoded)
    text = str(error.value)
    assert message in text and "\n" not in text


def test_missing_architecture_field_is_named_with_its_prefix() -> None:
    profile = min(all_profiles().values(), key=lambda candidate: candidate.parameter_count)
    spec = JobHyperparameters(
        knobs=TrainingKnobs(micro_batch_size=1, seq_len=128),
        architecture=profile.architecture,
        training=profile.training,
        job=JobSettings(profile=profile.name),
    )
    encoded = to_hyperparameters(spec)
    del encoded["arch.hidden_size"]
    with pytest.raises(BtkError, match=r"arch\.hidden_size"):
        from_hyperparameters(encoded)


def test_a_knob_added_later_leaves_earlier_jobs_hyperparameters_and_ladders_as_they_were() -> None:
    """``context_parallel`` at 1 is written nowhere (knobs, the knob ladder's rungs): a plan made before it existed
    gives the same job; set, it is written and read back."""
    plain = TrainingKnobs(micro_batch_size=2, seq_len=4096, activation_checkpointing="selective")
    shared = plain.model_copy(update={"context_parallel": 2})
    profile = fixture_catalog.LLAMA_8B
    spec = JobHyperparameters(knobs=plain, architecture=profile.architecture, training=profile.training,
                              job=JobSettings(profile=profile.name, knob_ladder=KnobLadder(rungs=(plain, shared))))
    encoded = to_hyperparameters(spec)
    assert "context_parallel" not in encoded
    rungs = json.loads(encoded["job.knob_ladder"])["rungs"]
    assert "context_parallel" not in rungs[0] and rungs[1]["context_parallel"] == 2
    assert from_hyperparameters(encoded) == spec
