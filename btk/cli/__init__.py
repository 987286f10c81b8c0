"""The ``btk`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``; handlers
return an exit code. Heavy imports (boto3, matplotlib) happen inside handlers so that
``btk plan`` stays fast. Every user error is one line on stderr and exit code 2. Every
command that prints results takes the same ``--format`` flag (:mod:`btk.cli.output`) and
prints its tables with :mod:`btk.table`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from btk.errors import BtkError

COMMAND_MODULES = ("btk.cli.planning", "btk.cli.capacity", "btk.cli.report")
EXIT_USAGE = 2


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="btk", description="Blackwell Training Kit: plan, reserve and report training on SageMaker."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except BtkError as error:
        print(f"btk: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # pragma: no cover - e.g. `btk profiles | head`
        return 0


def run() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
