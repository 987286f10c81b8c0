"""`make setup`'s editable install prints no notice a user cannot act on, and still prints real warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow  # set-up's own output, whatever environments.py holds: not re-run on another user's config
def test_the_bytecode_step_compiles_what_synth_imports_without_a_line_of_output(tmp_path: Path) -> None:
    """`make setup`'s scripts/compile_imports.py with every warning an error (the compiler's invalid-escape warning
    on the SageMaker SDK's docstrings among them): it still writes the SDK shapes' bytecode (into a fresh cache
    here) and prints nothing."""
    cache = tmp_path / "pycache"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPYCACHEPREFIX": str(cache), "AWS_REGION": "us-east-1",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-W", "error", "scripts/compile_imports.py", "infra"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert list(cache.rglob("sagemaker/core/shapes/shapes.*.pyc")), "the SDK's shapes were not compiled"
    assert list(cache.rglob("btk/cli/__init__.*.pyc")) and list(cache.rglob("aws_cdk/__init__.*.pyc"))


def test_the_bytecode_step_refuses_an_unknown_target_in_one_line() -> None:
    done = subprocess.run([sys.executable, "scripts/compile_imports.py", "trainer"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "usage: compile_imports.py infra|all\n")
