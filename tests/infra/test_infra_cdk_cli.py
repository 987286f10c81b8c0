"""`npx cdk ...` run directly (not through make) prints no jsii end-of-life banner for Node 20."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from stack_synth import REPO

import environments

SILENCE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


def test_cdk_json_app_silences_the_node_end_of_life_banner() -> None:
    """The app command sets the variable itself: jsii would print its banner as Python bytes literals."""
    command = shlex.split(json.loads((REPO / "cdk.json").read_text())["app"])
    assert command[0] == "env" and f"{SILENCE}=20" in command
    assert command[-2:] == [".venv/bin/python", "app.py"]


@pytest.mark.slow
def test_direct_cdk_synth_prints_no_banner(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != SILENCE and not key.startswith("AWS_")}
    env.update({"CDK_DISABLE_VERSION_CHECK": "1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": str(tmp_path / "absent"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "absent")})
    cdk = [str(REPO / "node_modules/.bin/cdk"), "synth", "TrainingStack", "--quiet", "--no-notices",
           "-c", f"env={environments.DEFAULT_ENVIRONMENT}", "-o", str(tmp_path / "out")]
    result = subprocess.run(cdk, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout + result.stderr
    assert "end-of-life" not in printed.lower() and "b'" not in printed, printed[:2000]
