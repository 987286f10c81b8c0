"""``btk evidence import|list|export|push|pull``: the team's measured runs the planner corrects itself with.

The store is one file (``btk-evidence.json`` here, ``BTK_EVIDENCE`` or ``--evidence FILE`` to
name another; format in :mod:`btk.evidence`). ``import`` validates files of runs and merges
them (a run whose id is there already is replaced), ``list`` prints the runs with what the
planner predicted for each, ``export`` writes them to a file for another machine. ``push`` and
``pull --env ENV`` merge the store with the environment's copy in its artifacts bucket
(:mod:`btk.evidence_bucket`). A file or object that is not evidence is one line naming it and
the field, exit 2, and the store is left as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from btk.cli.arguments import non_empty, non_empty_path
from btk.cli.output import JSON, TABLE, add_format_argument, print_json
from btk.errors import BtkError


def aws_clients(region: str) -> Any:
    """The clients of ``push`` and ``pull`` (:mod:`btk.aws_clients`: set-up checked, waits bounded)."""
    from btk.aws_clients import client_factory

    return client_factory(region, purpose="btk-evidence")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "evidence", help="the team's measured runs: import, list, export (btk plan corrects itself with them)"
    )
    commands = parser.add_subparsers(dest="evidence_command", required=True, parser_class=type(parser))
    importer = commands.add_parser("import", help="validate files of measured runs and add them to the store",
                                   description="Validate each FILE (the btk.evidence format) and merge its runs into "
                                   "the store; a run whose id is there already is replaced.")
    importer.add_argument("files", type=non_empty_path, nargs="+", metavar="FILE")
    lister = commands.add_parser("list", help="the stored runs, each beside the planner's prediction for it")
    add_format_argument(lister, (TABLE, JSON), default=TABLE)
    exporter = commands.add_parser("export", help="write the stored runs to FILE (a new file)")
    exporter.add_argument("file", type=non_empty_path, metavar="FILE")
    pusher = commands.add_parser("push", help="add the stored runs to the environment's (its artifacts bucket)",
                                 description="Merge the stored runs into the environment's evidence "
                                 "(s3://<ArtifactsBucketName>/btk/evidence.json): a stored run replaces the "
                                 "bucket's of the same id; the bucket's other runs stay.")
    puller = commands.add_parser("pull", help="add the environment's runs (its artifacts bucket) to the store",
                                 description="Merge the environment's evidence into the store: the bucket's run "
                                 "replaces a stored one of the same id; the store's other runs stay.")
    for command in (pusher, puller):
        command.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    for command, handler in ((importer, cmd_import), (lister, cmd_list), (exporter, cmd_export), (pusher, cmd_push),
                             (puller, cmd_pull)):
        command.add_argument("--evidence", type=non_empty_path, metavar="STORE",
                             help="the store (default: $BTK_EVIDENCE, else btk-evidence.json here)")
        command.set_defaults(handler=handler)


def cmd_import(args: argparse.Namespace) -> int:
    from btk.evidence import evidence_path, merged, read_evidence, write_evidence

    store = evidence_path(args.evidence)
    evidence = read_evidence(store)
    incoming = [read_evidence_file(path) for path in args.files]  # every file checked before the store changes
    added = replaced = 0
    for runs in incoming:
        evidence, new, changed = merged(evidence, runs.runs)
        added, replaced = added + new, replaced + changed
    write_evidence(store, evidence)
    print(f"{store}: {added} run(s) added, {replaced} replaced, {len(evidence.runs)} in all")
    return 0


def read_evidence_file(path: Path) -> Any:
    from btk.evidence import read_evidence

    if not path.is_file():
        raise BtkError(f"{path}: file not found" if not path.exists() else f"{path}: is not a file")
    return read_evidence(path)


def cmd_list(args: argparse.Namespace) -> int:
    from btk.evidence import evidence_path, read_evidence
    from btk.hardware import INSTANCE_TYPES
    from btk.planner.throughput import estimate_throughput

    store = evidence_path(args.evidence)
    rows = []
    for run in read_evidence(store).runs:
        instance = INSTANCE_TYPES.get(run.instance_type)
        predicted = (estimate_throughput(run.architecture, run.knobs, instance, run.nodes).tokens_per_second_per_gpu
                     if instance is not None else None)
        rows.append({"id": run.id, "kind": run.kind, "profile": run.profile, "instance_type": run.instance_type,
                     "nodes": run.nodes, "tokens_per_second_per_gpu": run.tokens_per_second_per_gpu,
                     "predicted_tokens_per_second_per_gpu": round(predicted, 1) if predicted else None,
                     "measured_over_predicted": round(run.tokens_per_second_per_gpu / predicted, 4)
                     if predicted else None})
    if args.output_format == JSON:
        print_json(rows)
        return 0
    if not rows:
        print(f"{store}: no measured runs (btk evidence import FILE adds some)")
        return 0
    from btk.table import Column, Table

    def number(key: str, fmt: str = "{:,.0f}", missing: str = "-") -> Any:
        return lambda row: missing if row[key] is None else fmt.format(row[key])

    table: Table[dict[str, Any]] = Table([
        Column("id", lambda row: row["id"]), Column("kind", lambda row: row["kind"]),
        Column("profile", lambda row: row["profile"]), Column("instance type", lambda row: row["instance_type"]),
        Column("nodes", number("nodes", "{}"), "right"),
        Column("tokens/s/GPU", number("tokens_per_second_per_gpu"), "right"),
        Column("predicted", number("predicted_tokens_per_second_per_gpu", missing="not in catalog"), "right"),
        Column("measured/predicted", number("measured_over_predicted", "{:.3f}"), "right"),
    ])
    print("\n".join(table.text(rows)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from btk.evidence import evidence_path, read_evidence, write_evidence

    if args.file.exists():
        raise BtkError(f"{args.file}: exists; export writes a new file")
    evidence = read_evidence(evidence_path(args.evidence))
    write_evidence(args.file, evidence)
    print(f"{args.file}: {len(evidence.runs)} run(s) written")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from btk.catalog import get_environment
    from btk.evidence import evidence_path, merged, read_evidence
    from btk.evidence_bucket import artifacts_bucket, read_bucket_evidence, write_bucket_evidence

    env = get_environment(args.env)
    store = evidence_path(args.evidence)
    local = read_evidence(store)  # a store that cannot be read stops the push before any AWS call
    clients = aws_clients(env.region)
    bucket = artifacts_bucket(clients, env)
    remote = read_bucket_evidence(clients, bucket)
    evidence, added, replaced = merged(remote.evidence, local.runs)
    if added == replaced == 0:
        print(f"{remote.uri}: already holds every run of {store} ({len(evidence.runs)} in all); nothing written")
        return 0
    write_bucket_evidence(clients, bucket, evidence, remote)
    print(f"{remote.uri}: {added} run(s) added, {replaced} replaced, {len(evidence.runs)} in all")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from btk.catalog import get_environment
    from btk.evidence import evidence_path, merged, read_evidence, write_evidence
    from btk.evidence_bucket import artifacts_bucket, read_bucket_evidence

    env = get_environment(args.env)
    store = evidence_path(args.evidence)
    local = read_evidence(store)
    clients = aws_clients(env.region)
    remote = read_bucket_evidence(clients, artifacts_bucket(clients, env))
    evidence, added, replaced = merged(local, remote.evidence.runs)
    if added or replaced:
        write_evidence(store, evidence)
    print(f"{store}: {added} run(s) added, {replaced} replaced from {remote.uri}, {len(evidence.runs)} in all")
    return 0
