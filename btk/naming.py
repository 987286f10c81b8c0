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
TAG_PURPOSE = "btk:purpose"
PURPOSE_REHEARSAL = "rehearsal"
"""A rehearsal job's ``btk:purpose`` (long runs have no such tag)."""

#: Longest job-name prefix: SageMaker Pipelines appends its own suffix up to the 63-character limit.
JOB_NAME_PREFIX_MAX = 40

#: SageMaker pipeline names; use with ``fullmatch`` (``$`` with ``match`` accepts a trailing newline).
_PIPELINE_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}")


def environment_prefix(environment: str) -> str:
    """``btk-<env>-``: how every pipeline, job and dashboard name of one environment starts.

    The pipeline role may only touch jobs whose names start with it, and the failure rules
    and log queries find the environment's jobs by it.
    """
    return f"btk-{environment}-"


def pipeline_name(environment: str, profile: str) -> str:
    """``btk-<env>-<profile>`` with every character SageMaker forbids (``.``, ``_``) as ``-``."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", f"{environment_prefix(environment)}{profile}")
    name = re.sub(r"-{2,}", "-", name).strip("-")
    if not _PIPELINE_NAME.fullmatch(name):
        raise BtkError(f"pipeline name {name!r} is not a valid SageMaker pipeline name: rename the profile")
    return name


def job_name_prefix(environment: str, profile: str) -> str:
    """Prefix of one profile's job names: the pipeline name, cut to leave room for SageMaker's suffix."""
    return pipeline_name(environment, profile)[:JOB_NAME_PREFIX_MAX].rstrip("-")
