"""The README's "Add a model profile" steps, applied as written to a copy of the project.

Both of its ways: ``btk profile import`` run as the README shows it, on Mistral NeMo's real
config.json (tests/hf_configs; a model whose heads are narrower than hidden / heads) with the
README's ``FAMILY_MODULES`` lines in ``profiles/__init__.py``, and the hand-written profile
appended to ``profiles/llama.py``; then the README's ``profiles=`` line in ``STAGING``. The tests
that read ``profiles/`` and ``environments.py`` then run there, as ``make test`` would after such a
pull request, and ``btk plan`` plans both.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The README's code blocks are found by these markers, so the test follows the README as written.
PROFILE_MARKER = "<!-- readme-example: add-profile -->"
ENVIRONMENT_MARKER = "<!-- readme-example: add-to-environment -->"
IMPORT_MARKER = "<!-- readme-example: import-profile -->"
IMPORT_FAMILY_MARKER = "<!-- readme-example: import-profile-family -->"
# The config.json the README's import reads (it names the model: Mistral NeMo 12B).
IMPORTED_CONFIG = REPO / "tests" / "hf_configs" / "mistral-nemo-base-2407.json"
# Where the README says to put them.
FAMILY_MODULE = Path("profiles/llama.py")
ENVIRONMENT_VARIABLE = "STAGING"
ENVIRONMENT_NAME = "staging"
# The tests whose expectations come from profiles/ and environments.py.
CONFIG_TESTS = (
    "tests/core/test_profiles.py",
    "tests/cli/test_user_config_cli.py::test_profiles_table_lists_catalog",
    "tests/cli/test_user_config_cli.py::test_plan_env_plans_every_profile",
    "tests/infra/test_infra_environments.py",
    "tests/ci/test_ci_workflows.py",
    "tests/pipeline/test_pipeline_definition.py",
    "tests/pipeline/test_pipeline_stack.py::test_one_pipeline_per_profile_named_for_env_and_profile",
    "tests/pipeline/test_pipeline_stack.py::test_hyperparameters_are_the_planners_knobs",
)
TOOL_ENVIRONMENT = {
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "CDK_DISABLE_VERSION_CHECK": "1",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "SAGEMAKER_VALIDATE_ROLE": "false",
}


def readme_example(marker: str, language: str = "python") -> str:
    """The first ```language block after ``marker`` in README.md."""
    readme = (REPO / "README.md").read_text()
    assert marker in readme, f"README.md lost its marker {marker}"
    fence = f"```{language}\n"
    start = readme.index(fence, readme.index(marker)) + len(fence)
    return readme[start : readme.index("\n```", start)] + "\n"


def copy_project(target: Path) -> None:
    """The working tree's files that git tracks or would track; the virtualenv and node_modules linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            (target / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / os.fsdecode(name))
    for linked in (".venv", "node_modules"):
        (target / linked).symlink_to(REPO / linked, target_is_directory=True)


def add_profile(project: Path) -> str:
    """README step 1: add KnobPins to the import line, append the example; returns the profile's name."""
    module = project / FAMILY_MODULE
    example = readme_example(PROFILE_MARKER)

    def with_knob_pins(match: re.Match[str]) -> str:
        names = {name.strip() for name in match.group(1).split(",")} | {"KnobPins"}
        return "from btk.profile import " + ", ".join(sorted(names))

    pattern = r"^from btk\.profile import ([\w, ]+)$"
    source, count = re.subn(pattern, with_knob_pins, module.read_text(), count=1, flags=re.M)
    assert count == 1, f"{FAMILY_MODULE} has no one-line `from btk.profile import ...` to add KnobPins to"
    module.write_text(f"{source}\n\n{example}")
    name = re.search(r'name="([^"]+)"', example)
    assert name is not None, "the README's profile example names no profile"
    return name.group(1)


def import_profile(project: Path) -> str:
    """README's import: its ``btk profile import`` command (the config.json path is the fixture's), then its
    ``from profiles import`` and ``FAMILY_MODULES`` lines in ``profiles/__init__.py``; returns the profile's name."""
    command, printed = readme_example(IMPORT_MARKER, "console").splitlines()[:2]
    words = shlex.split(command.removeprefix("$ "))
    assert words[:3] == [".venv/bin/btk", "profile", "import"], command
    name = words[words.index("--name") + 1]
    done = run(project, "-m", "btk.cli", "profile", "import", str(IMPORTED_CONFIG), *words[4:])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == printed.strip(), "README's printed line differs from what the import prints"
    package = project / "profiles" / "__init__.py"
    source = package.read_text()
    for line in readme_example(IMPORT_FAMILY_MARKER).splitlines():
        if line.strip():
            key = line.split("=")[0] if "=" in line else "from profiles import"
            source, count = re.subn(rf"^{re.escape(key)}.*$", line, source, count=1, flags=re.M)
            assert count == 1, f"profiles/__init__.py has no line starting {key!r} to replace"
    package.write_text(source)
    return name


def add_to_environment(project: Path) -> None:
    """README step 2: the README's ``profiles=`` line replaces the environment's."""
    path = project / "environments.py"
    source = path.read_text()
    line = readme_example(ENVIRONMENT_MARKER).rstrip("\n")
    start = source.index(f"{ENVIRONMENT_VARIABLE} = EnvironmentConfig(")
    profiles_line = source.index("    profiles=", start)
    path.write_text(source[:profiles_line] + line + source[source.index("\n", profiles_line) :])


#: A guard against a hang, not a speed target: the re-run of the suite in a copy takes 4-5 minutes on a busy
#: 2-core machine.
RUN_TIMEOUT_S = 1800


def run(project: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` in the copy, importing the copy's modules first (not the editable install's); ``env``: variables
    set on top of this process's."""
    variables = {**os.environ, **TOOL_ENVIRONMENT, **(env or {}), "PYTHONPATH": str(project)}
    return subprocess.run([sys.executable, *argv], cwd=project, env=variables, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


def test_adding_profiles_the_readme_ways_keeps_the_checks_green(tmp_path: Path) -> None:
    project = tmp_path / "project"
    copy_project(project)
    imported = import_profile(project)
    added = add_profile(project)
    add_to_environment(project)

    for name in (imported, added):
        plan = run(project, "-m", "btk.cli", "plan", name, "--format", "json")
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["profile"] == name

    plans = run(project, "-m", "btk.cli", "plan", "--env", ENVIRONMENT_NAME, "--format", "json")
    assert plans.returncode == 0, plans.stderr
    assert {imported, added} <= {entry["profile"] for entry in json.loads(plans.stdout)}

    listed = run(project, "-m", "btk.cli", "profiles", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    arch = next(p for p in json.loads(listed.stdout) if p["name"] == imported)["architecture"]
    assert arch["head_dim"] * arch["num_attention_heads"] != arch["hidden_size"]  # the case the import is for

    tests = run(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CONFIG_TESTS)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
