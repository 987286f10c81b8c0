"""``btk evidence push|pull --env ENV``: the team's runs through the environment's artifacts bucket.

Against moto in-process: CloudFormation holds a stack of the environment's name whose
``ArtifactsBucketName`` output names a versioned bucket (moto cannot run the whole TrainingStack;
a stack with that bucket and output stands in for it), and the commands find it as they would
in AWS, through DescribeStacks and the S3 API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from cli_run import run
from evidence_documents import runs_document
from fixture_catalog import STAGING

from btk.evidence_bucket import EVIDENCE_KEY

ENV = STAGING.name


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto in-process with throwaway credentials; yields a function that deploys the stand-in stack."""
    from moto import mock_aws

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        import boto3

        def deploy(*, output: bool = True) -> str:
            template: dict[str, Any] = {"Resources": {"Artifacts": {
                "Type": "AWS::S3::Bucket", "Properties": {"VersioningConfiguration": {"Status": "Enabled"}}}}}
            if output:
                template["Outputs"] = {"ArtifactsBucketName": {"Value": {"Ref": "Artifacts"}}}
            cloudformation = boto3.client("cloudformation", region_name=STAGING.region)
            cloudformation.create_stack(StackName=STAGING.stack_name, TemplateBody=json.dumps(template))
            resources = cloudformation.describe_stack_resources(StackName=STAGING.stack_name)["StackResources"]
            return str(resources[0]["PhysicalResourceId"])

        yield deploy


def _runs(*speeds: float, prefix: str = "reh") -> dict[str, Any]:
    return runs_document(*speeds, kind=prefix)


def _store(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def _speeds(path: Path) -> dict[str, float]:
    return {run["id"]: run["tokens_per_second_per_gpu"] for run in json.loads(path.read_text())["runs"]}


def test_two_people_share_their_runs_through_the_bucket(aws: Any, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    bucket = aws()
    mine = _store(tmp_path / "mine.json", _runs(15000.0, 15600.0))
    code, out, _ = run(capsys, "evidence", "push", "--env", ENV, "--evidence", str(mine))
    assert code == 0 and out == f"s3://{bucket}/{EVIDENCE_KEY}: 2 run(s) added, 0 replaced, 2 in all\n"
    code, out, _ = run(capsys, "evidence", "push", "--env", ENV, "--evidence", str(mine))
    assert code == 0 and "already holds every run" in out and "nothing written" in out

    theirs = tmp_path / "theirs.json"  # a colleague with no store yet pulls, measures, pushes
    code, out, _ = run(capsys, "evidence", "pull", "--env", ENV, "--evidence", str(theirs))
    assert code == 0 and out.startswith(f"{theirs}: 2 run(s) added, 0 replaced from s3://{bucket}/")
    assert _speeds(theirs) == _speeds(mine)
    changed = json.loads(theirs.read_text())
    changed["runs"][0]["tokens_per_second_per_gpu"] = 15100.0
    changed["runs"].extend(_runs(16000.0, prefix="run")["runs"])
    _store(theirs, changed)
    code, out, _ = run(capsys, "evidence", "push", "--env", ENV, "--evidence", str(theirs))
    assert code == 0 and "1 run(s) added, 1 replaced, 3 in all" in out

    code, out, _ = run(capsys, "evidence", "pull", "--env", ENV, "--evidence", str(mine))
    assert code == 0 and "1 run(s) added, 1 replaced" in out and _speeds(mine) == _speeds(theirs)


def test_a_push_that_raced_another_writes_nothing(aws: Any, capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone pushed between this push's read and its write: it is told to push again, and their runs stay."""
    import boto3

    from btk import evidence_bucket

    bucket = aws()
    s3 = boto3.client("s3", region_name=STAGING.region)
    read = evidence_bucket.read_bucket_evidence

    def read_then_someone_pushes(clients: Any, name: str) -> Any:
        found = read(clients, name)
        s3.put_object(Bucket=name, Key=EVIDENCE_KEY, Body=json.dumps(_runs(9.0, prefix="theirs")).encode())
        return found

    monkeypatch.setattr(evidence_bucket, "read_bucket_evidence", read_then_someone_pushes)
    code, _, err = run(capsys, "evidence", "push", "--env", ENV, "--evidence",
                       str(_store(tmp_path / "mine.json", _runs(15000.0))))
    assert code == 2 and err.strip() == (f"btk: error: s3://{bucket}/{EVIDENCE_KEY} changed while this push merged it "
                                         "(someone else pushed): push again")
    body = s3.get_object(Bucket=bucket, Key=EVIDENCE_KEY)["Body"].read()
    assert [run["id"] for run in json.loads(body)["runs"]] == ["btk-prod-llama3.1-8b-theirs-0"]


@pytest.mark.parametrize("command", ["push", "pull"])
def test_without_the_stack_it_is_one_line_and_the_store_is_untouched(
        aws: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    store = _store(tmp_path / "mine.json", _runs(15000.0))
    before = store.read_bytes()
    code, out, err = run(capsys, "evidence", command, "--env", ENV, "--evidence", str(store))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"stack {STAGING.stack_name} does not exist in {STAGING.region}" in err and "deploy it first" in err
    assert store.read_bytes() == before


def test_a_stack_without_the_output_is_one_line(aws: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    aws(output=False)
    code, _, err = run(capsys, "evidence", "pull", "--env", ENV, "--evidence", str(tmp_path / "store.json"))
    assert code == 2 and "has no ArtifactsBucketName output" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "store.json").exists()


@pytest.mark.parametrize(("body", "names"), [
    (b"not json", "not valid JSON"),
    (json.dumps({"version": 1, "runs": [{"id": "x"}]}).encode(), "runs.0.kind"),
    (json.dumps({"version": 7, "runs": []}).encode(), "version"),
])
@pytest.mark.parametrize("command", ["push", "pull"])
def test_an_object_that_is_not_evidence_is_one_line_naming_it(
        aws: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, body: bytes, names: str, command: str) -> None:
    import boto3

    bucket = aws()
    boto3.client("s3", region_name=STAGING.region).put_object(Bucket=bucket, Key=EVIDENCE_KEY, Body=body)
    store = _store(tmp_path / "mine.json", _runs(15000.0))
    before = store.read_bytes()
    code, _, err = run(capsys, "evidence", command, "--env", ENV, "--evidence", str(store))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"s3://{bucket}/{EVIDENCE_KEY}" in err and names in err
    assert store.read_bytes() == before


def test_a_store_that_is_not_evidence_stops_the_push_before_aws(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from btk.cli import evidence

    def no_aws(region: str) -> Any:
        raise AssertionError("called AWS")

    monkeypatch.setattr(evidence, "aws_clients", no_aws)
    store = tmp_path / "store.json"
    store.write_text("{")
    code, _, err = run(capsys, "evidence", "push", "--env", ENV, "--evidence", str(store))
    assert code == 2 and str(store) in err and len(err.strip().splitlines()) == 1
