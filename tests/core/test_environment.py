"""Environment validation rules that live in the core (more in tests/infra)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from btk.environment import (
    MAX_USER_TAGS,
    TAG_KEY_MAX,
    TAG_VALUE_MAX,
    DataStageConfig,
    EnvironmentConfig,
    ReservePlanCapacity,
    longest_execution_hours,
)
from btk.errors import one_line
from btk.naming import _PIPELINE_NAME


def _env(**overrides: object) -> EnvironmentConfig:
    values: dict[str, object] = {"name": "qa", "availability_zone": "us-east-1a", "profiles": ("llama3.2-1b",)}
    values.update(overrides)
    return EnvironmentConfig.model_validate(values)


def test_checkpoints_must_outlive_the_longest_execution_with_its_retries() -> None:
    # retries resume from the execution's checkpoints: they must outlive every attempt and wait
    with pytest.raises(ValidationError, match=r"checkpoint_expiration_days \(3\) must outlast the longest execution"):
        _env(max_runtime_hours=72, managed_spot=True, data_stage=DataStageConfig(checkpoint_expiration_days=3))
    config = _env(max_runtime_hours=72, data_stage=DataStageConfig(checkpoint_expiration_days=30))
    assert longest_execution_hours(config) >= 72 * (config.job_retries.max_attempts + 1)
    with pytest.raises(ValidationError, match="longest execution"):
        _env(max_runtime_hours=72, data_stage=DataStageConfig(checkpoint_expiration_days=4))


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


PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/btk-qa-0123abcd"
RESERVE: dict[str, object] = {
    "mode": "reserve", "start_after": "2027-01-04T00:00:00Z", "duration_hours": 48, "instance_count": 2,
    "max_upfront_fee": 1000.0, "purchase_approved": True,
}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "dev\n"}, "name"),
        ({"region": "us-east-1\n", "availability_zone": "us-east-1a"}, "region"),
        ({"capacity": {"mode": "existing", "plan_arn": PLAN_ARN + "\n"}}, "capacity.existing.plan_arn"),
    ],
)
def test_a_trailing_newline_is_not_a_valid_name(overrides: dict[str, object], field: str) -> None:
    """``$`` in ``re.match`` accepts a trailing newline; the patterns must match the whole text."""
    with pytest.raises(ValidationError) as caught:
        _env(**overrides)
    assert [".".join(map(str, error["loc"])) for error in caught.value.errors()] == [field]


def test_a_pipeline_name_with_a_trailing_newline_is_refused() -> None:
    assert _PIPELINE_NAME.fullmatch("btk-dev-x") and not _PIPELINE_NAME.fullmatch("btk-dev-x\n")


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("banana", "is not an IPv4 network"),
        ("10.80.0.1/16", "is not an IPv4 network"),
        ("10.0.0.0/8", "a VPC's block is /16 to /28"),
        ("10.80.0.0/29", "a VPC's block is /16 to /28"),
        ("10.80.0.0/24", "smaller than the /20 training subnet"),
        ("fd00::/56", "is not an IPv4 network"),
    ],
)
def test_vpc_cidr_must_be_a_vpc_block_the_subnet_fits_in(cidr: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        _env(vpc_cidr=cidr)
    assert caught.value.errors()[0]["loc"] == ("vpc_cidr",)


@pytest.mark.parametrize("cidr", ["10.80.0.0/16", "172.16.0.0/20", "192.168.16.0/20"])
def test_vpc_cidr_accepted(cidr: str) -> None:
    assert _env(vpc_cidr=cidr).vpc_cidr == cidr


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"aws:owner": "me"}, "starts with 'aws:'"),
        ({"AWS:owner": "me"}, "starts with 'aws:'"),
        ({"k" * (TAG_KEY_MAX + 1): "v"}, "use 1 to 128"),
        ({"team": "v" * (TAG_VALUE_MAX + 1)}, "use 1 to 256"),
        ({"team": ""}, "use 1 to 256"),
        ({"": "x"}, "use 1 to 128"),
        ({"team": "a;b"}, "contains ';'"),
        ({"btk:profile": "x"}, "is set by the kit itself"),
        ({f"k{i}": "v" for i in range(MAX_USER_TAGS + 1)}, f"at most {MAX_USER_TAGS}"),
    ],
)
def test_tags_follow_the_aws_tag_rules(tags: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        _env(tags=tags)
    assert caught.value.errors()[0]["loc"] == ("tags",)


def test_tags_accept_what_aws_accepts() -> None:
    tags = {"cost-center": "ml platform", "owner@team": "a_b.c:d/e=f+g-h@i", "projet": "modèle"}
    assert _env(tags=tags).tags == tags


@pytest.mark.parametrize("fee", [math.inf, math.nan])
def test_the_fee_ceiling_is_finite(fee: float) -> None:
    with pytest.raises(ValidationError, match="finite number") as caught:
        ReservePlanCapacity.model_validate({**RESERVE, "max_upfront_fee": fee})
    assert caught.value.errors()[0]["loc"] == ("max_upfront_fee",)


def test_end_before_leaves_room_for_the_duration() -> None:
    with pytest.raises(ValidationError, match=r"end_before \(2027-01-05T00:00:00\+00:00\) leaves no room") as caught:
        ReservePlanCapacity.model_validate({**RESERVE, "end_before": "2027-01-05T00:00:00Z"})
    assert one_line(caught.value, root=EnvironmentConfig).startswith("capacity.end_before: ")
    assert ReservePlanCapacity.model_validate({**RESERVE, "end_before": "2027-01-06T00:00:00Z"}).end_before


@pytest.mark.parametrize("field", ["start_after", "end_before"])
def test_a_window_computed_from_the_clock_is_refused(field: str) -> None:
    """A value with seconds cannot be a date a user typed; it would name a new plan on every deploy."""
    clock = datetime.now(UTC) + timedelta(days=400)
    clock = clock.replace(second=clock.second or 1)
    with pytest.raises(ValidationError, match=r"write a fixed date such as \d{4}-\d\d-\d\dT00:00:00Z") as caught:
        ReservePlanCapacity.model_validate({**RESERVE, "end_before": "2029-01-01T00:00:00Z", field: clock})
    assert caught.value.errors()[0]["loc"] == (field,)
    with pytest.raises(ValidationError, match="not a fixed date"):
        ReservePlanCapacity.model_validate({**RESERVE, field: datetime(2027, 1, 4, 0, 0, 0, 5, tzinfo=UTC)})


def test_plan_window_fields_say_the_name_derives_from_them() -> None:
    for field in ("start_after", "end_before"):
        description = ReservePlanCapacity.model_fields[field].description or ""
        assert "fixed date" in description


@pytest.mark.parametrize(("instance_type", "message"), [("p5", "write the SageMaker name ml.p5.48xlarge"),
                                                          ("ml.p5.48xlarge\n", "not a SageMaker instance type name"),
                                                          ("banana", "not a SageMaker instance type name: e.g.")])
def test_instance_type_is_a_sagemaker_name(instance_type: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        _env(instance_type=instance_type)
    assert caught.value.errors()[0]["loc"] == ("instance_type",)


def test_model_level_rules_name_their_field_not_the_root() -> None:
    with pytest.raises(ValidationError) as caught:
        _env(availability_zone="us-west-2a")
    message = one_line(caught.value, root=EnvironmentConfig)
    assert message.startswith("availability_zone: availability_zone 'us-west-2a'")
    with pytest.raises(ValidationError) as caught:
        _env(capacity={**RESERVE, "instance_count": 3})
    assert one_line(caught.value, root=EnvironmentConfig).startswith("capacity.instance_count: instance_count 3")


@pytest.mark.parametrize("when", ["0001-01-01T02:00:00+05:00", "9999-12-31T23:00:00-05:00", "1970-01-01T00:00:00Z",
                                  "2300-01-01T00:00:00Z"])
def test_a_plan_window_outside_real_dates_is_one_line(when: str) -> None:
    """Year 1 shifted to UTC overflowed (OverflowError in btk capacity); 1970 or 2300 is a typo, not a plan."""
    with pytest.raises(ValidationError) as caught:
        ReservePlanCapacity.model_validate({**RESERVE, "start_after": when})
    assert caught.value.errors()[0]["loc"] == ("start_after",)
    assert one_line(caught.value, root=EnvironmentConfig).startswith("capacity.start_after: ")


def test_a_window_in_another_time_zone_is_kept_as_the_same_instant() -> None:
    reserve = ReservePlanCapacity.model_validate({**RESERVE, "start_after": "2027-01-04T05:00:00+05:00"})
    assert reserve.start_after == datetime(2027, 1, 4, tzinfo=UTC) and reserve.start_after.tzinfo == UTC


@pytest.mark.parametrize("fee", [1e16, 2e12])
def test_the_fee_ceiling_is_a_real_amount(fee: float) -> None:
    """1e16 was accepted and then refused on every deploy: the construct wrote it as '1e+16'."""
    with pytest.raises(ValidationError) as caught:
        ReservePlanCapacity.model_validate({**RESERVE, "max_upfront_fee": fee})
    assert caught.value.errors()[0]["loc"] == ("max_upfront_fee",)
    assert "e+" not in repr(ReservePlanCapacity.model_validate({**RESERVE, "max_upfront_fee": 1e12}).max_upfront_fee)


@pytest.mark.parametrize("uri", [
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:v1",
    "123456789012.dkr.ecr.eu-west-1.amazonaws.com/ml/team-a/trainer:2026.12.02",
    "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/trainer@sha256:" + "a" * 64,
])
def test_an_image_built_elsewhere_is_an_ecr_uri_by_tag_or_digest(uri: str) -> None:
    assert _env(image_uri=uri).image_uri == uri


@pytest.mark.parametrize("uri", [
    "docker.io/library/python:3.12",  # SageMaker training pulls from ECR
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer",  # no tag: "latest" by accident
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/Trainer:v1",  # repository names are lower case
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:v1\n",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer@sha256:abc",
    "12345678901.dkr.ecr.us-east-1.amazonaws.com/trainer:v1",
])
def test_an_image_uri_that_is_not_an_ecr_image_is_refused_naming_the_field(uri: str) -> None:
    with pytest.raises(ValidationError, match=r"is not an ECR image URI like 123456789012\.dkr\.ecr") as caught:
        _env(image_uri=uri)
    assert caught.value.errors()[0]["loc"] == ("image_uri",)


def test_rehearsal_is_on_by_default_where_capacity_is_bought_ahead() -> None:
    from btk.environment import EnvironmentConfig, ExistingPlanCapacity, RehearsalConfig

    base = {"name": "dev", "availability_zone": "us-east-1a", "profiles": ("llama3.2-1b",)}
    assert not EnvironmentConfig(**base).rehearses
    plan = ExistingPlanCapacity(plan_arn="arn:aws:sagemaker:us-east-1:123456789012:training-plan/p")
    assert EnvironmentConfig(**base, capacity=plan).rehearses
    assert not EnvironmentConfig(**base, capacity=plan, rehearsal=RehearsalConfig(enabled=False)).rehearses
    assert EnvironmentConfig(**base, rehearsal=RehearsalConfig(enabled=True)).rehearses
