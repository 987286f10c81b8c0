"""Hostile input to the typed core: every bad value is one line naming the field, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from btk.errors import BtkError
from btk.hyperparameters import (
    JobHyperparameters,
    JobSettings,
    from_hyperparameters,
    known_keys,
    to_hyperparameters,
)
from btk.jsonfile import MAX_JSON_DEPTH, parse_json, read_json_file
from btk.knobs import TrainingKnobs
from btk.profile import KnobPins, ModelArchitecture, ModelProfile, TrainingIntent
from btk.shards import read_manifest

ARCH = ModelArchitecture(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=128,
    vocab_size=256, max_context=256,
)  # fmt: skip
TRAINING = TrainingIntent(seq_len=64, global_batch_tokens=1024)


def _spec(**job: object) -> JobHyperparameters:
    return JobHyperparameters(
        knobs=TrainingKnobs(micro_batch_size=1, seq_len=64),
        architecture=ARCH,
        training=TRAINING,
        job=JobSettings.model_validate({"profile": "tiny-test", **job}),
    )


HOSTILE_JSON: dict[str, bytes] = {
    "invalid UTF-8": b'{"a": "\xff\xfe"}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "nesting past the limit": b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
    "5000-digit integer": b'{"a": ' + b"9" * 5000 + b"}",
    "truncated": b'{"a": ',
    "empty": b"",
}


@pytest.mark.parametrize("content", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
def test_hostile_json_is_one_line_naming_the_file(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "hyperparameters.json"
    path.write_bytes(content)
    with pytest.raises(BtkError) as raised:
        read_json_file(path, "hyperparameters.json")
    assert "\n" not in str(raised.value) and str(raised.value).startswith("hyperparameters.json: ")


def test_json_file_that_is_a_directory_or_missing_is_one_line(tmp_path: Path) -> None:
    for path, words in ((tmp_path, "is a directory"), (tmp_path / "absent.json", "not found")):
        with pytest.raises(BtkError, match=words):
            read_json_file(path)


@pytest.mark.parametrize("content", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
def test_hostile_shard_manifest_is_one_line(content: bytes, tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(BtkError, match=r"^dataset .*manifest\.json: [^\n]*$"):
        read_manifest(tmp_path)


def test_parse_json_accepts_the_kits_own_nesting() -> None:
    assert parse_json('{"shards": [{"file": "a"}]}', "x") == {"shards": [{"file": "a"}]}


@pytest.mark.parametrize("profile", ["{x", "[1]"])
def test_profile_names_that_are_not_slugs_are_refused(profile: str) -> None:
    with pytest.raises(ValidationError, match="profile"):
        _spec(profile=profile)


@pytest.mark.parametrize("profile", ["true", "null", "12", "1e5"])
def test_profile_names_that_look_like_json_values_stay_strings(profile: str) -> None:
    spec = _spec(profile=profile)
    assert from_hyperparameters(to_hyperparameters(spec)) == spec


@pytest.mark.parametrize("init_from", ["{x", "/opt/ml/input/data/model", "s3-like:{}", " "])
def test_init_from_round_trips_whatever_it_looks_like(init_from: str) -> None:
    spec = _spec(init_from=init_from)
    assert from_hyperparameters(to_hyperparameters(spec)) == spec


def test_empty_init_from_is_refused_because_it_would_read_back_as_none() -> None:
    with pytest.raises(ValidationError, match="init_from"):
        _spec(init_from="")


def test_unknown_hyperparameter_is_refused_with_the_known_keys() -> None:
    encoded = to_hyperparameters(_spec()) | {"precison": "fp8_tensorwise"}
    with pytest.raises(BtkError) as raised:
        from_hyperparameters(encoded)
    message = str(raised.value)
    assert "'precison'" in message and "precision" in message and "\n" not in message


def test_sagemaker_namespace_keys_are_ignored() -> None:
    spec = _spec()
    assert from_hyperparameters(to_hyperparameters(spec) | {"sagemaker_program": "train.py"}) == spec


def test_known_keys_are_exactly_what_the_encoder_writes() -> None:
    """Every key but the knobs, architecture fields, training fields and job settings left at their default (left
    out of the job, read back as the default) is written."""
    written = set(to_hyperparameters(_spec()))
    left_out = {f"arch.{name}" for name in ModelArchitecture.LEFT_OUT_AT_DEFAULT} | {
        f"job.{name}" for name in JobSettings.LEFT_OUT_AT_DEFAULT} | {
        f"train.{name}" for name in TrainingIntent.LEFT_OUT_AT_DEFAULT} | set(TrainingKnobs.LEFT_OUT_AT_DEFAULT)
    assert sorted(known_keys()) == sorted(written | left_out) and not written & left_out


def test_async_tensor_parallel_is_written_only_when_a_job_asks_for_it() -> None:
    """Off by default and then absent, so a job's hyperparameters are what they were before the setting existed."""
    assert "job.async_tensor_parallel" not in to_hyperparameters(_spec())
    asked = _spec(async_tensor_parallel=True)
    encoded = to_hyperparameters(asked)
    assert encoded["job.async_tensor_parallel"] == "true" and from_hyperparameters(encoded) == asked


def test_document_masking_is_written_only_when_a_profile_asks_for_it() -> None:
    assert "train.document_masking" not in to_hyperparameters(_spec())
    asked = _spec().model_copy(update={"training": TRAINING.model_copy(update={"document_masking": True})})
    encoded = to_hyperparameters(asked)
    assert encoded["train.document_masking"] == "true" and from_hyperparameters(encoded) == asked
    with pytest.raises(BtkError, match=r"train\.document_masking") as raised:
        from_hyperparameters(encoded | {"train.document_masking": "sometimes"})
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("rungs", "phrase"), [
    ([{"micro_batch_size": 1, "seq_len": 64, "precision": "fp8_tensorwise"}], "rung 1 changes precision"),
    ([{"micro_batch_size": 1, "seq_len": 32}], "rung 1 changes seq_len"),
    ([{"micro_batch_size": 2, "seq_len": 64}], "rung 1 trains 2 x 1 sequences per step and rank, the plan 1 x 1"),
    ([{"micro_batch_size": 1, "seq_len": 64}] * 5, "at most 4 items"),
    ([], "at least 1 item"),
    ("not a list", "rungs"),
])
def test_a_knob_ladder_that_changes_what_is_trained_is_one_line_naming_it(rungs: object, phrase: str) -> None:
    import json

    encoded = to_hyperparameters(_spec()) | {"job.knob_ladder": json.dumps({"rungs": rungs})}
    with pytest.raises(BtkError, match=r"job\.knob_ladder") as raised:
        from_hyperparameters(encoded)
    assert phrase in str(raised.value) and "\n" not in str(raised.value)


def test_nested_hyperparameter_that_is_not_json_names_the_key() -> None:
    encoded = to_hyperparameters(_spec()) | {"arch.rope_scaling": "{not json"}
    with pytest.raises(BtkError, match=r"hyperparameter arch\.rope_scaling: not valid JSON"):
        from_hyperparameters(encoded)


@pytest.mark.parametrize("name", ["dev\n", "llama\n", "a", "UPPER", "-lead", "x" * 64])
def test_profile_names_are_matched_whole(name: str) -> None:
    with pytest.raises(ValidationError, match="name"):
        ModelProfile(name=name, family="t", architecture=ARCH, training=TRAINING)


def test_global_batch_has_an_upper_bound_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="global_batch_tokens"):
        TrainingIntent(seq_len=64, global_batch_tokens=10**30)


@pytest.mark.parametrize("field", ["micro_batch_size", "gradient_accumulation_steps"])
def test_pins_share_the_knobs_bounds(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        KnobPins.model_validate({field: 10**6})


def test_hyperparameters_file_round_trips_through_json(tmp_path: Path) -> None:
    spec = _spec(init_from="{weights}")
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps(to_hyperparameters(spec)))
    assert from_hyperparameters(read_json_file(path)) == spec


SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


@pytest.mark.parametrize(("key", "value", "field"), [
    ("arch.rope_theta", "inf", "arch.rope_theta"),          # 7 of 8 RoPE frequencies become 0: positions vanish
    ("arch.rope_theta", "1e30", "arch.rope_theta"),
    ("arch.rope_theta", "1.0", "arch.rope_theta"),          # every frequency 1 rad/token or more
    ("arch.rope_theta", "nan", "arch.rope_theta"),
    ("arch.rms_norm_eps", "inf", "arch.rms_norm_eps"),
    ("arch.rms_norm_eps", "0.5", "arch.rms_norm_eps"),
    ("arch.rope_scaling", json.dumps({**SCALING, "factor": 1e-300}), "arch.rope_scaling.factor"),  # NaN at step 1
    ("arch.rope_scaling", json.dumps({**SCALING, "factor": float("inf")}), "arch.rope_scaling.factor"),
    ("arch.rope_scaling", json.dumps({**SCALING, "low_freq_factor": 4.0}), "arch.rope_scaling.high_freq_factor"),
    # YaRN and linear scaling, read by their rope_type: a factor shrinking the context, a reversed ramp, a type
    # the trainer does not compute.
    ("arch.rope_scaling", json.dumps({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}),
     "arch.rope_scaling.factor"),
    ("arch.rope_scaling", json.dumps({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "beta_fast": 1.0, "beta_slow": 32.0}), "arch.rope_scaling.beta_fast"),
    ("arch.rope_scaling", json.dumps({"rope_type": "linear", "factor": float("nan")}), "arch.rope_scaling.factor"),
    ("arch.rope_scaling", json.dumps({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
     "arch.rope_scaling.low_freq_factor"),
    ("arch.rope_scaling", json.dumps({"rope_type": "dynamic", "factor": 2.0}), "arch.rope_scaling"),
    # Gemma's fields: outside its block, or values that would break attention.
    ("arch.sliding_window", "4096", "arch.sliding_window"),
    ("arch.attn_logit_softcapping", "inf", "arch.attn_logit_softcapping"),
    ("arch.final_logit_softcapping", "0", "arch.final_logit_softcapping"),
    ("arch.query_pre_attn_scalar", "0", "arch.query_pre_attn_scalar"),
    ("train.max_grad_norm", "inf", "train.max_grad_norm"),
    ("train.max_grad_norm", "1e300", "train.max_grad_norm"),
    ("train.learning_rate", "nan", "train.learning_rate"),
    ("train.weight_decay", "-inf", "train.weight_decay"),
    ("seq_len", "512", "seq_len"),                          # beyond the architecture's max_context (256)
])
def test_non_finite_or_absurd_training_floats_are_one_line_naming_the_key(key: str, value: str, field: str) -> None:
    hyperparameters = {**to_hyperparameters(_spec()), key: value}
    if key == "seq_len":
        hyperparameters["train.seq_len"] = "64"
    with pytest.raises(BtkError) as raised:
        from_hyperparameters(hyperparameters)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"invalid hyperparameters: {field}: "), message


def test_published_rope_settings_stay_valid() -> None:
    """Llama 3.1/3.2's scaling and the bases of every shipped and fixture family still load."""
    for theta in (1e4, 5e5, 1e6):
        ModelArchitecture.model_validate({**ARCH.model_dump(), "rope_theta": theta})
    llama32 = {**SCALING, "factor": 32.0, "original_max_position_embeddings": 8192}
    assert ModelArchitecture.model_validate({**ARCH.model_dump(), "rope_scaling": llama32}).rope_scaling is not None
