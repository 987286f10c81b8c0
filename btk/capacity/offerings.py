"""Offering search: find offerings for a reservation, rank them, and say why one may not be bought."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from btk.capacity.aws import _call
from btk.capacity.model import TARGET_RESOURCE, Offering, ReservationRequest, _any_unstated_zone
from btk.capacity.pricing import format_fee

LISTED_OFFERINGS_MAX = 5


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
