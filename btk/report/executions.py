"""Which training jobs are attempts of one experiment (one pipeline execution).

The pipeline retries a job that failed for want of capacity or inside SageMaker as a new
job of the same execution, and every job of an execution writes to that execution's own
checkpoint prefix (``<root>/<profile>/<execution id>``, from which a retry resumes). So jobs
sharing ``CheckpointConfig.S3Uri`` are attempts of one execution, whether they were found
through the pipeline (``ListPipelineExecutionSteps`` names only a step's latest job) or by
their tags (which find the earlier attempts too, and the jobs of a deleted pipeline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from btk.report.collect import JobOrigin

_T = TypeVar("_T")


def experiment_key(job: dict[str, Any], origin: JobOrigin) -> str:
    """What the job's experiment is known by: its checkpoint prefix, else its pipeline
    execution, else the job itself (a job outside any execution is an experiment of its own)."""
    checkpoint = str(job.get("CheckpointConfig", {}).get("S3Uri", "")).rstrip("/")
    if checkpoint:
        return f"checkpoint:{checkpoint}"
    if origin.pipeline_execution_arn:
        return f"execution:{origin.pipeline_execution_arn}"
    return f"job:{job['TrainingJobName']}"


def group_attempts(items: Sequence[_T], key: Callable[[_T], str], order: Callable[[_T], Any]) -> list[list[_T]]:
    """``items`` grouped by ``key``, each group sorted oldest first by ``order`` (its last item is
    the attempt that decided the experiment), groups in order of first appearance."""
    groups: dict[str, list[_T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return [sorted(group, key=order) for group in groups.values()]
