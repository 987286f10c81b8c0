"""Errors the core raises for bad user input.

Every user-facing error names the field at fault and, where there is one, the fix. The CLI
turns these into one line on stderr and exit code 2.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def printable(text: str) -> str:
    """``text`` with line breaks, control characters and undecodable bytes escaped: one line, always.

    Messages echo what the user wrote (a name with a newline, a NUL byte); escaped, the error
    still reads as the one line every tool and log parser expects.
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class BtkError(Exception):
    """A user-facing error: one line, naming the field and the fix."""


class UnknownNameError(BtkError):
    """An unknown profile, instance type or environment name."""


class InfeasiblePlanError(BtkError):
    """The requested knobs cannot run: memory overflow or an unsupported precision."""


class FieldError(ValueError):
    """A model validator's finding about one field (dotted path, relative to the model).

    Pydantic reports a model validator's error at the model's root; raising this instead of
    a plain ``ValueError`` lets :func:`one_line` name the field.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def models_in(annotation: Any) -> tuple[type[BaseModel], ...]:
    """The pydantic models an annotation can hold (``X``, ``X | None``, ``X | Y``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    if typing.get_origin(annotation) is typing.Annotated:  # a discriminated union, or a member's tag
        return models_in(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(model for arg in typing.get_args(annotation) for model in models_in(arg))
    return ()


def nested_models(root: type[BaseModel]) -> dict[str, tuple[type[BaseModel], str]]:
    """Each model in ``root`` by class name, with its dotted path: ``{"ModelArchitecture": (..., "architecture")}``."""
    found: dict[str, tuple[type[BaseModel], str]] = {root.__name__: (root, "")}
    pending: list[tuple[type[BaseModel], str]] = [(root, "")]
    while pending:
        model, prefix = pending.pop()
        for name, info in model.model_fields.items():
            for nested in models_in(info.annotation):
                if nested.__name__ not in found:
                    found[nested.__name__] = (nested, f"{prefix}{name}")
                    pending.append((nested, f"{prefix}{name}."))
    return found


def field_path(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """Pydantic's ``loc`` as a dotted field path, without the tags of discriminated unions."""
    parts: list[str] = []
    current: tuple[type[BaseModel], ...] = (model,) if model is not None else ()
    for part in loc:
        fields = [m.model_fields[part] for m in current if isinstance(part, str) and part in m.model_fields]
        if len(current) > 1 and not fields:
            continue  # the tag pydantic inserts for a discriminated union ("reserve")
        parts.append(str(part))
        current = tuple(nested for info in fields for nested in models_in(info.annotation))
    return ".".join(parts)


def _location(item: Any, model: type[BaseModel] | None, prefix: str) -> str:
    path = field_path(model, tuple(item["loc"]))
    cause = item.get("ctx", {}).get("error")
    if isinstance(cause, FieldError):
        path = f"{path}.{cause.field}" if path else cause.field
    return f"{prefix}.{path}" if prefix and path else prefix or path


def one_line(error: ValidationError, prefix: str = "", *, root: type[BaseModel] | None = None) -> str:
    """Render a pydantic ``ValidationError`` as one line naming each field at fault.

    ``root``: the model the user writes (``ModelProfile``, ``EnvironmentConfig``); an error
    of a model nested in it (``ModelArchitecture``) is then named by its path from the root
    (``architecture.num_attention_heads``).
    """
    model, path = nested_models(root).get(error.title, (None, "")) if root is not None else (None, "")
    parts = []
    for item in error.errors():
        location = _location(item, model, path)
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{location}: {message}" if location else message)
    text = printable("; ".join(parts))
    return f"{prefix}{text}" if prefix else text
