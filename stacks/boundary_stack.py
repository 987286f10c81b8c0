"""EnvironmentBoundaryStack: the permissions boundary every role of one environment carries.

Environments are bootstrapped with the CDK CLI's own ``cdk bootstrap``, one bootstrap per
environment (its ``bootstrap_qualifier``), customised only through the CLI's flags (see
:mod:`btk.bootstrap`): ``--custom-permissions-boundary`` with
``--apply-permissions-boundary-to-all-roles`` puts this stack's policy on the deploy,
file-publishing, image-publishing, lookup and CloudFormation execution roles, and
``--cloudformation-execution-policies`` makes the same policy the execution role's only grant
(in place of the CLI's default ``AdministratorAccess``). ``TrainingStack`` puts it on every role
it creates (it must: the boundary refuses roles without it).

The policy allows what the roles' own policies allow, except:

* any action on a resource CloudFormation tagged for another stack;
* any action on a resource named like another environment of the account (``TrainingStack-<other>``,
  ``btk-<other>-``, ``/btk/<other>/``, ``cdk-<other qualifier>-``, its bootstrap's and boundary's
  stacks), in every service whose ARNs carry a resource's name;
* CloudFormation on any stack but the environment's own (so the CDK template's deploy role, allowed
  every stack, reaches only ``TrainingStack-<env>``);
* creating a role or user without this boundary, removing a boundary, changing this policy;
* unless the environment owns them, changing SageMaker's account-wide job log groups.

Deployed once per environment and account, before ``cdk bootstrap``, with the caller's own
credentials (``LegacyStackSynthesizer``: a small template without assets is deployed inline, no
bootstrap is needed to deploy it);
``btk bootstrap --env <env>`` runs both steps. One account per environment remains the stronger
layout (docs/ci.md): an account is a boundary AWS enforces for every service, a tag or name
convention only for the resources that follow it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import App, CfnOutput, Environment, LegacyStackSynthesizer, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from btk.bootstrap import BOUNDARY_CONTEXT, boundary_policy_name, boundary_stack_name
from btk.environment import EnvironmentConfig, job_log_groups_owner
from btk.errors import BtkError
from training_constructs.nag import acknowledge
from training_constructs.sagemaker_service import SAGEMAKER_LOG_GROUPS

#: The tag CloudFormation puts on every resource it creates that supports tags.
#: https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-resource-tags.html
STACK_NAME_TAG = "aws:cloudformation:stack-name"
#: Services of the resources the environments create (the service part of an ARN in a policy cannot
#: be a wildcard: CloudFormation's schema refuses ``arn:aws:*:…``). EC2 and FSx ARNs hold ids, not
#: names; they are here for the resources whose id a caller may choose.
NAMED_SERVICES = ("cloudwatch", "ec2", "ecr", "events", "fsx", "iam", "kms", "lambda", "logs", "s3", "sagemaker",
                  "sns", "sqs", "ssm", "states")


def foreign_resource_patterns(other: EnvironmentConfig) -> tuple[str, ...]:
    """``service:name`` for each service and text that appears in the names of ``other``'s resources.

    Stacks are left out: the boundary refuses CloudFormation on every stack but the environment's own.
    """
    q = other.bootstrap_qualifier
    common = (other.stack_name, f"btk-{other.name}-", f"cdk-{q}-")
    extra = {
        "s3": (other.stack_name.lower(),),  # generated bucket names are lower case
        "logs": (f"/btk/{other.name}/",),
        "ssm": (f"/btk/{other.name}/", f"cdk-bootstrap/{q}/"),
    }
    return tuple(f"{service}:{token}" for service in NAMED_SERVICES for token in (*common, *extra.get(service, ())))


#: What follows the service in a service's ARNs, up to the name: IAM has no region and its ARNs
#: must name the kind of resource (roles and policies are what the environments create), S3 has
#: neither region nor account.
ARN_SCOPES = {"iam": (":*:role/", ":*:policy/"), "s3": ("::",)}


def foreign_arns(partition: str, pattern: str) -> list[str]:
    """``service:text`` as ARNs of any resource of that service whose name holds ``text``."""
    service, text = pattern.split(":", 1)
    return [f"arn:{partition}:{service}:{scope}*{text}*" for scope in ARN_SCOPES.get(service, ("*:*:",))]


#: What sets SageMaker's account-wide job log groups (training_constructs/job_logs.py), or removes them.
JOB_LOG_SETTINGS = ("logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy", "logs:AssociateKmsKey",
                    "logs:DisassociateKmsKey", "logs:DeleteLogGroup")


#: What IAM allows a managed policy, whitespace excluded.
#: https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html
MANAGED_POLICY_MAX_CHARS = 6144


@dataclass(frozen=True)
class EnvironmentBoundaryProps:
    """Props of :class:`EnvironmentBoundaryStack`.

    :param environment: the environment this boundary serves (its qualifier, region, stack name).
    :param neighbours: the other environments of the same account, whose resources the
        boundary also refuses by name. Default: none.
    :param owns_job_log_groups: whether the environment sets the retention and key of SageMaker's
        account-wide job log groups (:func:`btk.environment.job_log_groups_owner`); if not, the boundary
        refuses changing them. Default: ``True``.
    """

    environment: EnvironmentConfig
    neighbours: Sequence[EnvironmentConfig] = ()
    owns_job_log_groups: bool = True

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


class EnvironmentBoundaryStack(Stack):
    """The permissions boundary of one environment (see the module doc). Attribute: ``boundary``."""

    def __init__(
        self, scope: Construct, construct_id: str, *, props: EnvironmentBoundaryProps, env: Environment | None = None
    ) -> None:
        env_config = props.environment
        super().__init__(
            scope,
            construct_id,
            stack_name=boundary_stack_name(env_config),
            env=env or Environment(account=env_config.account, region=env_config.region),
            synthesizer=LegacyStackSynthesizer(),
            description=f"Blackwell Training Kit: permissions boundary of environment {env_config.name}",
            analytics_reporting=False,
        )
        self.props = props
        self.boundary = self._boundary()
        CfnOutput(self, "PermissionsBoundary", value=self.boundary.managed_policy_arn)

    def _stack_arn(self, name: str) -> str:
        return f"arn:{self.partition}:cloudformation:{self.region}:{self.account}:stack/{name}/*"

    def _boundary(self) -> iam.ManagedPolicy:
        env_config = self.props.environment
        allowed_stacks = [env_config.stack_name]
        policy_arn = f"arn:{self.partition}:iam::{self.account}:policy/{boundary_policy_name(env_config)}"
        foreign = [arn for other in self.props.neighbours for pattern in foreign_resource_patterns(other)
                   for arn in foreign_arns(self.partition, pattern)]
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
        if not self.props.owns_job_log_groups:
            groups = [f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:{name}"
                      for name in SAGEMAKER_LOG_GROUPS]
            statements.append(iam.PolicyStatement(
                sid="LeaveTheJobLogGroupsToTheirOwner", effect=iam.Effect.DENY, actions=list(JOB_LOG_SETTINGS),
                resources=groups,
            ))
        size = policy_size(statements)
        if size > MANAGED_POLICY_MAX_CHARS:
            raise BtkError(
                f"environment {env_config.name!r}: its permissions boundary names {len(self.props.neighbours)} other "
                f"environments of account {env_config.account} and would be {size} characters, over IAM's "
                f"{MANAGED_POLICY_MAX_CHARS}: give environments accounts of their own (docs/ci.md, Layout)"
            )
        boundary = iam.ManagedPolicy(
            self,
            "Boundary",
            managed_policy_name=boundary_policy_name(env_config),
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


def _skip_checkov(construct: IConstruct, rules: Sequence[str], comment: str) -> None:
    resource = construct.node.default_child
    assert resource is not None
    resource.add_metadata("checkov", {"skip": [{"id": rule, "comment": comment} for rule in rules]})  # type: ignore[attr-defined]


def policy_size(statements: Sequence[iam.PolicyStatement]) -> int:
    """Characters of the policy document IAM counts (no whitespace), the partition at its longest."""
    document = {"Version": "2012-10-17", "Statement": [statement.to_statement_json() for statement in statements]}
    text = re.sub(r"\$\{Token\[[^\]]*\]\}", "aws-us-gov", json.dumps(document, separators=(",", ":")))
    return len(text)


def add_boundary_stack(
    app: App, environments: Sequence[EnvironmentConfig], context: Mapping[str, Any]
) -> EnvironmentBoundaryStack | None:
    """Add the boundary of environment ``-c boundary=<env>`` to ``app``; nothing without it.

    Its neighbours are the other environments of ``environments`` in the same account (after a
    ``-c account=`` override, which applies to the chosen environment and, like every environment
    of ``environments.py`` that states no account, to the others).
    """
    name = context.get(BOUNDARY_CONTEXT)
    if not name:
        return None
    by_name = {env.name: env for env in environments}
    if name not in by_name:
        raise BtkError(f"-c boundary={name}: no such environment; use one of {', '.join(by_name)}")
    chosen = by_name[str(name)]
    account = str(context.get("account") or chosen.account)
    neighbours = [env for env in environments if env.name != chosen.name and env.account == chosen.account]
    owner = job_log_groups_owner(environments, chosen)
    props = EnvironmentBoundaryProps(environment=chosen, neighbours=neighbours,
                                     owns_job_log_groups=owner == chosen.name)
    return EnvironmentBoundaryStack(
        app, boundary_stack_name(chosen), props=props, env=Environment(account=account, region=chosen.region)
    )
