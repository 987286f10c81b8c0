"""SageMaker's job log groups under the environment's retention and key.

SageMaker writes every training and processing job's logs to the account-wide groups
``/aws/sagemaker/TrainingJobs`` and ``/aws/sagemaker/ProcessingJobs`` and creates them on an
account's first job, with no expiry and no customer key. A stack cannot own them as
``AWS::Logs::LogGroup`` (creating one that exists fails the deploy, and deleting the stack would
delete every environment's job logs), so :class:`SageMakerJobLogGroups` adopts them with SDK
calls at deploy time:

- Create/Update: ``CreateLogGroup`` (an existing group is fine), ``PutRetentionPolicy`` with the
  environment's ``log_retention_days`` and ``AssociateKmsKey`` with the environment's key;
- Delete: ``DisassociateKmsKey``, so that the groups stay writable once the environment's key is
  gone; the groups and their logs stay, under their retention.

In an account shared by several environments the groups are shared too: one environment of the
account and region owns them (:func:`btk.environment.job_log_groups_owner`: the last in
``environments.py``, the one CI deploys last), and the others' permissions boundaries refuse to
change their settings. One account per environment (docs/ci.md) keeps each environment's job logs
under its own settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from training_constructs.nag import acknowledge_wildcard_resources, depend_on_policy_only, skip_checkov
from training_constructs.sagemaker_service import SAGEMAKER_LOG_GROUPS

#: The group already exists (SageMaker made it, or another environment adopted it): nothing to create.
ALREADY_EXISTS = "ResourceAlreadyExistsException"
#: Construct id of the stack-wide function behind every ``AwsCustomResource`` (aws-cdk-lib's own).
AWS_CUSTOM_RESOURCE_FUNCTION = "AWS679f53fac002430cb0da5b7982bd2287"
#: What the adoption calls, by the group's ARN.
ADOPT_ACTIONS = ("logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:AssociateKmsKey", "logs:DisassociateKmsKey")


@dataclass(frozen=True)
class SageMakerJobLogGroupsProps:
    """Props of :class:`SageMakerJobLogGroups`.

    :param key: the key the groups are encrypted with; its policy must let
        ``logs.<region>.amazonaws.com`` use it for this account's log groups (the stack's
        :class:`~training_constructs.data_stage.DataKey` does).
    :param retention_days: the environment's ``log_retention_days`` (a CloudWatch Logs value).
    :param handler_log_group: where the SDK-call function logs. Default: None (Lambda's own group).
    :param log_group_names: the groups to adopt. Default: SageMaker's training and processing job groups.
    """

    key: kms.IKey
    retention_days: int
    handler_log_group: logs.ILogGroup | None = None
    log_group_names: tuple[str, ...] = SAGEMAKER_LOG_GROUPS


class SageMakerJobLogGroups(Construct):
    """Puts SageMaker's job log groups under a retention and a customer key (see the module doc).

    Attributes: ``log_group_arns`` (the groups adopted), ``custom_resources`` (one per group and call).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: SageMakerJobLogGroupsProps) -> None:
        super().__init__(scope, construct_id)
        self.log_group_arns: list[str] = []
        self.custom_resources: list[cr.AwsCustomResource] = []
        # One role for the stack's SDK-call function, no managed policy: each call's statement is
        # added to it by its custom resource, and it writes only its own log group.
        self.role = iam.Role(
            self,
            "CallerRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="SDK calls that put SageMaker's job log groups under the environment's retention and key",
        )
        if props.handler_log_group is not None:
            props.handler_log_group.grant_write(self.role)
        self._props = props
        for index, name in enumerate(props.log_group_names):
            self._adopt(index, name, props)
        function = Stack.of(self).node.try_find_child(AWS_CUSTOM_RESOURCE_FUNCTION)
        if function is not None:
            skip_checkov(function)
            depend_on_policy_only(function, self.role)

    def _adopt(self, index: int, name: str, props: SageMakerJobLogGroupsProps) -> None:
        """Create-if-missing, retention and key of one group; the key is disassociated on delete."""
        arn = Stack.of(self).format_arn(
            service="logs", resource="log-group", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        self.log_group_arns.append(arn)
        policy = cr.AwsCustomResourcePolicy.from_statements(
            [iam.PolicyStatement(actions=list(ADOPT_ACTIONS), resources=[arn, f"{arn}:*"])]
        )
        group = {"logGroupName": name}

        def call(action: str, parameters: dict[str, object], suffix: str, **extra: object) -> cr.AwsSdkCall:
            return cr.AwsSdkCall(
                service="CloudWatchLogs",
                action=action,
                parameters={**group, **parameters},
                physical_resource_id=cr.PhysicalResourceId.of(f"{name}:{suffix}"),
                **extra,  # type: ignore[arg-type]
            )

        common: dict[str, Any] = {
            "policy": policy, "install_latest_aws_sdk": False, "role": self.role, "log_group": props.handler_log_group
        }
        create = cr.AwsCustomResource(
            self, f"Create{index}", **common,
            on_create=call("createLogGroup", {}, "create", ignore_error_codes_matching=ALREADY_EXISTS),
        )
        retain = cr.AwsCustomResource(
            self, f"Retention{index}", **common,
            on_update=call("putRetentionPolicy", {"retentionInDays": props.retention_days}, "retention"),
        )
        encrypt = cr.AwsCustomResource(
            self, f"Key{index}", **common,
            on_update=call("associateKmsKey", {"kmsKeyId": props.key.key_arn}, "key"),
            on_delete=call("disassociateKmsKey", {}, "key", ignore_error_codes_matching="ResourceNotFoundException"),
        )
        retain.node.add_dependency(create)
        encrypt.node.add_dependency(create)
        for resource in (create, retain, encrypt):
            acknowledge_wildcard_resources(
                resource.node.find_child("CustomResourcePolicy"),
                [f"{arn}:*"],
                "CloudWatch Logs authorizes some log-group calls on the group's ARN with a ':*' suffix; the policy "
                f"names SageMaker's fixed job log group {name} only",
            )
            self.custom_resources.append(resource)
