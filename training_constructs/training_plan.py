"""``TrainingPlanReservation``: the environment's SageMaker training plan, as a custom resource.

Per ``EnvironmentConfig.capacity``:

- ``on_demand``: nothing is created and :attr:`TrainingPlanReservation.plan_arn` is None;
- ``existing``: a custom resource verifies the configured plan at deploy time (exists, targets
  training jobs, instance type, AZ, instance count); ``plan_arn`` is its ARN;
- ``reserve``: a custom resource finds the plan by its deterministic name or buys the best
  offering within ``max_upfront_fee`` in the environment's AZ, only with
  ``purchase_approved``; ``plan_arn`` is the custom resource's ``PlanArn`` attribute. It is
  asynchronous: the purchase returns at once and an ``isComplete`` check polls the plan until
  its payment clears (Pending → Scheduled/Active), for up to an hour, the longest
  CloudFormation waits for a custom resource; a plan still Pending then completes the resource
  as Pending rather than rolling the stack back.

The handlers (``lambda/training_plan/index.py``) run under the CDK ``Provider`` framework. Their
asset is bundled locally (no Docker) with a copy of the ``btk/capacity`` package, the one source of the
training-plan rules shared with ``btk capacity``, and of ``btk/pagination.py``, which it reads AWS's
answers with.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import (
    AssetHashType,
    BundlingOptions,
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
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from btk import capacity, pagination
from btk.environment import EnvironmentConfig, ExistingPlanCapacity, ReservePlanCapacity
from training_constructs.nag import (
    acknowledge,
    acknowledge_wildcard_resources,
    depend_on_policy_only,
    finding_token,
    skip_checkov,
)
from training_constructs.removal import data_removal_policy
from training_constructs.retention import RETENTION_DAYS

HANDLER_DIR = Path(__file__).parent / "lambda" / "training_plan"
#: The ``btk.capacity`` package, bundled byte for byte with the handler.
CAPACITY_PACKAGE = Path(capacity.__file__).parent
#: ``btk.pagination`` (bounded listings, answers held to their documented shape), which the package imports.
PAGINATION_MODULE = Path(pagination.__file__)
#: The latest Python runtime aws-cdk-lib 2.275 knows.
HANDLER_RUNTIME = lambda_.Runtime.PYTHON_3_14
#: One search, one list and one purchase (onEvent), or one describe (isComplete), with botocore's retries.
HANDLER_TIMEOUT = Duration.minutes(5)
#: Describing a plan: all the handler does in ``existing`` mode, and all ``isComplete`` does.
DESCRIBE_PLAN_ACTION = "sagemaker:DescribeTrainingPlan"
#: Finding offerings and this account's plans: these act on no resource and accept only ``*``.
PLAN_LOOKUP_ACTIONS = ("sagemaker:SearchTrainingPlanOfferings", "sagemaker:ListTrainingPlans")
#: Buying and describing one plan: limited to this environment's plan names.
OWN_PLAN_ACTIONS = ("sagemaker:CreateTrainingPlan", DESCRIBE_PLAN_ACTION)
#: What CreateTrainingPlan needs besides itself (the Service Authorization Reference's dependent
#: actions, and the managed policy AmazonSageMakerTrainingPlanCreateAccess): the plan's reserved
#: capacity is created, and both are tagged, as the caller.
#: https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonsagemaker.html
#: https://docs.aws.amazon.com/sagemaker/latest/dg/training-plan-iam-permissions.html
RESERVED_CAPACITY_ACTION = "sagemaker:CreateReservedCapacity"
TAG_ACTION = "sagemaker:AddTags"
#: The only SageMaker actions the handlers may call or have called on their behalf.
PLAN_ACTIONS = (*PLAN_LOOKUP_ACTIONS, *OWN_PLAN_ACTIONS, RESERVED_CAPACITY_ACTION, TAG_ACTION)
#: The longest CloudFormation waits for a custom resource (``ServiceTimeout``, 3600 s at most),
#: and so the waiter's total timeout; the Provider framework allows no more either.
#: https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-cloudformation-customresource.html
TOTAL_TIMEOUT = Duration.hours(1)
#: How often ``isComplete`` describes a bought plan.
QUERY_INTERVAL = Duration.minutes(1)
#: How long the deploy waits for a bought plan to leave Pending, unless the props say otherwise: the
#: total timeout less room for the last checks. Past it the resource completes with the plan Pending
#: (the framework's bare "timed out" would fail it, and roll back a first create).
DEFAULT_WAIT_TIMEOUT = Duration.minutes(55)


@jsii.implements(ILocalBundling)
class _CapacityBundle:
    """Local bundling: the handler directory plus ``btk.capacity`` and ``btk.pagination`` under a bare ``btk``."""

    def try_bundle(self, output_dir: str, *args: Any, **kwargs: Any) -> bool:
        output = Path(output_dir)
        for source in sorted(HANDLER_DIR.glob("*.py")):
            shutil.copyfile(source, output / source.name)
        package = output / "btk"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text(
            '"""btk.capacity and btk.pagination only (bundled for the training-plan handler)."""\n'
        )
        shutil.copyfile(PAGINATION_MODULE, package / PAGINATION_MODULE.name)
        (package / "capacity").mkdir(exist_ok=True)
        for source in sorted(CAPACITY_PACKAGE.glob("*.py")):
            shutil.copyfile(source, package / "capacity" / source.name)
        return True


def handler_code() -> lambda_.Code:
    """The handler asset; hashed on its bundled output, so a change to btk/capacity/ or btk/pagination.py redeploys."""
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
    :param wait_timeout: how long a deploy waits for a bought plan to become Scheduled/Active
        (``reserve`` mode; at most the one-hour custom-resource limit less two query intervals).
        Default: None, i.e. 55 minutes.
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
        if isinstance(env_config.capacity, ReservePlanCapacity):
            self._grant_purchase(role, plan_resources)
        else:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="DescribeConfiguredPlan", actions=[DESCRIBE_PLAN_ACTION], resources=plan_resources
                )
            )
        self.handler = self._function(
            "Handler", "index.on_event", role, handler_logs,
            f"Verifies or buys the SageMaker training plan of {env_config.name} (never twice)",
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
        waiter: dict[str, Any] = {}
        self.completion_handler: lambda_.Function | None = None
        if self.mode == "reserve":
            waiter = self._waiter(plan_resources, handler_logs, provider_logs)
            properties["WaitSeconds"] = str(int(wait.to_seconds()))
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.handler,
            framework_on_event_role=framework_role,
            log_group=provider_logs,
            **waiter,
        )
        self.custom_resource = CustomResource(
            self,
            "Resource",
            service_token=provider.service_token,
            resource_type="Custom::TrainingPlan",
            properties=properties,
            service_timeout=TOTAL_TIMEOUT,
        )
        self.plan_arn = self.custom_resource.get_att_string("PlanArn")
        self._plan_resources = plan_resources
        self._acknowledge(role, framework_role)
        framework = provider.node.find_child("framework-onEvent")
        skip_checkov(self.handler, framework)
        depend_on_policy_only(self.handler, role)
        depend_on_policy_only(framework, framework_role)
        if self.completion_handler is not None:
            self._finish_waiter(provider)

    def _grant_purchase(self, role: iam.Role, plan_resources: list[str]) -> None:
        """Search and list (``*`` only), buy and describe this environment's plans, and what a purchase needs."""
        stack = Stack.of(self)
        self._reserved_capacity = stack.format_arn(service="sagemaker", resource="reserved-capacity", resource_name="*")
        role.add_to_policy(
            iam.PolicyStatement(sid="SearchAndListPlans", actions=list(PLAN_LOOKUP_ACTIONS), resources=["*"])
        )
        role.add_to_policy(
            iam.PolicyStatement(sid="BuyAndDescribeOwnPlans", actions=list(OWN_PLAN_ACTIONS), resources=plan_resources)
        )
        # The reserved capacity SageMaker creates for a plan is named by SageMaker (a random
        # string), so its ARN is known only as reserved-capacity/* of this account and region.
        role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateThePlansReservedCapacity",
                actions=[RESERVED_CAPACITY_ACTION],
                resources=[self._reserved_capacity],
            )
        )
        # No sagemaker:TaggingAction condition: AWS documents none for these two calls, and a
        # condition SageMaker's call did not meet would fail every purchase after charging nothing,
        # which nothing offline can show.
        role.add_to_policy(
            iam.PolicyStatement(
                sid="TagThePlanAndItsCapacity",
                actions=[TAG_ACTION],
                resources=[*plan_resources, self._reserved_capacity],
            )
        )

    def _function(
        self, construct_id: str, entry: str, role: iam.Role, log_group: logs.LogGroup, description: str
    ) -> lambda_.Function:
        return lambda_.Function(
            self,
            construct_id,
            runtime=HANDLER_RUNTIME,
            architecture=lambda_.Architecture.ARM_64,
            handler=entry,
            code=handler_code(),
            timeout=HANDLER_TIMEOUT,
            memory_size=256,
            role=role,
            log_group=log_group,
            description=description,
        )

    def _waiter(
        self, plan_resources: list[str], handler_logs: logs.LogGroup, provider_logs: logs.LogGroup
    ) -> dict[str, Any]:
        """The ``isComplete`` handler (describe only) and the Provider's waiter settings."""
        env_config = self.env_config
        completion_role = iam.Role(
            self,
            "CompletionRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"training-plan isComplete check of {env_config.name}: describe its own plans",
        )
        handler_logs.grant_write(completion_role)
        completion_role.add_to_policy(
            iam.PolicyStatement(sid="DescribeOwnPlans", actions=[DESCRIBE_PLAN_ACTION], resources=plan_resources)
        )
        self.completion_handler = self._function(
            "CompletionHandler", "index.is_complete", completion_role, handler_logs,
            f"Says when the SageMaker training plan of {env_config.name} may be used",
        )
        self._completion_role = completion_role
        self._framework_waiter_role = iam.Role(
            self,
            "ProviderWaiterRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"CDK Provider framework isComplete/onTimeout of the {env_config.name} training-plan resource",
        )
        provider_logs.grant_write(self._framework_waiter_role)
        return {
            "is_complete_handler": self.completion_handler,
            "query_interval": QUERY_INTERVAL,
            "total_timeout": TOTAL_TIMEOUT,
            "framework_complete_and_timeout_role": self._framework_waiter_role,
            "disable_waiter_state_machine_logging": False,
            "waiter_state_machine_log_options": cr.LogOptions(
                destination=provider_logs, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
        }

    def _finish_waiter(self, provider: cr.Provider) -> None:
        assert self.completion_handler is not None
        waiter_functions = [provider.node.find_child(name) for name in ("framework-isComplete", "framework-onTimeout")]
        skip_checkov(self.completion_handler, *waiter_functions)
        depend_on_policy_only(self.completion_handler, self._completion_role)
        for function in waiter_functions:
            depend_on_policy_only(function, self._framework_waiter_role)
        self._acknowledge_waiter(provider)

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
        longest = TOTAL_TIMEOUT.to_seconds() - 2 * QUERY_INTERVAL.to_seconds()
        if env_config.capacity.mode == "reserve" and not 0 < wait.to_seconds() <= longest:
            raise ValueError(
                f"{self.node.path}: wait_timeout must be more than 0 and at most {longest / 60:.0f} minutes "
                f"(CloudFormation waits {TOTAL_TIMEOUT.to_minutes():.0f} minutes for a custom resource)"
            )

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
            acknowledge_wildcard_resources(
                role,
                [self._reserved_capacity],
                "SageMaker names a plan's reserved capacity itself (a random string) when the plan is bought; "
                "CreateReservedCapacity and AddTags are limited to this account and region",
            )
        completion = [self.completion_handler] if self.completion_handler is not None else []
        self._acknowledge_invoke(framework_role, [self.handler, *completion])

    def _acknowledge_invoke(self, role: IConstruct, functions: Sequence[Any]) -> None:
        for function in functions:
            acknowledge(
                role,
                f"AwsSolutions-IAM5[Resource::{finding_token(function.function_arn, self)}:*]",
                "the CDK Provider framework grants lambda:InvokeFunction on the functions it calls and their "
                "versions (ARN suffix :*), nothing else",
            )

    def _acknowledge_waiter(self, provider: cr.Provider) -> None:
        """The waiter's state machine: framework code, logged to the encrypted provider log group."""
        assert self.completion_handler is not None
        self._acknowledge_invoke(self._framework_waiter_role, [self.handler, self.completion_handler])
        state_machine = provider.node.find_child("waiter-state-machine")
        machine_role = state_machine.node.find_child("Role")
        depend_on_policy_only(state_machine, machine_role)
        self._acknowledge_invoke(
            machine_role,
            [provider.node.find_child(name) for name in ("framework-isComplete", "framework-onTimeout")],
        )
        acknowledge(
            machine_role,
            "AwsSolutions-IAM5[Resource::*]",
            "Step Functions log delivery (logs:CreateLogDelivery, GetLogDelivery, ListLogDeliveries, "
            "PutResourcePolicy, DescribeLogGroups ...) accepts only '*'; the CDK grants it for the waiter's logs",
        )
        machine_policy = machine_role.node.find_child("DefaultPolicy").node.default_child
        machine_policy.add_metadata(  # type: ignore[union-attr]
            "checkov",
            {"skip": [{"id": "CKV_AWS_111", "comment": "Step Functions log delivery APIs accept only '*'; the CDK "
                       "grants them to the waiter for its own log group"}]},
        )
        acknowledge(
            state_machine,
            "AwsSolutions-SF2",
            "the waiter calls one Lambda function once a minute and logs every execution to the encrypted "
            "provider log group; X-Ray would trace nothing the handlers' logs do not show",
        )
