"""SageMaker's account-wide job log groups get their owner's retention and key, and keep working after teardown;
every other environment of the account and region leaves them alone, and its boundary refuses to change them."""

from __future__ import annotations

import json
from typing import Any

import cfn_fakes
import pytest
from iam_evaluation import Principal
from permission_reference import boundary_statements
from reserve_variant import synthesize_boundary
from stack_synth import Synth

import environments
from btk.environment import job_log_groups_owner
from stacks.boundary_stack import JOB_LOG_SETTINGS
from training_constructs.sagemaker_service import SAGEMAKER_LOG_GROUPS


def sdk_call(value: Any) -> dict[str, Any]:
    """One ``AwsSdkCall`` as JSON; a token inside (``Fn::Join``) becomes the JSON of its intrinsic."""
    if isinstance(value, dict):
        parts = value["Fn::Join"][1]
        value = "".join(part if isinstance(part, str) else json.dumps(part).replace('"', "'") for part in parts)
    result: dict[str, Any] = json.loads(value)
    return result


def calls_by_group(synth: Synth) -> dict[str, dict[str, dict[str, Any]]]:
    """Per log group, per action of its Create call: the ``{"Create": call, "Delete": call}`` of that resource."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for resource in synth.resources("Custom::AWS").values():
        events = {event: sdk_call(resource["Properties"][event]) for event in ("Create", "Delete")
                  if event in resource["Properties"]}
        create = events["Create"]
        found.setdefault(create["parameters"]["logGroupName"], {})[create["action"]] = events
    return found


def owner_of(env_name: str) -> str:
    catalog = list(environments.ENVIRONMENTS)
    return job_log_groups_owner(catalog, next(env for env in catalog if env.name == env_name))


def test_one_environment_of_each_account_and_region_owns_the_job_log_groups() -> None:
    catalog = list(environments.ENVIRONMENTS)
    for env in catalog:
        sharing = [other for other in catalog if (other.account, other.region) == (env.account, env.region)]
        assert {owner_of(other.name) for other in sharing} == {sharing[-1].name}


def test_only_the_owner_adopts_the_job_log_groups(synth: Synth) -> None:
    owns = owner_of(synth.env_name) == synth.env_name
    assert synth.stack.owns_job_log_groups == owns
    assert bool(calls_by_group(synth)) == owns


@pytest.mark.parametrize("env", environments.ENVIRONMENTS, ids=lambda env: env.name)
def test_a_non_owners_boundary_refuses_to_change_the_job_log_groups(env: Any) -> None:
    if owner_of(env.name) == env.name:
        pytest.skip(f"{env.name} owns its account's job log groups")
    boundary = boundary_statements(synthesize_boundary(env, environments.ENVIRONMENTS))
    anything = Principal([{"Effect": "Allow", "Action": "*", "Resource": "*"}], boundary)
    for name in SAGEMAKER_LOG_GROUPS:
        group = f"arn:aws:logs:{env.region}:{env.account}:log-group:{name}"
        for action in JOB_LOG_SETTINGS:
            assert not anything.allows(action, group), action
        # SageMaker's jobs still write there under the execution role.
        assert anything.allows("logs:PutLogEvents", f"{group}:log-stream:job/algo-1")


def test_every_job_log_group_gets_the_owners_retention_and_key(synth: Synth) -> None:
    env = synth.stack.env_config
    if owner_of(env.name) != env.name:
        pytest.skip(f"{env.name} leaves the job log groups to {owner_of(env.name)}")
    key_arn = json.dumps(synth.stack.resolve(synth.stack.key.key_arn)).replace('"', "'")
    by_group = calls_by_group(synth)
    assert set(by_group) == set(SAGEMAKER_LOG_GROUPS)
    for name, calls in by_group.items():
        assert set(calls) == {"createLogGroup", "putRetentionPolicy", "associateKmsKey"}, name
        # SageMaker creates the group on an account's first job: an existing one is adopted, not an error.
        assert calls["createLogGroup"]["Create"]["ignoreErrorCodesMatching"] == "ResourceAlreadyExistsException"
        assert calls["putRetentionPolicy"]["Create"]["parameters"]["retentionInDays"] == env.log_retention_days
        assert calls["associateKmsKey"]["Create"]["parameters"]["kmsKeyId"] == key_arn
        # Teardown hands the group back unencrypted: the environment's key may go with the stack.
        assert calls["associateKmsKey"]["Delete"]["action"] == "disassociateKmsKey"


def test_the_sdk_calls_may_touch_only_sagemakers_job_log_groups(synth: Synth) -> None:
    names = set(SAGEMAKER_LOG_GROUPS)
    for logical_id, policy in synth.resources("AWS::IAM::Policy").items():
        if "CustomResourcePolicy" not in logical_id:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            for resource in statement["Resource"]:
                arn = cfn_fakes.resolve(synth.template, resource)
                group = arn.split(":log-group:", 1)[1].removesuffix(":*")
                assert group in names, arn
