"""One SageMaker pipeline per model profile (``AWS::SageMaker::Pipeline``).

The definition comes from :mod:`training_constructs.pipeline_definition` (the SageMaker
Python SDK v3, offline). Resource attributes (role, key, buckets, subnets, file system) go in
as CDK token strings and come out of the JSON as ``Fn::Join`` parts, so the definition body is
resolved by CloudFormation. The pipelines of one environment share a pipeline role that may
create, describe and stop only this environment's jobs (by job-name prefix), tag them, and
pass only the execution role to SageMaker.

:class:`TrainingPipelines` makes one :class:`TrainingPipeline` per profile of the
environment, with the planner's knobs: adding a profile to an environment adds a pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from btk.environment import EnvironmentConfig
from btk.knobs import TrainingKnobs
from btk.naming import pipeline_name
from btk.profile import ModelProfile
from training_constructs.execution_role import sagemaker_principal
from training_constructs.nag import acknowledge_wildcard_resources
from training_constructs.pipeline_definition import (
    DataPreparation,
    FsxTrainingData,
    PipelineSpec,
    S3TrainingData,
    build_pipeline_definition,
    job_name_prefix,
)

#: Default instance of the data-preparation (tokenize) processing job.
DEFAULT_PREPARATION_INSTANCE = "ml.c5.9xlarge"


@dataclass(frozen=True)
class FileSystemLocation:
    """Where the ``train`` channel is on FSx for Lustre (``fsx`` mode).

    :param file_system_id: ``fs-…`` (a token is fine).
    :param mount_name: the Lustre mount name (a token is fine).
    :param directory: directory inside the file system; the environment's ``fsx_directory``.
    """

    file_system_id: str
    mount_name: str
    directory: str


@dataclass(frozen=True)
class PipelineResources:
    """What every pipeline of an environment runs with (made by the stack's other constructs).

    :param image_uri: the training image URI.
    :param execution_role: the jobs' execution role (passed to SageMaker by the pipeline role).
    :param key: the environment's key: job output, and volumes where the instance has EBS.
    :param subnets: the training subnet(s) in the environment's AZ.
    :param security_groups: the EFA/Lustre security group(s).
    :param datasets_bucket: datasets bucket (``s3`` mode channel; data-preparation in/out).
    :param checkpoints_bucket: checkpoints, one prefix per profile and execution.
    :param artifacts_bucket: model artifacts, one prefix per profile.
    :param datasets_prefix: the prefix of tokenized datasets. Default: ``datasets/``.
    :param file_system: the FSx location (``fsx`` mode); None in ``s3`` mode. Default: None.
    :param raw_data_prefix: where raw JSONL and ``tokenizer.json`` are put for the tokenize
        step. Default: ``raw/``.
    """

    image_uri: str
    execution_role: iam.IRole
    key: kms.IKey
    subnets: Sequence[ec2.ISubnet]
    security_groups: Sequence[ec2.ISecurityGroup]
    datasets_bucket: s3.IBucket
    checkpoints_bucket: s3.IBucket
    artifacts_bucket: s3.IBucket
    datasets_prefix: str = "datasets/"
    file_system: FileSystemLocation | None = None
    raw_data_prefix: str = "raw/"


@dataclass(frozen=True)
class TrainingPipelineProps:
    """Props of :class:`TrainingPipeline`.

    :param environment: the environment; the profile must be one of its ``profiles``.
    :param profile: the model profile.
    :param knobs: the planner's knobs for ``profile`` on the environment's instances.
    :param resources: the shared :class:`PipelineResources`.
    :param pipeline_role: role SageMaker Pipelines assumes. Default: a new
        :class:`PipelineRole` for this pipeline alone.
    :param training_plan_arn: default of the ``TrainingPlanArn`` parameter (a token from the
        reservation construct is fine). Default: None, i.e. "" (on-demand).
    :param data_preparation: add the tokenize ``ProcessingStep`` before training. Default: False.
    :param preparation_instance_type: instance of the tokenize job. Default: ``ml.c5.9xlarge``.
    """

    environment: EnvironmentConfig
    profile: ModelProfile
    knobs: TrainingKnobs
    resources: PipelineResources
    pipeline_role: PipelineRole | None = None
    training_plan_arn: str | None = None
    data_preparation: bool = False
    preparation_instance_type: str = DEFAULT_PREPARATION_INSTANCE


class PipelineRole(Construct):
    """The role SageMaker Pipelines assumes to run one environment's pipelines.

    It may create, describe and stop training (and, with data preparation, processing) jobs
    whose names start with ``btk-<env>-``, add tags to them, pass the execution role to
    SageMaker, and create grants on the key for job volumes. Nothing else.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: EnvironmentConfig,
        execution_role: iam.IRole,
        key: kms.IKey,
        data_preparation: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        prefix = f"btk-{environment.name}-"
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=sagemaker_principal(stack),
            description=f"SageMaker Pipelines role of {environment.name} training pipelines",
        )
        job_kinds = ["training-job", *(["processing-job"] if data_preparation else [])]
        self.job_arns = [
            stack.format_arn(service="sagemaker", resource=kind, resource_name=f"{prefix}*") for kind in job_kinds
        ]
        actions = ["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"]
        if data_preparation:
            actions += ["sagemaker:CreateProcessingJob", "sagemaker:DescribeProcessingJob",
                        "sagemaker:StopProcessingJob"]
        self.role.add_to_policy(iam.PolicyStatement(sid="RunJobs", actions=actions, resources=self.job_arns))
        # "Plan user" permissions: a job started with a TrainingPlanArn uses that plan's
        # reserved capacity. The plan is a run-time pipeline parameter, so any plan of this
        # account and region may be named; using a plan buys nothing (CreateTrainingPlan is
        # not granted here).
        self.plan_arns = [stack.format_arn(service="sagemaker", resource="training-plan", resource_name="*")]
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="UseTrainingPlans",
                actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingPlan"],
                resources=self.plan_arns,
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="TagJobsAtCreation",
                actions=["sagemaker:AddTags"],
                resources=self.job_arns,
                conditions={"StringEquals": {"sagemaker:TaggingAction": ["CreateTrainingJob", "CreateProcessingJob"]}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="PassExecutionRole",
                actions=["iam:PassRole"],
                resources=[execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="VolumeKeyGrants",
                actions=["kms:CreateGrant", "kms:DescribeKey"],
                resources=[key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            )
        )
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge_wildcard_resources(
            policy,
            self.job_arns,
            f"SageMaker Pipelines names each job at run time ({prefix}<profile>-<suffix>); create/describe/"
            "stop/tag are limited to this environment's job-name prefix",
        )
        acknowledge_wildcard_resources(
            policy,
            self.plan_arns,
            "TrainingPlanArn is chosen when a pipeline execution starts, so a job may run on any training plan of "
            "this account and region; CreateTrainingJob/DescribeTrainingPlan on a plan use its capacity, they "
            "cannot buy or change one",
        )

    @property
    def role_arn(self) -> str:
        return self.role.role_arn


class TrainingPipeline(Construct):
    """An ``AWS::SageMaker::Pipeline`` that trains one profile with the planner's knobs.

    Attributes: ``pipeline`` (the ``CfnPipeline``), ``pipeline_name`` (``btk-<env>-<profile>``
    with ``.`` as ``-``), ``job_name_prefix``, ``definition`` (the JSON with tokens),
    ``pipeline_role``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingPipelineProps) -> None:
        super().__init__(scope, construct_id)
        env, profile, resources = props.environment, props.profile, props.resources
        self.environment = env
        self.profile = profile
        self.pipeline_name = pipeline_name(env.name, profile.name)
        self.job_name_prefix = job_name_prefix(env.name, profile.name)
        self.pipeline_role = props.pipeline_role or PipelineRole(
            self,
            "PipelineRole",
            environment=env,
            execution_role=resources.execution_role,
            key=resources.key,
            data_preparation=props.data_preparation,
        )
        tokens = _TokenPlaceholders()
        region = env.region
        train_data = self._train_data(env, resources)
        if isinstance(train_data, FsxTrainingData):
            train_data = FsxTrainingData(
                file_system_id=tokens.hide(train_data.file_system_id, "fs-{}"),
                mount_name=tokens.hide(train_data.mount_name),
                directory=train_data.directory,
            )
        else:
            train_data = S3TrainingData(tokens.hide(train_data.s3_uri, "s3://{}"))
        preparation = None
        if props.data_preparation:
            preparation = DataPreparation(
                raw_s3_uri=tokens.hide(
                    resources.datasets_bucket.s3_url_for_object(resources.raw_data_prefix), "s3://{}"
                ),
                output_s3_uri=tokens.hide(
                    resources.datasets_bucket.s3_url_for_object(resources.datasets_prefix), "s3://{}"
                ),
                instance_type=props.preparation_instance_type,
            )
        spec = PipelineSpec(
            environment=env,
            profile=profile,
            knobs=props.knobs,
            image_uri=tokens.hide(resources.image_uri),
            role_arn=tokens.hide(resources.execution_role.role_arn, "arn:aws:iam::000000000000:role/{}"),
            kms_key_arn=tokens.hide(resources.key.key_arn, f"arn:aws:kms:{region}:000000000000:key/{{}}"),
            subnet_ids=[tokens.hide(subnet.subnet_id, "subnet-{}") for subnet in resources.subnets],
            security_group_ids=[tokens.hide(group.security_group_id, "sg-{}") for group in resources.security_groups],
            train_data=train_data,
            checkpoint_s3_uri=tokens.hide(resources.checkpoints_bucket.s3_url_for_object("checkpoints"), "s3://{}"),
            output_s3_uri=tokens.hide(resources.artifacts_bucket.s3_url_for_object("models"), "s3://{}"),
            training_plan_arn=tokens.hide(
                props.training_plan_arn or "", f"arn:aws:sagemaker:{region}:000000000000:training-plan/{{}}"
            ),
            data_preparation=preparation,
        )
        #: The definition JSON; CDK token strings inside resolve to ``Fn::Join`` parts at synth.
        self.definition = tokens.restore(build_pipeline_definition(spec))
        self.pipeline = sagemaker.CfnPipeline(
            self,
            "Pipeline",
            pipeline_name=self.pipeline_name,
            pipeline_display_name=self.pipeline_name,
            pipeline_description=f"Train {profile.name} on {env.instance_type} ({env.name})",
            pipeline_definition={"PipelineDefinitionBody": self.definition},
            role_arn=self.pipeline_role.role_arn,
        )
        if props.data_preparation:
            grant_data_preparation(resources)

    def _train_data(self, env: EnvironmentConfig, resources: PipelineResources) -> FsxTrainingData | S3TrainingData:
        if env.data_stage.mode == "fsx":
            location = resources.file_system
            if location is None:
                raise ValueError(
                    f"{self.node.path}: environment {env.name!r} uses data_stage.mode=fsx: "
                    "pass PipelineResources.file_system (the data stage's FSx id, mount name, directory)"
                )
            return FsxTrainingData(location.file_system_id, location.mount_name, location.directory)
        return S3TrainingData(resources.datasets_bucket.s3_url_for_object(resources.datasets_prefix))

    @property
    def pipeline_arn(self) -> str:
        """ARN of the pipeline."""
        return Stack.of(self).format_arn(service="sagemaker", resource="pipeline", resource_name=self.pipeline_name)


class TrainingPipelines(Construct):
    """One :class:`TrainingPipeline` per profile of ``env_config``, sharing one pipeline role.

    :param env_config: the environment; every name in ``env_config.profiles`` gets a pipeline.
    :param resources: the shared :class:`PipelineResources`.
    :param knobs: knobs by profile name. Default: ``btk.planner.search.plan_environment(env_config)``
        (what ``btk plan`` reports for the environment's instance type and count).
    :param training_plan_arn: default ``TrainingPlanArn`` of every pipeline. Default: None ("").
    :param data_preparation: add the tokenize step to every pipeline. Default: False.

    Attributes: ``pipelines`` (by profile name), ``pipeline_role``, ``job_name_prefix``
    (``btk-<env>-``, shared by every job of the environment).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        env_config: EnvironmentConfig,
        *,
        resources: PipelineResources,
        knobs: Mapping[str, TrainingKnobs] | None = None,
        training_plan_arn: str | None = None,
        data_preparation: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        from btk.catalog import get_profile

        if knobs is None:
            from btk.planner.search import plan_environment

            knobs = {name: plan.knobs for name, plan in plan_environment(env_config).items()}
        missing = [name for name in env_config.profiles if name not in knobs]
        if missing:
            raise ValueError(f"{self.node.path}: no knobs for profile(s) {', '.join(missing)}: plan them first")
        self.job_name_prefix = f"btk-{env_config.name}-"
        self.pipeline_role = PipelineRole(
            self,
            "PipelineRole",
            environment=env_config,
            execution_role=resources.execution_role,
            key=resources.key,
            data_preparation=data_preparation,
        )
        self.pipelines: dict[str, TrainingPipeline] = {}
        for name in env_config.profiles:
            self.pipelines[name] = TrainingPipeline(
                self,
                _construct_id(name),
                props=TrainingPipelineProps(
                    environment=env_config,
                    profile=get_profile(name),
                    knobs=knobs[name],
                    resources=resources,
                    pipeline_role=self.pipeline_role,
                    training_plan_arn=training_plan_arn,
                    data_preparation=data_preparation,
                ),
            )

    @property
    def pipeline_names(self) -> list[str]:
        return [pipeline.pipeline_name for pipeline in self.pipelines.values()]


def grant_data_preparation(resources: PipelineResources) -> None:
    """Let the execution role read raw data and write shards for the tokenize step (idempotent)."""
    role, bucket = resources.execution_role, resources.datasets_bucket
    raw_objects = bucket.arn_for_objects(f"{resources.raw_data_prefix}*")
    shard_objects = bucket.arn_for_objects(f"{resources.datasets_prefix}*")
    iam.Grant.add_to_principal(
        grantee=role,
        actions=["s3:ListBucket"],
        resource_arns=[bucket.bucket_arn],
        conditions={"StringLike": {"s3:prefix": [f"{resources.raw_data_prefix}*"]}},
    )
    iam.Grant.add_to_principal(grantee=role, actions=["s3:GetObject"], resource_arns=[raw_objects])
    iam.Grant.add_to_principal(
        grantee=role, actions=["s3:PutObject", "s3:AbortMultipartUpload"], resource_arns=[shard_objects]
    )
    iam.Grant.add_to_principal(
        grantee=role, actions=["kms:Decrypt", "kms:GenerateDataKey"], resource_arns=[resources.key.key_arn]
    )
    policy = role.node.try_find_child("DefaultPolicy")
    if policy is not None:
        acknowledge_wildcard_resources(
            policy,
            [raw_objects, shard_objects],
            "the tokenize step reads the user's raw files under the raw prefix and writes shards under the "
            "datasets prefix; object keys are the user's data and unknown at deploy time",
        )


class _TokenPlaceholders:
    """Stand-ins for CDK tokens while the SDK builds the definition.

    The SDK checks some values (a role must look like an ARN, or it calls IAM), so each
    unresolved value is replaced by a well-formed placeholder (``shape`` filled with a unique
    ``btkphNNNNx`` marker) and put back into the finished JSON string. The markers have a
    fixed width, so none is a prefix of another.
    """

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def hide(self, value: str, shape: str = "{}") -> str:
        if not Token.is_unresolved(value):
            return value
        placeholder = shape.format(f"btkph{len(self._values):04d}x")
        self._values[placeholder] = value
        return placeholder

    def restore(self, text: str) -> str:
        for placeholder in sorted(self._values, key=len, reverse=True):
            text = text.replace(placeholder, self._values[placeholder])
        return text


def _construct_id(profile: str) -> str:
    """``llama3.2-1b`` -> ``Llama321b`` (stable construct ids: logical ids do not change)."""
    return "".join(part.capitalize() for part in profile.replace(".", "-").split("-"))
