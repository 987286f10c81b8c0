"""``btk capacity``: training-plan offerings and the environment's plan (issue 6)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser("capacity", help="training-plan offerings (not yet built)")
    parser.set_defaults(handler=_not_built)


def _not_built(args: argparse.Namespace) -> int:
    from btk.errors import BtkError

    raise BtkError("btk capacity is not built yet (issue 6)")
