"""Every role's calls against AWS's Service Authorization Reference (tests/permission_reference.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import cfn_fakes
import pytest
from iam_evaluation import Principal, glob_overlaps
from permission_reference import (
    Call,
    Caller,
    boundary_statements,
    cli_callers,
    coverage,
    execution_callers,
    missing,
    pipeline_callers,
    plan_handler_callers,
    pointless,
    privilege,
    requests,
    sagemaker_arn,
)
from reserve_variant import reserve_environment, synthesize_boundary, synthesize_environment
from stack_synth import Synth

import environments
from btk import capacity

RESERVE_START = datetime(2027, 1, 4, tzinfo=UTC)


@pytest.fixture(scope="module")
def reserve() -> tuple[Any, dict[str, Any]]:
    """The last catalog environment buying a plan at deploy, synthesized with cdk-nag."""
    env = reserve_environment(cfn_fakes.in_fake_region(environments.ENVIRONMENTS[-1]), RESERVE_START)
    return env, synthesize_environment(env)


def plan_arn(env: Any) -> str | None:
    if env.capacity.mode == "reserve":
        return sagemaker_arn("training-plan", capacity.reservation_request(env).plan_name())
    return str(env.capacity.plan_arn) if env.capacity.mode == "existing" else None


def callers_of(env: Any, template: dict[str, Any]) -> list[Caller]:
    """The environment's roles, each capped by its bootstrap's permissions boundary."""
    neighbours = [cfn_fakes.in_fake_region(other) for other in environments.ENVIRONMENTS]
    boundary = boundary_statements(synthesize_boundary(env, neighbours))
    return [*plan_handler_callers(template, env, boundary), *pipeline_callers(template, env, plan_arn(env), boundary),
            *execution_callers(template, env, boundary)]


def test_every_environments_roles_allow_their_calls_and_nothing_pointless(synth: Synth) -> None:
    env, template = synth.stack.env_config, synth.template
    if env.region != cfn_fakes.REGION:  # the calls' ARNs are built in the fakes' region (cfn_fakes.in_fake_region)
        env = cfn_fakes.in_fake_region(env)
        template = synthesize_environment(env)
    callers = callers_of(env, template)
    assert callers
    problems = [problem for caller in callers for problem in missing(caller) + pointless(caller)]
    assert problems == [], "\n".join(problems)


def test_a_reserving_environments_roles_allow_buying_and_using_its_plan(reserve: tuple[Any, dict[str, Any]]) -> None:
    env, template = reserve
    callers = callers_of(env, template)
    names = [caller.name for caller in callers]
    assert names == [
        "training-plan onEvent (reserve)", "training-plan isComplete", "pipeline role (SageMaker Pipelines)",
        "execution role (SageMaker, for the job)",
    ]
    problems = [problem for caller in callers for problem in missing(caller) + pointless(caller)]
    assert problems == [], "\n".join(problems)
    on_event = callers[0]
    # The operations come from the handler's code, the dependents from AWS's reference.
    assert {call.action for call in on_event.calls} == {
        "sagemaker:SearchTrainingPlanOfferings",
        "sagemaker:ListTrainingPlans",
        "sagemaker:DescribeTrainingPlan",
        "sagemaker:CreateTrainingPlan",
    }
    buy = next(call for call in on_event.calls if call.action == "sagemaker:CreateTrainingPlan")
    assert {r.action for r in requests(buy)} == {
        "sagemaker:CreateTrainingPlan",
        "sagemaker:CreateReservedCapacity",
        "sagemaker:AddTags",
    }
    print(coverage(callers))


def test_the_documented_cli_policies_cover_btk_report_and_btk_capacity() -> None:
    callers = cli_callers()
    report, capacity_cli = callers
    assert {call.action for call in report.calls} == {
        "sagemaker:ListPipelineExecutions",
        "sagemaker:ListPipelineExecutionSteps",
        "sagemaker:Search",
        "sagemaker:DescribeTrainingJob",
        "sagemaker:DescribeTrainingPlan",
    }
    assert {call.action for call in capacity_cli.calls} == {
        "sagemaker:SearchTrainingPlanOfferings",
        "sagemaker:DescribeTrainingPlan",
        "sagemaker:ListTrainingPlans",
    }
    problems = [problem for caller in callers for problem in missing(caller) + pointless(caller)]
    assert problems == [], "\n".join(problems)


# -- the check can fail ------------------------------------------------------------------------

PLAN = sagemaker_arn("training-plan", "btk-prod-0123abcd")
CAPACITY_ARN = sagemaker_arn("reserved-capacity", "rc-1")
BUY = Call(
    "sagemaker:CreateTrainingPlan",
    {"training-plan": PLAN, "reserved-capacity": CAPACITY_ARN},
    creates=frozenset({"training-plan", "reserved-capacity"}),
    source="test",
)


def allow(actions: list[str], resources: list[str]) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": actions, "Resource": resources}


def test_a_purchase_role_with_create_training_plan_alone_is_flagged() -> None:
    """What the reservation role granted before: the dependent actions AWS lists are missing."""
    role = Principal([allow(["sagemaker:CreateTrainingPlan"], [PLAN])], name="old")
    problems = missing(Caller("old", role, [BUY]))
    assert len(problems) == 3
    assert any("sagemaker:CreateReservedCapacity on " + CAPACITY_ARN in p for p in problems)
    assert any("sagemaker:AddTags on " + PLAN in p for p in problems)
    assert any("sagemaker:AddTags on " + CAPACITY_ARN in p for p in problems)


def test_an_action_on_a_resource_type_it_does_not_take_is_flagged() -> None:
    role = Principal([allow(["sagemaker:CreateTrainingPlan"], [sagemaker_arn("reserved-capacity", "*")])], name="r")
    assert pointless(Caller("r", role, [])) == [
        f"r: sagemaker:CreateTrainingPlan takes no resource like {sagemaker_arn('reserved-capacity', '*')}"
    ]
    assert pointless(Caller("r", Principal([allow(["sagemaker:*"], ["*"])]), [])) == [
        "r: sagemaker:* is a wildcard action"
    ]


def test_the_reference_is_aws_s_for_the_training_plan_actions() -> None:
    """Spot checks against the Service Authorization Reference page for SageMaker
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonsagemaker.html)."""
    create = privilege("sagemaker:CreateTrainingPlan")["resource_types"]
    dependents = set(create["training-plan"]["dependent_actions"])
    assert dependents == {"sagemaker:AddTags", "sagemaker:CreateReservedCapacity"}
    assert set(privilege("sagemaker:CreateTrainingJob")["resource_types"]) >= {"training-plan", "reserved-capacity"}
    assert set(privilege("sagemaker:SearchTrainingPlanOfferings")["resource_types"]) == {""}


@pytest.mark.parametrize(
    ("pattern", "arn_format", "overlaps"),
    [
        ("arn:aws:logs:us-east-1:1:log-group:g:*", "arn:${P}:logs:${R}:${A}:log-group:${G}:log-stream:${S}", True),
        ("arn:aws:sagemaker:r:1:reserved-capacity/*", "arn:${P}:sagemaker:${R}:${A}:training-plan/${N}", False),
        ("arn:aws:sagemaker:r:1:training-plan/btk-????????", "arn:${P}:sagemaker:${R}:${A}:training-plan/${N}", True),
        ("arn:aws:s3:::bucket", "arn:${P}:s3:::${B}/${K}", False),
    ],
)
def test_resource_patterns_overlap_only_their_types(pattern: str, arn_format: str, overlaps: bool) -> None:
    assert glob_overlaps(pattern, arn_format) is overlaps
