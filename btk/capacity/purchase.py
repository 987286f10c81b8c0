"""Purchase guards: buy at most once, only with approval, within the fee ceiling, in the environment's AZ."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from btk.capacity.aws import _answer, _error_code, _one_line
from btk.capacity.model import CapacityError, Offering, ReservationRequest, TrainingPlan
from btk.capacity.offerings import duplicate_ids, list_offerings, rank_offerings, rejection, search_offerings
from btk.capacity.plans import (
    DEFAULT_POLL_SECONDS,
    DEFAULT_WAIT_SECONDS,
    describe_plan,
    live_environment_plans,
    not_ready_error,
    plan_problems,
    usable,
)

#: CreateTrainingPlan error codes for a plan name that is already taken.
NAME_TAKEN_CODES = ("ResourceInUse",)


def create_plan(client: Any, name: str, offering_id: str) -> str:
    """Buy ``offering_id`` as plan ``name`` (charges the up-front fee); returns the plan ARN.

    When the name is already taken (``ResourceInUse``) and a plan of that name exists, its
    ARN is returned instead of an error: botocore retries a call whose response was lost
    (read timeout), and the first attempt may have bought the plan. The name is derived
    from the reservation inputs, so a plan of that name is this reservation's plan.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
    except (ClientError, BotoCoreError) as error:
        if _error_code(error) in NAME_TAKEN_CODES:
            existing = describe_plan(client, name)
            if existing is not None:
                return existing.arn
        raise _one_line(error, "create_training_plan") from None
    return str(_answer(client, "create_training_plan", response)["TrainingPlanArn"])


@dataclass(frozen=True)
class Reservation:
    """Outcome of :func:`ensure_reserved_plan`."""

    plan: TrainingPlan
    bought: bool
    offering: Offering | None = None


@dataclass(frozen=True)
class Purchase:
    """Outcome of :func:`find_or_buy_plan`: the plan's name and ARN, and whether it was bought now."""

    name: str
    arn: str
    bought: bool
    offering: Offering | None = None


def find_or_buy_plan(
    client: Any,
    request: ReservationRequest,
    *,
    max_upfront_fee: float,
    purchase_approved: bool,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Purchase:
    """The plan for ``request``, bought at most once; returns without waiting for it.

    1. A plan named ``request.plan_name()`` exists: it is the one (never buy twice).
    2. The environment holds another live plan (not Failed/Expired, not ended): refuse — a
       second plan for one environment is never bought implicitly.
    3. Otherwise search, rank, and buy the best offering that matches the request in every field
       (:func:`~btk.capacity.offerings.rejection`: the environment's AZ, instance type and count,
       duration, window, a unique id, a USD fee of at most ``max_upfront_fee``) — only when
       ``purchase_approved``; any other case raises a CapacityError listing the offerings.

    A bought plan is Pending until its payment clears: :func:`ready_plan` says when it may be used.
    """
    name = request.plan_name()
    existing = describe_plan(client, name)
    if existing is not None:
        return Purchase(name=name, arn=existing.arn, bought=False)

    live = live_environment_plans(client, request.environment, now())
    if live:
        held = ", ".join(f"{plan.name} ({plan.status})" for plan in live)
        raise CapacityError(
            f"plan {name} not bought: environment {request.environment} already holds {held}; "
            "capacity.start_after/end_before must be fixed dates (a date computed from the clock names a new "
            "plan on every deploy); to use a held plan set capacity.mode to existing with its ARN"
        )

    offerings = rank_offerings(search_offerings(client, request), request.availability_zone)
    window = request.describe_window()
    if not offerings:
        raise CapacityError(f"no training-plan offerings for {window}: widen the window or change the duration")
    listing = list_offerings(offerings, request, max_upfront_fee)
    if not purchase_approved:
        raise CapacityError(f"plan {name} not bought: set capacity.purchase_approved to buy; offerings: {listing}")
    duplicates = duplicate_ids(offerings)
    buyable = [offering for offering in offerings if rejection(offering, request, max_upfront_fee, duplicates) is None]
    if not buyable:
        raise CapacityError(
            f"plan {name} not bought: no offering in {request.availability_zone} matches {window} "
            f"within max_upfront_fee {max_upfront_fee:,.2f} USD; offerings: {listing}"
        )
    best = buyable[0]
    arn = create_plan(client, name, best.offering_id)
    return Purchase(name=name, arn=arn, bought=True, offering=best)


def ready_plan(client: Any, request: ReservationRequest) -> TrainingPlan | None:
    """The reservation's plan once Scheduled/Active and fit for it; None while it is still Pending.

    Raises :class:`CapacityError` when the plan is missing, Failed/Expired, or does not serve
    the request (target, instance type, AZ, count).
    """
    name = request.plan_name()
    plan = describe_plan(client, name)
    if plan is None:
        raise CapacityError(f"training plan {name} does not exist")
    if not usable(plan):
        return None
    problems = plan_problems(
        plan,
        instance_type=request.instance_type,
        availability_zone=request.availability_zone,
        instance_count=request.instance_count,
    )
    if problems:
        raise CapacityError(
            f"training plan {plan.name} does not fit the reservation: {'; '.join(problems)}: "
            "check the plan in the SageMaker console; it is not used"
        )
    return plan


def ensure_reserved_plan(
    client: Any,
    request: ReservationRequest,
    *,
    max_upfront_fee: float,
    purchase_approved: bool,
    timeout_seconds: float = DEFAULT_WAIT_SECONDS,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Reservation:
    """:func:`find_or_buy_plan`, then poll :func:`ready_plan` until the plan may be used.

    Raises :class:`PlanNotReadyError` when it is still pending after ``timeout_seconds``.
    """
    purchase = find_or_buy_plan(
        client, request, max_upfront_fee=max_upfront_fee, purchase_approved=purchase_approved, now=now
    )
    deadline = clock() + timeout_seconds
    while True:
        plan = ready_plan(client, request)
        if plan is not None:
            return Reservation(plan=plan, bought=purchase.bought, offering=purchase.offering)
        remaining = deadline - clock()
        if remaining <= 0:
            raise not_ready_error(purchase.name, "Pending", timeout_seconds)
        sleep(min(poll_seconds, remaining))
