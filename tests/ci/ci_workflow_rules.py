"""Rules the GitHub Actions workflows must follow, as functions that return problems.

Each function returns a list of one-line problems, empty when the workflow is fine; every
problem names what is wrong and what to add or change. The tests in this folder apply them
to the real workflows and to deliberately broken copies (so each rule is shown to fail).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS_DIR = REPO_ROOT / ".github" / "workflows"
DEPLOY_WORKFLOW = WORKFLOWS_DIR / "deploy.yml"
CHECKS_WORKFLOW = WORKFLOWS_DIR / "checks.yml"

CONFIGURE_AWS_CREDENTIALS = "aws-actions/configure-aws-credentials"
DEPLOY_ROLE_EXPRESSION = "${{ vars.DEPLOY_ROLE_ARN }}"
DEPLOY_JOB_PERMISSIONS = {"contents": "read", "id-token": "write"}
#: ``owner/repo[/path]@<40 hex>``: a commit, which a tag or branch move cannot change.
PINNED_USES = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
#: Names that mean a stored, long-lived AWS key is in play.
LONG_LIVED_KEYS = re.compile(
    r"AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|aws-access-key-id|aws-secret-access-key|aws-session-token"
)
SECRET_REFERENCE = re.compile(r"secrets\.([A-Za-z0-9_]+)|secrets\[")
#: PyTorch's CPU-only wheel index: PyPI's Linux torch wheel pulls several GB of CUDA libraries.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def load_workflow(path: Path) -> dict[str, Any]:
    """Parse a workflow file; YAML 1.1 reads the ``on:`` key as ``True``, so put it back."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a YAML mapping")
    if True in data:
        data["on"] = data.pop(True)
    return data


def deploy_job_id(environment: str) -> str:
    """The job id convention for deploying ``environment``."""
    return f"deploy-{environment}"


def job_environment(job: Mapping[str, Any]) -> str | None:
    """The GitHub Environment a job is bound to (``environment: x`` or ``environment: {name: x}``)."""
    environment = job.get("environment")
    if isinstance(environment, Mapping):
        name = environment.get("name")
        return str(name) if name is not None else None
    return str(environment) if environment is not None else None


def job_needs(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else [str(n) for n in needs]


def steps(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps") or [])


def step_with_id(job: Mapping[str, Any], step_id: str) -> dict[str, Any]:
    for step in steps(job):
        if step.get("id") == step_id:
            return step
    raise KeyError(f"no step with id {step_id!r}")


def iter_uses(workflow: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(job id, uses)`` for every step action and every reusable-workflow job."""
    for job_id, job in (workflow.get("jobs") or {}).items():
        if "uses" in job:
            yield job_id, str(job["uses"])
        for step in steps(job):
            if "uses" in step:
                yield job_id, str(step["uses"])


#: The deploy job's matrix: the rows the ``environments`` job reads from environments.py.
MATRIX_EXPRESSION = "${{ fromJSON(needs.environments.outputs.matrix) }}"
MATRIX_ENVIRONMENT = "${{ matrix.environment.name }}"


def deploy_workflow_problems(workflow: Mapping[str, Any]) -> list[str]:
    """Environments come from environments.py (no job per environment); deploys run one at a time,
    in order, after a diff of each; each deploy job uses OIDC only, one deploy at a time."""
    where = ".github/workflows/deploy.yml"
    jobs: Mapping[str, Any] = workflow.get("jobs") or {}
    problems: list[str] = []
    for job_id, job in jobs.items():
        environment = job_environment(job)
        if environment is not None and environment != MATRIX_ENVIRONMENT:
            problems.append(
                f"job '{job_id}' is bound to environment '{environment}' by name: deploy every environment with the "
                f"matrix job 'deploy' (`environment: {MATRIX_ENVIRONMENT}`), so adding one needs no YAML"
            )
    lister = jobs.get("environments")
    if lister is None or not any("environments.ENVIRONMENTS" in str(step.get("run", "")) for step in steps(lister)):
        problems.append(f"{where}: add a job 'environments' reading environments.ENVIRONMENTS into its matrix output")
    diff = jobs.get("diff")
    if diff is None or not any("cdk diff TrainingStack" in str(s.get("run", "")) and "GITHUB_STEP_SUMMARY" in
                               str(s.get("run", "")) for s in steps(diff)):
        problems.append(f"{where}: add a job 'diff' writing `cdk diff TrainingStack` of each environment to the "
                        "run's summary, so that a reviewer reads it before approving")
    deploy = jobs.get("deploy")
    if deploy is None:
        return [*problems, f"{where}: add the matrix job 'deploy'"]
    if not {"environments", "diff"} <= set(job_needs(deploy)):
        problems.append("job 'deploy' must have `needs: [environments, diff]`: the diff is shown before any deploy")
    strategy = deploy.get("strategy") or {}
    if (strategy.get("matrix") or {}).get("environment") != MATRIX_EXPRESSION:
        problems.append(f"job 'deploy' must take `strategy.matrix.environment: {MATRIX_EXPRESSION}`")
    if strategy.get("max-parallel") != 1 or strategy.get("fail-fast") is not True:
        problems.append(
            "job 'deploy' must set `max-parallel: 1` and `fail-fast: true`: environments deploy one at a time in "
            "the order of environments.py, and a failure stops the later ones"
        )
    if job_environment(deploy) != MATRIX_ENVIRONMENT:
        problems.append(f"job 'deploy' needs `environment: {MATRIX_ENVIRONMENT}` (each environment's gate and role)")
    dispatch = (workflow.get("on") or {}).get("workflow_dispatch") or {}
    choice = (dispatch.get("inputs") or {}).get("environment") or {}
    if choice.get("type") != "string" or "options" in choice:
        problems.append("on.workflow_dispatch.inputs.environment must be a string (checked against environments.py "
                        "by the 'environments' job), not a list of options to keep in step")
    return problems + deploy_job_problems("deploy", deploy, "${{ matrix.environment.name }}")


def deploy_job_problems(job_id: str, job: Mapping[str, Any], environment: str) -> list[str]:
    """The deploy job: OIDC only, least permissions, one deploy at a time, the matrix's stack."""
    problems: list[str] = []
    permissions = job.get("permissions")
    if permissions != DEPLOY_JOB_PERMISSIONS:
        problems.append(
            f"job '{job_id}' has permissions {permissions}: set exactly `permissions: {{id-token: write, "
            f"contents: read}}` (OIDC token, read-only checkout)"
        )
    concurrency = job.get("concurrency")
    if not isinstance(concurrency, Mapping) or concurrency.get("group") != f"deploy-{environment}":
        problems.append(
            f"job '{job_id}' needs `concurrency: {{group: deploy-{environment}, cancel-in-progress: false}}`"
        )
    elif concurrency.get("cancel-in-progress") is not False:
        problems.append(
            f"job '{job_id}' must set `cancel-in-progress: false`: cancelling a CloudFormation deploy midway "
            f"leaves the stack rolling back"
        )
    if (job.get("env") or {}).get("BTK_ENV") != environment:
        problems.append(f"job '{job_id}' needs `env: {{BTK_ENV: {environment}}}` for its steps")

    job_steps = steps(job)
    credentials = [
        i for i, s in enumerate(job_steps) if str(s.get("uses", "")).startswith(CONFIGURE_AWS_CREDENTIALS + "@")
    ]
    deploys = [i for i, s in enumerate(job_steps) if "cdk deploy TrainingStack" in str(s.get("run", ""))]
    if len(credentials) != 1:
        problems.append(
            f"job '{job_id}' must get AWS credentials once, with {CONFIGURE_AWS_CREDENTIALS} and "
            f"`role-to-assume: {DEPLOY_ROLE_EXPRESSION}`"
        )
    else:
        inputs = job_steps[credentials[0]].get("with") or {}
        if inputs.get("role-to-assume") != DEPLOY_ROLE_EXPRESSION:
            problems.append(
                f"job '{job_id}' assumes {inputs.get('role-to-assume')!r}: use `role-to-assume: "
                f"{DEPLOY_ROLE_EXPRESSION}` (the GitHub Environment's variable)"
            )
        keys = sorted(key for key in inputs if LONG_LIVED_KEYS.fullmatch(str(key)))
        if keys:
            problems.append(f"job '{job_id}' passes stored keys {keys}: remove them, OIDC needs none")
    if len(deploys) != 1:
        problems.append(f"job '{job_id}' needs exactly one step running `cdk deploy TrainingStack -c env=\"$BTK_ENV\"`")
    else:
        command = str(job_steps[deploys[0]]["run"])
        for required in ('-c env="$BTK_ENV" ', "--require-approval never"):
            if required not in command + " ":
                problems.append(f"job '{job_id}': its cdk deploy must pass `{required.strip()}`")
        if credentials and deploys[0] < credentials[0]:
            problems.append(f"job '{job_id}' runs cdk deploy before it gets credentials: move the deploy after")
    return problems


def environments_script(workflow: Mapping[str, Any]) -> str:
    """The Python the ``environments`` job runs (its heredoc) to list the environments to deploy."""
    for step in steps(workflow["jobs"]["environments"]):
        text = str(step.get("run", ""))
        if "<<'PY'" in text:
            body = text.split("<<'PY'", 1)[1].split("\n", 1)[1]
            return body.rsplit("PY", 1)[0]
    raise AssertionError("the environments job runs no Python heredoc")


def workflow_problems(name: str, workflow: Mapping[str, Any], text: str) -> list[str]:
    """Rules for every workflow: least permissions, pinned actions, no stored AWS keys."""
    problems: list[str] = []
    if workflow.get("permissions") != {"contents": "read"}:
        problems.append(f"{name}: set `permissions: {{contents: read}}` at the top; grant more per job")
    for job_id, job in (workflow.get("jobs") or {}).items():
        if "permissions" not in job:
            problems.append(f"{name}: job '{job_id}' has no `permissions:`: list what it needs (often contents: read)")
        granted = job.get("permissions") or {}
        uses_oidc = any(str(s.get("uses", "")).startswith(CONFIGURE_AWS_CREDENTIALS + "@") for s in steps(job))
        if isinstance(granted, Mapping) and granted.get("id-token") == "write" and not uses_oidc:
            problems.append(f"{name}: job '{job_id}' grants id-token: write but never assumes a role: remove it")
        if uses_oidc and (not isinstance(granted, Mapping) or granted.get("id-token") != "write"):
            problems.append(f"{name}: job '{job_id}' assumes a role: grant `id-token: write` to the job")
    for job_id, uses in iter_uses(workflow):
        if uses.startswith("./"):
            continue
        if not PINNED_USES.match(uses):
            problems.append(
                f"{name}: job '{job_id}' uses '{uses}': pin it to a full 40-hex commit SHA "
                f"(owner/repo@<sha> # vX.Y.Z)"
            )
    for match in LONG_LIVED_KEYS.finditer(text):
        problems.append(f"{name}: mentions {match.group(0)}: use OIDC role assumption, never stored AWS keys")
    for match in SECRET_REFERENCE.finditer(text):
        if match.group(1) != "GITHUB_TOKEN":
            problems.append(
                f"{name}: reads secret {match.group(0)}: CI needs no stored secret; use a variable and OIDC"
            )
    return problems


def torch_pin(pyproject: Path = REPO_ROOT / "pyproject.toml") -> str:
    """The ``torch==X`` requirement of the ``trainer`` extra (what ``make setup`` installs)."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["trainer"]
    pins = [str(item) for item in extras if re.match(r"^torch\s*==", str(item))]
    if len(pins) != 1:
        raise ValueError(f"pyproject.toml: the trainer extra pins torch {len(pins)} times, expected once")
    return pins[0].replace(" ", "")


def cpu_torch_problems(name: str, workflow: Mapping[str, Any], pin: str) -> list[str]:
    """Every job that runs ``make test`` first installs ``pin`` from the CPU-only wheel index.

    ``make setup`` then finds torch already satisfied (``X+cpu`` satisfies ``==X``) and does not
    download the multi-GB CUDA build from PyPI on the runner.
    """
    problems: list[str] = []
    for job_id, job in (workflow.get("jobs") or {}).items():
        job_steps = steps(job)
        runs = [str(step.get("run", "")) for step in job_steps]
        make = next((i for i, command in enumerate(runs) if re.search(r"\bmake (test|setup|pytest)\b", command)), None)
        if make is None:
            continue
        installs = [
            i
            for i, command in enumerate(runs[:make])
            if f"--index-url {TORCH_CPU_INDEX}" in command and f'"{pin}"' in command and ".venv/bin/pip" in command
        ]
        if not installs:
            problems.append(
                f"{name}: job '{job_id}' runs make without the CPU torch first: add a step before it running "
                f"`python -m venv .venv` and `.venv/bin/pip install --index-url {TORCH_CPU_INDEX} \"{pin}\"` "
                "(the pin of pyproject.toml's trainer extra)"
            )
    return problems
