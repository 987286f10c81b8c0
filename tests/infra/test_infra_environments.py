"""Environment selection and validation: every bad value is one line naming the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, cast

import pytest
from pydantic import ValidationError
from stack_synth import REPO, cli_app

import environments
from app import load_environment, validate_environment
from btk.environment import (
    LOG_RETENTION_DAYS,
    TRAINING_PLAN_MAX_HOURS,
    DataStageConfig,
    EnvironmentConfig,
    ReservePlanCapacity,
    is_sellable_plan_duration,
    validate_fsx_storage_capacity,
    validate_fsx_throughput,
)
from btk.errors import BtkError
from btk.hardware import INSTANCE_TYPES, InstanceType
from training_constructs.data_stage import validate_fsx_settings
from training_constructs.retention import RETENTION_DAYS


def _raise_message(context: dict[str, Any]) -> str:
    with pytest.raises(BtkError) as caught:
        load_environment(context)
    message = str(caught.value)
    assert "\n" not in message
    return message


# Names, regions and profiles come from the user's environments.py; the checks hold for any of them.
ENV = environments.ENVIRONMENTS[0]
OTHER_REGION = "eu-west-1" if ENV.region != "eu-west-1" else "us-west-2"


def _fsx_with(**data_stage: Any) -> dict[str, Any]:
    values = ENV.model_dump()
    values["data_stage"] = {**values["data_stage"], "mode": "fsx", "fsx_storage_capacity_gib": 1200,
                            "fsx_throughput_per_tib": 250, **data_stage}
    return values


def test_default_environment_is_dev() -> None:
    assert load_environment({}).name == environments.DEFAULT_ENVIRONMENT
    assert load_environment({"env": None}).name == environments.DEFAULT_ENVIRONMENT


@pytest.mark.parametrize("env", environments.ENVIRONMENTS, ids=lambda env: env.name)
def test_each_environment_loads_unchanged(env: EnvironmentConfig) -> None:
    assert load_environment({"env": env.name}) == env


def test_unknown_environment() -> None:
    typo = ENV.name + "x"
    message = _raise_message({"env": typo})
    assert message.startswith(f"unknown environment '{typo}'")
    assert ENV.name in message


def test_capacity_1300_names_the_field() -> None:
    with pytest.raises(BtkError) as caught:
        validate_environment(ENV.name, _fsx_with(fsx_storage_capacity_gib=1300))
    message = str(caught.value)
    expected = f"environments.py: environment {ENV.name!r}: data_stage.fsx_storage_capacity_gib: 1300 GiB"
    assert message.startswith(expected)
    assert "1200 or a multiple of 2400" in message
    assert "\n" not in message


def test_throughput_300_names_the_field() -> None:
    with pytest.raises(BtkError) as caught:
        validate_environment(ENV.name, _fsx_with(fsx_throughput_per_tib=300))
    message = str(caught.value)
    assert message.startswith(f"environments.py: environment {ENV.name!r}: data_stage.fsx_throughput_per_tib: 300")
    assert "125, 250, 500, 1000" in message


def test_availability_zone_outside_region() -> None:
    message = _raise_message({"env": ENV.name, "availability_zone": f"{OTHER_REGION}a"})
    assert message.startswith(f"environments.py with -c availability_zone={OTHER_REGION}a: environment {ENV.name!r}:")
    assert f"availability_zone '{OTHER_REGION}a' is not in region {ENV.region}" in message


def test_region_override_needs_matching_zone() -> None:
    message = _raise_message({"env": ENV.name, "region": OTHER_REGION})
    assert f"not in region {OTHER_REGION}" in message
    config = load_environment({"env": ENV.name, "region": OTHER_REGION, "availability_zone": f"{OTHER_REGION}b"})
    assert (config.region, config.availability_zone) == (OTHER_REGION, f"{OTHER_REGION}b")


def test_unknown_profile() -> None:
    message = _raise_message({"env": ENV.name, "profiles": f"{ENV.profiles[0]},llama9-70b"})
    assert f"environment {ENV.name!r}: profiles: unknown profile 'llama9-70b'" in message


def test_account_override() -> None:
    assert load_environment({"env": ENV.name, "account": "444455556666"}).account == "444455556666"
    message = _raise_message({"env": ENV.name, "account": "12345"})
    source = "environments.py with -c account=12345"
    assert message == f"{source}: environment {ENV.name!r}: account: must be a 12-digit AWS account id"


@pytest.mark.parametrize(("capacity", "throughput"), [(1200, 125), (2400, 250), (4800, 1000), (24000, 500)])
def test_fsx_settings_accepted(capacity: int, throughput: int) -> None:
    validate_fsx_settings(capacity, throughput)


@pytest.mark.parametrize(
    ("capacity", "throughput", "field"),
    [(1300, 250, "fsx_storage_capacity_gib"), (3600, 250, "fsx_storage_capacity_gib"),
     (0, 250, "fsx_storage_capacity_gib"), (1200, 300, "fsx_throughput_per_tib"),
     (2400, 200, "fsx_throughput_per_tib")],
)
def test_fsx_settings_rejected(capacity: int, throughput: int, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^data_stage\.{field}: "):
        validate_fsx_settings(capacity, throughput)


@pytest.mark.parametrize(("capacity", "throughput"), [(1300, 250), (3600, 250), (0, 250), (-2400, 250),
                                                    (1200, 300), (2400, 200), (1200, 0)])
def test_fsx_rule_rejects_the_same_values_in_the_config_and_the_construct(capacity: int, throughput: int) -> None:
    """Both levels call the same validators, so they reject the same values with the same words."""
    with pytest.raises(ValueError) as rule:
        validate_fsx_storage_capacity(capacity)
        validate_fsx_throughput(throughput)
    with pytest.raises(ValidationError) as config:
        DataStageConfig(fsx_storage_capacity_gib=capacity, fsx_throughput_per_tib=throughput)
    with pytest.raises(ValueError) as construct:
        validate_fsx_settings(capacity, throughput)
    assert str(rule.value) in str(config.value)
    assert str(construct.value).endswith(str(rule.value))


def test_every_accepted_log_retention_has_a_cdk_member() -> None:
    """The config's list is the map's keys; a value outside it fails before any construct."""
    assert tuple(RETENTION_DAYS) == LOG_RETENTION_DAYS
    values = ENV.model_dump()
    for days in (2, 0, 9999):
        with pytest.raises(BtkError, match=rf"log_retention_days: {days} is not a CloudWatch Logs retention"):
            validate_environment(ENV.name, {**values, "log_retention_days": days})


def test_each_retention_member_synthesizes_its_days() -> None:
    """The map pairs each number with the CDK member that CloudFormation receives as that number."""
    from aws_cdk import CfnElement, Stack
    from aws_cdk import aws_logs as logs
    from aws_cdk.assertions import Template

    stack = Stack(cli_app(), "Retention")
    groups = {days: logs.LogGroup(stack, f"Group{days}", retention=member) for days, member in RETENTION_DAYS.items()}
    template = Template.from_stack(stack).to_json()["Resources"]
    for days, group in groups.items():
        logical_id = stack.get_logical_id(cast(CfnElement, group.node.default_child))
        assert template[logical_id]["Properties"]["RetentionInDays"] == days


@pytest.mark.parametrize("hours", [0, 23, 24, 30, 25 * 24 + 1, TRAINING_PLAN_MAX_HOURS, TRAINING_PLAN_MAX_HOURS + 24])
def test_training_plan_duration_rule_is_the_configs(hours: int) -> None:
    """``btk capacity search --duration-hours`` and ``capacity.duration_hours`` ask the same function."""
    reserve = {"start_after": "2026-03-02T00:00:00Z", "instance_count": 2, "max_upfront_fee": 1.0,
               "purchase_approved": True}
    try:
        ReservePlanCapacity.model_validate({**reserve, "duration_hours": hours})
    except ValidationError:
        accepted = False
    else:
        accepted = True
    assert accepted == is_sellable_plan_duration(hours) == (hours in (24, TRAINING_PLAN_MAX_HOURS))


def _run_app(context: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context)}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"env": "nope"}, "btk: error: unknown environment 'nope'"),
        ({"env": ENV.name, "availability_zone": f"{OTHER_REGION}a"},
         f"btk: error: environments.py with -c availability_zone={OTHER_REGION}a: environment {ENV.name!r}: "),
        ({"env": ENV.name, "profiles": "gpt-x"},
         f"btk: error: environments.py with -c profiles=gpt-x: environment {ENV.name!r}: profiles: unknown profile"),
        ({"env": ENV.name, "require_rehearsal": "maybe"}, "btk: error: -c require_rehearsal=maybe: give true or false"),
    ],
)
def test_app_exits_2_with_one_line(context: dict[str, Any], expected: str) -> None:
    """app.py the way the CDK CLI runs it: exit 2, one line on stderr, nothing built."""
    result = _run_app(context)
    assert result.returncode == 2
    assert result.stderr.startswith(expected)
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


# -- managed spot, retries, notification e-mails ---------------------------------------------


def _with(**changes: Any) -> dict[str, Any]:
    values = ENV.model_dump()
    values.update({"capacity": {"mode": "on_demand"}, **changes})
    return values


@pytest.mark.parametrize("instance", list(INSTANCE_TYPES.values()), ids=lambda instance: instance.name)
def test_spot_only_where_the_catalog_shows_it_offered(instance: InstanceType) -> None:
    values = _with(instance_type=instance.name, managed_spot=True, data_stage={"mode": "s3"})
    if instance.managed_spot.offered:
        assert validate_environment(ENV.name, values).managed_spot
        return
    with pytest.raises(BtkError) as caught:
        validate_environment(ENV.name, values)
    message = str(caught.value)
    assert "\n" not in message
    assert f"environment {ENV.name!r}: managed_spot: {instance.name} is not shown to be offered" in message
    assert instance.managed_spot.source in message


def test_every_catalog_spot_answer_has_a_source() -> None:
    for instance in INSTANCE_TYPES.values():
        assert instance.managed_spot.source and instance.managed_spot.date, instance.name


@pytest.mark.parametrize(
    ("retries", "field"),
    [({"max_attempts": 21}, "max_attempts"), ({"max_attempts": -1}, "max_attempts"),
     ({"interval_seconds": 0}, "interval_seconds"), ({"backoff_rate": 0.5}, "backoff_rate"),
     ({"backoff_rate": float("inf")}, "backoff_rate"), ({"retry": 2}, "retry")],
)
def test_bad_job_retries_name_the_field(retries: dict[str, Any], field: str) -> None:
    with pytest.raises(BtkError) as caught:
        validate_environment(ENV.name, _with(job_retries=retries))
    message = str(caught.value)
    assert f"job_retries.{field}" in message and "\n" not in message


@pytest.mark.parametrize("emails", [("ops",), ("a b@example.com",), ("ops@example.com", "ops@example.com")])
def test_bad_notification_emails_name_the_field(emails: tuple[str, ...]) -> None:
    with pytest.raises(BtkError) as caught:
        validate_environment(ENV.name, _with(notification_emails=emails))
    message = str(caught.value)
    assert "notification_emails" in message and "\n" not in message


def test_notification_emails_accepted() -> None:
    config = validate_environment(ENV.name, _with(notification_emails=("ml-oncall@example.com",)))
    assert config.notification_emails == ("ml-oncall@example.com",)
