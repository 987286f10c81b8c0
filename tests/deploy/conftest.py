"""The deploy tests import stacks/ and app.py from the repository root, like `cdk synth` does."""

from __future__ import annotations

import os

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("AWS_REGION", "us-east-1")
