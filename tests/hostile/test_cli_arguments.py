"""Hostile ``btk`` arguments that once escaped as tracebacks or were silently ignored: one line each now."""

from __future__ import annotations

import errno
import io
import json
from pathlib import Path

import pytest
from cli_fixtures import ON_DEMAND_ENV, PROFILE, RESERVE_ENV, EmptySageMaker, assert_one_line_error, btk, install

from btk.cli.arguments import max_nodes


@pytest.fixture(autouse=True)
def sagemaker(monkeypatch: pytest.MonkeyPatch) -> EmptySageMaker:
    return install(monkeypatch)


HUGE = "9" * 400
FAR_DATES = ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59")


@pytest.mark.parametrize("command", ["plan", "estimate", "compare"])
@pytest.mark.parametrize("nodes", [HUGE, "--", "0", "-1", "65", "nan", "1e3", "2.0", "", " "])
def test_node_count_outside_one_to_the_maximum_is_one_line(
    capsys: pytest.CaptureFixture[str], command: str, nodes: str
) -> None:
    outcome = btk(capsys, [command, PROFILE.name, f"--nodes={nodes}"])
    assert_one_line_error(outcome)
    assert "--nodes" in outcome.err


def test_node_maximum_is_the_environments_and_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.environment import EnvironmentConfig

    with pytest.raises(ValueError, match="instance_count"):
        EnvironmentConfig(name="x-env", availability_zone="us-east-1a", profiles=("p",), instance_count=max_nodes() + 1)
    outcome = btk(capsys, ["plan", PROFILE.name, "--nodes", str(max_nodes()), "--format", "json"])
    assert outcome.code == 0 and json.loads(outcome.out)["nodes"] == max_nodes()


@pytest.mark.parametrize("option", ["--start-after", "--end-before"])
@pytest.mark.parametrize("date", FAR_DATES)
def test_capacity_search_far_dates_are_one_line_before_aws(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, option: str, date: str
) -> None:
    outcome = btk(capsys, ["capacity", "search", "--env", ON_DEMAND_ENV.name, "--profile", PROFILE.name, option, date])
    assert_one_line_error(outcome)
    assert option in outcome.err and sagemaker.calls == []


@pytest.mark.parametrize("date", FAR_DATES)
def test_report_far_since_is_one_line_before_aws(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, date: str
) -> None:
    outcome = btk(capsys, ["report", "--env", ON_DEMAND_ENV.name, "--since", date])
    assert_one_line_error(outcome)
    assert "--since" in outcome.err and sagemaker.calls == []


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "full.png").symlink_to("/dev/full")
    return {
        "directory": tmp_path,
        "directory named .png": tmp_path / "folder.png",
        "below a file": tmp_path / "file.txt" / "plan.png",
        "missing parent": tmp_path / "missing" / "plan.png",
        "not .png": tmp_path / "plan.jpg",
        "full disk": tmp_path / "full.png",
    }


@pytest.mark.parametrize(
    "case", ["directory", "directory named .png", "below a file", "missing parent", "not .png", "full disk"]
)
def test_plan_plot_that_cannot_be_written_is_one_line(
    capsys: pytest.CaptureFixture[str], paths: dict[str, Path], case: str
) -> None:
    outcome = btk(capsys, ["plan", PROFILE.name, "--plot", str(paths[case])])
    assert_one_line_error(outcome)
    assert "--plot" in outcome.err
    if case == "full disk":
        assert "No space left on device" in outcome.err


@pytest.mark.parametrize("case", ["file", "below a file"])
def test_report_plot_onto_a_file_is_one_line_before_aws(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, tmp_path: Path, case: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    target = tmp_path / "file.txt" if case == "file" else tmp_path / "file.txt" / "charts"
    outcome = btk(capsys, ["report", "--env", ON_DEMAND_ENV.name, "--plot", str(target)])
    assert_one_line_error(outcome)
    assert "is not a directory" in outcome.err and sagemaker.calls == []


def test_report_plot_on_a_full_disk_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from matplotlib.figure import Figure

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    outcome = btk(capsys, ["report", "--env", ON_DEMAND_ENV.name, "--plot", str(tmp_path / "charts")])
    assert outcome.code == 2
    assert outcome.err.count("\n") == 1 and "No space left on device" in outcome.err


EMPTY_VALUES = [
    ["plan", PROFILE.name, "--instance", ""],
    ["plan", PROFILE.name, "--plot", ""],
    ["plan", PROFILE.name, "--env", ""],
    ["plan", ""],
    ["estimate", PROFILE.name, "--instance", " "],
    ["compare", PROFILE.name, "--instances", ""],
    ["capacity", "search", "--env", ON_DEMAND_ENV.name, "--profile", PROFILE.name, "--start-after", ""],
    ["capacity", "search", "--env", ON_DEMAND_ENV.name, "--profile", PROFILE.name, "--end-before", ""],
    ["capacity", "show", "--env", ""],
    ["report", "--env", ON_DEMAND_ENV.name, "--since", ""],
    ["report", "--env", ON_DEMAND_ENV.name, "--plot", ""],
    ["report", "--env", ON_DEMAND_ENV.name, "--profile", ""],
]


@pytest.mark.parametrize("argv", EMPTY_VALUES, ids=[" ".join(argv) for argv in EMPTY_VALUES])
def test_empty_values_are_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, argv: list[str]
) -> None:
    outcome = btk(capsys, argv)
    assert_one_line_error(outcome)
    assert "empty" in outcome.err and sagemaker.calls == []


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", PROFILE.name, "--set", "micro\nbatch=1"],
        ["plan", "tiny\nprofile"],
        ["plan", PROFILE.name, "extra\nargument"],
        ["capacity", "show", "--env", "line\nbreak"],
        ["estimate", PROFILE.name, "--instance", "\udcff\n"],
    ],
)
def test_names_with_line_breaks_are_echoed_on_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    outcome = btk(capsys, argv)
    assert_one_line_error(outcome)
    assert "\\n" in outcome.err


def test_set_key_is_quoted(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = btk(capsys, ["estimate", PROFILE.name, "--set", "micro\nbatch=1"])
    assert outcome.err.startswith("btk: error: --set 'micro\\nbatch': unknown knob")


@pytest.mark.parametrize(
    "extra", [["--env", ON_DEMAND_ENV.name], ["--since", "2d"], ["--format", "markdown"], ["--profile", PROFILE.name]]
)
def test_json_schema_takes_no_other_option(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, extra: list[str]
) -> None:
    outcome = btk(capsys, ["report", "--json-schema", *extra])
    assert_one_line_error(outcome)
    assert extra[0] in outcome.err and sagemaker.calls == []


class FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_stdout_on_a_full_disk_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout", FullDisk())
    outcome = btk(capsys, ["plan", PROFILE.name])
    assert outcome.code == 2
    assert outcome.err == "btk: error: cannot write the output: No space left on device\n"


def test_reserve_environment_window_still_searches(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker
) -> None:
    outcome = btk(capsys, ["capacity", "search", "--env", RESERVE_ENV.name, "--profile", PROFILE.name])
    assert outcome.code == 0 and "no offerings" in outcome.out
    assert sagemaker.calls == ["search_training_plan_offerings"]
