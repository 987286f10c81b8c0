"""`make setup`'s editable install prints no notice a user cannot act on, and still prints real warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _editable_install_line() -> str:
    """The editable install command exactly as `make setup` runs it (make's dry run of the recipe)."""
    done = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    (line,) = [line for line in done.stdout.splitlines() if "pip install" in line and " -e " in line]
    return line


def test_the_editable_install_prints_no_setuptools_notice(tmp_path: Path) -> None:
    """The same line, pointed at a fresh interpreter (its ``--python``) and without dependencies."""
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    line = _editable_install_line()
    assert " --python .venv/bin/python " in line, line
    line = line.replace(" --python .venv/bin/python ", f" --python {target}/bin/python ", 1)
    command = line.rsplit(" ", 1)[0] + " . --no-deps"  # the project itself, not its extras' dependencies
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "Editable installation" not in output and "*****" not in output, output
    assert list(target.glob("lib/python*/site-packages/__editable__*blackwell_training_kit*")), "nothing installed"
