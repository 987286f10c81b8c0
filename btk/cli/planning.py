"""``btk profiles``, ``btk plan``, ``btk estimate``, ``btk compare``: the planner's CLI."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from btk.cli.arguments import max_nodes, node_count, non_empty
from btk.cli.output import JSON, add_format_argument, print_json
from btk.errors import BtkError
from btk.table import Column, Table

if TYPE_CHECKING:
    from btk.profile import ModelProfile

_NODES_HELP = f"number of instances, 1 to {max_nodes()} (default 1)"


def register(subparsers: Any) -> None:
    profiles = subparsers.add_parser("profiles", help="the profile catalog as a table")
    add_format_argument(profiles)
    profiles.set_defaults(handler=cmd_profiles)

    plan = subparsers.add_parser("plan", help="choose the knobs for a profile (or every profile of --env)")
    plan.add_argument("profile", nargs="?", type=non_empty, help="profile name (see `btk profiles`)")
    plan.add_argument(
        "--env", type=non_empty, help="plan every profile of this environment on its instance type and count"
    )
    plan.add_argument("--instance", type=non_empty, default=None, help="instance type (default ml.p6-b200.48xlarge)")
    plan.add_argument("--nodes", type=node_count, default=None, help=_NODES_HELP)
    add_format_argument(plan)
    plan.add_argument(
        "--plot", type=non_empty, metavar="FILE.png", help="draw memory and throughput of the top candidates"
    )
    plan.set_defaults(handler=cmd_plan)

    estimate = subparsers.add_parser("estimate", help="evaluate a given knob set (what-if, no search)")
    estimate.add_argument("profile", type=non_empty)
    estimate.add_argument("--instance", type=non_empty, default="ml.p6-b200.48xlarge")
    estimate.add_argument("--nodes", type=node_count, default=1, help=_NODES_HELP)
    estimate.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a knob value, e.g. --set precision=fp8_tensorwise (repeatable)",
    )
    add_format_argument(estimate)
    estimate.set_defaults(handler=cmd_estimate)

    compare = subparsers.add_parser("compare", help="best knobs, speed and cost of a profile on several instance types")
    compare.add_argument("profile", type=non_empty)
    compare.add_argument(
        "--instances",
        type=non_empty,
        default="ml.p4de.24xlarge,ml.p5.48xlarge,ml.p5en.48xlarge,ml.p6-b200.48xlarge",
        help="comma-separated instance types",
    )
    compare.add_argument("--nodes", type=node_count, default=1, help=_NODES_HELP)
    add_format_argument(compare)
    compare.set_defaults(handler=cmd_compare)


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
    ],
    gap=" ",
    rule="header",
)
"""``btk profiles``: one line per profile of the catalog."""


def cmd_profiles(args: argparse.Namespace) -> int:
    from btk.catalog import all_profiles

    profiles = list(all_profiles().values())
    if args.output_format == JSON:
        print_json([p.model_dump(mode="json") | {"parameter_count": p.parameter_count} for p in profiles])
        return 0
    print("\n".join(PROFILES_TABLE.text(profiles)))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from btk.catalog import get_environment, get_profile
    from btk.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type
    from btk.planner.plot import check_plot_path, plot_plan
    from btk.planner.search import plan_profile

    if args.env is not None and args.profile is not None:
        raise BtkError("give either a PROFILE or --env, not both")
    plot = check_plot_path(args.plot) if args.plot is not None else None
    if args.env is not None:
        env = get_environment(args.env)
        instance = get_instance_type(args.instance or env.instance_type)
        nodes = args.nodes or env.instance_count
        names = list(env.profiles)
    elif args.profile is not None:
        instance = get_instance_type(args.instance or DEFAULT_INSTANCE_TYPE)
        nodes = args.nodes or 1
        names = [args.profile]
    else:
        raise BtkError("plan needs a PROFILE (see `btk profiles`) or --env ENV")

    plans = [plan_profile(get_profile(name), instance, nodes) for name in names]
    if plot is not None:
        plot_plan(plans[0], plot)
    if args.output_format == JSON:
        print_json(plans[0].to_json() if args.profile else [plan.to_json() for plan in plans])
        return 0
    from btk.planner.render import render_plan

    if args.env:
        print(f"environment {args.env}: {len(plans)} profile(s) on {nodes} x {instance.name}\n")
    print("\n\n".join(render_plan(plan) for plan in plans))
    return 0


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
        values[key] = value.strip()
    return values


def cmd_estimate(args: argparse.Namespace) -> int:
    import sys

    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.knobs import parse_knobs
    from btk.planner.render import render_evaluation
    from btk.planner.search import evaluate_knobs

    profile = get_profile(args.profile)
    instance = get_instance_type(args.instance)
    values: dict[str, Any] = {"micro_batch_size": 1, "seq_len": profile.training.seq_len}
    values.update(profile.pinned.as_dict())
    values.update(parse_settings(args.settings))
    knobs = parse_knobs(values)
    evaluation = evaluate_knobs(profile, instance, args.nodes, knobs)
    if args.output_format == JSON:
        print_json(
            {"profile": profile.name, "instance_type": instance.name, "nodes": args.nodes, **evaluation.as_json()}
        )
    else:
        print(f"{profile.name} on {args.nodes} x {instance.name}")
        print(render_evaluation(evaluation))
    if not evaluation.fits:
        print(
            f"btk: warning: needs {evaluation.memory.total:.1f} GiB per GPU, over the "
            f"{evaluation.budget_gib:.1f} GiB budget: this run would run out of memory",
            file=sys.stderr,
        )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.compare import compare_instances

    profile = get_profile(args.profile)
    names = [name.strip() for name in args.instances.split(",") if name.strip()]
    if not names:
        raise BtkError("--instances is empty: give e.g. ml.p5.48xlarge,ml.p6-b200.48xlarge")
    comparisons = compare_instances(profile, [get_instance_type(name) for name in names], args.nodes)
    if args.output_format == JSON:
        print_json({"profile": profile.name, "nodes": args.nodes, "instances": [row.to_json() for row in comparisons]})
        return 0
    from btk.planner.render import render_compare

    print(render_compare(profile.name, args.nodes, comparisons))
    return 0
