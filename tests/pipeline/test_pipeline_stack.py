"""TrainingPipelines + TrainingObservability synthesized in a test stack (cdk-nag on).

Machinery: the stacks are built for the fixture environments, with :mod:`btk.catalog` pointed
at the fixture profiles (``tests/fixture_catalog.py``), never at the user's config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import botocore.session
import cfn_fakes
import fixture_catalog as fc
import pipeline_fixtures as fx
import pytest
from botocore.validate import validate_parameters

from btk.environment import SPOT_WAIT_FACTOR, EnvironmentConfig
from btk.hardware import INSTANCE_TYPES, get_instance_type
from btk.hyperparameters import from_hyperparameters
from btk.knobs import knobs_to_hyperparameters
from btk.metrics import METRICS, format_metric_line
from btk.naming import TAG_ENVIRONMENT, pipeline_name
from btk.planner.search import plan_profile
from btk.units import SECONDS_PER_HOUR
from training_constructs.pipeline_definition import (
    PARAM_INSTANCE_COUNT,
    PARAM_MAX_PENDING_SECONDS,
    PARAM_MAX_RUNTIME_SECONDS,
    PARAM_MAX_WAIT_SECONDS,
    PARAM_TOTAL_TOKENS,
    PARAM_TRAINING_PLAN_ARN,
    RETRIED_JOB_FAILURES,
    RETRIED_STEP_FAILURES,
    STEP_CHECK_PLAN,
    STEP_TOKENIZE,
    STEP_TRAIN,
    STEP_TRAIN_ON_PLAN,
    job_environment,
)

# Fixture environments with an FSx data stage and an S3 one: names and profiles come from them.
STAGING, DEV = fc.STAGING, fc.DEV
PLAN_ARN = f"arn:aws:sagemaker:{fx.REGION}:{fx.ACCOUNT}:training-plan/btk-test-plan"
#: The event log group of staging: its name carries the stack's generation (a retained group never blocks a redeploy).
EVENT_LOG = f"/btk/staging/training-events-{cfn_fakes.FAKE_STACK_GENERATION}"


@pytest.fixture(scope="module", autouse=True)
def catalog_fixtures() -> Iterator[None]:
    """The stacks look their profiles up in :mod:`btk.catalog`: point it at the fixtures."""
    with fc.installed():
        yield


@pytest.fixture(scope="module")
def staging(catalog_fixtures: None) -> dict[str, Any]:
    return fx.synth(STAGING)


@pytest.fixture(scope="module")
def dev_prepared(catalog_fixtures: None) -> dict[str, Any]:
    return fx.synth(DEV, data_preparation=True, training_plan_arn=PLAN_ARN)


#: The fixture dev environment on managed spot, on an instance type the catalog shows spot for.
SPOT_INSTANCE = next(t for t in INSTANCE_TYPES.values() if t.managed_spot.offered).name
SPOT_DEV = EnvironmentConfig.model_validate(
    {**DEV.model_dump(), "instance_type": SPOT_INSTANCE, "managed_spot": True,
     "capacity": {"mode": "on_demand"},
     # spot waiting lengthens the longest execution past dev's checkpoint expiry: keep checkpoints
     "data_stage": {**DEV.data_stage.model_dump(), "checkpoint_expiration_days": None}}
)


@pytest.fixture(scope="module")
def dev_spot(catalog_fixtures: None) -> dict[str, Any]:
    return fx.synth(SPOT_DEV)


def _service_model() -> Any:
    return botocore.session.get_session().get_service_model("sagemaker")


def _resources(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in template["Resources"].values() if r["Type"] == kind]


# -- one pipeline per profile, hyperparameters from the planner ----------------------------


def test_one_pipeline_per_profile_named_for_env_and_profile(staging: dict[str, Any]) -> None:
    names = sorted(fx.pipelines(staging))
    assert names == sorted(pipeline_name(STAGING.name, profile) for profile in STAGING.profiles)


@pytest.mark.parametrize("template_name", ["staging", "dev_prepared"])
def test_hyperparameters_are_the_planners_knobs(template_name: str, request: pytest.FixtureRequest) -> None:
    template = request.getfixturevalue(template_name)
    env = {"staging": STAGING, "dev_prepared": DEV}[template_name]
    instance = get_instance_type(env.instance_type)
    for profile_name in env.profiles:
        definition = fx.pipelines(template)[f"btk-{env.name}-{profile_name.replace('.', '-')}"]
        for step_name in (STEP_TRAIN, STEP_TRAIN_ON_PLAN):
            hyperparameters = fx.all_steps(definition)[step_name]["Arguments"]["HyperParameters"]
            plan = plan_profile(fc.PROFILES[profile_name], instance, env.instance_count)
            expected = knobs_to_hyperparameters(plan.knobs)
            assert {key: hyperparameters[key] for key in expected} == expected
            values = fx.substitute(hyperparameters, fx.sample_parameters(definition))
            parsed = from_hyperparameters(values)
            assert parsed.knobs == plan.knobs
            assert parsed.architecture == fc.PROFILES[profile_name].architecture
            assert parsed.job.profile == profile_name
            planned_gpus = instance.gpus_per_node * env.instance_count
            assert parsed.job.planned_data_parallel == planned_gpus // plan.knobs.tensor_parallel
            ladder = parsed.job.knob_ladder
            assert (ladder.rungs if ladder else ()) == tuple(rung.knobs for rung in plan.ladder)


def test_total_tokens_parameter_feeds_the_hyperparameter(staging: dict[str, Any]) -> None:
    profile = STAGING.profiles[-1]
    definition = fx.pipelines(staging)[pipeline_name(STAGING.name, profile)]
    hyperparameters = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]["HyperParameters"]
    assert hyperparameters["train.total_tokens"] == {"Get": f"Parameters.{PARAM_TOTAL_TOKENS}"}
    default = fx.sample_parameters(definition)[PARAM_TOTAL_TOKENS]
    assert default == str(fc.PROFILES[profile].training.total_tokens or "")
    parsed = from_hyperparameters(fx.substitute(hyperparameters, fx.sample_parameters(definition, TotalTokens="5000")))
    assert parsed.training.total_tokens == 5000


# -- channel, plan, checkpoints, KMS, VPC, metrics -----------------------------------------


def test_fsx_channel_mounts_the_data_stage_so_the_verification_record_can_live_beside_it(
        staging: dict[str, Any]) -> None:
    for definition in fx.pipelines(staging).values():
        channels = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]["InputDataConfig"]
        assert [c["ChannelName"] for c in channels] == ["train"]
        source = channels[0]["DataSource"]["FileSystemDataSource"]
        assert source == {
            "FileSystemId": fx.FAKE_FILE_SYSTEM_ID,
            "FileSystemAccessMode": "rw",
            "FileSystemType": "FSxLustre",
            "DirectoryPath": f"/{fx.FAKE_MOUNT_NAME}{STAGING.data_stage.fsx_directory}",
        }


def test_s3_mode_streams_the_datasets_prefix_with_fastfile(dev_prepared: dict[str, Any]) -> None:
    definition = fx.pipelines(dev_prepared)[pipeline_name(DEV.name, DEV.profiles[0])]
    arguments = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]
    channel = arguments["InputDataConfig"][0]
    assert channel["InputMode"] == "FastFile"
    uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
    assert re.fullmatch(r"s3://datasets[a-z0-9]*-bucket/datasets/", uri), uri


def test_training_plan_arn_is_wired_to_the_parameter(staging: dict[str, Any], dev_prepared: dict[str, Any]) -> None:
    for template, default in ((staging, ""), (dev_prepared, PLAN_ARN)):
        for definition in fx.pipelines(template).values():
            steps = fx.all_steps(definition)
            assert fx.sample_parameters(definition)[PARAM_TRAINING_PLAN_ARN] == default
            condition = steps[STEP_CHECK_PLAN]["Arguments"]["Conditions"]
            assert condition == [
                {"Type": "Equals", "LeftValue": {"Get": f"Parameters.{PARAM_TRAINING_PLAN_ARN}"}, "RightValue": ""}
            ]
            on_plan = steps[STEP_TRAIN_ON_PLAN]["Arguments"]["ResourceConfig"]
            assert on_plan["TrainingPlanArn"] == {"Get": f"Parameters.{PARAM_TRAINING_PLAN_ARN}"}
            assert "TrainingPlanArn" not in steps[STEP_TRAIN]["Arguments"]["ResourceConfig"]
            assert steps[STEP_TRAIN_ON_PLAN]["Arguments"]["EnableManagedSpotTraining"] is False


def test_instance_count_and_runtime_are_parameters(staging: dict[str, Any]) -> None:
    env = STAGING
    for definition in fx.pipelines(staging).values():
        defaults = fx.sample_parameters(definition)
        assert defaults[PARAM_INSTANCE_COUNT] == env.instance_count
        assert defaults[PARAM_MAX_RUNTIME_SECONDS] == env.max_runtime_hours * 3600
        arguments = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]
        assert arguments["ResourceConfig"]["InstanceType"] == env.instance_type
        assert arguments["ResourceConfig"]["InstanceCount"] == {"Get": f"Parameters.{PARAM_INSTANCE_COUNT}"}
        runtime = {"Get": f"Parameters.{PARAM_MAX_RUNTIME_SECONDS}"}
        assert arguments["StoppingCondition"] == {"MaxRuntimeInSeconds": runtime}


def test_checkpoints_kms_vpc_encryption_environment_and_tags(staging: dict[str, Any]) -> None:
    for name, definition in fx.pipelines(staging).items():
        arguments = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]
        profile = name.removeprefix("btk-staging-")
        checkpoint = fx.substitute(arguments["CheckpointConfig"], {}, execution_id="exec42")
        assert checkpoint["LocalPath"] == "/opt/ml/checkpoints"
        assert re.fullmatch(r"s3://checkpoints[a-z0-9]*-bucket/checkpoints/[a-z0-9.\-]+/exec42", checkpoint["S3Uri"])
        assert arguments["OutputDataConfig"]["KmsKeyId"] == fx.FAKE_KEY_ARN
        # P6-B200 has local NVMe and no EBS volume: SageMaker rejects a volume key there.
        assert "VolumeKmsKeyId" not in arguments["ResourceConfig"]
        assert arguments["VpcConfig"] == {"SecurityGroupIds": [fx.FAKE_GROUP], "Subnets": [fx.FAKE_SUBNET]}
        assert arguments["EnableInterContainerTrafficEncryption"] is STAGING.inter_container_encryption
        assert arguments["EnableManagedSpotTraining"] is False
        assert arguments["Environment"] == job_environment(STAGING.instance_type)
        tags = {tag["Key"]: tag["Value"] for tag in arguments["Tags"]}
        assert tags["btk:environment"] == "staging"
        assert tags["btk:instance-type"] == STAGING.instance_type
        assert tags["btk:profile"].replace(".", "-") == profile
        assert arguments["TrainingJobName"] == name
        assert arguments["AlgorithmSpecification"]["TrainingImage"] == (
            f"{fx.ACCOUNT}.dkr.ecr.{fx.REGION}.amazonaws.com/btk-training:latest"
        )
        assert "ContainerEntrypoint" not in arguments["AlgorithmSpecification"]


def test_spot_env_sets_max_wait_parameter(dev_spot: dict[str, Any]) -> None:
    for definition in fx.pipelines(dev_spot).values():
        arguments = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]
        assert arguments["EnableManagedSpotTraining"] is True
        assert arguments["StoppingCondition"]["MaxWaitTimeInSeconds"] == {"Get": f"Parameters.{PARAM_MAX_WAIT_SECONDS}"}
        defaults = fx.sample_parameters(definition)
        assert defaults[PARAM_MAX_WAIT_SECONDS] >= defaults[PARAM_MAX_RUNTIME_SECONDS]


def test_plan_branch_jobs_stop_waiting_for_capacity_in_sagemakers_bounds(dev_prepared: dict[str, Any]) -> None:
    """A job on a plan is Pending until the plan's capacity is there: it carries MaxPendingTimeInSeconds
    (botocore: 1800 to 2419200 s), from a parameter; the on-demand branch has no plan to wait for."""
    model = botocore.session.get_session().get_service_model("sagemaker").shape_for("StoppingCondition")
    bounds = model.members["MaxPendingTimeInSeconds"].metadata
    for definition in fx.pipelines(dev_prepared).values():
        steps = fx.all_steps(definition)
        on_plan = steps[STEP_TRAIN_ON_PLAN]["Arguments"]["StoppingCondition"]
        assert on_plan["MaxPendingTimeInSeconds"] == {"Get": f"Parameters.{PARAM_MAX_PENDING_SECONDS}"}
        assert "MaxPendingTimeInSeconds" not in steps[STEP_TRAIN]["Arguments"]["StoppingCondition"]
        default = fx.sample_parameters(definition)[PARAM_MAX_PENDING_SECONDS]
        assert bounds["min"] <= default <= bounds["max"]
        assert default == min(bounds["max"], max(bounds["min"], DEV.max_runtime_seconds))


def test_spot_wait_is_the_environments_longest_job(dev_spot: dict[str, Any]) -> None:
    """The pipeline's MaxWait and the checkpoint-expiration rule read one wait factor."""
    env = SPOT_DEV
    assert env.managed_spot
    for definition in fx.pipelines(dev_spot).values():
        defaults = fx.sample_parameters(definition)
        assert defaults[PARAM_MAX_WAIT_SECONDS] == SPOT_WAIT_FACTOR * defaults[PARAM_MAX_RUNTIME_SECONDS]
        assert defaults[PARAM_MAX_WAIT_SECONDS] == env.longest_job_hours * SECONDS_PER_HOUR


def test_metric_definitions_parse_the_trainers_lines(staging: dict[str, Any]) -> None:
    line = format_metric_line(
        step=120,
        loss=2.5,
        tokens_per_second_per_gpu=9876.5,
        tflops_per_gpu=612.3,
        mfu=0.4321,
        peak_memory_gib=88.5,
        nonfinite_steps=2,
    )
    expected = {"step": 120, "loss": 2.5, "tokens_per_second_per_gpu": 9876.5, "tflops_per_gpu": 612.3,
                "mfu": 0.4321, "peak_memory_gib": 88.5, "nonfinite_steps": 2}
    for definition in fx.pipelines(staging).values():
        definitions = fx.all_steps(definition)[STEP_TRAIN]["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]
        assert [d["Name"] for d in definitions] == [m.sagemaker_name for m in METRICS]
        by_name = {m.sagemaker_name: m.key for m in METRICS}
        for item in definitions:
            if by_name[item["Name"]] not in expected:  # printed on a line of its own (format_preflight_line)
                continue
            match = re.search(item["Regex"], line)
            assert match is not None, item
            assert float(match.group(1)) == pytest.approx(expected[by_name[item["Name"]]])
            assert re.search(item["Regex"], "step 120 loss 2.5") is None


def test_tokenize_step_runs_before_training(dev_prepared: dict[str, Any]) -> None:
    definition = fx.pipelines(dev_prepared)[pipeline_name(DEV.name, DEV.profiles[-1])]
    steps = fx.all_steps(definition)
    tokenize = steps[STEP_TOKENIZE]["Arguments"]
    assert tokenize["AppSpecification"]["ContainerEntrypoint"] == ["btk-tokenize"]
    assert tokenize["AppSpecification"]["ImageUri"] == (
        fx.all_steps(definition)[STEP_TRAIN]["Arguments"]["AlgorithmSpecification"]["TrainingImage"]
    )
    output = tokenize["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"]
    train_uri = steps[STEP_TRAIN]["Arguments"]["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    assert output == train_uri
    assert steps[STEP_CHECK_PLAN]["DependsOn"] == [STEP_TOKENIZE]
    # the tokenize tool refuses token ids the model's embedding cannot index
    arguments = tokenize["AppSpecification"]["ContainerArguments"]
    vocab = fc.PROFILES[DEV.profiles[-1]].architecture.vocab_size
    assert arguments[arguments.index("--vocab-size") + 1] == str(vocab)


# -- botocore validation ---------------------------------------------------------------------


@pytest.mark.parametrize("template_name", ["staging", "dev_prepared"])
def test_job_arguments_validate_against_botocore(template_name: str, request: pytest.FixtureRequest) -> None:
    template = request.getfixturevalue(template_name)
    model = _service_model()
    operations = {"Training": "CreateTrainingJob", "Processing": "CreateProcessingJob"}
    checked = 0
    for definition in fx.pipelines(template).values():
        # Each branch of the condition runs with the plan value that selects it.
        for plan_arn, skipped in (("", STEP_TRAIN_ON_PLAN), (PLAN_ARN, STEP_TRAIN)):
            parameters = fx.sample_parameters(definition, TrainingPlanArn=plan_arn, TotalTokens="1000000")
            for step in fx.all_steps(definition).values():
                if step["Type"] not in operations or step["Name"] == skipped:
                    continue
                arguments = fx.substitute(step["Arguments"], parameters)
                shape = model.operation_model(operations[step["Type"]]).input_shape
                validate_parameters(arguments, shape)  # raises ParamValidationError on any mismatch
                checked += 1
    assert checked >= 4


def test_empty_plan_arn_is_invalid_so_on_demand_needs_its_own_step(staging: dict[str, Any]) -> None:
    definition = next(iter(fx.pipelines(staging).values()))
    step = fx.all_steps(definition)[STEP_TRAIN_ON_PLAN]
    arguments = fx.substitute(step["Arguments"], fx.sample_parameters(definition, TrainingPlanArn=""))
    with pytest.raises(Exception, match="TrainingPlanArn"):
        validate_parameters(arguments, _service_model().operation_model("CreateTrainingJob").input_shape)


def test_botocore_validation_catches_a_broken_argument(staging: dict[str, Any]) -> None:
    definition = next(iter(fx.pipelines(staging).values()))
    arguments = fx.substitute(fx.all_steps(definition)[STEP_TRAIN]["Arguments"], fx.sample_parameters(definition))
    arguments["ResourceConfig"]["InstanceCount"] = "two"
    with pytest.raises(Exception, match="InstanceCount"):
        validate_parameters(arguments, _service_model().operation_model("CreateTrainingJob").input_shape)


# -- IAM, observability -----------------------------------------------------------------------


def _policy_statements(template: dict[str, Any], role_id_fragment: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::IAM::Policy" and role_id_fragment in logical_id:
            statements.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    return statements


def test_pipeline_role_is_least_privilege(staging: dict[str, Any]) -> None:
    statements = _policy_statements(staging, "PipelineRole")
    assert statements
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions), statement
        resources = fx.resolve(staging, statement["Resource"])
        resources = resources if isinstance(resources, list) else [resources]
        assert "*" not in resources
        if "iam:PassRole" in actions:
            assert resources == [f"arn:aws:iam::{fx.ACCOUNT}:role/{_logical_id(staging, 'ExecutionRole')}"]
            assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
        if "kms:CreateGrant" in actions:
            assert actions == ["kms:CreateGrant"]  # DescribeKey never carries kms:GrantIsForAWSResource
    sids = {statement.get("Sid") for statement in statements}
    assert {"CreateJobsTaggedForThisEnvironment", "PassExecutionRole", "DescribeVolumeKey"} <= sids
    # On-demand: no plan, so no plan of the account (another environment's reservation) may be used.
    assert not any("TrainingPlan" in str(sid) for sid in sids)
    all_actions = {a for st in statements for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}
    assert "sagemaker:CreateTrainingPlan" not in all_actions
    pipelines = _resources(staging, "AWS::SageMaker::Pipeline")
    pipeline_roles = {fx.resolve(staging, p["Properties"]["RoleArn"]) for p in pipelines}
    assert len(pipeline_roles) == 1


def _logical_id(template: dict[str, Any], fragment: str) -> str:
    matches = [lid for lid, r in template["Resources"].items() if fragment in lid and r["Type"] == "AWS::IAM::Role"]
    assert len(matches) == 1, matches
    return matches[0]


def test_failure_rules_notify_an_encrypted_topic(staging: dict[str, Any]) -> None:
    rules = _resources(staging, "AWS::Events::Rule")
    patterns = {rule["Properties"]["EventPattern"]["detail-type"][0]: rule for rule in rules}
    pipeline_rule = patterns["SageMaker Model Building Pipeline Execution Status Change"]
    detail = pipeline_rule["Properties"]["EventPattern"]["detail"]
    assert detail["currentPipelineExecutionStatus"] == ["Failed"]
    arns = fx.resolve(staging, detail["pipelineArn"])
    assert sorted(arns) == sorted(
        f"arn:aws:sagemaker:{fx.REGION}:{fx.ACCOUNT}:pipeline/{name}" for name in fx.pipelines(staging)
    )
    # a retried job attempt must not alert: only the execution's failure does (see observability.py)
    assert set(patterns) == {"SageMaker Model Building Pipeline Execution Status Change"}
    (topic,) = _resources(staging, "AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic["Properties"]
    (topic_policy,) = _resources(staging, "AWS::SNS::TopicPolicy")
    statements = topic_policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(s.get("Principal") == {"Service": "events.amazonaws.com"} and "aws:SourceArn" in str(s)
               for s in statements)
    assert any(s["Effect"] == "Deny" and "aws:SecureTransport" in str(s) for s in statements)
    log_target = f"arn:aws:logs:{fx.REGION}:{fx.ACCOUNT}:log-group:{EVENT_LOG}"
    for rule in rules:
        targets = [fx.resolve(staging, target["Arn"]) for target in rule["Properties"]["Targets"]]
        assert len(targets) == 2 and log_target in targets  # no ":*": EventBridge would deliver nothing


def test_event_log_group_has_environment_retention_and_key(staging: dict[str, Any]) -> None:
    groups = [g for g in _resources(staging, "AWS::Logs::LogGroup")
              if fx.resolve(staging, g["Properties"].get("LogGroupName")) == EVENT_LOG]
    assert len(groups) == 1
    assert groups[0]["Properties"]["RetentionInDays"] == STAGING.log_retention_days
    assert "KmsKeyId" in groups[0]["Properties"]


def test_event_log_policy_lets_only_the_failure_rules_put_events(staging: dict[str, Any]) -> None:
    (policy,) = _resources(staging, "AWS::Logs::ResourcePolicy")
    document = json.loads(fx.resolve(staging, policy["Properties"]["PolicyDocument"]))
    by_action = {statement["Action"]: statement for statement in document["Statement"]}
    assert set(by_action) == {"logs:CreateLogStream", "logs:PutLogEvents"}
    group_arn = f"arn:aws:logs:{fx.REGION}:{fx.ACCOUNT}:log-group:{EVENT_LOG}:*"
    for statement in by_action.values():
        assert statement["Principal"] == {"Service": ["events.amazonaws.com", "delivery.logs.amazonaws.com"]}
        assert statement["Resource"] == group_arn
    # EventBridge creates streams with no source-rule context: a SourceArn condition there blocks delivery.
    assert "Condition" not in by_action["logs:CreateLogStream"]
    rules = sorted(f"arn:aws:events:{fx.REGION}:{fx.ACCOUNT}:rule/{lid}"
                   for lid, r in staging["Resources"].items() if r["Type"] == "AWS::Events::Rule")
    assert sorted(by_action["logs:PutLogEvents"]["Condition"]["ArnEquals"]["aws:SourceArn"]) == rules


def test_dashboard_has_metrics_per_profile_and_pipeline_outcomes(staging: dict[str, Any]) -> None:
    (dashboard,) = _resources(staging, "AWS::CloudWatch::Dashboard")
    body = str(fx.resolve(staging, dashboard["Properties"]["DashboardBody"]))
    assert dashboard["Properties"]["DashboardName"] == "btk-staging-training"
    for name in fx.pipelines(staging):
        assert f"TrainingJobName={name}" in body
        assert name in body
    for metric in ("train:loss", "train:tokens_per_second_per_gpu", "train:mfu", "train:peak_memory_gib"):
        assert metric in body
    assert "ExecutionFailed" in body and "ExecutionSucceeded" in body
    assert "AWS/Sagemaker/ModelBuildingPipeline" in body


# -- determinism and growth --------------------------------------------------------------------


def test_two_synths_give_identical_definitions(staging: dict[str, Any]) -> None:
    again = fx.synth(STAGING)
    assert fx.raw_definitions(again) == fx.raw_definitions(staging)
    assert str(fx.raw_definitions(again)) == str(fx.raw_definitions(staging))


def test_adding_a_profile_adds_a_pipeline() -> None:
    added = next(name for name in sorted(fc.PROFILES) if name not in DEV.profiles)
    env = DEV.model_copy(update={"profiles": (*DEV.profiles, added)})
    template = fx.synth(env)
    assert len(_resources(template, "AWS::SageMaker::Pipeline")) == len(DEV.profiles) + 1
    assert pipeline_name(DEV.name, added) in fx.pipelines(template)


@pytest.mark.parametrize("template_name", ["staging", "dev_prepared"])
def test_job_creation_is_allowed_whatever_name_pipelines_gives_the_job(
    template_name: str, request: pytest.FixtureRequest
) -> None:
    """Create/tag/stop hold for ``btk-<env>-*`` and ``pipelines-*`` names, only with this environment's tag,
    and that tag is in every job request of the environment's definitions."""
    template = request.getfixturevalue(template_name)
    env = STAGING if template_name == "staging" else DEV
    statements = _policy_statements(template, "PipelineRole")
    arn = f"arn:aws:sagemaker:{fx.REGION}:{fx.ACCOUNT}"
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if not any(a.startswith(("sagemaker:Create", "sagemaker:Stop", "sagemaker:AddTags")) for a in actions):
            continue
        resources = fx.resolve(template, statement["Resource"])
        resources = resources if isinstance(resources, list) else [resources]
        if statement.get("Sid") == "UseTheEnvironmentsTrainingPlan":
            continue
        for kind in ("training-job", *(["processing-job"] if template_name == "dev_prepared" else [])):
            assert f"{arn}:{kind}/btk-{env.name}-*" in resources and f"{arn}:{kind}/pipelines-*" in resources
        tag_conditions = statement["Condition"]["StringEquals"]
        tagged = {k: v for k, v in tag_conditions.items() if k.endswith(f"Tag/{TAG_ENVIRONMENT}")}
        assert tagged and set(tagged.values()) == {env.name}, statement
    for definition in fx.pipelines(template).values():
        for step in fx.all_steps(definition).values():
            if step["Type"] in ("Training", "Processing"):
                tags = {tag["Key"]: tag["Value"] for tag in step["Arguments"]["Tags"]}
                assert tags[TAG_ENVIRONMENT] == env.name


def test_training_steps_retry_capacity_and_internal_errors_with_backoff(staging: dict[str, Any]) -> None:
    retries = STAGING.job_retries
    for definition in fx.pipelines(staging).values():
        for name in (STEP_TRAIN, STEP_TRAIN_ON_PLAN):
            policies = fx.all_steps(definition)[name].get("RetryPolicies", [])
            if retries.max_attempts == 0:
                assert not policies
                continue
            by_type = {tuple(p["ExceptionType"]): p for p in policies}
            assert set(by_type) == {RETRIED_JOB_FAILURES, RETRIED_STEP_FAILURES}
            for policy in policies:
                assert policy["MaxAttempts"] == retries.max_attempts
                assert policy["IntervalSeconds"] == retries.interval_seconds
                assert policy["BackoffRate"] == retries.backoff_rate
            # A retry is a new job of the same execution: it resumes from that execution's checkpoints.
            uri = fx.all_steps(definition)[name]["Arguments"]["CheckpointConfig"]["S3Uri"]
            assert uri["Std:Join"]["Values"][-1] == {"Get": "Execution.PipelineExecutionId"}


def test_jobs_may_run_on_the_environments_own_plan_only(dev_prepared: dict[str, Any]) -> None:
    """Plan-user permissions name the environment's plan: an execution started with another
    environment's TrainingPlanArn is refused (the reserved capacity alone grants nothing)."""
    statements = {s.get("Sid"): s for s in _policy_statements(dev_prepared, "PipelineRole")}
    use = statements["UseTheEnvironmentsTrainingPlan"]
    assert use["Action"] == "sagemaker:CreateTrainingJob"
    assert sorted(fx.resolve(dev_prepared, use["Resource"])) == sorted([  # cdk.json's minimizePolicies sorts them
        PLAN_ARN,
        f"arn:aws:sagemaker:{fx.REGION}:{fx.ACCOUNT}:reserved-capacity/*",
    ])
    describe = statements["DescribeTheEnvironmentsTrainingPlan"]
    assert (describe["Action"], fx.resolve(dev_prepared, describe["Resource"])) == (
        "sagemaker:DescribeTrainingPlan",
        PLAN_ARN,
    )
