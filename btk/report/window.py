"""The ``--since`` window: a duration back from now (``30d``, ``12h``, ``2w``) or a date."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from btk.errors import BtkError

_DURATION = re.compile(r"(\d{1,5})([hdw])")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}


def parse_since(text: str, now: datetime) -> datetime:
    """The start of the report window in UTC (a date without a zone is taken as UTC)."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if match:
        amount = int(match.group(1))
        if amount == 0:
            raise BtkError(f"--since {text!r} is an empty window: use a positive duration like 30d")
        return now - amount * _UNITS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BtkError(f"--since {text!r} is not a duration or a date: use e.g. 30d, 12h, 2w or 2025-06-01") from None
    try:
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise BtkError(f"--since {text!r} is out of range: give a date between years 1 and 9999 in UTC") from None
    if moment >= now:
        raise BtkError(f"--since {text!r} is in the future: give a date before now")
    return moment
