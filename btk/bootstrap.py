"""How an environment is bootstrapped: the CDK CLI's own ``cdk bootstrap``, customised by its flags only.

Two commands, run in this order by ``btk bootstrap --env ENV`` (docs/deploy.md, step 1):

1. ``cdk deploy BtkBoundary-<env> -c boundary=<env>``: the environment's permissions boundary, a
   managed policy (``stacks/boundary_stack.py``), deployed with the caller's own credentials; its
   cloud assembly is written to ``cdk.out/boundary-<env>``;
2. ``cdk bootstrap aws://ACCOUNT/REGION`` with the environment's qualifier and toolkit stack name,
   that policy as the boundary of every bootstrap role (``--custom-permissions-boundary``,
   ``--apply-permissions-boundary-to-all-roles``) and as the CloudFormation execution role's only
   policy (``--cloudformation-execution-policies``, in place of ``AdministratorAccess``). The CLI
   reads a cloud assembly before it bootstraps, even for an explicit ``aws://`` environment, and runs
   cdk.json's app to get one; ``--app cdk.out/boundary-<env>`` hands it the one step 1 just wrote.

The bootstrap is the CLI's template, unchanged: its bucket, repository, version parameter
(``/cdk-bootstrap/<qualifier>/version``) and roles under the names ``DefaultStackSynthesizer``
expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from btk.environment import EnvironmentConfig

#: The CDK CLI the project pins (package.json), run from the project's own node_modules when present.
LOCAL_CDK = Path("node_modules") / ".bin" / "cdk"
#: Context key selecting the environment whose boundary ``app.py`` synthesizes: ``-c boundary=<env>``.
BOUNDARY_CONTEXT = "boundary"


def partition_of(region: str) -> str:
    """The AWS partition a region belongs to."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def boundary_policy_name(env: EnvironmentConfig) -> str:
    """The managed policy every role of the environment carries as its permissions boundary."""
    return f"cdk-{env.bootstrap_qualifier}-boundary-{env.region}"


def toolkit_stack_name(env: EnvironmentConfig) -> str:
    """The stack ``cdk bootstrap --toolkit-stack-name`` creates for the environment."""
    return f"CDKToolkit-{env.bootstrap_qualifier}"


def boundary_stack_name(env: EnvironmentConfig) -> str:
    return f"BtkBoundary-{env.name}"


def boundary_assembly_dir(env: EnvironmentConfig) -> str:
    """Where ``btk bootstrap``'s boundary deploy writes its cloud assembly, for ``cdk bootstrap --app`` to read."""
    return f"cdk.out/boundary-{env.name}"


@dataclass(frozen=True)
class BootstrapCommands:
    """The two commands that bootstrap ``env`` in ``account`` (argument lists, the CDK CLI's name first)."""

    boundary: tuple[str, ...]
    bootstrap: tuple[str, ...]


def bootstrap_commands(env: EnvironmentConfig, account: str, *, cdk: str = "npx cdk",
                       approve: bool = False) -> BootstrapCommands:
    """What ``btk bootstrap --env ENV --account ACCOUNT`` runs; ``approve`` skips the CLI's questions."""
    partition = partition_of(env.region)
    policy = boundary_policy_name(env)
    policy_arn = f"arn:{partition}:iam::{account}:policy/{policy}"
    cli = tuple(cdk.split())
    quiet = ("--no-notices",)
    assembly = boundary_assembly_dir(env)
    boundary = (*cli, "deploy", boundary_stack_name(env), "-c", f"{BOUNDARY_CONTEXT}={env.name}",
                "-c", f"account={account}", "-o", assembly, *quiet,
                *(("--require-approval", "never") if approve else ()))
    bootstrap = (
        *cli, "bootstrap", f"aws://{account}/{env.region}",
        "--qualifier", env.bootstrap_qualifier,
        "--toolkit-stack-name", toolkit_stack_name(env),
        "--custom-permissions-boundary", policy,
        "--apply-permissions-boundary-to-all-roles",
        "--cloudformation-execution-policies", policy_arn,
        "--trust", account,
        # The boundary's assembly, as the deploy above wrote it: the CLI would otherwise run the app again.
        "--app", assembly,
        *quiet,
    )
    return BootstrapCommands(boundary=boundary, bootstrap=bootstrap)


def bootstrap_command_line(env: EnvironmentConfig, account: str) -> str:
    """The one command docs/deploy.md gives for bootstrapping (or upgrading the bootstrap of) ``env``."""
    return f"btk bootstrap --env {env.name} --account {account}"
