"""The SageMaker training execution role, least privilege.

The role may read the datasets prefix, read/write checkpoints, write artifacts, use the
environment's key, pull the training image, write its own log groups and metrics, create
and delete the job's network interfaces in this VPC's training subnet, and describe FSx.
Every ``*`` resource is an API that supports nothing narrower; each carries a cdk-nag
acknowledgement naming that API.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from training_constructs.data_stage import DataStage
from training_constructs.nag import acknowledge, acknowledge_wildcard_resources
from training_constructs.sagemaker_service import SAGEMAKER_LOG_GROUPS, TRAINING_METRIC_NAMESPACE, sagemaker_principal
from training_constructs.training_image import TrainingImage

#: Read-only EC2 calls SageMaker makes before placing ENIs; EC2 Describe* has no resource scope.
EC2_DESCRIBE_ACTIONS = (
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
)


@dataclass(frozen=True)
class TrainingExecutionRoleProps:
    """Props of :class:`TrainingExecutionRole`.

    :param data_stage: buckets, key and (``fsx`` mode) file system the jobs use.
    :param image: the training image the jobs pull.
    :param vpc: the VPC the jobs' network interfaces are created in.
    :param subnet: the training subnet.
    :param security_group: the EFA/Lustre security group attached to the jobs.
    """

    data_stage: DataStage
    image: TrainingImage
    vpc: ec2.IVpc
    subnet: ec2.ISubnet
    security_group: ec2.ISecurityGroup


class TrainingExecutionRole(Construct):
    """An IAM role assumed by ``sagemaker.amazonaws.com`` for training and processing jobs.

    Attributes: ``role``; ``add_to_policy`` adds a statement (acknowledge any wildcard it
    adds with :func:`training_constructs.nag.acknowledge`).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingExecutionRoleProps) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=sagemaker_principal(stack),
            description=f"SageMaker training execution role ({stack.stack_name})",
        )
        data_stage = props.data_stage
        data_stage.grant_read_datasets(self.role)
        data_stage.grant_read_write_checkpoints(self.role)
        data_stage.grant_write_artifacts(self.role)
        props.image.grant_pull(self.role)
        self._logs_and_metrics(stack)
        self._network_interfaces(stack, props)
        self._file_system(data_stage)
        self._acknowledge(stack, data_stage)

    def add_to_policy(self, statement: iam.PolicyStatement) -> bool:
        """Add ``statement`` to the role's default policy; True if it was added."""
        return self.role.add_to_principal_policy(statement).statement_added

    def _log_group_arns(self, stack: Stack) -> list[str]:
        return [
            stack.format_arn(
                service="logs", resource="log-group", resource_name=f"{name}:*",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
            for name in SAGEMAKER_LOG_GROUPS
        ]

    def _log_groups(self, stack: Stack) -> list[str]:
        """The groups themselves: ``logs:CreateLogGroup`` is authorized on the group ARN without ``:*``."""
        return [
            stack.format_arn(
                service="logs", resource="log-group", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
            )
            for name in SAGEMAKER_LOG_GROUPS
        ]

    def _logs_and_metrics(self, stack: Stack) -> None:
        # SageMaker creates its log groups on an account's first job, as this role.
        self.role.add_to_policy(
            iam.PolicyStatement(sid="CreateJobLogGroups", actions=["logs:CreateLogGroup"],
                                resources=self._log_groups(stack))
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=self._log_group_arns(stack),
            )
        )
        # The Service Authorization Reference lists the group's own ARN for DescribeLogStreams, while
        # CloudWatch Logs documents group ARNs ending in ":*"; granting both holds either way.
        self.role.add_to_policy(
            iam.PolicyStatement(sid="DescribeJobLogStreams", actions=["logs:DescribeLogStreams"],
                                resources=self._log_groups(stack))
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": TRAINING_METRIC_NAMESPACE}},
            )
        )

    def _network_interfaces(self, stack: Stack, props: TrainingExecutionRoleProps) -> None:
        vpc_arn = stack.format_arn(service="ec2", resource="vpc", resource_name=props.vpc.vpc_id)
        subnet_arn = stack.format_arn(service="ec2", resource="subnet", resource_name=props.subnet.subnet_id)
        group_arn = stack.format_arn(
            service="ec2", resource="security-group", resource_name=props.security_group.security_group_id
        )
        self.network_interface_arn = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
        self.role.add_to_policy(
            iam.PolicyStatement(sid="DescribeNetwork", actions=list(EC2_DESCRIBE_ACTIONS), resources=["*"])
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateJobInterfacesInTrainingSubnet",
                actions=["ec2:CreateNetworkInterface"],
                resources=[subnet_arn, group_arn],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateJobInterfaces",
                actions=["ec2:CreateNetworkInterface"],
                resources=[self.network_interface_arn],
                conditions={"StringEquals": {"ec2:Subnet": subnet_arn, "ec2:Vpc": vpc_arn}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="LetSageMakerUseJobInterfaces",
                actions=["ec2:CreateNetworkInterfacePermission"],
                resources=[self.network_interface_arn],
                # No ec2:AuthorizedService condition: SageMaker's documented role policy has none and
                # only CodeBuild documents setting it; a condition SageMaker's call does not meet
                # would fail every job's network set-up, which nothing offline can show.
                conditions={"StringEquals": {"ec2:Vpc": vpc_arn}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="DeleteJobInterfaces",
                actions=["ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission"],
                resources=[self.network_interface_arn],
                conditions={"StringEquals": {"ec2:Vpc": vpc_arn}},
            )
        )

    def _file_system(self, data_stage: DataStage) -> None:
        if not data_stage.fsx_enabled:
            return
        self.role.add_to_policy(
            iam.PolicyStatement(sid="DescribeFileSystems", actions=["fsx:DescribeFileSystems"], resources=["*"])
        )

    def _acknowledge(self, stack: Stack, data_stage: DataStage) -> None:
        policy = self.role.node.try_find_child("DefaultPolicy")
        assert policy is not None, "the role's grants create its default policy"
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            "only APIs without resource-level permissions use '*': ecr:GetAuthorizationToken, "
            "cloudwatch:PutMetricData (limited by cloudwatch:namespace), EC2 Describe* "
            "(DescribeNetworkInterfaces/Vpcs/DhcpOptions/Subnets/SecurityGroups) and fsx:DescribeFileSystems",
        )
        acknowledge_wildcard_resources(
            policy,
            [self.network_interface_arn],
            "SageMaker creates the job's ENIs at run time, so their ids are unknown; "
            "ec2:CreateNetworkInterface/CreateNetworkInterfacePermission/DeleteNetworkInterface are limited "
            "by the ec2:Vpc and ec2:Subnet conditions to this VPC's training subnet",
        )
        acknowledge_wildcard_resources(
            policy,
            self._log_group_arns(stack),
            "SageMaker names one log stream per job and host inside its fixed log groups "
            f"{' and '.join(SAGEMAKER_LOG_GROUPS)}; the streams are unknown at deploy",
        )
        acknowledge_wildcard_resources(
            policy,
            [data_stage.datasets_bucket.arn_for_objects(f"{data_stage.datasets_prefix}*")],
            "read access to dataset objects is limited to the datasets prefix; object keys are the user's data",
        )
        acknowledge_wildcard_resources(
            policy,
            [data_stage.checkpoints_bucket.arn_for_objects("*"), data_stage.artifacts_bucket.arn_for_objects("*")],
            "the checkpoints and artifacts buckets are dedicated to training jobs, whose object keys carry "
            "the run-time job name",
        )
