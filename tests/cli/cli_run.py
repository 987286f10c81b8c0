"""Run ``btk`` in-process and capture what it printed."""

from __future__ import annotations

import pytest

from btk.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``btk argv``: the exit code, stdout and stderr (a ``SystemExit`` from argparse is its code)."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
