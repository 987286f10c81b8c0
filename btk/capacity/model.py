"""The values of a training plan: names, the reservation request, offerings, plans, and the errors.

Standard library only (the reservation Lambda bundles this package): no pydantic, no boto3.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from btk.capacity.pricing import format_fee, parse_fee

if TYPE_CHECKING:  # typing only: the Lambda copy of this package has no pydantic
    from btk.environment import EnvironmentConfig


TARGET_RESOURCE = "training-job"

READY_STATUSES = ("Scheduled", "Active")

DEAD_STATUSES = ("Failed", "Expired")

PLAN_NAME_MAX = 63

PLAN_HASH_CHARS = 8

NAME_PREFIX = "btk"

#: SageMaker terminates a training plan's instances this long before its capacity ends.
CAPACITY_TERMINATION_LEAD_SECONDS = 30 * 60

#: The trainer stops this long before that termination: a large model's checkpoint takes
#: minutes to write, and SageMaker's background sync to S3 must upload it before the instance goes.
CAPACITY_STOP_MARGIN_SECONDS = 15 * 60


class CapacityError(Exception):
    """A training-plan problem, as one line naming the cause and the fix."""


class PlanNotReadyError(CapacityError):
    """A bought plan did not reach Scheduled/Active before the deadline."""


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
    ultraserver_type: str = ""
    """For an instance type sold in UltraServers (P6e-GB200): the UltraServer type booked, e.g. ml.u-p6e-gb200x72."""
    ultraserver_count: int = 0
    """How many of ``ultraserver_type`` (0 without one)."""

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
                # an UltraServer booking only: the names of instance bookings stay what they were
                *((self.ultraserver_type, str(self.ultraserver_count)) if self.ultraserver_type else ()),
            )
        )

    def describe_window(self) -> str:
        """``2 x ml.p6-b200.48xlarge, 168 h after 2027-01-04T00:00:00Z`` (an UltraServer booking names its
        UltraServers first: ``1 x ml.u-p6e-gb200x72 (16 x ml.p6e-gb200.36xlarge), ...``)."""
        instances = f"{self.instance_count} x {self.instance_type}"
        if self.ultraserver_type:
            instances = f"{self.ultraserver_count} x {self.ultraserver_type} ({instances})"
        return f"{instances}, {self.duration_hours} h after {iso(self.start_after)}"

    def to_properties(self) -> dict[str, str]:
        """Custom-resource properties (CloudFormation passes every value as a string)."""
        properties = {
            "Environment": self.environment,
            "InstanceType": self.instance_type,
            "InstanceCount": str(self.instance_count),
            "StartAfter": iso(self.start_after),
            "EndBefore": iso(self.end_before) if self.end_before is not None else "",
            "DurationHours": str(self.duration_hours),
            "AvailabilityZone": self.availability_zone,
        }
        if self.ultraserver_type:
            properties["UltraServerType"] = self.ultraserver_type
            properties["UltraServerCount"] = str(self.ultraserver_count)
        return properties

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
                ultraserver_type=str(properties.get("UltraServerType") or ""),
                ultraserver_count=int(properties.get("UltraServerCount") or 0),
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
            "StartTimeAfter": utc(self.start_after),
            "DurationHours": self.duration_hours,
        }
        if self.ultraserver_type:  # an UltraServer plan is sold by UltraServer type and count
            parameters["UltraServerType"] = self.ultraserver_type
            parameters["UltraServerCount"] = self.ultraserver_count
        else:
            parameters["InstanceCount"] = self.instance_count
        if self.end_before is not None:
            parameters["EndTimeBefore"] = utc(self.end_before)
        return parameters


def ultraserver_booking(
    instance_type: str, instance_count: int, ultraserver_type: str | None = None
) -> tuple[str, int]:
    """(UltraServer type, count) that hold ``instance_count`` instances of an UltraServer instance type
    (default: its largest UltraServer), or ``("", 0)`` for an instance type booked by instance."""
    from btk.hardware import INSTANCE_TYPES  # the catalog is not bundled with the Lambda, which never calls this

    instance = INSTANCE_TYPES.get(instance_type)
    if instance is None or not instance.ultraservers:
        return "", 0
    ultraserver = instance.ultraserver(ultraserver_type)
    return ultraserver.name, -(-instance_count // ultraserver.instances)


def reservation_request(env: EnvironmentConfig) -> ReservationRequest:
    """The reservation inputs of an environment whose ``capacity.mode`` is ``reserve``."""
    reserve = env.capacity
    if reserve.mode != "reserve":
        raise CapacityError(f"environment {env.name}: capacity.mode is {reserve.mode}, not reserve")
    ultraserver_type, ultraserver_count = ultraserver_booking(
        env.instance_type, reserve.instance_count, reserve.ultraserver_type
    )
    return ReservationRequest(
        environment=env.name,
        instance_type=env.instance_type,
        instance_count=reserve.instance_count,
        start_after=reserve.start_after,
        end_before=reserve.end_before,
        duration_hours=reserve.duration_hours,
        availability_zone=env.availability_zone,
        ultraserver_type=ultraserver_type,
        ultraserver_count=ultraserver_count,
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
    ultraserver_type: str = ""
    ultraserver_count: int = 0

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> CapacitySegment:
        return cls(
            instance_type=str(item.get("InstanceType", "")),
            instance_count=int(item.get("InstanceCount", item.get("TotalInstanceCount", 0))),
            availability_zone=str(item.get("AvailabilityZone", "")),
            start_time=item.get("StartTime"),
            end_time=item.get("EndTime"),
            status=str(item.get("Status", "")),
            ultraserver_type=str(item.get("UltraServerType", "")),
            ultraserver_count=int(item.get("UltraServerCount", 0)),
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


def one_line_text(value: Any) -> str:
    """AWS's free text (a plan's status message) as one printable line: whitespace runs become one space, other
    control characters are escaped (this package is bundled with the handler without the rest of btk)."""
    text = " ".join(str(value).split())
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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
            status_message=one_line_text(item.get("StatusMessage", "")),
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
