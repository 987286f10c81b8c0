"""Synthesize an environment's TrainingStack exactly as app.py does, once per test session.

The infrastructure tests (tests/infra) and the pipeline tests of the real stack
(tests/pipeline) read the same synthesized templates: each environment is synthesized once
per process, whichever folder asks first.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import environments

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("AWS_REGION", "us-east-1")

REPO = Path(__file__).resolve().parents[1]
ENV_NAMES = tuple(env.name for env in environments.ENVIRONMENTS)


@dataclass
class Synth:
    """One synthesized environment: the app, the stack, the output folder and the template."""

    env_name: str
    app: Any
    stack: Any
    outdir: Path
    template: dict[str, Any]

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == resource_type}

    def one(self, resource_type: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(resource_type)
        assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
        return next(iter(found.items()))


def synthesize(env_name: str, outdir: Path) -> Synth:
    """Build the app exactly as app.py does and synthesize it (cdk-nag runs and may raise)."""
    from app import build_app

    app = build_app({"env": env_name}, outdir=str(outdir))
    app.synth()
    stack = app.node.find_child("TrainingStack")
    template = json.loads((outdir / f"{stack.artifact_id}.template.json").read_text())
    return Synth(env_name, app, stack, outdir, template)


_SYNTHESIZED: dict[str, Synth] = {}


@pytest.fixture(scope="session")
def synths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synth]:
    """Every environment, synthesized on first use and shared by every folder that imports this fixture."""
    for name in ENV_NAMES:
        if name not in _SYNTHESIZED:
            _SYNTHESIZED[name] = synthesize(name, tmp_path_factory.mktemp(f"cdk-{name}"))
    return dict(_SYNTHESIZED)


@pytest.fixture(params=ENV_NAMES)
def synth(request: pytest.FixtureRequest, synths: dict[str, Synth]) -> Synth:
    """Each environment in turn."""
    return synths[request.param]


def cli_app(**options: Any) -> Any:
    """``aws_cdk.App`` as the CDK CLI builds it for this project: cdk.json's context (feature flags,
    ``validateAgainstDefaultRules``) under any ``context`` given."""
    from aws_cdk import App

    from app import project_context

    context = {**project_context(), **options.pop("context", {})}
    return App(context=context, **options)
