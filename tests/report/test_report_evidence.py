"""``btk report --record-evidence``: completed jobs' measured speed becomes the planner's evidence.

The jobs are the report fixtures' SageMaker answers (botocore's Stubber checks every call against the
service model): what is recorded is exactly their final ``train:tokens_per_second_per_gpu`` with
the architecture and knobs of their hyperparameters; what failed, stopped or still runs is left
out, counted by why; recording twice changes nothing; a rehearsal is recorded as one.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from botocore.stub import Stubber
from report_fixtures import (
    ENV,
    INSTANCE,
    KNOBS_1B,
    NOW,
    PROFILES,
    REGION,
    SINCE,
    FakePredictor,
    describe,
    june,
    metrics,
    queue_profile_history,
    transitions,
)

from btk.cli import build_parser, main
from btk.errors import BtkError
from btk.evidence import read_evidence
from btk.hardware import get_instance_type
from btk.naming import PURPOSE_REHEARSAL, TAG_PROFILE, TAG_PURPOSE
from btk.planner.evidence import correct_plan
from btk.planner.search import plan_profile
from btk.report.collect import Collection, JobOrigin
from btk.report.record import measured_runs


def _record(client: Any, store: Path) -> tuple[int, str]:
    from btk.cli.report import run_report

    args = build_parser().parse_args(["report", "--env", ENV, "--profile", PROFILES[0], "--format", "json",
                                      "--record-evidence", "--evidence", str(store)])
    out, err = io.StringIO(), io.StringIO()
    code = run_report(args, client=client, now=NOW, sleep=lambda _: None, predictor=FakePredictor(), stdout=out,
                      stderr=err)
    return code, err.getvalue()


def test_completed_jobs_are_recorded_with_their_final_speed_once(sagemaker_and_stubber: tuple[Any, Stubber],
                                                                 tmp_path: Path) -> None:
    client, stubber = sagemaker_and_stubber
    store = tmp_path / "evidence.json"
    queue_profile_history(stubber)
    code, err = _record(client, store)
    stubber.assert_no_pending_responses()
    assert code == 0
    runs = {run.id: run for run in read_evidence(store).runs}
    # J1 and J2 completed (30,400 and 31,040 tokens/s); J3 and J4 failed, J5 still runs.
    assert {name: run.tokens_per_second_per_gpu for name, run in runs.items()} == {
        "btk-dev-llama3-2-1b-j1": 30400.0, "btk-dev-llama3-2-1b-j2": 31040.0}
    profile = fixture_catalog.PROFILES[PROFILES[0]]
    for run in runs.values():
        assert (run.kind, run.profile, run.instance_type, run.nodes) == ("run", PROFILES[0], INSTANCE, 1)
        assert run.architecture == profile.architecture and run.knobs == KNOBS_1B
        assert run.id in run.source and REGION in run.source
    assert "2 completed job(s) with a measured speed (left out: 3 not completed)" in err
    assert f"{store}: 2 run(s) added, 0 replaced, 2 in all" in err
    queue_profile_history(stubber)
    code, err = _record(client, store)
    assert code == 0 and f"{store}: 0 run(s) added, 0 replaced, 2 in all" in err
    # The planner takes them: a plan of the same profile on the same instance is corrected by them.
    plan = plan_profile(profile, get_instance_type(INSTANCE), 1)
    correction = correct_plan(plan, read_evidence(store))
    assert correction is not None and set(correction.runs) == set(runs)


def _job(name: str, **changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "profile": PROFILES[0], "status": "Completed", "secondary": "Completed", "created": june(15, 8),
        "knobs": KNOBS_1B, "phases": transitions(june(15, 8), ("Training", 60, "Training"),
                                                 ("Completed", None, "Training job completed")),
        "final_metrics": metrics(25000.0, 0.4, june(15, 9)),
    }
    values.update(changes)
    return describe(name, **values)


def test_a_rehearsal_is_recorded_as_one_and_odd_jobs_are_left_out_by_why() -> None:
    rehearsal = JobOrigin(tags={TAG_PURPOSE: PURPOSE_REHEARSAL})
    no_speed = _job("no-speed", final_metrics=metrics(25000.0, 0.4, june(15, 9))[:2])
    collection = Collection(jobs=[
        (_job("btk-dev-llama3-2-1b-reh"), rehearsal),
        (_job("before-the-window", created=SINCE.replace(year=SINCE.year - 1)), JobOrigin()),
        (_job("other-profile", profile=PROFILES[1]), JobOrigin()),
        (no_speed, JobOrigin()),
        (_job("stopped", status="Stopped"), JobOrigin()),
        (_job("too-many-nodes", instance_count=65), JobOrigin()),
        (_job("no-btk-hyperparameters", knobs=None), JobOrigin(tags={TAG_PROFILE: PROFILES[0]})),
    ], plans={}, missing_pipelines=[], notes=[])
    recorded = measured_runs(collection, region=REGION, since=SINCE, profiles=[PROFILES[0]])
    assert [(run.id, run.kind) for run in recorded.runs] == [("btk-dev-llama3-2-1b-reh", "rehearsal")]
    assert recorded.left_out == {"without a final tokens/s": 1, "not completed": 1,
                                 "that evidence cannot hold": 1, "without btk hyperparameters": 1}


def test_evidence_without_record_evidence_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    assert main(["report", "--env", ENV, "--evidence", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--evidence names the store --record-evidence writes" in err


def test_a_store_that_cannot_be_read_stops_before_any_aws_call(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    store.write_text("{not json")
    args: argparse.Namespace = build_parser().parse_args(
        ["report", "--env", ENV, "--record-evidence", "--evidence", str(store)])
    from btk.cli.report import run_report

    with pytest.raises(BtkError) as raised:  # a client that is no client: any AWS call would fail otherwise
        run_report(args, client=object(), now=NOW)
    assert str(store) in str(raised.value) and "\n" not in str(raised.value)


def test_a_job_that_stepped_down_its_knob_ladder_is_recorded_with_the_knobs_it_trained() -> None:
    """Its train:knob_rung metric names the rung: the measured speed is that rung's, not the plan's."""
    from btk.hyperparameters import JobHyperparameters, JobSettings, KnobLadder, to_hyperparameters

    profile = fixture_catalog.PROFILES[PROFILES[0]]
    leaner = KNOBS_1B.model_copy(update={"micro_batch_size": KNOBS_1B.micro_batch_size // 2,
                                         "gradient_accumulation_steps": 2 * KNOBS_1B.gradient_accumulation_steps})
    spec = JobHyperparameters(knobs=KNOBS_1B, architecture=profile.architecture, training=profile.training,
                              job=JobSettings(profile=PROFILES[0], knob_ladder=KnobLadder(rungs=(leaner,))))
    jobs = []
    for name, rung in (("on-rung-1", 1.0), ("on-the-plan", None), ("on-rung-5", 5.0)):
        job = _job(name)
        job["HyperParameters"] = to_hyperparameters(spec)
        if rung is not None:
            job["FinalMetricDataList"].append({"MetricName": "train:knob_rung", "Value": rung,
                                               "Timestamp": june(15, 9)})
        jobs.append((job, JobOrigin()))
    recorded = measured_runs(Collection(jobs=jobs, plans={}, missing_pipelines=[], notes=[]), region=REGION,
                             since=SINCE)
    assert {run.id: run.knobs for run in recorded.runs} == {"on-rung-1": leaner, "on-the-plan": KNOBS_1B}
    assert recorded.left_out == {"on a knob rung its hyperparameters do not hold": 1}
