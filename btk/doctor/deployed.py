"""After a deploy: the stack, its pipelines against a template, its training image, its failure topic.

The pipelines are compared with the synthesized template when ``--cloud-assembly`` names one
(what this code would deploy) and with the deployed template otherwise (what CloudFormation
last deployed: a difference then is an edit made outside CloudFormation, which a deploy does
not undo while the template stays the same). The image is the stack's ``ImageUri`` output,
looked up in ECR (a lifecycle rule or a hand may have deleted it); the topic is its
``FailureTopicArn`` output, whose alerts reach nobody until a subscription is confirmed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from btk.doctor.assembly import CloudAssembly
from btk.doctor.aws import Answer, Caller, ServiceError
from btk.doctor.definitions import UncomparableError, definition_of, first_difference, pipeline_bodies
from btk.doctor.findings import FAIL, PASS, WARN, Check, Finding
from btk.environment import EnvironmentConfig
from btk.errors import BtkError
from btk.jsonfile import parse_json
from btk.naming import pipeline_name
from btk.report.aws import NOT_FOUND_CODES

HEALTHY = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "IMPORT_COMPLETE")
#: The stack's resources are in place, but its last change did not go through.
ROLLED_BACK = ("UPDATE_ROLLBACK_COMPLETE", "IMPORT_ROLLBACK_COMPLETE")
#: SNS writes these in ``SubscriptionArn`` until an address confirms, or after it was removed.
UNCONFIRMED = ("PendingConfirmation", "Deleted")
ECR_IMAGE = re.compile(
    r"(?P<registry>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repository>[^:@]+)"
    r"(?::(?P<tag>[^@]+)|@(?P<digest>sha256:[0-9a-f]{64}))"
)
BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class DeployedStack:
    """The environment's CloudFormation stack as DescribeStacks returns it."""

    name: str
    status: str
    reason: str = ""
    drift: str = ""
    outputs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> DeployedStack:
        return cls(
            name=str(item.get("StackName", "")),
            status=str(item.get("StackStatus", "")),
            reason=" ".join(str(item.get("StackStatusReason", "")).split()),
            drift=str((item.get("DriftInformation") or {}).get("StackDriftStatus", "")),
            outputs={str(o.get("OutputKey")): str(o.get("OutputValue", "")) for o in item.get("Outputs", [])},
        )


def describe_stack(caller: Caller, stack_name: str) -> DeployedStack | None:
    """The stack named ``stack_name``; ``None`` when it does not exist."""
    try:
        stacks = caller.call("cloudformation", "describe_stacks", StackName=stack_name).get("Stacks", [])
    except ServiceError as error:
        # CloudFormation answers a missing stack with "ValidationError: Stack with id X does not exist".
        if error.code == "ValidationError" and "does not exist" in error.message:
            return None
        raise
    return DeployedStack.from_api(stacks[0]) if stacks else None


def deploy_command(env: EnvironmentConfig, account: str) -> str:
    return f"npx cdk deploy TrainingStack -c env={env.name} -c account={account}"


def stack_finding(env: EnvironmentConfig, account: str, stack: DeployedStack | None) -> Finding:
    check = f"stack {env.stack_name}"
    deploy = deploy_command(env, account)
    if stack is None:
        return Finding(
            check, WARN, "not deployed yet (its pipelines, image and failure topic are checked once it exists)",
            f"the first deploy creates it: {deploy}",
        )  # fmt: skip
    found = stack.status + (f" ({stack.reason})" if stack.reason else "")
    found += f"; CloudFormation drift {stack.drift}" if stack.drift and stack.drift != "NOT_CHECKED" else ""
    data = {"status": stack.status, "drift": stack.drift, "outputs": stack.outputs}
    if stack.status in HEALTHY:
        return Finding(check, PASS, found, "", data)
    if stack.status in ROLLED_BACK:
        return Finding(
            check, WARN, found,
            f"its last update rolled back: read the stack's events, fix the cause and deploy again: {deploy}", data,
        )  # fmt: skip
    if stack.status.endswith("_IN_PROGRESS"):
        return Finding(check, WARN, found, "an operation is running: run btk doctor again when it ends", data)
    return Finding(
        check, FAIL, found, f"read the stack's events; delete a stack that never got created, then: {deploy}", data
    )


def _deployed_template(caller: Caller, stack_name: str) -> Any:
    answer = caller.call("cloudformation", "get_template", StackName=stack_name, TemplateStage="Original")
    body = answer.get("TemplateBody", "")
    # botocore decodes a JSON template into a dict; a YAML one stays text (and is not ours).
    try:
        return parse_json(body, f"the deployed template of {stack_name}") if isinstance(body, str) else body
    except BtkError:
        return {}


def pipeline_checks(
    env: EnvironmentConfig, account: str, assembly: CloudAssembly | None, caller: Caller
) -> list[Check]:
    """One check per profile: its pipeline exists and its definition is the template's."""
    if assembly is not None:
        reference = f"the synthesized template ({assembly.directory})"
        templates: Answer[Any] = Answer(lambda: assembly.template)
        fix = (
            f"deploy this code: {deploy_command(env, account)} (if that changes nothing, the pipeline was edited "
            "outside CloudFormation)"
        )
    else:
        reference = "the deployed template"
        templates = Answer(lambda: _deployed_template(caller, env.stack_name))
        fix = (
            "it was edited outside CloudFormation, which restores it only when the template changes: "
            "find the edit (CloudTrail UpdatePipeline) and deploy a change, or set it back with aws sagemaker "
            "update-pipeline"
        )

    def check_for(profile: str) -> Callable[[], Finding]:
        name = pipeline_name(env.name, profile)

        def run() -> Finding:
            check = f"pipeline {name}"
            bodies = pipeline_bodies(templates.get())
            try:
                live = caller.call("sagemaker", "describe_pipeline", PipelineName=name)
            except ServiceError as error:
                if error.code not in NOT_FOUND_CODES:
                    raise
                if assembly is None and name in bodies:
                    return Finding(
                        check, FAIL, "in the deployed template but deleted outside CloudFormation",
                        "CloudFormation does not re-create it while the template is unchanged: deploy once without "
                        "this profile (-c profiles=...) and once with it",
                    )  # fmt: skip
                return Finding(check, WARN, "not deployed yet", f"deploy creates it: {deploy_command(env, account)}")
            if name not in bodies:
                return Finding(
                    check, WARN, f"deployed, but not in {reference}",
                    f"synthesize every profile (no -c profiles=) and deploy: {deploy_command(env, account)}",
                )  # fmt: skip
            modified = f"last modified {live.get('LastModifiedTime', '?')}"
            try:
                expected = definition_of(bodies[name])
                deployed = parse_json(str(live.get("PipelineDefinition", "")), f"pipeline {name}'s definition")
            except (UncomparableError, BtkError) as error:
                return Finding(check, WARN, f"not compared: {error}", "compare it by hand in the SageMaker console")
            difference = first_difference(expected, deployed)
            if difference is None:
                return Finding(check, PASS, f"definition matches {reference} ({modified})")
            return Finding(check, FAIL, f"differs from {reference} at {difference} ({modified})", fix)

        return run

    return [(f"pipeline {pipeline_name(env.name, profile)}", check_for(profile)) for profile in env.profiles]


def _missing_output(check: str, output: str, env: EnvironmentConfig, account: str) -> Finding:
    return Finding(check, WARN, f"the stack has no {output} output", f"deploy adds it: {deploy_command(env, account)}")


def image_finding(env: EnvironmentConfig, account: str, stack: DeployedStack, caller: Caller) -> Finding:
    """The stack's training image is still in its ECR repository."""
    check = "training image"
    uri = stack.outputs.get("ImageUri")
    if not uri:
        return _missing_output(check, "ImageUri", env, account)
    image = ECR_IMAGE.fullmatch(uri)
    if image is None:
        return Finding(check, WARN, f"{uri} is not an ECR image URI", "check the ImageUri output of the stack")
    try:
        details = caller.call(
            "ecr",
            "describe_images",
            registryId=image["registry"],
            repositoryName=image["repository"],
            imageIds=[{"imageTag": image["tag"]} if image["tag"] else {"imageDigest": image["digest"]}],
        ).get("imageDetails", [])
    except ServiceError as error:
        if error.code == "ImageNotFoundException":
            return Finding(
                check, FAIL, f"{uri} is not in ECR (a lifecycle rule or a delete removed it)",
                f"deploy pushes it again: {deploy_command(env, account)}",
            )  # fmt: skip
        if error.code == "RepositoryNotFoundException":
            return Finding(
                check, FAIL, f"repository {image['repository']} does not exist",
                f"bootstrap again (docs/deploy.md), then deploy: {deploy_command(env, account)}",
            )  # fmt: skip
        raise
    detail = details[0] if details else {}
    size = float(detail.get("imageSizeInBytes", 0)) / BYTES_PER_GB
    reference = f":{image['tag'][:12]}" if image["tag"] else f"@{image['digest'][:19]}"
    found = f"{image['repository']}{reference} present, pushed {detail.get('imagePushedAt', '?')}, {size:.1f} GB"
    return Finding(check, PASS, found, "", {"image_uri": uri})


def topic_finding(env: EnvironmentConfig, account: str, stack: DeployedStack, caller: Caller) -> Finding:
    """The failure topic has a confirmed subscription: someone is told when training fails."""
    check = "failure topic"
    arn = stack.outputs.get("FailureTopicArn")
    if not arn:
        return _missing_output(check, "FailureTopicArn", env, account)
    try:
        subscriptions = list(caller.items("sns", "list_subscriptions_by_topic", "Subscriptions", TopicArn=arn))
    except ServiceError as error:
        if error.code != "NotFound":
            raise
        return Finding(check, FAIL, f"{arn} does not exist", f"deploy creates it: {deploy_command(env, account)}")
    confirmed = [s for s in subscriptions if s.get("SubscriptionArn") not in UNCONFIRMED]
    pending = [s for s in subscriptions if s.get("SubscriptionArn") == "PendingConfirmation"]
    data = {"topic_arn": arn, "confirmed": len(confirmed), "pending": len(pending)}
    if confirmed:
        protocols = ", ".join(sorted({str(s.get("Protocol", "?")) for s in confirmed}))
        return Finding(check, PASS, f"{len(confirmed)} confirmed subscription(s) ({protocols})", "", data)
    if pending:
        return Finding(
            check, WARN, f"no confirmed subscription; {len(pending)} pending confirmation",
            "each address confirms from the e-mail AWS sent it; nobody hears of failed training until then",
            data,
        )  # fmt: skip
    return Finding(
        check, WARN, "no subscription: nobody hears of failed training",
        f"set notification_emails in environments.py and deploy, or aws sns subscribe --topic-arn {arn} "
        "--protocol email --notification-endpoint ADDRESS",
        data,
    )  # fmt: skip
