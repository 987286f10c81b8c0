"""TrainingStack: everything one environment needs to train.

Composes the network, the data stage (key, buckets, FSx for Lustre), the training image
and the execution role. Pipelines, observability and training plans attach to the public
attributes ``network``, ``data_stage``, ``image``, ``execution_role`` and ``env_config``.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Environment, Stack, Tags
from aws_cdk import aws_iam as iam
from constructs import Construct

from btk.bootstrap import boundary_policy_name
from btk.catalog import get_profile
from btk.environment import EnvironmentConfig
from btk.hardware import INSTANCE_TYPES
from btk.planner.search import plan_environment, rehearsal_nodes
from training_constructs.data_stage import DataKey, DataKeyProps, DataStage, DataStageProps, datasets_bucket_name
from training_constructs.execution_role import TrainingExecutionRole, TrainingExecutionRoleProps
from training_constructs.network import TrainingNetwork, TrainingNetworkProps
from training_constructs.observability import TrainingObservability, TrainingObservabilityProps
from training_constructs.pipeline import PipelineResources, PlannedProfile, TrainingPipelines, TrainingPipelinesProps
from training_constructs.removal import data_removal_policy
from training_constructs.retention import RETENTION_DAYS
from training_constructs.training_image import TrainingImage, TrainingImageProps
from training_constructs.training_plan import TrainingPlanReservation, TrainingPlanReservationProps


def planned_profiles(env_config: EnvironmentConfig) -> tuple[PlannedProfile, ...]:
    """Each profile of the environment with the knobs ``btk plan`` reports for its instances, its knob ladder and
    where and how fast a rehearsal of them runs."""
    plans = plan_environment(env_config)
    planned = []
    for name in env_config.profiles:
        plan = plans[name]
        nodes, rehearsal = rehearsal_nodes(plan.profile, plan.instance, plan.nodes, plan.knobs)
        planned.append(PlannedProfile(get_profile(name), plan.knobs, tuple(rung.knobs for rung in plan.ladder),
                                      rehearsal_nodes=nodes,
                                      rehearsal_tokens_per_second_per_gpu=rehearsal.estimate.tokens_per_second_per_gpu))
    return tuple(planned)


class TrainingStack(Stack):
    """One environment's training infrastructure; stack name ``env_config.stack_name``."""

    def __init__(self, scope: Construct, construct_id: str, *, env_config: EnvironmentConfig,
                 owns_job_log_groups: bool = True) -> None:
        """``owns_job_log_groups``: put SageMaker's account-wide job log groups under this environment's
        retention and key (:func:`btk.environment.job_log_groups_owner`); default ``True``."""
        super().__init__(
            scope,
            construct_id,
            stack_name=env_config.stack_name,
            env=Environment(account=env_config.account, region=env_config.region),
            description=f"Blackwell Training Kit: training infrastructure for environment {env_config.name}",
            analytics_reporting=False,
        )
        self.env_config = env_config
        self.owns_job_log_groups = owns_job_log_groups
        for key, value in sorted(env_config.tags.items()):
            Tags.of(self).add(key, value)
        # Every role of the environment carries its bootstrap's permissions boundary
        # (stacks/boundary_stack.py): the boundary refuses to create a role without it, and keeps
        # each role off other environments' resources.
        iam.PermissionsBoundary.of(self).apply(
            iam.ManagedPolicy.from_managed_policy_name(self, "PermissionsBoundary", boundary_policy_name(env_config))
        )
        removal_policy = data_removal_policy(env_config.retain_data)
        log_retention = RETENTION_DAYS[env_config.log_retention_days]

        # In fsx mode the datasets bucket gets a name known before it exists, so that the key can
        # let FSx's S3 role use it for that bucket alone.
        datasets_bucket = datasets_bucket_name(env_config.name, self) if env_config.data_stage.mode == "fsx" else None
        self.key = DataKey(
            self, "DataKey", props=DataKeyProps(removal_policy=removal_policy, fsx_datasets_bucket=datasets_bucket)
        )
        self.network = TrainingNetwork(
            self,
            "Network",
            props=TrainingNetworkProps(
                cidr=env_config.vpc_cidr,
                availability_zone=env_config.availability_zone,
                flow_log_key=self.key,
                flow_log_retention=log_retention,
                removal_policy=removal_policy,
            ),
        )
        self.data_stage = DataStage(
            self,
            "DataStage",
            props=DataStageProps(
                config=env_config.data_stage,
                key=self.key,
                vpc=self.network.vpc,
                subnet=self.network.training_subnet,
                security_group=self.network.security_group,
                retain_data=env_config.retain_data,
                datasets_bucket_name=datasets_bucket,
            ),
        )
        instance = INSTANCE_TYPES.get(env_config.instance_type)  # outside the catalog, planning names the error
        self.image = TrainingImage(self, "TrainingImage", props=TrainingImageProps(
            image_uri=env_config.image_uri, cpu_architecture=instance.cpu_architecture if instance else "x86_64"))
        self.execution_role = TrainingExecutionRole(
            self,
            "ExecutionRole",
            props=TrainingExecutionRoleProps(
                data_stage=self.data_stage,
                image=self.image,
                vpc=self.network.vpc,
                subnet=self.network.training_subnet,
                security_group=self.network.security_group,
            ),
        )
        self.training_plan = TrainingPlanReservation(
            self,
            "TrainingPlan",
            props=TrainingPlanReservationProps(
                environment=env_config,
                log_key=self.key,
                availability_zone=self.network.training_subnet.availability_zone,
                log_retention=log_retention,
            ),
        )
        self._pipelines()
        self._outputs()

    def _pipelines(self) -> None:
        """One SageMaker pipeline per profile, and the environment's dashboard and failure alerts."""
        env_config, data_stage = self.env_config, self.data_stage
        self.pipelines = TrainingPipelines(
            self,
            "Pipelines",
            props=TrainingPipelinesProps(
                environment=env_config,
                profiles=planned_profiles(env_config),
                resources=PipelineResources(
                    image_uri=self.image.image_uri,
                    execution_role=self.execution_role.role,
                    key=self.key,
                    subnets=[self.network.training_subnet],
                    security_groups=[self.network.security_group],
                    datasets=data_stage.datasets,
                    checkpoints_bucket=data_stage.checkpoints_bucket,
                    artifacts_bucket=data_stage.artifacts_bucket,
                    file_system=data_stage.file_system,
                ),
                training_plan_arn=self.training_plan.plan_arn,
            ),
        )
        self.observability = TrainingObservability(
            self,
            "Observability",
            props=TrainingObservabilityProps(
                environment=env_config,
                pipeline_names=self.pipelines.pipeline_names,
                job_name_prefixes={name: p.job_name_prefix for name, p in self.pipelines.pipelines.items()},
                key=self.key,
                notification_emails=env_config.notification_emails,
                manage_sagemaker_log_groups=self.owns_job_log_groups,
            ),
        )

    @property
    def availability_zones(self) -> list[str]:
        """The configured AZ only: no ``availability-zones`` context lookup (offline synth)."""
        return [self.env_config.availability_zone]

    def _outputs(self) -> None:
        data_stage = self.data_stage
        outputs: dict[str, tuple[str, str]] = {
            "DatasetsBucketName": (data_stage.datasets_bucket.bucket_name, "S3 bucket for datasets"),
            "CheckpointsBucketName": (data_stage.checkpoints_bucket.bucket_name, "S3 bucket for checkpoints"),
            "ArtifactsBucketName": (data_stage.artifacts_bucket.bucket_name, "S3 bucket for model artifacts"),
            "DataKeyArn": (self.key.key_arn, "KMS key for data at rest"),
            "ImageUri": (self.image.image_uri, "training image URI"),
            "ExecutionRoleArn": (self.execution_role.role.role_arn, "SageMaker training execution role"),
            "TrainingSubnetId": (self.network.training_subnet.subnet_id, "subnet of the training jobs"),
            "TrainingSecurityGroupId": (self.network.security_group.security_group_id, "EFA/Lustre security group"),
            "FailureTopicArn": (
                self.observability.topic.topic_arn,
                "SNS topic of failed pipeline executions and training jobs (subscribe to be told)",
            ),
            "EventLogGroupName": (
                self.observability.event_log_group.log_group_name,
                "log group recording the failure events (/btk/<env>/training-events-<stack generation>)",
            ),
        }
        if self.training_plan.plan_arn is not None:
            outputs["TrainingPlanArn"] = (self.training_plan.plan_arn, "default training plan of every pipeline")
        location = data_stage.file_system
        if location is not None:
            outputs["FileSystemId"] = (location.file_system_id, "FSx for Lustre file system id")
            outputs["FileSystemMountName"] = (location.mount_name, "FSx for Lustre mount name")
            outputs["FileSystemDirectoryPath"] = (location.directory_path, "datasets path for FileSystemDataSource")
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)
