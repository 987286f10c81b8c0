"""``btk profiles``, ``btk plan``, ``btk estimate``, ``btk compare``: the planner's CLI."""

from __future__ import annotations

import argparse
import json
from typing import Any

from btk.errors import BtkError


def register(subparsers: Any) -> None:
    profiles = subparsers.add_parser("profiles", help="the profile catalog as a table")
    profiles.add_argument("--json", action="store_true", help="print JSON instead of a table")
    profiles.set_defaults(handler=cmd_profiles)

    plan = subparsers.add_parser("plan", help="choose the knobs for a profile (or every profile of --env)")
    plan.add_argument("profile", nargs="?", help="profile name (see `btk profiles`)")
    plan.add_argument("--env", help="plan every profile of this environment on its instance type and count")
    plan.add_argument("--instance", default=None, help="instance type (default ml.p6-b200.48xlarge)")
    plan.add_argument("--nodes", type=_positive_int, default=None, help="number of instances (default 1)")
    plan.add_argument("--json", action="store_true", help="print the documented JSON object")
    plan.add_argument("--plot", metavar="FILE.png", help="draw memory and throughput of the top candidates")
    plan.set_defaults(handler=cmd_plan)

    estimate = subparsers.add_parser("estimate", help="evaluate a given knob set (what-if, no search)")
    estimate.add_argument("profile")
    estimate.add_argument("--instance", default="ml.p6-b200.48xlarge")
    estimate.add_argument("--nodes", type=_positive_int, default=1)
    estimate.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a knob value, e.g. --set precision=fp8_tensorwise (repeatable)",
    )
    estimate.add_argument("--json", action="store_true")
    estimate.set_defaults(handler=cmd_estimate)

    compare = subparsers.add_parser("compare", help="best knobs, speed and cost of a profile on several instance types")
    compare.add_argument("profile")
    compare.add_argument(
        "--instances",
        default="ml.p4de.24xlarge,ml.p5.48xlarge,ml.p5en.48xlarge,ml.p6-b200.48xlarge",
        help="comma-separated instance types",
    )
    compare.add_argument("--nodes", type=_positive_int, default=1)
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(handler=cmd_compare)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def cmd_profiles(args: argparse.Namespace) -> int:
    from btk.catalog import all_profiles

    profiles = list(all_profiles().values())
    if args.json:
        print(
            json.dumps([p.model_dump(mode="json") | {"parameter_count": p.parameter_count} for p in profiles], indent=2)
        )
        return 0
    header = (
        f"{'profile':<14} {'family':<7} {'params':>8} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} "
        f"{'ffn':>6} {'vocab':>7} {'tied':>4} {'seq':>6} {'batch tok':>10}"
    )
    print(header)
    print("-" * len(header))
    for p in profiles:
        a = p.architecture
        print(
            f"{p.name:<14} {p.family:<7} {p.parameter_count / 1e9:7.2f}B {a.num_layers:>6} {a.hidden_size:>6} "
            f"{a.num_attention_heads:>5} {a.num_kv_heads:>3} {a.ffn_hidden_size:>6} {a.vocab_size:>7} "
            f"{'yes' if a.tied_embeddings else 'no':>4} {p.training.seq_len:>6} {p.training.global_batch_tokens:>10,}"
        )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from btk.catalog import get_environment, get_profile
    from btk.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type
    from btk.planner.search import plan_profile

    if args.env and args.profile:
        raise BtkError("give either a PROFILE or --env, not both")
    if args.env:
        env = get_environment(args.env)
        instance = get_instance_type(args.instance or env.instance_type)
        nodes = args.nodes or env.instance_count
        names = list(env.profiles)
    elif args.profile:
        instance = get_instance_type(args.instance or DEFAULT_INSTANCE_TYPE)
        nodes = args.nodes or 1
        names = [args.profile]
    else:
        raise BtkError("plan needs a PROFILE (see `btk profiles`) or --env ENV")

    plans = [plan_profile(get_profile(name), instance, nodes) for name in names]
    if args.plot:
        from btk.planner.plot import plot_plan

        plot_plan(plans[0], args.plot)
    if args.json:
        output: Any = plans[0].to_json() if args.profile else [plan.to_json() for plan in plans]
        print(json.dumps(output, indent=2))
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
            raise BtkError(f"--set {key}: unknown knob; known: {', '.join(KNOB_FIELDS)}")
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
    if args.json:
        print(
            json.dumps(
                {"profile": profile.name, "instance_type": instance.name, "nodes": args.nodes, **evaluation.as_json()},
                indent=2,
            )
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
    from btk.errors import InfeasiblePlanError
    from btk.hardware import get_instance_type
    from btk.planner.search import longest_sequence_one_node, plan_profile

    profile = get_profile(args.profile)
    names = [name.strip() for name in args.instances.split(",") if name.strip()]
    if not names:
        raise BtkError("--instances is empty: give e.g. ml.p5.48xlarge,ml.p6-b200.48xlarge")
    instances = [get_instance_type(name) for name in names]
    rows = []
    for instance in instances:
        longest = longest_sequence_one_node(profile, instance)
        try:
            plan = plan_profile(profile, instance, args.nodes)
        except InfeasiblePlanError as error:
            rows.append(
                {
                    "instance_type": instance.name,
                    "fits": False,
                    "reason": str(error),
                    "longest_seq_len_one_node": longest,
                }
            )
            continue
        rows.append(
            {
                "instance_type": instance.name,
                "fits": True,
                "knobs": plan.knobs.model_dump(),
                "tokens_per_second_per_gpu": round(plan.evaluation.estimate.tokens_per_second_per_gpu, 1),
                "tokens_per_second_per_node": round(
                    plan.evaluation.estimate.tokens_per_second_per_gpu * instance.gpus_per_node, 1
                ),
                "mfu": round(plan.evaluation.estimate.mfu, 4),
                "usd_per_billion_tokens": round(plan.evaluation.estimate.usd_per_billion_tokens, 2),
                "memory_gib": round(plan.evaluation.memory.total, 1),
                "longest_seq_len_one_node": longest,
            }
        )
    if args.json:
        print(json.dumps({"profile": profile.name, "nodes": args.nodes, "instances": rows}, indent=2))
        return 0
    from btk.planner.render import render_compare

    print(render_compare(profile.name, args.nodes, rows))
    return 0
