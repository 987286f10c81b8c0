"""One environment's CI can change nothing of another's, proven offline on the synthesized policies.

For every pair of environments of ``environments.py`` in one account, the roles of the first
environment's bootstrap (stacks/bootstrap_stack.py: deploy, file-publishing, image-publishing,
lookup, and the CloudFormation execution role under its permissions boundary), and *any* role
its stack could create (everything allowed, capped by the boundary), are evaluated
(tests/iam_evaluation.py) against the second environment's stack and every resource of its
synthesized templates (TrainingStack and bootstrap): by the name CloudFormation or the project
gives it, untagged, and by an id, tagged ``aws:cloudformation:stack-name`` as CloudFormation
tags it. Every action AWS's Service Authorization Reference lists for the resource's type is
tried; none may be allowed.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import cfn_fakes
import pytest
from iam_evaluation import Principal, glob_overlaps
from permission_reference import boundary_statements, reference, resource_arn_format
from reserve_variant import synthesize_bootstrap
from stack_synth import Synth, synths

import environments
from stacks.bootstrap_stack import STACK_NAME_TAG, bootstrap_stack_name

__all__ = ["synths"]

ENVS = {env.name: cfn_fakes.in_fake_region(env) for env in environments.ENVIRONMENTS}
PAIRS = [(a, b) for a, b in itertools.permutations(ENVS, 2) if ENVS[a].account == ENVS[b].account]
ACCOUNT, REGION = cfn_fakes.ACCOUNT, cfn_fakes.REGION

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


@functools.cache
def bootstrap_template(env_name: str) -> dict[str, Any]:
    return synthesize_bootstrap(ENVS[env_name], list(ENVS.values()))


@functools.cache
def principals(env_name: str) -> dict[str, Principal]:
    """The bootstrap roles of ``env_name`` and a stand-in for any role its stack may create."""
    template = bootstrap_template(env_name)
    boundary = boundary_statements(template)
    found: dict[str, Principal] = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        statements = []
        for policy in template["Resources"].values():
            if policy["Type"] == "AWS::IAM::Policy" and {"Ref": logical_id} in policy["Properties"]["Roles"]:
                statements += policy["Properties"]["PolicyDocument"]["Statement"]
        bounded = "PermissionsBoundary" in resource["Properties"]
        qualifier = ENVS[env_name].bootstrap_qualifier
        kind = resource["Properties"]["RoleName"].removeprefix(f"cdk-{qualifier}-").split("-role-")[0]
        found[kind] = Principal(by_names(template, statements), boundary if bounded else None)
    assert set(found) == {"deploy", "cfn-exec", "file-publishing", "image-publishing", "lookup"}
    found["any role of the stack"] = Principal([{"Effect": "Allow", "Action": "*", "Resource": "*"}], boundary)
    return found


@pytest.mark.skipif(not PAIRS, reason="no two environments share an account: AWS isolates them")
@pytest.mark.parametrize(("mine", "theirs"), PAIRS)
def test_one_environments_roles_can_do_nothing_to_another(mine: str, theirs: str, synths: dict[str, Synth]) -> None:
    other = ENVS[theirs]
    targets = probes(synths[theirs].template, other.stack_name)
    targets += probes(bootstrap_template(theirs), bootstrap_stack_name(other))
    allowed = []
    checked = 0
    for role, principal in principals(mine).items():
        for probe in targets:
            for action in actions_on(probe):
                checked += 1
                if principal.allows(action, probe.arn, probe.context):
                    allowed.append(f"{role}: {action} on {probe.arn} {probe.context or ''}")
    assert checked > 1000
    assert allowed == [], f"{len(allowed)} of {checked} requests allowed, e.g.\n" + "\n".join(allowed[:20])


def test_the_deploy_role_may_change_its_own_stack(synths: dict[str, Synth]) -> None:
    """The check can fail: the same evaluation allows the environment its own stack."""
    name = next(iter(ENVS))
    deploy = principals(name)["deploy"]
    own = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{ENVS[name].stack_name}/1a2b3c4d-0000"
    assert deploy.allows("cloudformation:ExecuteChangeSet", own)
    assert deploy.allows("cloudformation:DeleteStack", own)


def test_cdk_bootstraps_default_deploy_role_would_be_flagged() -> None:
    """What ``cdk bootstrap``'s own template grants the deploy role (DeployPermissions and
    CliPermissions on every stack): the evaluation allows it another environment's stack."""
    default = Principal([{"Effect": "Allow", "Resource": "*", "Action": [
        "cloudformation:CreateChangeSet", "cloudformation:ExecuteChangeSet", "cloudformation:DeleteStack"]}])
    theirs = ENVS[list(ENVS)[-1]]
    arn = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{theirs.stack_name}/1a2b3c4d-0000"
    assert default.allows("cloudformation:DeleteStack", arn)
