"""Output formats, the documented JSON schema, charts, docs freshness and the CLI end to end."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from botocore.stub import ANY, Stubber
from report_docs import DOC, blocks, current_blocks
from report_fixtures import NOW, FakePredictor, fixture_report, queue_profile_history

from btk.cli import build_parser, main
from btk.errors import BtkError
from btk.report import aws
from btk.report.plots import CHART_FILES, write_plots
from btk.report.render import render
from btk.report.schema import Report, report_json_schema

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report() -> Report:
    return fixture_report()


def test_json_output_validates_against_the_documented_schema(report: Report) -> None:
    document = json.loads(render(report, "json"))
    jsonschema.Draft202012Validator(report_json_schema()).validate(document)
    assert Report.model_validate(document) == report  # lossless
    assert document["overall"]["cost_per_successful_run_usd"] == 657.6


def test_schema_rejects_malformed_reports(report: Report) -> None:
    validator = jsonschema.Draft202012Validator(report_json_schema())
    document = json.loads(render(report, "json"))
    del document["overall"]["cost_usd"]
    document["runs"][0]["outcome"] = "exploded"
    errors = {error.message for error in validator.iter_errors(document)}
    assert "'cost_usd' is a required property" in errors
    assert any("'exploded' is not one of" in message for message in errors)


def test_docs_show_the_current_sample_and_schema() -> None:
    """docs/report.md's generated blocks match the code (regenerate: python tests/report/report_docs.py)."""
    documented = current_blocks(DOC.read_text())
    for name, expected in blocks().items():
        assert documented[name] == expected, f"docs/report.md block {name} is stale: run tests/report/report_docs.py"
    schema_text = documented["schema"].removeprefix("```json\n").removesuffix("```\n")
    assert json.loads(schema_text) == report_json_schema()


@pytest.mark.parametrize(
    "fmt, expected",
    [
        (
            "table",
            "llama3.2-1b     5   2       2        0        1         50.0%               5.68 (1.50)      25.33",
        ),
        ("markdown", "| llama3.2-3b | 6 | 2 | 3 | 1 | 0 | 50.0% | 1.62 (0.08) | 178.93 | 2,269.63 | 0.00 | 1,134.82 |"),
    ],
)
def test_human_formats_show_the_figures(report: Report, fmt: Any, expected: str) -> None:
    text = render(report, fmt)
    assert expected in text
    assert "btk-dev-llama3-2-3b" in text  # the missing pipeline is mentioned


def test_charts_are_written_and_not_blank(report: Report, tmp_path: Path) -> None:
    from matplotlib.image import imread

    paths = write_plots(report, tmp_path / "charts")
    assert [path.name for path in paths] == list(CHART_FILES)
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, path.name
        pixels = imread(path)
        assert pixels.std() > 0.05, f"{path.name} is blank"  # bars, points, bins drawn


def test_charts_of_an_empty_report_still_render(report: Report, tmp_path: Path) -> None:
    empty = report.model_copy(update={"runs": [], "by_profile": {}})
    paths = write_plots(empty, tmp_path)
    assert all(path.stat().st_size > 0 for path in paths)


def test_a_chart_that_cannot_be_written_is_one_line(report: Report, tmp_path: Path) -> None:
    (tmp_path / CHART_FILES[1]).mkdir()  # a directory where the second PNG goes: savefig fails
    with pytest.raises(BtkError) as raised:
        write_plots(report, tmp_path)
    assert str(raised.value).startswith(f"--plot {str(tmp_path)!r}: cannot write {CHART_FILES[1]} (")
    assert "\n" not in str(raised.value)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["report", *argv])


def test_cli_json_for_one_profile(sagemaker_and_stubber: tuple[Any, Stubber], tmp_path: Path) -> None:
    client, stubber = sagemaker_and_stubber
    queue_profile_history(stubber)
    out, err = io.StringIO(), io.StringIO()
    args = parse("--env", "dev", "--profile", "llama3.2-1b", "--format", "json", "--plot", str(tmp_path))
    code = aws_report(args, client, out, err)
    stubber.assert_no_pending_responses()
    assert code == 0
    document = json.loads(out.getvalue())
    jsonschema.Draft202012Validator(report_json_schema()).validate(document)
    assert document["profiles"] == ["llama3.2-1b"]
    assert document["missing_pipelines"] == []
    # J1..J5 only: 2 ok, 2 failed, 1 running; cost 227.86 + 113.93 + 18.9883 = 360.7783 / 2 = 180.39
    overall = document["overall"]
    assert (overall["runs"], overall["successes"], overall["failed"], overall["running"]) == (5, 2, 2, 1)
    assert overall["cost_per_successful_run_usd"] == 180.39
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(CHART_FILES)
    assert err.getvalue().startswith("btk report: wrote ")


def aws_report(args: argparse.Namespace, client: Any, out: io.StringIO, err: io.StringIO) -> int:
    from btk.cli.report import run_report

    return run_report(
        args, client=client, now=NOW, sleep=lambda _: None, predictor=FakePredictor(), stdout=out, stderr=err
    )


def test_cli_access_denied_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, sagemaker_and_stubber: tuple[Any, Stubber], capsys: pytest.CaptureFixture[str]
) -> None:
    client, stubber = sagemaker_and_stubber
    stubber.add_client_error(
        "list_pipeline_executions",
        service_error_code="AccessDeniedException",
        service_message="not authorized",
        expected_params={
            "PipelineName": "btk-dev-llama3-2-1b",
            "CreatedAfter": ANY,
            "SortBy": "CreationTime",
            "SortOrder": "Descending",
            "MaxResults": 100,
        },
    )
    monkeypatch.setattr(aws, "make_client", lambda region: client)
    assert main(["report", "--env", "dev", "--profile", "llama3.2-1b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "btk: error: AWS denied sagemaker:ListPipelineExecutions (AccessDeniedException): grant the caller "
        "sagemaker:ListPipelineExecutions (docs/report.md lists the read-only policy btk report needs)\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report"], "btk: error: --env is required: one of dev, prod, staging\n"),
        (["report", "--env", "nope"], "btk: error: unknown environment 'nope'"),
        (["report", "--env", "dev", "--profile", "llama9"], "btk: error: unknown profile 'llama9'"),
        (
            ["report", "--env", "dev", "--since", "yesterday"],
            "btk: error: --since 'yesterday' is not a duration or a date",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    def no_aws(region: str) -> Any:
        raise AssertionError("no AWS call expected for bad input")

    monkeypatch.setattr(aws, "make_client", no_aws)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_prints_the_schema_without_aws(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--json-schema"]) == 0
    assert json.loads(capsys.readouterr().out) == report_json_schema()


def test_report_command_does_not_import_boto3_or_matplotlib_at_startup() -> None:
    import subprocess
    import sys

    code = (
        "import sys, btk.cli; btk.cli.build_parser(); "
        "print(sorted(m for m in ('boto3', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
