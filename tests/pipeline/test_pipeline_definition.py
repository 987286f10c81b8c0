"""The pure definition builder: validation errors, offline build, SDK gaps, names.

Machinery: the specs are built from the fixture environments and profiles
(``tests/fixture_catalog.py``), never from the user's ``environments.py`` or ``profiles/``.
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from typing import Any

import fixture_catalog as fc
import pytest

from btk.errors import BtkError
from btk.knobs import TrainingKnobs
from btk.naming import environment_prefix, job_name_prefix, pipeline_name
from training_constructs.locations import FileSystemLocation
from training_constructs.pipeline_definition import (
    NCCL_ENVIRONMENT,
    STEP_TRAIN,
    STEP_TRAIN_ON_PLAN,
    PipelineSpec,
    S3TrainingData,
    build_pipeline_definition,
    job_environment,
)

# A profile outside staging, to check that a spec refuses it.
OUTSIDE_STAGING = next(name for name in sorted(fc.PROFILES) if name not in fc.STAGING.profiles)
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _spec(**changes: Any) -> PipelineSpec:
    profile = fc.PROFILES[fc.STAGING.profiles[0]]
    spec = PipelineSpec(
        environment=fc.STAGING,
        profile=profile,
        knobs=TrainingKnobs(micro_batch_size=2, seq_len=profile.training.seq_len),
        image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/btk:1",
        role_arn="arn:aws:iam::123456789012:role/exec",
        kms_key_arn=KEY,
        subnet_ids=["subnet-0a1b2c3d4e5f60718"],
        security_group_ids=["sg-0a1b2c3d4e5f60718"],
        train_data=FileSystemLocation("fs-0123456789abcdef0", "abcd1234", "/datasets"),
        checkpoint_s3_uri="s3://checkpoints-bucket/checkpoints",
        output_s3_uri="s3://artifacts-bucket/models",
    )
    return replace(spec, **changes)


def _train(definition: str, step: str = STEP_TRAIN) -> dict[str, Any]:
    parsed = json.loads(definition)
    condition = parsed["Steps"][-1]["Arguments"]
    for candidate in condition["IfSteps"] + condition["ElseSteps"]:
        if candidate["Name"] == step:
            arguments: dict[str, Any] = candidate["Arguments"]
            return arguments
    raise AssertionError(step)


def test_names_are_sanitised_for_sagemaker() -> None:
    assert pipeline_name("dev", "llama3.2-1b") == "btk-dev-llama3-2-1b"
    assert pipeline_name("prod", "qwen2.5_32b") == "btk-prod-qwen2-5-32b"
    assert len(job_name_prefix("staging-eu-west-1-big", "a-very-long-profile-name-for-testing")) <= 40


@pytest.mark.parametrize("profile", ["x", "llama3.2-1b", "a-very-long-profile-name-for-testing", "ab-" * 20])
def test_tokenize_and_rehearsal_jobs_keep_their_mark_at_any_prefix_length(profile: str) -> None:
    """At the longest prefix the profile's part is cut, not the mark: no helper job carries the training job's
    prefix, and every one stays within the prefix limit and the environment's prefix."""
    from btk.naming import JOB_NAME_PREFIX_MAX
    from training_constructs.pipeline_definition import marked_job_name

    prefix = job_name_prefix("staging-eu-west-1-big", profile)
    names = {mark: marked_job_name(prefix, mark) for mark in ("tok", "reh")}
    for mark, name in names.items():
        assert name.endswith(f"-{mark}") and "--" not in name and len(name) <= JOB_NAME_PREFIX_MAX
        assert name.startswith(environment_prefix("staging-eu-west-1-big")) and name != prefix
    if len(prefix) + 4 <= JOB_NAME_PREFIX_MAX:  # room for the mark: the profile's prefix is kept whole
        assert names == {mark: f"{prefix}-{mark}" for mark in names}


@pytest.mark.parametrize(("env_name", "profile"), [("dev", "llama3.2-1b"), ("staging", "qwen2.5_32b"), ("prod", "x")])
def test_every_name_of_an_environment_starts_with_its_prefix(env_name: str, profile: str) -> None:
    """The pipeline role's job ARNs, the failure rules and the log query all match on this prefix."""
    assert environment_prefix(env_name) == f"btk-{env_name}-"
    assert pipeline_name(env_name, profile).startswith(environment_prefix(env_name))
    assert job_name_prefix(env_name, profile).startswith(environment_prefix(env_name))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"profile": fc.PROFILES[OUTSIDE_STAGING]}, f"profile '{OUTSIDE_STAGING}' is not in environment 'staging'"),
        ({"role_arn": "exec-role"}, "role_arn 'exec-role' must be an IAM role ARN"),
        ({"checkpoint_s3_uri": "/tmp/ckpt"}, "checkpoint_s3_uri '/tmp/ckpt' must be an s3:// URI"),
        ({"image_uri": ""}, "pipeline image_uri is empty"),
        ({"subnet_ids": []}, "needs subnet_ids and security_group_ids"),
        ({"train_data": S3TrainingData("s3://b/datasets/")}, "uses data_stage.mode=fsx: pass FileSystemLocation"),
        ({"training_plan_arn": "my-plan"}, "is not a training plan ARN"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(BtkError, match=message) as raised:
        build_pipeline_definition(_spec(**changes))
    assert "\n" not in str(raised.value)


def test_s3_env_rejects_fsx_channel() -> None:
    spec = _spec(environment=fc.DEV)
    with pytest.raises(BtkError, match=r"uses data_stage\.mode=s3: pass S3TrainingData"):
        build_pipeline_definition(spec)


def test_build_makes_no_network_call(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    definition = build_pipeline_definition(_spec())
    assert attempts == []
    assert json.loads(definition)["Parameters"]


def test_same_spec_same_bytes() -> None:
    assert build_pipeline_definition(_spec()) == build_pipeline_definition(_spec())


def test_volume_key_only_where_the_instance_has_ebs() -> None:
    nvme = _train(build_pipeline_definition(_spec()))
    assert "VolumeKmsKeyId" not in nvme["ResourceConfig"]
    ebs_env = fc.STAGING.model_copy(update={"instance_type": "ml.p3.16xlarge"})
    ebs = _train(build_pipeline_definition(_spec(environment=ebs_env)))
    assert ebs["ResourceConfig"]["VolumeKmsKeyId"] == KEY
    assert ebs["ResourceConfig"]["VolumeSizeInGB"] == 500
    # Nothing was planned for an instance outside the catalog: the trainer keeps the knobs' accumulation.
    assert ebs["HyperParameters"]["job.planned_data_parallel"] == ""
    assert nvme["HyperParameters"]["job.planned_data_parallel"] == "8"


def test_existing_plan_default_and_on_plan_branch_has_no_spot() -> None:
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/btk-prod"
    definition = build_pipeline_definition(_spec(training_plan_arn=plan))
    parameters = {p["Name"]: p for p in json.loads(definition)["Parameters"]}
    assert parameters["TrainingPlanArn"]["DefaultValue"] == plan
    on_plan = _train(definition, STEP_TRAIN_ON_PLAN)
    assert on_plan["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in on_plan["StoppingCondition"]


def test_prod_multi_node_encrypts_inter_node_traffic() -> None:
    prod = fc.PROD.model_copy(update={"instance_count": 2, "inter_container_encryption": True})
    profile = fc.PROFILES[prod.profiles[-1]]
    spec = _spec(environment=prod, profile=profile, knobs=TrainingKnobs(micro_batch_size=1, seq_len=4096))
    definition = build_pipeline_definition(spec)
    arguments = _train(definition)
    assert arguments["EnableInterContainerTrafficEncryption"] is True
    parameters = {p["Name"]: p for p in json.loads(definition)["Parameters"]}
    assert parameters["InstanceCount"]["DefaultValue"] == prod.instance_count == 2
    assert arguments["Environment"]["FI_PROVIDER"] == "efa" == job_environment(prod.instance_type)["FI_PROVIDER"]


def test_job_environment_takes_network_settings_from_the_catalog_only_for_its_instance() -> None:
    from btk.hardware import INSTANCE_TYPES

    for name, instance in INSTANCE_TYPES.items():
        assert job_environment(name) == {**NCCL_ENVIRONMENT, **instance.network_environment}
    assert job_environment("ml.p3.16xlarge") == NCCL_ENVIRONMENT  # outside the catalog: no EFA settings
    assert "FI_PROVIDER" not in NCCL_ENVIRONMENT  # one home for the EFA settings: btk.hardware


def _steps_by_name(definition: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}

    def walk(steps: list[dict[str, Any]], parents: tuple[str, ...]) -> None:
        for step in steps:
            found[step["Name"]] = {**step, "parents": parents}
            arguments = step.get("Arguments", {})
            walk(arguments.get("IfSteps", []), (*parents, f"{step['Name']}:if"))
            walk(arguments.get("ElseSteps", []), (*parents, f"{step['Name']}:else"))

    walk(json.loads(definition)["Steps"], ())
    return found


@pytest.mark.parametrize("suffix", ["", "OnPlan"])
def test_a_rehearsal_gates_the_long_run(suffix: str) -> None:
    """Rehearse, then a condition on its final metrics: the long run only where it passed, a Fail step where not.
    The rehearsal is short and apart: its own node count, step count and time limit, no checkpoints (the long run
    must not resume from it), no rescaled accumulation, no spot, tagged as a rehearsal, named apart."""
    from btk.metrics import METRICS_BY_KEY
    from btk.naming import PURPOSE_REHEARSAL, TAG_PURPOSE
    from training_constructs.pipeline_definition import (
        STEP_REHEARSAL_FAILED,
        STEP_REHEARSAL_GATE,
        STEP_REHEARSE,
        RehearsalSpec,
    )

    rehearsal = RehearsalSpec(nodes=1, steps=60, min_tokens_per_second_per_gpu=12345.6, max_runtime_seconds=5400,
                              max_peak_memory_gib=161.25)
    env = fc.STAGING.model_copy(update={"managed_spot": True, "instance_count": 2})
    steps = _steps_by_name(build_pipeline_definition(_spec(environment=env, rehearsal=rehearsal)))
    rehearse, gate = steps[STEP_REHEARSE + suffix], steps[STEP_REHEARSAL_GATE + suffix]
    branch = "CheckTrainingPlan:else" if suffix else "CheckTrainingPlan:if"
    assert rehearse["parents"] == gate["parents"] == (branch,)
    assert steps[STEP_TRAIN + suffix]["parents"] == (branch, f"{STEP_REHEARSAL_GATE}{suffix}:if")
    assert steps[STEP_REHEARSAL_FAILED + suffix]["parents"] == (branch, f"{STEP_REHEARSAL_GATE}{suffix}:else")
    final = f"Steps.{STEP_REHEARSE}{suffix}.FinalMetricDataList"
    throughput = METRICS_BY_KEY["tokens_per_second_per_gpu"].sagemaker_name
    nonfinite = METRICS_BY_KEY["nonfinite_steps"].sagemaker_name
    memory, loss_drop = (METRICS_BY_KEY[key].sagemaker_name for key in ("peak_memory_gib", "loss_drop"))
    assert gate["Arguments"]["Conditions"] == [
        {"LeftValue": {"Get": f"{final}['{throughput}'].Value"}, "RightValue": 12345.6, "Type": "GreaterThanOrEqualTo"},
        {"LeftValue": {"Get": f"{final}['{nonfinite}'].Value"}, "RightValue": 0.0, "Type": "Equals"},
        {"LeftValue": {"Get": f"{final}['{memory}'].Value"}, "RightValue": 161.25, "Type": "LessThanOrEqualTo"},
        {"LeftValue": {"Get": f"{final}['{loss_drop}'].Value"}, "RightValue": 0.0, "Type": "GreaterThan"},
    ]
    # Every metric a condition reads is one the job's metric definitions capture from its log.
    captured = {item["Name"] for item in rehearse["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]}
    assert {throughput, nonfinite, memory, loss_drop} <= captured
    failed = steps[STEP_REHEARSAL_FAILED + suffix]["Arguments"]["ErrorMessage"]
    assert all(name in failed for name in (throughput, nonfinite, memory, loss_drop))
    job = rehearse["Arguments"]
    assert job["ResourceConfig"]["InstanceCount"] == 1 and "CheckpointConfig" not in job
    assert job["StoppingCondition"]["MaxRuntimeInSeconds"] == 5400 and not job.get("EnableManagedSpotTraining")
    assert job["TrainingJobName"] == f"{job_name_prefix(env.name, fc.STAGING.profiles[0])}-reh"
    assert {"Key": TAG_PURPOSE, "Value": PURPOSE_REHEARSAL} in job["Tags"]
    long_run = steps[STEP_TRAIN + suffix]["Arguments"]
    assert {key: value for key, value in job["HyperParameters"].items() if long_run["HyperParameters"][key] != value} \
        == {"job.max_steps": "60", "job.checkpoint_interval_steps": "1000000", "job.planned_data_parallel": ""}
    assert TAG_PURPOSE not in {tag["Key"] for tag in long_run["Tags"]} and "CheckpointConfig" in long_run


@pytest.mark.parametrize("suffix", ["", "OnPlan"])
def test_the_long_run_starts_on_the_rung_its_rehearsal_held(suffix: str) -> None:
    """With a knob ladder, the long run's job.start_rung is the rehearsal's train:knob_rung metric, which the
    rehearsal's metric definitions capture; the trainer reads the joined float back as a whole number."""
    from btk.hyperparameters import from_hyperparameters
    from btk.metrics import METRICS_BY_KEY
    from training_constructs.pipeline_definition import STEP_REHEARSE, RehearsalSpec

    knobs = TrainingKnobs(micro_batch_size=2, seq_len=fc.PROFILES[fc.STAGING.profiles[0]].training.seq_len)
    ladder = (knobs.model_copy(update={"micro_batch_size": 1, "gradient_accumulation_steps": 2}),)
    rehearsal = RehearsalSpec(nodes=1, steps=60, min_tokens_per_second_per_gpu=1.0, max_runtime_seconds=5400,
                              max_peak_memory_gib=161.25)
    steps = _steps_by_name(build_pipeline_definition(_spec(knobs=knobs, knob_ladder=ladder, rehearsal=rehearsal)))
    rung = METRICS_BY_KEY["knob_rung"].sagemaker_name
    long_run = steps[STEP_TRAIN + suffix]["Arguments"]["HyperParameters"]
    assert long_run["job.start_rung"] == {"Std:Join": {"On": "", "Values": [
        {"Get": f"Steps.{STEP_REHEARSE}{suffix}.FinalMetricDataList['{rung}'].Value"}]}}
    rehearse = steps[STEP_REHEARSE + suffix]["Arguments"]
    assert "job.start_rung" not in rehearse["HyperParameters"]
    assert rung in {item["Name"] for item in rehearse["AlgorithmSpecification"]["MetricDefinitions"]}
    held = {**long_run, "job.start_rung": "1.0", "train.total_tokens": ""}
    assert from_hyperparameters(held).job.start_rung == 1
    without_ladder = _steps_by_name(build_pipeline_definition(_spec(rehearsal=rehearsal)))
    assert "job.start_rung" not in without_ladder[STEP_TRAIN + suffix]["Arguments"]["HyperParameters"]


def test_without_a_rehearsal_step_the_caller_names_the_start_rung() -> None:
    """Where `btk rehearse` rehearsed on demand, the long run starts on the rung it held through the StartRung
    parameter (default 0: the plan's knobs); only where there is a ladder to start on."""
    from training_constructs.pipeline_definition import PARAM_START_RUNG

    knobs = TrainingKnobs(micro_batch_size=2, seq_len=fc.PROFILES[fc.STAGING.profiles[0]].training.seq_len)
    ladder = (knobs.model_copy(update={"micro_batch_size": 1, "gradient_accumulation_steps": 2}),)
    definition = build_pipeline_definition(_spec(knobs=knobs, knob_ladder=ladder))
    assert {"Name": PARAM_START_RUNG, "Type": "String", "DefaultValue": "0"} in json.loads(definition)["Parameters"]
    for suffix in ("", "OnPlan"):
        hyperparameters = _steps_by_name(definition)[STEP_TRAIN + suffix]["Arguments"]["HyperParameters"]
        assert hyperparameters["job.start_rung"] == {"Get": f"Parameters.{PARAM_START_RUNG}"}
    plain = json.loads(build_pipeline_definition(_spec()))
    assert PARAM_START_RUNG not in {parameter["Name"] for parameter in plain["Parameters"]}


def test_a_rehearsal_from_trained_weights_may_leave_the_loss_unchecked() -> None:
    from btk.metrics import METRICS_BY_KEY
    from training_constructs.pipeline_definition import STEP_REHEARSAL_GATE, RehearsalSpec

    rehearsal = RehearsalSpec(nodes=1, steps=60, min_tokens_per_second_per_gpu=1.0, max_runtime_seconds=5400,
                              max_peak_memory_gib=161.25, require_falling_loss=False)
    steps = _steps_by_name(build_pipeline_definition(_spec(rehearsal=rehearsal)))
    conditions = steps[STEP_REHEARSAL_GATE]["Arguments"]["Conditions"]
    assert len(conditions) == 3
    assert not any(METRICS_BY_KEY["loss_drop"].sagemaker_name in str(condition) for condition in conditions)


def test_without_a_rehearsal_the_long_run_follows_the_plan_check_directly() -> None:
    steps = _steps_by_name(build_pipeline_definition(_spec()))
    assert steps[STEP_TRAIN]["parents"] == ("CheckTrainingPlan:if",)
    assert not [name for name in steps if name.startswith("Rehears")]
