"""``btk rehearse``: a short run of a profile's pipeline on demand, judged by the rehearsal gate's rules.

Where an environment does not rehearse every execution (on demand, by default), ``btk rehearse PROFILE --env
ENV`` starts the profile's pipeline for a rehearsal's length: :class:`~btk.environment.RehearsalConfig`'s
``steps`` (as pipeline parameter ``TotalTokens``: the steps times the plan's tokens per step), on the fewest
nodes that hold the plan's knobs (``InstanceCount``), within its ``max_runtime_minutes``. When the run ends its
training job is judged by the same rules as the pipeline's ``RehearsalPassed`` condition (speed, non-finite
steps, peak memory, the loss falling), each figure beside the plan's, and it is recorded as a rehearsal in
the team's evidence store, so ``btk plan`` and ``btk capacity search`` know the model ran on the instance type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from btk.metrics import METRICS_BY_KEY
from btk.naming import pipeline_name
from btk.planner.search import RehearsalGate, plan_profile, rehearsal_gate
from btk.report.classify import classify_failure, first_line

EXECUTION_DISPLAY_NAME = "btk-rehearsal"
ENDED = ("Succeeded", "Failed", "Stopped")
"""Pipeline execution statuses after which nothing more runs."""
START_UP_ALLOWANCE_SECONDS = 3600
"""How long past the rehearsal's time limit ``--wait`` keeps waiting: image pull, data staging, the plan check."""


@dataclass(frozen=True)
class RehearsalRun:
    """The pipeline execution that rehearses a profile: its parameters and the gate it is judged by."""

    pipeline: str
    instance_type: str
    gate: RehearsalGate
    total_tokens: int
    max_runtime_seconds: int

    @property
    def parameters(self) -> list[dict[str, str]]:
        """StartPipelineExecution's ``PipelineParameters``."""
        return [{"Name": "InstanceCount", "Value": str(self.gate.nodes)},
                {"Name": "TotalTokens", "Value": str(self.total_tokens)},
                {"Name": "MaxRuntimeSeconds", "Value": str(self.max_runtime_seconds)}]

    def describe(self) -> str:
        """What it runs, costs and must reach (printed before it starts)."""
        gate = self.gate
        return (f"rehearsal of {self.pipeline}: {gate.steps} steps on {gate.nodes} x {self.instance_type}, about "
                f"{gate.training_seconds / 60:.0f} min of training (${gate.usd:,.0f}) plus start-up and compilation, "
                f"at most {self.max_runtime_seconds // 60} min; it passes at >= "
                f"{gate.min_tokens_per_second_per_gpu:,.1f} tokens/s/GPU (of "
                f"{gate.predicted_tokens_per_second_per_gpu:,.1f} predicted), no non-finite step, peak memory within "
                f"{gate.max_peak_memory_gib:,.1f} GiB/GPU" + (" and the loss falling" if gate.require_falling_loss
                                                             else ""))


def rehearsal_run(env: EnvironmentConfig, profile_name: str) -> RehearsalRun:
    """The rehearsal of ``profile_name``'s plan in ``env``; one line where the environment rehearses anyway."""
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type

    if profile_name not in env.profiles:
        raise BtkError(f"environment {env.name} has no pipeline for profile {profile_name!r}: its profiles are "
                       f"{', '.join(env.profiles)}")
    if env.rehearses:
        raise BtkError(f"environment {env.name} rehearses every execution before its long run (rehearsal=...): "
                       "start its pipeline, whose RehearsalPassed step judges the rehearsal")
    instance = get_instance_type(env.instance_type)
    plan = plan_profile(get_profile(profile_name), instance, env.instance_count)
    rehearsal = env.rehearsal
    gate = rehearsal_gate(plan, rehearsal.steps, rehearsal.min_throughput_share,
                          require_falling_loss=rehearsal.require_falling_loss)
    return RehearsalRun(pipeline_name(env.name, profile_name), instance.name, gate,
                        total_tokens=rehearsal.steps * plan.global_batch.planned_tokens,
                        max_runtime_seconds=rehearsal.max_runtime_minutes * 60)


@dataclass(frozen=True)
class Check:
    """One rule of the gate against the job's figure."""

    name: str
    passed: bool
    line: str


def _metric(job: dict[str, Any], key: str) -> float | None:
    name = METRICS_BY_KEY[key].sagemaker_name
    values = [item.get("Value") for item in job.get("FinalMetricDataList", []) if item.get("MetricName") == name]
    value = values[-1] if values else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def judge(gate: RehearsalGate, job: dict[str, Any]) -> list[Check]:
    """The gate's rules on the rehearsal's training job (DescribeTrainingJob), each with the plan's figure."""
    status = job.get("TrainingJobStatus")
    if status != "Completed":
        reason = first_line(job.get("FailureReason")) or "no reason given"
        cause = classify_failure(job.get("FailureReason")) if status == "Failed" else None
        advice = ("; every rung of the knob ladder ran out of memory: re-plan with more memory headroom (btk plan "
                  "--set ...)" if cause == "out_of_memory" else "")
        return [Check("job", False, f"training job {job.get('TrainingJobName')}: {status} ({reason}){advice}")]
    speed, nonfinite = _metric(job, "tokens_per_second_per_gpu"), _metric(job, "nonfinite_steps")
    memory, drop = _metric(job, "peak_memory_gib"), _metric(job, "loss_drop")
    checks = [
        Check("speed", speed is not None and speed >= gate.min_tokens_per_second_per_gpu,
              f"tokens/s/GPU {_shown(speed, 1)} (plan {gate.predicted_tokens_per_second_per_gpu:,.1f}; needs >= "
              f"{gate.min_tokens_per_second_per_gpu:,.1f})"),
        Check("nonfinite", nonfinite == 0, f"non-finite steps {_shown(nonfinite, 0)} (needs 0)"),
        Check("memory", memory is not None and memory <= gate.max_peak_memory_gib,
              f"peak memory {_shown(memory, 2)} GiB/GPU (needs <= {gate.max_peak_memory_gib:,.2f}, the planner's "
              "budget)"),
    ]
    if gate.require_falling_loss:
        checks.append(Check("loss", drop is not None and drop > 0,
                            f"loss fell by {_shown(drop, 4)} from the first metric line to the last (needs > 0)"))
    return checks


def described(gate: RehearsalGate, job: dict[str, Any]) -> list[str]:
    """What the rehearsal measured beyond the gate's rules (its MFU, the trainer's once-per-run metric lines), each
    beside the plan's figure where the planner has one."""
    lines = []
    mfu = _metric(job, "mfu")
    if mfu is not None:
        lines.append(f"MFU {mfu:.1%} of dense bf16 (plan {gate.predicted_mfu:.1%})")
    first, spread, reserved = (_metric(job, key) for key in ("first_step_seconds", "step_time_spread",
                                                             "peak_reserved_gib"))
    if first is not None:
        lines.append(f"time to the first step {first:,.0f} s (model build, data check and compilation included)")
    if spread is not None:
        lines.append(f"step time spread {spread:.1%} over the metric windows after the first")
    if reserved is not None:
        allocated = _metric(job, "peak_memory_gib")
        lines.append(f"peak reserved memory {reserved:,.2f} GiB/GPU (allocated {_shown(allocated, 2)}; plan "
                     f"{gate.predicted_memory_gib:,.1f} allocated)")
    return lines


def held_rung(job: dict[str, Any]) -> int:
    """The knob-ladder rung the rehearsal trained on (0: the plan's own knobs)."""
    rung = _metric(job, "knob_rung")
    return int(rung) if rung is not None else 0


def _shown(value: float | None, digits: int) -> str:
    return "missing" if value is None else f"{value:,.{digits}f}"


def training_job_name(steps: list[dict[str, Any]]) -> str | None:
    """The training job of the execution's long-run step (ListPipelineExecutionSteps' answer), newest first."""
    for step in steps:
        arn = step.get("Metadata", {}).get("TrainingJob", {}).get("Arn")
        if isinstance(arn, str) and step.get("StepName", "").startswith("Train"):
            return arn.rsplit("/", 1)[-1]
    return None
