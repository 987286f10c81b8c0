"""``btk`` writing to a closed standard output or to one that cannot encode its tables: one line or escapes,
never a traceback."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import fixture_catalog
import pytest

from btk.catalog import all_profiles
from btk.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_an_ascii_stdout_gets_escapes_for_what_it_cannot_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's error band is printed with `±`; an ASCII stream receives `\\xb1` instead."""
    fixture_catalog.install(monkeypatch)
    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")  # errors="strict", as PYTHONIOENCODING=ascii gives
    monkeypatch.setattr(sys, "stdout", ascii_out)
    assert main(["plan", "llama3.1-8b"]) == 0
    printed = raw.getvalue().decode("ascii")
    assert "\\xb1" in printed and "llama3.1-8b" in printed


def test_a_closed_stdout_is_one_line_and_nothing_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture_catalog.install(monkeypatch)
    monkeypatch.setattr(sys, "stdout", None)  # what Python sets when started with descriptor 1 closed
    assert main(["profiles"]) == 2
    assert capsys.readouterr().err == "btk: error: cannot write the output: standard output is closed\n"


def test_a_closed_stderr_drops_the_error_line_without_raising(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit status still says it; the line does not land on stdout (``print(file=None)`` would put it there)."""
    fixture_catalog.install(monkeypatch)
    monkeypatch.setattr(sys, "stderr", None)
    assert main(["plan", "no-such-profile-anywhere"]) == 2
    assert capsys.readouterr().out == ""


def _btk(shell_suffix: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m btk.cli ARGS`` under a shell (for redirections), from the repository root."""
    command = f"{sys.executable} -m btk.cli {shell_suffix}"
    return subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=False)  # fmt: skip


def test_the_real_command_with_stdout_closed_says_so_in_one_line() -> None:
    completed = _btk("profiles >&-")
    assert (completed.returncode, completed.stderr) == (
        2, "btk: error: cannot write the output: standard output is closed\n"
    )  # fmt: skip


@pytest.mark.parametrize(
    "env",
    [{"PYTHONIOENCODING": "ascii"}, {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0"}],  # C: ASCII, surrogateescape
    ids=str,
)
def test_the_real_command_on_an_ascii_terminal_prints_its_plan(env: dict[str, str]) -> None:
    """Any profile of the user's catalog: its plan prints, escaped where ASCII lacks a character."""
    profile = next(iter(all_profiles()))
    completed = _btk(f"plan {profile}", **env)
    assert completed.returncode == 0 and "Traceback" not in completed.stderr, completed.stderr
    assert profile in completed.stdout and completed.stdout.isascii()


def test_a_file_the_command_cannot_use_is_named_not_called_the_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError about a file (here reading a profile module) names that file; it is no write error."""

    def unreadable() -> dict[str, object]:
        raise PermissionError(13, "Permission denied", "profiles/llama.py")

    monkeypatch.setattr("btk.catalog.all_profiles", unreadable)
    assert main(["profiles"]) == 2
    assert capsys.readouterr().err == "btk: error: profiles/llama.py: Permission denied\n"
