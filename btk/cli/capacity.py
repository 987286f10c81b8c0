"""``btk capacity search`` and ``btk capacity show``: training-plan offerings and the environment's plan.

``btk.capacity`` (and with it boto3) is imported inside the handlers only, so ``btk plan``
stays fast. The SageMaker client comes from :func:`sagemaker_client`.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from btk.cli.arguments import non_empty, non_empty_path
from btk.cli.output import JSON, add_format_argument, print_json
from btk.errors import BtkError
from btk.table import Column, Table

if TYPE_CHECKING:
    from btk.capacity import Offering, ReservationRequest, TrainingPlan
    from btk.environment import EnvironmentConfig
    from btk.planner.evidence import EvidenceCorrection
    from btk.planner.search import Plan

DEFAULT_DURATION_HOURS = 7 * 24


def sagemaker_client(region: str) -> Any:
    """The SageMaker client of every call here (:mod:`btk.aws_clients`: set-up checked, waits bounded)."""
    from btk.aws_clients import make_client

    return make_client("sagemaker", region, purpose="btk-capacity")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "capacity", help="training-plan offerings and the environment's plan"
    )
    commands = parser.add_subparsers(dest="capacity_command", required=True, parser_class=type(parser))

    search = commands.add_parser("search", help="offerings for a profile, with the fee per billion tokens")
    search.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    search.add_argument(
        "--profile", type=non_empty, required=True, help="model profile whose throughput prices the tokens"
    )
    search.add_argument("--start-after", type=non_empty, help="ISO-8601 time; default: the reserve window's, else now")
    search.add_argument("--end-before", type=non_empty, help="ISO-8601 time; default: the reserve window's, else none")
    search.add_argument("--duration-hours", type=int, help=f"whole days in hours; default {DEFAULT_DURATION_HOURS}")
    search.add_argument("--instance-count", type=int, help="instances; default: the reserve count, else the env's")
    search.add_argument("--evidence", type=non_empty_path, metavar="STORE",
                        help="the team's measured runs (default: $BTK_EVIDENCE, else btk-evidence.json here)")
    search.add_argument("--require-rehearsal", action="store_true",
                        help="refuse (exit 2, before any AWS call) when the store holds no measured run of the "
                        "profile's model on the environment's instance type")
    add_format_argument(search)
    search.set_defaults(handler=_search)

    show = commands.add_parser(
        "show",
        help="the environment's plan: on-demand, existing ARN or reserve name (exit 1: the existing plan does not fit)",
    )
    show.add_argument("--env", type=non_empty, required=True, help="environment name (environments.py)")
    add_format_argument(show)
    show.set_defaults(handler=_show)


# --------------------------------------------------------------------------- search


def _search(args: argparse.Namespace) -> int:
    from btk import capacity

    env = _environment(args.env)
    request = _search_request(env, args)
    plan = _plan(env, args.profile, request.instance_count)
    profile, gpus = plan.profile.name, plan.nodes * plan.instance.gpus_per_node
    tokens_per_second_per_gpu = float(plan.evaluation.estimate.tokens_per_second_per_gpu)
    tested, rehearsed_line, correction = _team_evidence(env, plan, args.evidence)
    if args.require_rehearsal and not tested:
        raise BtkError(f"--require-rehearsal: {profile}: {rehearsed_line}")
    try:
        client = sagemaker_client(env.region)
        offerings = capacity.rank_offerings(capacity.search_offerings(client, request), env.availability_zone)
    except capacity.CapacityError as error:
        raise BtkError(str(error)) from None

    rows = _best_value_first([_offering_row(offering, env, tokens_per_second_per_gpu, gpus) for offering in offerings])
    if args.output_format == JSON:
        print_json(
            {
                "environment": env.name,
                "profile": profile,
                "instance_type": request.instance_type,
                "instance_count": request.instance_count,
                "start_after": capacity.iso(request.start_after),
                "end_before": capacity.iso(request.end_before) if request.end_before else None,
                "duration_hours": request.duration_hours,
                "availability_zone": env.availability_zone,
                "tokens_per_second_per_gpu": tokens_per_second_per_gpu,
                "gpus": gpus,
                "runs_on_record": list(tested),
                "evidence": correction.as_json(tokens_per_second_per_gpu) if correction is not None else None,
                "offerings": rows,
            },
            sort_keys=True,
        )
        return 0
    window = request.describe_window()
    print(f"{env.name}: training-plan offerings for {window} (AZ {env.availability_zone})")
    print(f"{profile}: {tokens_per_second_per_gpu:,.0f} tokens/s/GPU x {gpus} GPUs (planner)")
    print(rehearsed_line)
    if correction is not None:
        print(f"the team's evidence: {len(correction.runs)} measured run(s) at x{correction.factor:.3f} of the "
              f"planner's speed; at it each fee per billion tokens below is x{1 / correction.factor:.3f}")
    if not rows:
        print("no offerings: widen the window (--start-after/--end-before) or change --duration-hours")
        return 0
    print("\n".join(OFFERINGS_TABLE.text(rows)))
    return 0


def _search_request(env: EnvironmentConfig, args: argparse.Namespace) -> ReservationRequest:
    from btk import capacity
    from btk.environment import (
        TRAINING_PLAN_INSTANCE_COUNTS,
        TRAINING_PLAN_MAX_HOURS,
        ReservePlanCapacity,
        is_sellable_plan_duration,
    )

    if env.instance_type not in capacity.plan_instance_types():
        raise BtkError(f"environment {env.name}: instance_type {env.instance_type} is not sold as a training plan")
    reserve = env.capacity if isinstance(env.capacity, ReservePlanCapacity) else None
    if args.start_after is not None:
        start = _parse_time(args.start_after, "--start-after")
    else:
        start = reserve.start_after if reserve else datetime.now(UTC).replace(microsecond=0)
    if args.end_before is not None:
        end: datetime | None = _parse_time(args.end_before, "--end-before")
    else:
        end = reserve.end_before if reserve else None
    if args.duration_hours is not None:
        duration = args.duration_hours
    else:
        duration = reserve.duration_hours if reserve else DEFAULT_DURATION_HOURS
    if args.instance_count is not None:
        count = args.instance_count
    else:
        count = reserve.instance_count if reserve else env.instance_count
    if args.duration_hours is not None and not is_sellable_plan_duration(duration):
        raise BtkError(f"--duration-hours {duration}: use whole days, 24 to {TRAINING_PLAN_MAX_HOURS} hours")
    if args.instance_count is not None and count not in TRAINING_PLAN_INSTANCE_COUNTS:
        allowed = ", ".join(map(str, TRAINING_PLAN_INSTANCE_COUNTS))
        raise BtkError(f"--instance-count {count} is not sold: use one of {allowed}")
    if end is not None and end <= start:
        raise BtkError("--end-before must be after --start-after")
    ultraserver_type, ultraserver_count = capacity.ultraserver_booking(
        env.instance_type, count, reserve.ultraserver_type if reserve else None
    )
    return capacity.ReservationRequest(
        environment=env.name,
        instance_type=env.instance_type,
        instance_count=count,
        start_after=start,
        end_before=end,
        duration_hours=duration,
        availability_zone=env.availability_zone,
        ultraserver_type=ultraserver_type,
        ultraserver_count=ultraserver_count,
    )


def _parse_time(text: str, option: str) -> datetime:
    """``text`` as a UTC instant; one line when it is no ISO-8601 time or lies outside years 1 to 9999 in UTC."""
    from btk import capacity

    try:
        return capacity.parse_iso(text, option)
    except capacity.CapacityError as error:
        raise BtkError(str(error)) from None
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise BtkError(f"{option} {text!r} is out of range: give a time between years 1 and 9999 in UTC") from None


def _plan(env: EnvironmentConfig, profile_name: str, nodes: int) -> Plan:
    """The profile's plan for ``nodes`` instances of the env's type (its speed prices the tokens)."""
    from btk.catalog import get_profile
    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    return plan_profile(get_profile(profile_name), get_instance_type(env.instance_type), nodes)


def _team_evidence(env: EnvironmentConfig, plan: Plan, store_option: Path | None,
                   ) -> tuple[tuple[str, ...], str, EvidenceCorrection | None]:
    """The measured runs of the plan's model on the environment's instance type in the evidence store, the line
    that says so, and the plan's speed corrected by them."""
    from btk.evidence import evidence_path, read_evidence
    from btk.planner.evidence import correct_plan, rehearsal_record_line, runs_on_record

    store = evidence_path(store_option)
    evidence = read_evidence(store)
    runs = runs_on_record(evidence, plan.profile.architecture, env.instance_type)
    return runs, rehearsal_record_line(runs, env.instance_type, store), correct_plan(plan, evidence)


def _offering_row(offering: Offering, env: EnvironmentConfig, tokens_per_second: float, gpus: int) -> dict[str, Any]:
    """The offering's JSON plus whether it is in the environment's AZ and its tokens and fee per billion."""
    from btk.planner.cost import plan_fee_per_billion_tokens, plan_tokens_billion, usable_plan_hours

    row = offering.to_json()
    row["in_environment_az"] = offering.in_zone(env.availability_zone)
    row["usable_hours"] = round(usable_plan_hours(offering.duration_hours), 2)
    row["tokens_billion"] = round(plan_tokens_billion(tokens_per_second, gpus, offering.duration_hours), 3)
    fee = plan_fee_per_billion_tokens(offering.upfront_fee, tokens_per_second, gpus, offering.duration_hours)
    row["fee_per_billion_tokens"] = round(fee, 2) if fee is not None else None
    return row


def _best_value_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Offerings in the environment's AZ first (only they can be bought), then by fee per billion
    trainable tokens (unknown fees last), then by start and id: what a billion tokens costs on each."""

    def key(row: dict[str, Any]) -> tuple[bool, bool, float, str, str]:
        fee = row["fee_per_billion_tokens"]
        return (not row["in_environment_az"], fee is None, fee or 0.0, row["start_time"] or "~", row["offering_id"])

    return sorted(rows, key=key)


def _fee(value: float | None) -> str:
    return f"{value:,.2f}" if value is not None else "?"


def _zones(row: dict[str, Any]) -> str:
    zones = "+".join(row["availability_zones"]) or "?"
    return zones if row["in_environment_az"] else f"{zones} (other AZ)"


OFFERINGS_TABLE: Table[dict[str, Any]] = Table(
    [
        Column("offering", lambda row: row["offering_id"]),
        Column("upfront fee", lambda row: _fee(row["upfront_fee"])),
        Column("cur", lambda row: row["currency"] or "?"),
        Column("start", lambda row: _short(row["start_time"])),
        Column("end", lambda row: _short(row["end_time"])),
        Column("AZ", _zones),
        Column("inst", lambda row: str(row["instance_count"])),
        Column("hours", lambda row: f"{row['duration_hours']:g}"),
        Column("B tokens", lambda row: f"{row['tokens_billion']:,.1f}"),
        Column("fee/B tok", lambda row: _fee(row["fee_per_billion_tokens"])),
    ],
    rule="none",
)
"""One line per offering, every column left-aligned (the rows of ``btk capacity search --format json``)."""


def _short(value: str | None) -> str:
    return value.replace("+00:00", "Z") if value else "?"


# --------------------------------------------------------------------------- show


def _show(args: argparse.Namespace) -> int:
    from btk import capacity
    from btk.environment import ExistingPlanCapacity, ReservePlanCapacity

    env = _environment(args.env)
    config = env.capacity
    result: dict[str, Any] = {"environment": env.name, "mode": config.mode}
    lines: list[str] = []
    if isinstance(config, ExistingPlanCapacity):
        result["plan_arn"] = config.plan_arn
        plan = _describe(env, config.plan_arn)
        if plan is None:
            raise BtkError(f"environment {env.name}: capacity.plan_arn {config.plan_arn} does not exist: fix the ARN")
        problems = capacity.plan_problems(
            plan,
            instance_type=env.instance_type,
            availability_zone=env.availability_zone,
            instance_count=env.instance_count,
        )
        result.update(plan=plan.to_json(), problems=problems)
        lines.append(f"{env.name}: existing training plan {config.plan_arn}")
        lines.extend(_plan_lines(plan))
        lines.append("fits the environment" if not problems else "does NOT fit the environment: " + "; ".join(problems))
    elif isinstance(config, ReservePlanCapacity):
        request = capacity.reservation_request(env)
        name = request.plan_name()
        result.update(
            plan_name=name,
            reservation=request.to_properties(),
            max_upfront_fee=config.max_upfront_fee,
            purchase_approved=config.purchase_approved,
        )
        window = request.describe_window()
        if request.end_before is not None:
            window += f", ending before {capacity.iso(request.end_before)}"
        lines.append(f"{env.name}: reserve {window} in {env.availability_zone}")
        lines.append(
            f"plan name {name}; max_upfront_fee {config.max_upfront_fee:,.2f} USD; "
            f"purchase_approved {str(config.purchase_approved).lower()}"
        )
        plan = _describe(env, name)
        result["plan"] = plan.to_json() if plan else None
        if plan is None:
            lines.append("not bought yet: the next deploy buys the best offering within the ceiling in this AZ")
        else:
            lines.extend(_plan_lines(plan))
        others = [
            other
            for other in _list(env, capacity.plan_name_prefix(env.name))
            if other.name != name and capacity.is_environment_plan(other.name, env.name)
        ]
        result["other_plans"] = [other.to_json() for other in others]
        for other in others:
            lines.append(f"other plan of {env.name} (earlier reservation inputs): {other.name} {other.status}")
    else:
        lines.append(f"{env.name}: capacity on_demand: no training plan; jobs run on on-demand capacity")
    _emit(args.output_format, result, lines)
    # An existing plan that does not fit would fail the deploy: say so in the exit status too.
    return 1 if result.get("problems") else 0


def _plan_lines(plan: TrainingPlan) -> list[str]:
    from btk import capacity

    start = capacity.iso(plan.start_time) if plan.start_time else "?"
    end = capacity.iso(plan.end_time) if plan.end_time else "?"
    zones = "+".join(plan.availability_zones) or "?"
    types = "+".join(plan.instance_types) or "?"
    return [
        f"plan {plan.name}: {plan.status}" + (f" ({plan.status_message})" if plan.status_message else ""),
        f"  {plan.total_instance_count} x {types} in {zones}, {start} -> {end}",
        f"  up-front fee {capacity.format_fee(plan.upfront_fee, plan.currency)}; targets "
        + ("+".join(plan.target_resources) or "?"),
        "  a plan cannot be deleted: it expires on its end date",
    ]


def _describe(env: EnvironmentConfig, name_or_arn: str) -> TrainingPlan | None:
    from btk import capacity

    try:
        return capacity.describe_plan(sagemaker_client(env.region), name_or_arn)
    except capacity.CapacityError as error:
        raise BtkError(str(error)) from None


def _list(env: EnvironmentConfig, prefix: str) -> list[TrainingPlan]:
    from btk import capacity

    try:
        return capacity.list_plans(sagemaker_client(env.region), prefix)
    except capacity.CapacityError as error:
        raise BtkError(str(error)) from None


def _emit(output_format: str, result: dict[str, Any], lines: list[str]) -> None:
    if output_format == JSON:
        print_json(result, sort_keys=True)
    else:
        print("\n".join(lines))


def _environment(name: str) -> EnvironmentConfig:
    from btk import catalog

    return catalog.get_environment(name)
