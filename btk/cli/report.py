"""``btk report``: experiment economics (issue 8)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser("report", help="experiment economics (not yet built)")
    parser.set_defaults(handler=_not_built)


def _not_built(args: argparse.Namespace) -> int:
    from btk.errors import BtkError

    raise BtkError("btk report is not built yet (issue 8)")
