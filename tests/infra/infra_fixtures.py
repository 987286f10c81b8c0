"""Helpers for the infrastructure tests: synthesize an environment and read its template."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# stacks/ and training_constructs/ live at the repository root next to app.py.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("AWS_REGION", "us-east-1")

ENV_NAMES = ("dev", "staging", "prod")


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
