"""Environment validation rules that live in the core (more in tests/infra)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from btk.environment import DataStageConfig, EnvironmentConfig


def _env(**overrides: object) -> EnvironmentConfig:
    values: dict[str, object] = {"name": "qa", "availability_zone": "us-east-1a", "profiles": ("llama3.2-1b",)}
    values.update(overrides)
    return EnvironmentConfig.model_validate(values)


def test_checkpoints_must_outlive_the_longest_job() -> None:
    with pytest.raises(ValidationError, match=r"checkpoint_expiration_days \(3\) must outlast the longest job \(144 h"):
        _env(max_runtime_hours=72, managed_spot=True, data_stage=DataStageConfig(checkpoint_expiration_days=3))
    assert _env(max_runtime_hours=72, data_stage=DataStageConfig(checkpoint_expiration_days=4)).data_stage


def test_spot_and_training_plan_are_exclusive() -> None:
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/btk-qa-0123abcd"
    with pytest.raises(ValidationError, match="managed_spot cannot be combined with a training plan"):
        _env(managed_spot=True, capacity={"mode": "existing", "plan_arn": plan})


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        ({"instance_count": 3}, "instance_count 3 is not sold"),
        ({"duration_hours": 30}, "duration_hours 30 must be whole days"),
        ({"duration_hours": 24 * 183}, "must be whole days between 1 and 182"),
        ({"purchase_approved": False}, "purchase_approved must be true"),
        ({"max_upfront_fee": None}, "max_upfront_fee is required"),
    ],
)
def test_reserve_mode_is_checked_at_synth(capacity: dict[str, object], message: str) -> None:
    reserve: dict[str, object] = {
        "mode": "reserve", "start_after": "2026-12-07T00:00:00Z", "duration_hours": 24 * 14, "instance_count": 2,
        "max_upfront_fee": 250_000.0, "purchase_approved": True,
    }
    reserve.update(capacity)
    with pytest.raises(ValidationError, match=message):
        _env(capacity=reserve)
