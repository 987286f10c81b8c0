"""One SageMaker pipeline per model profile (``AWS::SageMaker::Pipeline``).

The definition comes from :mod:`training_constructs.pipeline_definition` (the SageMaker
Python SDK v3, offline). Resource attributes (role, key, buckets, subnets, file system) go in
as CDK token strings and come out of the JSON as ``Fn::Join`` parts, so the definition body is
resolved by CloudFormation. The pipelines of one environment share a pipeline role that may
create, tag and stop only jobs tagged for this environment, describe the jobs its pipelines
name, and pass only the execution role to SageMaker.

:class:`TrainingPipelines` makes one :class:`TrainingPipeline` per profile of the
environment, with the knobs the caller planned for it: adding a profile to an environment
adds a pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from btk.environment import EnvironmentConfig
from btk.hardware import get_instance_type
from btk.knobs import TrainingKnobs
from btk.naming import TAG_ENVIRONMENT, environment_prefix, job_name_prefix, pipeline_name
from btk.planner.search import rehearsal_memory_limit_gib, rehearsal_threshold
from btk.profile import ModelProfile
from training_constructs.data_stage import DatasetsLocation
from training_constructs.locations import FileSystemLocation
from training_constructs.nag import acknowledge_wildcard_resources
from training_constructs.pipeline_definition import (
    DataPreparation,
    PipelineSpec,
    RehearsalSpec,
    S3TrainingData,
    build_pipeline_definition,
)
from training_constructs.sagemaker_service import sagemaker_principal

#: How SageMaker Pipelines names a job whose step carries no job name of its own.
PIPELINES_JOB_NAME_PREFIX = "pipelines-"
#: Default instance of the data-preparation (tokenize) processing job.
DEFAULT_PREPARATION_INSTANCE = "ml.c5.9xlarge"


@dataclass(frozen=True)
class PlannedProfile:
    """A model profile with the knobs planned for it on the environment's instances.

    :param profile: the model profile.
    :param knobs: what ``btk plan`` chose for it (or any knobs the caller pins).
    :param knob_ladder: the knob sets a job steps down to when it runs out of memory before its
        first checkpoint (``btk plan``'s ``knob_ladder``). Default: none.
    :param rehearsal_nodes: the instances a rehearsal of the knobs runs on
        (:func:`btk.planner.search.rehearsal_nodes`). Default: 1.
    :param rehearsal_tokens_per_second_per_gpu: the planner's tokens/s per GPU for the rehearsal, which
        its gate holds the measured figure against. Default: None (the environment's rehearsal, if on,
        cannot be gated: synth fails naming it).
    """

    profile: ModelProfile
    knobs: TrainingKnobs
    knob_ladder: tuple[TrainingKnobs, ...] = ()
    rehearsal_nodes: int = 1
    rehearsal_tokens_per_second_per_gpu: float | None = None


@dataclass(frozen=True)
class PipelineResources:
    """What every pipeline of an environment runs with (made by the stack's other constructs).

    :param image_uri: the training image URI.
    :param execution_role: the jobs' execution role (passed to SageMaker by the pipeline role).
    :param key: the environment's key: job output, and volumes where the instance has EBS.
    :param subnets: the training subnet(s) in the environment's AZ.
    :param security_groups: the EFA/Lustre security group(s).
    :param datasets: the datasets bucket and prefixes (``s3`` mode channel; data-preparation
        in/out); ``DataStage.datasets``.
    :param checkpoints_bucket: checkpoints, one prefix per profile and execution.
    :param artifacts_bucket: model artifacts, one prefix per profile.
    :param file_system: the FSx location (``fsx`` mode; ``DataStage.file_system``). Default:
        None (``s3`` mode).
    """

    image_uri: str
    execution_role: iam.IRole
    key: kms.IKey
    subnets: Sequence[ec2.ISubnet]
    security_groups: Sequence[ec2.ISecurityGroup]
    datasets: DatasetsLocation
    checkpoints_bucket: s3.IBucket
    artifacts_bucket: s3.IBucket
    file_system: FileSystemLocation | None = None


@dataclass(frozen=True)
class PipelineRoleProps:
    """Props of :class:`PipelineRole`.

    :param environment: the environment whose jobs (``btk-<env>-*``) the role may run.
    :param execution_role: the jobs' execution role, the only role it may pass to SageMaker.
    :param key: the environment's key, on which it may create grants for job volumes.
    :param data_preparation: also run processing (tokenize) jobs. Default: False.
    :param training_plan_arn: the environment's training plan (``existing``/``reserve`` mode; a
        token is fine), the only plan its jobs may run on. Default: None (on-demand: no plan).
    """

    environment: EnvironmentConfig
    execution_role: iam.IRole
    key: kms.IKey
    data_preparation: bool = False
    training_plan_arn: str | None = None


class PipelineRole(Construct):
    """The role SageMaker Pipelines assumes to run one environment's pipelines.

    It may create, tag and stop training (and, with data preparation, processing) jobs named
    ``btk-<env>-*`` or ``pipelines-*`` that carry the ``btk:environment=<env>`` tag, describe
    jobs with those names, run jobs on the environment's own training plan (none on-demand),
    pass the execution role to SageMaker, and create grants on the key for job volumes.
    Nothing else.

    Attributes: ``role``, ``role_arn``, ``job_arns``, ``plan_arns``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: PipelineRoleProps) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        environment, data_preparation = props.environment, props.data_preparation
        prefix = environment_prefix(environment.name)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=sagemaker_principal(stack),
            description=f"SageMaker Pipelines role of {environment.name} training pipelines",
        )
        job_kinds = ["training-job", *(["processing-job"] if data_preparation else [])]
        # SageMaker Pipelines names a job from the step's TrainingJobName/ProcessingJobName when
        # the definition carries one (btk-<env>-...), else pipelines-<execution>-<step>-<suffix>.
        # Both patterns are granted, and creating, tagging and stopping additionally need the
        # btk:environment tag every job of this environment carries, so neither pattern reaches
        # another environment's or team's jobs.
        self.job_arns = [
            stack.format_arn(service="sagemaker", resource=kind, resource_name=f"{name_prefix}*")
            for kind in job_kinds
            for name_prefix in (prefix, PIPELINES_JOB_NAME_PREFIX)
        ]
        environment_tag = {f"aws:RequestTag/{TAG_ENVIRONMENT}": environment.name}
        creates = ["sagemaker:CreateTrainingJob", *(["sagemaker:CreateProcessingJob"] if data_preparation else [])]
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateJobsTaggedForThisEnvironment",
                actions=creates,
                resources=self.job_arns,
                conditions={"StringEquals": environment_tag},
            )
        )
        describes = ["sagemaker:DescribeTrainingJob",
                     *(["sagemaker:DescribeProcessingJob"] if data_preparation else [])]
        # Read-only and without a tag condition: the pipeline polls every job it started, and a
        # condition the poll did not meet would fail every execution.
        self.role.add_to_policy(iam.PolicyStatement(sid="DescribeJobs", actions=describes, resources=self.job_arns))
        stops = ["sagemaker:StopTrainingJob", *(["sagemaker:StopProcessingJob"] if data_preparation else [])]
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="StopThisEnvironmentsJobs",
                actions=stops,
                resources=self.job_arns,
                conditions={"StringEquals": {f"aws:ResourceTag/{TAG_ENVIRONMENT}": environment.name}},
            )
        )
        # "Plan user" permissions: a job started with a TrainingPlanArn uses that plan's
        # reserved capacity, and CreateTrainingJob is authorized on the plan and on its
        # reserved-capacity resource too. Only the environment's own plan: the TrainingPlanArn
        # parameter may be overridden when an execution starts, and another environment's plan
        # must be refused. The reserved capacity is named by SageMaker (reserved-capacity/<random>),
        # so it is any of this account and region; without the plan it grants nothing.
        self.plan_arns: list[str] = []
        if props.training_plan_arn is not None:
            self.plan_arns = [
                props.training_plan_arn,
                stack.format_arn(service="sagemaker", resource="reserved-capacity", resource_name="*"),
            ]
            self.role.add_to_policy(
                iam.PolicyStatement(
                    sid="UseTheEnvironmentsTrainingPlan",
                    actions=["sagemaker:CreateTrainingJob"],
                    resources=self.plan_arns,
                )
            )
            self.role.add_to_policy(
                iam.PolicyStatement(
                    sid="DescribeTheEnvironmentsTrainingPlan",
                    actions=["sagemaker:DescribeTrainingPlan"],
                    resources=self.plan_arns[:1],
                )
            )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="TagJobsAtCreation",
                actions=["sagemaker:AddTags"],
                resources=self.job_arns,
                conditions={
                    "StringEquals": {
                        "sagemaker:TaggingAction": ["CreateTrainingJob", "CreateProcessingJob"],
                        **environment_tag,
                    }
                },
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="PassExecutionRole",
                actions=["iam:PassRole"],
                resources=[props.execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="VolumeKeyGrants",
                actions=["kms:CreateGrant"],
                resources=[props.key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            )
        )
        # DescribeKey is no grant operation, so kms:GrantIsForAWSResource is never present on it:
        # under that condition it would never be allowed.
        self.role.add_to_policy(
            iam.PolicyStatement(sid="DescribeVolumeKey", actions=["kms:DescribeKey"], resources=[props.key.key_arn])
        )
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge_wildcard_resources(
            policy,
            self.job_arns,
            f"SageMaker Pipelines names each job at run time ({prefix}<profile>-<suffix>, or "
            f"{PIPELINES_JOB_NAME_PREFIX}<execution>-<step>-<suffix>); create, tag and stop also require the "
            f"{TAG_ENVIRONMENT}={environment.name} tag, describe is read-only",
        )
        acknowledge_wildcard_resources(
            policy,
            [arn for arn in self.plan_arns if "*" in arn],
            "SageMaker names a plan's reserved capacity itself (reserved-capacity/<random>); CreateTrainingJob "
            "also needs the environment's own plan, granted by its ARN, so no other plan's capacity can be used",
        )

    @property
    def role_arn(self) -> str:
        return self.role.role_arn


@dataclass(frozen=True)
class TrainingPipelineProps:
    """Props of :class:`TrainingPipeline`.

    :param environment: the environment; the profile must be one of its ``profiles``.
    :param profile: the model profile.
    :param knobs: the planner's knobs for ``profile`` on the environment's instances.
    :param resources: the shared :class:`PipelineResources`.
    :param knob_ladder: knob sets to step down to on an out-of-memory before the first
        checkpoint (``btk plan``'s). Default: none.
    :param rehearsal: the rehearsal before the long run and its gate. Default: None (none).
    :param pipeline_role: role SageMaker Pipelines assumes. Default: a new
        :class:`PipelineRole` for this pipeline alone.
    :param training_plan_arn: default of the ``TrainingPlanArn`` parameter (a token from the
        reservation construct is fine). Default: None, i.e. "" (on-demand).
    :param data_preparation: add the tokenize ``ProcessingStep`` before training, and let the
        execution role read raw data and write shards. Default: False.
    :param preparation_instance_type: instance of the tokenize job. Default: ``ml.c5.9xlarge``.
    """

    environment: EnvironmentConfig
    profile: ModelProfile
    knobs: TrainingKnobs
    resources: PipelineResources
    knob_ladder: tuple[TrainingKnobs, ...] = ()
    rehearsal: RehearsalSpec | None = None
    pipeline_role: PipelineRole | None = None
    training_plan_arn: str | None = None
    data_preparation: bool = False
    preparation_instance_type: str = DEFAULT_PREPARATION_INSTANCE


class TrainingPipeline(Construct):
    """An ``AWS::SageMaker::Pipeline`` that trains one profile with the planner's knobs.

    Attributes: ``pipeline`` (the ``CfnPipeline``), ``pipeline_name`` (``btk-<env>-<profile>``
    with ``.`` as ``-``), ``job_name_prefix``, ``definition`` (the JSON with tokens),
    ``pipeline_role``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingPipelineProps) -> None:
        super().__init__(scope, construct_id)
        self._validate_props(props)
        env, profile, resources = props.environment, props.profile, props.resources
        self.environment = env
        self.profile = profile
        self.pipeline_name = pipeline_name(env.name, profile.name)
        self.job_name_prefix = job_name_prefix(env.name, profile.name)
        self.pipeline_role = props.pipeline_role or PipelineRole(
            self,
            "PipelineRole",
            props=PipelineRoleProps(
                environment=env,
                execution_role=resources.execution_role,
                key=resources.key,
                data_preparation=props.data_preparation,
                training_plan_arn=props.training_plan_arn,
            ),
        )
        #: The definition JSON; CDK token strings inside resolve to ``Fn::Join`` parts at synth.
        self.definition = self._definition(props)
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
            resources.datasets.grant_prepare(resources.execution_role)

    def _validate_props(self, props: TrainingPipelineProps) -> None:
        env = props.environment
        if env.data_stage.mode == "fsx" and props.resources.file_system is None:
            raise ValueError(
                f"{self.node.path}: environment {env.name!r} uses data_stage.mode=fsx: "
                "pass PipelineResources.file_system (the data stage's FSx id, mount name, directory)"
            )

    def _definition(self, props: TrainingPipelineProps) -> str:
        """Build the definition with tokens hidden from the SDK, then put them back."""
        env, resources = props.environment, props.resources
        tokens = _TokenPlaceholders()
        region = env.region
        train_data: FileSystemLocation | S3TrainingData
        if env.data_stage.mode == "fsx":
            location = resources.file_system
            assert location is not None  # _validate_props
            train_data = FileSystemLocation(
                file_system_id=tokens.hide(location.file_system_id, "fs-{}"),
                mount_name=tokens.hide(location.mount_name),
                directory=location.directory,
            )
        else:
            train_data = S3TrainingData(tokens.hide(resources.datasets.shards_s3_url, "s3://{}"))
        preparation = None
        if props.data_preparation:
            preparation = DataPreparation(
                raw_s3_uri=tokens.hide(resources.datasets.raw_s3_url, "s3://{}"),
                output_s3_uri=tokens.hide(resources.datasets.shards_s3_url, "s3://{}"),
                instance_type=props.preparation_instance_type,
            )
        spec = PipelineSpec(
            environment=env,
            profile=props.profile,
            knobs=props.knobs,
            knob_ladder=props.knob_ladder,
            rehearsal=props.rehearsal,
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
        return tokens.restore(build_pipeline_definition(spec))

    @property
    def pipeline_arn(self) -> str:
        """ARN of the pipeline."""
        return Stack.of(self).format_arn(service="sagemaker", resource="pipeline", resource_name=self.pipeline_name)


@dataclass(frozen=True)
class TrainingPipelinesProps:
    """Props of :class:`TrainingPipelines`.

    :param environment: the environment; every name in its ``profiles`` gets a pipeline.
    :param profiles: one :class:`PlannedProfile` per name in ``environment.profiles`` (the
        stack plans them: what ``btk plan`` reports for the environment's instance type and count).
    :param resources: the shared :class:`PipelineResources`.
    :param training_plan_arn: default ``TrainingPlanArn`` of every pipeline. Default: None ("").
    :param data_preparation: add the tokenize step to every pipeline. Default: False.
    """

    environment: EnvironmentConfig
    profiles: Sequence[PlannedProfile]
    resources: PipelineResources
    training_plan_arn: str | None = None
    data_preparation: bool = False


class TrainingPipelines(Construct):
    """One :class:`TrainingPipeline` per profile of the environment, sharing one pipeline role.

    Attributes: ``pipelines`` (by profile name, in the environment's order), ``pipeline_role``,
    ``job_name_prefix`` (``btk-<env>-``, shared by every job of the environment).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingPipelinesProps) -> None:
        super().__init__(scope, construct_id)
        self._validate_props(props)
        env, resources = props.environment, props.resources
        planned = {item.profile.name: item for item in props.profiles}
        self.job_name_prefix = environment_prefix(env.name)
        self.pipeline_role = PipelineRole(
            self,
            "PipelineRole",
            props=PipelineRoleProps(
                environment=env,
                execution_role=resources.execution_role,
                key=resources.key,
                data_preparation=props.data_preparation,
                training_plan_arn=props.training_plan_arn,
            ),
        )
        self.pipelines: dict[str, TrainingPipeline] = {}
        for name in env.profiles:
            self.pipelines[name] = TrainingPipeline(
                self,
                _construct_id(name),
                props=TrainingPipelineProps(
                    environment=env,
                    profile=planned[name].profile,
                    knobs=planned[name].knobs,
                    knob_ladder=planned[name].knob_ladder,
                    rehearsal=_rehearsal(env, planned[name], self.node.path),
                    resources=resources,
                    pipeline_role=self.pipeline_role,
                    training_plan_arn=props.training_plan_arn,
                    data_preparation=props.data_preparation,
                ),
            )

    def _validate_props(self, props: TrainingPipelinesProps) -> None:
        """``profiles`` must plan exactly the environment's profiles."""
        env = props.environment
        names = [item.profile.name for item in props.profiles]
        missing = [name for name in env.profiles if name not in names]
        if missing:
            raise ValueError(
                f"{self.node.path}: profiles: no knobs for profile(s) {', '.join(missing)}: plan them first"
            )
        extra = [name for name in names if name not in env.profiles]
        if extra:
            raise ValueError(
                f"{self.node.path}: profiles: {', '.join(extra)} not in environment {env.name!r}: add to its profiles"
            )

    @property
    def pipeline_names(self) -> list[str]:
        return [pipeline.pipeline_name for pipeline in self.pipelines.values()]


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


def _rehearsal(env: EnvironmentConfig, planned: PlannedProfile, path: str) -> RehearsalSpec | None:
    """The rehearsal of ``planned`` where the environment rehearses (``EnvironmentConfig.rehearses``)."""
    if not env.rehearses:
        return None
    predicted = planned.rehearsal_tokens_per_second_per_gpu
    if predicted is None:
        raise ValueError(f"{path}: profiles: {planned.profile.name} has no rehearsal_tokens_per_second_per_gpu, "
                         f"which environment {env.name}'s rehearsal gate needs: plan it with "
                         "stacks.training_stack.planned_profiles")
    rehearsal = env.rehearsal
    return RehearsalSpec(nodes=planned.rehearsal_nodes, steps=rehearsal.steps,
                         min_tokens_per_second_per_gpu=rehearsal_threshold(predicted, rehearsal.min_throughput_share),
                         max_runtime_seconds=rehearsal.max_runtime_minutes * 60,
                         max_peak_memory_gib=rehearsal_memory_limit_gib(get_instance_type(env.instance_type)),
                         require_falling_loss=rehearsal.require_falling_loss)
