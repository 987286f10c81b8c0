"""`npx cdk ...` run directly (not through make) prints no jsii end-of-life banner for Node 20: cdk.json's app
sets jsii's switch itself. The documented deploy (tests/deploy) runs the CLI without the switch and reads its
output for the banner."""

from __future__ import annotations

import json
import shlex

from stack_synth import REPO

SILENCE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


def test_cdk_json_app_silences_the_node_end_of_life_banner() -> None:
    """The app command sets the variable itself: jsii would print its banner as Python bytes literals."""
    command = shlex.split(json.loads((REPO / "cdk.json").read_text())["app"])
    assert command[0] == "env" and f"{SILENCE}=20" in command
    assert command[-2:] == [".venv/bin/python", "app.py"]
