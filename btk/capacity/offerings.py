"""Offering search: find offerings for a reservation, rank them, and say why one may not be bought."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from btk.capacity.aws import _call
from btk.capacity.model import TARGET_RESOURCE, Offering, ReservationRequest, _any_unstated_zone, iso, utc
from btk.capacity.pricing import format_fee

LISTED_OFFERINGS_MAX = 5

#: The only currency an offering is bought in: ``max_upfront_fee`` is in US dollars.
PURCHASE_CURRENCY = "USD"


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


def duplicate_ids(offerings: Iterable[Offering]) -> frozenset[str]:
    """Offering ids listed more than once in one answer: which of them a purchase would buy is unknowable."""
    counts = Counter(offering.offering_id for offering in offerings)
    return frozenset(offering_id for offering_id, count in counts.items() if count > 1)


def rejection(
    offering: Offering,
    request: ReservationRequest,
    max_upfront_fee: float,
    duplicates: frozenset[str] = frozenset(),
) -> str | None:
    """Why ``offering`` may not be bought for ``request``; None when every field matches it.

    An offering is bought only as asked: its id listed once (``duplicates`` holds the ids listed more
    than once in the same answer), serving training jobs, every capacity block in the environment's
    AZ with the requested instance type and count, priced in USD within ``max_upfront_fee``, lasting
    the requested hours, starting no earlier than ``start_after`` and ending no later than
    ``end_before`` (when set). A field the offering does not state is a mismatch.
    """
    if offering.offering_id in duplicates:
        return f"offering id {offering.offering_id} is listed more than once in one answer"
    if TARGET_RESOURCE not in offering.target_resources:
        return f"targets {'+'.join(offering.target_resources) or 'nothing'}, not {TARGET_RESOURCE}"
    if not offering.in_zone(request.availability_zone):
        zones = "+".join(offering.availability_zones) or "no AZ"
        unstated = " (a capacity block states no AZ)" if _any_unstated_zone(offering.segments) else ""
        return f"AZ {zones}{unstated} is not the environment's {request.availability_zone}"
    return (
        _capacity_mismatch(offering, request)
        or _window_mismatch(offering, request)
        or _price_mismatch(offering, max_upfront_fee)
    )


def _capacity_mismatch(offering: Offering, request: ReservationRequest) -> str | None:
    types = sorted({segment.instance_type for segment in offering.segments})
    if types != [request.instance_type]:
        return f"instance type {'+'.join(types) or 'none'}, not {request.instance_type}"
    if request.ultraserver_type:
        ultraservers = sorted({segment.ultraserver_type for segment in offering.segments})
        if ultraservers != [request.ultraserver_type]:
            return f"UltraServer type {'+'.join(ultraservers) or 'none'}, not {request.ultraserver_type}"
        counts = sorted({segment.ultraserver_count for segment in offering.segments})
        if counts != [request.ultraserver_count]:
            return f"{'+'.join(map(str, counts))} UltraServers, not {request.ultraserver_count}"
    else:
        counts = sorted({segment.instance_count for segment in offering.segments})
        if counts != [request.instance_count]:
            return f"{'+'.join(map(str, counts))} instances, not {request.instance_count}"
    if offering.duration_hours != request.duration_hours:
        return f"lasts {offering.duration_hours:g} h, not {request.duration_hours} h"
    return None


def _window_mismatch(offering: Offering, request: ReservationRequest) -> str | None:
    if any(segment.start_time is None or segment.end_time is None for segment in offering.segments):
        return "a capacity block states no start or end time"
    start, end = offering.start_time, offering.end_time
    if start is None or end is None:  # unreachable: every block states both
        return "the offering states no start or end time"
    if start < utc(request.start_after):
        return f"starts {iso(start)}, before start_after {iso(request.start_after)}"
    if request.end_before is not None and end > utc(request.end_before):
        return f"ends {iso(end)}, after end_before {iso(request.end_before)}"
    return None


def _price_mismatch(offering: Offering, max_upfront_fee: float) -> str | None:
    if offering.currency != PURCHASE_CURRENCY:
        return f"priced in {offering.currency or 'an unstated currency'}, not {PURCHASE_CURRENCY}"
    if offering.upfront_fee is None:
        return "the offering states no up-front fee"
    if offering.upfront_fee > max_upfront_fee:
        return f"fee {format_fee(offering.upfront_fee, offering.currency)} > max_upfront_fee {max_upfront_fee:,.2f}"
    return None


def list_offerings(offerings: Sequence[Offering], request: ReservationRequest, max_upfront_fee: float) -> str:
    """The offerings as one line for an error message (best first, at most a few)."""
    if not offerings:
        return "no offerings"
    duplicates = duplicate_ids(offerings)
    parts = []
    for offering in offerings[:LISTED_OFFERINGS_MAX]:
        reason = rejection(offering, request, max_upfront_fee, duplicates)
        parts.append(offering.summary() + (f": {reason}" if reason else ""))
    more = len(offerings) - LISTED_OFFERINGS_MAX
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
