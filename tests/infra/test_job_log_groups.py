"""SageMaker's job log groups get the environment's retention and key, and keep working after teardown."""

from __future__ import annotations

import json
from typing import Any

import cfn_fakes
from stack_synth import Synth

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


def test_every_job_log_group_gets_the_environments_retention_and_key(synth: Synth) -> None:
    env = synth.stack.env_config
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
