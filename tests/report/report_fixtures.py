"""A recorded-shaped SageMaker history for ``btk report`` tests, queued on a botocore Stubber.

Environment ``dev``, profiles ``llama3.2-1b`` (pipeline alive, 5 executions over 3 pages)
and ``llama3.2-3b`` (pipeline deleted: its 6 jobs are found by their tags). The shapes
follow real DescribeTrainingJob / DescribeTrainingPlan / ListPipelineExecutions /
ListPipelineExecutionSteps / Search responses (the Stubber validates every request and
response against the SageMaker service model). All jobs run on ml.p6-b200.48xlarge
(8 GPUs, catalog price 113.93 USD per instance-hour).

| job | profile | what happens                                   | instances | billable s | wait s |
|-----|---------|------------------------------------------------|-----------|------------|--------|
| J1  | 1b      | completed, on demand                           | 1         | 7200       | 360    |
| J2  | 1b      | completed, managed spot, interrupted once      | 1         | 3600/10800 | 5400   |
| J3  | 1b      | failed: CUDA out of memory                     | 1         | 600        | 300    |
| J4  | 1b      | failed: CapacityError, never started           | 1         | (none)     | 7200   |
| J5  | 1b      | in progress, still Starting (since 2 h)        | 1         | (none)     | 7200   |
| J6  | 3b      | completed on training plan (4800 USD, 24h x 2) | 2         | 36000      | 4200   |
| J7  | 3b      | failed: NCCL / EFA (NET/OFI)                   | 2         | 1800       | 600    |
| J8  | 3b      | failed: ClientError (data download)            | 1         | 120        | 240    |
| J9  | 3b      | failed: InternalServerError                    | 1         | 300        | 300    |
| J10 | 3b      | stopped by the user                            | 1         | 900        | 300    |
| J11 | 3b      | completed, started by hand: no knobs, no metrics | 1       | 3600       | 180    |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import fixture_catalog

from btk.hyperparameters import JobHyperparameters, JobSettings, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture
from btk.report.collect import pipeline_name, search_expression
from btk.report.predict import Prediction, PredictionUnavailableError

ACCOUNT = "123456789012"
REGION = "us-east-1"
ENV = "dev"
PROFILES = ("llama3.2-1b", "llama3.2-3b")
NOW = datetime(2025, 7, 1, 12, 0, tzinfo=UTC)
SINCE = NOW - timedelta(days=30)  # --since 30d
INSTANCE = "ml.p6-b200.48xlarge"
PLAN_NAME = "dev-b200-june"
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/{PLAN_NAME}"
PIPELINE_ARN_PREFIX = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/TrainingStack-dev-SageMakerTrainingRole"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/btk-trainer:0.1.0"

KNOBS_1B = TrainingKnobs(micro_batch_size=8, gradient_accumulation_steps=1, seq_len=8192, precision="mxfp8")
KNOBS_1B_OOM = TrainingKnobs(micro_batch_size=32, seq_len=8192, precision="bf16", compile=False, fused_loss=False)
KNOBS_3B = TrainingKnobs(micro_batch_size=4, gradient_accumulation_steps=2, seq_len=8192, precision="mxfp8")

# The planner's (fake, fixed) predictions, by (profile, nodes): tokens/s per GPU and MFU.
PREDICTIONS = {
    ("llama3.2-1b", 1): Prediction(32000.0, 0.44, peak_memory_gib=96.5, fits=True),
    ("llama3.2-3b", 2): Prediction(15000.0, 0.45, peak_memory_gib=120.25, fits=True),
    ("llama3.2-3b", 1): Prediction(16000.0, 0.46, peak_memory_gib=131.0, fits=True),
}


@dataclass
class FakePredictor:
    """Fixed predictions; records every call so tests can check what the report asked."""

    calls: list[tuple[str, str, int, TrainingKnobs, ModelArchitecture | None]] = field(default_factory=list)

    def __call__(
        self, profile: str, instance_type: str, nodes: int, knobs: TrainingKnobs, architecture: ModelArchitecture | None
    ) -> Prediction:
        self.calls.append((profile, instance_type, nodes, knobs, architecture))
        try:
            return PREDICTIONS[(profile, nodes)]
        except KeyError:
            raise PredictionUnavailableError(f"no prediction for {profile} on {nodes} nodes") from None


def june(day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2025, 6, day, hour, minute, tzinfo=UTC)


def hyperparameters(profile: str, knobs: TrainingKnobs) -> dict[str, str]:
    spec = fixture_catalog.PROFILES[profile]
    return to_hyperparameters(
        JobHyperparameters(
            knobs=knobs, architecture=spec.architecture, training=spec.training, job=JobSettings(profile=profile)
        )
    )


def job_arn(name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"


def checkpoint_uri(profile: str, execution: str) -> str:
    return f"s3://btk-dev-checkpoints-{ACCOUNT}/checkpoints/{profile}/{execution}"


def transitions(start: datetime, *phases: tuple[str, int | None, str]) -> list[dict[str, Any]]:
    """SecondaryStatusTransitions from (status, minutes, message); minutes None = still in it."""
    result = []
    moment = start
    for status, minutes, message in phases:
        item: dict[str, Any] = {"Status": status, "StartTime": moment, "StatusMessage": message}
        if minutes is not None:
            moment = moment + timedelta(minutes=minutes)
            item["EndTime"] = moment
        result.append(item)
    return result


STARTING = "Preparing the instances for training"
DOWNLOADING = "Downloading the training image"
TRAINING = "Training image download completed. Training in progress."
UPLOADING = "Uploading generated training model"


def metrics(tokens: float, mfu: float, when: datetime) -> list[dict[str, Any]]:
    return [
        {"MetricName": "train:step", "Value": 500.0, "Timestamp": when},
        {"MetricName": "train:loss", "Value": 2.5125, "Timestamp": when},
        {"MetricName": "train:tokens_per_second_per_gpu", "Value": tokens, "Timestamp": when},
        {"MetricName": "train:mfu", "Value": mfu, "Timestamp": when},
        {"MetricName": "train:peak_memory_gib", "Value": 101.75, "Timestamp": when},
    ]


def describe(
    name: str,
    *,
    profile: str,
    status: str,
    secondary: str,
    created: datetime,
    phases: list[dict[str, Any]],
    knobs: TrainingKnobs | None,
    instance_count: int = 1,
    training_seconds: int | None = None,
    billable_seconds: int | None = None,
    failure_reason: str | None = None,
    final_metrics: list[dict[str, Any]] | None = None,
    spot: bool = False,
    plan_arn: str | None = None,
    execution: str | None = None,
) -> dict[str, Any]:
    """A DescribeTrainingJob response as SageMaker returns it for a btk pipeline job.

    ``execution``: the pipeline execution id in the job's checkpoint prefix (every job of an
    execution, retries included, shares it); None for a job without checkpoints.
    """
    resource: dict[str, Any] = {"InstanceType": INSTANCE, "InstanceCount": instance_count, "VolumeSizeInGB": 500}
    if plan_arn:
        resource["TrainingPlanArn"] = plan_arn
    response: dict[str, Any] = {
        "TrainingJobName": name,
        "TrainingJobArn": job_arn(name),
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://btk-dev-artifacts-{ACCOUNT}/models/{name}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "HyperParameters": hyperparameters(profile, knobs)
        if knobs
        else {"epochs": "1", "sagemaker_program": "train.py"},
        "AlgorithmSpecification": {
            "TrainingImage": IMAGE,
            "TrainingInputMode": "FastFile",
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": ROLE_ARN,
        "OutputDataConfig": {"S3OutputPath": f"s3://btk-dev-artifacts-{ACCOUNT}/models/"},
        "ResourceConfig": resource,
        "StoppingCondition": {"MaxRuntimeInSeconds": 259200, **({"MaxWaitTimeInSeconds": 345600} if spot else {})},
        "CreationTime": created,
        "LastModifiedTime": phases[-1].get("EndTime", phases[-1]["StartTime"]),
        "SecondaryStatusTransitions": phases,
        "EnableNetworkIsolation": False,
        "EnableInterContainerTrafficEncryption": False,
        "EnableManagedSpotTraining": spot,
    }
    if execution is not None:
        response["CheckpointConfig"] = {"S3Uri": checkpoint_uri(profile, execution), "LocalPath": "/opt/ml/checkpoints"}
    if status != "InProgress":
        response["TrainingEndTime"] = phases[-1]["StartTime"]
    if failure_reason:
        response["FailureReason"] = failure_reason
    if training_seconds is not None:
        response["TrainingTimeInSeconds"] = training_seconds
    if billable_seconds is not None:
        response["BillableTimeInSeconds"] = billable_seconds
    if final_metrics:
        response["FinalMetricDataList"] = final_metrics
    return response


OOM_REASON = (
    'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "torch.OutOfMemoryError: CUDA out of memory. '
    'Tried to allocate 7.83 GiB. GPU 3 has a total capacity of 178.35 GiB of which 2.11 GiB is free."\n'
    'Command "/usr/bin/python3 -m btk_trainer", exit code: 1'
)
CAPACITY_REASON = (
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type."
)
NCCL_REASON = (
    'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "torch.distributed.DistBackendError: NCCL error '
    "in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited or there was a network "
    "error, NCCL version 2.26.2\nncclRemoteError: A call failed possibly due to a network error or a remote process "
    "exiting prematurely.\nLast error:\nNET/OFI Request completed with error. RC: 21. "
    'Error: 12 (Cannot allocate memory)"'
)
USER_REASON = (
    "ClientError: Data download failed:NoSuchKey (404): The specified key does not exist. "
    f"s3://btk-dev-data-{ACCOUNT}/datasets/fineweb-edu/shard-00000.bin"
)
OTHER_REASON = "InternalServerError: We encountered an internal error. Please try again."


def jobs() -> dict[str, dict[str, Any]]:
    """The eleven DescribeTrainingJob responses, by job name (J1..J11 of the module table)."""
    j = {}
    j["J1"] = describe(
        "btk-dev-llama3-2-1b-j1",
        execution="e1",
        profile="llama3.2-1b",
        status="Completed",
        secondary="Completed",
        created=june(10, 8),
        knobs=KNOBS_1B,
        training_seconds=7200,
        billable_seconds=7200,
        phases=transitions(
            june(10, 8),
            ("Starting", 6, STARTING),
            ("Downloading", 4, DOWNLOADING),
            ("Training", 120, TRAINING),
            ("Uploading", 2, UPLOADING),
            ("Completed", None, "Training job completed"),
        ),
        final_metrics=metrics(30400.0, 0.41, june(10, 10, 10)),
    )
    j["J2"] = describe(
        "btk-dev-llama3-2-1b-j2",
        execution="e2",
        profile="llama3.2-1b",
        status="Completed",
        secondary="Completed",
        created=june(12),
        knobs=KNOBS_1B,
        training_seconds=10800,
        billable_seconds=3600,
        spot=True,
        phases=transitions(
            june(12),
            ("Starting", 30, "Insufficient capacity error from EC2 while launching instances, retrying!"),
            ("Downloading", 5, DOWNLOADING),
            ("Training", 85, TRAINING),
            ("Interrupted", 1, "Training interrupted: spot instances reclaimed"),
            ("Starting", 60, "Insufficient capacity error from EC2 while launching instances, retrying!"),
            ("Training", 89, TRAINING),
            ("Uploading", 5, UPLOADING),
            ("Completed", None, "Training job completed"),
        ),
        final_metrics=metrics(31040.0, 0.40, june(12, 4, 30)),
    )
    j["J3"] = describe(
        "btk-dev-llama3-2-1b-j3",
        execution="e3",
        profile="llama3.2-1b",
        status="Failed",
        secondary="Failed",
        created=june(14),
        knobs=KNOBS_1B_OOM,
        training_seconds=600,
        billable_seconds=600,
        failure_reason=OOM_REASON,
        phases=transitions(
            june(14),
            ("Starting", 5, STARTING),
            ("Downloading", 3, DOWNLOADING),
            ("Training", 10, TRAINING),
            ("Failed", None, "Training job failed"),
        ),
    )
    j["J4"] = describe(
        "btk-dev-llama3-2-1b-j4",
        execution="e4",
        profile="llama3.2-1b",
        status="Failed",
        secondary="Failed",
        created=june(16),
        knobs=KNOBS_1B,
        failure_reason=CAPACITY_REASON,
        phases=transitions(
            june(16), ("Starting", 120, "Launching requested ML instances"), ("Failed", None, CAPACITY_REASON)
        ),
    )
    j["J5"] = describe(
        "btk-dev-llama3-2-1b-j5",
        execution="e5",
        profile="llama3.2-1b",
        status="InProgress",
        secondary="Starting",
        created=datetime(2025, 7, 1, 10, 0, tzinfo=UTC),
        knobs=KNOBS_1B,
        phases=transitions(datetime(2025, 7, 1, 10, 0, tzinfo=UTC), ("Starting", None, STARTING)),
    )
    j["J6"] = describe(
        "btk-dev-llama3-2-3b-j6",
        profile="llama3.2-3b",
        status="Completed",
        secondary="Completed",
        created=june(20),
        knobs=KNOBS_3B,
        instance_count=2,
        training_seconds=36000,
        billable_seconds=36000,
        plan_arn=PLAN_ARN,
        phases=transitions(
            june(20),
            ("Pending", 60, "Waiting for capacity in training plan dev-b200-june"),
            ("Starting", 10, STARTING),
            ("Downloading", 5, DOWNLOADING),
            ("Training", 600, TRAINING),
            ("Uploading", 5, UPLOADING),
            ("Completed", None, "Training job completed"),
        ),
        final_metrics=metrics(14000.0, 0.42, june(20, 11, 15)),
    )
    j["J7"] = describe(
        "btk-dev-llama3-2-3b-j7",
        profile="llama3.2-3b",
        status="Failed",
        secondary="Failed",
        created=june(22),
        knobs=KNOBS_3B,
        instance_count=2,
        training_seconds=1800,
        billable_seconds=1800,
        failure_reason=NCCL_REASON,
        phases=transitions(
            june(22),
            ("Starting", 10, STARTING),
            ("Downloading", 5, DOWNLOADING),
            ("Training", 30, TRAINING),
            ("Failed", None, "Training job failed"),
        ),
        final_metrics=metrics(12000.0, 0.36, june(22, 0, 44)),
    )
    j["J8"] = describe(
        "btk-dev-llama3-2-3b-j8",
        profile="llama3.2-3b",
        status="Failed",
        secondary="Failed",
        created=june(24),
        knobs=KNOBS_3B,
        training_seconds=120,
        billable_seconds=120,
        failure_reason=USER_REASON,
        phases=transitions(
            june(24),
            ("Starting", 4, STARTING),
            ("Downloading", 2, "Downloading input data"),
            ("Failed", None, "Training job failed"),
        ),
    )
    j["J9"] = describe(
        "btk-dev-llama3-2-3b-j9",
        profile="llama3.2-3b",
        status="Failed",
        secondary="Failed",
        created=june(26),
        knobs=KNOBS_3B,
        training_seconds=300,
        billable_seconds=300,
        failure_reason=OTHER_REASON,
        phases=transitions(
            june(26),
            ("Starting", 5, STARTING),
            ("Downloading", 5, DOWNLOADING),
            ("Training", 5, TRAINING),
            ("Failed", None, "Training job failed"),
        ),
    )
    j["J10"] = describe(
        "btk-dev-llama3-2-3b-j10",
        profile="llama3.2-3b",
        status="Stopped",
        secondary="Stopped",
        created=june(28),
        knobs=KNOBS_3B,
        training_seconds=900,
        billable_seconds=900,
        phases=transitions(
            june(28),
            ("Starting", 5, STARTING),
            ("Downloading", 5, DOWNLOADING),
            ("Training", 15, TRAINING),
            ("Stopping", 1, "Stopping the training job"),
            ("Stopped", None, "Training job stopped"),
        ),
        final_metrics=metrics(16400.0, 0.483, june(28, 0, 24)),
    )
    j["J11"] = describe(
        "manual-llama3-2-3b-j11",
        profile="llama3.2-3b",
        status="Completed",
        secondary="Completed",
        created=june(29),
        knobs=None,
        training_seconds=3600,
        billable_seconds=3600,
        phases=transitions(
            june(29),
            ("Starting", 3, STARTING),
            ("Downloading", 2, DOWNLOADING),
            ("Training", 60, TRAINING),
            ("Uploading", 1, UPLOADING),
            ("Completed", None, "Training job completed"),
        ),
    )
    return j


def execution_arn(profile: str, execution: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/{pipeline_name(ENV, profile)}/execution/{execution}"


def execution_summary(profile: str, execution: str, started: datetime, status: str) -> dict[str, Any]:
    return {
        "PipelineExecutionArn": execution_arn(profile, execution),
        "StartTime": started,
        "PipelineExecutionStatus": status,
        "PipelineExecutionDisplayName": f"execution-{execution}",
    }


def training_step(job: dict[str, Any], status: str) -> dict[str, Any]:
    step: dict[str, Any] = {
        "StepName": "Train",
        "StepDisplayName": "Train",
        "StartTime": job["CreationTime"],
        "StepStatus": status,
        "AttemptCount": 1,
        "Metadata": {"TrainingJob": {"Arn": job["TrainingJobArn"]}},
    }
    if "FailureReason" in job:
        step["FailureReason"] = job["FailureReason"]
    return step


def search_record(job: dict[str, Any], profile: str) -> dict[str, Any]:
    """A Search result: the TrainingJob record with the tags the pipeline sets."""
    record = {key: job[key] for key in ("TrainingJobName", "TrainingJobArn", "TrainingJobStatus", "CreationTime")}
    record["Tags"] = [
        {"Key": "btk:environment", "Value": ENV},
        {"Key": "btk:profile", "Value": profile},
        {"Key": "btk:instance-type", "Value": INSTANCE},
        {"Key": "project", "Value": "blackwell-training-kit"},
    ]
    return {"TrainingJob": record}


def plan_response() -> dict[str, Any]:
    return {
        "TrainingPlanArn": PLAN_ARN,
        "TrainingPlanName": PLAN_NAME,
        "Status": "Expired",
        "StatusMessage": "The training plan has expired",
        "DurationHours": 24,
        "DurationMinutes": 0,
        "StartTime": june(20),
        "EndTime": june(21),
        "UpfrontFee": "4800.00",
        "CurrencyCode": "USD",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 0,
        "InUseInstanceCount": 0,
        "TargetResources": ["training-job"],
        "ReservedCapacitySummaries": [
            {
                "ReservedCapacityArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:reserved-capacity/dev-b200-june-rc",
                "InstanceType": INSTANCE,
                "TotalInstanceCount": 2,
                "Status": "Expired",
                "AvailabilityZone": "us-east-1a",
                "DurationHours": 24,
                "DurationMinutes": 0,
                "StartTime": june(20),
                "EndTime": june(21),
            }
        ],
    }


def queue_pipeline(stubber: Any, j: dict[str, dict[str, Any]]) -> None:
    """Pipeline btk-dev-llama3-2-1b: five executions over three pages, newest first, with their steps."""
    one_b = PROFILES[0]
    executions = [
        ("e5", "J5", "Executing", "Executing"),
        ("e4", "J4", "Failed", "Failed"),
        ("e3", "J3", "Failed", "Failed"),
        ("e2", "J2", "Succeeded", "Succeeded"),
        ("e1", "J1", "Succeeded", "Succeeded"),
    ]
    pages = [executions[0:2], executions[2:4], executions[4:5]]
    for index, page in enumerate(pages):
        params: dict[str, Any] = {
            "PipelineName": pipeline_name(ENV, one_b),
            "CreatedAfter": SINCE,
            "SortBy": "CreationTime",
            "SortOrder": "Descending",
            "MaxResults": 100,
        }
        if index:
            params["NextToken"] = f"executions-page-{index + 1}"
        response: dict[str, Any] = {
            "PipelineExecutionSummaries": [
                execution_summary(one_b, execution, j[key]["CreationTime"], status)
                for execution, key, status, _ in page
            ]
        }
        if index < len(pages) - 1:
            response["NextToken"] = f"executions-page-{index + 2}"
        stubber.add_response("list_pipeline_executions", response, params)
    for execution, key, _, step_status in executions:
        steps = [training_step(j[key], step_status)]
        if key == "J4":  # a condition step before training: no training job in its metadata
            steps.insert(
                0,
                {
                    "StepName": "CheckBudget",
                    "StepStatus": "Succeeded",
                    "StartTime": j[key]["CreationTime"],
                    "Metadata": {"Condition": {"Outcome": "True"}},
                },
            )
        stubber.add_response(
            "list_pipeline_execution_steps",
            {"PipelineExecutionSteps": steps},
            {"PipelineExecutionArn": execution_arn(one_b, execution), "MaxResults": 100},
        )


def queue_history(stubber: Any, *, throttle_search: bool = True) -> dict[str, dict[str, Any]]:
    """Queue the whole scenario on ``stubber`` in the order ``collect`` makes its calls."""
    j = jobs()
    one_b, three_b = PROFILES
    queue_pipeline(stubber, j)
    # 2. Pipeline btk-dev-llama3-2-3b was deleted.
    stubber.add_client_error(
        "list_pipeline_executions",
        service_error_code="ResourceNotFound",
        http_status_code=400,
        service_message=f"Pipeline '{PIPELINE_ARN_PREFIX}/{pipeline_name(ENV, three_b)}' does not exist.",
        expected_params={
            "PipelineName": pipeline_name(ENV, three_b),
            "CreatedAfter": SINCE,
            "SortBy": "CreationTime",
            "SortOrder": "Descending",
            "MaxResults": 100,
        },
    )
    # 3. Tag search: two pages; the second is throttled once first.
    search = {
        "Resource": "TrainingJob",
        "SearchExpression": search_expression(ENV, SINCE, None),
        "SortBy": "CreationTime",
        "SortOrder": "Descending",
        "MaxResults": 100,
    }
    stubber.add_response(
        "search",
        {
            "Results": [search_record(j[key], three_b) for key in ("J11", "J10", "J9", "J8")]
            + [search_record(j["J1"], one_b)],
            "NextToken": "search-page-2",
        },
        search,
    )
    if throttle_search:
        stubber.add_client_error(
            "search",
            service_error_code="ThrottlingException",
            http_status_code=400,
            service_message="Rate exceeded",
            expected_params={**search, "NextToken": "search-page-2"},
        )
    stubber.add_response(
        "search",
        {"Results": [search_record(j[key], three_b) for key in ("J7", "J6")]},
        {**search, "NextToken": "search-page-2"},
    )
    # 4. DescribeTrainingJob, in discovery order: pipeline jobs newest first, then tag-only ones.
    for key in ("J5", "J4", "J3", "J2", "J1", "J11", "J10", "J9", "J8", "J7", "J6"):
        stubber.add_response("describe_training_job", j[key], {"TrainingJobName": j[key]["TrainingJobName"]})
    # 5. The training plan J6 ran on.
    stubber.add_response("describe_training_plan", plan_response(), {"TrainingPlanName": PLAN_NAME})
    return j


def queue_profile_history(stubber: Any) -> None:
    """``--profile llama3.2-1b``: its pipeline, a tag search narrowed to the profile, five describes."""
    j = jobs()
    queue_pipeline(stubber, j)
    search = {
        "Resource": "TrainingJob",
        "SearchExpression": search_expression(ENV, SINCE, PROFILES[0]),
        "SortBy": "CreationTime",
        "SortOrder": "Descending",
        "MaxResults": 100,
    }
    stubber.add_response("search", {"Results": [search_record(j[key], PROFILES[0]) for key in ("J2", "J1")]}, search)
    for key in ("J5", "J4", "J3", "J2", "J1"):
        stubber.add_response("describe_training_job", j[key], {"TrainingJobName": j[key]["TrainingJobName"]})


def stubbed_client() -> Any:
    """A real botocore SageMaker client with dummy credentials (never used: the Stubber answers)."""
    import botocore.session

    return botocore.session.get_session().create_client(
        "sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def fixture_report() -> Any:
    """The report of the whole scenario (what docs/report.md shows as its sample)."""
    from botocore.stub import Stubber

    from btk.report.aws import SageMakerReader
    from btk.report.collect import collect
    from btk.report.economics import build_report

    client = stubbed_client()
    with Stubber(client) as stubber:
        queue_history(stubber)
        collection = collect(
            SageMakerReader(client, sleep=lambda _: None), environment=ENV, profiles=PROFILES, since=SINCE
        )
        stubber.assert_no_pending_responses()
    return build_report(
        collection, environment=ENV, region=REGION, profiles=PROFILES, since=SINCE, now=NOW, predictor=FakePredictor()
    )
