"""Plan lookup: describe and list plans, wait for one to be usable, and check that it fits an environment."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from btk.capacity.aws import _answer, _call, _is_not_found, _one_line
from btk.capacity.model import (
    DEAD_STATUSES,
    TARGET_RESOURCE,
    CapacityError,
    PlanNotReadyError,
    TrainingPlan,
    _any_unstated_zone,
    is_environment_plan,
    plan_name_prefix,
    utc,
)
from btk.pagination import paginate

DEFAULT_WAIT_SECONDS = 600.0

DEFAULT_POLL_SECONDS = 15.0

#: Pages of ListTrainingPlans one listing may take: 10,000 plans at ``MaxResults`` 100, far more
#: than an account holds, while a listing that never ends stops after 100 calls, well inside the
#: reservation Lambda's timeout.
LIST_PLANS_MAX_PAGES = 100


def describe_plan(client: Any, name_or_arn: str) -> TrainingPlan | None:
    """The plan named (or ARN'd) ``name_or_arn``; None when it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.describe_training_plan(TrainingPlanName=name_or_arn)
    except (ClientError, BotoCoreError) as error:
        if _is_not_found(error):
            return None
        raise _one_line(error, "describe_training_plan") from None
    return TrainingPlan.from_api(_answer(client, "describe_training_plan", response))


def list_plans(client: Any, name_prefix: str = "") -> list[TrainingPlan]:
    """Every plan of the account and region (all pages) whose name starts with ``name_prefix``.

    Bounded: a repeated page token or more than :data:`LIST_PLANS_MAX_PAGES` pages is one CapacityError.
    """
    parameters: dict[str, Any] = {"MaxResults": 100, "SortBy": "StartTime", "SortOrder": "Ascending"}
    summaries = paginate(
        lambda token: _call(client, "list_training_plans", **parameters, **({"NextToken": token} if token else {})),
        operation="sagemaker:ListTrainingPlans",
        result_key="TrainingPlanSummaries",
        max_pages=LIST_PLANS_MAX_PAGES,
        error=CapacityError,
    )
    return [TrainingPlan.from_api(item) for item in summaries if str(item["TrainingPlanName"]).startswith(name_prefix)]


def live_environment_plans(client: Any, environment: str, now: datetime) -> list[TrainingPlan]:
    """The environment's plans (by the exact name rule) that are neither dead nor ended at ``now``."""
    return [
        plan
        for plan in list_plans(client, plan_name_prefix(environment))
        if is_environment_plan(plan.name, environment)
        and plan.status not in DEAD_STATUSES
        and (plan.end_time is None or utc(plan.end_time) > utc(now))
    ]


def wait_for_plan(
    client: Any,
    name_or_arn: str,
    *,
    timeout_seconds: float = DEFAULT_WAIT_SECONDS,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> TrainingPlan:
    """Poll DescribeTrainingPlan until the plan is Scheduled or Active.

    Raises :class:`CapacityError` when it is Failed/Expired or missing, and
    :class:`PlanNotReadyError` when still pending at the deadline.
    """
    deadline = clock() + timeout_seconds
    while True:
        plan = describe_plan(client, name_or_arn)
        if plan is None:
            raise CapacityError(f"training plan {name_or_arn} does not exist")
        if usable(plan):
            return plan
        remaining = deadline - clock()
        if remaining <= 0:
            raise not_ready_error(plan.name, plan.status, timeout_seconds)
        sleep(min(poll_seconds, remaining))


def usable(plan: TrainingPlan) -> bool:
    """True once ``plan`` is Scheduled/Active, False while Pending; a CapacityError when Failed/Expired."""
    if plan.status in DEAD_STATUSES:
        reason = f": {plan.status_message}" if plan.status_message else ""
        raise CapacityError(
            f"training plan {plan.name} is {plan.status}{reason}; change the reservation window to buy a new one"
        )
    return plan.ready


def not_ready_error(name: str, status: str, waited_seconds: float) -> PlanNotReadyError:
    """The one line a deploy fails with when a bought plan is still not usable at its deadline."""
    return PlanNotReadyError(
        f"training plan {name} is still {status} after {waited_seconds:.0f}s; deploy again: "
        "it is found by name and not bought twice"
    )


def plan_problems(
    plan: TrainingPlan, *, instance_type: str, availability_zone: str, instance_count: int = 1
) -> list[str]:
    """Why ``plan`` cannot serve the environment's training jobs; empty when it can."""
    problems: list[str] = []
    if TARGET_RESOURCE not in plan.target_resources:
        problems.append(f"targets {'+'.join(plan.target_resources) or 'nothing'}, not {TARGET_RESOURCE}")
    if plan.instance_types != (instance_type,):
        problems.append(f"instance type {'+'.join(plan.instance_types) or 'none'}, not {instance_type}")
    if plan.availability_zones != (availability_zone,) or _any_unstated_zone(plan.segments):
        unstated = " (a capacity block states no AZ)" if _any_unstated_zone(plan.segments) else ""
        problems.append(f"AZ {'+'.join(plan.availability_zones) or 'none'}{unstated}, not {availability_zone}")
    if plan.total_instance_count < instance_count:
        problems.append(f"{plan.total_instance_count} instances < instance_count {instance_count}")
    if plan.status in DEAD_STATUSES:
        problems.append(f"status {plan.status}")
    return problems


def verify_existing_plan(
    client: Any,
    plan_arn: str,
    *,
    instance_type: str,
    availability_zone: str,
    instance_count: int = 1,
) -> TrainingPlan:
    """Check a plan bought elsewhere: it exists, serves training jobs, has the instance type, AZ, count."""
    plan = describe_plan(client, plan_arn)
    if plan is None:
        raise CapacityError(f"capacity.plan_arn {plan_arn} does not exist in this account/region: fix the ARN")
    problems = plan_problems(
        plan, instance_type=instance_type, availability_zone=availability_zone, instance_count=instance_count
    )
    if problems:
        raise CapacityError(
            f"capacity.plan_arn {plan.name} does not fit the environment: {'; '.join(problems)}: "
            "use a matching plan or change the environment"
        )
    return plan


def plan_instance_types() -> tuple[str, ...]:
    """Instance types SageMaker sells as training plans, from botocore's service model (offline)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("ReservedCapacityInstanceType").enum)
