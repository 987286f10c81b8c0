"""Fixtures for the infrastructure tests: each environment is synthesized once per session."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sys

import pytest

REPO = Path(__file__).resolve().parents[2]
# stacks/ and training_constructs/ live at the repository root next to app.py.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "1")
os.environ.setdefault("AWS_REGION", "us-east-1")

ENV_NAMES = ("dev", "staging", "prod")


@dataclass
class Synth:
    """One synthesized environment: the config, the app, the stack and its template."""

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
    from app import build_app

    app = build_app({"env": env_name}, outdir=str(outdir))
    app.synth()  # runs the cdk-nag plugin: an unacknowledged finding raises here
    stack = app.node.find_child("TrainingStack")
    template = json.loads((outdir / f"{stack.artifact_id}.template.json").read_text())
    return Synth(env_name, app, stack, outdir, template)


@pytest.fixture(scope="session")
def synths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synth]:
    return {name: synthesize(name, tmp_path_factory.mktemp(f"cdk-{name}")) for name in ENV_NAMES}


@pytest.fixture(params=ENV_NAMES)
def synth(request: pytest.FixtureRequest, synths: dict[str, Synth]) -> Synth:
    return synths[request.param]
