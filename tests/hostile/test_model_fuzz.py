"""Hostile values for every typed model a user or a service fills: validated or refused by field.

Each test takes a valid example, replaces one field (or one nested field) with a hostile value
and asserts one of two outcomes: the model accepts it (and a second validation of its own dump
gives the same model), or pydantic refuses it with an error whose location names that field.
Anything else escaping — ``OverflowError``, ``TypeError``, ``RecursionError`` — fails. With the
example counts below the suite generates 1,200 cases per run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from btk.environment import EnvironmentConfig, ReservePlanCapacity
from btk.errors import one_line
from btk.hyperparameters import JobSettings
from btk.knobs import TrainingKnobs
from btk.profile import KnobPins, ModelArchitecture, TrainingIntent
from btk.shards import ShardManifest

HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\n", "dev\n", "a" * 5000, "\x00", "ü", "-1", "1e309", "nan", "inf", "{x", "[]"]),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.datetimes(timezones=st.just(UTC)),
)

ARCH = {
    "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 128,
    "vocab_size": 256, "max_context": 256,
}  # fmt: skip
VALID: dict[type[BaseModel], dict[str, Any]] = {
    TrainingKnobs: {"micro_batch_size": 1, "seq_len": 128},
    ModelArchitecture: ARCH,
    TrainingIntent: {"seq_len": 64, "global_batch_tokens": 1024},
    KnobPins: {},
    JobSettings: {"profile": "tiny-test"},
    ShardManifest: {
        "dtype": "uint16",
        "vocab_size": 256,
        "eos_token_id": 2,
        "shards": [{"file": "shard_00000.bin", "num_tokens": 10, "sha256": "0" * 64}],
    },
    ReservePlanCapacity: {
        "start_after": datetime(2027, 1, 4, tzinfo=UTC),
        "duration_hours": 168,
        "instance_count": 2,
        "max_upfront_fee": 150_000.0,
        "purchase_approved": True,
    },
    EnvironmentConfig: {"name": "qa", "availability_zone": "us-east-1a", "profiles": ["llama3.2-1b"]},
}
MODELS = list(VALID)


def _check(model: type[BaseModel], field: str, value: Any) -> None:
    data = {**VALID[model], field: value}
    try:
        parsed = model.model_validate(data)
    except ValidationError as error:
        message = one_line(error)
        assert "\n" not in message
        located = {str(item["loc"][0]) for item in error.errors() if item["loc"]}
        assert field in located or not located, (field, message)
        return
    again = model.model_validate(parsed.model_dump())
    assert again == parsed


@settings(max_examples=capped(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(MODELS).flatmap(lambda m: st.tuples(st.just(m), st.sampled_from(sorted(m.model_fields)))),
    HOSTILE,
)
def test_one_hostile_field_is_accepted_consistently_or_refused_by_name(
    model_and_field: tuple[type[BaseModel], str], value: Any
) -> None:
    model, field = model_and_field
    _check(model, field, value)


@settings(max_examples=capped(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(EnvironmentConfig.model_fields)),
    st.sampled_from(["data_stage", "capacity", "job_retries"]),
    st.dictionaries(st.sampled_from(["mode", "fsx_storage_capacity_gib", "checkpoint_expiration_days", "plan_arn",
                                     "max_attempts", "interval_seconds", "backoff_rate", "start_after"]),
                    HOSTILE, max_size=3),
)
def test_hostile_nested_environment_settings_are_refused_by_name(
    field: str, nested: str, values: dict[str, Any]
) -> None:
    _check(EnvironmentConfig, nested, values)
    _check(EnvironmentConfig, field, values)
