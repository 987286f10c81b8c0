"""``btk bootstrap --env NAME``: bootstrap an environment with the CDK CLI's own ``cdk bootstrap``.

Runs the two commands of :mod:`btk.bootstrap` in order (the environment's permissions boundary,
then ``cdk bootstrap`` with the flags that apply it), printing each before it runs. Run it with
an administrator's credentials, once per environment and again after the CDK CLI is upgraded or
an environment is added to the same account. ``--dry-run`` prints the commands and runs nothing.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from typing import Any

from btk.cli.arguments import non_empty
from btk.errors import BtkError

_ACCOUNT = re.compile(r"[0-9]{12}")


def aws_account(text: str) -> str:
    """A 12-digit AWS account id (ASCII digits, nothing around them)."""
    if not _ACCOUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a 12-digit AWS account id")
    return text


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bootstrap",
        help="bootstrap an environment: its permissions boundary, then cdk bootstrap with it",
        description="Bootstrap an environment with the CDK CLI's own cdk bootstrap: deploy the environment's "
        "permissions boundary (BtkBoundary-<env>), then run cdk bootstrap with its qualifier, toolkit stack name "
        "and that boundary on every bootstrap role. Needs an administrator's credentials.",
    )
    parser.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    parser.add_argument("--account", type=aws_account,
                        help="the AWS account to bootstrap; default: the environment's account in environments.py")
    parser.add_argument("--yes", action="store_true",
                        help="do not ask before deploying the boundary's IAM changes (--require-approval never)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from btk.bootstrap import LOCAL_CDK, bootstrap_commands
    from btk.catalog import get_environment

    env = get_environment(args.env)
    account = args.account or env.account
    cdk = str(LOCAL_CDK) if LOCAL_CDK.exists() else "npx cdk"
    commands = bootstrap_commands(env, account, cdk=cdk, approve=args.yes)
    for command in (commands.boundary, commands.bootstrap):
        print(f"$ {shlex.join(command)}", flush=True)
        if args.dry_run:
            continue
        try:
            status = subprocess.run(command, check=False, stdin=sys.stdin).returncode
        except OSError as error:
            raise BtkError(f"cannot run {command[0]}: {error.strerror or error} (run make setup first)") from None
        if status != 0:
            raise BtkError(f"{shlex.join(command[:3])} failed (exit {status}); its output is above")
    return 0
