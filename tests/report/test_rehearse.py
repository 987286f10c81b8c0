"""``btk rehearse``: a short run of a profile's pipeline, judged by the gate's rules, recorded as a rehearsal.

SageMaker's answers come from botocore's Stubber (every call and answer checked against the service model):
a rehearsal that passes, one too slow, one whose loss did not fall, one that ran out of memory on every rung,
one still running past its time limit; and the calls it makes are exactly the start with the rehearsal's
parameters, the status polls, the execution's steps and the training job.
"""

from __future__ import annotations

import argparse
import io
from typing import Any

import fixture_catalog
import pytest
from botocore.stub import Stubber
from report_fixtures import KNOBS_1B, describe, job_arn, june, transitions

from btk.cli import build_parser, main
from btk.cli.rehearse import POLL_SECONDS, run_rehearse
from btk.errors import BtkError
from btk.evidence import read_evidence
from btk.hardware import get_instance_type
from btk.planner.search import plan_profile
from btk.rehearse import EXECUTION_DISPLAY_NAME, START_UP_ALLOWANCE_SECONDS, rehearsal_run

PROFILE = fixture_catalog.DEV.profiles[0]
EXECUTION = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/btk-dev-llama3-2-1b/execution/abc123"
JOB = "pipelines-abc123-Train-XYZ"
OOM = ("AlgorithmError: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; knob ladder: no rung "
       "left")


def _gate() -> Any:
    return rehearsal_run(fixture_catalog.DEV, PROFILE).gate


def _job(speed: float, *, memory: float = 60.0, loss_drop: float = 1.5, status: str = "Completed",
         failure: str | None = None) -> dict[str, Any]:
    when = june(15, 9)
    metrics = [{"MetricName": name, "Value": value, "Timestamp": when} for name, value in (
        ("train:tokens_per_second_per_gpu", speed), ("train:nonfinite_steps", 0.0),
        ("train:peak_memory_gib", memory), ("train:loss_drop", loss_drop), ("train:first_step_seconds", 412.5),
        ("train:step_time_spread", 0.031), ("train:peak_reserved_gib", memory + 4.5), ("train:mfu", 0.4123))]
    return describe(JOB, profile=PROFILE, status=status, secondary=status, created=june(15, 8), knobs=KNOBS_1B,
                    phases=transitions(june(15, 8), ("Training", 30, "Training"), (status, None, status)),
                    final_metrics=None if failure else metrics, failure_reason=failure)


def _queue_start(stubber: Stubber) -> None:
    run = rehearsal_run(fixture_catalog.DEV, PROFILE)
    stubber.add_response("start_pipeline_execution", {"PipelineExecutionArn": EXECUTION},
                         {"PipelineName": run.pipeline, "PipelineParameters": run.parameters,
                          "PipelineExecutionDisplayName": EXECUTION_DISPLAY_NAME})


def _queue_end(stubber: Stubber, job: dict[str, Any], *, polls: int = 2) -> None:
    for status in ["Executing"] * (polls - 1) + ["Succeeded" if job["TrainingJobStatus"] == "Completed" else "Failed"]:
        stubber.add_response("describe_pipeline_execution", {"PipelineExecutionArn": EXECUTION,
                                                             "PipelineExecutionStatus": status},
                             {"PipelineExecutionArn": EXECUTION})
    steps = [{"StepName": "Train", "StepStatus": "Succeeded", "Metadata": {"TrainingJob": {"Arn": job_arn(JOB)}}},
             {"StepName": "CheckTrainingPlan", "StepStatus": "Succeeded", "Metadata": {}}]
    stubber.add_response("list_pipeline_execution_steps", {"PipelineExecutionSteps": steps},
                         {"PipelineExecutionArn": EXECUTION})
    stubber.add_response("describe_training_job", job, {"TrainingJobName": JOB})


def _rehearse(client: Any, tmp_path: Any, *extra: str) -> tuple[int, str, list[float]]:
    args: argparse.Namespace = build_parser().parse_args(
        ["rehearse", PROFILE, "--env", "dev", "--evidence", str(tmp_path / "evidence.json"), *extra])
    out, slept = io.StringIO(), []
    code = run_rehearse(args, client=client, sleep=slept.append, clock=lambda: 0.0, stdout=out)
    return code, out.getvalue(), slept


def test_the_rehearsal_runs_the_gates_length_on_its_nodes() -> None:
    """TotalTokens is the rehearsal's steps times the plan's tokens per step; InstanceCount its nodes."""
    run = rehearsal_run(fixture_catalog.DEV, PROFILE)
    plan = plan_profile(fixture_catalog.PROFILES[PROFILE], get_instance_type(fixture_catalog.DEV.instance_type),
                        fixture_catalog.DEV.instance_count)
    rehearsal = fixture_catalog.DEV.rehearsal
    assert run.total_tokens == rehearsal.steps * plan.global_batch.planned_tokens
    assert {item["Name"]: item["Value"] for item in run.parameters} == {
        "InstanceCount": str(run.gate.nodes), "TotalTokens": str(run.total_tokens),
        "MaxRuntimeSeconds": str(rehearsal.max_runtime_minutes * 60)}


def test_a_rehearsal_that_passes_is_recorded_as_one(sagemaker_and_stubber: tuple[Any, Stubber], tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    gate = _gate()
    _queue_start(stubber)
    _queue_end(stubber, _job(gate.predicted_tokens_per_second_per_gpu * 0.9))
    code, out, slept = _rehearse(client, tmp_path)
    stubber.assert_no_pending_responses()
    assert code == 0 and slept == [POLL_SECONDS]
    lines = out.splitlines()
    assert lines[0].startswith(f"rehearsal of btk-dev-llama3-2-1b: {gate.steps} steps on {gate.nodes} x ")
    assert lines[1] == f"started {EXECUTION}"
    assert [line.split()[0] for line in lines[2:6]] == ["pass"] * 4
    assert lines[6:10] == [f"  info  MFU 41.2% of dense bf16 (plan {gate.predicted_mfu:.1%})",
                           "  info  time to the first step 412 s (model build, data check and compilation included)",
                           "  info  step time spread 3.1% over the metric windows after the first",
                           "  info  peak reserved memory 64.50 GiB/GPU (allocated 60.00; plan "
                           f"{gate.predicted_memory_gib:,.1f} allocated)"]
    assert 0 < gate.predicted_mfu < 1 and 0 < gate.predicted_memory_gib <= gate.max_peak_memory_gib
    assert lines[-1] == f"rehearsal passed: training job {JOB}"
    runs = read_evidence(tmp_path / "evidence.json").runs
    assert [(run.id, run.kind, run.profile) for run in runs] == [(JOB, "rehearsal", PROFILE)]


@pytest.mark.parametrize(("job", "failed"), [
    (lambda gate: _job(gate.min_tokens_per_second_per_gpu * 0.9), "tokens/s/GPU"),
    (lambda gate: _job(gate.predicted_tokens_per_second_per_gpu, loss_drop=-0.01), "loss fell by -0.0100"),
    (lambda gate: _job(gate.predicted_tokens_per_second_per_gpu, memory=gate.max_peak_memory_gib + 1), "peak memory"),
])
def test_a_rehearsal_that_misses_a_rule_fails_naming_it(sagemaker_and_stubber: tuple[Any, Stubber], tmp_path: Any,
                                                        job: Any, failed: str) -> None:
    client, stubber = sagemaker_and_stubber
    _queue_start(stubber)
    _queue_end(stubber, job(_gate()), polls=1)
    code, out, _ = _rehearse(client, tmp_path)
    assert code == 1 and out.splitlines()[-1] == f"rehearsal failed: training job {JOB}"
    failures = [line for line in out.splitlines() if line.startswith("  FAIL")]
    assert len(failures) == 1 and failed in failures[0]


def test_a_rehearsal_out_of_memory_on_every_rung_says_to_re_plan(sagemaker_and_stubber: tuple[Any, Stubber],
                                                                 tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    _queue_start(stubber)
    _queue_end(stubber, _job(0.0, status="Failed", failure=OOM), polls=1)
    code, out, _ = _rehearse(client, tmp_path)
    assert code == 1
    assert f"  FAIL  training job {JOB}: Failed (AlgorithmError: torch.OutOfMemoryError" in out
    assert "re-plan with more memory headroom" in out
    assert not (tmp_path / "evidence.json").exists()  # a failed job is no evidence of the plan's speed


def test_no_wait_starts_and_says_how_to_judge_later(sagemaker_and_stubber: tuple[Any, Stubber], tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    _queue_start(stubber)
    code, out, _ = _rehearse(client, tmp_path, "--no-wait")
    stubber.assert_no_pending_responses()
    assert code == 0 and out.splitlines()[-1] == (
        f"judge it when it ends: btk rehearse {PROFILE} --env dev --execution {EXECUTION}")


def test_an_execution_past_its_time_limit_is_left_to_judge_later(sagemaker_and_stubber: tuple[Any, Stubber],
                                                                 tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_response("describe_pipeline_execution", {"PipelineExecutionArn": EXECUTION,
                                                         "PipelineExecutionStatus": "Executing"},
                         {"PipelineExecutionArn": EXECUTION})
    args: argparse.Namespace = build_parser().parse_args(
        ["rehearse", PROFILE, "--env", "dev", "--execution", EXECUTION, "--evidence", str(tmp_path / "e.json")])
    out = io.StringIO()
    limit = rehearsal_run(fixture_catalog.DEV, PROFILE).max_runtime_seconds + START_UP_ALLOWANCE_SECONDS
    code = run_rehearse(args, client=client, sleep=lambda _: None, clock=iter([0.0, limit]).__next__, stdout=out)
    assert code == 1 and f"judge it later with --execution {EXECUTION}" in out.getvalue()


def test_an_environment_that_rehearses_itself_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from btk.environment import RehearsalConfig

    rehearsing = fixture_catalog.DEV.model_copy(update={"name": "rehearsing",
                                                        "rehearsal": RehearsalConfig(enabled=True)})
    fixture_catalog.install(monkeypatch, rehearsing)
    assert main(["rehearse", PROFILE, "--env", "rehearsing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rehearses every execution before its long run" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["rehearse", "llama3.1-8b", "--env", "dev"], "environment dev has no pipeline for profile 'llama3.1-8b'"),
    (["rehearse", PROFILE, "--env", "dev", "--no-wait", "--execution", EXECUTION], "give one of them"),
    (["rehearse", "no-such-profile", "--env", "dev"], "no-such-profile"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_failed_start_is_one_line(sagemaker_and_stubber: tuple[Any, Stubber], tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_client_error("start_pipeline_execution", service_error_code="ResourceNotFound",
                             service_message="Pipeline btk-dev-llama3-2-1b does not exist")
    with pytest.raises(BtkError, match=r"^sagemaker:StartPipelineExecution of btk-dev-llama3-2-1b failed "
                                       r"\(ResourceNotFound\): Pipeline btk-dev-llama3-2-1b does not exist$"):
        _rehearse(client, tmp_path)


def test_an_execution_answered_without_a_status_is_one_line(sagemaker_and_stubber: tuple[Any, Stubber],
                                                             tmp_path: Any) -> None:
    """An odd answer stops the wait in one line instead of polling forever."""
    client, stubber = sagemaker_and_stubber
    stubber.add_response("describe_pipeline_execution", {"PipelineExecutionArn": EXECUTION},
                         {"PipelineExecutionArn": EXECUTION})
    with pytest.raises(BtkError, match=rf"^sagemaker:DescribePipelineExecution answered for {EXECUTION} without a "
                                       "status$"):
        _rehearse(client, tmp_path, "--execution", EXECUTION)


def test_a_rehearsal_that_stepped_down_says_on_which_rung(sagemaker_and_stubber: tuple[Any, Stubber],
                                                          tmp_path: Any) -> None:
    client, stubber = sagemaker_and_stubber
    job = _job(_gate().predicted_tokens_per_second_per_gpu)
    job["FinalMetricDataList"].append({"MetricName": "train:knob_rung", "Value": 1.0, "Timestamp": june(15, 9)})
    _queue_start(stubber)
    _queue_end(stubber, job, polls=1)
    code, out, _ = _rehearse(client, tmp_path)
    assert code == 0 and "  note  it trained on rung 1 of its knob ladder" in out
    assert "the pipeline parameter StartRung=1 (" in out and "--pipeline-parameters Name=StartRung,Value=1)" in out
