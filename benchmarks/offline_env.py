"""The environment every synth benchmark runs under: offline, no credentials, no telemetry."""

from __future__ import annotations

import os

OFFLINE_ENV = {
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "CDK_DISABLE_VERSION_CHECK": "1",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "SAGEMAKER_VALIDATE_ROLE": "false",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def offline_environment() -> dict[str, str]:
    """The current environment without an AWS profile, plus :data:`OFFLINE_ENV`."""
    return {key: value for key, value in os.environ.items() if key != "AWS_PROFILE"} | OFFLINE_ENV
