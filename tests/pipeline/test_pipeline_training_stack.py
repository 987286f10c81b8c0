"""The pipelines of the real TrainingStack, for every environment (not a test stack).

* Both training steps of every pipeline (``Train`` on-demand/spot, ``TrainOnPlan``) give
  ``CreateTrainingJob`` arguments that botocore's ``sagemaker`` model accepts, with the
  pipeline parameters substituted and the stack's resources resolved to fake values.
* In ``capacity.mode = existing`` the training-plan construct's verified ``PlanArn`` is the
  pipelines' ``TrainingPlanArn`` default (the stack's wiring, not only the construct's).

The first checks run on the user's environments (each one synthesized as ``app.py`` does);
the existing-plan wiring is machinery, checked on a fixture environment and fixture profiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import botocore.session
import fixture_catalog as fc
import pipeline_fixtures as fx
import pytest
from botocore.validate import validate_parameters
from cfn_fakes import ACCOUNT, resolve
from stack_synth import ENV_NAMES, Synth, cli_app

from btk.catalog import get_environment
from btk.environment import EnvironmentConfig
from training_constructs.pipeline_definition import (
    ON_PLAN_SUFFIX,
    PARAM_TRAINING_PLAN_ARN,
    STEP_CHECK_PLAN,
    STEP_REHEARSE,
    STEP_TRAIN,
    STEP_TRAIN_ON_PLAN,
)

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
    """The training steps under ``CheckTrainingPlan``, however deep (a rehearsal's gate holds the long run)."""
    (check,) = [step for step in definition["Steps"] if step["Name"] == STEP_CHECK_PLAN]
    found: dict[str, dict[str, Any]] = {}
    pending = check["Arguments"]["IfSteps"] + check["Arguments"]["ElseSteps"]
    while pending:
        step = pending.pop()
        if step["Type"] == "Training":
            found[step["Name"]] = step
        pending += step.get("Arguments", {}).get("IfSteps", []) + step.get("Arguments", {}).get("ElseSteps", [])
    return found


def _validate_both_training_steps(template: dict[str, Any], env: EnvironmentConfig) -> int:
    """Validate ``Train`` with ``TrainingPlanArn=""`` and ``TrainOnPlan`` with a plan; the count."""
    shape = botocore.session.get_session().get_service_model("sagemaker").operation_model(
        "CreateTrainingJob").input_shape
    definitions = _definitions(template)
    assert len(definitions) == len(env.profiles)
    validated = 0
    for definition in definitions.values():
        steps = _training_steps(definition)
        rehearsals = {STEP_REHEARSE, STEP_REHEARSE + ON_PLAN_SUFFIX} if env.rehearses else set()
        assert set(steps) == {STEP_TRAIN, STEP_TRAIN_ON_PLAN} | rehearsals
        defaults = {p["Name"]: p.get("DefaultValue") for p in definition["Parameters"]}
        for step_name in sorted(steps):
            plan_arn = PLAN_ARN if step_name.endswith(ON_PLAN_SUFFIX) else ""
            arguments = fx.substitute(steps[step_name]["Arguments"], {**defaults, PARAM_TRAINING_PLAN_ARN: plan_arn})
            validate_parameters(arguments, shape)  # ParamValidationError names the field
            assert ("TrainingPlanArn" in arguments["ResourceConfig"]) == step_name.endswith(ON_PLAN_SUFFIX)
            validated += 1
    return validated


def test_every_environment_both_training_steps_validate_against_botocore(synth: Synth) -> None:
    env = get_environment(synth.env_name)
    assert _validate_both_training_steps(synth.template, env) == (4 if env.rehearses else 2) * len(env.profiles)


def test_validation_rejects_a_broken_real_argument(synths: dict[str, Synth]) -> None:
    """The control: the same resolution and validation catch a wrong type in the real stack."""
    template = synths[ENV_NAMES[-1]].template
    definition = next(iter(_definitions(template).values()))
    step = _training_steps(definition)[STEP_TRAIN]
    defaults = {p["Name"]: p.get("DefaultValue") for p in definition["Parameters"]}
    arguments = fx.substitute(step["Arguments"], defaults)
    arguments["StoppingCondition"]["MaxRuntimeInSeconds"] = "72h"
    shape = botocore.session.get_session().get_service_model("sagemaker").operation_model(
        "CreateTrainingJob").input_shape
    with pytest.raises(Exception, match="MaxRuntimeInSeconds"):
        validate_parameters(arguments, shape)


# -- existing training plan: the stack wires the verified plan into every pipeline -------------


@pytest.fixture(scope="module")
def existing_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[EnvironmentConfig, Any, dict[str, Any]]:

    from stacks.training_stack import TrainingStack
    from training_constructs.nag import apply_nag

    env = EnvironmentConfig.model_validate(
        {**fc.STAGING.model_dump(), "capacity": {"mode": "existing", "plan_arn": PLAN_ARN}}
    )
    app = cli_app(outdir=str(tmp_path_factory.mktemp("cdk-existing")), analytics_reporting=False)
    with fc.installed():  # the stack looks its profiles up in btk.catalog
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
    assert _validate_both_training_steps(template, env) == (4 if env.rehearses else 2) * len(env.profiles)


def test_on_demand_environments_default_to_no_plan(synth: Synth) -> None:
    """An on-demand environment's pipelines default to no plan; one with a plan (existing or reserved)
    defaults to it and outputs it."""
    planned = get_environment(synth.env_name).capacity.mode != "on_demand"
    for definition in _definitions(synth.template).values():
        parameters = {p["Name"]: p for p in definition["Parameters"]}
        assert (parameters[PARAM_TRAINING_PLAN_ARN]["DefaultValue"] != "") == planned
    assert ("TrainingPlanArn" in synth.template["Outputs"]) == planned


def test_a_plan_environment_rehearses_each_profile_against_the_planners_figure_for_the_rehearsal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's threshold is the environment's share of the planner's tokens/s for the knobs on the rehearsal's
    nodes (one where they fit there); an on-demand environment has no rehearsal."""
    from datetime import UTC, datetime

    from reserve_variant import reserve_environment

    from btk.hardware import get_instance_type
    from btk.planner.search import evaluate_knobs, plan_profile
    from stacks.training_stack import planned_profiles
    from training_constructs.pipeline import _rehearsal

    env = reserve_environment(fc.STAGING, datetime(2030, 1, 1, tzinfo=UTC))
    fc.install(monkeypatch, env)  # the fixture catalog, whatever the user's profiles/ holds
    assert env.rehearses and not fc.STAGING.rehearses
    instance = get_instance_type(env.instance_type)
    for planned in planned_profiles(env):
        plan = plan_profile(planned.profile, instance, env.instance_count)
        one_node = evaluate_knobs(planned.profile, instance, 1, plan.knobs)
        nodes = 1 if one_node.fits else env.instance_count
        predicted = evaluate_knobs(planned.profile, instance, nodes, plan.knobs).estimate.tokens_per_second_per_gpu
        rehearsal = _rehearsal(env, planned, "test")
        assert rehearsal is not None and rehearsal.nodes == planned.rehearsal_nodes == nodes
        assert rehearsal.min_tokens_per_second_per_gpu == round(predicted * env.rehearsal.min_throughput_share, 1)
        assert rehearsal.steps == env.rehearsal.steps and rehearsal.max_runtime_seconds == 120 * 60
        assert _rehearsal(fc.STAGING, planned, "test") is None
