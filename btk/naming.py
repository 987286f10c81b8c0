"""Names shared by the infrastructure and the tools that read what it created.

The pipeline construct names pipelines and tags training jobs with these; ``btk report``
finds them by the same names. One definition, so the two cannot drift apart.
"""

from __future__ import annotations

import re

from btk.errors import BtkError

TAG_ENVIRONMENT = "btk:environment"
TAG_PROFILE = "btk:profile"
TAG_INSTANCE_TYPE = "btk:instance-type"

_PIPELINE_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}$")


def pipeline_name(environment: str, profile: str) -> str:
    """``btk-<env>-<profile>`` with every character SageMaker forbids (``.``, ``_``) as ``-``."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", f"btk-{environment}-{profile}")
    name = re.sub(r"-{2,}", "-", name).strip("-")
    if not _PIPELINE_NAME.match(name):
        raise BtkError(f"pipeline name {name!r} is not a valid SageMaker pipeline name: rename the profile")
    return name
