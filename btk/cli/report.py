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
from typing import TYPE_CHECKING, Any, TextIO

from btk.cli.arguments import non_empty, non_empty_path
from btk.cli.output import JSON, MARKDOWN, TABLE, add_format_argument
from btk.errors import BtkError

if TYPE_CHECKING:
    from btk.report.predict import Predictor

DEFAULT_SINCE = "30d"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="experiment economics: cost per successful run, failures, capacity wait, predicted vs achieved",
        description="Report on an environment's SageMaker training jobs (read-only AWS calls).",
    )
    parser.add_argument("--env", type=non_empty, help="environment name from environments.py (required)")
    parser.add_argument(
        "--profile", type=non_empty, help="only this profile (default: every profile of the environment)"
    )
    parser.add_argument(
        "--since", type=non_empty, help=f"window: a duration (30d, 12h, 2w) or a date (default {DEFAULT_SINCE})"
    )
    add_format_argument(parser, (TABLE, MARKDOWN, JSON))
    parser.add_argument("--plot", type=non_empty_path, metavar="DIR", help="also write PNG charts into DIR")
    parser.add_argument(
        "--record-evidence", action="store_true",
        help="also add every completed job's measured tokens/s to the evidence store, which btk plan corrects "
        "its prediction with (rehearsals as rehearsals; a job recorded before is replaced)",
    )
    parser.add_argument("--evidence", type=non_empty_path, metavar="STORE",
                        help="the store --record-evidence writes (default: $BTK_EVIDENCE, else btk-evidence.json here)")
    parser.add_argument(
        "--json-schema", action="store_true", help="print the JSON schema of --format json and exit (no other option)"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return run_report(args)


def _window_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options that choose what to report (``--json-schema`` takes none of them)."""
    output_format = None if args.output_format == TABLE else args.output_format
    return {
        "--env": args.env,
        "--profile": args.profile,
        "--since": args.since,
        "--plot": args.plot,
        "--format": output_format,
        "--record-evidence": args.record_evidence or None,
        "--evidence": args.evidence,
    }


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
        given = [option for option, value in _window_options(args).items() if value is not None]
        if given:
            raise BtkError(f"--json-schema prints the schema only: drop {', '.join(given)}")
        out.write(json.dumps(report_json_schema(), indent=2) + "\n")
        return 0

    from btk.catalog import all_environments, get_environment, get_profile
    from btk.report import aws
    from btk.report.collect import collect
    from btk.report.economics import build_report
    from btk.report.plots import check_plot_directory
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
    since = parse_since(args.since or DEFAULT_SINCE, moment)
    if args.plot is not None:
        check_plot_directory(args.plot)
    if args.evidence is not None and not args.record_evidence:
        raise BtkError("--evidence names the store --record-evidence writes: add --record-evidence")
    store = _evidence_store(args) if args.record_evidence else None

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
    if store is not None:
        _record(collection, environment.region, since, None if args.profile is None else profiles, store,
                stderr if stderr is not None else sys.stderr)
    return 0


def _evidence_store(args: argparse.Namespace) -> Any:
    """The store --record-evidence writes, read before any AWS call: a store that cannot be read stops the
    command before it reports."""
    from btk.evidence import evidence_path, read_evidence

    store = evidence_path(args.evidence)
    read_evidence(store)
    return store


def _record(collection: Any, region: str, since: datetime, profiles: list[str] | None, store: Any,
            err: TextIO) -> None:
    from btk.evidence import merged, read_evidence, write_evidence
    from btk.report.record import measured_runs

    recorded = measured_runs(collection, region=region, since=since, profiles=profiles)
    evidence, added, replaced = merged(read_evidence(store), recorded.runs)
    write_evidence(store, evidence)
    err.write(f"btk report: {recorded.summary()}; {store}: {added} run(s) added, {replaced} replaced, "
              f"{len(evidence.runs)} in all\n")
