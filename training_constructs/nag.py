"""cdk-nag 3 wiring: the AwsSolutions pack on every synth, and acknowledgements with reasons.

cdk-nag 3 reports through CDK's policy-validation API: any finding not acknowledged with
``Validations.of(construct).acknowledge(...)`` interrupts synthesis. Each acknowledgement
here must carry a concrete reason (which API, which constraint), never a generic one.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, App, CfnElement, Stack, Validations
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

#: Reasons shorter than this are rejected: an acknowledgement must explain itself.
MIN_REASON_LENGTH = 20


def apply_nag(app: App, *, verbose: bool = False) -> AwsSolutionsChecks:
    """Register the AwsSolutions pack on ``app``; unacknowledged findings fail synth."""
    checks = AwsSolutionsChecks(app, verbose=verbose)
    Validations.of(app).add_plugins(checks)
    return checks


def acknowledge(construct: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one finding (``AwsSolutions-IAM5[Resource::*]`` style) on ``construct``."""
    if len(reason.strip()) < MIN_REASON_LENGTH:
        raise ValueError(f"acknowledgement of {rule_id} needs a concrete reason, got {reason!r}")
    Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def finding_token(value: str, scope: IConstruct) -> str:
    """Render ``value`` the way cdk-nag names it in an IAM5 finding id.

    cdk-nag writes ``Fn::GetAtt`` as ``<LogicalId.Attr>`` and ``Ref`` as ``<LogicalId>``
    and keeps pseudo parameters as ``<AWS::Region>``; this resolves ``value`` in the stack
    of ``scope`` and renders it the same way, so acknowledgements need no hand-written ids.
    """
    return _render(Stack.of(scope).resolve(value))


def _render(node: object) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        if "Fn::GetAtt" in node:
            logical_id, attribute = node["Fn::GetAtt"]
            return f"<{logical_id}.{attribute}>"
        if "Ref" in node:
            return f"<{node['Ref']}>"
        if "Fn::Join" in node:
            separator, parts = node["Fn::Join"]
            return str(separator).join(_render(part) for part in parts)
    raise ValueError(f"cannot render {node!r} as a cdk-nag finding id")


def acknowledge_wildcard_resources(
    construct: IConstruct, resources: list[str], reason: str
) -> None:
    """Acknowledge ``AwsSolutions-IAM5`` for each wildcard resource ARN, with one reason."""
    for resource in resources:
        acknowledge(construct, f"AwsSolutions-IAM5[Resource::{finding_token(resource, construct)}]", reason)


def statement_resources(statement: iam.PolicyStatement) -> list[str]:
    """The resources of ``statement`` that contain a ``*`` (what IAM5 flags)."""
    return [resource for resource in statement.resources if "*" in resource]


#: checkov findings that do not apply to a custom-resource handler, with the reason.
CHECKOV_SKIPS = (
    ("CKV_AWS_115", "custom-resource handler runs once per deployment; reserving concurrency would fail in "
     "accounts with the minimum concurrency quota"),
    ("CKV_AWS_116", "invoked synchronously by CloudFormation/the Provider framework; a DLQ never receives events"),
    ("CKV_AWS_117", "calls only AWS control-plane APIs (SageMaker, CloudWatch Logs); it reaches no resource inside "
     "the VPC"),
    ("CKV_AWS_173", "environment variables hold no secret: at most the framework's function or state-machine ARN"),
)


def skip_checkov(*functions: Any) -> None:
    """Record :data:`CHECKOV_SKIPS` on each custom-resource Lambda function (a construct or its L1)."""
    for function in functions:
        resource = function.node.default_child or function
        resource.add_metadata(
            "checkov", {"skip": [{"id": rule, "comment": comment} for rule, comment in CHECKOV_SKIPS]}
        )


def depend_on_policy_only(function: Any, role: Any) -> None:
    """Keep the function's DependsOn on its role's policy, drop the one on the role.

    The role is already a dependency through ``Fn::GetAtt`` (cfn-lint W3005); the policy must
    stay, or the function could be invoked before it may call anything.
    """
    stack = Stack.of(function)
    policy = role.node.try_find_child("DefaultPolicy")
    resource = policy.node.default_child if policy is not None else None
    if isinstance(resource, CfnElement):
        function.node.default_child.add_override("DependsOn", [stack.get_logical_id(resource)])
