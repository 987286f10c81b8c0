"""The ``btk`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``; handlers
return an exit code. Heavy imports (boto3, matplotlib) happen inside handlers so that
``btk plan`` stays fast. Every user error is one line on stderr and exit code 2. Every
command that prints results takes the same ``--format`` flag (:mod:`btk.cli.output`) and
prints its tables with :mod:`btk.table`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from btk.cli.streams import closed, tolerate_unencodable
from btk.errors import BtkError, printable

COMMAND_MODULES = ("btk.cli.planning", "btk.cli.profile", "btk.cli.capacity", "btk.cli.report", "btk.cli.doctor",
                   "btk.cli.bootstrap", "btk.cli.evidence", "btk.cli.rehearse")
EXIT_USAGE = 2


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        # argparse echoes some arguments verbatim ("unrecognized arguments: …"): keep them on one line.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message)}\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse before 3.13 drops a value that is exactly "--" (``--nodes=--``) and hands the
        # option an empty list instead of reporting the missing value.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="btk", description="Blackwell Training Kit: plan, reserve and report training on SageMaker."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # an ASCII terminal prints `±` as `\xb1`, never a traceback
        tolerate_unencodable(stream)
    parser = build_parser()
    args = parser.parse_args(argv)
    if closed(sys.stdout):  # `btk … >&-`: nothing is run whose output would be lost
        return _fail("cannot write the output: standard output is closed")
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # a full disk under `btk … > FILE` surfaces here, not at exit
        return code
    except BtkError as error:
        return _fail(str(error))
    except BrokenPipeError:  # pragma: no cover - e.g. `btk profiles | head`
        return 0
    except OSError as error:
        if error.filename:  # a file the command read or wrote: which, and what the system said
            return _fail(f"{error.filename}: {error.strerror or error}")
        return _fail(f"cannot write the output: {error.strerror or error}")  # stdout: a full disk, a closed pipe


def _fail(message: str) -> int:
    if not closed(sys.stderr):
        with contextlib.suppress(OSError):  # stderr on a full disk: the exit status still says it
            print(f"btk: error: {printable(message)}", file=sys.stderr)
    return EXIT_USAGE


def run() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
