"""cdk-nag 3 wiring: the AwsSolutions pack on every synth, and acknowledgements with reasons.

cdk-nag 3 reports through CDK's policy-validation API: any finding not acknowledged with
``Validations.of(construct).acknowledge(...)`` interrupts synthesis. Each acknowledgement
here must carry a concrete reason (which API, which constraint), never a generic one.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
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
