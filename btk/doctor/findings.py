"""One check's outcome: pass, warn or fail, the figure found and the exact next step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from btk.errors import printable

Status = Literal["pass", "warn", "fail"]
PASS: Status = "pass"
WARN: Status = "warn"
FAIL: Status = "fail"
STATUSES: tuple[Status, ...] = (PASS, WARN, FAIL)
#: Exit status of ``btk doctor``: nothing failed, or something did (2, bad input, is the CLI's).
EXIT_OK = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Finding:
    """What one check found.

    check: what was checked, e.g. ``quota 'ml.p5.48xlarge for training job usage'``.
    status: ``pass``, ``warn`` (training may still start; or AWS would not answer) or ``fail``.
    found: the figure found, in words.
    next_step: the exact thing to do; empty when there is nothing to do.
    data: the figures behind ``found``, for ``--format json``.
    """

    check: str
    status: Status
    found: str
    next_step: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The finding as one line: ``FAIL check: found -> next step``."""
        text = f"{self.status.upper():4} {self.check}: {self.found}"
        return printable(text + (f" -> {self.next_step}" if self.next_step else ""))

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status,
            "found": self.found,
            "next_step": self.next_step,
            "data": dict(self.data),
        }


Check = tuple[str, Callable[[], Finding]]
"""A check's name (its line when AWS does not answer) and the function that finds."""


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """How many findings have each status, every status present (zero included)."""
    tally: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for finding in findings:
        tally[finding.status] += 1
    return tally


def exit_code(findings: Iterable[Finding]) -> int:
    """``EXIT_FAILED`` when any finding failed, else ``EXIT_OK`` (warnings do not fail)."""
    return EXIT_FAILED if any(finding.status == FAIL for finding in findings) else EXIT_OK
