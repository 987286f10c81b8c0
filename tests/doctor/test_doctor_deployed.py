"""The CDK bootstrap, and what a deploy left behind: stack, pipelines, training image, failure topic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from doctor_fixtures import (
    ACCOUNT,
    REGION,
    TOPIC_ARN,
    Error,
    StubbedAws,
    definition_parts,
    described_pipeline,
    doctor,
    findings_of,
    healthy_account,
    image_uri,
    jobs_of,
    resolved,
    stack,
    template,
)

from btk.catalog import get_environment
from btk.naming import pipeline_name

ENV = "dev"


def account() -> StubbedAws:
    env = get_environment(ENV)
    return healthy_account(env, jobs_of(env))


def found(aws: StubbedAws, capsys: Any, **options: Any) -> tuple[int, dict[str, str]]:
    code, lines = doctor(ENV, aws, capsys, **options)
    return code, findings_of(lines)


# --------------------------------------------------------------------------- bootstrap


def parameter(value: str) -> dict[str, Any]:
    name = f"/cdk-bootstrap/{get_environment(ENV).bootstrap_qualifier}/version"
    return {"Parameter": {"Name": name, "Type": "String", "Value": value, "Version": 3, "DataType": "text"}}


BOOTSTRAP = "CDK bootstrap 'btkdev'"
COMMAND = f"btk bootstrap --env dev --account {ACCOUNT}"


def test_a_missing_bootstrap_fails_with_the_command_that_makes_it(capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("ssm", "GetParameter")] = Error("ParameterNotFound", "")
    code, checks = found(aws, capsys)
    assert code == 1
    assert checks[BOOTSTRAP] == (
        f"FAIL {BOOTSTRAP}: no /cdk-bootstrap/btkdev/version in {ACCOUNT}/{REGION}: not bootstrapped -> {COMMAND}"
    )
    assert aws.calls[[c[:2] for c in aws.calls].index(("ssm", "GetParameter"))][2] == {
        "Name": "/cdk-bootstrap/btkdev/version"
    }


@pytest.mark.parametrize(
    ("version", "status", "step"),
    [
        ("5", "FAIL", f"upgrade it: {COMMAND}"),
        ("7", "WARN", f"upgrade it for the lookup role (CI's doctor, cdk diff): {COMMAND}"),
        ("8", "PASS", ""),
        ("latest", "FAIL", COMMAND),
    ],
)
def test_a_bootstrap_older_than_the_app_needs_is_found(
    version: str, status: str, step: str, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = account()
    aws.answers[("ssm", "GetParameter")] = parameter(version)
    _, checks = found(aws, capsys)
    assert checks[BOOTSTRAP].startswith(f"{status} {BOOTSTRAP}: ")
    assert checks[BOOTSTRAP].endswith(f" -> {step}" if step else "DefaultStackSynthesizer)")


# --------------------------------------------------------------------------- stack


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        ("CREATE_COMPLETE", "PASS"),
        ("UPDATE_ROLLBACK_COMPLETE", "WARN"),
        ("UPDATE_IN_PROGRESS", "WARN"),
        ("ROLLBACK_COMPLETE", "FAIL"),
        ("UPDATE_ROLLBACK_FAILED", "FAIL"),
    ],
)
def test_the_stack_status_decides_its_line(status: str, verdict: str, capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("cloudformation", "DescribeStacks")] = stack(get_environment(ENV), status)
    code, checks = found(aws, capsys)
    assert checks["stack TrainingStack-dev"].startswith(f"{verdict} stack TrainingStack-dev: {status}")
    assert code == (1 if verdict == "FAIL" else 0)


# --------------------------------------------------------------------------- pipelines


def edited(profile: str, instance_count: int) -> dict[str, Any]:
    """DescribePipeline of a pipeline whose default InstanceCount was changed outside CloudFormation."""
    env = get_environment(ENV)
    return described_pipeline(env, profile, resolved(definition_parts(env, profile, instance_count), env))


def test_a_pipeline_edited_outside_cloudformation_fails_where_it_differs(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment(ENV)
    profile = env.profiles[0]
    aws = account()
    healthy = aws.answers[("sagemaker", "DescribePipeline")]
    changed = edited(profile, 7)
    aws.answers[("sagemaker", "DescribePipeline")] = lambda params: (
        changed if params["PipelineName"] == changed["PipelineName"] else healthy(params)  # type: ignore[operator]  # this operation's stand-in answer is a function
    )
    code, checks = found(aws, capsys)
    name = pipeline_name(ENV, profile)
    assert code == 1
    assert checks[f"pipeline {name}"].startswith(
        f"FAIL pipeline {name}: differs from the deployed template at Parameters[0].DefaultValue: template 1, "
        "deployed 7 (last modified "
    )
    assert "-> it was edited outside CloudFormation" in checks[f"pipeline {name}"]
    assert all(checks[f"pipeline {pipeline_name(ENV, p)}"].startswith("PASS") for p in env.profiles[1:])


def test_a_pipeline_deleted_outside_cloudformation_fails(capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("sagemaker", "DescribePipeline")] = Error("ResourceNotFound", "Pipeline does not exist")
    code, checks = found(aws, capsys)
    name = pipeline_name(ENV, get_environment(ENV).profiles[0])
    assert code == 1
    assert checks[f"pipeline {name}"].startswith(
        f"FAIL pipeline {name}: in the deployed template but deleted outside CloudFormation"
    )


def test_a_profile_added_since_the_deploy_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment(ENV)
    older = {job.profile: job.instance_count for job in jobs_of(env)[:1]}
    aws = account()
    aws.answers[("cloudformation", "GetTemplate")] = {"TemplateBody": json.dumps(template(env, older))}
    aws.answers[("sagemaker", "DescribePipeline")] = lambda params: (
        edited(env.profiles[0], older[env.profiles[0]])
        if params["PipelineName"] == pipeline_name(ENV, env.profiles[0])
        else Error("ResourceNotFound", "Pipeline does not exist")
    )
    code, checks = found(aws, capsys)
    name = pipeline_name(ENV, env.profiles[1])
    assert code == 0
    assert checks[f"pipeline {name}"] == (
        f"WARN pipeline {name}: not deployed yet -> deploy creates it: "
        f"npx cdk deploy TrainingStack -c env={ENV} -c account={ACCOUNT}"
    )


def write_assembly(directory: Path, env_name: str, body: dict[str, Any], account: str = ACCOUNT) -> Path:
    """A cloud assembly as ``cdk synth`` writes it: manifest.json naming the stack, and its template."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "TrainingStack.template.json").write_text(json.dumps(body))
    manifest = {
        "version": "55.0.0",
        "artifacts": {
            "TrainingStack": {
                "type": "aws:cloudformation:stack",
                "environment": f"aws://{account}/{REGION}",
                "properties": {
                    "templateFile": "TrainingStack.template.json",
                    "stackName": f"TrainingStack-{env_name}",
                    "requiresBootstrapStackVersion": 6,
                    "lookupRole": {"requiresBootstrapStackVersion": 8},
                },
            }
        },
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_with_a_fresh_synth_a_new_image_tag_is_a_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment(ENV)
    synthesized = template(env, {job.profile: job.instance_count for job in jobs_of(env)})
    text = json.dumps(synthesized).replace(image_uri(env).rsplit(":", 1)[1], "f" * 64)
    assembly = write_assembly(tmp_path / "cdk.out", ENV, json.loads(text))
    aws = account()
    code, checks = found(aws, capsys, cloud_assembly=assembly)
    name = pipeline_name(ENV, env.profiles[0])
    assert code == 1
    line = checks[f"pipeline {name}"]
    assert line.startswith(
        f"FAIL pipeline {name}: differs from the synthesized template ({assembly}) at "
        "Steps[0].Arguments.AlgorithmSpecification.TrainingImage: "
    )
    assert f"-> deploy this code: npx cdk deploy TrainingStack -c env={ENV} -c account={ACCOUNT}" in line
    assert ("cloudformation", "GetTemplate") not in aws.operations()
    assert checks[BOOTSTRAP].endswith(f"the app needs 6, its lookup role 8 ({assembly}/manifest.json)")


def test_a_fresh_synth_of_the_deployed_code_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = get_environment(ENV)
    assembly = write_assembly(tmp_path, ENV, template(env, {job.profile: job.instance_count for job in jobs_of(env)}))
    code, checks = found(account(), capsys, cloud_assembly=assembly)
    assert code == 0
    assert checks[f"pipeline {pipeline_name(ENV, env.profiles[0])}"].startswith(
        f"PASS pipeline {pipeline_name(ENV, env.profiles[0])}: definition matches the synthesized template"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: d,
            "--cloud-assembly {d}: no manifest.json there: run npx cdk synth TrainingStack -c env=dev -o {d} first",
        ),
        (
            lambda d: write_assembly(d, "prod", {"Resources": {}}),
            "--cloud-assembly {d} holds TrainingStack-prod, not TrainingStack-dev: run npx cdk synth TrainingStack "
            "-c env=dev -o {d}",
        ),
        (
            lambda d: write_assembly(d, "dev", {"Resources": {}}, account="111122223333"),
            "--cloud-assembly {d} was synthesized for account 111122223333, the credentials are for "
            f"{ACCOUNT}: synthesize with -c env=dev -c account={ACCOUNT}",
        ),
    ],
    ids=["empty folder", "another environment", "another account"],
)
def test_a_cloud_assembly_for_something_else_is_one_line_and_exit_2(
    make: Any, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from btk.cli import main

    aws = account()
    monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region: aws.client)
    make(tmp_path)
    assert main(["doctor", "--env", ENV, "--cloud-assembly", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "btk: error: " + message.format(d=tmp_path) + "\n")


# --------------------------------------------------------------------------- image and topic


def test_an_image_gone_from_ecr_fails(capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("ecr", "DescribeImages")] = Error("ImageNotFoundException", "The image requested does not exist")
    code, checks = found(aws, capsys)
    assert code == 1
    assert checks["training image"] == (
        f"FAIL training image: {image_uri(get_environment(ENV))} is not in ECR (a lifecycle rule or a delete removed "
        f"it) -> deploy pushes it again: npx cdk deploy TrainingStack -c env={ENV} -c account={ACCOUNT}"
    )
    (asked,) = [params for service, _, params in aws.calls if service == "ecr"]
    uri = image_uri(get_environment(ENV))
    assert asked == {
        "registryId": ACCOUNT,
        "repositoryName": uri.split("/", 1)[1].split(":")[0],
        "imageIds": [{"imageTag": uri.rsplit(":", 1)[1]}],
    }


def test_an_image_built_elsewhere_is_looked_up_by_its_digest(capsys: pytest.CaptureFixture[str]) -> None:
    """An ``image_uri`` by digest (an image pipeline's own): ECR is asked for that digest."""
    env = get_environment(ENV)
    digest = "sha256:" + "ab" * 32
    uri = f"{ACCOUNT}.dkr.ecr.{env.region}.amazonaws.com/ml/trainer@{digest}"
    aws = account()
    aws.answers[("cloudformation", "DescribeStacks")] = stack(env, ImageUri=uri)
    aws.answers[("ecr", "DescribeImages")] = {"imageDetails": [{"imageSizeInBytes": 9_000_000_000}]}
    _, checks = found(aws, capsys)
    assert checks["training image"].startswith(f"PASS training image: ml/trainer@{digest[:19]} present")
    (asked,) = [params for service, _, params in aws.calls if service == "ecr"]
    assert asked == {"registryId": ACCOUNT, "repositoryName": "ml/trainer", "imageIds": [{"imageDigest": digest}]}


def test_an_image_repository_gone_fails(capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("ecr", "DescribeImages")] = Error("RepositoryNotFoundException", "does not exist")
    code, checks = found(aws, capsys)
    assert code == 1
    assert checks["training image"].startswith("FAIL training image: repository cdk-btkdev-container-assets-")


def subscription(arn: str) -> dict[str, str]:
    return {"SubscriptionArn": arn, "Owner": ACCOUNT, "Protocol": "email", "Endpoint": "a@example.com",
            "TopicArn": TOPIC_ARN}  # fmt: skip


@pytest.mark.parametrize(
    ("subscriptions", "line"),
    [
        ([subscription("PendingConfirmation")],
         "WARN failure topic: no confirmed subscription; 1 pending confirmation -> each address confirms"),
        ([], "WARN failure topic: no subscription: nobody hears of failed training -> set notification_emails"),
        ([subscription("PendingConfirmation"), subscription(f"{TOPIC_ARN}:0a1b2c3d-0000-4000-8000-00000000000a")],
         "PASS failure topic: 1 confirmed subscription(s) (email)"),
    ],
    ids=["pending", "none", "one confirmed"],
)  # fmt: skip
def test_the_failure_topic_needs_a_confirmed_subscription(
    subscriptions: list[dict[str, str]], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = account()
    pages = [subscriptions[:1], subscriptions[1:]] if len(subscriptions) > 1 else [subscriptions]

    def listing(params: dict[str, Any]) -> dict[str, Any]:
        page = int(params.get("NextToken", "0"))
        return {"Subscriptions": pages[page], **({"NextToken": str(page + 1)} if page + 1 < len(pages) else {})}

    aws.answers[("sns", "ListSubscriptionsByTopic")] = listing
    code, checks = found(aws, capsys)
    assert code == 0
    assert checks["failure topic"].startswith(line)


def test_a_topic_gone_fails(capsys: pytest.CaptureFixture[str]) -> None:
    aws = account()
    aws.answers[("sns", "ListSubscriptionsByTopic")] = Error("NotFound", "Topic does not exist", 404)
    code, checks = found(aws, capsys)
    assert code == 1
    assert checks["failure topic"].startswith(f"FAIL failure topic: {TOPIC_ARN} does not exist")
