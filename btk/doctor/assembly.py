"""A fresh synth to compare the deployed stack with: the cloud assembly ``cdk synth`` wrote.

``btk`` does not import the CDK, so it does not synthesize; ``--cloud-assembly DIR`` names the
folder ``npx cdk synth TrainingStack -c env=NAME`` wrote (``cdk.out`` by default). Its
``manifest.json`` says which stack each template is (``stackName``), for which account and
region (``environment``), and the bootstrap versions the app needs
(``requiresBootstrapStackVersion``, on the stack and on its lookup role).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from btk.doctor.bootstrap import BootstrapNeed
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from btk.jsonfile import read_json_file

STACK_ARTIFACT = "aws:cloudformation:stack"
#: ``aws://ACCOUNT/REGION`` of a stack artifact; ``unknown-account`` when synthesized without one.
ENVIRONMENT = re.compile(r"aws://(?P<account>[^/]+)/(?P<region>[^/]+)")


@dataclass(frozen=True)
class CloudAssembly:
    """The environment's stack in a synthesized cloud assembly."""

    directory: Path
    template: dict[str, Any]
    account: str
    region: str
    bootstrap: BootstrapNeed


def _stack_artifacts(manifest: Any) -> list[dict[str, Any]]:
    artifacts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    if not isinstance(artifacts, dict):
        return []
    return [a for a in artifacts.values() if isinstance(a, dict) and a.get("type") == STACK_ARTIFACT]


def _properties(artifact: dict[str, Any]) -> dict[str, Any]:
    properties = artifact.get("properties")
    return properties if isinstance(properties, dict) else {}


def _version(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def read_cloud_assembly(directory: Path, env: EnvironmentConfig) -> CloudAssembly:
    """The environment's template, target and bootstrap needs from ``directory``; one line when it has none."""
    synth = f"npx cdk synth TrainingStack -c env={env.name} -o {directory}"
    if not (directory / "manifest.json").is_file():
        raise BtkError(f"--cloud-assembly {directory}: no manifest.json there: run {synth} first")
    manifest = read_json_file(directory / "manifest.json", f"--cloud-assembly {directory}/manifest.json")
    stacks = _stack_artifacts(manifest)
    names = [str(_properties(a).get("stackName", "")) for a in stacks]
    if env.stack_name not in names:
        held = ", ".join(name for name in names if name) or "no stack"
        raise BtkError(f"--cloud-assembly {directory} holds {held}, not {env.stack_name}: run {synth}")
    artifact = stacks[names.index(env.stack_name)]
    properties = _properties(artifact)
    template_file = str(properties.get("templateFile", ""))
    template = read_json_file(directory / template_file, f"--cloud-assembly {directory}/{template_file}")
    if not isinstance(template, dict):
        raise BtkError(f"--cloud-assembly {directory}/{template_file}: not a CloudFormation template")
    target = ENVIRONMENT.fullmatch(str(artifact.get("environment", "")))
    deploy = _version(properties.get("requiresBootstrapStackVersion"), BootstrapNeed().deploy)
    lookup_role = properties.get("lookupRole")
    lookup_role = lookup_role if isinstance(lookup_role, dict) else {}
    return CloudAssembly(
        directory=directory,
        template=template,
        account=target["account"] if target else "",
        region=target["region"] if target else "",
        bootstrap=BootstrapNeed(
            deploy=deploy,
            lookup_role=_version(lookup_role.get("requiresBootstrapStackVersion"), deploy),
            source=f"{directory}/manifest.json",
        ),
    )
