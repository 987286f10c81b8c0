"""SageMaker Flexible Training Plans: search, rank, buy once, describe, wait, verify.

One package shared by the ``btk capacity`` CLI and the deploy-time custom resource
(``training_constructs/lambda/training_plan``), one module per concern: :mod:`.model` (names,
the reservation request, offerings, plans, errors), :mod:`.pricing` (fees), :mod:`.aws` (the
client and one-line errors), :mod:`.offerings` (offering search and ranking), :mod:`.plans`
(plan lookup, waiting, fit) and :mod:`.purchase` (the purchase guards). This module re-exports
them: callers use ``btk.capacity``. The custom resource's asset bundles a byte-identical copy
of the package and of :mod:`btk.pagination`, so both must stay importable on the Lambda Python
runtime with nothing but the standard library and boto3: no pydantic, no other ``btk`` module,
and boto3/botocore only inside functions (``btk plan`` never pays for importing them).

A plan charges its up-front fee when bought, cannot be modified and has no delete API. The
rules encoded here:

- a plan's name is derived from its reservation inputs (:meth:`ReservationRequest.plan_name`),
  so a retry after a timeout finds the plan it already bought instead of buying again;
- :func:`find_or_buy_plan` buys only with ``purchase_approved`` and only an offering that matches
  the request in every field: listed once, every capacity block in the environment's AZ with the
  requested instance type and count, the requested duration inside the requested window, priced
  in USD at most ``max_upfront_fee`` (a field the offering does not state is a mismatch);
- it never buys while the environment already holds a live plan under another name: a
  reservation window computed from the clock would otherwise name a new plan on every deploy;
- a plan found by name is verified like a plan given by ARN before it is used;
- fees are parsed strictly (``1234.5`` or ``1,234.50``): an ambiguous text is no fee;
- every answer is held to its documented shape and every listing is bounded
  (:mod:`btk.pagination`, bundled with the package);
- failures are :class:`CapacityError` with one line of text naming the cause and the fix.
"""

from __future__ import annotations

from btk.capacity.model import (
    CAPACITY_STOP_MARGIN_SECONDS,
    CAPACITY_TERMINATION_LEAD_SECONDS,
    DEAD_STATUSES,
    NAME_PREFIX,
    PLAN_HASH_CHARS,
    PLAN_NAME_MAX,
    READY_STATUSES,
    TARGET_RESOURCE,
    CapacityError,
    CapacitySegment,
    Offering,
    PlanNotReadyError,
    ReservationRequest,
    TrainingPlan,
    is_environment_plan,
    iso,
    parse_iso,
    plan_name_prefix,
    reservation_request,
    ultraserver_booking,
    utc,
)
from btk.capacity.offerings import (
    LISTED_OFFERINGS_MAX,
    PURCHASE_CURRENCY,
    duplicate_ids,
    list_offerings,
    rank_offerings,
    rejection,
    search_offerings,
)
from btk.capacity.plans import (
    DEFAULT_POLL_SECONDS,
    DEFAULT_WAIT_SECONDS,
    LIST_PLANS_MAX_PAGES,
    describe_plan,
    list_plans,
    live_environment_plans,
    not_ready_error,
    plan_instance_types,
    plan_problems,
    usable,
    verify_existing_plan,
    wait_for_plan,
)
from btk.capacity.pricing import (
    format_fee,
    parse_fee,
)
from btk.capacity.purchase import (
    NAME_TAKEN_CODES,
    Purchase,
    Reservation,
    create_plan,
    ensure_reserved_plan,
    find_or_buy_plan,
    ready_plan,
)

__all__ = [
    "CAPACITY_STOP_MARGIN_SECONDS",
    "CAPACITY_TERMINATION_LEAD_SECONDS",
    "DEAD_STATUSES",
    "DEFAULT_POLL_SECONDS",
    "DEFAULT_WAIT_SECONDS",
    "LISTED_OFFERINGS_MAX",
    "LIST_PLANS_MAX_PAGES",
    "NAME_PREFIX",
    "NAME_TAKEN_CODES",
    "PLAN_HASH_CHARS",
    "PLAN_NAME_MAX",
    "PURCHASE_CURRENCY",
    "READY_STATUSES",
    "TARGET_RESOURCE",
    "CapacityError",
    "CapacitySegment",
    "Offering",
    "PlanNotReadyError",
    "Purchase",
    "Reservation",
    "ReservationRequest",
    "TrainingPlan",
    "create_plan",
    "describe_plan",
    "duplicate_ids",
    "ensure_reserved_plan",
    "find_or_buy_plan",
    "format_fee",
    "is_environment_plan",
    "iso",
    "list_offerings",
    "list_plans",
    "live_environment_plans",
    "not_ready_error",
    "parse_fee",
    "parse_iso",
    "plan_instance_types",
    "plan_name_prefix",
    "plan_problems",
    "rank_offerings",
    "ready_plan",
    "rejection",
    "reservation_request",
    "search_offerings",
    "ultraserver_booking",
    "usable",
    "utc",
    "verify_existing_plan",
    "wait_for_plan",
]
