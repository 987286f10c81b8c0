"""Every check of ``btk doctor``, in the order printed, each answered even when AWS does not answer it.

The order follows what fails first in a run's life: the quotas a job is created against, the
bootstrap a deploy needs, the training plan the jobs wait for, the FSx quotas the stack's file
system is created against, then what a deploy left behind (stack, pipelines, image, topic).
A check whose call AWS denies or keeps throttling becomes a warning that names the call and
the fix (:func:`guarded`); the other checks still run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from btk.doctor.assembly import CloudAssembly
from btk.doctor.aws import SHAPE_ERRORS, Answer, Caller, ServiceError, UnansweredError
from btk.doctor.bootstrap import BootstrapNeed, bootstrap_command, bootstrap_finding, lookup_role_arn
from btk.doctor.deployed import (
    DeployedStack,
    describe_stack,
    image_finding,
    pipeline_checks,
    stack_finding,
    topic_finding,
)
from btk.doctor.findings import WARN, Check, Finding
from btk.doctor.plan import training_plan_checks
from btk.doctor.quotas import PlannedJob, fsx_quota_checks, training_quota_checks
from btk.environment import DOCUMENTATION_ACCOUNT, EnvironmentConfig
from btk.errors import BtkError


@dataclass(frozen=True)
class Target:
    """What the checks are about: the environment, its planned jobs, the account the credentials reach.

    assembly: the synthesized cloud assembly to compare the deployed pipelines with; ``None``
        compares them with the deployed template.
    """

    env: EnvironmentConfig
    account: str
    jobs: tuple[PlannedJob, ...]
    assembly: CloudAssembly | None = None


def planned_jobs(env: EnvironmentConfig) -> tuple[PlannedJob, ...]:
    """Each profile's job as the planner plans it for the environment (what synth puts in its pipeline)."""
    from btk.planner.search import plan_environment

    plans = plan_environment(env)
    return tuple(PlannedJob(name, plans[name].instance.name, plans[name].nodes) for name in env.profiles)


def caller_account(caller: Caller) -> tuple[str, str]:
    """(account, ARN) of the credentials; :class:`BtkError` (one line, exit 2) when there are none that work."""
    try:
        identity = caller.call("sts", "get_caller_identity")
    except UnansweredError as error:
        raise BtkError(f"{error}: {error.remedy}") from None
    except ServiceError as error:
        raise BtkError(f"AWS refused the credentials: {error}: refresh them and retry") from None
    account, arn = identity.get("Account"), identity.get("Arn")
    if not isinstance(account, str) or not isinstance(arn, str):
        raise BtkError("sts:GetCallerIdentity answered without an account: run btk doctor again")
    return account, arn


def assume_lookup_role(caller: Caller, env: EnvironmentConfig, account: str, caller_arn: str) -> dict[str, Any]:
    """STS credentials of the environment's bootstrap lookup role; :class:`BtkError` when it cannot be assumed."""
    partition = caller_arn.split(":")[1] if caller_arn.startswith("arn:") else "aws"
    role = lookup_role_arn(env, account, partition)
    try:
        answer = caller.call("sts", "assume_role", RoleArn=role, RoleSessionName=f"btk-doctor-{env.name}")
    except (UnansweredError, ServiceError) as error:
        raise BtkError(
            f"cannot read as the lookup role {role}: {error}: bootstrap the environment "
            f"({bootstrap_command(env, account)}) and let the caller assume it"
        ) from None
    credentials = answer.get("Credentials")
    if not isinstance(credentials, dict) or not all(
        isinstance(credentials.get(key), str) for key in ("AccessKeyId", "SecretAccessKey", "SessionToken")
    ):
        raise BtkError(f"sts:AssumeRole of {role} answered without credentials: run btk doctor again")
    return credentials


def check_target(env: EnvironmentConfig, account: str, assembly: CloudAssembly | None) -> None:
    """:class:`BtkError` when the credentials or the assembly are for another account or region than ``env``."""
    if env.account != DOCUMENTATION_ACCOUNT and env.account != account:
        raise BtkError(
            f"the credentials are for account {account}, environment {env.name} deploys to {env.account}: "
            "use that account's credentials"
        )
    if assembly is None:
        return
    if assembly.account not in ("unknown-account", account):
        raise BtkError(
            f"--cloud-assembly {assembly.directory} was synthesized for account {assembly.account}, the credentials "
            f"are for {account}: synthesize with -c env={env.name} -c account={account}"
        )
    if assembly.region not in ("unknown-region", env.region):
        raise BtkError(
            f"--cloud-assembly {assembly.directory} was synthesized for region {assembly.region}, environment "
            f"{env.name} is in {env.region}: synthesize it again with -c env={env.name}"
        )


def guarded(check: Check) -> Finding:
    """The check's finding, or a warning naming the call AWS did not answer and what to do."""
    name, run = check
    try:
        return run()
    except UnansweredError as error:
        return Finding(name, WARN, f"not checked: {error}", error.remedy, {"error": str(error)})
    except ServiceError as error:
        return Finding(
            name, WARN, f"not checked: {error}", "run btk doctor again; if it persists, look the code up in AWS's docs",
            {"error": str(error), "code": error.code},
        )  # fmt: skip
    except SHAPE_ERRORS as error:  # an answer outside AWS's documented shape
        what = f"an AWS answer is not in the documented shape ({type(error).__name__}: {error})"
        return Finding(name, WARN, f"not checked: {what}", "run btk doctor again", {"error": what})


def _own_file_system(stack: Answer[DeployedStack | None]) -> str | None:
    deployed = stack.get()
    return deployed.outputs.get("FileSystemId") if deployed else None


def run_checks(target: Target, caller: Caller, now: datetime) -> list[Finding]:
    """Every finding for ``target``, in order."""
    env, account = target.env, target.account
    need = target.assembly.bootstrap if target.assembly else BootstrapNeed()
    stack = Answer(lambda: describe_stack(caller, env.stack_name))
    checks: list[Check] = [
        *training_quota_checks(env, target.jobs, caller),
        (f"CDK bootstrap '{env.bootstrap_qualifier}'", partial(bootstrap_finding, env, account, need, caller)),
        *training_plan_checks(env, target.jobs, caller, now),
    ]
    if env.data_stage.mode == "fsx":
        checks += fsx_quota_checks(env, caller, partial(_own_file_system, stack))
    checks.append((f"stack {env.stack_name}", lambda: stack_finding(env, account, stack.get())))
    findings = [guarded(check) for check in checks]
    try:
        deployed = stack.get()
    except (UnansweredError, ServiceError, *SHAPE_ERRORS):
        deployed = None  # the stack line says why; what hangs on the stack cannot be read
    if deployed is not None:
        after_deploy: list[Check] = [
            *pipeline_checks(env, account, target.assembly, caller),
            ("training image", partial(image_finding, env, account, deployed, caller)),
            ("failure topic", partial(topic_finding, env, account, deployed, caller)),
        ]
        findings += [guarded(check) for check in after_deploy]
    return findings
