"""``btk doctor`` on a whole account: every check answered, and AWS refusing or throttling each call in turn."""

from __future__ import annotations

import json
from typing import Any

import fixture_catalog
import pytest
from doctor_fixtures import (
    ACCOUNT,
    CALLER_ARN,
    NOW,
    Error,
    StubbedAws,
    denied,
    doctor,
    findings_of,
    healthy_account,
    jobs_of,
    once_throttled,
    throttled,
    variant,
)

from btk.aws_clients import NO_CREDENTIALS
from btk.catalog import get_environment
from btk.cli import main
from btk.doctor.quotas import training_needs

ENVIRONMENTS = sorted(fixture_catalog.ENVIRONMENTS)


def expected_checks(env_name: str) -> list[str]:
    """The checks a deployed environment gets, in order, derived from its configuration."""
    env = get_environment(env_name)
    checks = [f"quota '{need.label}'" for need in training_needs(env, jobs_of(env))]
    checks.append(f"CDK bootstrap '{env.bootstrap_qualifier}'")
    if env.data_stage.mode == "fsx":
        checks += [
            "quota 'Lustre Persistent_2 storage capacity'",
            "quota 'Lustre Persistent_2 file systems'",
            "quota 'Lustre Persistent_2 throughput capacity'",
        ]
    checks.append(f"stack {env.stack_name}")
    checks += [f"pipeline btk-{env.name}-{profile.replace('.', '-')}" for profile in env.profiles]
    return [*checks, "training image", "failure topic"]


def healthy(env_name: str) -> StubbedAws:
    env = get_environment(env_name)
    return healthy_account(env, jobs_of(env))


@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_a_prepared_account_passes_every_check(env_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    aws = healthy(env_name)
    code, lines = doctor(env_name, aws, capsys)
    assert code == 0
    assert lines[0] == f"btk doctor: environment {env_name}, account {ACCOUNT}, us-east-1, as {CALLER_ARN}"
    assert list(findings_of(lines)) == expected_checks(env_name)
    assert all(line.startswith("PASS ") for line in lines[1:-1]), lines
    assert lines[-1] == f"btk doctor: 0 failed, 0 warned, {len(lines) - 2} passed"
    aws.done()


def test_json_has_every_check_with_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = doctor("prod", healthy("prod"), capsys, output_format="json")
    result = json.loads("\n".join(lines))
    assert code == result["exit_code"] == 0
    assert (result["environment"], result["account"], result["region"]) == ("prod", ACCOUNT, "us-east-1")
    assert [check["check"] for check in result["checks"]] == expected_checks("prod")
    assert result["counts"] == {"pass": len(result["checks"]), "warn": 0, "fail": 0}
    instance = result["checks"][0]
    assert instance["data"]["needed"] == max(job.instance_count for job in jobs_of(get_environment("prod")))
    assert instance["data"]["quota_code"].startswith("L-")


def test_before_the_first_deploy_the_stack_is_a_warning_and_nothing_hangs_on_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = get_environment("staging")
    aws = healthy_account(env, jobs_of(env), deployed=False)
    code, lines = doctor("staging", aws, capsys)
    found = findings_of(lines)
    assert code == 0
    assert found["stack TrainingStack-staging"].startswith("WARN stack TrainingStack-staging: not deployed yet")
    assert (
        "-> the first deploy creates it: npx cdk deploy TrainingStack -c env=staging"
        in found["stack TrainingStack-staging"]
    )
    assert list(found)[-1] == "stack TrainingStack-staging"
    assert ("cloudformation", "GetTemplate") not in aws.operations()
    aws.done()


def calls_of(env_name: str) -> list[tuple[str, str]]:
    """The AWS operations a run for ``env_name`` makes against a prepared account (identity aside)."""
    aws = healthy(env_name)
    doctor(env_name, aws)
    return [call for call in aws.operations() if call != ("sts", "GetCallerIdentity")]


with fixture_catalog.installed():
    PROD_CALLS = calls_of("prod")
#: What hangs on the stack, and is not checked when DescribeStacks gets no answer.
AFTER_DEPLOY = ("pipeline ", "training image", "failure topic")


def test_the_prod_run_asks_every_kind_of_question() -> None:
    assert {service for service, _ in PROD_CALLS} == {
        "service-quotas", "ssm", "fsx", "cloudformation", "sagemaker", "ecr", "sns"
    }  # fmt: skip


def iam_action(service: str, operation: str) -> str:
    prefix = "servicequotas" if service == "service-quotas" else service
    return f"{prefix}:{operation}"


@pytest.mark.parametrize("call", PROD_CALLS, ids=lambda call: f"{call[0]}:{call[1]}")
@pytest.mark.parametrize("answer", ["denied", "throttled"])
def test_a_call_aws_refuses_costs_its_own_checks_only(
    call: tuple[str, str], answer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, passing = doctor("prod", healthy("prod"), capsys)
    aws = healthy("prod")
    aws.answers[call] = denied(call[0]) if answer == "denied" else throttled(call[0])
    sleeps: list[float] = []
    code, lines = doctor("prod", aws, capsys, sleeps=sleeps)
    action = iam_action(*call)
    said = (
        f": not checked: AWS denied {action} ({denied(call[0]).code}) -> grant it to the caller (docs/deploy.md"
        if answer == "denied"
        else f": not checked: {action} still throttled ({throttled(call[0]).code}) after 4 attempts -> run btk "
        "doctor again later"
    )
    unanswered = [line for line in lines[1:-1] if line not in passing]
    assert unanswered, "the refused call changed nothing"
    assert all(line.startswith("WARN ") and said in line for line in unanswered), unanswered
    checks = expected_checks("prod")
    if call == ("cloudformation", "DescribeStacks"):
        checks = [check for check in checks if not check.startswith(AFTER_DEPLOY)]
    assert list(findings_of(lines)) == checks  # every other check still ran, in its place
    assert code == 0  # nothing failed: a check AWS did not answer warns
    attempts = len([made for made in aws.calls if made[:2] == call])
    assert sleeps == ([] if answer == "denied" else [1.0, 2.0, 4.0] * (attempts // 4))
    assert answer == "denied" or attempts % 4 == 0


@pytest.mark.parametrize("call", PROD_CALLS, ids=lambda call: f"{call[0]}:{call[1]}")
def test_a_call_throttled_once_is_retried_and_answers(
    call: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, passing = doctor("prod", healthy("prod"), capsys)
    aws = healthy("prod")
    aws.answers[call] = once_throttled(call[0], aws.answers[call])
    sleeps: list[float] = []
    code, lines = doctor("prod", aws, capsys, sleeps=sleeps)
    assert (code, lines) == (0, passing)
    assert sleeps and set(sleeps) == {1.0}  # each distinct request waited once, the first backoff step
    aws.done()


def test_no_credentials_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code = main(["doctor", "--env", "dev"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err == f"btk: error: {NO_CREDENTIALS}\n"


@pytest.mark.parametrize(
    "error", [Error("ExpiredToken", "The security token included in the request is expired"), throttled("sts")]
)
def test_credentials_aws_refuses_are_one_line_and_exit_2(
    error: Error, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = healthy("dev")
    aws.answers[("sts", "GetCallerIdentity")] = error
    monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region: aws.client)
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    code = main(["doctor", "--env", "dev"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("btk: error: ")
    assert error.code in captured.err


def test_credentials_of_another_account_than_the_environment_s_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # 111122223333: another of the account ids AWS documentation uses, like 123456789012
    pinned = variant(get_environment("dev"), account="111122223333", name="pinned")
    fixture_catalog.install(monkeypatch, pinned)
    aws = healthy("dev")
    monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region: aws.client)
    assert main(["doctor", "--env", "pinned"]) == 2
    assert capsys.readouterr().err == (
        f"btk: error: the credentials are for account {ACCOUNT}, environment pinned deploys to 111122223333: "
        "use that account's credentials\n"
    )


@pytest.mark.parametrize("argv", [["doctor"], ["doctor", "--env", "nope"], ["doctor", "--env", " "]])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1


def test_a_listing_that_never_ends_costs_its_own_checks_only(capsys: pytest.CaptureFixture[str]) -> None:
    aws = healthy("prod")
    env = get_environment("prod")
    own = aws.answers[("fsx", "DescribeFileSystems")]
    aws.answers[("fsx", "DescribeFileSystems")] = {**own, "NextToken": "same-token-again"}  # type: ignore[dict-item]
    code, lines = doctor("prod", aws, capsys)
    found = findings_of(lines)
    for check in ("quota 'Lustre Persistent_2 storage capacity'", "quota 'Lustre Persistent_2 file systems'"):
        assert found[check].startswith(
            f"WARN {check}: not checked: fsx:DescribeFileSystems repeated a page token after 2 pages"
        )
    assert code == 0
    assert list(found) == expected_checks(env.name)


LOOKUP_ROLE = f"arn:aws:iam::{ACCOUNT}:role/cdk-btkdev-lookup-role-{ACCOUNT}-us-east-1"
LOOKUP_ROLE_ARN = f"arn:aws:sts::{ACCOUNT}:assumed-role/cdk-btkdev-lookup-role-{ACCOUNT}-us-east-1/btk-doctor-dev"


def test_with_lookup_role_the_checks_read_as_the_bootstrap_lookup_role(capsys: pytest.CaptureFixture[str]) -> None:
    aws = healthy("dev")
    identities = iter(
        [
            {"UserId": "AROADEPLOY:deploy", "Account": ACCOUNT, "Arn": CALLER_ARN},
            {"UserId": "AROALOOKUP:btk-doctor-dev", "Account": ACCOUNT, "Arn": LOOKUP_ROLE_ARN},
        ]
    )
    aws.answers[("sts", "GetCallerIdentity")] = lambda params: next(identities)
    aws.answers[("sts", "AssumeRole")] = {
        "Credentials": {
            "AccessKeyId": "ASIAEXAMPLELOOKUP01",
            "SecretAccessKey": "not-a-real-secret",
            "SessionToken": "not-a-real-token",
            "Expiration": NOW,
        },
        "AssumedRoleUser": {"AssumedRoleId": "AROALOOKUP:btk-doctor-dev", "Arn": LOOKUP_ROLE_ARN},
    }
    code, lines = doctor("dev", aws, capsys, lookup_role=True)
    assert code == 0
    assert lines[0].endswith(f"as {LOOKUP_ROLE_ARN}")
    (assumed,) = [params for _, operation, params in aws.calls if operation == "AssumeRole"]
    assert assumed == {"RoleArn": LOOKUP_ROLE, "RoleSessionName": "btk-doctor-dev"}
    aws.done()


def test_a_lookup_role_that_cannot_be_assumed_is_one_line_naming_the_bootstrap(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = healthy("dev")
    aws.answers[("sts", "AssumeRole")] = denied("sts")
    monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region, credentials=None: aws.client)
    assert main(["doctor", "--env", "dev", "--lookup-role"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"btk: error: cannot read as the lookup role {LOOKUP_ROLE}: AWS denied sts:AssumeRole (AccessDeniedException): "
        f"bootstrap the environment (btk bootstrap --env dev --account {ACCOUNT}) "
        "and let the caller assume it\n"
    )


def test_clients_made_with_assumed_credentials_sign_with_them() -> None:
    from botocore.awsrequest import AWSResponse

    from btk.doctor.aws import client_factory

    credentials = {"AccessKeyId": "ASIAEXAMPLELOOKUP01", "SecretAccessKey": "x" * 40, "SessionToken": "token"}
    client = client_factory("us-east-1", credentials)("sts")
    sent: list[Any] = []

    class Raw:
        def stream(self, **_: Any) -> Any:
            yield (
                b"<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>" + LOOKUP_ROLE_ARN.encode()
                + b"</Arn><UserId>AROALOOKUP:x</UserId><Account>123456789012</Account></GetCallerIdentityResult>"
                b"</GetCallerIdentityResponse>"
            )  # fmt: skip

    def answer(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {}, Raw())

    client.meta.events.register("before-send.sts.GetCallerIdentity", answer)
    assert client.get_caller_identity()["Arn"] == LOOKUP_ROLE_ARN
    (request,) = sent
    assert "Credential=ASIAEXAMPLELOOKUP01/" in request.headers["Authorization"].decode()
    assert request.headers["X-Amz-Security-Token"].decode() == "token"
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 6}  # 5 retries
