"""The training image's Dockerfile passes hadolint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_hadolint_clean() -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint not installed (make setup installs it)")
    completed = subprocess.run([str(hadolint), str(ROOT / "containers" / "Dockerfile")], capture_output=True,
                               text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
