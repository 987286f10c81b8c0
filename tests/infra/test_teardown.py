"""``cdk destroy`` of an environment ends DELETE_COMPLETE and a redeploy succeeds: proven from the template.

CloudFormation deletes a stack in reverse dependency order (a resource goes only after every
resource that depends on it, through ``DependsOn``, ``Ref``, ``Fn::GetAtt`` or ``Fn::Sub``) and
skips what has ``DeletionPolicy: Retain``. So:

* a kept resource must depend only on kept resources, or what it depends on fails to delete
  while it still uses it (a file system kept inside a deleted subnet: DELETE_FAILED);
* the file system must be deleted before the security-group rules it was created under;
* what is kept and has a fixed physical name must carry the stack's generation in it, or the
  next deploy fails with "already exists";
* what is kept is exactly what docs/deploy.md ("Tear down") promises: the key, the buckets and
  the log groups.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from stack_synth import Synth

#: docs/deploy.md, "Tear down": what an environment with ``retain_data`` keeps.
KEPT_TYPES = {"AWS::KMS::Key", "AWS::S3::Bucket", "AWS::Logs::LogGroup"}
#: Properties holding a resource's physical name.
NAME_PROPERTIES = ("BucketName", "LogGroupName", "FileSystemName", "Name", "RoleName", "TopicName")


def references(node: Any) -> Iterator[str]:
    """Logical ids ``node`` refers to (``Ref``, ``Fn::GetAtt``, ``${Id}`` of ``Fn::Sub``); pseudo parameters too."""
    if isinstance(node, list):
        for item in node:
            yield from references(item)
    elif isinstance(node, dict):
        if set(node) == {"Ref"}:
            yield node["Ref"]
        elif set(node) == {"Fn::GetAtt"}:
            target = node["Fn::GetAtt"]
            yield target[0] if isinstance(target, list) else target.split(".", 1)[0]
        elif set(node) == {"Fn::Sub"}:
            text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
            yield from (name.split(".", 1)[0] for name in re.findall(r"\$\{([^}!]+)\}", text))
        else:
            for value in node.values():
                yield from references(value)


def dependency_graph(template: dict[str, Any]) -> dict[str, set[str]]:
    """Each resource's direct dependencies (resources only)."""
    resources = template["Resources"]
    graph: dict[str, set[str]] = {}
    for logical_id, resource in resources.items():
        depends = resource.get("DependsOn", [])
        found = set(depends if isinstance(depends, list) else [depends])
        found |= set(references(resource.get("Properties", {})))
        graph[logical_id] = {ref for ref in found if ref in resources}
    return graph


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    pending = list(graph[start])
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(graph[node])
    return seen


def kept(template: dict[str, Any]) -> set[str]:
    policies = ("Retain", "RetainExceptOnCreate")
    return {k for k, r in template["Resources"].items() if r.get("DeletionPolicy") in policies}


def deletion_order(graph: dict[str, set[str]], kept_ids: set[str]) -> list[str]:
    """The order CloudFormation may delete in: each resource after everything that depends on it."""
    dependents: dict[str, set[str]] = {node: set() for node in graph}
    for node, deps in graph.items():
        for dep in deps:
            dependents[dep].add(node)
    order: list[str] = []
    done: set[str] = set()
    while len(done) < len(graph):
        ready = sorted(n for n in graph if n not in done and dependents[n] <= done)
        assert ready, "dependency cycle"
        order.extend(n for n in ready if n not in kept_ids)
        done.update(ready)
    return order


def test_what_is_kept_depends_only_on_what_is_kept(synth: Synth) -> None:
    graph = dependency_graph(synth.template)
    kept_ids = kept(synth.template)
    for logical_id in sorted(kept_ids):
        deleted = closure(graph, logical_id) - kept_ids
        assert not deleted, f"{logical_id} is kept but uses {sorted(deleted)}, which would fail to delete"


def test_what_is_kept_is_what_the_docs_promise(synth: Synth) -> None:
    types = {synth.template["Resources"][k]["Type"] for k in kept(synth.template)}
    if synth.stack.env_config.retain_data:
        assert types == KEPT_TYPES
    else:
        assert types == set()


def test_kept_names_carry_the_stacks_generation(synth: Synth) -> None:
    for logical_id in kept(synth.template):
        properties = synth.template["Resources"][logical_id].get("Properties", {})
        for key in NAME_PROPERTIES:
            if key in properties:
                assert "AWS::StackId" in set(references(properties[key])), (
                    f"{logical_id}: kept with the fixed name {properties[key]!r}: a redeploy would fail"
                )


def test_the_file_system_goes_before_its_security_group_rules(synth: Synth) -> None:
    template = synth.template
    file_systems = synth.resources("AWS::FSx::FileSystem")
    if not file_systems:
        pytest.skip(f"{synth.env_name} has no file system (data_stage.mode s3)")
    graph = dependency_graph(template)
    order = deletion_order(graph, kept(template))
    for logical_id, file_system in file_systems.items():
        assert logical_id in order, "the file system is a cache of the datasets prefix: it is never kept"
        groups = set(references(file_system["Properties"]["SecurityGroupIds"]))
        rules = [k for k, r in template["Resources"].items()
                 if r["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
                 and set(references(r["Properties"]["GroupId"])) & groups]
        assert rules
        for rule in rules:
            assert rule in closure(graph, logical_id)  # created before the file system ...
            assert order.index(logical_id) < order.index(rule)  # ... and deleted after it
