"""The documented bootstrap, run for real against an AWS emulator, and what it gives each environment.

docs/deploy.md's step 1 and docs/ci.md's step 2, in the order a user runs them, from an empty account
(moto in server mode, ``tests/aws_emulator.py``): ``btk bootstrap --env <env>`` for every environment
of ``environments.py`` (the environment's boundary, then the CDK CLI's own ``cdk bootstrap``), then
``cdk deploy CiAccessStack``, each environment's ``cdk deploy TrainingStack`` (its change set: moto cannot
execute it), docs/deploy.md's destroy and a second deploy of the first environment. Then, as the change
set would, each environment's pipelines are created from the template the CLI uploaded, and
docs/pipeline.md's start commands and docs/capacity.md's ``btk capacity show`` and ``search`` run. The
roles are then read back from the emulator's IAM as the commands created them.

Isolation: for every pair of environments in one account, every role of the first one's bootstrap
(deploy, file-publishing, image-publishing, lookup, CloudFormation execution), its CI deploy role,
and *any* role its stack could create (everything allowed, capped by the boundary) are evaluated
(tests/iam_evaluation.py) against the second environment's stack and every resource of its
synthesized TrainingStack: by the name CloudFormation or the project gives it, untagged, and by an
id, tagged ``aws:cloudformation:stack-name`` as CloudFormation tags it. Every action AWS's Service
Authorization Reference lists for the resource's type is tried; none may be allowed. An AWS managed
policy a role carries (``ReadOnlyAccess``, whose document the emulator does not hold) counts as
allowing everything: what keeps a role off another environment must be the boundary.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cfn_fakes
import pytest
from aws_emulator import (
    Emulator,
    RecordedCall,
    RoleRecord,
    caller_arn,
    deployed_managed_policies,
    moto_server,
    read_roles,
    recorded_calls,
)
from iam_evaluation import Principal, glob_overlaps
from permission_reference import reference, resource_arn_format
from stack_synth import Synth, synths

import environments
from btk.bootstrap import boundary_policy_name, boundary_stack_name, toolkit_stack_name
from btk.doctor.bootstrap import DEPLOY_BOOTSTRAP_VERSION, LOOKUP_ROLE_BOOTSTRAP_VERSION, version_parameter
from btk.naming import pipeline_name
from stacks.boundary_stack import STACK_NAME_TAG

__all__ = ["synths"]

REPO = Path(__file__).resolve().parents[2]
ENVS = {env.name: cfn_fakes.in_fake_region(env) for env in environments.ENVIRONMENTS}
PAIRS = [(a, b) for a, b in itertools.permutations(ENVS, 2) if ENVS[a].account == ENVS[b].account]
#: moto's account: every environment is bootstrapped into it.
ACCOUNT, REGION = cfn_fakes.ACCOUNT, cfn_fakes.REGION
BOOTSTRAP_KINDS = ("deploy", "cfn-exec", "file-publishing", "image-publishing", "lookup")
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Account:
    """The emulated account after the documented commands, and what each printed."""

    emulator: Emulator
    roles: dict[str, RoleRecord]
    outputs: dict[str, str]
    calls: list[RecordedCall]
    callers: dict[str, str]
    """Who each access key of the recorded calls is (an ARN)."""
    torn_down_stack_id: str
    """The id of the stack the first deploy of :data:`TORN_DOWN` created, before the destroy."""
    capacity: dict[str, tuple[subprocess.CompletedProcess[str], list[RecordedCall]]]
    """docs/capacity.md's ``btk capacity show`` for each environment: how it exited, and the calls it made."""
    capacity_search: tuple[subprocess.CompletedProcess[str], list[RecordedCall]]
    """docs/capacity.md's ``btk capacity search`` for the first environment, likewise."""
    pipeline_runs: list[PipelineRun]
    """docs/pipeline.md's start commands, run on each environment's pipelines."""


def code_blocks(doc: str, heading: str) -> list[str]:
    """The commands of the bash blocks under ``heading`` in ``docs/<doc>`` (continuations joined, comments out)."""
    text = (REPO / "docs" / doc).read_text()
    section = text[text.index(heading):]
    for end in ("\n**", "\n## "):
        section = section[:section.index(end, 1)] if end in section[1:] else section
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def documented_bootstrap(env_name: str) -> list[str]:
    """docs/ci.md's bootstrap command (docs/deploy.md's step 1), for ``env_name`` in the emulator's account."""
    (template, *_) = [c for c in code_blocks("ci.md", "**1. Bootstrap each environment**")
                      if c.startswith("btk bootstrap")]
    match = re.fullmatch(r"btk bootstrap --env (\S+) --account ACCOUNT", template)
    assert match, template
    return [".venv/bin/btk", "bootstrap", "--env", env_name, "--account", ACCOUNT, "--yes"]


def documented_ci_access() -> list[str]:
    """docs/ci.md's CiAccessStack command, for every environment, in the emulator's account."""
    (command,) = [c for c in code_blocks("ci.md", "**2. Deploy `CiAccessStack` once per account**")
                  if c.startswith("npx cdk deploy CiAccessStack")]
    words = command.replace("ACCOUNT", ACCOUNT).replace("OWNER/REPO", "example-org/blackwell-training-kit").split()
    words = [f"ci_environments={','.join(ENVS)}" if word.startswith("ci_environments=") else word for word in words]
    return ["node_modules/.bin/cdk", *words[2:], "--require-approval", "never", "--no-notices"]


#: An image built elsewhere (``-c image_uri=``): the emulator has no Docker to build containers/Dockerfile.
IMAGE_URI = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/btk-trainer:emulated"


def documented_deploy(env_name: str) -> list[str]:
    """docs/deploy.md's ``cdk deploy TrainingStack`` for ``env_name``, with an image built elsewhere, its change
    set created and not executed (the emulator cannot execute it: docs/deploy.md, "Rehearsed offline")."""
    (command,) = [c for c in code_blocks("deploy.md", "## 3. Deploy an environment")
                  if c.startswith("npx cdk deploy TrainingStack")]
    words = [f"env={env_name}" if word.startswith("env=") else word.replace("123456789012", ACCOUNT)
             for word in command.split()]
    return ["node_modules/.bin/cdk", *words[2:], "-c", f"image_uri={IMAGE_URI}", "--no-execute",
            "--require-approval", "never", "--no-notices"]


def documented_doctor(env_name: str) -> list[str]:
    """docs/deploy.md's ``btk doctor`` before the deploy, as the deploy workflow runs it: as the lookup role."""
    (command,) = [c for c in code_blocks("deploy.md", "## 3. Deploy an environment") if c.startswith("btk doctor")]
    words = [env_name if word == "staging" else word for word in command.split("#")[0].split()]
    return [".venv/bin/btk", *words[1:], "--lookup-role"]


def documented_destroy(env_name: str) -> list[str]:
    """docs/deploy.md's ``cdk destroy TrainingStack`` for ``env_name`` (``--force``: no question to answer)."""
    (command,) = [c for c in code_blocks("deploy.md", "## 5. Tear down") if c.startswith("npx cdk destroy")]
    words = [f"env={env_name}" if word.startswith("env=") else word.replace("123456789012", ACCOUNT)
             for word in command.split("#")[0].split()]
    return ["node_modules/.bin/cdk", *words[2:], "--force", "--no-notices"]


def documented_capacity_show(env_name: str) -> list[str]:
    """docs/capacity.md's ``btk capacity show`` for ``env_name`` (its optional arguments left out)."""
    text = (REPO / "docs" / "capacity.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("$ btk capacity show")]
    words = line.removeprefix("$ ").split("[")[0].split()
    assert words[3:] == ["--env", "prod"], words
    return [".venv/bin/btk", *words[1:4], env_name]


def documented_capacity_search(env_name: str) -> list[str]:
    """docs/capacity.md's ``btk capacity search`` for ``env_name`` and its first profile (optional arguments out)."""
    text = (REPO / "docs" / "capacity.md").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("$ btk capacity search")]
    words = line.removeprefix("$ ").split("[")[0].split()
    assert words[3:7] == ["--env", "prod", "--profile", "llama3.1-8b"], words
    return [".venv/bin/btk", *words[1:4], env_name, "--profile", ENVS[env_name].profiles[0], *words[7:]]


@dataclass(frozen=True)
class PipelineRun:
    """One of docs/pipeline.md's start commands, run on one pipeline: what it asked for and what came back."""

    env: str
    pipeline: str
    parameters: dict[str, str]
    declared: dict[str, str]
    """The parameters the pipeline's definition declares, by name: their types."""
    execution_arn: str


def documented_starts() -> list[tuple[str, dict[str, str]]]:
    """docs/pipeline.md's ``aws sagemaker start-pipeline-execution`` commands: (pipeline, parameters) each."""
    starts: list[tuple[str, dict[str, str]]] = []
    for command in code_blocks("pipeline.md", "## Starting a run"):
        words = shlex.split(command)
        assert words[:3] == ["aws", "sagemaker", "start-pipeline-execution"], command
        options: dict[str, list[str]] = {}
        for word in words[3:]:
            if word.startswith("--"):
                options[word] = []
            else:
                options[list(options)[-1]].append(word)
        assert set(options) <= {"--pipeline-name", "--pipeline-parameters"}, command
        pairs = [dict(item.split("=", 1) for item in shorthand.split(","))
                 for shorthand in options.get("--pipeline-parameters", [])]
        starts.append((options["--pipeline-name"][0], {pair["Name"]: pair["Value"] for pair in pairs}))
    assert starts, "docs/pipeline.md documents no start command"
    return starts


def training_template(emulator: Emulator, env: Any) -> dict[str, Any]:
    """``env``'s TrainingStack template as the CDK CLI uploaded it to the environment's own asset bucket."""
    s3, bucket = emulator.client("s3", REGION), f"cdk-{env.bootstrap_qualifier}-assets-{ACCOUNT}-{REGION}"
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=bucket)["Contents"] if item["Key"].endswith(".json")]
    bodies = [json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) for key in keys]
    (template,) = [body for body in bodies if "AWS::SageMaker::Pipeline" in json.dumps(body)]
    assert IMAGE_URI in json.dumps(template), keys
    return template


def start_documented_runs(emulator: Emulator) -> list[PipelineRun]:
    """Each environment's pipelines created as CloudFormation creates them from the uploaded template (moto
    cannot execute the change set), then docs/pipeline.md's start commands run on each, as a user runs them."""
    sagemaker = emulator.client("sagemaker", REGION)
    runs: list[PipelineRun] = []
    for name, env in ENVS.items():
        template = training_template(emulator, env)
        for resource in template["Resources"].values():
            if resource["Type"] != "AWS::SageMaker::Pipeline":
                continue
            properties = by_names(template, resource["Properties"])
            pipeline, body = properties["PipelineName"], properties["PipelineDefinition"]["PipelineDefinitionBody"]
            sagemaker.create_pipeline(PipelineName=pipeline, PipelineDefinition=body, RoleArn=properties["RoleArn"])
            declared = {item["Name"]: item["Type"] for item in json.loads(body)["Parameters"]}
            for _, parameters in documented_starts():
                values = {key: value.replace("us-east-1", env.region).replace("123456789012", ACCOUNT)
                          for key, value in parameters.items()}
                started = sagemaker.start_pipeline_execution(
                    PipelineName=pipeline, PipelineParameters=[{"Name": key, "Value": value}
                                                               for key, value in values.items()])
                runs.append(PipelineRun(name, pipeline, values, declared, started["PipelineExecutionArn"]))
    return runs


#: The environment torn down and deployed again after the first deploys.
TORN_DOWN = next(iter(ENVS))


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    """An empty emulated account after docs/ci.md's steps 1 and 2 and docs/deploy.md's step 3 (the doctor,
    then the deploy), run as written (``--yes`` and ``--require-approval never`` answer the CLI's questions),
    then docs/deploy.md's step 5 and step 3 again for one environment."""
    workdir: Path = tmp_path_factory.mktemp("emulated-account")
    with moto_server(workdir, REGION) as emulator:
        outputs: dict[str, str] = {}
        named: dict[str, list[str]] = {}
        for name, env in ENVS.items():
            outputs[f"bootstrap {name}"] = emulator.run(documented_bootstrap(name))
            named.update(deployed_managed_policies(emulator, toolkit_stack_name(env), ACCOUNT, env.region))
        outputs["ci access"] = emulator.run(documented_ci_access())
        for name in ENVS:
            outputs[f"doctor {name}"] = emulator.run(documented_doctor(name), allowed_exits=(0, 1))
            outputs[f"deploy {name}"] = emulator.run(documented_deploy(name))
        cloudformation = emulator.client("cloudformation", REGION)
        first_stack_id = cloudformation.describe_stacks(StackName=ENVS[TORN_DOWN].stack_name)["Stacks"][0]["StackId"]
        outputs["destroy"] = emulator.run(documented_destroy(TORN_DOWN))
        outputs["deploy again"] = emulator.run(documented_deploy(TORN_DOWN))
        runs = start_documented_runs(emulator)
        capacity: dict[str, tuple[subprocess.CompletedProcess[str], list[RecordedCall]]] = {}
        for name in ENVS:
            before = len(recorded_calls(emulator))
            result = emulator.completed(documented_capacity_show(name))
            capacity[name] = (result, recorded_calls(emulator)[before:])
        before = len(recorded_calls(emulator))
        searched = emulator.completed(documented_capacity_search(TORN_DOWN))
        search = (searched, recorded_calls(emulator)[before:])
        roles = read_roles(emulator, "", named)
        calls = recorded_calls(emulator)
        callers = {key: caller_arn(emulator, key) for key in {call.access_key for call in calls}}
        yield Account(emulator, roles, outputs, calls, callers, first_stack_id, capacity, search, runs)


def bootstrap_role(env_name: str, kind: str) -> str:
    return f"cdk-{ENVS[env_name].bootstrap_qualifier}-{kind}-role-{ACCOUNT}-{ENVS[env_name].region}"


def principal_of(record: RoleRecord) -> Principal:
    """The role as the evaluation sees it; AWS managed policies the emulator does not hold allow everything."""
    statements = list(record.statements)
    if record.managed_elsewhere:
        statements.append({"Effect": "Allow", "Action": "*", "Resource": "*"})
    return Principal(statements, record.boundary, name=record.name)


#: CloudFormation resource type -> (service prefix, the reference's resource type, lower-case generated names).
ARN_TYPES: dict[str, tuple[str, str, bool]] = {
    "AWS::S3::Bucket": ("s3", "bucket", True),
    "AWS::IAM::Role": ("iam", "role", False),
    "AWS::IAM::ManagedPolicy": ("iam", "policy", False),
    "AWS::Lambda::Function": ("lambda", "function", False),
    "AWS::Logs::LogGroup": ("logs", "log-group", False),
    "AWS::KMS::Key": ("kms", "key", False),
    "AWS::EC2::VPC": ("ec2", "vpc", False),
    "AWS::EC2::Subnet": ("ec2", "subnet", False),
    "AWS::EC2::SecurityGroup": ("ec2", "security-group", False),
    "AWS::EC2::RouteTable": ("ec2", "route-table", False),
    "AWS::EC2::VPCEndpoint": ("ec2", "vpc-endpoint", False),
    "AWS::FSx::FileSystem": ("fsx", "file-system", False),
    "AWS::SageMaker::Pipeline": ("sagemaker", "pipeline", False),
    "AWS::SNS::Topic": ("sns", "topic", False),
    "AWS::Events::Rule": ("events", "rule-on-default-event-bus", False),
    "AWS::StepFunctions::StateMachine": ("states", "stateMachine", False),
    "AWS::CloudWatch::Dashboard": ("cloudwatch", "dashboard", False),
    "AWS::ECR::Repository": ("ecr", "repository", False),
    "AWS::SSM::Parameter": ("ssm", "parameter", False),
}
#: Properties naming a resource.
NAME_KEYS = ("BucketName", "RoleName", "ManagedPolicyName", "FunctionName", "LogGroupName", "PipelineName",
             "TopicName", "Name", "StateMachineName", "DashboardName", "RepositoryName")


@dataclass(frozen=True)
class Probe:
    arn: str
    service: str
    context: dict[str, str]


def arn_of(service: str, resource_type: str, name: str) -> str:
    """The reference's ARN format of the type, in the test account and region, every name part ``name``."""
    import re

    values = {"Partition": "aws", "Region": REGION, "Account": ACCOUNT}
    return re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1), name), resource_arn_format(service, resource_type))


def probes(template: dict[str, Any], stack_name: str) -> list[Probe]:
    """Each resource of ``template`` by name (untagged) and by id (tagged as CloudFormation tags it)."""
    found = [Probe(f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{stack_name}/1a2b3c4d-0000", "cloudformation", {})]
    tagged = {f"aws:ResourceTag/{STACK_NAME_TAG}": stack_name}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] not in ARN_TYPES:
            continue
        service, kind, lower = ARN_TYPES[resource["Type"]]
        properties = resource.get("Properties", {})
        names = [cfn_fakes.resolve(template, properties[key]) for key in NAME_KEYS if key in properties]
        generated = f"{stack_name}-{logical_id}-ABCDEF123456"
        name = str(names[0]) if names and isinstance(names[0], str) else (generated.lower() if lower else generated)
        name = name.lstrip("/") if service == "ssm" else name  # parameter/<name without its leading slash>
        found.append(Probe(arn_of(service, kind, name), service, {}))
        found.append(Probe(arn_of(service, kind, f"id-{logical_id.lower()}"), service, tagged))
    return found


@functools.cache
def service_actions(service: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Every action of ``service`` with the ARN formats of the resource types it takes."""
    data = reference()[service]
    actions = []
    for name, privilege in sorted(data["privileges"].items()):
        formats = tuple(data["resources"][kind]["arn"] for kind in privilege["resource_types"] if kind)
        actions.append((f"{service}:{name}", formats))
    return tuple(actions)


def actions_on(probe: Probe) -> tuple[str, ...]:
    """The actions AWS lists for the probe's resource type (those whose formats fit its ARN)."""
    return _actions_on(probe.service, probe.arn)


@functools.cache  # the same resources are probed by every role of every environment
def _actions_on(service: str, arn: str) -> tuple[str, ...]:
    fitting = tuple(action for action, formats in service_actions(service)
                    if any(glob_overlaps(arn, arn_format) for arn_format in formats))
    assert fitting, f"no action of {service} takes {arn}"
    return fitting


def by_names(template: dict[str, Any], node: Any) -> Any:
    """``node`` with each ``Ref``/``Fn::GetAtt .Arn`` of a named resource replaced by its name/ARN,
    then every other intrinsic by cfn_fakes' values."""

    def named(logical_id: str, attribute: str | None) -> str | None:
        resource = template["Resources"].get(logical_id)
        if resource is None or resource["Type"] not in ARN_TYPES:
            return None
        properties = resource.get("Properties", {})
        names = [properties[key] for key in NAME_KEYS if isinstance(properties.get(key), str)]
        if not names:
            return None
        service, kind, _ = ARN_TYPES[resource["Type"]]
        name = names[0].lstrip("/") if service == "ssm" else names[0]
        return arn_of(service, kind, name) if attribute == "Arn" or (service == "ssm" and attribute) else names[0]

    def walk(item: Any) -> Any:
        if isinstance(item, list):
            return [walk(value) for value in item]
        if isinstance(item, dict):
            if set(item) == {"Ref"}:
                return named(item["Ref"], None) or item
            if set(item) == {"Fn::GetAtt"}:
                logical_id, attribute = item["Fn::GetAtt"]
                return named(logical_id, attribute) or item
            return {key: walk(value) for key, value in item.items()}
        return item

    return cfn_fakes.resolve(template, walk(node))


def principals(account: Account, env_name: str) -> dict[str, Principal]:
    """The bootstrap roles of ``env_name``, its CI deploy role, and a stand-in for any role its stack may create."""
    found = {kind: principal_of(account.roles[bootstrap_role(env_name, kind)]) for kind in BOOTSTRAP_KINDS}
    found["ci deploy"] = principal_of(account.roles[f"btk-github-deploy-{env_name}"])
    boundary = account.roles[bootstrap_role(env_name, "cfn-exec")].boundary
    found["any role of the stack"] = Principal([{"Effect": "Allow", "Action": "*", "Resource": "*"}], boundary)
    return found


def bootstrap_probes(env_name: str) -> list[Probe]:
    """What the documented bootstrap created for ``env_name``, by the names the CDK CLI's template gives it."""
    env = ENVS[env_name]
    qualifier, suffix = env.bootstrap_qualifier, f"{ACCOUNT}-{env.region}"
    named = [("s3", "bucket", f"cdk-{qualifier}-assets-{suffix}"),
             ("ecr", "repository", f"cdk-{qualifier}-container-assets-{suffix}"),
             ("ssm", "parameter", version_parameter(qualifier).lstrip("/")),
             ("iam", "policy", boundary_policy_name(env)),
             *[("iam", "role", bootstrap_role(env_name, kind)) for kind in BOOTSTRAP_KINDS]]
    stacks = [toolkit_stack_name(env), boundary_stack_name(env)]
    return [*[Probe(arn_of(service, kind, name), service, {}) for service, kind, name in named],
            *[Probe(f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{stack}/1a2b3c4d-0000", "cloudformation", {})
              for stack in stacks]]


@pytest.mark.skipif(not PAIRS, reason="no two environments share an account: AWS isolates them")
@pytest.mark.parametrize(("mine", "theirs"), PAIRS)
def test_one_environments_roles_can_do_nothing_to_another(
    mine: str, theirs: str, synths: dict[str, Synth], account: Account
) -> None:
    other = ENVS[theirs]
    targets = probes(synths[theirs].template, other.stack_name) + bootstrap_probes(theirs)
    allowed = []
    checked = 0
    for role, principal in principals(account, mine).items():
        for probe in targets:
            for action in actions_on(probe):
                checked += 1
                if principal.allows(action, probe.arn, probe.context):
                    allowed.append(f"{role}: {action} on {probe.arn} {probe.context or ''}")
    assert checked > 1000
    assert allowed == [], f"{len(allowed)} of {checked} requests allowed, e.g.\n" + "\n".join(allowed[:20])


def test_every_role_an_environment_reaches_carries_its_boundary(account: Account) -> None:
    """The five bootstrap roles and the CI deploy role of each environment, as IAM holds them."""
    for name, env in ENVS.items():
        expected = f"arn:aws:iam::{ACCOUNT}:policy/{boundary_policy_name(env)}"
        roles = [bootstrap_role(name, kind) for kind in BOOTSTRAP_KINDS] + [f"btk-github-deploy-{name}"]
        assert {role: account.roles[role].boundary_arn for role in roles} == dict.fromkeys(roles, expected)


def test_the_execution_role_has_the_boundary_as_its_only_policy(account: Account) -> None:
    """``--cloudformation-execution-policies`` took the place of the CLI's default AdministratorAccess."""
    for name in ENVS:
        record = account.roles[bootstrap_role(name, "cfn-exec")]
        assert record.managed_elsewhere == ()
        assert list(record.statements) == list(record.boundary or ())


def test_the_bootstrap_writes_the_version_the_app_needs(account: Account) -> None:
    ssm = account.emulator.client("ssm", REGION)
    for env in ENVS.values():
        version = int(ssm.get_parameter(Name=version_parameter(env.bootstrap_qualifier))["Parameter"]["Value"])
        assert version >= max(DEPLOY_BOOTSTRAP_VERSION, LOOKUP_ROLE_BOOTSTRAP_VERSION)


def test_the_roles_may_do_what_the_cdk_cli_asks_of_them(account: Account) -> None:
    """The check can fail: the same evaluation allows each environment what the CLI does with its own
    bootstrap (the asset publisher describes the repository and its images before it pushes)."""
    for name, env in ENVS.items():
        roles = principals(account, name)
        own_stack = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{env.stack_name}/1a2b3c4d-0000"
        repository = arn_of("ecr", "repository", f"cdk-{env.bootstrap_qualifier}-container-assets-{ACCOUNT}-{REGION}")
        bucket_object = arn_of("s3", "object", f"cdk-{env.bootstrap_qualifier}-assets-{ACCOUNT}-{REGION}")
        assert roles["deploy"].allows("cloudformation:ExecuteChangeSet", own_stack)
        assert roles["deploy"].allows("cloudformation:DeleteStack", own_stack)
        in_account = {"aws:ResourceAccount": ACCOUNT}
        for action in ("ecr:DescribeRepositories", "ecr:DescribeImages", "ecr:PutImage", "ecr:InitiateLayerUpload"):
            assert roles["image-publishing"].allows(action, repository, in_account), action
        assert roles["file-publishing"].allows("s3:PutObject", bucket_object, in_account)
        assert roles["ci deploy"].allows("sts:AssumeRole", arn_of("iam", "role", bootstrap_role(name, "deploy")))
        # btk doctor --lookup-role lists the file systems (an action on no resource, so no tag to match).
        assert roles["lookup"].allows("fsx:DescribeFileSystems", "*")


def test_the_documented_commands_printed_what_they_ran(account: Account) -> None:
    """``btk bootstrap`` printed the boundary's deploy and the CLI's bootstrap, and the CLI said it bootstrapped."""
    for name, env in ENVS.items():
        output = account.outputs[f"bootstrap {name}"]
        assert f"$ node_modules/.bin/cdk deploy BtkBoundary-{name} " in output
        assert f"--qualifier {env.bootstrap_qualifier} --toolkit-stack-name {toolkit_stack_name(env)}" in output
        assert f"Environment aws://{ACCOUNT}/{env.region} bootstrapped" in output
    assert "CiAccessStack" in account.outputs["ci access"]


def test_the_documented_commands_print_no_jsii_banner(account: Account) -> None:
    """Run from a shell without jsii's Node 20 switch (cdk.json's app sets it for the synth), no command
    printed jsii's end-of-life banner, which reaches the terminal as Python bytes literals."""
    for name, output in account.outputs.items():
        assert "end-of-life" not in output.lower() and not re.search(r"\bb'", output), f"{name}: {output[:2000]}"


def test_the_destroy_deletes_the_stack_and_the_deploy_after_it_creates_it_anew(account: Account) -> None:
    """docs/deploy.md's step 5 deleted the environment's stack (through its deploy role: the call check below
    covers the destroy's calls too), and step 3 after it created a new stack with its change set."""
    cloudformation = account.emulator.client("cloudformation", REGION)
    stack_name = ENVS[TORN_DOWN].stack_name
    assert f"({stack_name}): destroyed" in account.outputs["destroy"], account.outputs["destroy"][-2000:]
    first = account.torn_down_stack_id
    assert cloudformation.describe_stacks(StackName=first)["Stacks"][0]["StackStatus"] == "DELETE_COMPLETE"
    (again,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    assert again["StackId"] != first and again["StackStatus"] == "REVIEW_IN_PROGRESS"
    assert "created and waiting in review for manual execution" in account.outputs["deploy again"]
    deleted_as = {account.callers[call.access_key].split(":assumed-role/")[-1].split("/")[0]
                  for call in account.calls if (call.service, call.operation) == ("cloudformation", "DeleteStack")}
    assert deleted_as == {bootstrap_role(TORN_DOWN, "deploy")}


def test_each_environments_deploy_reaches_its_change_set_through_its_own_bootstrap(account: Account) -> None:
    """The CLI published the assets through the file-publishing role and created the change set as the
    deploy role, with the execution role: what the emulator holds afterwards says so."""
    cloudformation = account.emulator.client("cloudformation", REGION)
    for name, env in ENVS.items():
        assert "created and waiting in review for manual execution" in account.outputs[f"deploy {name}"]
        (stack,) = cloudformation.describe_stacks(StackName=env.stack_name)["Stacks"]
        summaries = cloudformation.list_change_sets(StackName=env.stack_name)["Summaries"]
        # moto lists every stack's change sets, a deleted stack's of the same name included.
        (summary,) = [item for item in summaries if item["StackId"] == stack["StackId"]]
        change_set = cloudformation.describe_change_set(StackName=env.stack_name,
                                                        ChangeSetName=summary["ChangeSetName"])
        assert change_set["Status"] == "CREATE_COMPLETE"
        types = {change["ResourceChange"]["ResourceType"] for change in change_set["Changes"]}
        assert {"AWS::IAM::Role", "AWS::S3::Bucket", "AWS::KMS::Key", "AWS::SageMaker::Pipeline"} <= types
        # The template the file-publishing role uploaded to the environment's own asset bucket.
        assert training_template(account.emulator, env)["Resources"]


#: Operations whose IAM action is not ``service:Operation`` (AWS's Service Authorization Reference).
IAM_ACTIONS = {
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "GetBucketEncryption"): "s3:GetEncryptionConfiguration",
    ("s3", "HeadObject"): "s3:GetObject",
}
#: Calls the CDK CLI makes knowing they may be refused, and carries on without: (role kind, action,
#: resource) -> why.
DEFAULT_TOOLKIT = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/CDKToolkit/1a2b3c4d-0000"
TOLERATED = {
    ("deploy", "cloudformation:DescribeStacks", DEFAULT_TOOLKIT):
        "the CLI looks for the default toolkit stack to decide whether assets cross accounts, and goes on without it",
}


def stack_arn(name: str) -> str:
    return f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{name}/1a2b3c4d-0000"


def authorized_requests(call: RecordedCall) -> list[tuple[str, str]]:
    """What IAM authorizes for ``call``: (action, resource ARN) pairs; a call the check cannot name fails."""
    action = IAM_ACTIONS.get((call.service, call.operation), f"{call.service}:{call.operation}")
    assert call.operation in reference()[call.service]["privileges"] or action != f"{call.service}:{call.operation}", (
        f"{action} is not in AWS's Service Authorization Reference: add its action to IAM_ACTIONS")
    params = call.params
    if call.service == "s3":
        on_object = call.operation in ("PutObject", "GetObject", "HeadObject")
        return [(action, f"arn:aws:s3:::{call.bucket}" + (f"/{call.key}" if on_object else ""))]
    if call.service == "cloudformation":
        stack = params.get("StackName")
        if stack is None:
            return [(action, "*")]
        arn = stack if stack.startswith("arn:") else stack_arn(stack)
        return [(action, arn)] + ([("iam:PassRole", params["RoleARN"])] if params.get("RoleARN") else [])
    if call.service == "ssm" and "Name" in params:
        return [(action, f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{params['Name'].lstrip('/')}")]
    if call.service == "ecr" and "repositoryName" in params:
        return [(action, f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{params['repositoryName']}")]
    service, name = action.split(":")
    if not any(kind for kind in reference()[service]["privileges"][name]["resource_types"]):
        return [(action, "*")]  # an action on no resource type (GetCallerIdentity, ListServiceQuotas)
    raise AssertionError(f"the check cannot name the resource of {call}: add it to authorized_requests")


def role_kinds() -> dict[str, str]:
    """Bootstrap role name -> its kind."""
    return {bootstrap_role(name, kind): kind for name in ENVS for kind in BOOTSTRAP_KINDS}


def test_every_call_made_as_a_bootstrap_role_is_one_that_role_may_make(account: Account) -> None:
    """Each request the CDK CLI or ``btk doctor --lookup-role`` signed with an environment's bootstrap role
    during the documented run, as the emulator recorded it, evaluated against that role's policies and
    boundary as IAM holds them. (The administrator's own calls, bootstrapping and deploying the CI access,
    are not bounded.)"""
    kinds = role_kinds()
    context = {"aws:ResourceAccount": ACCOUNT, "iam:PassedToService": "cloudformation.amazonaws.com"}
    checked, refused = 0, []
    for call in account.calls:
        caller = account.callers[call.access_key]
        if ":assumed-role/" not in caller:
            continue
        role = caller.split(":assumed-role/", 1)[1].split("/")[0]
        kind = kinds[role]
        record = account.roles[role]
        for action, resource in authorized_requests(call):
            checked += 1
            if principal_of(record).allows(action, resource, context) or (kind, action, resource) in TOLERATED:
                continue
            identity = Principal(principal_of(record).statements).allows(action, resource, context)
            refused.append(f"{call} as {role}: {action} on {resource} is refused by its "
                           f"{'boundary' if identity else 'policies (no statement allows it)'}")
    assert checked >= 10 * len(ENVS), checked
    assert refused == [], "\n".join(refused)


def test_the_call_check_can_fail(account: Account) -> None:
    """The same evaluation refuses a call the deploy role could not make: another environment's stack."""
    if not PAIRS:
        pytest.skip("no two environments share an account")
    mine, theirs = PAIRS[0]
    call = RecordedCall("-", "cloudformation", "CreateChangeSet", {"StackName": ENVS[theirs].stack_name})
    ((action, resource),) = authorized_requests(call)
    assert not principal_of(account.roles[bootstrap_role(mine, "deploy")]).allows(action, resource)


def test_the_doctor_reads_the_real_bootstrap_through_its_lookup_role(account: Account) -> None:
    """No traceback, the bootstrap found at the CLI's version, read as the environment's own lookup role."""
    for name, env in ENVS.items():
        output = account.outputs[f"doctor {name}"]
        assert f"as arn:aws:sts::{ACCOUNT}:assumed-role/{bootstrap_role(name, 'lookup')}/" in output
        assert f"PASS CDK bootstrap '{env.bootstrap_qualifier}'" in output
        assert "Traceback" not in output


def test_cdk_bootstraps_default_deploy_role_would_be_flagged() -> None:
    """What ``cdk bootstrap``'s own template grants the deploy role (DeployPermissions and
    CliPermissions on every stack): without the boundary the evaluation allows it another environment's stack."""
    default = Principal([{"Effect": "Allow", "Resource": "*", "Action": [
        "cloudformation:CreateChangeSet", "cloudformation:ExecuteChangeSet", "cloudformation:DeleteStack"]}])
    theirs = ENVS[list(ENVS)[-1]]
    arn = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{theirs.stack_name}/1a2b3c4d-0000"
    assert default.allows("cloudformation:DeleteStack", arn)


#: How a pipeline parameter's type reads a value (SageMaker refuses a value its type cannot take).
PARAMETER_TYPES = {"Integer": int, "Float": float, "String": str,
                   "Boolean": lambda value: {"true": True, "false": False}[value.lower()]}


def test_each_pipeline_starts_with_the_documented_commands(account: Account) -> None:
    """docs/pipeline.md's start commands, on every pipeline of every environment, created from the template the
    CLI uploaded: the emulator started an execution of that pipeline, and every parameter a command sets is one
    the pipeline's definition declares, with a value of its type (moto starts an execution whatever the
    parameters say; SageMaker refuses an undeclared one)."""
    expected = {(name, pipeline_name(name, profile)) for name, env in ENVS.items() for profile in env.profiles}
    assert {(run.env, run.pipeline) for run in account.pipeline_runs} == expected
    sagemaker = account.emulator.client("sagemaker", REGION)
    for run in account.pipeline_runs:
        execution = sagemaker.describe_pipeline_execution(PipelineExecutionArn=run.execution_arn)
        assert execution["PipelineArn"].endswith(f":pipeline/{run.pipeline}"), execution
        for parameter, value in run.parameters.items():
            assert parameter in run.declared, f"{run.pipeline}: docs/pipeline.md sets {parameter}, not declared"
            PARAMETER_TYPES[run.declared[parameter]](value)
    documented = {name for _, parameters in documented_starts() for name in parameters}
    assert documented, "docs/pipeline.md starts no run with parameters"


def test_btk_capacity_show_asks_aws_only_where_the_environment_uses_a_plan(account: Account) -> None:
    """docs/capacity.md's ``btk capacity show``, for each environment, against the emulator: an on-demand
    environment is answered without a call; one on a training plan asks SageMaker for it in the environment's
    region, and since moto has no training plans the answer is one line and exit 2 (what the command then does
    with a plan is tests/capacity's, on botocore's own stubs)."""
    for name, env in ENVS.items():
        result, calls = account.capacity[name]
        if env.capacity.mode == "on_demand":
            assert result.returncode == 0 and "on_demand" in result.stdout and calls == [], result
            continue
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        asked = {call.operation for call in calls if call.service == "sagemaker"}
        assert asked & {"DescribeTrainingPlan", "ListTrainingPlans"}, calls


def test_btk_capacity_search_asks_sagemaker_and_reports_an_odd_answer_in_one_line(account: Account) -> None:
    """docs/capacity.md's ``btk capacity search`` reaches SageMaker's SearchTrainingPlanOfferings through the
    emulator; moto answers it with an HTML internal-server-error page, and the command says so in one line
    naming the page, not the page's markup, exit 2 (the offerings themselves: tests/capacity, on botocore's
    stubs)."""
    result, calls = account.capacity_search
    assert result.returncode == 2 and result.stdout == "", result
    (line,) = result.stderr.strip().splitlines()
    assert line == ("btk: error: SearchTrainingPlanOfferings failed: 500: an HTML page (500 Internal Server Error), "
                    "not an AWS answer (check AWS_ENDPOINT_URL and any HTTPS_PROXY)"), line
    assert {(call.service, call.operation) for call in calls} == {("sagemaker", "SearchTrainingPlanOfferings")}
