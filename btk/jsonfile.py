"""Reading JSON that a user or a service wrote, with one-line errors instead of tracebacks.

``json.loads`` fails in five different ways on hostile input — ``JSONDecodeError``,
``UnicodeDecodeError`` for bytes that are not UTF-8, ``RecursionError`` for deep nesting,
``ValueError`` for integers longer than Python's digit limit, ``OSError`` for unreadable
files — and each becomes a traceback unless caught. Every JSON file the kit reads
(``hyperparameters.json``, ``resourceconfig.json``, a dataset's ``manifest.json``) goes
through :func:`read_json_file`, so each failure is one :class:`~btk.errors.BtkError` that
names the file and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from btk.errors import BtkError

MAX_JSON_BYTES = 16 * 1024 * 1024
"""Largest JSON file read (the kit's own files are a few kB; a larger one is not ours)."""

MAX_JSON_DEPTH = 32
"""Deepest nesting accepted: the kit's files nest three levels at most."""


def parse_json(text: str | bytes, what: str) -> Any:
    """Parse ``text`` as JSON; :class:`BtkError` naming ``what`` on any failure."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError as error:
        raise BtkError(f"{what}: not UTF-8 text (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise BtkError(f"{what}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except RecursionError:
        raise BtkError(f"{what}: JSON nested too deeply") from None
    except ValueError as error:  # e.g. an integer longer than sys.get_int_max_str_digits()
        raise BtkError(f"{what}: unreadable JSON value ({str(error).splitlines()[0]})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise BtkError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json_file(path: Path, what: str | None = None) -> Any:
    """Read and parse the JSON file at ``path``; :class:`BtkError` naming the file on any failure."""
    name = what or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise BtkError(f"{name}: {size} bytes is larger than the {MAX_JSON_BYTES} bytes a kit file may have")
        data = path.read_bytes()
    except FileNotFoundError:
        raise BtkError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise BtkError(f"{name}: is a directory, not a file") from None
    except OSError as error:
        raise BtkError(f"{name}: cannot be read ({error.strerror or error})") from None
    return parse_json(data, name)


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion limit to hit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest
