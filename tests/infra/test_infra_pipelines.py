"""The pipelines of the real TrainingStack, for every environment (not a test stack).

* Both training steps of every pipeline (``Train`` on-demand/spot, ``TrainOnPlan``) give
  ``CreateTrainingJob`` arguments that botocore's ``sagemaker`` model accepts, with the
  pipeline parameters substituted and the stack's resources resolved to fake values.
* In ``capacity.mode = existing`` the training-plan construct's verified ``PlanArn`` is the
  pipelines' ``TrainingPlanArn`` default (the stack's wiring, not only the construct's).
* The image asset stages the repository root filtered to ``btk/``, ``profiles/`` and
  ``containers/``: nothing else reaches the build context or the asset hash.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters
from cfn_fakes import ACCOUNT, resolve
from infra_fixtures import REPO, Synth

import environments
from btk.environment import EnvironmentConfig
from training_constructs.pipeline_definition import (
    PARAM_TRAINING_PLAN_ARN,
    STEP_CHECK_PLAN,
    STEP_TRAIN,
    STEP_TRAIN_ON_PLAN,
)
from training_constructs.training_image import DEFAULT_DOCKERFILE, EXCLUDE

PLAN_ARN = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/btk-existing-plan"
#: Fakes beyond the shared ones: the verified plan ARN of an ``existing`` capacity.
EXTRA_FAKES = {("Custom::TrainingPlan", "PlanArn"): PLAN_ARN}


def _resolve(template: dict[str, Any], node: Any) -> Any:
    """Resolve ``Ref``, ``Fn::GetAtt``, ``Fn::Join`` and ``Fn::Sub`` (image URI) with fakes."""
    return resolve(template, node, EXTRA_FAKES)


def _definitions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        resource["Properties"]["PipelineName"]: json.loads(
            _resolve(template, resource["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"])
        )
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::SageMaker::Pipeline"
    }


def _training_steps(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (check,) = [step for step in definition["Steps"] if step["Name"] == STEP_CHECK_PLAN]
    branches = check["Arguments"]["IfSteps"] + check["Arguments"]["ElseSteps"]
    return {step["Name"]: step for step in branches if step["Type"] == "Training"}


def _substitute(node: Any, parameters: dict[str, Any]) -> Any:
    """Replace pipeline parameters, the execution id and ``Std:Join`` with sample values."""
    if isinstance(node, list):
        return [_substitute(item, parameters) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Get"}:
        reference = node["Get"]
        if reference.startswith("Parameters."):
            return parameters[reference.removeprefix("Parameters.")]
        assert reference == "Execution.PipelineExecutionId", reference
        return "abc123execution"
    if set(node) == {"Std:Join"}:
        join = node["Std:Join"]
        return join["On"].join(str(_substitute(value, parameters)) for value in join["Values"])
    return {key: _substitute(value, parameters) for key, value in node.items()}


def _validate_both_training_steps(template: dict[str, Any], env: EnvironmentConfig) -> int:
    """Validate ``Train`` with ``TrainingPlanArn=""`` and ``TrainOnPlan`` with a plan; the count."""
    shape = botocore.session.get_session().get_service_model("sagemaker").operation_model(
        "CreateTrainingJob").input_shape
    definitions = _definitions(template)
    assert len(definitions) == len(env.profiles)
    validated = 0
    for definition in definitions.values():
        steps = _training_steps(definition)
        assert set(steps) == {STEP_TRAIN, STEP_TRAIN_ON_PLAN}
        defaults = {p["Name"]: p.get("DefaultValue") for p in definition["Parameters"]}
        for step_name, plan_arn in ((STEP_TRAIN, ""), (STEP_TRAIN_ON_PLAN, PLAN_ARN)):
            arguments = _substitute(steps[step_name]["Arguments"], {**defaults, PARAM_TRAINING_PLAN_ARN: plan_arn})
            validate_parameters(arguments, shape)  # ParamValidationError names the field
            assert ("TrainingPlanArn" in arguments["ResourceConfig"]) == (step_name == STEP_TRAIN_ON_PLAN)
            validated += 1
    return validated


def test_every_environment_both_training_steps_validate_against_botocore(synth: Synth) -> None:
    env = next(e for e in environments.ENVIRONMENTS if e.name == synth.env_name)
    assert _validate_both_training_steps(synth.template, env) == 2 * len(env.profiles)


def test_validation_rejects_a_broken_real_argument(synths: dict[str, Synth]) -> None:
    """The control: the same resolution and validation catch a wrong type in the real stack."""
    template = synths["prod"].template
    definition = next(iter(_definitions(template).values()))
    step = _training_steps(definition)[STEP_TRAIN]
    defaults = {p["Name"]: p.get("DefaultValue") for p in definition["Parameters"]}
    arguments = _substitute(step["Arguments"], defaults)
    arguments["StoppingCondition"]["MaxRuntimeInSeconds"] = "72h"
    shape = botocore.session.get_session().get_service_model("sagemaker").operation_model(
        "CreateTrainingJob").input_shape
    with pytest.raises(Exception, match="MaxRuntimeInSeconds"):
        validate_parameters(arguments, shape)


# -- existing training plan: the stack wires the verified plan into every pipeline -------------


@pytest.fixture(scope="module")
def existing_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[EnvironmentConfig, Any, dict[str, Any]]:
    from aws_cdk import App

    from stacks.training_stack import TrainingStack
    from training_constructs.nag import apply_nag

    env = EnvironmentConfig.model_validate(
        {**environments.STAGING.model_dump(), "capacity": {"mode": "existing", "plan_arn": PLAN_ARN}}
    )
    app = App(outdir=str(tmp_path_factory.mktemp("cdk-existing")), analytics_reporting=False)
    stack = TrainingStack(app, "TrainingStack", env_config=env)
    apply_nag(app)  # an unacknowledged finding fails this synth too
    app.synth()
    template = json.loads((Path(app.outdir) / f"{stack.artifact_id}.template.json").read_text())
    return env, stack, template


def test_existing_plan_is_every_pipelines_training_plan_default(
    existing_plan: tuple[EnvironmentConfig, Any, dict[str, Any]],
) -> None:
    env, stack, template = existing_plan
    custom = stack.training_plan.custom_resource
    assert custom is not None
    plan_att = {"Fn::GetAtt": [stack.get_logical_id(custom.node.default_child), "PlanArn"]}
    (custom_resource,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::TrainingPlan"]
    assert custom_resource["Properties"]["PlanArn"] == PLAN_ARN
    pipelines = [r for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Pipeline"]
    assert len(pipelines) == len(env.profiles)
    for pipeline in pipelines:
        body = pipeline["Properties"]["PipelineDefinition"]["PipelineDefinitionBody"]
        # The default is the custom resource's verified ARN (deploy fails first if the plan does not fit).
        assert plan_att in body["Fn::Join"][1]
    for definition in _definitions(template).values():
        parameters = {p["Name"]: p for p in definition["Parameters"]}
        assert parameters[PARAM_TRAINING_PLAN_ARN]["DefaultValue"] == PLAN_ARN
    assert template["Outputs"]["TrainingPlanArn"]["Value"] == plan_att
    assert _validate_both_training_steps(template, env) == 2 * len(env.profiles)


def test_on_demand_environments_default_to_no_plan(synth: Synth) -> None:
    for definition in _definitions(synth.template).values():
        parameters = {p["Name"]: p for p in definition["Parameters"]}
        assert parameters[PARAM_TRAINING_PLAN_ARN]["DefaultValue"] == ""
    assert "TrainingPlanArn" not in synth.template["Outputs"]


# -- the image asset's build context --------------------------------------------------------

BUILD_INPUTS = ("btk", "profiles", "containers")


def _staged_files(synth: Synth) -> set[str]:
    assets = json.loads((synth.outdir / f"{synth.stack.artifact_id}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    staged = synth.outdir / image["source"]["directory"]
    assert image["source"]["dockerFile"] == DEFAULT_DOCKERFILE
    return {path.relative_to(staged).as_posix() for path in staged.rglob("*") if path.is_file()}


def test_image_asset_stages_only_btk_profiles_and_containers(synth: Synth) -> None:
    files = _staged_files(synth)
    assert DEFAULT_DOCKERFILE in files
    assert {name.split("/", 1)[0] for name in files} == set(BUILD_INPUTS)
    for name in files:
        parts = name.split("/")
        assert "__pycache__" not in parts and not name.endswith(".pyc"), name
        assert not any(part.endswith("_cache") for part in parts), name
        assert not name.startswith("containers/bench/"), name
    assert "btk/knobs.py" in files and "btk/metrics.py" in files  # the core the trainer imports


def test_image_asset_holds_every_tracked_build_input(synth: Synth) -> None:
    """Every committed file of the build inputs is in the context, but for the paths EXCLUDE names."""
    listing = subprocess.run(["git", "ls-files", "--", *BUILD_INPUTS], cwd=REPO, capture_output=True, text=True,
                             check=False)
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    named = [rule for rule in EXCLUDE if not rule.startswith("!") and "*" not in rule]
    assert "containers/bench" in named
    tracked = {name for name in listing.stdout.splitlines()
               if not any(name == rule or name.startswith(f"{rule}/") for rule in named) and (REPO / name).is_file()}
    assert tracked
    missing = sorted(tracked - _staged_files(synth))
    assert not missing, missing[:10]
