"""CiAccessStack: short-lived GitHub Actions access to each environment, through OIDC.

Deployed once per AWS account, by a person, before CI can deploy (see docs/ci.md):

    npx cdk deploy CiAccessStack -c ci_access=true -c github_repo=OWNER/NAME -c account=ACCOUNT

It creates (or imports) the GitHub OIDC identity provider and:

* per environment, a **deploy role** that only the workflow job bound to the GitHub
  Environment of the same name can assume (``sub`` = ``repo:OWNER/NAME:environment:ENV``,
  ``aud`` = ``sts.amazonaws.com``). Its only permission is ``sts:AssumeRole`` on the four
  CDK bootstrap roles of that environment's own bootstrap (``cdk-<qualifier>-<kind>-role-…``
  with the environment's ``bootstrap_qualifier``, in its region: deploy, file-publishing,
  image-publishing, lookup): CloudFormation, not CI, holds the power to change resources,
  and the bootstrap ``--trust`` decides which account may hand it out. Two environments of
  one account and region must not share a qualifier (refused): the dev role could then
  deploy prod through the shared bootstrap roles, past prod's required reviewers.
* one **diff role** for pull requests and for the deploy workflow's diff on ``main`` (``sub`` =
  ``repo:OWNER/NAME:pull_request`` or ``repo:OWNER/NAME:ref:refs/heads/main``). It may
  assume nothing; it can only read the deployed template of each environment's training
  stack (``cloudformation:DescribeStacks``, ``GetTemplate``, ``ListStackResources``), which
  is all ``cdk diff --method template`` needs once the CLI falls back from the lookup role
  to these credentials. Giving it the lookup role instead would grant ``ReadOnlyAccess`` to
  the whole account to any branch that can open a pull request.

Each deploy role carries its environment's permissions boundary (``stacks/boundary_stack.py``),
so the environments must be bootstrapped first. The stack holds no secret and no long-lived key.
It is deployed with the caller's own credentials (``LegacyStackSynthesizer``: its template goes inline), not through
an environment's bootstrap, whose roles may reach only that environment's stack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import App, CfnOutput, Duration, Environment, LegacyStackSynthesizer, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from btk.bootstrap import boundary_policy_name
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from training_constructs.nag import acknowledge_wildcard_resources

#: GitHub's OIDC issuer and the audience aws-actions/configure-aws-credentials requests.
GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
GITHUB_OIDC_URL = f"https://{GITHUB_OIDC_HOST}"
STS_AUDIENCE = "sts.amazonaws.com"
#: Placeholder repository; set the real one with ``-c github_repo=OWNER/NAME``.
DEFAULT_GITHUB_REPO = "example-org/blackwell-training-kit"
#: The four roles ``cdk bootstrap`` creates, as ``cdk-<qualifier>-<kind>-role-<account>-<region>``.
BOOTSTRAP_ROLE_KINDS = ("deploy", "file-publishing", "image-publishing", "lookup")
#: What ``cdk diff --method template`` calls with fallback credentials.
DIFF_ACTIONS = ("cloudformation:DescribeStacks", "cloudformation:GetTemplate", "cloudformation:ListStackResources")

_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_ROLE_PREFIX = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,30}$")
_PROVIDER_ARN = re.compile(
    r"^arn:aws[a-z-]*:iam::\d{12}:oidc-provider/" + re.escape(GITHUB_OIDC_HOST) + r"$"
)


@dataclass(frozen=True)
class CiAccessProps:
    """What CiAccessStack creates.

    environments: the environments CI deploys from this account (at least one); no two of
        one region may share a ``bootstrap_qualifier``.
    github_repo: ``OWNER/NAME`` of the repository whose workflows may assume the roles;
        default the placeholder :data:`DEFAULT_GITHUB_REPO`.
    existing_provider_arn: ARN of a GitHub OIDC provider already in the account (an
        account holds one per URL); default ``None`` creates it.
    diff_role: create the read-only pull-request diff role; default ``True``.
    role_name_prefix: deploy roles are ``<prefix>-deploy-<env>``, the diff role
        ``<prefix>-diff``; default ``btk-github``. Fixed names keep the ARNs you paste
        into GitHub stable across stack updates.
    max_session: longest session a workflow can get; default two hours, since a deploy that
        creates FSx for Lustre and pushes the training image can outlast one hour and the
        CDK CLI refreshes the bootstrap-role session from this one.
    """

    environments: Sequence[EnvironmentConfig]
    github_repo: str = DEFAULT_GITHUB_REPO
    existing_provider_arn: str | None = None
    diff_role: bool = True
    role_name_prefix: str = "btk-github"
    max_session: Duration = field(default_factory=lambda: Duration.hours(2))

    def __post_init__(self) -> None:
        if not self.environments:
            raise BtkError("CiAccessProps.environments is empty: pass at least one environment from environments.py")
        names = [env.name for env in self.environments]
        if len(set(names)) != len(names):
            raise BtkError(f"CiAccessProps.environments lists an environment twice: {', '.join(names)}")
        if not _REPO.fullmatch(self.github_repo):
            raise BtkError(
                f"github_repo {self.github_repo!r} is not OWNER/NAME: pass -c github_repo=your-org/your-repo"
            )
        if self.existing_provider_arn is not None and not _PROVIDER_ARN.fullmatch(self.existing_provider_arn):
            raise BtkError(
                f"existing_provider_arn {self.existing_provider_arn!r} is not a GitHub OIDC provider ARN: "
                f"use arn:aws:iam::ACCOUNT:oidc-provider/{GITHUB_OIDC_HOST}"
            )
        shared = shared_bootstrap(self.environments)
        if shared is not None:
            raise BtkError(shared)
        if not _ROLE_PREFIX.fullmatch(self.role_name_prefix):
            raise BtkError(
                f"role_name_prefix {self.role_name_prefix!r} is not usable in a role name: "
                "use up to 30 letters, digits or +=,.@_-"
            )


def shared_bootstrap(environments: Sequence[EnvironmentConfig]) -> str | None:
    """Why two of ``environments`` (all in one account) would share bootstrap roles, or ``None``."""
    seen: dict[tuple[str, str], str] = {}
    for env in environments:
        key = (env.region, env.bootstrap_qualifier)
        if key in seen:
            return (
                f"environments {seen[key]!r} and {env.name!r} share bootstrap_qualifier {env.bootstrap_qualifier!r} "
                f"in {env.region}: either CI role could deploy both; give each its own bootstrap_qualifier "
                "in environments.py and run cdk bootstrap --qualifier for it (docs/ci.md)"
            )
        seen[key] = env.name
    return None


def environment_subject(github_repo: str, environment: str) -> str:
    """The OIDC ``sub`` of a job bound to GitHub Environment ``environment``."""
    return f"repo:{github_repo}:environment:{environment}"


def pull_request_subject(github_repo: str) -> str:
    """The OIDC ``sub`` of a job triggered by ``pull_request``."""
    return f"repo:{github_repo}:pull_request"


def main_branch_subject(github_repo: str) -> str:
    """The OIDC ``sub`` of a job on a push to ``main`` bound to no GitHub Environment (the deploy
    workflow's diff, shown before the environments' approvals)."""
    return f"repo:{github_repo}:ref:refs/heads/main"


class CiAccessStack(Stack):
    """The GitHub OIDC provider, one deploy role per environment and a read-only diff role.

    Attributes: ``provider`` (the OIDC provider, created or imported), ``deploy_roles``
    (by environment name) and ``diff_role`` (``None`` when ``props.diff_role`` is false).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        props: CiAccessProps,
        env: Environment | None = None,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            env=env,
            # Deployed by a person with the account's own credentials, not through an environment's
            # bootstrap: each bootstrap's roles may reach only that environment's stack.
            synthesizer=LegacyStackSynthesizer(),
            description="Blackwell Training Kit: GitHub Actions OIDC roles for deploying each environment",
            analytics_reporting=False,
        )
        self.props = props
        if props.existing_provider_arn is None:
            self.provider: iam.IOidcProvider = iam.OidcProviderNative(
                self, "GitHubOidcProvider", url=GITHUB_OIDC_URL, client_ids=[STS_AUDIENCE]
            )
        else:
            self.provider = iam.OidcProviderNative.from_oidc_provider_arn(
                self, "GitHubOidcProvider", props.existing_provider_arn
            )

        self.deploy_roles: dict[str, iam.Role] = {}
        for env_config in props.environments:
            role = self._github_role(
                f"DeployRole-{env_config.name}",
                role_name=f"{props.role_name_prefix}-deploy-{env_config.name}",
                subject=environment_subject(props.github_repo, env_config.name),
                description=(
                    f"GitHub Actions deploy of environment {env_config.name}: may only assume the CDK bootstrap roles"
                ),
                boundary=iam.ManagedPolicy.from_managed_policy_name(
                    self, f"Boundary-{env_config.name}", boundary_policy_name(env_config)
                ),
            )
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="AssumeCdkBootstrapRoles",
                    actions=["sts:AssumeRole"],
                    resources=self.bootstrap_role_arns(env_config),
                )
            )
            self.deploy_roles[env_config.name] = role
            CfnOutput(
                self,
                f"DeployRoleArn-{env_config.name}",
                value=role.role_arn,
                description=f"Set as variable DEPLOY_ROLE_ARN of GitHub Environment {env_config.name}",
            )

        self.diff_role: iam.Role | None = None
        if props.diff_role:
            self.diff_role = self._github_role(
                "DiffRole",
                role_name=f"{props.role_name_prefix}-diff",
                subject=[pull_request_subject(props.github_repo), main_branch_subject(props.github_repo)],
                description="GitHub Actions cdk diff (pull requests; main, before approval): reads deployed templates",
            )
            stacks = self.training_stack_arns()
            self.diff_role.add_to_principal_policy(
                iam.PolicyStatement(sid="ReadTrainingStackTemplates", actions=list(DIFF_ACTIONS), resources=stacks)
            )
            acknowledge_wildcard_resources(
                self.diff_role,
                stacks,
                "CloudFormation appends a generated id to a stack ARN (stack/NAME/ID); the wildcard only "
                "covers that id and the training stack's nested stacks, read-only actions",
            )
            names = ", ".join(f"{env.name.upper().replace('-', '_')}_DIFF_ROLE_ARN" for env in props.environments)
            CfnOutput(
                self,
                "DiffRoleArn",
                value=self.diff_role.role_arn,
                description=f"Set as repository variable(s) {names}",
            )

    def bootstrap_role_arns(self, env_config: EnvironmentConfig) -> list[str]:
        """The CDK bootstrap roles of ``env_config``'s own bootstrap (its qualifier and region) in this account."""
        stack = Stack.of(self)
        qualifier, region = env_config.bootstrap_qualifier, env_config.region
        return [
            f"arn:{stack.partition}:iam::{stack.account}:role/cdk-{qualifier}-{kind}-role-{stack.account}-{region}"
            for kind in BOOTSTRAP_ROLE_KINDS
        ]

    def training_stack_arns(self) -> list[str]:
        """Each environment's TrainingStack ARN and its nested stacks' (``<name>-<id>-<suffix>``)."""
        stack = Stack.of(self)
        arns: list[str] = []
        for env_config in self.props.environments:
            base = f"arn:{stack.partition}:cloudformation:{env_config.region}:{stack.account}:stack"
            arns += [f"{base}/{env_config.stack_name}/*", f"{base}/{env_config.stack_name}-*/*"]
        return arns

    def _github_role(
        self, construct_id: str, *, role_name: str, subject: str | list[str], description: str,
        boundary: iam.IManagedPolicy | None = None,
    ) -> iam.Role:
        principal = iam.WebIdentityPrincipal(
            self.provider.oidc_provider_arn,
            conditions={
                "StringEquals": {
                    f"{GITHUB_OIDC_HOST}:aud": STS_AUDIENCE,
                    f"{GITHUB_OIDC_HOST}:sub": subject,
                }
            },
        )
        return iam.Role(
            self,
            construct_id,
            role_name=role_name,
            assumed_by=principal,
            description=description,
            max_session_duration=self.props.max_session,
            permissions_boundary=boundary,
        )


#: CDK context keys read by :func:`add_ci_access_stack`.
CONTEXT_KEYS = ("ci_access", "github_repo", "ci_environments", "github_oidc_provider_arn", "account", "region")


def ci_access_props_from_context(
    context: Mapping[str, Any], environments: Sequence[EnvironmentConfig]
) -> CiAccessProps | None:
    """CiAccessProps from CDK context, or ``None`` unless ``ci_access`` is true.

    ``ci_environments=dev,staging`` limits the roles to the environments in this account
    (default: every environment); ``github_oidc_provider_arn`` imports an existing provider.
    """
    if str(context.get("ci_access") or "").lower() not in {"true", "1", "yes"}:
        return None
    by_name = {env.name: env for env in environments}
    selected = context.get("ci_environments")
    if selected:
        names = [name.strip() for name in str(selected).split(",") if name.strip()]
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise BtkError(
                f"ci_environments names unknown environment(s) {', '.join(unknown)}: "
                f"use names from environments.py ({', '.join(by_name)})"
            )
        chosen = [by_name[name] for name in names]
    else:
        chosen = list(environments)
    provider_arn = context.get("github_oidc_provider_arn")
    return CiAccessProps(
        environments=chosen,
        github_repo=str(context.get("github_repo") or DEFAULT_GITHUB_REPO),
        existing_provider_arn=str(provider_arn) if provider_arn else None,
    )


def add_ci_access_stack(
    app: App, environments: Sequence[EnvironmentConfig], context: Mapping[str, Any] | None = None
) -> CiAccessStack | None:
    """Add ``CiAccessStack`` to ``app`` when ``-c ci_access=true``; otherwise add nothing.

    Off by default so ``cdk synth TrainingStack -c env=...`` and every CI synth stay as
    they are. ``context`` defaults to the app's CDK context (``-c key=value``). The stack's
    account/region come from ``account`` / ``region`` (the CLI's credentials when absent).
    """
    if context is None:
        context = {key: app.node.try_get_context(key) for key in CONTEXT_KEYS}
    props = ci_access_props_from_context(context, environments)
    if props is None:
        return None
    account, region = context.get("account"), context.get("region")
    env = Environment(account=str(account) if account else None, region=str(region) if region else None)
    return CiAccessStack(app, "CiAccessStack", props=props, env=env)
