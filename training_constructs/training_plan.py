"""``TrainingPlanReservation``: the environment's SageMaker training plan, as a custom resource.

Per ``EnvironmentConfig.capacity``:

- ``on_demand``: nothing is created and :attr:`TrainingPlanReservation.plan_arn` is None;
- ``existing``: a custom resource verifies the configured plan at deploy time (exists, targets
  training jobs, instance type, AZ, instance count); ``plan_arn`` is its ARN;
- ``reserve``: a custom resource finds the plan by its deterministic name or buys the best
  offering within ``max_upfront_fee`` in the environment's AZ, only with
  ``purchase_approved``; ``plan_arn`` is the custom resource's ``PlanArn`` attribute.

The handler (``lambda/training_plan/index.py``) runs under the CDK ``Provider`` framework. Its
asset is bundled locally (no Docker) with a copy of ``btk/capacity.py``, the one source of the
training-plan rules shared with ``btk capacity``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import (
    AssetHashType,
    BundlingOptions,
    CfnElement,
    CustomResource,
    DockerImage,
    Duration,
    ILocalBundling,
    Stack,
    Token,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from btk import capacity
from btk.environment import EnvironmentConfig, ExistingPlanCapacity, ReservePlanCapacity
from training_constructs.nag import acknowledge, acknowledge_wildcard_resources, finding_token
from training_constructs.removal import data_removal_policy
from training_constructs.retention import RETENTION_DAYS

HANDLER_DIR = Path(__file__).parent / "lambda" / "training_plan"
CAPACITY_MODULE = Path(capacity.__file__)
#: The latest Python runtime aws-cdk-lib 2.275 knows.
HANDLER_RUNTIME = lambda_.Runtime.PYTHON_3_14
#: Lambda's hard limit; the handler keeps a margin to answer CloudFormation.
HANDLER_TIMEOUT = Duration.minutes(15)
#: Describing a plan: all the handler does in ``existing`` mode.
DESCRIBE_PLAN_ACTION = "sagemaker:DescribeTrainingPlan"
#: Finding offerings and this account's plans: these act on no resource and accept only ``*``.
PLAN_LOOKUP_ACTIONS = ("sagemaker:SearchTrainingPlanOfferings", "sagemaker:ListTrainingPlans")
#: Buying and describing one plan: limited to this environment's plan names.
OWN_PLAN_ACTIONS = ("sagemaker:CreateTrainingPlan", DESCRIBE_PLAN_ACTION)
#: The only SageMaker actions the handler may call.
PLAN_ACTIONS = (*PLAN_LOOKUP_ACTIONS, *OWN_PLAN_ACTIONS)
#: How long Create waits for a bought plan to become Scheduled/Active, unless the props say otherwise.
DEFAULT_WAIT_TIMEOUT = Duration.minutes(10)


@jsii.implements(ILocalBundling)
class _CapacityBundle:
    """Local bundling: the handler directory plus ``btk/capacity.py`` as package ``btk``."""

    def try_bundle(self, output_dir: str, *args: Any, **kwargs: Any) -> bool:
        output = Path(output_dir)
        for source in sorted(HANDLER_DIR.glob("*.py")):
            shutil.copyfile(source, output / source.name)
        package = output / "btk"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text('"""btk.capacity only (bundled for the training-plan handler)."""\n')
        shutil.copyfile(CAPACITY_MODULE, package / "capacity.py")
        return True


def handler_code() -> lambda_.Code:
    """The handler asset; hashed on its bundled output, so a change to btk/capacity.py redeploys."""
    return lambda_.Code.from_asset(
        str(HANDLER_DIR),
        asset_hash_type=AssetHashType.OUTPUT,
        exclude=["__pycache__", "*.pyc"],
        bundling=BundlingOptions(
            image=DockerImage.from_registry("local-bundling-only"),
            local=_CapacityBundle(),
        ),
    )


def check_capacity(env_config: EnvironmentConfig, availability_zone: str | None = None) -> None:
    """Synth-time checks beyond ``EnvironmentConfig``'s own; raises ValueError with one line."""
    name = env_config.name
    if availability_zone is not None and availability_zone != env_config.availability_zone:
        raise ValueError(
            f"environment {name}: the network's AZ {availability_zone} is not availability_zone "
            f"{env_config.availability_zone}: a plan is bought in the environment's AZ, use one AZ for both"
        )
    if env_config.capacity.mode == "on_demand":
        return
    sellable = capacity.plan_instance_types()
    if sellable and env_config.instance_type not in sellable:
        raise ValueError(
            f"environment {name}: instance_type {env_config.instance_type} is not sold as a training plan: "
            "use capacity on_demand or a plan instance type such as ml.p6-b200.48xlarge"
        )
    reserve = env_config.capacity
    if isinstance(reserve, ReservePlanCapacity) and reserve.instance_count < env_config.instance_count:
        raise ValueError(
            f"environment {name}: capacity.instance_count {reserve.instance_count} is less than instance_count "
            f"{env_config.instance_count}: reserve at least as many instances as a job uses"
        )


#: checkov findings that do not apply to a custom-resource handler, with the reason.
CHECKOV_SKIPS = (
    ("CKV_AWS_115", "custom-resource handler runs once per deployment; reserving concurrency would fail in "
     "accounts with the minimum concurrency quota"),
    ("CKV_AWS_116", "invoked synchronously by CloudFormation/the Provider framework; a DLQ never receives events"),
    ("CKV_AWS_117", "calls only the SageMaker control-plane API; it reaches no resource inside the VPC"),
    ("CKV_AWS_173", "the only environment variable is the handler's function ARN, which is not secret"),
)


def _skip_checkov(*functions: Any) -> None:
    for function in functions:
        function.node.default_child.add_metadata(
            "checkov", {"skip": [{"id": rule, "comment": comment} for rule, comment in CHECKOV_SKIPS]}
        )


def _depend_on_policy_only(function: Any, role: iam.Role) -> None:
    """Keep the function's DependsOn on its role's policy, drop the one on the role.

    The role is already a dependency through ``Fn::GetAtt`` (cfn-lint W3005); the policy must
    stay, or the function could be invoked before it may call anything.
    """
    stack = Stack.of(function)
    policy = role.node.try_find_child("DefaultPolicy")
    resource = policy.node.default_child if policy is not None else None
    if isinstance(resource, CfnElement):
        function.node.default_child.add_override("DependsOn", [stack.get_logical_id(resource)])


@dataclass(frozen=True)
class TrainingPlanReservationProps:
    """Props of :class:`TrainingPlanReservation`.

    :param environment: the environment; its ``capacity`` picks the mode.
    :param log_key: KMS key of the handler's and the provider's log groups (required: logs are
        encrypted at rest with a customer key). Its policy must let
        ``logs.<region>.amazonaws.com`` use it for this account's log groups, as the stack's
        :class:`~training_constructs.data_stage.DataKey` does.
    :param availability_zone: the AZ of the network/file system this plan must serve.
        Default: None, i.e. ``environment.availability_zone``; a different value fails synth.
    :param wait_timeout: how long Create waits for a bought plan to become Scheduled/Active
        (at most the 15-minute Lambda limit less a margin). Default: None, i.e. 10 minutes.
    :param log_retention: retention of the handler's logs. Default: None, i.e.
        ``environment.log_retention_days``.
    """

    environment: EnvironmentConfig
    log_key: kms.IKey
    availability_zone: str | None = None
    wait_timeout: Duration | None = None
    log_retention: logs.RetentionDays | None = None


class TrainingPlanReservation(Construct):
    """The environment's training plan: none, a verified existing one, or one bought once.

    Attributes: ``plan_arn`` (None for on_demand; a token for reserve), ``plan_name`` (the
    deterministic name in reserve mode), ``handler`` / ``custom_resource`` (None for on_demand).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: TrainingPlanReservationProps) -> None:
        super().__init__(scope, construct_id)
        self._validate_props(props)
        env_config, log_key = props.environment, props.log_key
        stack = Stack.of(self)
        self.env_config = env_config
        self.mode = env_config.capacity.mode
        self.plan_arn: str | None = None
        self.plan_name: str | None = None
        self.handler: lambda_.Function | None = None
        self.custom_resource: CustomResource | None = None
        if self.mode == "on_demand":
            return

        wait = props.wait_timeout or DEFAULT_WAIT_TIMEOUT
        retention = props.log_retention or RETENTION_DAYS[env_config.log_retention_days]
        removal = data_removal_policy(env_config.retain_data)

        properties: dict[str, str] = {
            "Mode": self.mode,
            "InstanceType": env_config.instance_type,
            "AvailabilityZone": env_config.availability_zone,
            "WaitSeconds": str(int(wait.to_seconds())),
        }
        plan_resources: list[str]
        if isinstance(env_config.capacity, ExistingPlanCapacity):
            properties["PlanArn"] = env_config.capacity.plan_arn
            properties["InstanceCount"] = str(env_config.instance_count)
            plan_resources = [env_config.capacity.plan_arn]
        else:
            reserve = env_config.capacity
            assert isinstance(reserve, ReservePlanCapacity)
            request = capacity.reservation_request(env_config)
            self.plan_name = request.plan_name()
            properties.update(request.to_properties())
            properties["MaxUpfrontFee"] = repr(float(reserve.max_upfront_fee or 0))
            properties["PurchaseApproved"] = "true" if reserve.purchase_approved else "false"
            plan_resources = [
                stack.format_arn(
                    service="sagemaker",
                    resource="training-plan",
                    # exactly this environment's plan names: btk-<env>-<8 hex>, each ? one character
                    # (btk-<env>-* would also match the plans of an environment named <env>-<more>)
                    resource_name=capacity.plan_name_prefix(env_config.name) + "?" * capacity.PLAN_HASH_CHARS,
                )
            ]

        handler_logs = logs.LogGroup(
            self, "HandlerLogs", retention=retention, encryption_key=log_key, removal_policy=removal
        )
        role = iam.Role(
            self,
            "HandlerRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"training-plan custom resource of {env_config.name}: search/create/describe/list plans",
        )
        handler_logs.grant_write(role)
        if self.mode == "reserve":
            role.add_to_policy(
                iam.PolicyStatement(sid="SearchAndListPlans", actions=list(PLAN_LOOKUP_ACTIONS), resources=["*"])
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="BuyAndDescribeOwnPlans", actions=list(OWN_PLAN_ACTIONS), resources=plan_resources
                )
            )
        else:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="DescribeConfiguredPlan", actions=[DESCRIBE_PLAN_ACTION], resources=plan_resources
                )
            )

        self.handler = lambda_.Function(
            self,
            "Handler",
            runtime=HANDLER_RUNTIME,
            architecture=lambda_.Architecture.ARM_64,
            handler="index.on_event",
            code=handler_code(),
            timeout=HANDLER_TIMEOUT,
            memory_size=256,
            role=role,
            log_group=handler_logs,
            description=f"Verifies or buys the SageMaker training plan of {env_config.name} (never twice)",
        )
        provider_logs = logs.LogGroup(
            self, "ProviderLogs", retention=retention, encryption_key=log_key, removal_policy=removal
        )
        framework_role = iam.Role(
            self,
            "ProviderRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"CDK Provider framework onEvent of the {env_config.name} training-plan resource",
        )
        provider_logs.grant_write(framework_role)
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.handler,
            framework_on_event_role=framework_role,
            log_group=provider_logs,
        )
        self.custom_resource = CustomResource(
            self,
            "Resource",
            service_token=provider.service_token,
            resource_type="Custom::TrainingPlan",
            properties=properties,
        )
        self.plan_arn = self.custom_resource.get_att_string("PlanArn")
        self._plan_resources = plan_resources
        self._acknowledge(role, framework_role)
        framework = provider.node.find_child("framework-onEvent")
        _skip_checkov(self.handler, framework)
        _depend_on_policy_only(self.handler, role)
        _depend_on_policy_only(framework, framework_role)

    def _validate_props(self, props: TrainingPlanReservationProps) -> None:
        """Synth-time checks (capacity, region, wait), each failing with one line naming the prop."""
        env_config = props.environment
        try:
            check_capacity(env_config, props.availability_zone)
        except ValueError as error:
            raise ValueError(f"{self.node.path}: {error}") from None
        stack = Stack.of(self)
        if not Token.is_unresolved(stack.region) and stack.region != env_config.region:
            raise ValueError(f"{self.node.path}: stack region {stack.region} is not region {env_config.region}")
        wait = props.wait_timeout or DEFAULT_WAIT_TIMEOUT
        if env_config.capacity.mode != "on_demand" and wait.to_seconds() > HANDLER_TIMEOUT.to_seconds() - 60:
            raise ValueError(f"{self.node.path}: wait_timeout must be at most 14 minutes (Lambda limit 15)")

    def grant_describe(self, grantee: iam.IGrantable) -> iam.Grant | None:
        """Let ``grantee`` describe this plan (None for on_demand: there is no plan)."""
        if self.plan_arn is None:
            return None
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=[DESCRIBE_PLAN_ACTION], resource_arns=[self.plan_arn]
        )

    def _acknowledge(self, role: iam.Role, framework_role: iam.Role) -> None:
        assert self.handler is not None
        if self.mode == "reserve":
            acknowledge(
                role,
                "AwsSolutions-IAM5[Resource::*]",
                "SearchTrainingPlanOfferings and ListTrainingPlans act on no resource and accept only '*'",
            )
            acknowledge_wildcard_resources(
                role,
                [resource for resource in self._plan_resources if "*" in resource],
                "the plan's name is derived from its reservation inputs at deploy time; the role may only "
                f"create/describe plans named {capacity.plan_name_prefix(self.env_config.name)}<8 hex>",
            )
        acknowledge(
            framework_role,
            f"AwsSolutions-IAM5[Resource::{finding_token(self.handler.function_arn, self)}:*]",
            "the CDK Provider framework grants lambda:InvokeFunction on the handler and its versions "
            "(ARN suffix :*), nothing else",
        )
