"""The training plan of an ``existing`` or ``reserve`` environment, read as its jobs will meet it.

The rules are :mod:`btk.capacity`'s (what a plan must be to serve the environment:
:func:`~btk.capacity.plan_problems`; the plan a reservation is bought as:
:func:`~btk.capacity.reservation_request`) and :mod:`btk.planner.cost`'s (the hours of a plan
that train: :func:`~btk.planner.cost.usable_plan_hours`); only the call goes through
:class:`~btk.doctor.aws.Caller`, so that throttling and denials end like every other check's.
The training subnet is created in the environment's ``availability_zone``
(``training_constructs/network.py``), so the plan's zone is compared with that.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from btk import capacity
from btk.doctor.aws import Answer, Caller, ServiceError
from btk.doctor.findings import FAIL, PASS, WARN, Check, Finding
from btk.doctor.quotas import PlannedJob
from btk.environment import EnvironmentConfig, ExistingPlanCapacity, ReservePlanCapacity
from btk.planner.cost import usable_plan_hours
from btk.report.aws import NOT_FOUND_CODES
from btk.units import SECONDS_PER_HOUR

PENDING = "Pending"


def describe(caller: Caller, name_or_arn: str) -> capacity.TrainingPlan | None:
    """The plan named (or ARN'd) ``name_or_arn``; ``None`` when it does not exist."""
    try:
        response = caller.call("sagemaker", "describe_training_plan", TrainingPlanName=name_or_arn)
    except ServiceError as error:
        if error.code in NOT_FOUND_CODES:
            return None
        raise
    return capacity.TrainingPlan.from_api(response)


def _summary(plan: capacity.TrainingPlan) -> str:
    types = "+".join(plan.instance_types) or "?"
    zones = "+".join(plan.availability_zones) or "?"
    end = capacity.iso(plan.end_time) if plan.end_time else "?"
    return f"{plan.status}, {plan.total_instance_count} x {types} in {zones}, ends {end}"


def training_plan_checks(
    env: EnvironmentConfig, jobs: Sequence[PlannedJob], caller: Caller, now: datetime
) -> list[Check]:
    """The plan's status and fit, and its hours left against the pipelines' maximum runtime; none on demand."""
    config = env.capacity
    if isinstance(config, ExistingPlanCapacity):
        name = config.plan_arn
    elif isinstance(config, ReservePlanCapacity):
        name = capacity.reservation_request(env).plan_name()
    else:
        return []
    plan = Answer(lambda: describe(caller, name))
    largest = max(job.instance_count for job in jobs)
    explain = f"btk capacity show --env {env.name} explains it"

    def fit() -> Finding:
        check = f"training plan {name}"
        found = plan.get()
        if found is None and isinstance(config, ReservePlanCapacity):
            return Finding(
                check, WARN, "not bought yet",
                f"the next cdk deploy buys it within max_upfront_fee; btk capacity search --env {env.name} "
                "shows the offerings",
            )  # fmt: skip
        if found is None:
            return Finding(
                check, FAIL, f"does not exist in {env.region}", f"fix capacity.plan_arn in environments.py; {explain}"
            )
        problems = capacity.plan_problems(
            found, instance_type=env.instance_type, availability_zone=env.availability_zone, instance_count=largest
        )
        data = {"plan": found.to_json(), "problems": problems, "needed_instances": largest}
        if problems:
            what = f"{_summary(found)}: does not fit: {'; '.join(problems)}"
            return Finding(check, FAIL, what, f"use a plan that fits or change the environment; {explain}", data)
        if found.status == PENDING:
            return Finding(check, WARN, _summary(found), "its payment is pending: wait until it is Scheduled", data)
        return Finding(check, PASS, f"{_summary(found)}; {largest} instances needed", "", data)

    def hours() -> Finding:
        check = "training plan hours left"
        found = plan.get()
        runtime = env.max_runtime_hours
        if found is None and isinstance(config, ReservePlanCapacity):
            usable = usable_plan_hours(config.duration_hours)
            left = f"{usable:,.1f} usable hours once bought (duration_hours {config.duration_hours})"
        elif found is None or found.end_time is None:
            return Finding(check, WARN, "no plan end to read", "see the training plan line")
        else:
            end = capacity.utc(found.end_time)
            start = max(capacity.utc(now), capacity.utc(found.start_time or now))
            if end <= capacity.utc(now):
                return Finding(
                    check, FAIL, f"the plan ended at {capacity.iso(end)}", f"a new plan is needed; {explain}"
                )
            usable = usable_plan_hours((end - start).total_seconds() / SECONDS_PER_HOUR)
            left = f"{usable:,.1f} usable hours left (until {capacity.iso(end)}, less the final checkpoint lead)"
        data = {"usable_hours": round(usable, 2), "max_runtime_hours": runtime}
        if usable <= 0:
            return Finding(check, FAIL, left, f"nothing left to train on: a new plan is needed; {explain}", data)
        if usable < runtime:
            return Finding(
                check, WARN, f"{left}, less than max_runtime_hours {runtime}",
                "a job started now stops at the plan's end and resumes from its checkpoints: plan the next "
                "capacity, or lower max_runtime_hours",
                data,
            )  # fmt: skip
        return Finding(check, PASS, f"{left}, max_runtime_hours {runtime}", "", data)

    return [(f"training plan {name}", fit), ("training plan hours left", hours)]
