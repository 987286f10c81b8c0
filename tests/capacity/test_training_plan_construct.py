"""TrainingPlanReservation: resources per mode, least-privilege role, bundled handler, cdk-nag."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import fixture_catalog
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template
from capacity_fixtures import ACCOUNT, REGION
from stack_synth import cli_app

from btk import capacity, pagination
from btk.environment import EnvironmentConfig, ExistingPlanCapacity, OnDemandCapacity, ReservePlanCapacity
from training_constructs.nag import apply_nag
from training_constructs.training_plan import (
    DEFAULT_WAIT_TIMEOUT,
    PLAN_ACTIONS,
    RESERVED_CAPACITY_ACTION,
    TAG_ACTION,
    TrainingPlanReservation,
    TrainingPlanReservationProps,
)

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

RESERVE = ReservePlanCapacity(
    start_after=datetime(2026, 3, 2, tzinfo=UTC),
    duration_hours=168,
    instance_count=2,
    max_upfront_fee=150000,
    purchase_approved=True,
)
EXISTING = ExistingPlanCapacity(plan_arn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/team-plan")


def environment(capacity_config: Any, **overrides: Any) -> EnvironmentConfig:
    values: dict[str, Any] = {
        "name": "prod",
        "availability_zone": "us-east-1a",
        "profiles": ("llama3.1-8b",),
        "instance_count": 2,
        "capacity": capacity_config,
    }
    values.update(overrides)
    return EnvironmentConfig(**values)


class Synth:
    def __init__(self, env_config: EnvironmentConfig, outdir: Path, nag: bool = True) -> None:
        self.app = cli_app(outdir=str(outdir))
        if nag:
            apply_nag(self.app)
        self.stack = cdk.Stack(self.app, "PlanTest", env=cdk.Environment(account=ACCOUNT, region=REGION))
        key = cdk.aws_kms.Key(self.stack, "LogKey", enable_key_rotation=True)
        self.plan = TrainingPlanReservation(
            self.stack, "Plan", props=TrainingPlanReservationProps(environment=env_config, log_key=key)
        )
        assembly = self.app.synth()  # raises when cdk-nag reports an unacknowledged finding
        self.outdir = Path(assembly.directory)
        self.template = Template.from_stack(self.stack)
        self.json: dict[str, Any] = self.template.to_json()

    def one_id(self, resource_type: str) -> str:
        found = [key for key, value in self.json["Resources"].items() if value["Type"] == resource_type]
        assert len(found) == 1, found
        return found[0]

    def resolve(self, value: Any) -> Any:
        return self.stack.resolve(value)

    def role_statements(self, role_id: str) -> list[dict[str, Any]]:
        role = self.plan.node.find_child(role_id)
        assert isinstance(role, iam.Role), role
        role_ref = self.resolve(role.role_name)
        statements: list[dict[str, Any]] = []
        for resource in self.json["Resources"].values():
            if resource["Type"] == "AWS::IAM::Policy" and role_ref in resource["Properties"]["Roles"]:
                statements.extend(resource["Properties"]["PolicyDocument"]["Statement"])
        return statements


@pytest.fixture(scope="module")
def reserve(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return Synth(environment(RESERVE), tmp_path_factory.mktemp("reserve"))


@pytest.fixture(scope="module")
def existing(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return Synth(environment(EXISTING), tmp_path_factory.mktemp("existing"))


def log_key(stack: cdk.Stack, key_id: str = "LogKey") -> cdk.aws_kms.Key:
    return cdk.aws_kms.Key(stack, key_id, enable_key_rotation=True)


def actions(statements: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for statement in statements:
        value = statement["Action"]
        found.update([value] if isinstance(value, str) else value)
    return found


def test_on_demand_creates_nothing_and_has_no_plan_arn(tmp_path: Path) -> None:
    synth = Synth(environment(OnDemandCapacity()), tmp_path)
    assert synth.plan.plan_arn is None and synth.plan.custom_resource is None and synth.plan.handler is None
    assert {r["Type"] for r in synth.json["Resources"].values()} == {"AWS::KMS::Key"}  # the test's own key


def test_reserve_custom_resource_carries_the_reservation_inputs(reserve: Synth) -> None:
    request = capacity.reservation_request(reserve.plan.env_config)
    reserve.template.resource_count_is("Custom::TrainingPlan", 1)
    reserve.template.has_resource_properties(
        "Custom::TrainingPlan",
        {
            **request.to_properties(),
            "Mode": "reserve",
            "MaxUpfrontFee": "150000.0",
            "PurchaseApproved": "true",
            "WaitSeconds": str(int(DEFAULT_WAIT_TIMEOUT.to_seconds())),
            "ServiceToken": Match.any_value(),
        },
    )
    assert reserve.plan.plan_name == request.plan_name()
    custom = reserve.plan.custom_resource
    assert custom is not None
    assert reserve.resolve(reserve.plan.plan_arn) == {
        "Fn::GetAtt": [reserve.stack.get_logical_id(custom.node.default_child), "PlanArn"]  # type: ignore[arg-type]
    }


def test_plan_actions_are_the_sagemaker_operations_btk_capacity_calls() -> None:
    """The handler's policy grants what the bundled ``btk/capacity.py`` calls, plus what a purchase
    needs on the caller's behalf (the reference check, tests/infra/test_permission_reference.py,
    derives those from AWS's Service Authorization Reference), and nothing else."""
    import re

    source = "\n".join(path.read_text() for path in sorted(Path(capacity.__file__).parent.glob("*.py")))
    operations = set(re.findall(r'_call\(client, "(\w+)"', source)) | set(re.findall(r"client\.(\w+)\(", source))
    called = {"sagemaker:" + "".join(part.capitalize() for part in name.split("_")) for name in operations}
    assert called == set(PLAN_ACTIONS) - {RESERVED_CAPACITY_ACTION, TAG_ACTION} == {
        "sagemaker:SearchTrainingPlanOfferings",
        "sagemaker:CreateTrainingPlan",
        "sagemaker:DescribeTrainingPlan",
        "sagemaker:ListTrainingPlans",
    }


def test_handlers_run_on_the_latest_python_and_the_waiter_runs_for_the_custom_resource_limit(reserve: Synth) -> None:
    for entry in ("index.on_event", "index.is_complete"):
        reserve.template.has_resource_properties(
            "AWS::Lambda::Function", {"Runtime": "python3.14", "Handler": entry, "Timeout": 300}
        )
    # The framework's waiter: isComplete every minute for an hour, CloudFormation's longest wait.
    definition = json.dumps(reserve.json["Resources"][reserve.one_id("AWS::StepFunctions::StateMachine")])
    assert '\\"IntervalSeconds\\":60' in definition and '\\"MaxAttempts\\":60' in definition
    reserve.template.has_resource_properties("Custom::TrainingPlan", {"ServiceTimeout": "3600"})


def test_reserve_role_may_only_search_create_describe_and_list_its_own_plans(reserve: Synth) -> None:
    statements = reserve.role_statements("HandlerRole")
    sagemaker = [s for s in statements if any(a.startswith("sagemaker:") for a in actions([s]))]
    assert actions(sagemaker) == set(PLAN_ACTIONS)
    assert actions(statements) - set(PLAN_ACTIONS) == {"logs:CreateLogStream", "logs:PutLogEvents"}
    by_sid = {s["Sid"]: s for s in sagemaker}
    assert by_sid["SearchAndListPlans"]["Resource"] == "*"
    # cdk.json's enablePartitionLiterals: the partition of a known region is written out.
    assert reserve.resolve(by_sid["BuyAndDescribeOwnPlans"]["Resource"]) == (
        f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/btk-prod-????????"
    )
    capacity_arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:reserved-capacity/*"
    assert reserve.resolve(by_sid["CreateThePlansReservedCapacity"]["Resource"]) == capacity_arn
    assert sorted(reserve.resolve(by_sid["TagThePlanAndItsCapacity"]["Resource"])) == sorted([
        reserve.resolve(by_sid["BuyAndDescribeOwnPlans"]["Resource"]),
        capacity_arn,
    ])
    assert all(s["Effect"] == "Allow" for s in statements)


@pytest.mark.parametrize("env_name", ["prod", "a--b", "ml-"])
def test_the_role_may_buy_exactly_the_environments_plan_names(tmp_path: Path, env_name: str) -> None:
    """IAM's ``?`` is one character: the pattern takes this env's plan names, not env ``<name>-x``'s."""
    synth = Synth(environment(RESERVE, name=env_name), tmp_path, nag=False)
    statement = next(s for s in synth.role_statements("HandlerRole") if s.get("Sid") == "BuyAndDescribeOwnPlans")
    pattern = synth.resolve(statement["Resource"]).rsplit("training-plan/", 1)[1]
    assert fnmatch.fnmatchcase(synth.plan.plan_name or "", pattern)
    longer = environment(RESERVE, name=env_name.rstrip("-") + "-x")
    assert not fnmatch.fnmatchcase(capacity.reservation_request(longer).plan_name(), pattern)


def test_existing_role_may_only_describe_the_configured_plan(existing: Synth) -> None:
    statements = existing.role_statements("HandlerRole")
    sagemaker = [s for s in statements if any(a.startswith("sagemaker:") for a in actions([s]))]
    assert sagemaker == [
        {
            "Action": "sagemaker:DescribeTrainingPlan",
            "Effect": "Allow",
            "Resource": EXISTING.plan_arn,
            "Sid": "DescribeConfiguredPlan",
        }
    ]
    assert existing.plan.plan_arn is not None
    existing.template.has_resource_properties(
        "Custom::TrainingPlan", {"Mode": "existing", "PlanArn": EXISTING.plan_arn, "InstanceCount": "2"}
    )


def test_provider_framework_roles_only_invoke_the_handlers_start_the_waiter_and_write_logs(reserve: Synth) -> None:
    assert actions(reserve.role_statements("ProviderRole")) == {
        "lambda:InvokeFunction",
        "lambda:GetFunction",
        "states:StartExecution",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }
    assert actions(reserve.role_statements("ProviderWaiterRole")) == {
        "lambda:InvokeFunction",
        "lambda:GetFunction",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }
    completion = [s for s in reserve.role_statements("CompletionRole") if s.get("Sid") == "DescribeOwnPlans"]
    assert [s["Action"] for s in completion] == ["sagemaker:DescribeTrainingPlan"]


def test_no_role_uses_a_managed_policy(reserve: Synth) -> None:
    roles = reserve.template.find_resources("AWS::IAM::Role")
    assert roles and all("ManagedPolicyArns" not in role["Properties"] for role in roles.values())


def test_lambdas_carry_checkov_skips_with_reasons(reserve: Synth) -> None:
    functions = reserve.template.find_resources("AWS::Lambda::Function")
    assert len(functions) == 5  # onEvent, isComplete, and the framework's onEvent, isComplete, onTimeout
    for function in functions.values():
        skips = function["Metadata"]["checkov"]["skip"]
        assert {skip["id"] for skip in skips} == {"CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117", "CKV_AWS_173"}
        assert all(len(skip["comment"]) > 30 for skip in skips)


def handler_asset(synth: Synth) -> Path:
    function = next(
        f
        for f in synth.template.find_resources("AWS::Lambda::Function").values()
        if f["Properties"]["Runtime"].startswith("python")
    )
    asset_hash = function["Properties"]["Code"]["S3Key"].removesuffix(".zip")
    return synth.outdir / f"asset.{asset_hash}"


def test_bundled_asset_holds_the_handler_and_byte_identical_capacity_and_pagination(reserve: Synth) -> None:
    asset = handler_asset(reserve)
    package = Path(capacity.__file__).parent
    modules = sorted(path.name for path in package.glob("*.py"))
    assert sorted(str(p.relative_to(asset)) for p in asset.rglob("*.py")) == [
        "btk/__init__.py",
        *(f"btk/capacity/{name}" for name in modules),
        "btk/pagination.py",
        "index.py",
    ]
    for name in modules:
        assert (asset / "btk" / "capacity" / name).read_bytes() == (package / name).read_bytes(), name
    assert (asset / "btk" / "pagination.py").read_bytes() == Path(pagination.__file__).read_bytes()


def test_bundled_handler_imports_without_pydantic_or_the_rest_of_btk(reserve: Synth) -> None:
    asset = handler_asset(reserve)
    probe = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import index; "
        "print(json.dumps({'capacity': index.capacity.__file__, "
        "'pydantic': 'pydantic' in sys.modules, 'btk': sorted(m for m in sys.modules if m.startswith('btk'))}))"
    )
    output = subprocess.run(
        [sys.executable, "-c", probe, str(asset)], check=True, capture_output=True, text=True, cwd=asset
    ).stdout
    result = json.loads(output)
    assert result["capacity"].startswith(str(asset))
    assert result["pydantic"] is False
    assert result["btk"] == ["btk", "btk.capacity"] + [
        f"btk.capacity.{path.stem}" for path in sorted(Path(capacity.__file__).parent.glob("*.py"))
        if path.stem != "__init__"
    ] + ["btk.pagination"]


def test_synth_is_deterministic(tmp_path: Path, reserve: Synth) -> None:
    again = Synth(environment(RESERVE), tmp_path, nag=False)
    assert again.json == reserve.json


def test_network_az_mismatch_fails_synth_with_one_line() -> None:
    stack = cdk.Stack(cli_app(), "S", env=cdk.Environment(account=ACCOUNT, region=REGION))
    with pytest.raises(ValueError) as raised:
        TrainingPlanReservation(
            stack,
            "Plan",
            props=TrainingPlanReservationProps(
                environment=environment(RESERVE), log_key=log_key(stack), availability_zone="us-east-1b"
            ),
        )
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "S/Plan: environment prod: the network's AZ us-east-1b is not availability_zone us-east-1a"
    )


def test_reserving_fewer_instances_than_a_job_uses_fails_synth() -> None:
    stack = cdk.Stack(cli_app(), "S")
    with pytest.raises(ValueError, match=r"capacity.instance_count 2 is less than instance_count 4: reserve at least"):
        TrainingPlanReservation(
            stack,
            "Plan",
            props=TrainingPlanReservationProps(
                environment=environment(RESERVE, instance_count=4), log_key=log_key(stack)
            ),
        )


def test_an_instance_type_not_sold_as_a_plan_fails_synth() -> None:
    stack = cdk.Stack(cli_app(), "S")
    with pytest.raises(ValueError, match=r"instance_type ml.g5.48xlarge is not sold as a training plan"):
        TrainingPlanReservation(
            stack,
            "Plan",
            props=TrainingPlanReservationProps(
                environment=environment(EXISTING, instance_type="ml.g5.48xlarge"), log_key=log_key(stack)
            ),
        )


def test_stack_in_another_region_fails_synth() -> None:
    stack = cdk.Stack(cli_app(), "S", env=cdk.Environment(account=ACCOUNT, region="us-west-2"))
    with pytest.raises(ValueError, match=r"stack region us-west-2 is not region us-east-1"):
        TrainingPlanReservation(
            stack, "Plan", props=TrainingPlanReservationProps(environment=environment(EXISTING), log_key=log_key(stack))
        )


def test_wait_timeout_beyond_the_custom_resource_limit_fails_synth() -> None:
    stack = cdk.Stack(cli_app(), "S")
    with pytest.raises(ValueError, match=r"wait_timeout must be more than 0 and at most 58 minutes"):
        TrainingPlanReservation(
            stack,
            "Plan",
            props=TrainingPlanReservationProps(
                environment=environment(RESERVE), log_key=log_key(stack), wait_timeout=cdk.Duration.minutes(59)
            ),
        )


def test_grant_describe_scopes_to_the_plan() -> None:
    stack = cdk.Stack(cli_app(), "S", env=cdk.Environment(account=ACCOUNT, region=REGION))
    on_demand = TrainingPlanReservation(
        stack,
        "OnDemand",
        props=TrainingPlanReservationProps(environment=environment(OnDemandCapacity()), log_key=log_key(stack)),
    )
    plan = TrainingPlanReservation(
        stack,
        "Plan",
        props=TrainingPlanReservationProps(environment=environment(EXISTING), log_key=log_key(stack, "Key2")),
    )
    role = cdk.aws_iam.Role(stack, "Jobs", assumed_by=cdk.aws_iam.ServicePrincipal("sagemaker.amazonaws.com"))
    assert on_demand.grant_describe(role) is None
    assert plan.grant_describe(role) is not None
    Template.from_stack(stack).has_resource_properties(
        "AWS::IAM::Policy",
        {
            "Roles": [{"Ref": stack.get_logical_id(role.node.default_child)}],  # type: ignore[arg-type]
            "PolicyDocument": {
                "Statement": [
                    {"Action": "sagemaker:DescribeTrainingPlan", "Effect": "Allow", "Resource": Match.any_value()}
                ]
            },
        },
    )


def test_plan_arn_becomes_the_default_of_the_pipelines_training_plan_parameter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_s3 as s3

    from btk.environment import DataStageConfig
    from stacks.training_stack import planned_profiles
    from training_constructs.data_stage import DatasetsLocation
    from training_constructs.pipeline import PipelineResources, TrainingPipelines, TrainingPipelinesProps
    from training_constructs.pipeline_definition import PARAM_TRAINING_PLAN_ARN

    fixture_catalog.install(monkeypatch)  # planned_profiles looks the profile up in the catalog
    env_config = environment(RESERVE, profiles=("llama3.2-1b",), data_stage=DataStageConfig(mode="s3"))
    stack = cdk.Stack(cli_app(), "Wired", env=cdk.Environment(account=ACCOUNT, region=REGION))
    key = kms.Key(stack, "Key")
    plan = TrainingPlanReservation(
        stack, "TrainingPlan", props=TrainingPlanReservationProps(environment=env_config, log_key=key)
    )
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        availability_zones=[env_config.availability_zone],
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="t", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)],
    )
    resources = PipelineResources(
        image_uri=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/btk-training:latest",
        execution_role=iam.Role(stack, "Exec", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com")),
        key=key,
        subnets=vpc.isolated_subnets,
        security_groups=[ec2.SecurityGroup(stack, "Sg", vpc=vpc)],
        datasets=DatasetsLocation(bucket=s3.Bucket(stack, "Datasets"), key=key),
        checkpoints_bucket=s3.Bucket(stack, "Checkpoints"),
        artifacts_bucket=s3.Bucket(stack, "Artifacts"),
    )
    TrainingPipelines(
        stack,
        "Pipelines",
        props=TrainingPipelinesProps(
            environment=env_config,
            profiles=planned_profiles(env_config),
            resources=resources,
            training_plan_arn=plan.plan_arn,
        ),
    )

    template = Template.from_stack(stack).to_json()
    custom_id = stack.get_logical_id(plan.custom_resource.node.default_child)  # type: ignore[union-attr,arg-type]
    bought = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/{plan.plan_name}"

    def fake(node: Any) -> Any:
        if isinstance(node, dict) and set(node) == {"Fn::GetAtt"}:
            return bought if node["Fn::GetAtt"] == [custom_id, "PlanArn"] else "x"
        if isinstance(node, dict) and set(node) == {"Ref"}:
            return "x"
        if isinstance(node, dict) and set(node) == {"Fn::Join"}:
            separator, parts = node["Fn::Join"]
            return separator.join(str(fake(part)) for part in parts)
        return node

    pipelines = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Pipeline"]
    assert len(pipelines) == 1
    body = json.loads(fake(pipelines[0]["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"]))
    parameter = next(p for p in body["Parameters"] if p["Name"] == PARAM_TRAINING_PLAN_ARN)
    assert parameter["DefaultValue"] == bought


def test_functions_depend_on_their_policy_and_the_template_passes_cfn_lint(reserve: Synth) -> None:
    functions = reserve.template.find_resources("AWS::Lambda::Function")
    policies = reserve.template.find_resources("AWS::IAM::Policy")
    for function in functions.values():
        (dependency,) = function["DependsOn"]
        assert dependency in policies
    template = reserve.outdir / "PlanTest.template.json"
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), str(template)], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout
