"""``btk capacity search|show`` on stubbed offerings and plans; bad arguments exit 2 with one line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from capacity_fixtures import ACCOUNT, AZ, REGION, START, StubbedSageMaker, described_plan, offering, plan_arn

from btk import capacity, catalog
from btk.cli import main
from btk.environment import EnvironmentConfig, ExistingPlanCapacity, ReservePlanCapacity
from btk.hardware import get_instance_type
from btk.planner.search import plan_profile

RESERVE_ENV = EnvironmentConfig(
    name="burst",
    availability_zone=AZ,
    profiles=("llama3.1-8b",),
    instance_count=2,
    capacity=ReservePlanCapacity(
        start_after=START, duration_hours=168, instance_count=2, max_upfront_fee=150000, purchase_approved=True
    ),
)
EXISTING_ENV = EnvironmentConfig(
    name="team",
    availability_zone=AZ,
    profiles=("llama3.1-8b",),
    instance_count=2,
    capacity=ExistingPlanCapacity(plan_arn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/team-plan"),
)
SEARCH = {
    "TargetResources": ["training-job"],
    "InstanceType": "ml.p6-b200.48xlarge",
    "InstanceCount": 2,
    "StartTimeAfter": START,
    "DurationHours": 168,
}


@pytest.fixture(autouse=True)
def environments(monkeypatch: pytest.MonkeyPatch, stubbed_sagemaker: StubbedSageMaker) -> None:
    fixture_catalog.install(monkeypatch, RESERVE_ENV, EXISTING_ENV)
    monkeypatch.setattr("btk.cli.capacity.sagemaker_client", lambda region: stubbed_sagemaker.client)


def btk(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_search_json_prices_each_offering_with_the_planner(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    offerings = [offering("tpo-b", fee="90000.00", az="us-east-1b"), offering("tpo-a", fee="120000.00", hours=336)]
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings", {"TrainingPlanOfferings": offerings}, {**SEARCH, "DurationHours": 336}
    )

    code, out, err = btk(
        capsys,
        "capacity",
        "search",
        "--env",
        "burst",
        "--profile",
        "llama3.1-8b",
        "--duration-hours",
        "336",
        "--format",
        "json",
    )

    assert (code, err) == (0, "")
    assert stubbed_sagemaker.calls == ["SearchTrainingPlanOfferings"]
    result = json.loads(out)
    instance = get_instance_type("ml.p6-b200.48xlarge")
    speed = plan_profile(catalog.get_profile("llama3.1-8b"), instance, 2).evaluation.estimate.tokens_per_second_per_gpu
    assert result["tokens_per_second_per_gpu"] == pytest.approx(speed)
    assert result["gpus"] == 2 * instance.gpus_per_node == 16
    assert [row["offering_id"] for row in result["offerings"]] == ["tpo-a", "tpo-b"]  # environment's AZ first
    first = result["offerings"][0]
    assert first["in_environment_az"] is True and first["availability_zones"] == ["us-east-1a"]
    assert first["upfront_fee"] == 120000.0 and first["currency"] == "USD" and first["instance_count"] == 2
    assert first["start_time"] == "2026-03-02T00:00:00+00:00" and first["end_time"] == "2026-03-16T00:00:00+00:00"
    # the plan trains until 30 min before its end, less 15 min for the last checkpoint: 335.25 h of 336
    assert first["usable_hours"] == 335.25
    billions = speed * 16 * 335.25 * 3600 / 1e9
    assert first["tokens_billion"] == pytest.approx(billions, abs=1e-3)
    assert first["fee_per_billion_tokens"] == pytest.approx(120000 / billions, abs=0.01)


def test_search_ranks_offerings_in_the_az_by_fee_per_billion_trainable_tokens(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    # a cheaper fee on a one-day plan loses to a dearer week: 45 of its 1,440 minutes train nothing
    offerings = [
        offering("tpo-week", fee="140000.00", hours=168),
        offering("tpo-day", fee="19800.00", hours=24),
        offering("tpo-unpriced", fee=None, hours=168),
        offering("tpo-elsewhere", fee="1000.00", az="us-east-1b"),
    ]
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": offerings})

    code, out, err = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b", "--format", "json")

    assert (code, err) == (0, "")
    rows = json.loads(out)["offerings"]
    assert [row["offering_id"] for row in rows] == ["tpo-week", "tpo-day", "tpo-unpriced", "tpo-elsewhere"]
    week, day = rows[0], rows[1]
    assert week["fee_per_billion_tokens"] < day["fee_per_billion_tokens"]
    assert 140000 / 168 > 19800 / 24  # per paid hour the day is cheaper; per trained token it is not


def test_search_table_lists_fee_currency_window_az_count_and_fee_per_billion(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_response(
        "search_training_plan_offerings",
        {
            "TrainingPlanOfferings": [
                offering("tpo-a", fee="120000.00"),
                offering("tpo-b", fee="80000.00", az="us-east-1c"),
            ]
        },
        {**SEARCH, "StartTimeAfter": datetime(2026, 4, 1, tzinfo=UTC)},
    )

    code, out, _ = btk(
        capsys,
        "capacity",
        "search",
        "--env",
        "burst",
        "--profile",
        "llama3.1-8b",
        "--start-after",
        "2026-04-01T00:00:00Z",
    )

    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "burst: training-plan offerings for 2 x ml.p6-b200.48xlarge, 168 h after 2026-04-01T00:00:00+00:00 "
        "(AZ us-east-1a)"
    )
    assert lines[2].startswith("not rehearsed: no run of this model on ml.p6-b200.48xlarge on record in ")
    header = lines[3].split()
    assert header[:3] == ["offering", "upfront", "fee"] and header[-2:] == ["fee/B", "tok"]
    row_a = lines[4].split()
    assert row_a[:6] == ["tpo-a", "120,000.00", "USD", "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "us-east-1a"]
    assert row_a[6:8] == ["2", "168"]
    assert "us-east-1c (other AZ)" in lines[5]


def _store(tmp_path: Path, *kinds: str, instance_type: str = "ml.p6-b200.48xlarge") -> Path:
    """An evidence store with one run of llama3.1-8b's model per kind given."""
    profile = catalog.get_profile("llama3.1-8b")
    knobs = plan_profile(profile, get_instance_type(instance_type), 1).knobs
    runs = [{"id": f"job-{index}", "kind": kind, "profile": profile.name,
             "architecture": profile.architecture.model_dump(mode="json"), "instance_type": instance_type,
             "nodes": 1, "knobs": knobs.model_dump(mode="json"), "tokens_per_second_per_gpu": 10000.0}
            for index, kind in enumerate(kinds)]
    store = tmp_path / "evidence.json"
    store.write_text(json.dumps({"version": 1, "runs": runs}))
    return store


def test_search_requiring_a_rehearsal_refuses_before_any_call(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A rehearsal or a run on another instance type says nothing about this one."""
    store = _store(tmp_path, "run", "rehearsal", instance_type="ml.p5.48xlarge")
    code, out, err = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b",
                         "--evidence", str(store), "--require-rehearsal")
    assert (code, out) == (2, "") and stubbed_sagemaker.calls == []
    assert err.count("\n") == 1 and f"--require-rehearsal: llama3.1-8b: not rehearsed: no run of this model " \
        f"on ml.p6-b200.48xlarge on record in {store}" in err


def test_search_says_which_runs_are_on_record(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = _store(tmp_path, "rehearsal", "run")
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, SEARCH)
    code, out, _ = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b",
                       "--evidence", str(store), "--require-rehearsal", "--format", "json")
    result = json.loads(out)
    assert code == 0 and result["runs_on_record"] == ["job-0", "job-1"]
    # Both measured 10,000 tokens/s: the planner's speed for the plan is corrected towards them.
    evidence = result["evidence"]
    assert evidence["runs"] == ["job-0", "job-1"]
    assert evidence["tokens_per_second_per_gpu"] == pytest.approx(
        result["tokens_per_second_per_gpu"] * evidence["factor"], rel=1e-3)
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, SEARCH)
    code, out, _ = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b",
                       "--evidence", str(store))
    line = next(line for line in out.splitlines() if line.startswith("the team's evidence: "))
    assert code == 0 and line.startswith(f"the team's evidence: 2 measured run(s) at x{evidence['factor']:.3f} of the "
                                         "planner's speed; at it each fee per billion tokens below is x")
    assert float(line.rsplit("x", 1)[1]) == pytest.approx(1 / evidence["factor"], abs=2e-3)


def test_search_with_no_offerings_says_how_to_widen(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, SEARCH)

    code, out, _ = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b")

    assert code == 0
    assert out.splitlines()[-1].startswith("no offerings: widen the window")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "nope", "--profile", "llama3.1-8b"], "btk: error: unknown environment 'nope'"),
        (["--env", "burst", "--profile", "gpt-9"], "btk: error: unknown profile 'gpt-9'"),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--duration-hours", "30"],
            "btk: error: --duration-hours 30: use whole days, 24 to 4368 hours",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--duration-hours", "0"],
            "btk: error: --duration-hours 0: use whole days, 24 to 4368 hours",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--instance-count", "0"],
            "btk: error: --instance-count 0 is not sold: use one of 1, 2, 4, 8, 16, 32, 64",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--instance-count", "3"],
            "btk: error: --instance-count 3 is not sold: use one of 1, 2, 4, 8, 16, 32, 64",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--start-after", "soon"],
            "btk: error: --start-after 'soon' is not an ISO-8601 time",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--start-after", "2026-05-01", "--end-before", "2026-04-01"],
            "btk: error: --end-before must be after --start-after",
        ),
        (
            ["--env", "burst", "--profile", "llama3.1-8b", "--duration-hours", "x"],
            "btk capacity search: error: argument --duration-hours: invalid int value: 'x'",
        ),
        (["--profile", "llama3.1-8b"], "btk capacity search: error: the following arguments are required: --env"),
    ],
)
def test_bad_search_arguments_exit_2_with_one_line(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code, _out, err = btk(capsys, "capacity", "search", *argv)
    except SystemExit as exit_:
        code, err = int(exit_.code or 0), capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(message)
    assert stubbed_sagemaker.calls == []


def test_aws_access_denied_exits_2_with_one_line(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_client_error(
        "search_training_plan_offerings",
        service_error_code="AccessDeniedException",
        service_message="not authorized",
        http_status_code=403,
    )

    code, _out, err = btk(capsys, "capacity", "search", "--env", "burst", "--profile", "llama3.1-8b")

    assert code == 2
    assert err == "btk: error: SearchTrainingPlanOfferings failed: AccessDeniedException: not authorized\n"


def test_show_on_demand_makes_no_call(stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = btk(capsys, "capacity", "show", "--env", "dev")

    assert code == 0
    assert out == "dev: capacity on_demand: no training plan; jobs run on on-demand capacity\n"
    assert stubbed_sagemaker.calls == []


def test_show_reserve_not_bought_yet(stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]) -> None:
    name = capacity.reservation_request(RESERVE_ENV).plan_name()
    stubbed_sagemaker.stubber.add_client_error(
        "describe_training_plan", "ResourceNotFound", "no such plan", 400, expected_params={"TrainingPlanName": name}
    )
    summaries = []
    # the second plan is environment burst-eu's (its name also starts with btk-burst-): not listed
    for other_name, status in (("btk-burst-00000000", "Expired"), ("btk-burst-eu-0000abcd", "Active")):
        other = described_plan(other_name, status=status)
        summaries.append({key: other[key] for key in ("TrainingPlanArn", "TrainingPlanName", "Status")})
    stubbed_sagemaker.stubber.add_response("list_training_plans", {"TrainingPlanSummaries": summaries})

    code, out, _ = btk(capsys, "capacity", "show", "--env", "burst")

    assert code == 0
    assert out.splitlines() == [
        "burst: reserve 2 x ml.p6-b200.48xlarge, 168 h after 2026-03-02T00:00:00+00:00 in us-east-1a",
        f"plan name {name}; max_upfront_fee 150,000.00 USD; purchase_approved true",
        "not bought yet: the next deploy buys the best offering within the ceiling in this AZ",
        "other plan of burst (earlier reservation inputs): btk-burst-00000000 Expired",
    ]
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan", "ListTrainingPlans"]


def test_show_existing_json_reports_the_plan_and_its_problems(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan",
        described_plan("team-plan", az="us-east-1b"),
        {"TrainingPlanName": plan_arn("team-plan")},
    )

    code, out, _ = btk(capsys, "capacity", "show", "--env", "team", "--format", "json")

    assert code == 1  # the plan would fail the deploy
    result: dict[str, Any] = json.loads(out)
    assert result["mode"] == "existing" and result["plan"]["name"] == "team-plan"
    assert result["plan"]["status"] == "Scheduled" and result["plan"]["total_instance_count"] == 2
    assert result["problems"] == ["AZ us-east-1b, not us-east-1a"]
    assert stubbed_sagemaker.calls == ["DescribeTrainingPlan"]


def test_show_existing_plan_that_fits_exits_0(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_response(
        "describe_training_plan",
        described_plan("team-plan", status="Active"),
        {"TrainingPlanName": plan_arn("team-plan")},
    )

    code, out, _ = btk(capsys, "capacity", "show", "--env", "team")

    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"team: existing training plan {plan_arn('team-plan')}"
    assert lines[1] == "plan team-plan: Active"
    assert lines[-1] == "fits the environment"


def test_show_existing_plan_missing_exits_2(
    stubbed_sagemaker: StubbedSageMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    stubbed_sagemaker.stubber.add_client_error("describe_training_plan", "ResourceNotFound", "no such plan", 400)

    code, _, err = btk(capsys, "capacity", "show", "--env", "team")

    assert code == 2
    assert (
        err == f"btk: error: environment team: capacity.plan_arn {plan_arn('team-plan')} does not exist: fix the ARN\n"
    )


def test_btk_plan_path_does_not_import_boto3() -> None:
    import subprocess
    import sys

    probe = "import sys, btk.cli; btk.cli.build_parser(); print('boto3' in sys.modules or 'botocore' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
