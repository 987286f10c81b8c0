"""``btk report``: experiment economics.

Reads the environment's training jobs from SageMaker and prints, per profile and overall:
runs, failure rate and causes, capacity wait, billable GPU-hours, cost and cost per
successful run, and achieved vs predicted tokens/s and MFU. See ``docs/report.md``.
boto3 and matplotlib are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from btk.cli.output import JSON, MARKDOWN, TABLE, add_format_argument
from btk.errors import BtkError

if TYPE_CHECKING:
    from btk.report.predict import Predictor


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="experiment economics: cost per successful run, failures, capacity wait, predicted vs achieved",
        description="Report on an environment's SageMaker training jobs (read-only AWS calls).",
    )
    parser.add_argument("--env", help="environment name from environments.py (required)")
    parser.add_argument("--profile", help="only this profile (default: every profile of the environment)")
    parser.add_argument("--since", default="30d", help="window: a duration (30d, 12h, 2w) or a date (default 30d)")
    add_format_argument(parser, (TABLE, MARKDOWN, JSON))
    parser.add_argument("--plot", type=Path, metavar="DIR", help="also write PNG charts into DIR")
    parser.add_argument("--json-schema", action="store_true", help="print the JSON schema of --format json and exit")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run_report(args)


def run_report(
    args: argparse.Namespace,
    *,
    client: Any = None,
    now: datetime | None = None,
    sleep: Callable[[float], None] = time.sleep,
    predictor: Predictor | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """The command body; AWS client, clock, sleep and predictor are injectable for tests."""
    from btk.report.schema import report_json_schema

    out = stdout if stdout is not None else sys.stdout
    if args.json_schema:
        out.write(json.dumps(report_json_schema(), indent=2) + "\n")
        return 0

    from btk.catalog import all_environments, get_environment, get_profile
    from btk.report import aws
    from btk.report.collect import collect
    from btk.report.economics import build_report
    from btk.report.predict import planner_predictor
    from btk.report.render import render
    from btk.report.window import parse_since

    if not args.env:
        raise BtkError(f"--env is required: one of {', '.join(sorted(all_environments()))}")
    environment = get_environment(args.env)
    profiles = list(environment.profiles)
    if args.profile is not None:
        if args.profile not in environment.profiles:
            get_profile(args.profile)  # unknown names fail here with suggestions
        profiles = [args.profile]
    moment = now if now is not None else datetime.now(UTC)
    since = parse_since(args.since, moment)

    reader = aws.SageMakerReader(client if client is not None else aws.make_client(environment.region), sleep=sleep)
    collection = collect(
        reader,
        environment=environment.name,
        profiles=profiles,
        since=since,
        only_profile=args.profile,
        progress_stream=stderr,
    )
    report = build_report(
        collection,
        environment=environment.name,
        region=environment.region,
        profiles=profiles,
        since=since,
        now=moment,
        predictor=predictor if predictor is not None else planner_predictor,
        only_profile=args.profile,
    )
    out.write(render(report, args.output_format))
    if args.plot is not None:
        from btk.report.plots import write_plots

        paths = write_plots(report, args.plot)
        err = stderr if stderr is not None else sys.stderr
        err.write("btk report: wrote " + ", ".join(str(path) for path in paths) + "\n")
    return 0
