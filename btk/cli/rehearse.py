"""``btk rehearse PROFILE --env ENV``: start a rehearsal of the profile's pipeline, wait for it, judge it.

See :mod:`btk.rehearse`. Exit 0: the rehearsal passed (or was started, with ``--no-wait``); 1: it failed one of
the gate's rules, or did not end in time; 2: bad input or an AWS call that failed (one line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from btk.cli.arguments import non_empty, non_empty_path
from btk.errors import BtkError

POLL_SECONDS = 60.0


def sagemaker_client(region: str) -> Any:
    """The SageMaker client of every call here (:mod:`btk.aws_clients`: set-up checked, waits bounded)."""
    from btk.aws_clients import make_client

    return make_client("sagemaker", region, purpose="btk-rehearse")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rehearse", help="a short run of a profile's pipeline on demand, judged by the rehearsal gate's rules",
        description="Start the profile's pipeline for a rehearsal (the environment's rehearsal steps, on the "
        "fewest nodes that hold the plan), wait for it, and judge its training job by the gate's rules: speed, "
        "non-finite steps, peak memory, the loss falling. The result is recorded as a rehearsal in the evidence "
        "store. For environments that do not rehearse every execution themselves.",
    )
    parser.add_argument("profile", type=non_empty, metavar="PROFILE")
    parser.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    parser.add_argument("--no-wait", action="store_true", help="start it and print how to judge it later")
    parser.add_argument("--execution", type=non_empty, metavar="ARN",
                        help="judge this execution (started before) instead of starting one")
    parser.add_argument("--evidence", type=non_empty_path, metavar="STORE",
                        help="where the rehearsal is recorded (default: $BTK_EVIDENCE, else btk-evidence.json here)")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run_rehearse(args)


def run_rehearse(args: argparse.Namespace, *, client: Any = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, stdout: TextIO | None = None) -> int:
    """The command body; the SageMaker client, sleep and clock are injectable for tests."""
    from btk.catalog import get_environment, get_profile
    from btk.evidence import evidence_path, read_evidence
    from btk.rehearse import rehearsal_run

    out = stdout if stdout is not None else sys.stdout
    if args.no_wait and args.execution:
        raise BtkError("--no-wait starts a rehearsal and --execution judges one: give one of them")
    env = get_environment(args.env)
    get_profile(args.profile)  # an unknown name fails with suggestions
    run = rehearsal_run(env, args.profile)
    store = evidence_path(args.evidence)
    read_evidence(store)  # a store that cannot be read stops the command before anything starts
    if client is None:
        client = sagemaker_client(env.region)
    from btk.report.aws import SageMakerReader

    reader = SageMakerReader(client, sleep=sleep)
    execution = args.execution
    if execution is None:
        out.write(run.describe() + "\n")
        execution = _start(client, run)
        out.write(f"started {execution}\n")
        if args.no_wait:
            out.write(f"judge it when it ends: btk rehearse {args.profile} --env {env.name} --execution {execution}\n")
            return 0
    status = _wait(reader, execution, run.max_runtime_seconds, sleep, clock)
    if status is None:
        out.write(f"{execution} has not ended within the rehearsal's time limit and the start-up allowance: judge "
                  f"it later with --execution {execution}\n")
        return 1
    return _judge(reader, run, execution, status, store, out, env.region)


def _start(client: Any, run: Any) -> str:
    """StartPipelineExecution; any failure is one line."""
    from botocore.exceptions import ClientError

    from btk.aws_clients import call_failure_line, call_failures
    from btk.rehearse import EXECUTION_DISPLAY_NAME

    try:
        answer = client.start_pipeline_execution(PipelineName=run.pipeline, PipelineParameters=run.parameters,
                                                 PipelineExecutionDisplayName=EXECUTION_DISPLAY_NAME)
    except ClientError as error:
        problem = error.response.get("Error", {})
        raise BtkError(f"sagemaker:StartPipelineExecution of {run.pipeline} failed ({problem.get('Code')}): "
                       f"{' '.join(str(problem.get('Message', '')).split())[:300]}") from None
    except call_failures() as error:
        raise BtkError(f"sagemaker:StartPipelineExecution failed: {call_failure_line(error)}") from None
    arn = answer.get("PipelineExecutionArn")
    if not isinstance(arn, str) or not arn:
        raise BtkError("sagemaker:StartPipelineExecution answered without a PipelineExecutionArn")
    return arn


def _wait(reader: Any, execution: str, max_runtime_seconds: int, sleep: Callable[[float], None],
          clock: Callable[[], float]) -> str | None:
    """The execution's final status, or None when it has not ended within its time limit plus the allowance."""
    from btk.rehearse import ENDED, START_UP_ALLOWANCE_SECONDS

    deadline = clock() + max_runtime_seconds + START_UP_ALLOWANCE_SECONDS
    while True:
        status = reader.call("describe_pipeline_execution", PipelineExecutionArn=execution).get(
            "PipelineExecutionStatus")
        if not isinstance(status, str):
            raise BtkError(f"sagemaker:DescribePipelineExecution answered for {execution} without a status")
        if status in ENDED:
            return str(status)
        if clock() >= deadline:
            return None
        sleep(POLL_SECONDS)


def _judge(reader: Any, run: Any, execution: str, status: str, store: Path, out: TextIO, region: str) -> int:
    from btk.evidence import merged, read_evidence, write_evidence
    from btk.naming import PURPOSE_REHEARSAL, TAG_PURPOSE
    from btk.rehearse import described, held_rung, judge, training_job_name
    from btk.report.collect import Collection, JobOrigin
    from btk.report.record import measured_runs

    steps = list(reader.pages("list_pipeline_execution_steps", "PipelineExecutionSteps",
                              PipelineExecutionArn=execution))
    name = training_job_name(steps)
    if name is None:
        out.write(f"{execution}: {status} before its training job started: read its steps with aws sagemaker "
                  f"list-pipeline-execution-steps --pipeline-execution-arn {execution}\n")
        return 1
    job = reader.call("describe_training_job", TrainingJobName=name)
    checks = judge(run.gate, job)
    for check in checks:
        out.write(f"  {'pass' if check.passed else 'FAIL'}  {check.line}\n")
    for line in described(run.gate, job):
        out.write(f"  info  {line}\n")
    rung = held_rung(job)
    if rung:
        out.write(f"  note  it trained on rung {rung} of its knob ladder (the plan's knobs ran out of memory): start "
                  f"the long run there with the pipeline parameter StartRung={rung} (aws sagemaker "
                  f"start-pipeline-execution --pipeline-name {run.pipeline} --pipeline-parameters "
                  f"Name=StartRung,Value={rung}), or re-plan with more memory headroom\n")
    passed = all(check.passed for check in checks)
    collection = Collection(jobs=[(job, JobOrigin(tags={TAG_PURPOSE: PURPOSE_REHEARSAL}))], plans={},
                            missing_pipelines=[], notes=[])
    recorded = measured_runs(collection, region=region, since=datetime.min.replace(tzinfo=UTC))
    if recorded.runs:
        evidence, added, replaced = merged(read_evidence(store), recorded.runs)
        write_evidence(store, evidence)
        out.write(f"recorded in {store} as a rehearsal ({added} added, {replaced} replaced)\n")
    out.write(f"rehearsal {'passed' if passed else 'failed'}: training job {name}\n")
    return 0 if passed else 1

