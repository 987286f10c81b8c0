"""AWS answers for ``btk doctor``, served by ``botocore.stub.Stubber`` on real botocore clients.

Every response passes through a Stubber, which validates it against botocore's service model
(and the client validates every request against it). The answers are kept by operation rather
than in one queue: :class:`StubbedAws` adds the answer to the Stubber just before each call
(``provide-client-params``), so a test says what AWS answers to each question, not in which
order the checks ask. Every call is recorded.

The response shapes follow the AWS API references of Service Quotas (ListServiceQuotas), SSM
(GetParameter), SageMaker (DescribeTrainingPlan, DescribePipeline), FSx
(DescribeFileSystems), CloudFormation (DescribeStacks, GetTemplate), ECR (DescribeImages),
SNS (ListSubscriptionsByTopic) and STS (GetCallerIdentity). Quota codes here are synthetic
(``L-`` and a hash of the name): real codes differ by quota and the doctor matches names.

A uniquely named module, not ``conftest``: ``from conftest import ...`` picks whichever
folder's conftest was loaded first when several test folders run in one pytest session.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import botocore.session
from botocore import xform_name
from botocore.stub import Stubber

from btk.doctor.bootstrap import version_parameter
from btk.doctor.checks import planned_jobs
from btk.doctor.quotas import GIB_PER_TIB, PlannedJob, instance_quota_name
from btk.environment import EnvironmentConfig
from btk.naming import pipeline_name

ACCOUNT = "123456789012"
REGION = "us-east-1"
CALLER_ARN = f"arn:aws:sts::{ACCOUNT}:assumed-role/btk-doctor/alice"
NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
BOOTSTRAP_VERSION = "30"
TOPIC_ARN = f"arn:aws:sns:{REGION}:{ACCOUNT}:TrainingStack-prod-ObservabilityTopic-abc"
IMAGE_TAG = "3047f73dc991440228db96e24305c907557b4026b052b2db4f50ffdf4f86bb8e"
#: The throttling code each service answers with (botocore's models; SNS's is its own).
THROTTLING = {
    "service-quotas": "TooManyRequestsException",
    "ssm": "ThrottlingException",
    "sagemaker": "ThrottlingException",
    "fsx": "ThrottlingException",
    "cloudformation": "Throttling",
    "ecr": "ThrottlingException",
    "sns": "Throttled",
    "sts": "Throttling",
}
#: The access-denied code each service answers with.
DENIED = {"cloudformation": "AccessDenied", "sns": "AuthorizationError"}


_planned = cache(lambda text: planned_jobs(EnvironmentConfig.model_validate_json(text)))


def jobs_of(env: EnvironmentConfig) -> tuple[PlannedJob, ...]:
    """``btk.doctor.checks.planned_jobs(env)``, computed once per configuration (the planner is deterministic)."""
    return _planned(env.model_dump_json())  # type: ignore[no-any-return]


#: One botocore session for every client: it loads each service model once.
_SESSION = botocore.session.get_session()


@dataclass(frozen=True)
class Error:
    """An error answer: its code, message and HTTP status."""

    code: str
    message: str = ""
    status: int = 400


Answer = dict[str, Any] | Error | Callable[[dict[str, Any]], "dict[str, Any] | Error"]


@dataclass
class StubbedAws:
    """Real botocore clients with dummy credentials, each wrapped in an active Stubber.

    ``answers[(service, Operation)]`` is a response, an :class:`Error`, or a function of the
    request's parameters returning either. ``calls`` records ``(service, Operation, params)``.
    """

    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    clients: dict[str, Any] = field(default_factory=dict)
    stubbers: dict[str, Stubber] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        if service not in self.clients:
            client = _SESSION.create_client(
                service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
            )
            stubber = Stubber(client)
            stubber.activate()
            client.meta.events.register("provide-client-params", self._hook(service, stubber))
            self.clients[service], self.stubbers[service] = client, stubber
        return self.clients[service]

    def _hook(self, service: str, stubber: Stubber) -> Callable[..., None]:
        def answer(params: dict[str, Any], model: Any, **_: Any) -> None:
            self.calls.append((service, model.name, dict(params)))
            if (service, model.name) not in self.answers:
                raise AssertionError(f"no answer for {service} {model.name} {params}")
            given = self.answers[(service, model.name)]
            result = given(params) if callable(given) else given
            method = xform_name(model.name)
            if isinstance(result, Error):
                stubber.add_client_error(
                    method, service_error_code=result.code, service_message=result.message,
                    http_status_code=result.status,
                )  # fmt: skip
            else:
                stubber.add_response(method, result)

        return answer

    def operations(self) -> list[tuple[str, str]]:
        """The distinct (service, Operation) pairs called, in first-call order."""
        return list(dict.fromkeys((service, operation) for service, operation, _ in self.calls))

    def done(self) -> None:
        for stubber in self.stubbers.values():
            stubber.assert_no_pending_responses()


def denied(service: str) -> Error:
    return Error(DENIED.get(service, "AccessDeniedException"), "User is not authorized to perform this action", 403)


def throttled(service: str) -> Error:
    return Error(THROTTLING[service], "Rate exceeded", 400)


def once_throttled(service: str, answer: Answer) -> Answer:
    """``answer``, after one throttling error per distinct request."""
    seen: set[str] = set()

    def respond(params: dict[str, Any]) -> dict[str, Any] | Error:
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            return throttled(service)
        return answer(params) if callable(answer) else answer

    return respond


# --------------------------------------------------------------------------- Service Quotas


def quota(name: str, value: float, *, service: str = "sagemaker", adjustable: bool = True) -> dict[str, Any]:
    code = "L-" + hashlib.sha256(name.encode()).hexdigest()[:8].upper()
    return {
        "ServiceCode": service,
        "ServiceName": "Amazon SageMaker" if service == "sagemaker" else "Amazon FSx",
        "QuotaArn": f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:{service}/{code}",
        "QuotaCode": code,
        "QuotaName": name,
        "Value": float(value),
        "Unit": "None",
        "Adjustable": adjustable,
        "GlobalQuota": False,
    }


def quota_code(name: str) -> str:
    return str(quota(name, 0)["QuotaCode"])


def training_quotas(env: EnvironmentConfig, jobs: tuple[PlannedJob, ...], *, spare: int = 0) -> dict[str, float]:
    """SageMaker training quotas with room for every planned job at once, plus ``spare`` instances."""
    every = sum(job.instance_count for job in jobs) + spare
    values: dict[str, float] = {}
    for job in jobs:
        values[instance_quota_name(job.instance_type, spot=False)] = every
        values[instance_quota_name(job.instance_type, spot=True)] = every
    values.update(
        {
            "Maximum number of instances per training job": 20,
            "Maximum number of instances per spot training job": 20,
            "Number of instances across all training jobs": every,
            "Number of instances across all spot training jobs": every,
            "Longest run time for a training job": float(env.max_runtime_seconds),
            # One of the many quotas the doctor does not read, as every real listing has.
            "ml.p4d.24xlarge for endpoint usage": 0,
        }
    )
    return values


def fsx_quotas(storage_gib: float = 100_800, file_systems: float = 100) -> dict[str, float]:
    """FSx's Lustre Persistent_2 quotas (defaults: AWS's, per the FSx quota listing)."""
    return {"Lustre Persistent_2 storage capacity": storage_gib, "Lustre Persistent_2 file systems": file_systems}


def quota_listing(values: dict[str, float], service: str, page: int = 3) -> Callable[[dict[str, Any]], Any]:
    """ListServiceQuotas (or ListAWSDefaultServiceQuotas) of ``values``, ``page`` quotas a page."""
    items = [quota(name, value, service=service) for name, value in values.items()]

    def respond(params: dict[str, Any]) -> dict[str, Any]:
        assert params["ServiceCode"] == service
        start = int(params.get("NextToken", "0"))
        response: dict[str, Any] = {"Quotas": items[start : start + page]}
        if start + page < len(items):
            response["NextToken"] = str(start + page)
        return response

    return respond


def by_service(listings: dict[str, Callable[[dict[str, Any]], Any]]) -> Callable[[dict[str, Any]], Any]:
    return lambda params: listings[params["ServiceCode"]](params)


# --------------------------------------------------------------------------- the stack


def lustre_file_system(file_system_id: str, storage_gib: int, per_tib: int) -> dict[str, Any]:
    return {
        "OwnerId": ACCOUNT,
        "CreationTime": NOW - timedelta(days=30),
        "FileSystemId": file_system_id,
        "FileSystemType": "LUSTRE",
        "Lifecycle": "AVAILABLE",
        "StorageCapacity": storage_gib,
        "StorageType": "SSD",
        "SubnetIds": ["subnet-0123456789abcdef0"],
        "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": per_tib},
    }


def image_uri(env: EnvironmentConfig, tag: str = IMAGE_TAG) -> str:
    repository = f"cdk-{env.bootstrap_qualifier}-container-assets-{ACCOUNT}-{env.region}"
    return f"{ACCOUNT}.dkr.ecr.{env.region}.amazonaws.com/{repository}:{tag}"


def stack(env: EnvironmentConfig, status: str = "UPDATE_COMPLETE", **outputs: str) -> dict[str, Any]:
    values = {"ImageUri": image_uri(env), "FailureTopicArn": TOPIC_ARN, **outputs}
    return {
        "Stacks": [
            {
                "StackId": f"arn:aws:cloudformation:{env.region}:{ACCOUNT}:stack/{env.stack_name}/abc",
                "StackName": env.stack_name,
                "CreationTime": NOW - timedelta(days=30),
                "StackStatus": status,
                "Outputs": [{"OutputKey": key, "OutputValue": value} for key, value in values.items()],
                "DriftInformation": {"StackDriftStatus": "NOT_CHECKED"},
            }
        ]
    }


MISSING_STACK = Error("ValidationError", "Stack with id TrainingStack-x does not exist")


def definition_parts(env: EnvironmentConfig, profile: str, instance_count: int) -> list[Any]:
    """A pipeline definition as the template's ``Fn::Join`` holds it (the shape synth writes, abridged)."""
    head = {
        "Version": "2020-12-01",
        "Parameters": [{"Name": "InstanceCount", "Type": "Integer", "DefaultValue": instance_count}],
        "Steps": [
            {
                "Name": "Train",
                "Type": "Training",
                "Arguments": {
                    "AlgorithmSpecification": {"TrainingImage": "@IMAGE@", "TrainingInputMode": "File"},
                    "CheckpointConfig": {"S3Uri": "s3://@BUCKET@/checkpoints/" + profile},
                    "ResourceConfig": {"InstanceCount": {"Get": "Parameters.InstanceCount"}, "VolumeSizeInGB": 100},
                    "EnableManagedSpotTraining": env.managed_spot,
                },
            }
        ],
    }
    text = json.dumps(head, separators=(",", ":"))
    before_image, rest = text.split("@IMAGE@")
    before_bucket, after_bucket = rest.split("@BUCKET@")
    image = {"Fn::Sub": image_uri(env).replace(f".{env.region}.amazonaws.com", f".{env.region}.${{AWS::URLSuffix}}")}
    return [before_image, image, before_bucket, {"Ref": "DataStageCheckpointsA40A0B9B"}, after_bucket]


def template(env: EnvironmentConfig, counts: dict[str, int]) -> dict[str, Any]:
    """A template holding one pipeline per profile in ``counts`` (profile -> planned instances)."""
    resources = {
        f"Pipeline{i}": {
            "Type": "AWS::SageMaker::Pipeline",
            "Properties": {
                "PipelineName": pipeline_name(env.name, profile),
                "PipelineDefinition": {"PipelineDefinitionBody": {"Fn::Join": ["", definition_parts(env, profile, n)]}},
                "RoleArn": {"Fn::GetAtt": ["PipelineRole", "Arn"]},
            },
        }
        for i, (profile, n) in enumerate(counts.items())
    }
    return {"Resources": resources}


CHECKPOINT_BUCKET = "trainingstack-datastagecheckpoints-1a2b3c"


def resolved(parts: list[Any], env: EnvironmentConfig) -> str:
    """The definition text CloudFormation hands SageMaker: each token resolved."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif "Fn::Sub" in part:
            out.append(part["Fn::Sub"].replace("${AWS::URLSuffix}", "amazonaws.com"))
        else:
            out.append(CHECKPOINT_BUCKET)
    return "".join(out)


def described_pipeline(env: EnvironmentConfig, profile: str, definition: str) -> dict[str, Any]:
    name = pipeline_name(env.name, profile)
    return {
        "PipelineArn": f"arn:aws:sagemaker:{env.region}:{ACCOUNT}:pipeline/{name}",
        "PipelineName": name,
        "PipelineDefinition": definition,
        "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/TrainingStack-PipelineRole",
        "PipelineStatus": "Active",
        "CreationTime": NOW - timedelta(days=30),
        "LastModifiedTime": NOW - timedelta(days=2),
    }


# --------------------------------------------------------------------------- a whole account


def healthy_account(
    env: EnvironmentConfig, jobs: tuple[PlannedJob, ...], *, deployed: bool = True, other_gib: int = 2400
) -> StubbedAws:
    """An account where every check of ``env`` passes: the answers AWS gives a well-prepared account."""
    aws = StubbedAws()
    counts = {job.profile: job.instance_count for job in jobs}
    aws.answers[("sts", "GetCallerIdentity")] = {"UserId": "AROAEXAMPLE:alice", "Account": ACCOUNT, "Arn": CALLER_ARN}
    listings = {
        "sagemaker": quota_listing(training_quotas(env, jobs), "sagemaker"),
        "fsx": quota_listing(fsx_quotas(), "fsx"),
    }
    aws.answers[("service-quotas", "ListServiceQuotas")] = by_service(listings)
    # AWS's defaults: 0 instances of a large GPU type (the failure this command exists for).
    defaults = {name: 0.0 if "usage" in name else value for name, value in training_quotas(env, jobs).items()}
    default_listings = {"sagemaker": quota_listing(defaults, "sagemaker"), "fsx": quota_listing(fsx_quotas(), "fsx")}
    aws.answers[("service-quotas", "ListAWSDefaultServiceQuotas")] = by_service(default_listings)
    aws.answers[("ssm", "GetParameter")] = {
        "Parameter": {
            "Name": version_parameter(env.bootstrap_qualifier),
            "Type": "String",
            "Value": BOOTSTRAP_VERSION,
            "Version": 1,
            "ARN": f"arn:aws:ssm:{env.region}:{ACCOUNT}:parameter{version_parameter(env.bootstrap_qualifier)}",
            "DataType": "text",
        }
    }
    own = lustre_file_system(
        "fs-0own0000000000000", env.data_stage.fsx_storage_capacity_gib, env.data_stage.fsx_throughput_per_tib
    )
    others = [lustre_file_system("fs-0other000000000000", other_gib, 250)]
    aws.answers[("fsx", "DescribeFileSystems")] = {"FileSystems": ([own] if deployed else []) + others}
    if not deployed:
        aws.answers[("cloudformation", "DescribeStacks")] = MISSING_STACK
        return aws
    outputs = {"FileSystemId": own["FileSystemId"]} if env.data_stage.mode == "fsx" else {}
    aws.answers[("cloudformation", "DescribeStacks")] = stack(env, **outputs)
    deployed_template = template(env, counts)
    aws.answers[("cloudformation", "GetTemplate")] = {"TemplateBody": json.dumps(deployed_template)}
    definitions = {
        pipeline_name(env.name, profile): described_pipeline(
            env, profile, resolved(definition_parts(env, profile, n), env)
        )
        for profile, n in counts.items()
    }
    aws.answers[("sagemaker", "DescribePipeline")] = lambda params: definitions.get(
        params["PipelineName"], Error("ResourceNotFound", f"Pipeline {params['PipelineName']} does not exist")
    )
    aws.answers[("ecr", "DescribeImages")] = lambda params: {
        "imageDetails": [
            {
                "registryId": params["registryId"],
                "repositoryName": params["repositoryName"],
                "imageDigest": "sha256:" + "0" * 64,
                "imageTags": [params["imageIds"][0]["imageTag"]],
                "imageSizeInBytes": 9_876_543_210,
                "imagePushedAt": NOW - timedelta(days=2),
            }
        ]
    }
    aws.answers[("sns", "ListSubscriptionsByTopic")] = {
        "Subscriptions": [
            {
                "SubscriptionArn": f"{TOPIC_ARN}:1f2e3d4c-0000-4000-8000-000000000001",
                "Owner": ACCOUNT,
                "Protocol": "email",
                "Endpoint": "ml-team@example.com",
                "TopicArn": TOPIC_ARN,
            }
        ]
    }
    return aws


def gib_to_mbps(storage_gib: int, per_tib: int) -> float:
    return storage_gib / GIB_PER_TIB * per_tib


def doctor(
    env_name: str,
    aws: StubbedAws,
    capsys: Any = None,
    *,
    output_format: str = "table",
    cloud_assembly: Any = None,
    lookup_role: bool = False,
    sleeps: list[float] | None = None,
) -> tuple[int, list[str]]:
    """``btk doctor --env env_name`` against ``aws`` at :data:`NOW`: the exit code and the lines printed.

    Without ``capsys`` (outside a test function) stdout is captured here.
    """
    import argparse
    import contextlib
    import io

    from btk.cli.doctor import run_doctor

    args = argparse.Namespace(
        env=env_name, cloud_assembly=cloud_assembly, output_format=output_format, lookup_role=lookup_role
    )
    recorded = sleeps if sleeps is not None else []
    if capsys is None:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = run_doctor(args, clients=aws.client, now=NOW, sleep=recorded.append)
        return code, buffer.getvalue().splitlines()
    code = run_doctor(args, clients=aws.client, now=NOW, sleep=recorded.append)
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, captured.out.splitlines()


def findings_of(lines: list[str]) -> dict[str, str]:
    """The check lines by check name (``PASS quota 'x': ...`` -> ``{"quota 'x'": "PASS quota 'x': ..."}``)."""
    found = {}
    for line in lines[1:-1]:
        status, rest = line.split(" ", 1)
        assert status in ("PASS", "WARN", "FAIL"), line
        found[rest.split(": ", 1)[0]] = line
    return found


def variant(env: EnvironmentConfig, **update: Any) -> EnvironmentConfig:
    """``env`` with ``update`` applied, validated like environments.py's own (the name's qualifier follows it)."""
    values = {key: value for key, value in env.model_dump().items() if key != "bootstrap_qualifier"}
    return EnvironmentConfig.model_validate({**values, **update})
