"""cdk.json sets every feature flag the pinned aws-cdk-lib recommends (as `cdk init` would)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import aws_cdk

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Flags deliberately set against the recommendation; docs/cdk-feature-flags.md says why.
LEFT_OFF = {"@aws-cdk/aws-ec2:restrictDefaultSecurityGroup": False}


def recommended_flags() -> dict[str, Any]:
    """``recommended-feature-flags.json`` of the aws-cdk-lib the Python package bundles."""
    (tarball,) = (Path(aws_cdk.__file__).parent / "_jsii").glob("aws-cdk-lib@*.jsii.tgz")
    with tarfile.open(tarball) as archive:
        member = archive.extractfile("package/recommended-feature-flags.json")
        assert member is not None
        flags: dict[str, Any] = json.load(member)
    return flags


def test_every_recommended_flag_is_set_and_the_exceptions_are_documented() -> None:
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    expected = recommended_flags() | LEFT_OFF
    assert {key: context.get(key) for key in expected} == expected
    doc = (REPO_ROOT / "docs" / "cdk-feature-flags.md").read_text()
    assert all(f"`{flag}`" in doc for flag in LEFT_OFF)
