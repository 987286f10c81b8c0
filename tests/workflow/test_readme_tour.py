"""The README's five-minute tour, followed as written on the shipped example.

Six steps (plan, dry run, deploy, rehearse, run, report), one command each, and each command
works: the plan prints; the dry run's arguments select plans that ``tests/trainer/test_dryrun.py``
dry-runs at full size; the deploy names the stack the app builds for that environment; the
rehearsal and the run start a pipeline the synthesized template holds, with parameters its
definition declares; the report's arguments parse for an environment that exists. These check
the shipped ``environments.py`` and ``profiles/`` the README is written for, so they are not part
of the run on another user's config (``test_user_config_independence``).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from cfn_fakes import resolve
from stack_synth import Synth

from btk.catalog import get_environment

REPO = Path(__file__).resolve().parents[2]
STEPS = ("Plan", "Dry-run", "Deploy", "Rehearse", "Run", "Report")


def tour() -> list[tuple[str, list[str]]]:
    """(step name, argv) of each numbered step of the README's tour, in order."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Five-minute tour")
    section = readme[start : readme.index("\n## ", start + 1)]
    steps = re.split(r"\n\*\*\d\. ", section)[1:]
    found = []
    for step in steps:
        blocks = re.findall(r"```console\n(.*?)```", step, flags=re.S)
        assert len(blocks) == 1, f"a tour step has {len(blocks)} commands, not one: {step[:60]!r}"
        lines = [line for line in blocks[0].replace("\\\n", " ").splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("$ "), f"one command per step: {blocks[0]!r}"
        found.append((step.split()[0].rstrip("*"), shlex.split(lines[0][2:])))
    return found


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _pipeline_parameters(argv: list[str]) -> dict[str, str]:
    if "--pipeline-parameters" not in argv:
        return {}
    parameters = {}
    for pair in argv[argv.index("--pipeline-parameters") + 1 :]:
        match = re.fullmatch(r"Name=(\w+),Value=(\S+)", pair)
        assert match is not None, f"not a Name=...,Value=... pair: {pair!r}"
        parameters[match[1]] = match[2]
    return parameters


def _definition(synths: dict[str, Synth], pipeline_name: str) -> dict[str, Any]:
    """The pipeline's definition as its environment's template holds it (intrinsics replaced by fake values)."""
    for synth in synths.values():
        for resource in synth.resources("AWS::SageMaker::Pipeline").values():
            if resource["Properties"]["PipelineName"] == pipeline_name:
                body = resource["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"]
                return dict(json.loads(resolve(synth.template, body)))
    raise AssertionError(f"no environment's template holds {pipeline_name}")


def test_the_tour_has_six_steps_of_one_command_each() -> None:
    assert [name for name, _ in tour()] == list(STEPS)


def test_step_1_plans(capsys: pytest.CaptureFixture[str]) -> None:
    from btk.cli import main

    (_, argv), *_ = tour()
    assert argv[0] == ".venv/bin/btk"
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out.startswith(argv[2])


def test_step_2_dry_runs_plans_the_full_size_tests_dry_run() -> None:
    from btk_trainer import dryrun

    argv = tour()[1][1]
    assert argv[:4] == ["PYTHONPATH=containers:.", ".venv/bin/python", "-m", "btk_trainer.dryrun"]
    cases = dryrun.cases_from_args(dryrun.parse_args(argv[4:]))
    shipped = {(case.name, case.instance.name, case.nodes, case.knobs) for case in dryrun.shipped_cases()}
    assert cases and {(case.name, case.instance.name, case.nodes, case.knobs) for case in cases} <= shipped


def test_step_3_deploys_the_stack_the_app_builds(synths: dict[str, Synth]) -> None:
    argv = tour()[2][1]
    assert argv[:3] == ["npx", "cdk", "deploy"] and argv[3] == "TrainingStack"
    env = dict(pair.split("=", 1) for pair in argv[4:][1::2])["env"]
    assert synths[env].stack.node.id == argv[3]


def test_step_4_rehearses_a_pipeline_of_the_template_with_its_parameters(synths: dict[str, Synth]) -> None:
    """``btk rehearse`` starts the profile's pipeline (one the template holds) with parameters it declares."""
    from btk.cli import build_parser
    from btk.rehearse import rehearsal_run

    argv = tour()[3][1]
    assert argv[0] == ".venv/bin/btk"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "rehearse"
    run = rehearsal_run(get_environment(args.env), args.profile)
    declared = {parameter["Name"] for parameter in _definition(synths, run.pipeline)["Parameters"]}
    assert {item["Name"] for item in run.parameters} <= declared, (declared, run.parameters)


def test_step_5_starts_a_pipeline_of_the_template_with_its_parameters(synths: dict[str, Synth]) -> None:
    argv = tour()[4][1]
    assert argv[:3] == ["aws", "sagemaker", "start-pipeline-execution"]
    declared = {parameter["Name"] for parameter in _definition(synths, _option(argv, "--pipeline-name"))["Parameters"]}
    assert set(_pipeline_parameters(argv)) <= declared, (declared, argv)


def test_step_6_reports_on_an_environment_that_exists() -> None:
    from btk.cli import build_parser

    argv = tour()[5][1]
    args = build_parser().parse_args(argv[1:])
    assert args.command == "report" and get_environment(args.env).name == args.env
