"""Argument types the ``btk`` commands share, and the one-line rendering of what users typed.

A type function that raises ``argparse.ArgumentTypeError`` becomes one ``btk … error:`` line
naming the option (see :class:`btk.cli.OneLineArgumentParser`).
"""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

#: Longer numbers are refused unread: no count this CLI takes needs more characters.
MAX_NUMBER_CHARS = 20


def non_empty(text: str) -> str:
    """A value that says something: an empty or blank one is refused, never taken as "not given"."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty: give a value or leave the option out")
    return text


def non_empty_path(text: str) -> Path:
    """A path that is not empty (``Path('')`` would silently mean the current directory)."""
    return Path(non_empty(text))


@cache
def max_nodes() -> int:
    """The most instances one training job of an environment may use: ``EnvironmentConfig.instance_count``'s bound."""
    from annotated_types import Le

    from btk.environment import EnvironmentConfig

    bounds = [item.le for item in EnvironmentConfig.model_fields["instance_count"].metadata if isinstance(item, Le)]
    return int(str(bounds[0]))


def node_count(text: str) -> int:
    """A number of instances, 1 to :func:`max_nodes`."""
    limit = max_nodes()
    stripped = text.strip()
    value: int | None = None
    # Thousands of digits would overflow the planner's float models: the length check comes first.
    if len(stripped) <= MAX_NUMBER_CHARS:
        try:
            value = int(stripped)
        except ValueError:
            value = None
    if value is None or not 1 <= value <= limit:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {limit}")
    return value
