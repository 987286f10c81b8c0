"""Errors the core raises for bad user input.

Every user-facing error names the field at fault and, where there is one, the fix. The CLI
turns these into one line on stderr and exit code 2.
"""

from __future__ import annotations

from pydantic import ValidationError


class BtkError(Exception):
    """A user-facing error: one line, naming the field and the fix."""


class UnknownNameError(BtkError):
    """An unknown profile, instance type or environment name."""


class InfeasiblePlanError(BtkError):
    """The requested knobs cannot run: memory overflow or an unsupported precision."""


def one_line(error: ValidationError, prefix: str = "") -> str:
    """Render a pydantic ``ValidationError`` as one line naming each field at fault."""
    parts = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(root)"
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{location}: {message}")
    text = "; ".join(parts)
    return f"{prefix}{text}" if prefix else text
