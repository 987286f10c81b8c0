"""``btk profiles``, ``btk plan``, ``btk estimate``, ``btk compare``: the planner's CLI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from btk.cli.arguments import MAX_NUMBER_CHARS, max_nodes, node_count, non_empty, non_empty_path
from btk.cli.output import JSON, add_format_argument, print_json
from btk.errors import BtkError
from btk.table import Column, Table

if TYPE_CHECKING:
    from btk.profile import ModelProfile

_NODES_HELP = f"number of instances, 1 to {max_nodes()} (default 1)"


def register(subparsers: Any) -> None:
    from btk.hardware import INSTANCE_TYPES

    profiles = subparsers.add_parser("profiles", help="the profile catalog as a table")
    add_format_argument(profiles)
    profiles.set_defaults(handler=cmd_profiles)

    plan = subparsers.add_parser(
        "plan",
        help="choose the knobs for a profile (or every profile of --env)",
        description="Choose the knobs for PROFILE, or for every profile of --env, and say what training "
        "the profile's training.total_tokens costs.",
    )
    plan.add_argument("profile", nargs="?", type=non_empty, help="profile name (see `btk profiles`)")
    plan.add_argument(
        "--env",
        type=non_empty,
        help="plan on this environment's instance type and count: PROFILE alone, or every profile of the environment",
    )
    plan.add_argument("--instance", type=non_empty, default=None, help="instance type (default ml.p6-b200.48xlarge)")
    plan.add_argument("--nodes", type=node_count, default=None, help=_NODES_HELP)
    add_format_argument(plan)
    plan.add_argument(
        "--plot",
        type=non_empty,
        metavar="FILE.png",
        help="draw memory and throughput of the top candidates; with several profiles, FILE-PROFILE.png each",
    )
    _add_settings_argument(plan, "plan at a sequence length or with a knob fixed, e.g. --set seq_len=131072 or "
                                 "--set context_parallel=4 (repeatable; seq_len keeps the profile's global batch)")
    _add_evidence_argument(plan)
    plan.set_defaults(handler=cmd_plan)

    estimate = subparsers.add_parser(
        "estimate",
        help="evaluate a given knob set (what-if, no search)",
        description="What-if: start from the knobs `btk plan` chooses for this instance type and node count, "
        "apply --set, and evaluate. The profile's global batch is kept: when micro_batch_size, seq_len or "
        "tensor_parallel change, gradient_accumulation_steps is recomputed unless --set gives it.",
    )
    estimate.add_argument("profile", type=non_empty)
    estimate.add_argument("--instance", type=non_empty, default="ml.p6-b200.48xlarge")
    estimate.add_argument("--nodes", type=node_count, default=1, help=_NODES_HELP)
    _add_settings_argument(estimate, "a knob value over the plan's, e.g. --set precision=fp8_tensorwise (repeatable)")
    add_format_argument(estimate)
    _add_evidence_argument(estimate)
    estimate.set_defaults(handler=cmd_estimate)

    compare = subparsers.add_parser("compare", help="best knobs, speed and cost of a profile on several instance types")
    compare.add_argument("profile", type=non_empty)
    compare.add_argument(
        "--instances",
        type=non_empty,
        default=",".join(INSTANCE_TYPES),
        help="comma-separated instance types (default: every instance type of the hardware catalog)",
    )
    compare.add_argument("--nodes", type=node_count, default=1, help=_NODES_HELP)
    compare.add_argument(
        "--total-tokens",
        type=token_count,
        default=None,
        metavar="TOKENS",
        help="tokens to price the run for, e.g. 300B or 1.4T (default: the profile's training.total_tokens)",
    )
    add_format_argument(compare)
    compare.add_argument(
        "--plot", type=non_empty, metavar="FILE.png", help="draw tokens/s/GPU and $ per billion tokens per instance"
    )
    _add_settings_argument(compare, "compare at a sequence length or with a knob fixed on every instance type, "
                                    "e.g. --set seq_len=131072 (repeatable)")
    _add_evidence_argument(compare)
    compare.set_defaults(handler=cmd_compare)


def _add_settings_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE", help=help_text)


def _add_evidence_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--evidence", type=non_empty_path, metavar="STORE",
                        help="the team's measured runs to correct the prediction with (default: $BTK_EVIDENCE, else "
                        "btk-evidence.json here, where it exists; see btk evidence)")


TOKEN_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
MAX_TOTAL_TOKENS = 10**18
"""More than any training run prices (a million times Llama 3's 15T): a larger count is a typo."""


def token_count(text: str) -> int:
    """A whole number of tokens, optionally with a K, M, B or T suffix (``300B``, ``1.4T``), 1 to 10^18."""
    from decimal import Decimal, InvalidOperation

    stripped = text.strip()
    suffix = stripped[-1:].upper() if stripped[-1:].isalpha() else ""
    number = stripped[: len(stripped) - len(suffix)]
    value: Decimal | None = None
    digits = number.replace(".", "", 1)
    if suffix in TOKEN_SUFFIXES and len(number) <= MAX_NUMBER_CHARS and digits.isascii() and digits.isdigit():
        try:
            value = Decimal(number) * TOKEN_SUFFIXES[suffix]
        except InvalidOperation:
            value = None
    if value is None or value != value.to_integral_value() or not 1 <= value <= MAX_TOTAL_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a token count from 1 to 10^18: give a whole number, or one with K, M, B or T (300B)"
        )
    return int(value)


PROFILES_TABLE: Table[ModelProfile] = Table(
    [
        Column("profile", lambda p: p.name, "left", 14),
        Column("family", lambda p: p.family, "left", 7),
        Column("params", lambda p: f"{p.parameter_count / 1e9:.2f}B", "right", 8),
        Column("layers", lambda p: str(p.architecture.num_layers), "right", 6),
        Column("hidden", lambda p: str(p.architecture.hidden_size), "right", 6),
        Column("heads", lambda p: str(p.architecture.num_attention_heads), "right", 5),
        Column("kv", lambda p: str(p.architecture.num_kv_heads), "right", 3),
        Column("ffn", lambda p: str(p.architecture.ffn_hidden_size), "right", 6),
        Column("vocab", lambda p: str(p.architecture.vocab_size), "right", 7),
        Column("tied", lambda p: "yes" if p.architecture.tied_embeddings else "no", "right", 4),
        Column("seq", lambda p: str(p.training.seq_len), "right", 6),
        Column("batch tok", lambda p: f"{p.training.global_batch_tokens:,}", "right", 10),
        Column("count", lambda p: "published" if p.published_parameter_count else "unverified", "left", 10),
    ],
    gap=" ",
    rule="header",
)
"""``btk profiles``: one line per profile of the catalog."""


def cmd_profiles(args: argparse.Namespace) -> int:
    from btk.catalog import all_profiles

    profiles = list(all_profiles().values())
    if args.output_format == JSON:
        print_json([p.model_dump(mode="json") | {"parameter_count": p.parameter_count,
                                                  "parameter_count_verified": p.published_parameter_count is not None}
                    for p in profiles])
        return 0
    print("\n".join(PROFILES_TABLE.text(profiles)))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from btk.catalog import environment_profiles, get_environment, get_profile
    from btk.evidence import evidence_path, read_evidence
    from btk.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type
    from btk.planner.cost import reserved_plan_hours
    from btk.planner.evidence import correct_plan, rehearsal_record_line, runs_on_record
    from btk.planner.plot import check_plot_path, plot_plans
    from btk.planner.search import plan_profile, rehearsal_gate, with_settings

    plot = check_plot_path(args.plot) if args.plot is not None else None
    plan_hours: int | None = None
    if args.env is not None:
        env = get_environment(args.env)
        instance = get_instance_type(args.instance or env.instance_type)
        nodes = args.nodes or env.instance_count
        if args.profile is None:
            environment_profiles(env)  # a profile the environment names but profiles/ lacks: said as such
        names = [args.profile] if args.profile is not None else list(env.profiles)
        plan_hours = reserved_plan_hours(env.capacity)
    elif args.profile is not None:
        instance = get_instance_type(args.instance or DEFAULT_INSTANCE_TYPE)
        nodes = args.nodes or 1
        names = [args.profile]
    else:
        raise BtkError("plan needs a PROFILE (see `btk profiles`) or --env ENV")

    settings = parse_settings(args.settings)
    plans = [plan_profile(with_settings(get_profile(name), settings), instance, nodes) for name in names]
    rehearsals = [rehearsal_gate(plan, env.rehearsal.steps, env.rehearsal.min_throughput_share,
                                 require_falling_loss=env.rehearsal.require_falling_loss)
                  if args.env is not None and env.rehearses else None for plan in plans]
    store = evidence_path(args.evidence)
    evidence = read_evidence(store)
    corrections = [correct_plan(plan, evidence) for plan in plans]
    # Where the environment buys its capacity at deploy: was each model rehearsed on the instance type before?
    buys = args.env is not None and env.capacity.mode == "reserve"
    on_record = [runs_on_record(evidence, plan.profile.architecture, instance.name) if buys else None
                 for plan in plans]
    written = plot_plans(plans, plot) if plot is not None else []
    if args.output_format == JSON:
        documents = [plan.to_json(plan_hours) for plan in plans]
        for document, plan, rehearsal, correction, record in zip(documents, plans, rehearsals, corrections,
                                                                  on_record, strict=True):
            if args.env is not None:
                document["rehearsal"] = rehearsal.as_json() if rehearsal is not None else None
                document["runs_on_record"] = list(record) if record is not None else None
            predicted = plan.evaluation.estimate.tokens_per_second_per_gpu
            document["evidence"] = correction.as_json(predicted) if correction is not None else None
        print_json(documents[0] if args.profile else documents)
        _say_written(written, sys.stderr)
        return 0
    from btk.planner.render import render_plan

    if args.env:
        print(f"environment {args.env}: {len(plans)} profile(s) on {nodes} x {instance.name}\n")
    rendered = [render_plan(plan, plan_hours, rehearsal, correction)
                + ("" if record is None else "\n" + rehearsal_record_line(record, instance.name, store))
                for plan, rehearsal, correction, record in zip(plans, rehearsals, corrections, on_record, strict=True)]
    print("\n\n".join(rendered))
    _say_written(written, sys.stdout)
    return 0


def _say_written(paths: list[Path], stream: TextIO) -> None:
    """Where each plot went: on stdout after a table, on stderr after JSON (stdout stays one document)."""
    for path in paths:
        print(f"plot written to {path}", file=stream)


def parse_settings(settings: list[str]) -> dict[str, str]:
    """Parse ``KEY=VALUE`` pairs; a malformed one is a one-line error naming it."""
    from btk.knobs import KNOB_FIELDS

    values: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise BtkError(f"--set {item!r} is malformed: use KEY=VALUE, e.g. --set micro_batch_size=4")
        if key not in KNOB_FIELDS:
            raise BtkError(f"--set {key!r}: unknown knob; known: {', '.join(KNOB_FIELDS)}")
        if key in values:
            raise BtkError(f"--set {key} is given twice ({values[key]!r} and {value.strip()!r}): give it once")
        values[key] = value.strip()
    return values


def cmd_estimate(args: argparse.Namespace) -> int:
    from btk.catalog import get_profile
    from btk.evidence import evidence_path, read_evidence
    from btk.hardware import get_instance_type
    from btk.planner.band import band_for
    from btk.planner.evidence import correct_prediction
    from btk.planner.render import render_what_if
    from btk.planner.search import what_if

    profile = get_profile(args.profile)
    instance = get_instance_type(args.instance)
    result = what_if(profile, instance, args.nodes, parse_settings(args.settings))
    evaluation = result.evaluation
    band = band_for(instance, profile.parameter_count, evaluation.knobs.seq_len, args.nodes)
    correction = correct_prediction(profile.architecture, instance, band,
                                    read_evidence(evidence_path(args.evidence)))
    predicted = evaluation.estimate.tokens_per_second_per_gpu
    if args.output_format == JSON:
        nearest = result.nearest
        print_json(
            {
                "profile": profile.name,
                "instance_type": instance.name,
                "nodes": args.nodes,
                "start": result.start,
                "set": list(result.changed),
                **evaluation.as_json(),
                "shortfall_gib": round(evaluation.shortfall_gib, 1),
                "nearest_fitting": None
                if nearest is None
                else nearest.as_json() | {"changed": result.changed_to_fit()},
                "global_batch_tokens": result.global_batch.as_json(),
                "error_band": band.as_json(),
                "evidence": correction.as_json(predicted) if correction is not None else None,
            }
        )
    else:
        print(f"{profile.name} on {args.nodes} x {instance.name}")
        print(f"error band: {band.describe()}")
        print(render_what_if(result))
        if correction is not None:
            usd = evaluation.estimate.usd_per_billion_tokens / correction.factor
            print(f"team's evidence: {correction.describe(predicted)}; ${usd:,.0f} per billion tokens at that speed")
    if not evaluation.fits:
        print(
            f"btk: warning: {evaluation.describe_shortfall()}: this run would run out of memory",
            file=sys.stderr,
        )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from btk.catalog import get_profile
    from btk.evidence import evidence_path, read_evidence
    from btk.hardware import get_instance_type
    from btk.planner.compare import compare_instances
    from btk.planner.plot import check_plot_path, plot_compare
    from btk.planner.search import with_settings

    plot = check_plot_path(args.plot) if args.plot is not None else None
    profile = with_settings(get_profile(args.profile), parse_settings(args.settings))
    names = [name.strip() for name in args.instances.split(",") if name.strip()]
    if not names:
        raise BtkError("--instances is empty: give e.g. ml.p5.48xlarge,ml.p6-b200.48xlarge")
    instances = [get_instance_type(name) for name in names]
    evidence = read_evidence(evidence_path(args.evidence))
    comparisons = compare_instances(profile, instances, args.nodes, args.total_tokens, evidence)
    written = [plot_compare(profile.name, args.nodes, comparisons, plot)] if plot is not None else []
    if args.output_format == JSON:
        print_json({"profile": profile.name, "nodes": args.nodes, "instances": [row.to_json() for row in comparisons]})
        _say_written(written, sys.stderr)
        return 0
    from btk.planner.render import render_compare

    print(render_compare(profile.name, args.nodes, comparisons))
    _say_written(written, sys.stdout)
    return 0
