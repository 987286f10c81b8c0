"""An AWS emulator for the documented deploy: moto in server mode, on loopback, for one test module.

The CDK CLI and ``btk`` reach it through ``AWS_ENDPOINT_URL`` (both honour it), with throwaway
credentials; nothing leaves the machine. :func:`read_roles` reads back what the real commands
created, as IAM holds it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]
MOTO_SERVER = Path(sys.executable).parent / "moto_server"
#: Every AWS credential and endpoint variable a developer's shell may hold, dropped first.
AWS_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
JSII_SILENCE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


@dataclass(frozen=True)
class Emulator:
    """A running moto server: its endpoint and the environment variables that point a process at it."""

    endpoint: str
    env: Mapping[str, str]
    log: Path
    recording: Path
    """Every request the emulator answered, one JSON object a line (moto's recorder)."""

    def client(self, service: str, region: str = "us-east-1") -> Any:
        import boto3

        return boto3.client(service, region_name=region, endpoint_url=self.endpoint,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def run(self, command: Sequence[str], timeout: float = 600, allowed_exits: Sequence[int] = (0,)) -> str:
        """Run ``command`` in the repository against the emulator; its output, or a failure naming it."""
        result = self.completed(command, timeout)
        output = result.stdout + result.stderr
        if result.returncode not in allowed_exits:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{output[-4000:]}")
        return output

    def completed(self, command: Sequence[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in the repository against the emulator, whatever its exit status."""
        return subprocess.run(list(command), cwd=REPO, env=dict(self.env), capture_output=True, text=True,
                              timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server(workdir: Path, region: str = "us-east-1") -> Iterator[Emulator]:
    """Start ``moto_server`` on a free loopback port; stop it on exit."""
    port = _free_port()
    # "localhost", not 127.0.0.1: moto's CloudFormation reads a TemplateURL on "localhost" from its own S3
    # (the CDK CLI builds the URL from AWS_ENDPOINT_URL).
    endpoint = f"http://localhost:{port}"
    log = workdir / "moto_server.log"
    recording = workdir / "requests.jsonl"
    server_env = {**os.environ, "MOTO_ENABLE_RECORDING": "1", "MOTO_RECORDER_FILEPATH": str(recording)}
    with log.open("w") as sink:
        process = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=sink,
                                   stderr=subprocess.STDOUT, env=server_env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"moto_server did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        # Without jsii's Node 20 switch, as a user's shell runs the documented commands: cdk.json's app and btk
        # must keep jsii's end-of-life banner out of what they print themselves.
        env = {key: value for key, value in os.environ.items() if key not in AWS_VARIABLES and key != JSII_SILENCE}
        env.update({
            "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": region, "AWS_DEFAULT_REGION": region, "CDK_DISABLE_VERSION_CHECK": "1",
        })
        yield Emulator(endpoint=endpoint, env=env, log=log, recording=recording)
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()


@dataclass(frozen=True)
class RoleRecord:
    """A role as IAM holds it: its identity-policy statements and its boundary's (``None``: no boundary).

    ``managed_elsewhere`` lists attached policies whose document the emulator does not hold (AWS's
    own, such as ``ReadOnlyAccess``).
    """

    name: str
    statements: tuple[Mapping[str, Any], ...]
    boundary: tuple[Mapping[str, Any], ...] | None
    managed_elsewhere: tuple[str, ...]
    boundary_arn: str | None = None


def _document(raw: Any) -> dict[str, Any]:
    """A policy document as IAM returns it: URL-encoded JSON (boto3 decodes it to a dict), or, for
    an inline policy moto's CloudFormation created, the text of a Python dict."""
    if isinstance(raw, str):
        text = unquote(raw)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            raw = ast.literal_eval(text)
    statements = raw.get("Statement", [])
    return {**raw, "Statement": statements if isinstance(statements, list) else [statements]}


def _managed_statements(iam: Any, arn: str) -> list[Mapping[str, Any]] | None:
    try:
        policy = iam.get_policy(PolicyArn=arn)["Policy"]
    except iam.exceptions.NoSuchEntityException:
        return None
    version = iam.get_policy_version(PolicyArn=arn, VersionId=policy["DefaultVersionId"])["PolicyVersion"]
    return list(_document(version["Document"])["Statement"])


def read_roles(emulator: Emulator, prefix: str, named: Mapping[str, Sequence[str]] | None = None
               ) -> dict[str, RoleRecord]:
    """Every role whose name starts with ``prefix``, with its policies and boundary as IAM holds them,
    and the managed policies ``named`` gives it (:func:`deployed_managed_policies`)."""
    iam = emulator.client("iam")
    found: dict[str, RoleRecord] = {}
    for page in iam.get_paginator("list_roles").paginate():
        for summary in page["Roles"]:
            name = summary["RoleName"]
            if not name.startswith(prefix):
                continue
            role = iam.get_role(RoleName=name)["Role"]
            statements: list[Mapping[str, Any]] = []
            for policy_name in iam.list_role_policies(RoleName=name)["PolicyNames"]:
                document = iam.get_role_policy(RoleName=name, PolicyName=policy_name)["PolicyDocument"]
                statements += _document(document)["Statement"]
            elsewhere: list[str] = []
            listed = iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
            attached = [item["PolicyArn"] for item in listed]
            for arn in dict.fromkeys([*attached, *(named or {}).get(name, ())]):
                managed = _managed_statements(iam, arn)
                if managed is None:
                    elsewhere.append(arn)
                else:
                    statements += managed
            boundary_arn = (role.get("PermissionsBoundary") or {}).get("PermissionsBoundaryArn")
            boundary = None
            if boundary_arn:
                boundary_statements = _managed_statements(iam, boundary_arn)
                assert boundary_statements is not None, f"{name}'s boundary {boundary_arn} does not exist"
                boundary = tuple(boundary_statements)
            found[name] = RoleRecord(name, tuple(statements), boundary, tuple(elsewhere), boundary_arn)
    return found


class _Template:
    """A deployed template's values under the parameters the stack was deployed with (the intrinsics the
    CDK CLI's bootstrap template uses: Ref, Fn::Sub, Fn::Join, Fn::If and the condition functions)."""

    def __init__(self, template: Mapping[str, Any], parameters: Mapping[str, Any], account: str, region: str):
        self.template = template
        self.values: dict[str, Any] = {"AWS::Partition": "aws", "AWS::AccountId": account, "AWS::Region": region,
                                       "AWS::NoValue": None}
        for name, spec in template.get("Parameters", {}).items():
            value = parameters.get(name, spec.get("Default", ""))
            kind = spec.get("Type", "String")
            if kind == "CommaDelimitedList":  # moto answers a list parameter with the text of a Python list
                items = ast.literal_eval(value) if str(value).startswith("[") else str(value).split(",")
                value = [item for item in items if item]
            self.values[name] = value

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template["Conditions"][name]))

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [value for value in (self.resolve(item) for item in node) if value is not None]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {key: self.resolve(value) for key, value in node.items()}
        (key, arg), = node.items()
        if key == "Ref":
            return self.values[arg]
        if key == "Condition":
            return self.condition(arg)
        if key == "Fn::If":
            return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])
        if key == "Fn::Sub":
            text = arg if isinstance(arg, str) else arg[0]
            for name, value in self.values.items():
                text = text.replace("${" + name + "}", str(value))
            return text
        if key == "Fn::Join":
            parts = self.resolve(arg[1])
            return arg[0].join(str(part) for part in (parts if isinstance(parts, list) else [parts]))
        if key == "Fn::Equals":
            first, second = (self.resolve(item) for item in arg)
            return first == second
        if key == "Fn::Not":
            return not self.resolve(arg[0])
        if key == "Fn::And":
            return all(self.resolve(item) for item in arg)
        if key == "Fn::Or":
            return any(self.resolve(item) for item in arg)
        return {key: self.resolve(arg)}


def deployed_managed_policies(emulator: Emulator, stack_name: str, account: str, region: str) -> dict[str, list[str]]:
    """The managed policies each role of a deployed stack names (``ManagedPolicyArns``), by role name,
    read from the template and parameters the stack was deployed with (moto's IAM does not attach them)."""
    import yaml

    cloudformation = emulator.client("cloudformation", region)
    body = cloudformation.get_template(StackName=stack_name)["TemplateBody"]
    template = yaml.safe_load(body) if isinstance(body, str) else body
    stack = cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0]
    parameters = {item["ParameterKey"]: item.get("ParameterValue", "") for item in stack.get("Parameters", [])}
    values = _Template(template, parameters, account, region)
    found: dict[str, list[str]] = {}
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Role" or "RoleName" not in resource.get("Properties", {}):
            continue
        if "Condition" in resource and not values.condition(resource["Condition"]):
            continue
        properties = resource["Properties"]
        arns = values.resolve(properties.get("ManagedPolicyArns")) or []
        found[values.resolve(properties["RoleName"])] = list(arns if isinstance(arns, list) else [arns])
    return found


@dataclass(frozen=True)
class RecordedCall:
    """One request the emulator answered: who signed it (access key id), the service and operation, its
    parameters (query or JSON body), and for S3 the bucket and key of its path."""

    access_key: str
    service: str
    operation: str
    params: Mapping[str, Any]
    bucket: str = ""
    key: str = ""

    def __str__(self) -> str:
        where = f" {self.bucket}/{self.key}" if self.bucket else ""
        return f"{self.service}:{self.operation}{where} {dict(self.params) if not self.bucket else ''}".rstrip()


def _entries(path: Path) -> list[dict[str, Any]]:
    """The recorder's entries; concurrent requests may share a line, so objects are read one after another."""
    text, decoder, position, found = path.read_text(), json.JSONDecoder(), 0, []
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return found
        entry, position = decoder.raw_decode(text, position)
        found.append(entry)


#: S3 REST requests: (method, the query parameter that names the sub-resource or "" for an object or
#: bucket) -> operation.
S3_OPERATIONS = {
    ("GET", "list-type"): "ListObjectsV2", ("GET", "encryption"): "GetBucketEncryption",
    ("GET", "location"): "GetBucketLocation", ("PUT", ""): "PutObject", ("GET", ""): "GetObject",
    ("HEAD", ""): "HeadObject",
}


def recorded_calls(emulator: Emulator) -> list[RecordedCall]:
    """Every signed AWS request in the emulator's recording, parsed; an S3 request of an unknown kind fails."""
    from urllib.parse import parse_qs, urlsplit

    calls = []
    for entry in _entries(emulator.recording):
        headers = {name.lower(): value for name, value in entry["headers"].items()}
        credential = headers.get("authorization", "").partition("Credential=")[2].split(",")[0].split("/")
        if len(credential) < 4:
            continue  # the emulator's own API (/moto-api/), unsigned
        access_key, service = credential[0], credential[3]
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            import base64

            body = base64.b64decode(body).decode("utf-8", "replace")
        url = urlsplit(entry["url"])
        if service == "s3":
            bucket, _, key = url.path.lstrip("/").partition("/")
            query = parse_qs(url.query, keep_blank_values=True)
            sub = next((name for name in ("list-type", "encryption", "location") if name in query), "")
            operation = S3_OPERATIONS.get((entry["method"], sub))
            assert operation, f"an S3 request the check cannot name: {entry['method']} {url.path}?{url.query}"
            calls.append(RecordedCall(access_key, service, operation, {}, bucket, key))
        elif "x-amz-target" in headers:
            params = json.loads(body or "{}")
            calls.append(RecordedCall(access_key, service, headers["x-amz-target"].rsplit(".", 1)[-1], params))
        else:
            params = {name: values[0] for name, values in parse_qs(body, keep_blank_values=True).items()}
            calls.append(RecordedCall(access_key, service, params.pop("Action", "?"), params))
    return calls


def caller_arn(emulator: Emulator, access_key: str) -> str:
    """Who an access key is (the emulator identifies a caller by the key alone)."""
    import boto3

    sts = boto3.client("sts", region_name="us-east-1", endpoint_url=emulator.endpoint, aws_access_key_id=access_key,
                       aws_secret_access_key="unchecked")
    arn: str = sts.get_caller_identity()["Arn"]
    return arn
