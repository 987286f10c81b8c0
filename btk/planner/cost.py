"""What a billion tokens costs: the tokens a set of GPUs trains in some hours, and a price spread over them.

The planner prices on-demand instance-hours this way (``throughput``), and ``btk capacity
search`` prices a training plan's up-front fee the same way, so the two figures compare.
:class:`TrainingCost` is a whole run: a profile's ``training.total_tokens`` in days and dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from btk.capacity import CAPACITY_STOP_MARGIN_SECONDS, CAPACITY_TERMINATION_LEAD_SECONDS
from btk.environment import TRAINING_PLAN_MAX_DAYS, CapacityConfig, ReservePlanCapacity
from btk.units import HOURS_PER_DAY, SECONDS_PER_HOUR

TOKENS_PER_BILLION = 1e9


def tokens_billion(tokens_per_second_per_gpu: float, gpus: int, hours: float) -> float:
    """Billions of tokens ``gpus`` GPUs train in ``hours`` at ``tokens_per_second_per_gpu`` each."""
    return tokens_per_second_per_gpu * gpus * hours * SECONDS_PER_HOUR / TOKENS_PER_BILLION


def fee_per_billion_tokens(
    fee: float | None, tokens_per_second_per_gpu: float, gpus: int, hours: float
) -> float | None:
    """``fee`` divided by the billions of tokens trained in ``hours``; None without a fee or without tokens."""
    billions = tokens_billion(tokens_per_second_per_gpu, gpus, hours)
    if fee is None or billions <= 0:
        return None
    return fee / billions


def usable_plan_hours(duration_hours: float) -> float:
    """Hours of a training plan that train: its duration less the termination lead and the final checkpoint.

    SageMaker terminates a plan's instances :data:`~btk.capacity.CAPACITY_TERMINATION_LEAD_SECONDS`
    before the capacity ends, and the trainer stops
    :data:`~btk.capacity.CAPACITY_STOP_MARGIN_SECONDS` before that to write and upload its last
    checkpoint; neither stretch trains tokens, and a plan's fee pays for both.
    """
    return max(0.0, duration_hours - plan_overhead_hours())


def plan_overhead_hours() -> float:
    """Hours of every training plan that do not train: the termination lead and the final checkpoint."""
    return (CAPACITY_TERMINATION_LEAD_SECONDS + CAPACITY_STOP_MARGIN_SECONDS) / SECONDS_PER_HOUR


def plan_tokens_billion(tokens_per_second_per_gpu: float, gpus: int, duration_hours: float) -> float:
    """Billions of tokens a training plan of ``duration_hours`` trains (its usable hours only)."""
    return tokens_billion(tokens_per_second_per_gpu, gpus, usable_plan_hours(duration_hours))


def plan_fee_per_billion_tokens(
    fee: float | None, tokens_per_second_per_gpu: float, gpus: int, duration_hours: float
) -> float | None:
    """A training plan's up-front fee per billion tokens it can actually train."""
    return fee_per_billion_tokens(fee, tokens_per_second_per_gpu, gpus, usable_plan_hours(duration_hours))


PLAN_FEE_NOTE = "plan fees are quoted per offering by AWS, not in the catalog: `btk capacity search` prices one"


@dataclass(frozen=True)
class TrainingCost:
    """What training ``total_tokens`` takes at a predicted speed: on demand, and on training plans.

    On demand is priced at the catalog's hourly price. A training plan's fee is not in the
    catalog (AWS quotes it per offering), so the plan side says how many plans of
    ``plan_duration_hours`` the run needs and how many days they book, each plan training only
    its :func:`usable_plan_hours`; it never guesses the fee.
    """

    total_tokens: int
    training_hours: float
    """Wall-clock hours at the predicted speed, on capacity that is never taken away."""
    on_demand_usd: float
    plan_duration_hours: int
    plans: int

    @property
    def on_demand_days(self) -> float:
        return self.training_hours / HOURS_PER_DAY

    @property
    def usable_hours_per_plan(self) -> float:
        return usable_plan_hours(self.plan_duration_hours)

    @property
    def plan_days_booked(self) -> float:
        return self.plans * self.plan_duration_hours / HOURS_PER_DAY

    def as_json(self) -> dict[str, Any]:
        return {
            "total_tokens": self.total_tokens,
            "on_demand": {"days": round(self.on_demand_days, 2), "usd": round(self.on_demand_usd)},
            "training_plan": {
                "duration_hours": self.plan_duration_hours,
                "usable_hours_per_plan": round(self.usable_hours_per_plan, 2),
                "plans": self.plans,
                "days_booked": round(self.plan_days_booked, 2),
                "fee_usd": None,
                "fee_note": PLAN_FEE_NOTE,
            },
        }


def shortest_covering_plan_hours(training_hours: float) -> int:
    """The shortest sellable plan (whole days, at most the longest sold) whose usable hours cover ``training_hours``."""
    overhead = plan_overhead_hours()
    days = max(1, math.ceil((training_hours + overhead) / HOURS_PER_DAY - 1e-9))
    return min(days, TRAINING_PLAN_MAX_DAYS) * HOURS_PER_DAY


def training_cost(
    total_tokens: int,
    tokens_per_second_per_gpu: float,
    gpus: int,
    cluster_usd_per_hour: float,
    plan_duration_hours: int | None = None,
) -> TrainingCost:
    """Days and dollars to train ``total_tokens``.

    The plan side uses plans of ``plan_duration_hours``; by default the shortest one that covers the run.
    """
    training_hours = total_tokens / TOKENS_PER_BILLION / tokens_billion(tokens_per_second_per_gpu, gpus, 1.0)
    duration = plan_duration_hours or shortest_covering_plan_hours(training_hours)
    usable = usable_plan_hours(duration)
    plans = max(1, math.ceil(training_hours / usable - 1e-9)) if usable > 0 else 0
    return TrainingCost(
        total_tokens=total_tokens,
        training_hours=training_hours,
        on_demand_usd=training_hours * cluster_usd_per_hour,
        plan_duration_hours=duration,
        plans=plans,
    )


def reserved_plan_hours(capacity: CapacityConfig) -> int | None:
    """The plan length an environment reserves (``capacity.duration_hours``), or None when it reserves none."""
    return capacity.duration_hours if isinstance(capacity, ReservePlanCapacity) else None
