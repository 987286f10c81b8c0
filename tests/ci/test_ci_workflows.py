"""The GitHub Actions workflows: deploys derived from environments.py, OIDC, pins, PR synth/diff, actionlint.

Both workflows read their environments from ``environments.py`` (an ``environments`` job whose
output is the matrix): the tests run that job's Python on a project with one more environment.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ci_workflow_rules as rules
import pytest

import environments
from btk.environment import EnvironmentConfig, OnDemandCapacity


@pytest.fixture(scope="module")
def deploy() -> dict[str, Any]:
    return rules.load_workflow(rules.DEPLOY_WORKFLOW)


@pytest.fixture(scope="module")
def checks() -> dict[str, Any]:
    return rules.load_workflow(rules.CHECKS_WORKFLOW)


def _qa() -> EnvironmentConfig:
    return EnvironmentConfig(name="qa", availability_zone="us-east-1a", profiles=environments.ENVIRONMENTS[0].profiles,
                             capacity=OnDemandCapacity())


# --- the deploy workflow: derived from environments.py ------------------------------------


def test_the_deploy_workflow_is_one_matrix_over_environments_py(deploy: dict[str, Any]) -> None:
    assert rules.deploy_workflow_problems(deploy) == []
    assert [job_id for job_id in deploy["jobs"] if job_id.startswith("deploy-")] == []


def run_environments_job(deploy: dict[str, Any], environments_py: str, tmp_path: Path, chosen: str = "") -> Any:
    """The 'environments' job's Python on a project whose environments.py is ``environments_py``."""
    (tmp_path / "environments.py").write_text(environments_py)
    output = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", rules.environments_script(deploy)],
        cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{rules.REPO_ROOT}", "CHOSEN": chosen,
             "GITHUB_OUTPUT": str(output)},
    )
    if result.returncode:
        return result.stderr
    key, _, value = result.stdout.strip().partition("=")
    assert key == "matrix"
    return json.loads(value)


QA_ENVIRONMENTS = """
import environments_base
from btk.environment import EnvironmentConfig, OnDemandCapacity
QA = EnvironmentConfig(name="qa", availability_zone="us-east-1a", profiles=environments_base.ENVIRONMENTS[0].profiles,
                       capacity=OnDemandCapacity())
ENVIRONMENTS = (*environments_base.ENVIRONMENTS, QA)
"""


def test_a_new_environment_is_deployed_with_no_yaml_copied(deploy: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "environments_base.py").write_text((rules.REPO_ROOT / "environments.py").read_text())
    rows = run_environments_job(deploy, QA_ENVIRONMENTS, tmp_path)
    names = [env.name for env in environments.ENVIRONMENTS]
    assert [row["name"] for row in rows] == [*names, "qa"]
    assert rows[-1] == {"name": "qa", "region": "us-east-1", "diff_role_variable": "QA_DIFF_ROLE_ARN"}
    # A manual run deploys up to and including the named environment, in order.
    first_two = run_environments_job(deploy, QA_ENVIRONMENTS, tmp_path, chosen=names[min(1, len(names) - 1)])
    assert [row["name"] for row in first_two] == names[: min(2, len(names))]
    assert "is not in environments.py" in run_environments_job(deploy, QA_ENVIRONMENTS, tmp_path, chosen="nope")


def test_pushes_deploy_everything_in_order_after_a_diff_of_each(deploy: dict[str, Any]) -> None:
    assert deploy["on"]["push"] == {"branches": ["main"]}
    assert deploy["on"]["workflow_dispatch"]["inputs"]["environment"]["type"] == "string"
    jobs = deploy["jobs"]
    assert rules.job_needs(jobs["environments"]) == ["test"]
    assert rules.job_needs(jobs["diff"]) == ["environments"]
    assert rules.job_needs(jobs["deploy"]) == ["environments", "diff"]
    assert jobs["deploy"]["strategy"]["max-parallel"] == 1 and jobs["deploy"]["strategy"]["fail-fast"] is True
    guard = jobs["test"]["steps"][0]
    assert guard["if"] == "github.ref != 'refs/heads/main'" and "exit 1" in guard["run"]


def _broken(deploy: dict[str, Any], job: str, change: Any) -> list[str]:
    workflow = copy.deepcopy(deploy)
    change(workflow["jobs"][job])
    return rules.deploy_workflow_problems(workflow)


def test_rules_catch_parallel_deploys_permissions_concurrency_keys_and_named_jobs(deploy: dict[str, Any]) -> None:
    def parallel(job: dict[str, Any]) -> None:
        job["strategy"]["max-parallel"] = 3

    def no_oidc(job: dict[str, Any]) -> None:
        job["permissions"] = {"contents": "read"}

    def no_concurrency(job: dict[str, Any]) -> None:
        del job["concurrency"]

    def cancels(job: dict[str, Any]) -> None:
        job["concurrency"]["cancel-in-progress"] = True

    def stored_keys(job: dict[str, Any]) -> None:
        step = next(s for s in job["steps"] if s.get("uses", "").startswith(rules.CONFIGURE_AWS_CREDENTIALS))
        step["with"]["aws-access-key-id"] = "${{ secrets.KEY }}"

    def no_diff_first(job: dict[str, Any]) -> None:
        job["needs"] = ["environments"]

    assert any("`max-parallel: 1`" in p for p in _broken(deploy, "deploy", parallel))
    assert any("set exactly `permissions: {id-token: write" in p for p in _broken(deploy, "deploy", no_oidc))
    assert any("needs `concurrency: {group: deploy-" in p for p in _broken(deploy, "deploy", no_concurrency))
    assert any("`cancel-in-progress: false`" in p for p in _broken(deploy, "deploy", cancels))
    assert any("passes stored keys ['aws-access-key-id']" in p for p in _broken(deploy, "deploy", stored_keys))
    assert any("the diff is shown before any deploy" in p for p in _broken(deploy, "deploy", no_diff_first))
    named = copy.deepcopy(deploy)
    named["jobs"]["deploy-prod"] = {**named["jobs"]["deploy"], "environment": "prod"}
    assert any("job 'deploy-prod' is bound to environment 'prod' by name" in p
               for p in rules.deploy_workflow_problems(named))


# --- rules for every workflow --------------------------------------------------------------


def _workflow_files() -> list[Path]:
    files = sorted(rules.WORKFLOWS_DIR.glob("*.yml"))
    assert {f.name for f in files} >= {"checks.yml", "deploy.yml"}
    return files


@pytest.mark.parametrize("path", _workflow_files(), ids=lambda p: p.name)
def test_least_permissions_pinned_actions_no_stored_keys(path: Path) -> None:
    text = path.read_text()
    assert rules.workflow_problems(path.name, rules.load_workflow(path), text) == []
    for line in text.splitlines():
        if "uses:" in line and "@" in line:
            assert "# v" in line, f"{path.name}: say which release the pinned SHA is: {line.strip()}"


def test_workflow_rules_reject_tags_stored_keys_and_broad_permissions(deploy: dict[str, Any]) -> None:
    workflow = copy.deepcopy(deploy)
    workflow["permissions"] = "write-all"
    workflow["jobs"]["test"]["steps"][1]["uses"] = "actions/checkout@v4"
    del workflow["jobs"]["test"]["permissions"]
    text = "env:\n  AWS_SECRET_ACCESS_KEY: ${{ secrets.AWS_SECRET_ACCESS_KEY }}\n"
    problems = rules.workflow_problems("deploy.yml", workflow, text)
    assert any("set `permissions: {contents: read}` at the top" in p for p in problems)
    assert any("uses 'actions/checkout@v4': pin it to a full 40-hex commit SHA" in p for p in problems)
    assert any("job 'test' has no `permissions:`" in p for p in problems)
    assert any("mentions AWS_SECRET_ACCESS_KEY" in p for p in problems)
    assert any("reads secret secrets.AWS_SECRET_ACCESS_KEY" in p for p in problems)


# --- the pull-request workflow -------------------------------------------------------------


def test_pull_requests_run_make_test_and_synth_every_environment(checks: dict[str, Any]) -> None:
    assert "pull_request" in checks["on"]
    assert any(s.get("run") == "make test" for s in checks["jobs"]["test"]["steps"])
    job = checks["jobs"]["synth-diff"]
    assert job["strategy"]["matrix"]["environment"] == "${{ fromJSON(needs.environments.outputs.matrix) }}"
    synth = next(s for s in job["steps"] if "cdk synth" in s.get("run", ""))
    assert 'cdk synth TrainingStack -c env="$BTK_ENV"' in synth["run"]
    diff = next(s for s in job["steps"] if "npx --no-install cdk diff TrainingStack" in s.get("run", ""))
    assert diff["if"] == "steps.role.outputs.configured == 'true'"
    assert "--method template" in diff["run"] and '"$GITHUB_STEP_SUMMARY"' in diff["run"]


def _run_step(script: str, env: dict[str, str], tmp_path: Path) -> tuple[str, str, str]:
    """Run a workflow `run:` script with bash as GitHub does; returns (stdout, output file, summary)."""
    output, summary = tmp_path / "output", tmp_path / "summary"
    output.write_text("")
    summary.write_text("")
    path = f"{rules.REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=rules.REPO_ROOT, capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "PATH": path, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary), **env},
    )
    return result.stdout, output.read_text(), summary.read_text()


def test_the_matrix_lists_every_environment_with_its_diff_variable(checks: dict[str, Any], tmp_path: Path) -> None:
    step = rules.step_with_id(checks["jobs"]["environments"], "matrix")
    _, output, _ = _run_step(step["run"], {}, tmp_path)
    assert output.startswith("matrix=")
    rows = json.loads(output.removeprefix("matrix=").strip())
    assert rows == [
        {"name": env.name, "region": env.region, "diff_role_variable": f"{env.name.upper()}_DIFF_ROLE_ARN"}
        for env in environments.ENVIRONMENTS
    ]


def test_diff_is_skipped_with_a_visible_notice_without_a_role(checks: dict[str, Any], tmp_path: Path) -> None:
    step = rules.step_with_id(checks["jobs"]["synth-diff"], "role")
    assert step["env"]["ROLE_ARN"] == "${{ vars[matrix.environment.diff_role_variable] }}"
    env = {"BTK_ENV": "staging", "ROLE_VARIABLE": "STAGING_DIFF_ROLE_ARN", "SAME_REPOSITORY": "true", "ROLE_ARN": ""}
    stdout, output, summary = _run_step(step["run"], env, tmp_path)
    assert stdout.startswith("::notice title=cdk diff skipped (staging)::")
    assert "set the repository variable STAGING_DIFF_ROLE_ARN" in stdout
    assert output == "configured=false\n"
    assert "STAGING_DIFF_ROLE_ARN" in summary

    env["ROLE_ARN"] = "arn:aws:iam::123456789012:role/btk-github-diff"
    stdout, output, _ = _run_step(step["run"], env, tmp_path)
    assert stdout == ""
    assert output == "configured=true\naccount=123456789012\n"

    env["SAME_REPOSITORY"] = "false"
    stdout, output, _ = _run_step(step["run"], env, tmp_path)
    assert "forks get no OIDC token" in stdout and output == "configured=false\n"


# --- actionlint with shellcheck, and zizmor (current releases, from PyPI) ---------------------


def _venv_tool(name: str) -> str:
    tool = rules.REPO_ROOT / ".venv" / "bin" / name
    if not tool.is_file():
        pytest.fail(f".venv/bin/{name} is missing: run `make setup` (pyproject.toml's dev extra)")
    return str(tool)


def _actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    """actionlint as ``make actionlint`` runs it: shellcheck on every run script, no pyflakes."""
    return subprocess.run([_venv_tool("actionlint"), f"-shellcheck={_venv_tool('shellcheck')}", "-pyflakes=",
                           "-no-color", *map(str, files)], capture_output=True, text=True, timeout=120, check=False,
                          cwd=rules.REPO_ROOT)


def test_actionlint_is_clean_on_every_workflow() -> None:
    result = _actionlint(*_workflow_files())
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_real_mistakes_and_shellcheck_findings(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-99.04\n    steps:\n"
        "      - run: echo ${{ github.no_such_property }}\n"
        "      - run: echo ${{ varz.X }}\n"
        "      - run: echo \"${{ vars.FINE }}\"\n"
        "      - run: rm -rf $DIR/*\n"
        "  b:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo fine\n"
    )
    result = _actionlint(bad)
    assert result.returncode == 1
    assert 'label "ubuntu-99.04" is unknown' in result.stdout
    assert 'property "no_such_property" is not defined' in result.stdout
    assert 'undefined variable "varz"' in result.stdout
    assert "SC2086" in result.stdout  # shellcheck, through actionlint: unquoted $DIR
    assert 'undefined variable "vars"' not in result.stdout  # a current context
    assert "bad.yml:12:" not in result.stdout  # job b: a current runner label, nothing to report


def test_zizmor_finds_nothing_in_the_workflows() -> None:
    result = subprocess.run([_venv_tool("zizmor"), "--offline", "--no-progress", "--format=plain",
                             *map(str, _workflow_files())], capture_output=True, text=True, timeout=300, check=False,
                            cwd=rules.REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_still_reports_template_injection(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request_target\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo \"${{ github.event.pull_request.title }}\"\n"
    )
    result = subprocess.run([_venv_tool("zizmor"), "--offline", "--no-progress", str(bad)], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode != 0 and "template-injection" in result.stdout + result.stderr


# --- CPU torch on the runners ----------------------------------------------------------------


@pytest.mark.parametrize("path", [rules.CHECKS_WORKFLOW, rules.DEPLOY_WORKFLOW], ids=lambda p: p.name)
def test_make_test_jobs_install_the_cpu_torch_of_the_pyproject_pin_first(path: Path) -> None:
    pin = rules.torch_pin()
    assert pin.startswith("torch==")
    assert rules.cpu_torch_problems(path.name, rules.load_workflow(path), pin) == []


def test_cpu_torch_rule_catches_a_missing_step_and_a_stale_pin(deploy: dict[str, Any]) -> None:
    pin = rules.torch_pin()
    without = copy.deepcopy(deploy)
    without["jobs"]["test"]["steps"] = [
        step for step in without["jobs"]["test"]["steps"] if rules.TORCH_CPU_INDEX not in str(step.get("run", ""))
    ]
    (problem,) = rules.cpu_torch_problems("deploy.yml", without, pin)
    assert problem.startswith("deploy.yml: job 'test' runs make without the CPU torch first: add a step")
    assert f'--index-url {rules.TORCH_CPU_INDEX} \"{pin}\"' in problem and "\n" not in problem
    assert len(rules.cpu_torch_problems("deploy.yml", deploy, "torch==0.0.1")) == 1

    after = copy.deepcopy(deploy)  # installing it after make is too late
    job_steps = after["jobs"]["test"]["steps"]
    cpu = next(i for i, step in enumerate(job_steps) if rules.TORCH_CPU_INDEX in str(step.get("run", "")))
    job_steps.append(job_steps.pop(cpu))
    assert len(rules.cpu_torch_problems("deploy.yml", after, pin)) == 1


def test_torch_pin_reads_the_trainer_extra(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.optional-dependencies]\ntrainer = ["numpy", "torch == 9.1.0"]\n')
    assert rules.torch_pin(pyproject) == "torch==9.1.0"
    pyproject.write_text('[project.optional-dependencies]\ntrainer = ["numpy"]\n')
    with pytest.raises(ValueError, match="pins torch 0 times"):
        rules.torch_pin(pyproject)
