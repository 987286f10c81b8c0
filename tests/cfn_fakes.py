"""Resolve a synthesized CloudFormation template's intrinsic functions with fake values.

Shared by the pipeline and infrastructure tests: ``Ref``, ``Fn::GetAtt``, ``Fn::Join`` and
``Fn::Sub`` (pseudo parameters and resource references) become fixed, well-formed values, so
pipeline definitions can be parsed and their API arguments validated against botocore.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
FAKE_FILE_SYSTEM_ID = "fs-0123456789abcdef0"
FAKE_MOUNT_NAME = "abcd1234"
FAKE_SUBNET = "subnet-0a1b2c3d4e5f60718"
FAKE_GROUP = "sg-0a1b2c3d4e5f60718"
FAKE_KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
#: The first group of the fake stack id's UUID (``training_constructs.removal.stack_generation``).
FAKE_STACK_GENERATION = "1a2b3c4d"
FAKE_STACK_ID = (
    f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/TrainingStack/{FAKE_STACK_GENERATION}-0000-4000-8000-0123456789ab"
)
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackId": FAKE_STACK_ID}

#: Fake values by (resource type, attribute); ``None`` is ``Ref``. Attribute-specific first.
FAKES: dict[tuple[str, str | None], str] = {
    ("AWS::EC2::Subnet", None): FAKE_SUBNET,
    ("AWS::EC2::SecurityGroup", "GroupId"): FAKE_GROUP,
    ("AWS::KMS::Key", "Arn"): FAKE_KEY_ARN,
    ("AWS::FSx::FileSystem", None): FAKE_FILE_SYSTEM_ID,
    ("AWS::FSx::FileSystem", "LustreMountName"): FAKE_MOUNT_NAME,
}


def fake_value(
    template: dict[str, Any], logical_id: str, attribute: str | None, extra: Mapping[tuple[str, str | None], str] = {}
) -> str:
    """A fixed, well-formed value for ``Ref``/``Fn::GetAtt`` of ``logical_id``."""
    if logical_id in PSEUDO:
        return PSEUDO[logical_id]
    kind = template["Resources"][logical_id]["Type"]
    for fakes in (extra, FAKES):
        if (kind, attribute) in fakes:
            return fakes[(kind, attribute)]
    if kind == "AWS::Logs::LogGroup":  # as CloudFormation: Ref is the name, Arn ends in ":*"
        properties = template["Resources"][logical_id].get("Properties", {})
        name = resolve(template, properties.get("LogGroupName", logical_id))
        assert isinstance(name, str), name
        return name if attribute is None else f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*"
    by_type = {
        "AWS::EC2::Subnet": FAKE_SUBNET,
        "AWS::EC2::SecurityGroup": FAKE_GROUP,
        "AWS::KMS::Key": FAKE_KEY_ARN,
        "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{logical_id}",
        "AWS::S3::Bucket": f"{logical_id.lower()[:40]}-bucket",
        "AWS::SNS::Topic": f"arn:aws:sns:{REGION}:{ACCOUNT}:{logical_id}",
        "AWS::Events::Rule": f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{logical_id}",
    }
    if kind in by_type:
        return by_type[kind]
    raise AssertionError(f"no fake value for {kind} {logical_id}.{attribute}")


def resolve(
    template: dict[str, Any],
    node: Any,
    extra: Mapping[tuple[str, str | None], str] = {},
    allow_sub: bool = True,
) -> Any:
    """``node`` with every intrinsic function replaced by fake values (recursively)."""
    if isinstance(node, list):
        return [resolve(template, item, extra, allow_sub) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Ref"}:
        return fake_value(template, node["Ref"], None, extra)
    if set(node) == {"Fn::GetAtt"}:
        logical_id, attribute = node["Fn::GetAtt"]
        return fake_value(template, logical_id, attribute, extra)
    if set(node) == {"Fn::Join"}:
        separator, parts = node["Fn::Join"]
        return separator.join(str(resolve(template, part, extra, allow_sub)) for part in parts)
    if set(node) == {"Fn::Split"}:
        separator, value = node["Fn::Split"]
        return str(resolve(template, value, extra, allow_sub)).split(separator)
    if set(node) == {"Fn::Select"}:
        index, values = node["Fn::Select"]
        return resolve(template, values, extra, allow_sub)[int(index)]
    if set(node) == {"Fn::Sub"}:
        assert allow_sub, "expected Fn::Join here, not Fn::Sub"
        assert isinstance(node["Fn::Sub"], str), node
        return re.sub(r"\$\{([^}]+)\}", lambda m: fake_value(template, m.group(1), None, extra), node["Fn::Sub"])
    return {key: resolve(template, value, extra, allow_sub) for key, value in node.items()}


def in_fake_region(env: Any) -> Any:
    """``env`` (an EnvironmentConfig) moved to the fakes' region, same zone letter.

    The ARNs these fakes and the permission tests build are in :data:`REGION`; a template
    synthesized for another region writes that region literally. What a role may do does not
    depend on the region, so permission tests check a user's environment in this region (all
    of them in one region is also the strictest case for isolation).
    """
    if env.region == REGION:
        return env
    zone = REGION + env.availability_zone[len(env.region):]
    return env.model_copy(update={"region": REGION, "availability_zone": zone})
