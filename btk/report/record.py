"""What ``btk report --record-evidence`` keeps: each completed job's measured speed, as the planner's evidence.

Every job of the report's window that completed, ran on one instance type, and reported its final
``train:tokens_per_second_per_gpu`` (the last metric line: a steady-state window) becomes a
:class:`~btk.evidence.MeasuredRun` with the architecture and knobs its hyperparameters hold. A
rehearsal (tag ``btk:purpose=rehearsal``) is recorded as one; the job name is the run's id, so
recording the same window again replaces, never duplicates. Jobs that failed, stopped or still run
are not evidence of a plan's speed and are left out, each counted by why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from btk.evidence import MeasuredRun
from btk.naming import PURPOSE_REHEARSAL, TAG_PURPOSE
from btk.report.collect import Collection
from btk.report.economics import (
    TOKENS_METRIC,
    final_metrics,
    job_profile,
    knob_rung,
    parse_job_knobs,
    unquoted_hyperparameters,
)


@dataclass(frozen=True)
class Recorded:
    """The runs a report's jobs give, and how many jobs were left out for each reason."""

    runs: tuple[MeasuredRun, ...]
    left_out: dict[str, int]

    def summary(self) -> str:
        reasons = ", ".join(f"{count} {why}" for why, count in sorted(self.left_out.items()))
        measured = f"{len(self.runs)} completed job(s) with a measured speed"
        return f"{measured} (left out: {reasons})" if reasons else measured


def measured_runs(collection: Collection, *, region: str, since: datetime,
                  profiles: Sequence[str] | None = None) -> Recorded:
    """The evidence in ``collection``'s jobs created at or after ``since`` (of ``profiles`` when given)."""
    runs: list[MeasuredRun] = []
    left_out: Counter[str] = Counter()
    for job, origin in collection.jobs:
        if job["CreationTime"] < since:
            continue
        hyperparameters = unquoted_hyperparameters(job)
        profile = job_profile(job, origin, hyperparameters)
        if profiles is not None and profile not in profiles:
            continue
        why = _left_out_because(job)
        metrics = final_metrics(job)
        knobs, architecture = parse_job_knobs(hyperparameters, [], knob_rung(metrics))  # the knobs it trained on
        speed = metrics.get(TOKENS_METRIC)
        if why is None and architecture is None:
            why = "without btk hyperparameters"
        if why is None and knobs is None:
            why = "on a knob rung its hyperparameters do not hold"
        if why is None and (speed is None or not math.isfinite(speed) or speed <= 0):
            why = "without a final tokens/s"
        if why is not None:
            left_out[why] += 1
            continue
        resource = job["ResourceConfig"]
        name = job["TrainingJobName"]
        try:
            runs.append(MeasuredRun(
                id=name, kind="rehearsal" if origin.tags.get(TAG_PURPOSE) == PURPOSE_REHEARSAL else "run",
                profile=profile, architecture=architecture, instance_type=resource["InstanceType"],
                nodes=resource["InstanceCount"], knobs=knobs, tokens_per_second_per_gpu=speed,
                source=f"SageMaker training job {name} ({region}): its final {TOKENS_METRIC}",
            ))
        except ValidationError:  # an answer outside what evidence holds (a name, a node count): not recorded
            left_out["that evidence cannot hold"] += 1
    return Recorded(tuple(runs), dict(left_out))


def _left_out_because(job: dict[str, object]) -> str | None:
    """Why a job is no evidence of its plan's speed before its figures are read (None: it may be)."""
    if job.get("TrainingJobStatus") != "Completed":
        return "not completed"
    resource = job.get("ResourceConfig")
    if not isinstance(resource, dict) or "InstanceGroups" in resource or "InstanceType" not in resource:
        return "on instance groups"
    return None
