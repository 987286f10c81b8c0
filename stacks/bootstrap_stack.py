"""EnvironmentBootstrapStack: a CDK bootstrap per environment whose roles reach only that environment.

``cdk bootstrap``'s default template gives its deploy role CloudFormation on every stack of the
account and its execution role ``AdministratorAccess``: with environments in one account, the
bootstrap of ``dev`` (whose CI job needs no reviewer) can update or delete ``TrainingStack-prod``.
This stack replaces it, one per environment (its ``bootstrap_qualifier``), with the resources and
names ``DefaultStackSynthesizer`` expects (``cdk-<qualifier>-…``) and roles scoped by construction:

* **deploy role** (what CI assumes): CloudFormation only on ``TrainingStack-<env>``, pass only
  this bootstrap's execution role, read this bootstrap's assets and version;
* **file/image-publishing roles**: write only this bootstrap's bucket/repository;
* **lookup role**: read only ``TrainingStack-<env>`` (``cdk diff``; the app itself looks nothing up);
* **execution role** (what CloudFormation acts as): everything, under the **permissions
  boundary** ``cdk-<qualifier>-boundary-<account>-<region>``, which denies every action on a
  resource CloudFormation tagged for another stack, on anything whose name belongs to another
  environment of the account (``TrainingStack-<other>``, ``btk-<other>-``, ``/btk/<other>/``,
  ``cdk-<other qualifier>-``), creating a role or user without this boundary, and changing the
  boundary itself. ``TrainingStack`` puts the same boundary on every role it creates (it must:
  the boundary refuses roles without it), so no role of the environment can reach further.

Deployed once per environment and account by an administrator, with the CLI's own credentials
(no bootstrap is needed to deploy it)::

    npx cdk deploy BtkBootstrap-dev -c bootstrap=dev -c account=ACCOUNT

One account per environment remains the stronger layout (docs/ci.md): an account is a boundary
AWS enforces for every service, a tag or name convention only for the resources that follow it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import (
    App,
    BootstraplessSynthesizer,
    CfnOutput,
    Duration,
    Environment,
    RemovalPolicy,
    Stack,
)
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct, IConstruct

from btk import capacity
from btk.environment import EnvironmentConfig, ExistingPlanCapacity
from btk.errors import BtkError
from training_constructs.nag import acknowledge, acknowledge_wildcard_resources

#: The bootstrap version this stack provides: that of the CDK CLI's own template
#: (node_modules/aws-cdk/lib/api/bootstrap/bootstrap-template.yaml, output BootstrapVersion; aws-cdk 2.1148.1).
BOOTSTRAP_VERSION = "33"
#: The tag CloudFormation puts on every resource it creates that supports tags.
#: https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-resource-tags.html
STACK_NAME_TAG = "aws:cloudformation:stack-name"
#: What the deploy role may do to its environment's stack (the CDK CLI's deploy, diff and destroy).
DEPLOY_ACTIONS = (
    "cloudformation:CreateChangeSet",
    "cloudformation:DeleteChangeSet",
    "cloudformation:DescribeChangeSet",
    "cloudformation:ExecuteChangeSet",
    "cloudformation:CreateStack",
    "cloudformation:UpdateStack",
    "cloudformation:DeleteStack",
    "cloudformation:RollbackStack",
    "cloudformation:ContinueUpdateRollback",
    "cloudformation:UpdateTerminationProtection",
    "cloudformation:DescribeStacks",
    "cloudformation:DescribeStackEvents",
    "cloudformation:DescribeStackResources",
    "cloudformation:ListStackResources",
    "cloudformation:GetTemplate",
)
#: Reading file assets (the deploy role hands CloudFormation templates that name them).
ASSET_READ_ACTIONS = ("s3:GetObject",)
#: What ``cdk diff`` reads through the lookup role.
LOOKUP_ACTIONS = ("cloudformation:DescribeStacks", "cloudformation:GetTemplate", "cloudformation:ListStackResources")


def role_name(qualifier: str, kind: str, account: str, region: str) -> str:
    """``cdk-<qualifier>-<kind>-role-<account>-<region>``: DefaultStackSynthesizer's names."""
    return f"cdk-{qualifier}-{kind}-role-{account}-{region}"


def boundary_name(env_config: EnvironmentConfig) -> str:
    """The managed policy every role of the environment carries as its permissions boundary."""
    return f"cdk-{env_config.bootstrap_qualifier}-boundary-{env_config.region}"


def bootstrap_stack_name(env_config: EnvironmentConfig) -> str:
    return f"BtkBootstrap-{env_config.name}"


def foreign_name_tokens(other: EnvironmentConfig) -> tuple[str, ...]:
    """Text that appears in the names of ``other``'s resources (generated or chosen by this project)."""
    return (
        other.stack_name,
        other.stack_name.lower(),
        f"btk-{other.name}-",
        f"/btk/{other.name}/",
        f"cdk-{other.bootstrap_qualifier}-",
        f"cdk-bootstrap/{other.bootstrap_qualifier}/",
        bootstrap_stack_name(other),
    )


@dataclass(frozen=True)
class EnvironmentBootstrapProps:
    """Props of :class:`EnvironmentBootstrapStack`.

    :param environment: the environment this bootstrap serves (its qualifier, region, stack name).
    :param neighbours: the other environments of the same account, whose resources the
        boundary also refuses by name. Default: none.
    """

    environment: EnvironmentConfig
    neighbours: Sequence[EnvironmentConfig] = ()

    def __post_init__(self) -> None:
        for other in self.neighbours:
            if other.name == self.environment.name:
                raise BtkError(f"environment {other.name!r} cannot be its own neighbour")
            if (other.region, other.bootstrap_qualifier) == (self.environment.region,
                                                             self.environment.bootstrap_qualifier):
                raise BtkError(
                    f"environments {self.environment.name!r} and {other.name!r} share bootstrap_qualifier "
                    f"{other.bootstrap_qualifier!r}: give each its own in environments.py"
                )


class EnvironmentBootstrapStack(Stack):
    """The bootstrap of one environment (see the module doc).

    Attributes: ``roles`` (by kind: deploy, cfn-exec, file-publishing, image-publishing,
    lookup), ``boundary``, ``bucket``, ``repository``.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, props: EnvironmentBootstrapProps, env: Environment | None = None
    ) -> None:
        env_config = props.environment
        super().__init__(
            scope,
            construct_id,
            stack_name=bootstrap_stack_name(env_config),
            env=env or Environment(account=env_config.account, region=env_config.region),
            synthesizer=BootstraplessSynthesizer(),
            description=f"Blackwell Training Kit: CDK bootstrap of environment {env_config.name}, scoped to it",
            analytics_reporting=False,
        )
        self.props = props
        qualifier = env_config.bootstrap_qualifier
        self.own_stack_arns = [self._stack_arn(env_config.stack_name)]
        self.bucket = self._staging_bucket(qualifier)
        self.repository = ecr.Repository(
            self,
            "ContainerAssets",
            repository_name=f"cdk-{qualifier}-container-assets-{self.account}-{self.region}",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.version = ssm.StringParameter(
            self,
            "Version",
            parameter_name=f"/cdk-bootstrap/{qualifier}/version",
            string_value=BOOTSTRAP_VERSION,
            description=f"CDK bootstrap version of {env_config.name} (read by every deploy)",
        )
        self.boundary = self._boundary()
        self.roles: dict[str, iam.Role] = {}
        self._execution_role()
        self._deploy_role()
        self._publishing_roles()
        self._lookup_role()
        CfnOutput(self, "BootstrapVersion", value=BOOTSTRAP_VERSION, description="what cdk deploy checks")
        CfnOutput(self, "PermissionsBoundary", value=self.boundary.managed_policy_arn)

    # -- resources ------------------------------------------------------------------------------

    def _stack_arn(self, name: str) -> str:
        return f"arn:{self.partition}:cloudformation:{self.region}:{self.account}:stack/{name}/*"

    def _staging_bucket(self, qualifier: str) -> s3.Bucket:
        bucket = s3.Bucket(
            self,
            "StagingBucket",
            bucket_name=f"cdk-{qualifier}-assets-{self.account}-{self.region}",
            encryption=s3.BucketEncryption.KMS_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=Duration.days(30))],
        )
        reason = ("holds only CDK assets (templates, Lambda code) written by the file-publishing role; "
                  "CloudTrail records who wrote them")
        acknowledge(bucket, "AwsSolutions-S1", reason)
        bucket.node.default_child.add_metadata(  # type: ignore[union-attr]
            "checkov", {"skip": [{"id": "CKV_AWS_18", "comment": reason}]}
        )
        return bucket

    def _role(
        self, kind: str, description: str, *, principal: iam.IPrincipal | None = None, bounded: bool = False
    ) -> iam.Role:
        """A bootstrap role; assumed by this account's principals (CI's deploy role) unless ``principal``."""
        env_config = self.props.environment
        role = iam.Role(
            self,
            f"{kind.title().replace('-', '')}Role",
            role_name=role_name(env_config.bootstrap_qualifier, kind, self.account, self.region),
            assumed_by=principal or iam.AccountPrincipal(self.account),
            description=description,
            permissions_boundary=self.boundary if bounded else None,
        )
        self.roles[kind] = role
        return role

    def _execution_role(self) -> None:
        """What CloudFormation acts as: any action, within the boundary."""
        role = self._role(
            "cfn-exec",
            f"CloudFormation execution of {self.props.environment.stack_name}: anything within the boundary",
            principal=iam.ServicePrincipal("cloudformation.amazonaws.com"),
            bounded=True,
        )
        role.add_to_policy(iam.PolicyStatement(sid="WithinTheBoundary", actions=["*"], resources=["*"]))
        reason = ("CloudFormation creates every kind of resource the environment's stack holds; the permissions "
                  "boundary keeps it off every other environment's and stack's resources")
        acknowledge(role, "AwsSolutions-IAM5[Action::*]", reason)
        acknowledge(role, "AwsSolutions-IAM5[Resource::*]", reason)
        _skip_checkov(role.node.find_child("DefaultPolicy"), EXECUTION_CHECKOV_SKIPS, reason)

    def _deploy_role(self) -> None:
        """What CI assumes: the environment's own stack only."""
        env_config = self.props.environment
        role = self._role("deploy", f"Deploys {env_config.stack_name} only (CI assumes it)")
        role.add_to_policy(iam.PolicyStatement(
            sid="ThisEnvironmentsStackOnly", actions=list(DEPLOY_ACTIONS), resources=self.own_stack_arns
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="PassThisExecutionRole", actions=["iam:PassRole"], resources=[self.roles["cfn-exec"].role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "cloudformation.amazonaws.com"}},
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadBootstrapVersion", actions=["ssm:GetParameter", "ssm:GetParameters"],
            resources=[self.version.parameter_arn],
        ))
        self._grant_bucket(role, ASSET_READ_ACTIONS)
        acknowledge_wildcard_resources(
            role, self.own_stack_arns,
            "CloudFormation appends a generated id to the stack ARN (stack/NAME/ID); only this environment's stack",
        )

    def _publishing_roles(self) -> None:
        env_config = self.props.environment
        files = self._role("file-publishing", f"Uploads {env_config.name}'s file assets to its staging bucket")
        self._grant_bucket(files, (*ASSET_READ_ACTIONS, "s3:PutObject", "s3:AbortMultipartUpload"))
        images = self._role("image-publishing", f"Pushes {env_config.name}'s images to its asset repository")
        self.repository.grant_pull_push(images)
        acknowledge(images, "AwsSolutions-IAM5[Resource::*]",
                    "ecr:GetAuthorizationToken acts on no resource and accepts only '*'")

    def _lookup_role(self) -> None:
        """``cdk diff`` and ``btk doctor --lookup-role`` (docs/deploy.md's BtkDoctorReadOnly), scoped to
        this environment's stack, pipelines, plan, topic, file system and image repository."""
        env_config = self.props.environment
        role = self._role("lookup", f"Reads {env_config.stack_name} and its resources (cdk diff, btk doctor)")
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadThisEnvironmentsStack", actions=list(LOOKUP_ACTIONS), resources=self.own_stack_arns
        ))
        # Quotas and default quotas describe the account, not a resource (they accept only '*').
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadQuotas",
            actions=["servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas"],
            resources=["*"],
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadBootstrapVersion", actions=["ssm:GetParameter"], resources=[self.version.parameter_arn]
        ))
        prefix = f"btk-{env_config.name}-"
        pipelines = self.format_arn(service="sagemaker", resource="pipeline", resource_name=f"{prefix}*")
        topics = self.format_arn(service="sns", resource=f"{env_config.stack_name}-*")
        owned = [pipelines, topics, *self.own_stack_arns]
        role.add_to_policy(iam.PolicyStatement(sid="DescribePipelines", actions=["sagemaker:DescribePipeline"],
                                               resources=[pipelines]))
        role.add_to_policy(iam.PolicyStatement(sid="ReadFailureTopic", actions=["sns:ListSubscriptionsByTopic"],
                                               resources=[topics]))
        plans = self._plan_arns()
        if plans:
            role.add_to_policy(iam.PolicyStatement(sid="DescribeThePlan", actions=["sagemaker:DescribeTrainingPlan"],
                                                   resources=plans))
        role.add_to_policy(iam.PolicyStatement(
            sid="DescribeThisStacksFileSystem", actions=["fsx:DescribeFileSystems"], resources=["*"],
            conditions={"StringEquals": {f"aws:ResourceTag/{STACK_NAME_TAG}": env_config.stack_name}},
        ))
        role.add_to_policy(iam.PolicyStatement(sid="DescribeImages", actions=["ecr:DescribeImages"],
                                               resources=[self.repository.repository_arn]))
        acknowledge_wildcard_resources(
            role, [*owned, *[plan for plan in plans if "*" in plan]],
            "names CloudFormation or the project gives this environment's resources (stack/NAME/ID, "
            f"{prefix}<profile> pipelines, {env_config.stack_name}-<id> topic); read-only actions",
        )
        acknowledge(role, "AwsSolutions-IAM5[Resource::*]",
                    "service quotas accept only '*'; fsx:DescribeFileSystems is limited by the stack-name tag "
                    "CloudFormation puts on this environment's file system")

    def _plan_arns(self) -> list[str]:
        """The environment's training plan(s): the configured ARN, or its plan names (none on-demand)."""
        capacity_config = self.props.environment.capacity
        if isinstance(capacity_config, ExistingPlanCapacity):
            return [capacity_config.plan_arn]
        if capacity_config.mode == "reserve":
            name = capacity.plan_name_prefix(self.props.environment.name) + "?" * capacity.PLAN_HASH_CHARS
            return [self.format_arn(service="sagemaker", resource="training-plan", resource_name=name)]
        return []

    def _grant_bucket(self, role: iam.Role, object_actions: Sequence[str]) -> None:
        """List this bootstrap's staging bucket and act on its objects (asset keys are content hashes)."""
        role.add_to_policy(iam.PolicyStatement(
            sid="ListStagingBucket", actions=["s3:ListBucket", "s3:GetBucketLocation"],
            resources=[self.bucket.bucket_arn],
        ))
        objects = self.bucket.arn_for_objects("*")
        role.add_to_policy(iam.PolicyStatement(sid="StagingObjects", actions=list(object_actions), resources=[objects]))
        acknowledge_wildcard_resources(
            role, [objects], "asset objects are named by their content hash; only this bootstrap's staging bucket"
        )

    def _boundary(self) -> iam.ManagedPolicy:
        env_config = self.props.environment
        allowed_stacks = [env_config.stack_name, bootstrap_stack_name(env_config)]
        policy_arn = f"arn:{self.partition}:iam::{self.account}:policy/{boundary_name(env_config)}"
        foreign = [f"arn:{self.partition}:*:*:*:*{token}*"
                   for other in self.props.neighbours for token in foreign_name_tokens(other)]
        statements = [
            iam.PolicyStatement(sid="AllowWhatThePoliciesAllow", actions=["*"], resources=["*"]),
            iam.PolicyStatement(
                sid="DenyResourcesOfOtherStacks",
                effect=iam.Effect.DENY,
                actions=["*"],
                resources=["*"],
                conditions={
                    "StringNotEquals": {f"aws:ResourceTag/{STACK_NAME_TAG}": allowed_stacks},
                    "Null": {f"aws:ResourceTag/{STACK_NAME_TAG}": "false"},
                },
            ),
            iam.PolicyStatement(
                sid="DenyStacksOfOthers",
                effect=iam.Effect.DENY,
                actions=["cloudformation:*"],
                not_resources=[self._stack_arn(name) for name in allowed_stacks],
            ),
            iam.PolicyStatement(
                sid="DenyRolesWithoutThisBoundary",
                effect=iam.Effect.DENY,
                actions=["iam:CreateRole", "iam:PutRolePermissionsBoundary", "iam:CreateUser",
                         "iam:PutUserPermissionsBoundary"],
                resources=["*"],
                conditions={"StringNotEquals": {"iam:PermissionsBoundary": policy_arn}},
            ),
            iam.PolicyStatement(
                sid="KeepBoundariesOnRoles",
                effect=iam.Effect.DENY,
                actions=["iam:DeleteRolePermissionsBoundary", "iam:DeleteUserPermissionsBoundary"],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="KeepTheBoundary",
                effect=iam.Effect.DENY,
                actions=["iam:CreatePolicyVersion", "iam:DeletePolicy", "iam:DeletePolicyVersion",
                         "iam:SetDefaultPolicyVersion"],
                resources=[policy_arn],
            ),
        ]
        if foreign:
            statements.insert(2, iam.PolicyStatement(
                sid="DenyNamedResourcesOfOtherEnvironments", effect=iam.Effect.DENY, actions=["*"], resources=foreign
            ))
        boundary = iam.ManagedPolicy(
            self,
            "Boundary",
            managed_policy_name=boundary_name(env_config),
            description=f"Permissions boundary of every role of environment {env_config.name}",
            statements=statements,
        )
        acknowledge(boundary, "AwsSolutions-IAM5[Action::*]",
                    "a permissions boundary grants nothing: it caps what the roles' own policies allow, and its "
                    "Deny statements keep every role of the environment off other environments' resources")
        acknowledge(boundary, "AwsSolutions-IAM5[Resource::*]",
                    "a permissions boundary grants nothing: its Allow is the ceiling; the Denies do the scoping")
        _skip_checkov(boundary, ("CKV_AWS_109", "CKV_AWS_111"),
                      "a permissions boundary grants nothing: it caps the roles' own policies")
        return boundary


#: checkov's checks of an unconstrained policy: the execution role's is, as cdk bootstrap's
#: AdministratorAccess is, and its permissions boundary constrains it.
EXECUTION_CHECKOV_SKIPS = ("CKV_AWS_62", "CKV_AWS_63", "CKV_AWS_107", "CKV_AWS_108", "CKV_AWS_109", "CKV_AWS_110",
                           "CKV_AWS_111")


def _skip_checkov(construct: IConstruct, rules: Sequence[str], comment: str) -> None:
    resource = construct.node.default_child
    assert resource is not None
    resource.add_metadata("checkov", {"skip": [{"id": rule, "comment": comment} for rule in rules]})  # type: ignore[attr-defined]


#: Context key selecting the environment whose bootstrap ``app.py`` adds: ``-c bootstrap=<env>``.
BOOTSTRAP_CONTEXT = "bootstrap"


def add_bootstrap_stack(
    app: App, environments: Sequence[EnvironmentConfig], context: Mapping[str, Any] | None = None
) -> EnvironmentBootstrapStack | None:
    """Add the bootstrap of environment ``-c bootstrap=<env>`` to ``app``; nothing without it.

    Its neighbours are the other environments of ``environments`` in the same account (after a
    ``-c account=`` override, which applies to the chosen environment and, like every environment
    of ``environments.py`` that states no account, to the others).
    """
    if context is None:
        context = {key: app.node.try_get_context(key) for key in (BOOTSTRAP_CONTEXT, "account")}
    name = context.get(BOOTSTRAP_CONTEXT)
    if not name:
        return None
    by_name = {env.name: env for env in environments}
    if name not in by_name:
        raise BtkError(f"-c bootstrap={name}: no such environment; use one of {', '.join(by_name)}")
    chosen = by_name[str(name)]
    account = str(context.get("account") or chosen.account)
    neighbours = [env for env in environments if env.name != chosen.name and env.account == chosen.account]
    props = EnvironmentBootstrapProps(environment=chosen, neighbours=neighbours)
    return EnvironmentBootstrapStack(
        app, bootstrap_stack_name(chosen), props=props, env=Environment(account=account, region=chosen.region)
    )
