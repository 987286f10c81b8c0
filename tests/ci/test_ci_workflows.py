"""The GitHub Actions workflows: deploy chain per environment, OIDC, pins, PR synth/diff, actionlint.

The deploy tests check ``.github/workflows/deploy.yml`` against ``environments.py``: that
workflow is written for the shipped dev / staging / prod example, so they are checks of the
shipped example, and a user who changes the environments updates the workflow with them
(docs/ci.md). The checks workflow's environment matrix is derived from ``environments.py``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
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


# --- the deploy workflow against environments.py -------------------------------------------


def test_every_environment_has_a_chained_oidc_deploy_job(deploy: dict[str, Any]) -> None:
    assert rules.deploy_workflow_problems(deploy, environments.ENVIRONMENTS) == []


def test_deploys_follow_the_order_of_environments(deploy: dict[str, Any]) -> None:
    jobs = deploy["jobs"]
    names = [env.name for env in environments.ENVIRONMENTS]
    for previous, name in zip(["test", *(f"deploy-{n}" for n in names)], names, strict=False):
        assert rules.job_needs(jobs[f"deploy-{name}"]) == [previous]
        assert rules.job_environment(jobs[f"deploy-{name}"]) == name


@pytest.mark.parametrize("name", [env.name for env in environments.ENVIRONMENTS])
def test_each_deploy_job_uses_oidc_and_one_deploy_at_a_time(deploy: dict[str, Any], name: str) -> None:
    job = deploy["jobs"][f"deploy-{name}"]
    assert job["permissions"] == {"id-token": "write", "contents": "read"}
    assert job["concurrency"] == {"group": f"deploy-{name}", "cancel-in-progress": False}
    credentials = [s for s in job["steps"] if s.get("uses", "").startswith(rules.CONFIGURE_AWS_CREDENTIALS)]
    assert [s["with"]["role-to-assume"] for s in credentials] == ["${{ vars.DEPLOY_ROLE_ARN }}"]
    assert not any(rules.LONG_LIVED_KEYS.fullmatch(key) for key in credentials[0]["with"])
    (deploy_step,) = [s for s in job["steps"] if "cdk deploy" in s.get("run", "")]
    assert f"cdk deploy TrainingStack -c env={name} " in deploy_step["run"]
    assert "--require-approval never" in deploy_step["run"]


def test_pushes_deploy_everything_and_dispatch_deploys_up_to_the_choice(deploy: dict[str, Any]) -> None:
    assert deploy["on"]["push"] == {"branches": ["main"]}
    choice = deploy["on"]["workflow_dispatch"]["inputs"]["environment"]
    assert choice["type"] == "choice"
    assert choice["options"] == [env.name for env in environments.ENVIRONMENTS]
    jobs = deploy["jobs"]
    first, *_, last = [env.name for env in environments.ENVIRONMENTS]
    assert "if" not in jobs[f"deploy-{first}"]
    assert jobs[f"deploy-{last}"]["if"] == f"github.event_name == 'push' || inputs.environment == '{last}'"
    guard = jobs["test"]["steps"][0]
    assert guard["if"] == "github.ref != 'refs/heads/main'" and "exit 1" in guard["run"]


def test_an_environment_without_a_deploy_job_fails_with_what_to_add(
    deploy: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [env.name for env in environments.ENVIRONMENTS]
    monkeypatch.setattr(environments, "ENVIRONMENTS", (*environments.ENVIRONMENTS, _qa()))
    problems = rules.deploy_workflow_problems(deploy, environments.ENVIRONMENTS)
    assert problems, "a missing deploy job must be reported"
    missing = problems[0]
    assert "environment 'qa' from environments.py has no deploy job in .github/workflows/deploy.yml" in missing
    for what_to_add in (
        "add a job 'deploy-qa'", f"copy deploy-{names[-1]}", "`environment: qa`", f"`needs: deploy-{names[-1]}`",
        "group: deploy-qa", "`-c env=qa`", "add 'qa' to on.workflow_dispatch.inputs.environment.options",
    ):
        assert what_to_add in missing
    assert any(f"options is {names}: make it {[*names, 'qa']}" in p for p in problems)


def test_a_deploy_job_for_an_unknown_environment_is_reported(deploy: dict[str, Any]) -> None:
    *kept, dropped = environments.ENVIRONMENTS
    problems = rules.deploy_workflow_problems(deploy, tuple(kept))
    name = dropped.name
    assert any(f"job 'deploy-{name}' deploys environment '{name}', which environments.py does not define" in p
               for p in problems)


def _broken(deploy: dict[str, Any], job: str, change: Any) -> list[str]:
    workflow = copy.deepcopy(deploy)
    change(workflow["jobs"][job])
    return rules.deploy_workflow_problems(workflow, environments.ENVIRONMENTS)


def test_rules_catch_a_broken_chain_permissions_concurrency_and_keys(deploy: dict[str, Any]) -> None:
    def skip_staging(job: dict[str, Any]) -> None:
        job["needs"] = "deploy-dev"

    def no_oidc(job: dict[str, Any]) -> None:
        job["permissions"] = {"contents": "read"}

    def no_concurrency(job: dict[str, Any]) -> None:
        del job["concurrency"]

    def cancels(job: dict[str, Any]) -> None:
        job["concurrency"]["cancel-in-progress"] = True

    def stored_keys(job: dict[str, Any]) -> None:
        step = next(s for s in job["steps"] if s.get("uses", "").startswith(rules.CONFIGURE_AWS_CREDENTIALS))
        step["with"]["aws-access-key-id"] = "${{ secrets.KEY }}"

    def wrong_env(job: dict[str, Any]) -> None:
        step = next(s for s in job["steps"] if "cdk deploy" in s.get("run", ""))
        step["run"] = step["run"].replace("-c env=prod", "-c env=staging")

    chain = _broken(deploy, "deploy-prod", skip_staging)
    assert any("'deploy-prod' must have `needs: deploy-staging`" in p for p in chain)
    assert any("set exactly `permissions: {id-token: write" in p for p in _broken(deploy, "deploy-prod", no_oidc))
    assert any("needs `concurrency: {group: deploy-prod" in p for p in _broken(deploy, "deploy-prod", no_concurrency))
    assert any("`cancel-in-progress: false`" in p for p in _broken(deploy, "deploy-prod", cancels))
    assert any("passes stored keys ['aws-access-key-id']" in p for p in _broken(deploy, "deploy-prod", stored_keys))
    assert any("must pass `-c env=prod`" in p for p in _broken(deploy, "deploy-prod", wrong_env))


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
