"""The output flag every result-printing ``btk`` command shares.

``--format`` picks the output (``table`` by default; ``json`` everywhere; ``markdown`` where a
command offers it; ``python`` for ``btk profile import``, whose output is a module to commit)
and ``--json`` is the same as ``--format json`` on every command, so scripts written against
either spelling keep working. Both land in ``args.output_format``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

TABLE = "table"
JSON = "json"
MARKDOWN = "markdown"
PYTHON = "python"


def add_format_argument(
    parser: argparse.ArgumentParser, formats: Sequence[str] = (TABLE, JSON), default: str = TABLE
) -> None:
    """Add ``--format {formats}`` (default ``default``, ``table`` unless the command prints something else) and
    its alias ``--json``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--format",
        choices=tuple(formats),
        default=default,
        dest="output_format",
        help=f"output format (default {default})",
    )
    group.add_argument(
        "--json",
        action="store_const",
        const=JSON,
        default=default,
        dest="output_format",
        help=f"same as --format {JSON}",
    )


def print_json(value: Any, *, sort_keys: bool = False) -> None:
    """``value`` as indented JSON on stdout; values JSON lacks (datetimes) print as strings."""
    print(json.dumps(value, indent=2, sort_keys=sort_keys, default=str))
