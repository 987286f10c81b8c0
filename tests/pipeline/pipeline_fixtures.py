"""A small test stack for the pipeline and observability constructs, and template helpers.

The stack makes its own VPC, key, buckets, security group, execution role and (``fsx``
mode) file system, so these tests do not depend on TrainingStack. Token values resolve to
fixed fake values (:func:`resolve`), so definitions can be parsed and validated.
"""

from __future__ import annotations

import json
import os
from typing import Any

import cfn_fakes
from stack_synth import cli_app

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("AWS_REGION", "us-east-1")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAGEMAKER_VALIDATE_ROLE", "false")

from aws_cdk import App, Environment, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

from btk.environment import EnvironmentConfig
from stacks.training_stack import planned_profiles
from training_constructs.data_stage import DatasetsLocation
from training_constructs.locations import FileSystemLocation
from training_constructs.nag import apply_nag
from training_constructs.observability import TrainingObservability, TrainingObservabilityProps
from training_constructs.pipeline import PipelineResources, TrainingPipelines, TrainingPipelinesProps

# The shared fake values, read by the pipeline tests as fx.<NAME>.
ACCOUNT = cfn_fakes.ACCOUNT
REGION = cfn_fakes.REGION
FAKE_FILE_SYSTEM_ID = cfn_fakes.FAKE_FILE_SYSTEM_ID
FAKE_MOUNT_NAME = cfn_fakes.FAKE_MOUNT_NAME
FAKE_SUBNET = cfn_fakes.FAKE_SUBNET
FAKE_GROUP = cfn_fakes.FAKE_GROUP
FAKE_KEY_ARN = cfn_fakes.FAKE_KEY_ARN


class PipelineTestStack(Stack):
    """VPC, key, buckets, role (and FSx) plus the constructs under test."""

    def __init__(
        self,
        scope: App,
        env_config: EnvironmentConfig,
        *,
        data_preparation: bool = False,
        training_plan_arn: str | None = None,
    ) -> None:
        super().__init__(scope, f"PipelineTest-{env_config.name}", env=Environment(account=ACCOUNT, region=REGION))
        self.key = kms.Key(self, "Key", enable_key_rotation=True)
        vpc = ec2.Vpc(
            self,
            "Vpc",
            availability_zones=[env_config.availability_zone],
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="training", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            ],
        )
        vpc.add_flow_log("FlowLog")
        group = ec2.SecurityGroup(self, "Efa", vpc=vpc, allow_all_outbound=False)
        buckets = {
            name: s3.Bucket(
                self,
                name,
                encryption_key=self.key,
                enforce_ssl=True,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                server_access_logs_prefix="logs/",
                versioned=True,
            )
            for name in ("Datasets", "Checkpoints", "Artifacts")
        }
        self.execution_role = iam.Role(
            self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com")
        )
        location = None
        if env_config.data_stage.mode == "fsx":
            file_system = fsx.LustreFileSystem(
                self,
                "FileSystem",
                vpc=vpc,
                vpc_subnet=vpc.isolated_subnets[0],
                security_group=group,
                storage_capacity_gib=1200,
                kms_key=self.key,
                lustre_configuration=fsx.LustreConfiguration(
                    deployment_type=fsx.LustreDeploymentType.PERSISTENT_2, per_unit_storage_throughput=250
                ),
            )
            location = FileSystemLocation(
                file_system.file_system_id, file_system.mount_name, env_config.data_stage.fsx_directory
            )
        self.resources = PipelineResources(
            image_uri=f"{self.account}.dkr.ecr.{self.region}.{self.url_suffix}/btk-training:latest",
            execution_role=self.execution_role,
            key=self.key,
            subnets=vpc.isolated_subnets,
            security_groups=[group],
            datasets=DatasetsLocation(bucket=buckets["Datasets"], key=self.key),
            checkpoints_bucket=buckets["Checkpoints"],
            artifacts_bucket=buckets["Artifacts"],
            file_system=location,
        )
        self.pipelines = TrainingPipelines(
            self,
            "Pipelines",
            props=TrainingPipelinesProps(
                environment=env_config,
                profiles=planned_profiles(env_config),
                resources=self.resources,
                training_plan_arn=training_plan_arn,
                data_preparation=data_preparation,
            ),
        )
        self.observability = TrainingObservability(
            self,
            "Observability",
            props=TrainingObservabilityProps(
                environment=env_config,
                pipeline_names=self.pipelines.pipeline_names,
                job_name_prefixes={name: p.job_name_prefix for name, p in self.pipelines.pipelines.items()},
            ),
        )


def synth(env_config: EnvironmentConfig, **kwargs: Any) -> dict[str, Any]:
    """Synthesize the test stack with cdk-nag (unacknowledged findings fail) and return the template."""
    app = cli_app()
    apply_nag(app)
    stack = PipelineTestStack(app, env_config, **kwargs)
    app.synth()
    template: dict[str, Any] = Template.from_stack(stack).to_json()
    return template


def fake_value(template: dict[str, Any], logical_id: str, attribute: str | None) -> str:
    """A fixed, well-formed fake value for ``Ref``/``Fn::GetAtt`` of a resource."""
    return cfn_fakes.fake_value(template, logical_id, attribute)


def resolve(template: dict[str, Any], node: Any) -> Any:
    """Resolve ``Ref``, ``Fn::GetAtt`` and ``Fn::Join`` with fake values (definitions use no Fn::Sub)."""
    return cfn_fakes.resolve(template, node, allow_sub=False)


def pipelines(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Parsed pipeline definitions by pipeline name."""
    found: dict[str, dict[str, Any]] = {}
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::SageMaker::Pipeline":
            continue
        properties = resource["Properties"]
        body = resolve(template, properties["PipelineDefinition"]["PipelineDefinitionBody"])
        found[properties["PipelineName"]] = json.loads(body)
    return found


def raw_definitions(template: dict[str, Any]) -> dict[str, Any]:
    """Unresolved ``PipelineDefinitionBody`` values (for byte-for-byte comparison)."""
    return {
        resource["Properties"]["PipelineName"]: resource["Properties"]["PipelineDefinition"]
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::SageMaker::Pipeline"
    }


def all_steps(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every step by name, including those inside condition steps."""
    found: dict[str, dict[str, Any]] = {}

    def visit(steps: list[dict[str, Any]]) -> None:
        for step in steps:
            found[step["Name"]] = step
            if step["Type"] == "Condition":
                visit(step["Arguments"].get("IfSteps", []))
                visit(step["Arguments"].get("ElseSteps", []))

    visit(definition["Steps"])
    return found


def sample_parameters(definition: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """Typed sample values for every pipeline parameter (defaults, then ``overrides``)."""
    values: dict[str, Any] = {}
    for parameter in definition["Parameters"]:
        default = parameter.get("DefaultValue")
        values[parameter["Name"]] = default
    values.update(overrides)
    return values


def substitute(node: Any, parameters: dict[str, Any], execution_id: str = "abc123execution") -> Any:
    """Replace ``{"Get": "Parameters.X"}`` / execution variables / a previous job's metric / ``Std:Join`` with
    sample values."""
    if isinstance(node, list):
        return [substitute(item, parameters, execution_id) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Get"}:
        reference = node["Get"]
        if reference.startswith("Parameters."):
            return parameters[reference.removeprefix("Parameters.")]
        if reference == "Execution.PipelineExecutionId":
            return execution_id
        if reference.startswith("Steps.") and ".FinalMetricDataList[" in reference:
            return 0.0  # a metric a previous job reported (a float, as SageMaker keeps it)
        raise AssertionError(f"unknown reference {reference}")
    if set(node) == {"Std:Join"}:
        join = node["Std:Join"]
        return join["On"].join(str(substitute(value, parameters, execution_id)) for value in join["Values"])
    return {key: substitute(value, parameters, execution_id) for key, value in node.items()}
