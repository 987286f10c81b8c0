"""Up-front fees as the training-plan API writes them: parsed strictly, printed with their currency."""

from __future__ import annotations

import math
import re
from typing import Any

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
