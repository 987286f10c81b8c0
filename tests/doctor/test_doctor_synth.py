"""The doctor against a real synth: the bootstrap versions aws-cdk-lib states, and the pipelines' real template.

One environment of the fixture catalog is synthesized exactly as ``app.py`` does (cdk-nag and
all). What CloudFormation does to the template's tokens is done here by hand: each ``Fn::Sub``
gets the partition's URL suffix, each ``Ref`` and ``Fn::GetAtt`` a physical value, and the
joined text is what SageMaker would hold. The doctor must find no difference there, and find
one where a value that matters changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fixture_catalog
import pytest
from stack_synth import Synth, synthesize

from btk.catalog import get_environment
from btk.doctor.assembly import read_cloud_assembly
from btk.doctor.bootstrap import BootstrapNeed
from btk.doctor.definitions import definition_of, first_difference, pipeline_bodies
from btk.naming import pipeline_name

ENV = "prod"


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    with fixture_catalog.installed():
        yield synthesize(ENV, tmp_path_factory.mktemp("doctor-synth"))


def test_the_bootstrap_versions_are_those_aws_cdk_lib_writes_in_the_manifest(synth: Synth) -> None:
    assembly = read_cloud_assembly(synth.outdir, get_environment(ENV))
    assert (BootstrapNeed().deploy, BootstrapNeed().lookup_role) == (
        assembly.bootstrap.deploy,
        assembly.bootstrap.lookup_role,
    )
    assert assembly.template == synth.template
    parameter = synth.template["Parameters"]["BootstrapVersion"]["Default"]
    assert parameter == f"/cdk-bootstrap/{get_environment(ENV).bootstrap_qualifier}/version"


def physical(token: Any) -> str:
    """What CloudFormation puts where a token stands (a name or id shaped like a real one)."""
    if "Fn::Sub" in token:
        return str(token["Fn::Sub"]).replace("${AWS::URLSuffix}", "amazonaws.com")
    logical = token["Ref"] if "Ref" in token else token["Fn::GetAtt"][0]
    return f"trainingstack-{logical.lower()}-1a2b3c4d"


def deployed_text(synth: Synth, name: str) -> str:
    body = pipeline_bodies(synth.template)[name]["PipelineDefinitionBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    return "".join(part if isinstance(part, str) else physical(part) for part in parts)


def names() -> list[str]:
    return [pipeline_name(ENV, profile) for profile in fixture_catalog.ENVIRONMENTS[ENV].profiles]


@pytest.mark.parametrize("name", names())
def test_a_pipeline_as_cloudformation_deploys_it_matches_its_template(synth: Synth, name: str) -> None:
    expected = definition_of(pipeline_bodies(synth.template)[name])
    deployed = json.loads(deployed_text(synth, name))
    assert first_difference(expected, deployed) is None
    # key order and whitespace are not differences: SageMaker may store the JSON as it likes
    reordered = json.loads(json.dumps(deployed, sort_keys=True, indent=1))
    assert first_difference(expected, reordered) is None


def test_values_that_matter_are_differences_and_resolved_names_are_not(synth: Synth) -> None:
    name = names()[0]
    expected = definition_of(pipeline_bodies(synth.template)[name])
    text = deployed_text(synth, name)
    parameter = next(p for p in json.loads(text)["Parameters"] if p["Name"] == "InstanceCount")
    index = json.loads(text)["Parameters"].index(parameter)

    more_nodes = json.loads(text)
    more_nodes["Parameters"][index]["DefaultValue"] = parameter["DefaultValue"] + 1
    assert first_difference(expected, more_nodes) == (
        f"Parameters[{index}].DefaultValue: template {parameter['DefaultValue']}, "
        f"deployed {parameter['DefaultValue'] + 1}"
    )

    tag = re.search(r"container-assets-[0-9]+-[a-z0-9-]+:([0-9a-f]{64})", text)
    assert tag is not None
    other_image = json.loads(text.replace(tag[1], "0" * 64))
    difference = first_difference(expected, other_image)
    assert difference is not None and ".AlgorithmSpecification.TrainingImage: template " in difference

    renamed_bucket = json.loads(text.replace("trainingstack-datastagecheckpoints", "another-checkpoints"))
    assert renamed_bucket != json.loads(text)
    assert first_difference(expected, renamed_bucket) is None  # a Ref may resolve to any name

    extra = json.loads(text)
    extra["Steps"][0]["Arguments"]["Unexpected"] = True
    assert first_difference(expected, extra) == "Steps[0].Arguments.Unexpected: deployed, not in the template"


def test_the_cloud_assembly_is_found_by_stack_name(synth: Synth, tmp_path: Path) -> None:
    assembly = read_cloud_assembly(synth.outdir, get_environment(ENV))
    assert sorted(pipeline_bodies(assembly.template)) == sorted(names())
    assert (assembly.region, assembly.directory) == (get_environment(ENV).region, synth.outdir)
