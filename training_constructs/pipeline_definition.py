"""The SageMaker pipeline definition of one model profile, built with the SageMaker Python SDK v3.

:func:`build_pipeline_definition` is pure: plain values (or CDK token strings, which it
copies through untouched) in, the definition JSON string out. It never calls AWS: the SDK
builds definitions offline when the region is known, ``SAGEMAKER_VALIDATE_ROLE=false``, the
role is an ARN string, every S3 location is explicit and nothing is uploaded (no
``source_code``: the image's own entrypoint launches torchrun). Telemetry is switched off
through the session's SDK config, so the SDK sends nothing either.

The pipeline::

    [Tokenize] (ProcessingStep, only with data preparation)
        -> CheckTrainingPlan (ConditionStep: TrainingPlanArn == "")
              if  -> Train        (TrainingStep, on-demand or managed spot)
              else-> TrainOnPlan  (TrainingStep, ResourceConfig.TrainingPlanArn = the parameter)

Two training steps, because ``CreateTrainingJob`` rejects an empty ``TrainingPlanArn``
(min length 50): "empty means on-demand" can only be said by leaving the field out.

In an environment that rehearses (:class:`RehearsalSpec`), each branch runs ``Rehearse`` (a short
job) first, then ``RehearsalPassed`` (ConditionStep on the rehearsal's final metrics): the long
run where it passed, ``RehearsalFailed`` (FailStep) where not. The long run starts on the
knob-ladder rung the rehearsal held: its ``job.start_rung`` hyperparameter is the rehearsal's
``train:knob_rung`` metric (``Std:Join`` of the float, read back as a whole number).

Pipeline parameters: ``InstanceCount`` (Integer), ``TrainingPlanArn`` (String, "" =
on-demand), ``MaxRuntimeSeconds`` (Integer), ``TotalTokens`` (String, the
``train.total_tokens`` hyperparameter; "" = the trainer derives it from ``job.max_steps``),
``MaxPendingSeconds`` (Integer, ``StoppingCondition.MaxPendingTimeInSeconds`` of the plan branch:
how long a job may wait for its plan's capacity), and ``MaxWaitSeconds`` (Integer) in
managed-spot environments; ``StartRung`` (String, default "0": the knob-ladder rung the long run
starts on, ``job.start_rung``) where the profile has a knob ladder and the environment does not
rehearse every execution.

Where the SDK cannot say a field, the compiled definition is post-processed, and only there
(:func:`_fill_sdk_gaps`; tested):

* ``StoppingCondition`` takes plain integers in the SDK, so ``MaxRuntimeInSeconds`` (and
  ``MaxWaitTimeInSeconds``) are replaced by ``{"Get": "Parameters.…"}``. Pipeline expressions
  have no arithmetic (only ``Std:Join`` and ``Std:JsonGet``), hence a run-time limit in
  seconds rather than hours.
* ``ModelTrainer`` drops ``TrainingJobName`` under a ``PipelineSession``; it is put back as
  ``btk-<env>-<profile>`` and, with ``PipelineDefinitionConfig(use_custom_job_prefix=True)``,
  SageMaker Pipelines uses it as the job-name prefix. Dashboards, alarms and the report tool
  find a profile's jobs by that prefix.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from btk.environment import EnvironmentConfig
from btk.errors import BtkError, UnknownNameError
from btk.hardware import get_instance_type
from btk.hyperparameters import JobHyperparameters, JobSettings, KnobLadder, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.metrics import METRIC_DEFINITIONS, METRICS_BY_KEY
from btk.naming import (
    JOB_NAME_PREFIX_MAX,
    PURPOSE_REHEARSAL,
    TAG_ENVIRONMENT,
    TAG_INSTANCE_TYPE,
    TAG_PROFILE,
    TAG_PURPOSE,
    job_name_prefix,
    pipeline_name,
)
from btk.profile import ModelProfile
from btk.training_environment import TRAINING_PROCESS_ENVIRONMENT
from training_constructs.definition_cache import cached_definition
from training_constructs.definition_worker import build_with_worker, serve
from training_constructs.locations import FileSystemLocation

PARAM_INSTANCE_COUNT = "InstanceCount"
PARAM_TRAINING_PLAN_ARN = "TrainingPlanArn"
PARAM_MAX_RUNTIME_SECONDS = "MaxRuntimeSeconds"
PARAM_MAX_WAIT_SECONDS = "MaxWaitSeconds"
PARAM_TOTAL_TOKENS = "TotalTokens"
PARAM_MAX_PENDING_SECONDS = "MaxPendingSeconds"
PARAM_START_RUNG = "StartRung"
#: SageMaker's bounds of ``StoppingCondition.MaxPendingTimeInSeconds`` (botocore's service model).
MAX_PENDING_BOUNDS = (1800, 2_419_200)

STEP_TOKENIZE = "Tokenize"
STEP_CHECK_PLAN = "CheckTrainingPlan"
STEP_TRAIN = "Train"
STEP_TRAIN_ON_PLAN = "TrainOnPlan"
STEP_REHEARSE = "Rehearse"
STEP_REHEARSAL_GATE = "RehearsalPassed"
STEP_REHEARSAL_FAILED = "RehearsalFailed"
ON_PLAN_SUFFIX = "OnPlan"
REHEARSAL_CHECKPOINT_INTERVAL = 1_000_000  # a rehearsal writes no checkpoint: it must not be resumed from

TRAIN_CHANNEL = "train"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
PROCESSING_INPUT = "/opt/ml/processing/input"
PROCESSING_OUTPUT = "/opt/ml/processing/output"
#: The tokenize tool of the training image (``containers/pyproject.toml``: ``btk-tokenize``).
TOKENIZE_COMMAND = ("btk-tokenize",)

#: NCCL / PyTorch settings of every training container (:mod:`btk.training_environment`, shared with the GPU
#: benchmark); the instance type's network settings (libfabric/EFA) come from the hardware catalog
#: (:func:`job_environment`).
NCCL_ENVIRONMENT: dict[str, str] = TRAINING_PROCESS_ENVIRONMENT


def max_pending_seconds(environment: EnvironmentConfig) -> int:
    """Default of ``MaxPendingSeconds``: a job may wait for its plan's capacity as long as it may run
    (``max_runtime_seconds``), within SageMaker's bounds (:data:`MAX_PENDING_BOUNDS`)."""
    low, high = MAX_PENDING_BOUNDS
    return max(low, min(high, environment.max_runtime_seconds))


def job_environment(instance_type: str) -> dict[str, str]:
    """The training job's environment: :data:`NCCL_ENVIRONMENT` plus the catalog's network
    settings for ``instance_type`` (none for a type outside the catalog)."""
    from btk.hardware import INSTANCE_TYPES

    instance = INSTANCE_TYPES.get(instance_type)
    return {**NCCL_ENVIRONMENT, **(instance.network_environment if instance is not None else {})}


_TOKEN = "${Token["

#: Job failures the pipeline retries. Not ``SageMaker.RESOURCE_LIMIT``: an account quota does not
#: rise by waiting, so a retry would only cost time.
RETRIED_JOB_FAILURES = ("SageMaker.CAPACITY_ERROR", "SageMaker.JOB_INTERNAL_ERROR")
#: Step failures the pipeline retries: CreateTrainingJob throttled or failing inside the service.
RETRIED_STEP_FAILURES = ("Step.SERVICE_FAULT", "Step.THROTTLING")



@dataclass(frozen=True)
class S3TrainingData:
    """The ``train`` channel streamed from S3 with FastFile (``s3`` mode)."""

    s3_uri: str


@dataclass(frozen=True)
class DataPreparation:
    """The optional tokenize step: raw text in S3 -> shards where the ``train`` channel reads.

    :param raw_s3_uri: raw documents and ``tokenizer.json``.
    :param output_s3_uri: where the shards go (the datasets prefix FSx mirrors, or the S3
        channel's prefix).
    :param instance_type: CPU instance of the processing job. Default: ``ml.c5.9xlarge``.
    :param volume_size_gb: EBS volume of the processing job. Default: 200.
    """

    raw_s3_uri: str
    output_s3_uri: str
    instance_type: str = "ml.c5.9xlarge"
    volume_size_gb: int = 200


@dataclass(frozen=True)
class RehearsalSpec:
    """The rehearsal before the long run, and the gate it must pass (``EnvironmentConfig.rehearsal``).

    :param nodes: instances of the rehearsal job (:func:`btk.planner.search.rehearsal_nodes`).
    :param steps: its optimizer steps.
    :param min_tokens_per_second_per_gpu: the last metric line's tokens/s per GPU must reach this.
    :param max_runtime_seconds: its time limit.
    :param max_peak_memory_gib: the last metric line's peak allocated memory per GPU must stay within this
        (:func:`btk.planner.search.memory_budget_gib` of the instance type).
    :param require_falling_loss: the end-of-run ``loss_drop`` must be above 0. Default: True.
    """

    nodes: int
    steps: int
    min_tokens_per_second_per_gpu: float
    max_runtime_seconds: int
    max_peak_memory_gib: float
    require_falling_loss: bool = True


@dataclass(frozen=True)
class PipelineSpec:
    """Everything one profile's pipeline is built from (strings may be CDK tokens).

    :param environment: the environment (instance type and count, spot, encryption, limits).
    :param profile: the model profile.
    :param knobs: the planner's knobs for this profile on ``environment``'s instances.
    :param image_uri: the training image.
    :param knob_ladder: knob sets the job steps down to on an out-of-memory before its first
        checkpoint. Default: none.
    :param rehearsal: rehearse before the long run, which starts only if the rehearsal passes.
        Default: None (no rehearsal).
    :param role_arn: the execution role of the jobs.
    :param kms_key_arn: the key for job output (and volumes where the instance has EBS).
    :param subnet_ids: the training subnet(s) (the environment's AZ).
    :param security_group_ids: the EFA/Lustre security group(s).
    :param train_data: a :class:`FileSystemLocation` (``fsx`` mode) or :class:`S3TrainingData`.
    :param checkpoint_s3_uri: checkpoint root; each execution gets its own prefix below it.
    :param output_s3_uri: model artifacts root.
    :param training_plan_arn: default of ``TrainingPlanArn``. Default: "" (on-demand).
    :param data_preparation: add the tokenize step. Default: None (no step).
    :param volume_size_gb: EBS volume per instance, where the instance type has EBS. Default: 500.
    """

    environment: EnvironmentConfig
    profile: ModelProfile
    knobs: TrainingKnobs
    image_uri: str
    role_arn: str
    kms_key_arn: str
    subnet_ids: Sequence[str]
    security_group_ids: Sequence[str]
    train_data: FileSystemLocation | S3TrainingData
    checkpoint_s3_uri: str
    output_s3_uri: str
    training_plan_arn: str = ""
    data_preparation: DataPreparation | None = None
    volume_size_gb: int = 500
    extra_tags: dict[str, str] = field(default_factory=dict)
    knob_ladder: tuple[TrainingKnobs, ...] = ()
    rehearsal: RehearsalSpec | None = None


def training_hyperparameters(
    profile: ModelProfile, knobs: TrainingKnobs, planned_data_parallel: int | None = None,
    knob_ladder: Sequence[TrainingKnobs] = (),
) -> dict[str, str]:
    """The job's hyperparameters: knobs, architecture, schedule and job settings (the core's codec).

    ``planned_data_parallel`` (the environment's GPUs / tensor_parallel) lets the trainer keep
    the planned global batch when the ``InstanceCount`` parameter runs the job on another
    node count; ``knob_ladder``: where the job steps down to on an out-of-memory before its
    first checkpoint.
    """
    spec = JobHyperparameters(
        knobs=knobs,
        architecture=profile.architecture,
        training=profile.training,
        job=JobSettings(profile=profile.name, planned_data_parallel=planned_data_parallel,
                        knob_ladder=KnobLadder(rungs=tuple(knob_ladder)) if knob_ladder else None),
    )
    return to_hyperparameters(spec)


def planned_data_parallel(environment: EnvironmentConfig, knobs: TrainingKnobs) -> int | None:
    """Data-parallel ranks the knobs were planned for; ``None`` for an instance outside the catalog
    (nothing was planned for it, so the trainer takes the knobs' accumulation as given)."""
    try:
        gpus = get_instance_type(environment.instance_type).gpus_per_node
    except UnknownNameError:
        return None
    return gpus * environment.instance_count // knobs.tensor_parallel


def job_tags(spec: PipelineSpec, *, rehearsal: bool = False) -> dict[str, str]:
    """Tags of every job: the environment's tags plus environment, profile and instance type; a rehearsal's also
    say so (``btk report`` tells it from the long runs)."""
    tags = dict(spec.environment.tags)
    tags.update(spec.extra_tags)
    tags[TAG_ENVIRONMENT] = spec.environment.name
    tags[TAG_PROFILE] = spec.profile.name
    tags[TAG_INSTANCE_TYPE] = spec.environment.instance_type
    if rehearsal:
        tags[TAG_PURPOSE] = PURPOSE_REHEARSAL
    return dict(sorted(tags.items()))


def validate_spec(spec: PipelineSpec) -> None:
    """One-line :class:`BtkError` naming the first bad field and the fix."""
    env = spec.environment
    if spec.profile.name not in env.profiles:
        raise BtkError(f"profile {spec.profile.name!r} is not in environment {env.name!r}: add it to profiles")
    for name in ("image_uri", "role_arn", "kms_key_arn", "checkpoint_s3_uri", "output_s3_uri"):
        if not getattr(spec, name):
            raise BtkError(f"pipeline {name} is empty: pass the value from the stack")
    if not _is_token(spec.role_arn) and not spec.role_arn.startswith("arn:"):
        raise BtkError(f"role_arn {spec.role_arn!r} must be an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
    for name in ("checkpoint_s3_uri", "output_s3_uri"):
        value = getattr(spec, name)
        if not _is_token(value) and not value.startswith("s3://"):
            raise BtkError(f"{name} {value!r} must be an s3:// URI")
    if not spec.subnet_ids or not spec.security_group_ids:
        raise BtkError("pipeline needs subnet_ids and security_group_ids: pass the training subnet and EFA group")
    if isinstance(spec.train_data, S3TrainingData) and env.data_stage.mode != "s3":
        raise BtkError(f"environment {env.name!r} uses data_stage.mode=fsx: pass FileSystemLocation")
    if isinstance(spec.train_data, FileSystemLocation) and env.data_stage.mode != "fsx":
        raise BtkError(f"environment {env.name!r} uses data_stage.mode=s3: pass S3TrainingData")
    plan = spec.training_plan_arn
    if plan and not _is_token(plan) and ":training-plan/" not in plan:
        raise BtkError(f"training_plan_arn {plan!r} is not a training plan ARN: use \"\" for on-demand")


def build_pipeline_definition(spec: PipelineSpec) -> str:
    """The pipeline definition JSON (canonical: sorted keys, compact) for ``spec``.

    Built by the SDK (in the definition worker when ``app.py`` started one:
    :mod:`training_constructs.definition_worker`), or read from the definition cache where it
    is on and an equal spec was built by the same code and SDK before
    (:mod:`training_constructs.definition_cache`).
    """
    validate_spec(spec)
    return cached_definition(spec, lambda uncached: build_with_worker(uncached, build_with_sdk))


#: The SDK modules the builder uses. Importing them takes about two seconds (the SDK's packages
#: import most of the SDK, pandas and docker included): the definition worker imports them
#: while the app is being built.
SDK_MODULES = (
    "sagemaker.core.common_utils",
    "sagemaker.core.config.config_manager",
    "sagemaker.core.network",
    "sagemaker.core.processing",
    "sagemaker.core.shapes",
    "sagemaker.core.training.configs",
    "sagemaker.core.workflow.conditions",
    "sagemaker.core.workflow.execution_variables",
    "sagemaker.core.workflow.functions",
    "sagemaker.core.workflow.parameters",
    "sagemaker.core.workflow.pipeline_context",
    "sagemaker.core.workflow.pipeline_definition_config",
    "sagemaker.mlops.workflow",
    "sagemaker.mlops.workflow.fail_step",
    "sagemaker.mlops.workflow.retry",
    "sagemaker.train",
)


def serve_definitions() -> None:
    """The definition worker's entry point (``definition_worker.ENTRY``): serve this module's builds."""
    serve(sys.modules[__name__])  # a module satisfies the Builder protocol


def prepare_offline_session(region: str) -> None:
    """Create the offline SDK session of ``region`` that :func:`build_with_sdk` will use."""
    offline_sdk_environment(region)
    with _sdk_config_validated_once():  # as when a build creates it: the session validates the config once
        _offline_session(region)


def build_with_sdk(spec: PipelineSpec) -> str:
    """Build the definition with the SDK in this process (no cache, no worker)."""
    offline_sdk_environment(spec.environment.region)
    with _sdk_config_validated_once():
        builder = _Builder(spec)
        return builder.definition()


# -- implementation -------------------------------------------------------------------------


def _is_token(value: str) -> bool:
    return _TOKEN in value


def offline_sdk_environment(region: str | None) -> None:
    """What the SDK needs to build offline; set only where the caller has not set it.

    ``region`` None (the definition worker, before it knows a spec) sets everything but the region.
    """
    if region is not None:
        os.environ.setdefault("AWS_DEFAULT_REGION", region)
        os.environ.setdefault("AWS_REGION", region)
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    # Some SDK modules create boto3 clients at import time; without this, botocore's credential
    # chain asks the EC2 instance-metadata endpoint (a network call, seconds of timeouts).
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    # The SDK logs every step at INFO ("Not applying SDK defaults", ...): keep synth quiet.
    for name in ("sagemaker", "sagemaker.config"):
        logging.getLogger(name).setLevel(logging.WARNING)


#: Placeholder for the offline session's credentials (never valid, never used to sign a sent request).
_OFFLINE_CREDENTIAL = "btk-offline-synth"

#: SDK defaults config with telemetry off: the SDK must not call out during synth.
_SDK_CONFIG: dict[str, Any] = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}


@functools.cache
def _offline_session(region: str) -> Any:
    """The offline ``PipelineSession`` of ``region``, one per process.

    Creating one builds five boto clients and an S3 resource (about 0.3 s); the pipelines
    are built one after another and each job function resets the session's only per-step
    state (``context``), so every pipeline of a region can share it.
    """
    import warnings

    import boto3
    from sagemaker.core.workflow.pipeline_context import PipelineSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PipelineSession(
            # Inert placeholder credentials: creating the SDK's clients must not walk the
            # credential chain (instance metadata, SSO, ...), and no request is ever sent.
            boto_session=boto3.Session(
                region_name=region,
                aws_access_key_id=_OFFLINE_CREDENTIAL,
                aws_secret_access_key=_OFFLINE_CREDENTIAL,
            ),
            # Never used (every location is explicit); set so nothing asks STS for it.
            default_bucket="btk-unused-default-bucket",
            # Validated against the SDK's schema here, once (see _sdk_config_validated_once).
            sagemaker_config=_SDK_CONFIG,
        )


@contextmanager
def _sdk_config_validated_once() -> Iterator[None]:
    """Skip the SDK's re-validation of :data:`_SDK_CONFIG` on each of its config lookups.

    The SDK checks its defaults config against its JSON schema (meta-schema included) on
    every lookup, about 16 per pipeline and 0.1 s each, although the config never changes:
    the session validated this very dict when it was created. Any other config is still
    validated; the SDK's own validator is back in place on exit.
    """
    from sagemaker.core.config.config_manager import SageMakerConfig

    original = SageMakerConfig.__dict__["validate_sagemaker_config"]

    def validate(sagemaker_config: dict[str, Any] | None = None) -> None:
        if sagemaker_config is not _SDK_CONFIG:
            original.__func__(sagemaker_config)

    SageMakerConfig.validate_sagemaker_config = staticmethod(validate)
    try:
        yield
    finally:
        SageMakerConfig.validate_sagemaker_config = original


class _Builder:
    """Builds the SDK objects of one pipeline and compiles them."""

    def __init__(self, spec: PipelineSpec) -> None:
        from sagemaker.core.workflow.parameters import ParameterInteger, ParameterString

        self.spec = spec
        env = spec.environment
        self.pipeline_name = pipeline_name(env.name, spec.profile.name)
        self.job_prefix = job_name_prefix(env.name, spec.profile.name)
        self.session = _offline_session(env.region)
        self.instance_count = ParameterInteger(name=PARAM_INSTANCE_COUNT, default_value=env.instance_count)
        self.training_plan_arn = ParameterString(name=PARAM_TRAINING_PLAN_ARN, default_value=spec.training_plan_arn)
        self.max_runtime = ParameterInteger(name=PARAM_MAX_RUNTIME_SECONDS, default_value=env.max_runtime_seconds)
        self.max_wait = ParameterInteger(name=PARAM_MAX_WAIT_SECONDS, default_value=env.max_wait_seconds)
        self.max_pending = ParameterInteger(name=PARAM_MAX_PENDING_SECONDS, default_value=max_pending_seconds(env))
        hyperparameters = training_hyperparameters(
            spec.profile, spec.knobs, planned_data_parallel=planned_data_parallel(env, spec.knobs),
            knob_ladder=spec.knob_ladder,
        )
        self.total_tokens = ParameterString(
            name=PARAM_TOTAL_TOKENS, default_value=hyperparameters["train.total_tokens"]
        )
        self.hyperparameters: dict[str, Any] = dict(hyperparameters)
        self.hyperparameters["train.total_tokens"] = self.total_tokens
        # Without a rehearsal step, the rung to start on is the caller's (the one `btk rehearse` saw held); with
        # one, the rehearsal's metric (_branch).
        self.start_rung = (ParameterString(name=PARAM_START_RUNG, default_value="0")
                           if spec.knob_ladder and spec.rehearsal is None else None)
        if self.start_rung is not None:
            self.hyperparameters["job.start_rung"] = self.start_rung

    @property
    def parameters(self) -> list[Any]:
        params = [self.instance_count, self.training_plan_arn, self.max_runtime, self.total_tokens, self.max_pending]
        if self.spec.environment.managed_spot:
            params.append(self.max_wait)
        if self.start_rung is not None:
            params.append(self.start_rung)
        return params

    def definition(self) -> str:
        import warnings

        from sagemaker.core.workflow.conditions import ConditionEquals
        from sagemaker.core.workflow.pipeline_definition_config import PipelineDefinitionConfig
        from sagemaker.mlops.workflow import ConditionStep, Pipeline

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps: list[Any] = []
            depends_on: list[Any] = []
            if self.spec.data_preparation is not None:
                tokenize = self._tokenize_step(self.spec.data_preparation)
                steps.append(tokenize)
                depends_on.append(tokenize)
            check = ConditionStep(
                name=STEP_CHECK_PLAN,
                conditions=[ConditionEquals(left=self.training_plan_arn, right="")],
                if_steps=self._branch(on_plan=False),
                else_steps=self._branch(on_plan=True),
                depends_on=depends_on or None,
            )
            steps.append(check)
            pipeline = Pipeline(
                name=self.pipeline_name,
                parameters=self.parameters,
                steps=steps,
                sagemaker_session=self.session,
                pipeline_experiment_config=None,
                pipeline_definition_config=PipelineDefinitionConfig(use_custom_job_prefix=True),
            )
            compiled = json.loads(pipeline.definition())
        _fill_sdk_gaps(compiled, self.spec, self.job_prefix)
        return json.dumps(compiled, sort_keys=True, separators=(",", ":"))

    # -- steps ----------------------------------------------------------------------------

    def _branch(self, *, on_plan: bool) -> list[Any]:
        """The steps on demand or on a plan: the long run, after the rehearsal and its gate when there is one."""
        from sagemaker.core.workflow.conditions import (
            ConditionEquals,
            ConditionGreaterThan,
            ConditionGreaterThanOrEqualTo,
            ConditionLessThanOrEqualTo,
        )
        from sagemaker.core.workflow.functions import Join
        from sagemaker.mlops.workflow import ConditionStep
        from sagemaker.mlops.workflow.fail_step import FailStep

        suffix = ON_PLAN_SUFFIX if on_plan else ""
        rehearsal = self.spec.rehearsal
        if rehearsal is None:
            return [self._training_step(STEP_TRAIN + suffix, on_plan=on_plan)]
        rehearse = self._training_step(STEP_REHEARSE + suffix, on_plan=on_plan, rehearsal=rehearsal)
        final = rehearse.properties.FinalMetricDataList
        # The long run starts on the knob-ladder rung the rehearsal held (its train:knob_rung metric, which a job
        # with a ladder always reports): a plan that ran out of memory in the rehearsal does not again.
        start_rung = ({"job.start_rung": Join(on="", values=[final[METRICS_BY_KEY["knob_rung"].sagemaker_name].Value])}
                      if self.spec.knob_ladder else {})
        train = self._training_step(STEP_TRAIN + suffix, on_plan=on_plan, extra_hyperparameters=start_rung)
        throughput, nonfinite, memory, loss_drop = (
            METRICS_BY_KEY[key].sagemaker_name
            for key in ("tokens_per_second_per_gpu", "nonfinite_steps", "peak_memory_gib", "loss_drop"))
        conditions = [
            ConditionGreaterThanOrEqualTo(left=final[throughput].Value, right=rehearsal.min_tokens_per_second_per_gpu),
            ConditionEquals(left=final[nonfinite].Value, right=0.0),
            ConditionLessThanOrEqualTo(left=final[memory].Value, right=rehearsal.max_peak_memory_gib),
        ]
        musts = [f"its last {throughput} must reach {rehearsal.min_tokens_per_second_per_gpu:,.1f}",
                 f"{nonfinite} be 0", f"{memory} stay within {rehearsal.max_peak_memory_gib:,.2f}"]
        if rehearsal.require_falling_loss:
            conditions.append(ConditionGreaterThan(left=final[loss_drop].Value, right=0.0))
            musts.append(f"{loss_drop} be above 0")
        gate = ConditionStep(
            name=STEP_REHEARSAL_GATE + suffix,
            conditions=conditions,
            if_steps=[train],
            else_steps=[FailStep(name=STEP_REHEARSAL_FAILED + suffix, error_message=(
                f"the rehearsal did not pass: {', '.join(musts[:-1])} and {musts[-1]}; read the {STEP_REHEARSE}"
                f"{suffix} job's metrics and log, then re-plan (btk plan) or change the environment's rehearsal"))],
        )
        return [rehearse, gate]

    def _training_step(self, name: str, *, on_plan: bool, rehearsal: RehearsalSpec | None = None,
                       extra_hyperparameters: dict[str, Any] | None = None) -> Any:
        from sagemaker.core.common_utils import instance_supports_kms
        from sagemaker.core.shapes import (
            Channel,
            DataSource,
            FileSystemDataSource,
            MetricDefinition,
            S3DataSource,
            Tag,
        )
        from sagemaker.core.training.configs import (
            CheckpointConfig,
            Compute,
            Networking,
            OutputDataConfig,
            StoppingCondition,
        )
        from sagemaker.core.workflow.execution_variables import ExecutionVariables
        from sagemaker.core.workflow.functions import Join
        from sagemaker.mlops.workflow import TrainingStep
        from sagemaker.train import ModelTrainer

        spec, env = self.spec, self.spec.environment
        spot = env.managed_spot and not on_plan and rehearsal is None  # a rehearsal is short: no spot wait
        compute: dict[str, Any] = {
            "instance_type": env.instance_type,
            "instance_count": self.instance_count if rehearsal is None else rehearsal.nodes,
            "enable_managed_spot_training": spot,
        }
        if instance_supports_kms(env.instance_type):
            # Instances with local NVMe (P5, P6-B200, ...) get no EBS volume: SageMaker rejects a
            # VolumeKmsKeyId there (the NVMe is encrypted by the hardware) and ignores the size, so
            # the definition carries only the SDK's default VolumeSizeInGB (30) for them.
            compute["volume_size_in_gb"] = spec.volume_size_gb
            compute["volume_kms_key_id"] = spec.kms_key_arn
        if on_plan:
            compute["training_plan_arn"] = self.training_plan_arn

        if isinstance(spec.train_data, FileSystemLocation):
            source = DataSource(
                file_system_data_source=FileSystemDataSource(
                    file_system_id=spec.train_data.file_system_id,
                    # Read-write only so that the trainer can leave the dataset's verification record
                    # beside the shards (btk.shards.dataset_record_path): the next execution on the same
                    # dataset version then hashes nothing. The trainer opens shards read-only.
                    file_system_access_mode="rw",
                    file_system_type="FSxLustre",
                    directory_path=spec.train_data.directory_path,
                )
            )
            input_mode = "File"
        else:
            source = DataSource(
                s3_data_source=S3DataSource(
                    s3_data_type="S3Prefix",
                    s3_uri=spec.train_data.s3_uri,
                    s3_data_distribution_type="FullyReplicated",
                )
            )
            input_mode = "FastFile"
        channel = Channel(channel_name=TRAIN_CHANNEL, data_source=source, input_mode=input_mode)

        stopping = {"max_runtime_in_seconds": env.max_runtime_seconds if rehearsal is None
                    else rehearsal.max_runtime_seconds}
        if spot:
            stopping["max_wait_time_in_seconds"] = self.max_wait.default_value
        checkpoint_uri = Join(
            on="/",
            values=[spec.checkpoint_s3_uri.rstrip("/"), spec.profile.name, ExecutionVariables.PIPELINE_EXECUTION_ID],
        )
        own = self.hyperparameters if rehearsal is None else self._rehearsal_hyperparameters(rehearsal)
        hyperparameters = {**own, **(extra_hyperparameters or {})}
        trainer = ModelTrainer(
            sagemaker_session=self.session,
            role=spec.role_arn,
            base_job_name=self.job_prefix,
            training_image=spec.image_uri,
            training_input_mode=input_mode,
            compute=Compute(**compute),
            networking=Networking(
                subnets=list(spec.subnet_ids),
                security_group_ids=list(spec.security_group_ids),
                enable_inter_container_traffic_encryption=env.inter_container_encryption,
            ),
            stopping_condition=StoppingCondition(**stopping),
            output_data_config=OutputDataConfig(
                s3_output_path=f"{spec.output_s3_uri.rstrip('/')}/{spec.profile.name}",
                kms_key_id=spec.kms_key_arn,
                compression_type="NONE",
            ),
            # A rehearsal keeps no checkpoint: the long run must never resume from it.
            checkpoint_config=(CheckpointConfig(s3_uri=checkpoint_uri, local_path=CHECKPOINT_LOCAL_PATH)
                               if rehearsal is None else None),
            environment=job_environment(env.instance_type),
            hyperparameters=hyperparameters,
            tags=[Tag(key=key, value=value) for key, value in job_tags(spec, rehearsal=rehearsal is not None).items()],
        ).with_metric_definitions(
            [MetricDefinition(name=item["Name"], regex=item["Regex"]) for item in METRIC_DEFINITIONS]
        )
        return TrainingStep(
            name=name, step_args=trainer.train(input_data_config=[channel]), retry_policies=self._retry_policies()
        )

    def _rehearsal_hyperparameters(self, rehearsal: RehearsalSpec) -> dict[str, Any]:
        """The long run's, for ``rehearsal.steps`` steps, no checkpoint, and the knobs as planned for the rehearsal's
        node count (no rescaled accumulation: the gate's prediction is for these knobs)."""
        hyperparameters = dict(self.hyperparameters)
        hyperparameters["job.max_steps"] = str(rehearsal.steps)
        hyperparameters["job.checkpoint_interval_steps"] = str(REHEARSAL_CHECKPOINT_INTERVAL)
        hyperparameters["job.planned_data_parallel"] = ""
        return hyperparameters

    def _retry_policies(self) -> list[Any] | None:
        """Retry a job that failed for want of capacity or inside SageMaker (the environment's ``job_retries``).

        The retried job is a new job of the same execution, so it resumes from the execution's
        checkpoint prefix. ``None`` when the environment asks for no retries.
        """
        from sagemaker.mlops.workflow.retry import (
            SageMakerJobExceptionTypeEnum,
            SageMakerJobStepRetryPolicy,
            StepExceptionTypeEnum,
            StepRetryPolicy,
        )

        retries = self.spec.environment.job_retries
        if retries.max_attempts == 0:
            return None
        timing = {
            "interval_seconds": retries.interval_seconds,
            "backoff_rate": retries.backoff_rate,
            "max_attempts": retries.max_attempts,
        }
        return [
            SageMakerJobStepRetryPolicy(
                exception_types=_members(SageMakerJobExceptionTypeEnum, RETRIED_JOB_FAILURES), **timing
            ),
            StepRetryPolicy(exception_types=_members(StepExceptionTypeEnum, RETRIED_STEP_FAILURES), **timing),
        ]

    def _tokenize_step(self, prep: DataPreparation) -> Any:
        from sagemaker.core.network import NetworkConfig
        from sagemaker.core.processing import Processor
        from sagemaker.core.shapes import ProcessingInput, ProcessingOutput, ProcessingS3Input, ProcessingS3Output
        from sagemaker.mlops.workflow import ProcessingStep

        spec, env = self.spec, self.spec.environment
        processor = Processor(
            role=spec.role_arn,
            image_uri=spec.image_uri,
            instance_count=1,
            instance_type=prep.instance_type,
            entrypoint=list(TOKENIZE_COMMAND),
            volume_size_in_gb=prep.volume_size_gb,
            volume_kms_key=spec.kms_key_arn,
            output_kms_key=spec.kms_key_arn,
            max_runtime_in_seconds=env.max_runtime_seconds,
            base_job_name=_tokenize_job_name(self.job_prefix),
            sagemaker_session=self.session,
            tags=[{"Key": key, "Value": value} for key, value in job_tags(spec).items()],
            network_config=NetworkConfig(
                subnets=list(spec.subnet_ids),
                security_group_ids=list(spec.security_group_ids),
                encrypt_inter_container_traffic=env.inter_container_encryption,
            ),
        )
        step_args = processor.run(
            inputs=[
                ProcessingInput(
                    input_name="raw",
                    s3_input=ProcessingS3Input(
                        s3_uri=prep.raw_s3_uri,
                        s3_data_type="S3Prefix",
                        local_path=PROCESSING_INPUT,
                        s3_input_mode="File",
                        s3_data_distribution_type="FullyReplicated",
                    ),
                )
            ],
            outputs=[
                ProcessingOutput(
                    output_name="shards",
                    s3_output=ProcessingS3Output(
                        s3_uri=prep.output_s3_uri, s3_upload_mode="EndOfJob", local_path=PROCESSING_OUTPUT
                    ),
                )
            ],
            arguments=[
                "--input", PROCESSING_INPUT,
                "--output", PROCESSING_OUTPUT,
                "--tokenizer", f"{PROCESSING_INPUT}/tokenizer.json",
                # token ids must index the model's embedding: refuse a tokenizer larger than it
                "--vocab-size", str(spec.profile.architecture.vocab_size),
            ],
        )
        return ProcessingStep(name=STEP_TOKENIZE, step_args=step_args)


def _members(enum: Any, values: Sequence[str]) -> list[Any]:
    """The members of one of the SDK's exception-type enums with these values (its metaclass maps
    ``enum(value)`` to a default member, so look them up by value)."""
    by_value = {member.value: member for member in enum}
    return [by_value[value] for value in values]


def marked_job_name(job_prefix: str, mark: str) -> str:
    """A job name prefix of the profile's marked ``-<mark>`` within the same length limit: the profile's is cut,
    never the mark (a tokenize or rehearsal job never carries the training job's own prefix)."""
    return f"{job_prefix[:JOB_NAME_PREFIX_MAX - len(mark) - 1].rstrip('-')}-{mark}"


def _tokenize_job_name(job_prefix: str) -> str:
    """The tokenize job's name prefix: the profile's, marked ``-tok``."""
    return marked_job_name(job_prefix, "tok")


def _rehearsal_job_name(job_prefix: str) -> str:
    """The rehearsal job's name prefix: the profile's, marked ``-reh``."""
    return marked_job_name(job_prefix, "reh")


def _iter_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every step, including those nested in condition steps."""
    found: list[dict[str, Any]] = []
    for step in steps:
        found.append(step)
        arguments = step.get("Arguments", {})
        if step.get("Type") == "Condition":
            found.extend(_iter_steps(arguments.get("IfSteps", [])))
            found.extend(_iter_steps(arguments.get("ElseSteps", [])))
    return found


def _fill_sdk_gaps(definition: dict[str, Any], spec: PipelineSpec, job_prefix: str) -> None:
    """Set what the SDK's typed objects cannot hold (see the module docstring)."""
    for step in _iter_steps(definition["Steps"]):
        arguments = step["Arguments"]
        if step["Type"] == "Training":
            rehearsal = step["Name"].startswith(STEP_REHEARSE)
            arguments["TrainingJobName"] = _rehearsal_job_name(job_prefix) if rehearsal else job_prefix
            stopping = arguments.setdefault("StoppingCondition", {})
            if not rehearsal:  # a rehearsal keeps its own time limit, as built
                stopping["MaxRuntimeInSeconds"] = {"Get": f"Parameters.{PARAM_MAX_RUNTIME_SECONDS}"}
            if arguments.get("EnableManagedSpotTraining"):
                stopping["MaxWaitTimeInSeconds"] = {"Get": f"Parameters.{PARAM_MAX_WAIT_SECONDS}"}
            if "TrainingPlanArn" in arguments.get("ResourceConfig", {}):
                # A job on a plan is Pending until the plan's capacity is there; it stops after this
                # instead of queueing on a plan that will not start (expired, or held by other jobs).
                stopping["MaxPendingTimeInSeconds"] = {"Get": f"Parameters.{PARAM_MAX_PENDING_SECONDS}"}
        elif step["Type"] == "Processing":
            arguments["ProcessingJobName"] = _tokenize_job_name(job_prefix)
