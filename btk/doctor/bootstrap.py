"""The CDK bootstrap of the environment's qualifier: present in the account and region, recent enough.

``btk bootstrap --env ENV`` runs ``cdk bootstrap --qualifier Q`` (:mod:`btk.bootstrap`), which
writes its version to the SSM parameter ``/cdk-bootstrap/Q/version``; every
synthesized stack reads it (its ``BootstrapVersion``
parameter) and refuses to deploy below the version its synthesizer needs. aws-cdk-lib's
``DefaultStackSynthesizer`` needs 6 to deploy and 8 for its lookup role
(``MIN_BOOTSTRAP_STACK_VERSION`` and ``MIN_LOOKUP_ROLE_BOOTSTRAP_STACK_VERSION`` in
https://github.com/aws/aws-cdk/blob/main/packages/aws-cdk-lib/core/lib/stack-synthesizers/default-synthesizer.ts;
a synthesized cloud assembly states both in its ``manifest.json``, and a test compares them).
The deploy workflow reads the account through that lookup role, and ``cdk diff`` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from btk.bootstrap import bootstrap_command_line
from btk.doctor.aws import Caller, ServiceError
from btk.doctor.findings import FAIL, PASS, WARN, Finding
from btk.environment import EnvironmentConfig

DEPLOY_BOOTSTRAP_VERSION = 6
LOOKUP_ROLE_BOOTSTRAP_VERSION = 8
SYNTHESIZER = "aws-cdk-lib's DefaultStackSynthesizer"


@dataclass(frozen=True)
class BootstrapNeed:
    """The bootstrap versions the app needs: to deploy, and for the lookup role; ``source`` says who said so."""

    deploy: int = DEPLOY_BOOTSTRAP_VERSION
    lookup_role: int = LOOKUP_ROLE_BOOTSTRAP_VERSION
    source: str = SYNTHESIZER


def version_parameter(qualifier: str) -> str:
    """The SSM parameter the bootstrap of qualifier ``qualifier`` writes its version to."""
    return f"/cdk-bootstrap/{qualifier}/version"


def bootstrap_command(env: EnvironmentConfig, account: str) -> str:
    """The command that bootstraps (or upgrades the bootstrap of) the environment, as docs/deploy.md gives it."""
    return bootstrap_command_line(env, account)


def lookup_role_arn(env: EnvironmentConfig, account: str, partition: str = "aws") -> str:
    """The bootstrap's lookup role (read-only, scoped to its environment): what CI's doctor reads as."""
    name = f"cdk-{env.bootstrap_qualifier}-lookup-role-{account}-{env.region}"
    return f"arn:{partition}:iam::{account}:role/{name}"


def bootstrap_finding(env: EnvironmentConfig, account: str, need: BootstrapNeed, caller: Caller) -> Finding:
    """Whether the bootstrap of ``env.bootstrap_qualifier`` exists in the account and region at ``need``."""
    name = version_parameter(env.bootstrap_qualifier)
    check = f"CDK bootstrap '{env.bootstrap_qualifier}'"
    command = bootstrap_command(env, account)
    try:
        parameter = caller.call("ssm", "get_parameter", Name=name).get("Parameter") or {}
    except ServiceError as error:
        if error.code != "ParameterNotFound":
            raise
        return Finding(check, FAIL, f"no {name} in {account}/{env.region}: not bootstrapped", command)
    value = str(parameter.get("Value", ""))
    data = {"parameter": name, "version": value, "needed": need.deploy, "needed_lookup_role": need.lookup_role}
    if not value.strip().isdigit():
        return Finding(check, FAIL, f"{name} holds {value!r}, not a version number", command, data)
    version = int(value)
    found = (
        f"version {version} ({name}); the app needs {need.deploy}, its lookup role {need.lookup_role} ({need.source})"
    )
    if version < need.deploy:
        return Finding(check, FAIL, found, f"upgrade it: {command}", data)
    if version < need.lookup_role:
        return Finding(check, WARN, found, f"upgrade it for the lookup role (CI's doctor, cdk diff): {command}", data)
    return Finding(check, PASS, found, "", data)
