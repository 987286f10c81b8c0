"""SageMaker Flexible Training Plans: search, rank, buy once, describe, wait, verify.

One module shared by the ``btk capacity`` CLI and the deploy-time custom resource
(``training_constructs/lambda/training_plan``). The custom resource's asset bundles a copy of
this very file, so it must stay importable on the Lambda Python runtime with nothing but the
standard library and boto3: no pydantic, no other ``btk`` module, and boto3/botocore only
inside functions (``btk plan`` never pays for importing them).

A plan charges its up-front fee when bought, cannot be modified and has no delete API. The
rules encoded here:

- a plan's name is derived from its reservation inputs (:meth:`ReservationRequest.plan_name`),
  so a retry after a timeout finds the plan it already bought instead of buying again;
- :func:`find_or_buy_plan` buys only with ``purchase_approved`` and only an offering whose
  fee is at most ``max_upfront_fee`` and every one of whose capacity blocks states the
  environment's AZ (a block that states no AZ cannot be checked, so it is refused);
- it never buys while the environment already holds a live plan under another name: a
  reservation window computed from the clock would otherwise name a new plan on every deploy;
- a plan found by name is verified like a plan given by ARN before it is used;
- fees are parsed strictly (``1234.5`` or ``1,234.50``): an ambiguous text is no fee;
- failures are :class:`CapacityError` with one line of text naming the cause and the fix.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typing only: the Lambda copy of this module has no pydantic
    from btk.environment import EnvironmentConfig

TARGET_RESOURCE = "training-job"
READY_STATUSES = ("Scheduled", "Active")
DEAD_STATUSES = ("Failed", "Expired")
PLAN_NAME_MAX = 63
PLAN_HASH_CHARS = 8
NAME_PREFIX = "btk"
LISTED_OFFERINGS_MAX = 5
DEFAULT_WAIT_SECONDS = 600.0
DEFAULT_POLL_SECONDS = 15.0
#: CreateTrainingPlan error codes for a plan name that is already taken.
NAME_TAKEN_CODES = ("ResourceInUse",)
#: SageMaker terminates a training plan's instances this long before its capacity ends.
CAPACITY_TERMINATION_LEAD_SECONDS = 30 * 60
#: The trainer stops this long before that termination: a large model's checkpoint takes
#: minutes to write, and SageMaker's background sync to S3 must upload it before the instance goes.
CAPACITY_STOP_MARGIN_SECONDS = 15 * 60


class CapacityError(Exception):
    """A training-plan problem, as one line naming the cause and the fix."""


class PlanNotReadyError(CapacityError):
    """A bought plan did not reach Scheduled/Active before the deadline."""


# --------------------------------------------------------------------------- values


def utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive values are taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def iso(value: datetime) -> str:
    """Canonical text of an instant: UTC, whole seconds, e.g. ``2026-01-05T00:00:00+00:00``."""
    return utc(value).replace(microsecond=0).isoformat()


def parse_iso(value: str, field_name: str) -> datetime:
    """Parse an ISO-8601 instant (``Z`` accepted); naive values are UTC."""
    try:
        return utc(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
    except ValueError:
        raise CapacityError(f"{field_name} {value!r} is not an ISO-8601 time: use e.g. 2026-01-05T00:00:00Z") from None


_FEE = re.compile(r"(?:[0-9]+|[0-9]{1,3}(?:,[0-9]{3})+)(?:\.[0-9]+)?")
"""A fee as the API writes it: digits, optionally grouped by commas in threes, a decimal point."""


def parse_fee(value: Any) -> float | None:
    """The API's ``UpfrontFee`` string as a number; None when absent, not a finite number, or ambiguous.

    Strict on purpose: ``"150.000,50"`` (a decimal comma) must not read as 150.0005 and pass a
    150,000 ceiling, so only plain decimals and comma-grouped thousands are accepted.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        fee = float(value)
    elif isinstance(value, str) and _FEE.fullmatch(value.strip()):
        fee = float(value.strip().replace(",", ""))
    else:
        return None
    return fee if math.isfinite(fee) and fee >= 0 else None


def format_fee(fee: float | None, currency: str) -> str:
    return "unknown fee" if fee is None else f"{fee:,.2f} {currency}".strip()


def plan_name_prefix(environment: str) -> str:
    """``btk-<env slug>-``: what every plan name of ``environment`` starts with (8 hex digits follow).

    The slug is the environment name reduced to what a plan name allows (letters, digits,
    single hyphens), cut so that the whole name fits in :data:`PLAN_NAME_MAX` characters.
    """
    slug = "-".join(part for part in environment.lower().replace("_", "-").split("-") if part)
    slug = "".join(ch for ch in slug if ch.isalnum() or ch == "-")
    room = PLAN_NAME_MAX - len(NAME_PREFIX) - PLAN_HASH_CHARS - 2
    slug = slug[:room].strip("-") or "env"
    return f"{NAME_PREFIX}-{slug}-"


def is_environment_plan(name: str, environment: str) -> bool:
    """True when ``name`` is a plan name :meth:`ReservationRequest.plan_name` gives ``environment``.

    Exact: ``btk-dev-<8 hex>`` is dev's, ``btk-dev-eu-<8 hex>`` is not (it is environment dev-eu's).
    """
    prefix = plan_name_prefix(environment)
    digest = name[len(prefix) :]
    return (
        name.startswith(prefix)
        and len(digest) == PLAN_HASH_CHARS
        and all(ch in "0123456789abcdef" for ch in digest)
    )


@dataclass(frozen=True)
class ReservationRequest:
    """What to reserve: the inputs that identify one plan (and so its name).

    The fee ceiling and the approval are deliberately *not* part of it: changing either must
    never lead to buying a second plan.
    """

    environment: str
    instance_type: str
    instance_count: int
    start_after: datetime
    duration_hours: int
    availability_zone: str
    end_before: datetime | None = None

    def plan_name(self) -> str:
        """Deterministic, idempotent plan name ``btk-<env>-<hash8>`` (valid for CreateTrainingPlan)."""
        digest = hashlib.sha256(self.identity().encode()).hexdigest()[:PLAN_HASH_CHARS]
        return plan_name_prefix(self.environment) + digest

    def identity(self) -> str:
        """Canonical text of the inputs the name is derived from."""
        end = iso(self.end_before) if self.end_before is not None else ""
        return "|".join(
            (
                self.environment,
                self.instance_type,
                str(self.instance_count),
                iso(self.start_after),
                end,
                str(self.duration_hours),
                self.availability_zone,
            )
        )

    def to_properties(self) -> dict[str, str]:
        """Custom-resource properties (CloudFormation passes every value as a string)."""
        return {
            "Environment": self.environment,
            "InstanceType": self.instance_type,
            "InstanceCount": str(self.instance_count),
            "StartAfter": iso(self.start_after),
            "EndBefore": iso(self.end_before) if self.end_before is not None else "",
            "DurationHours": str(self.duration_hours),
            "AvailabilityZone": self.availability_zone,
        }

    @classmethod
    def from_properties(cls, properties: dict[str, Any]) -> ReservationRequest:
        """Inverse of :meth:`to_properties`; a missing or malformed value is a CapacityError."""
        try:
            end = str(properties.get("EndBefore") or "")
            return cls(
                environment=str(properties["Environment"]),
                instance_type=str(properties["InstanceType"]),
                instance_count=int(properties["InstanceCount"]),
                start_after=parse_iso(str(properties["StartAfter"]), "StartAfter"),
                end_before=parse_iso(end, "EndBefore") if end else None,
                duration_hours=int(properties["DurationHours"]),
                availability_zone=str(properties["AvailabilityZone"]),
            )
        except KeyError as missing:
            raise CapacityError(f"reservation property {missing.args[0]} is missing") from None
        except ValueError as error:
            raise CapacityError(f"reservation properties are malformed: {error}") from None

    def search_parameters(self) -> dict[str, Any]:
        """Request of SearchTrainingPlanOfferings for this reservation."""
        parameters: dict[str, Any] = {
            "TargetResources": [TARGET_RESOURCE],
            "InstanceType": self.instance_type,
            "InstanceCount": self.instance_count,
            "StartTimeAfter": utc(self.start_after),
            "DurationHours": self.duration_hours,
        }
        if self.end_before is not None:
            parameters["EndTimeBefore"] = utc(self.end_before)
        return parameters


def reservation_request(env: EnvironmentConfig) -> ReservationRequest:
    """The reservation inputs of an environment whose ``capacity.mode`` is ``reserve``."""
    reserve = env.capacity
    if reserve.mode != "reserve":
        raise CapacityError(f"environment {env.name}: capacity.mode is {reserve.mode}, not reserve")
    return ReservationRequest(
        environment=env.name,
        instance_type=env.instance_type,
        instance_count=reserve.instance_count,
        start_after=reserve.start_after,
        end_before=reserve.end_before,
        duration_hours=reserve.duration_hours,
        availability_zone=env.availability_zone,
    )


@dataclass(frozen=True)
class CapacitySegment:
    """One reserved-capacity block of an offering or a plan."""

    instance_type: str
    instance_count: int
    availability_zone: str
    start_time: datetime | None = None
    end_time: datetime | None = None
    status: str = ""

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> CapacitySegment:
        return cls(
            instance_type=str(item.get("InstanceType", "")),
            instance_count=int(item.get("InstanceCount", item.get("TotalInstanceCount", 0))),
            availability_zone=str(item.get("AvailabilityZone", "")),
            start_time=item.get("StartTime"),
            end_time=item.get("EndTime"),
            status=str(item.get("Status", "")),
        )


def _any_unstated_zone(segments: Sequence[CapacitySegment]) -> bool:
    return any(not segment.availability_zone for segment in segments)


def _zones(segments: Sequence[CapacitySegment]) -> tuple[str, ...]:
    return tuple(sorted({segment.availability_zone for segment in segments if segment.availability_zone}))


def _first(values: Iterable[datetime | None]) -> datetime | None:
    known = [utc(value) for value in values if value is not None]
    return min(known) if known else None


def _last(values: Iterable[datetime | None]) -> datetime | None:
    known = [utc(value) for value in values if value is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class Offering:
    """One training-plan offering from SearchTrainingPlanOfferings."""

    offering_id: str
    upfront_fee: float | None
    currency: str
    duration_hours: float
    target_resources: tuple[str, ...]
    segments: tuple[CapacitySegment, ...] = field(default_factory=tuple)

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> Offering:
        hours = float(item.get("DurationHours", 0)) + float(item.get("DurationMinutes", 0)) / 60
        return cls(
            offering_id=str(item["TrainingPlanOfferingId"]),
            upfront_fee=parse_fee(item.get("UpfrontFee")),
            currency=str(item.get("CurrencyCode", "")),
            duration_hours=hours,
            target_resources=tuple(item.get("TargetResources", ())),
            segments=tuple(CapacitySegment.from_api(part) for part in item.get("ReservedCapacityOfferings", ())),
        )

    @property
    def availability_zones(self) -> tuple[str, ...]:
        return _zones(self.segments)

    @property
    def start_time(self) -> datetime | None:
        return _first(segment.start_time for segment in self.segments)

    @property
    def end_time(self) -> datetime | None:
        return _last(segment.end_time for segment in self.segments)

    @property
    def instance_count(self) -> int:
        """Instances available at once: the smallest block (blocks may be consecutive)."""
        return min((segment.instance_count for segment in self.segments), default=0)

    def in_zone(self, availability_zone: str) -> bool:
        """True when every capacity block states ``availability_zone`` (a block with no AZ cannot be checked)."""
        return bool(self.segments) and all(s.availability_zone == availability_zone for s in self.segments)

    def summary(self) -> str:
        start = iso(self.start_time) if self.start_time else "?"
        zones = "+".join(self.availability_zones) or "?"
        return f"{self.offering_id} ({format_fee(self.upfront_fee, self.currency)}, {zones}, start {start})"

    def to_json(self) -> dict[str, Any]:
        return {
            "offering_id": self.offering_id,
            "upfront_fee": self.upfront_fee,
            "currency": self.currency,
            "start_time": iso(self.start_time) if self.start_time else None,
            "end_time": iso(self.end_time) if self.end_time else None,
            "availability_zones": list(self.availability_zones),
            "instance_count": self.instance_count,
            "duration_hours": self.duration_hours,
        }


@dataclass(frozen=True)
class TrainingPlan:
    """A bought plan, from DescribeTrainingPlan or ListTrainingPlans."""

    arn: str
    name: str
    status: str
    status_message: str = ""
    upfront_fee: float | None = None
    currency: str = ""
    start_time: datetime | None = None
    end_time: datetime | None = None
    total_instance_count: int = 0
    target_resources: tuple[str, ...] = ()
    segments: tuple[CapacitySegment, ...] = ()

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> TrainingPlan:
        return cls(
            arn=str(item["TrainingPlanArn"]),
            name=str(item["TrainingPlanName"]),
            status=str(item["Status"]),
            status_message=str(item.get("StatusMessage", "")),
            upfront_fee=parse_fee(item.get("UpfrontFee")),
            currency=str(item.get("CurrencyCode", "")),
            start_time=item.get("StartTime"),
            end_time=item.get("EndTime"),
            total_instance_count=int(item.get("TotalInstanceCount", 0)),
            target_resources=tuple(item.get("TargetResources", ())),
            segments=tuple(CapacitySegment.from_api(part) for part in item.get("ReservedCapacitySummaries", ())),
        )

    @property
    def availability_zones(self) -> tuple[str, ...]:
        return _zones(self.segments)

    @property
    def instance_types(self) -> tuple[str, ...]:
        return tuple(sorted({segment.instance_type for segment in self.segments}))

    @property
    def ready(self) -> bool:
        return self.status in READY_STATUSES

    def to_json(self) -> dict[str, Any]:
        return {
            "arn": self.arn,
            "name": self.name,
            "status": self.status,
            "status_message": self.status_message,
            "upfront_fee": self.upfront_fee,
            "currency": self.currency,
            "start_time": iso(self.start_time) if self.start_time else None,
            "end_time": iso(self.end_time) if self.end_time else None,
            "total_instance_count": self.total_instance_count,
            "target_resources": list(self.target_resources),
            "instance_types": list(self.instance_types),
            "availability_zones": list(self.availability_zones),
        }


# --------------------------------------------------------------------------- AWS calls


def sagemaker_client(region: str) -> Any:
    """The boto3 SageMaker client every call here uses (tests replace this function)."""
    import boto3

    return boto3.client("sagemaker", region_name=region)


def _call(client: Any, operation: str, **parameters: Any) -> dict[str, Any]:
    """Call ``operation`` and turn any AWS/botocore failure into one CapacityError line."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response: dict[str, Any] = getattr(client, operation)(**parameters)
    except (ClientError, BotoCoreError) as error:
        raise _one_line(error, operation) from None
    return response


def _one_line(error: Exception, operation: str) -> CapacityError:
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = details.get("Code", "Error")
        message = " ".join(str(details.get("Message", "")).split())
        api = error.operation_name or operation
        return CapacityError(f"{api} failed: {code}: {message}".rstrip(": "))
    text = " ".join(str(error).split())
    return CapacityError(f"{operation} failed: {text} (configure AWS credentials and region)")


def _error_code(error: Exception) -> str:
    from botocore.exceptions import ClientError

    return str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError) else ""


def _is_not_found(error: Exception) -> bool:
    return _error_code(error) in ("ResourceNotFound", "ResourceNotFoundException")


def search_offerings(client: Any, request: ReservationRequest) -> list[Offering]:
    """Offerings for ``request``, in the API's order (rank them with :func:`rank_offerings`)."""
    response = _call(client, "search_training_plan_offerings", **request.search_parameters())
    return [Offering.from_api(item) for item in response.get("TrainingPlanOfferings", [])]


def rank_offerings(offerings: Iterable[Offering], availability_zone: str) -> list[Offering]:
    """Best first: capacity in ``availability_zone``, then earliest start, lowest fee, then id."""
    far_future = datetime.max.replace(tzinfo=UTC)

    def key(offering: Offering) -> tuple[int, datetime, float, str]:
        fee = offering.upfront_fee if offering.upfront_fee is not None else math.inf
        zone_rank = 0 if offering.in_zone(availability_zone) else 1
        return (zone_rank, offering.start_time or far_future, fee, offering.offering_id)

    return sorted(offerings, key=key)


def rejection(offering: Offering, request: ReservationRequest, max_upfront_fee: float) -> str | None:
    """Why ``offering`` may not be bought for ``request``; None when it may."""
    if TARGET_RESOURCE not in offering.target_resources:
        return f"targets {'+'.join(offering.target_resources) or 'nothing'}, not {TARGET_RESOURCE}"
    if not offering.in_zone(request.availability_zone):
        zones = "+".join(offering.availability_zones) or "no AZ"
        unstated = " (a capacity block states no AZ)" if _any_unstated_zone(offering.segments) else ""
        return f"AZ {zones}{unstated} is not the environment's {request.availability_zone}"
    if any(segment.instance_type != request.instance_type for segment in offering.segments):
        return f"instance type is not {request.instance_type}"
    if offering.instance_count < request.instance_count:
        return f"{offering.instance_count} instances < {request.instance_count}"
    if offering.upfront_fee is None:
        return "the offering states no up-front fee"
    if offering.upfront_fee > max_upfront_fee:
        return f"fee {format_fee(offering.upfront_fee, offering.currency)} > max_upfront_fee {max_upfront_fee:,.2f}"
    return None


def describe_plan(client: Any, name_or_arn: str) -> TrainingPlan | None:
    """The plan named (or ARN'd) ``name_or_arn``; None when it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = client.describe_training_plan(TrainingPlanName=name_or_arn)
    except (ClientError, BotoCoreError) as error:
        if _is_not_found(error):
            return None
        raise _one_line(error, "describe_training_plan") from None
    return TrainingPlan.from_api(response)


def list_plans(client: Any, name_prefix: str = "") -> list[TrainingPlan]:
    """Every plan of the account and region (all pages) whose name starts with ``name_prefix``."""
    plans: list[TrainingPlan] = []
    token: str | None = None
    while True:
        parameters: dict[str, Any] = {"MaxResults": 100, "SortBy": "StartTime", "SortOrder": "Ascending"}
        if token:
            parameters["NextToken"] = token
        response = _call(client, "list_training_plans", **parameters)
        plans.extend(
            TrainingPlan.from_api(item)
            for item in response.get("TrainingPlanSummaries", [])
            if str(item.get("TrainingPlanName", "")).startswith(name_prefix)
        )
        token = response.get("NextToken")
        if not token:
            return plans


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
    return str(response["TrainingPlanArn"])


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


# --------------------------------------------------------------------------- policies


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


def list_offerings(offerings: Sequence[Offering], request: ReservationRequest, max_upfront_fee: float) -> str:
    """The offerings as one line for an error message (best first, at most a few)."""
    if not offerings:
        return "no offerings"
    parts = []
    for offering in offerings[:LISTED_OFFERINGS_MAX]:
        reason = rejection(offering, request, max_upfront_fee)
        parts.append(offering.summary() + (f": {reason}" if reason else ""))
    more = len(offerings) - LISTED_OFFERINGS_MAX
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


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
    3. Otherwise search, rank, and buy the best offering in the environment's AZ with a fee of at
       most ``max_upfront_fee`` — only when ``purchase_approved``; any other case raises a
       CapacityError listing the offerings.

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
    window = (
        f"{request.instance_count} x {request.instance_type}, {request.duration_hours} h "
        f"after {iso(request.start_after)}"
    )
    if not offerings:
        raise CapacityError(f"no training-plan offerings for {window}: widen the window or change the duration")
    listing = list_offerings(offerings, request, max_upfront_fee)
    if not purchase_approved:
        raise CapacityError(f"plan {name} not bought: set capacity.purchase_approved to buy; offerings: {listing}")
    buyable = [offering for offering in offerings if rejection(offering, request, max_upfront_fee) is None]
    if not buyable:
        raise CapacityError(
            f"plan {name} not bought: no offering in {request.availability_zone} within max_upfront_fee "
            f"{max_upfront_fee:,.2f}; offerings: {listing}"
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


def live_environment_plans(client: Any, environment: str, now: datetime) -> list[TrainingPlan]:
    """The environment's plans (by the exact name rule) that are neither dead nor ended at ``now``."""
    return [
        plan
        for plan in list_plans(client, plan_name_prefix(environment))
        if is_environment_plan(plan.name, environment)
        and plan.status not in DEAD_STATUSES
        and (plan.end_time is None or utc(plan.end_time) > utc(now))
    ]
