"""``btk doctor --env NAME``: the account checked for what makes training fail in its first minutes.

Read-only; the credentials come from boto3's usual chain (environment, ``AWS_PROFILE``, SSO,
instance role). One line per check (pass, warn or fail, the figure found, the next step);
exit 0 when nothing failed, 1 when something did, 2 on bad input or without usable
credentials. See docs/deploy.md. boto3 is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from btk.cli.arguments import non_empty, non_empty_path
from btk.cli.output import JSON, add_format_argument, print_json
from btk.errors import printable


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor",
        help="check the account before a deploy or a run: quotas, bootstrap, training plan, FSx, the deployed stack",
        description="Check an environment's AWS account for what makes SageMaker training fail in its first "
        "minutes (read-only AWS calls). Exit 0: nothing failed; 1: something failed; 2: bad input.",
    )
    parser.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    parser.add_argument(
        "--cloud-assembly",
        type=non_empty_path,
        metavar="DIR",
        help="compare the deployed pipelines with this synthesized cloud assembly (npx cdk synth -o DIR); "
        "default: with the deployed template",
    )
    parser.add_argument(
        "--lookup-role",
        action="store_true",
        help="read as the environment's CDK bootstrap lookup role (cdk-<qualifier>-lookup-role-…, ReadOnlyAccess), "
        "assumed with the usual credentials: how the deploy workflow runs it",
    )
    add_format_argument(parser)
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run_doctor(args)


def run_doctor(
    args: argparse.Namespace,
    *,
    clients: Callable[[str], Any] | None = None,
    now: datetime | None = None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """The command body; the AWS clients, the clock and the sleep are injectable for tests."""
    from btk.catalog import get_environment
    from btk.doctor.assembly import read_cloud_assembly
    from btk.doctor.aws import Caller, client_factory
    from btk.doctor.checks import (
        Target,
        assume_lookup_role,
        caller_account,
        check_target,
        planned_jobs,
        run_checks,
    )
    from btk.doctor.findings import counts, exit_code

    env = get_environment(args.env)
    jobs = planned_jobs(env)
    assembly = read_cloud_assembly(args.cloud_assembly, env) if args.cloud_assembly is not None else None
    pause = sleep or time.sleep
    caller = Caller(clients if clients is not None else client_factory(env.region), sleep=pause)
    account, arn = caller_account(caller)
    if args.lookup_role:
        credentials = assume_lookup_role(caller, env, account, arn)
        caller = Caller(clients if clients is not None else client_factory(env.region, credentials), sleep=pause)
        account, arn = caller_account(caller)
    check_target(env, account, assembly)
    target = Target(env=env, account=account, jobs=jobs, assembly=assembly)
    findings = run_checks(target, caller, now or datetime.now(UTC))
    tally = counts(findings)
    if args.output_format == JSON:
        print_json(
            {
                "environment": env.name,
                "account": account,
                "region": env.region,
                "caller_arn": arn,
                "cloud_assembly": str(assembly.directory) if assembly else None,
                "checks": [finding.to_json() for finding in findings],
                "counts": tally,
                "exit_code": exit_code(findings),
            }
        )
        return exit_code(findings)
    print(printable(f"btk doctor: environment {env.name}, account {account}, {env.region}, as {arn}"))
    for finding in findings:
        print(finding.line())
    print(f"btk doctor: {tally['fail']} failed, {tally['warn']} warned, {tally['pass']} passed")
    return exit_code(findings)
