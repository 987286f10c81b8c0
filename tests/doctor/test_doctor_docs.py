"""The docs say what ``btk doctor`` does: its sample output, its IAM actions, its place before a deploy."""

from __future__ import annotations

import json
import re

import pytest
from doctor_docs import DOC, current_sample, sample
from doctor_fixtures import StubbedAws, doctor, healthy_account, jobs_of, variant

from btk.catalog import get_environment

README = DOC.parents[1] / "README.md"


def test_the_sample_in_docs_deploy_md_is_what_the_doctor_prints() -> None:
    assert current_sample(DOC.read_text()) == sample(), (
        "docs/deploy.md's btk doctor sample is stale: run .venv/bin/python tests/doctor/doctor_docs.py"
    )


def iam_actions(aws: StubbedAws) -> set[str]:
    """The IAM action of every call made, from botocore's model (signing name and operation)."""
    return {
        f"{aws.clients[service].meta.service_model.signing_name}:{operation}"
        for service, operation in aws.operations()
        if service != "sts"  # GetCallerIdentity needs no permission
    }


def documented_actions() -> set[str]:
    text = DOC.read_text()
    policy = re.search(r"```json\n(\{\n  \"Version\".*?\"BtkDoctorReadOnly\".*?)```", text, re.DOTALL)
    assert policy is not None, "docs/deploy.md lost the BtkDoctorReadOnly policy"
    (statement,) = json.loads(policy.group(1))["Statement"]
    return set(statement["Action"])


def test_the_documented_iam_actions_are_exactly_those_the_checks_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import fixture_catalog

    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/btk-plan"
    planned = variant(get_environment("prod"), name="planned", capacity={"mode": "existing", "plan_arn": arn})
    fixture_catalog.install(monkeypatch, planned)
    used: set[str] = set()
    for env in (get_environment("prod"), planned):
        aws = healthy_account(env, jobs_of(env))
        aws.answers[("sagemaker", "DescribeTrainingPlan")] = {
            "TrainingPlanArn": arn, "TrainingPlanName": "btk-plan", "Status": "Active"
        }  # fmt: skip
        doctor(env.name, aws)
        used |= iam_actions(aws)
    assert "sagemaker:DescribeTrainingPlan" in used and "fsx:DescribeFileSystems" in used
    assert documented_actions() == used


def test_readme_and_deploy_guide_run_the_doctor_before_the_first_deploy() -> None:
    for path in (README, DOC):
        text = path.read_text()
        doctor_at = text.find("btk doctor --env staging")
        deploy_at = text.find("npx cdk deploy TrainingStack -c env=staging")
        assert 0 <= doctor_at < deploy_at, f"{path.name}: btk doctor must come before the first cdk deploy"


def test_every_deploy_job_runs_the_doctor_before_its_deploy() -> None:
    import yaml

    workflow = yaml.safe_load((DOC.parents[1] / ".github" / "workflows" / "deploy.yml").read_text())
    jobs = {name: job for name, job in workflow["jobs"].items() if any(
        "cdk deploy" in str(step.get("run", "")) for step in job.get("steps", [])
    )}  # fmt: skip
    assert jobs, "deploy.yml has no deploy job"
    for name, job in jobs.items():
        env = job["environment"]
        steps = job["steps"]
        # The environment is named directly or through the job's BTK_ENV (a matrix job over environments.py).
        names = {env} | ({'"$BTK_ENV"', "$BTK_ENV"} if job.get("env", {}).get("BTK_ENV") == env else set())
        commands = {f".venv/bin/btk doctor --env {value} --lookup-role" for value in names}
        command = min(commands)
        doctor_at = next((i for i, step in enumerate(steps) if str(step.get("run", "")).strip() in commands), None)
        credentials_at = next(i for i, step in enumerate(steps) if "configure-aws-credentials" in step.get("uses", ""))
        deploy_at = next(i for i, step in enumerate(steps) if "cdk deploy" in str(step.get("run", "")))
        assert doctor_at is not None, f"{name}: no step runs `{command}`"
        assert credentials_at < doctor_at < deploy_at, (
            f"{name}: btk doctor runs with the credentials, before cdk deploy"
        )
