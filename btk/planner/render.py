"""Human-readable tables for plans, estimates and comparisons (plain text, no deps).

Each figure has one formatting function here, used by every command that prints it, so the
same value reads the same in ``btk plan``, ``btk estimate`` and ``btk compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from btk.knobs import TrainingKnobs
from btk.planner.compare import InstanceComparison, PlannedFigures
from btk.planner.cost import PLAN_FEE_NOTE, TrainingCost
from btk.planner.evidence import EvidenceCorrection
from btk.planner.memory import MemoryBreakdown
from btk.planner.search import Evaluation, GlobalBatch, Plan, RehearsalGate, Scaling, WhatIf
from btk.planner.throughput import MFU_PEAK
from btk.table import Column, Table

MEMORY_ROWS = ("parameters", "gradients", "optimizer", "activations", "logits", "other", "total", "capacity")


def format_mfu(mfu: float) -> str:
    """Model FLOPs utilisation, one decimal of a per cent: ``52.2%``."""
    return f"{mfu:.1%}"


def format_speed(tokens_per_second: float) -> str:
    """Tokens per second, whole tokens with thousands separators."""
    return f"{tokens_per_second:,.0f}"


def format_usd(usd: float) -> str:
    """Whole dollars with thousands separators."""
    return f"${usd:,.0f}"


def format_days(days: float) -> str:
    return f"{days:,.1f} days"


def format_tokens(tokens: int) -> str:
    """A token count the way profiles give it: ``300B``, ``1.4T``, ``750M``."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if tokens >= scale:
            return f"{tokens / scale:,.4g}{suffix}"
    return f"{tokens:,}"


def _knob_line(knobs: TrainingKnobs) -> str:
    k = knobs
    return (
        f"mb={k.micro_batch_size} ga={k.gradient_accumulation_steps} seq={k.seq_len} {k.precision} "
        f"ac={k.activation_checkpointing} {k.sharding} tp={k.tensor_parallel}{context_parallel_suffix(k)} "
        f"compile={'on' if k.compile else 'off'} fused_loss={'on' if k.fused_loss else 'off'}"
    )


def context_parallel_suffix(knobs: TrainingKnobs) -> str:
    """`` cp=N`` where the plan shares each sequence between N GPUs; nothing without context parallelism."""
    return f" cp={knobs.context_parallel}" if knobs.context_parallel > 1 else ""


def _memory_row(memory: MemoryBreakdown, name: str) -> str:
    """One part of the breakdown; a part that is zero says why."""
    value = getattr(memory, name)
    text = f"{name} {value:.1f}"
    if value == 0 and name == "logits" and memory.peak_phase == "backward":
        text += " (freed before the backward peak)"
    elif value == 0 and name == "other":
        text += " (nothing gathered: unsharded)"
    return text


def render_evaluation(evaluation: Evaluation) -> str:
    """Knobs, memory and, where they fit, speed and price; where they do not, the shortfall and no price."""
    e, m = evaluation.estimate, evaluation.memory
    lines = [f"  knobs     {_knob_line(evaluation.knobs)}"]
    lines.append("  memory    " + "  ".join(_memory_row(m, name) for name in MEMORY_ROWS) + " GiB")
    if not evaluation.fits:
        lines.append(f"  DOES NOT FIT: {evaluation.describe_shortfall()}: it cannot run, so it has no speed or price")
        return "\n".join(lines)
    lines.append(
        f"  estimate  {format_speed(e.tokens_per_second_per_gpu)} tokens/s/GPU  MFU {format_mfu(e.mfu)} of {MFU_PEAK}  "
        f"step {e.step_seconds:.2f} s  {format_usd(e.usd_per_billion_tokens)} per billion tokens  (fits: yes)"
    )
    return "\n".join(lines)


def render_global_batch(batch: GlobalBatch) -> list[str]:
    """A note when whole micro-batches cannot reach the profile's global batch exactly."""
    if not batch.rounded:
        return []
    return [
        f"note: global batch {batch.planned_tokens:,} tokens, not the requested {batch.requested_tokens:,}: "
        "rounded up to whole micro-batches on every data-parallel rank"
    ]


def render_training_cost(cost: TrainingCost | None) -> list[str]:
    """Days and dollars to train the profile's ``training.total_tokens``."""
    if cost is None:
        return ["to train: the profile sets no training.total_tokens"]
    plan_days = cost.plan_duration_hours / 24
    return [
        f"to train {format_tokens(cost.total_tokens)} tokens (training.total_tokens) at this speed:",
        f"  on demand       {format_days(cost.on_demand_days)}, {format_usd(cost.on_demand_usd)} at the catalog price",
        f"  training plans  {cost.plans} x {plan_days:g}-day plan: {format_days(cost.plan_days_booked)} booked, "
        f"each plan training {cost.usable_hours_per_plan:g} of its {cost.plan_duration_hours} h",
        f"                  {PLAN_FEE_NOTE}",
    ]


def render_scaling(plan: Plan) -> list[str]:
    """On several nodes: tokens/s/GPU against the one-node plan, and the communication the step waits for."""
    scaling = plan.scaling
    if scaling is None:
        return []
    estimate = plan.evaluation.estimate
    waits = (
        f"the step waits {estimate.exposed_communication_seconds:.2f} s of its {estimate.step_seconds:.2f} s "
        "for communication"
    )
    if scaling.efficiency is None or scaling.one_node_tokens_per_second_per_gpu is None:
        return [f"scaling: the profile does not fit one node, so no one-node figure to compare; {waits}"]
    lines = [
        f"scaling: {scaling.efficiency:.1%} of the one-node plan's "
        f"{format_speed(scaling.one_node_tokens_per_second_per_gpu)} tokens/s/GPU on {scaling.nodes} nodes; {waits}"
    ]
    changes = scaling.knob_changes()
    if scaling.efficiency > 1:
        lines.append(f"  above 100%: {_scaling_reason(scaling, changes)}")
    elif changes:
        lines.append(f"  knobs differ from the one-node plan: {_knob_changes(changes)}")
    return lines


def _knob_changes(changes: dict[str, list[object]]) -> str:
    return ", ".join(f"{name} {one} -> {here}" for name, (one, here) in changes.items())


def _scaling_reason(scaling: Scaling, changes: dict[str, list[object]]) -> str:
    """Why tokens/s per GPU on several nodes exceeds one node's, and so why a billion tokens costs less."""
    if not changes:
        return (
            "the same knobs as the one-node plan with fewer gradient-accumulation steps per GPU, "
            "for which the throughput model predicts more tokens per GPU-second"
        )
    if scaling.knobs_on_one_node is not None:
        return (
            f"{_knob_changes(changes)}: on {scaling.nodes} nodes each GPU holds a smaller shard of the model "
            f"state, and that memory pays for knobs one node cannot hold (on one node: {scaling.knobs_on_one_node}); "
            "they do more work per GPU-second, so a billion tokens costs less than on one node"
        )
    return (
        f"{_knob_changes(changes)}: these knobs fit one node too, but with this node count's batch shape the "
        "throughput model predicts them faster per GPU than the one-node plan's"
    )


def render_plan(plan: Plan, plan_duration_hours: int | None = None, rehearsal: RehearsalGate | None = None,
                correction: EvidenceCorrection | None = None) -> str:
    best = plan.evaluation
    header = (
        f"{plan.profile.name} ({plan.profile.parameter_count / 1e9:.2f}B) on {plan.nodes} x {plan.instance.name} "
        f"({plan.nodes * plan.instance.gpus_per_node} x {plan.instance.gpu.name}, budget {best.budget_gib:.0f} GiB/GPU)"
    )
    lines = [header, f"error band: {plan.band.describe()}"]
    if correction is not None:
        lines.append(f"team's evidence: {correction.describe(best.estimate.tokens_per_second_per_gpu)}")
    lines += ["plan:", render_evaluation(best)]
    lines += render_global_batch(plan.global_batch)
    lines += render_scaling(plan)
    cost = plan.training_cost(plan_duration_hours)
    lines += render_training_cost(cost)
    if cost is not None and correction is not None:
        lines.append(f"  at the team's measured speed (x{correction.factor:.3f}): "
                     f"{format_days(cost.on_demand_days / correction.factor)}, "
                     f"{format_usd(cost.on_demand_usd / correction.factor)} on demand")
    lines.append(plan.stop_save.describe())
    if rehearsal is not None:
        lines.append(
            f"rehearsal first: {rehearsal.steps} steps on {rehearsal.nodes} x {plan.instance.name}, about "
            f"{rehearsal.training_seconds / 60:.0f} min of training (${rehearsal.usd:,.0f}) plus start-up and "
            f"compilation; the long run starts only at >= {format_speed(rehearsal.min_tokens_per_second_per_gpu)} "
            f"tokens/s/GPU (of {format_speed(rehearsal.predicted_tokens_per_second_per_gpu)} predicted for it) "
            f"with no non-finite step, peak memory within {rehearsal.max_peak_memory_gib:,.1f} GiB/GPU"
            f"{' and the loss falling' if rehearsal.require_falling_loss else ''}")
    lines.append("why:")
    lines += [f"  - {line}" for line in plan.explanations]
    if plan.baseline is not None:
        lines += [
            "legacy baseline (full checkpointing, micro-batch 1, bf16, full shard, eager loss):",
            render_evaluation(plan.baseline),
        ]
        lines.append(f"speed-up over the legacy baseline: {plan.speedup_vs_baseline:.2f}x")
    else:
        lines.append("legacy baseline: does not fit on this cluster")
    if plan.ladder:
        lines.append("if the job runs out of memory before its first checkpoint, it steps down to:")
        for number, rung in enumerate(plan.ladder, start=1):
            speed = format_speed(rung.estimate.tokens_per_second_per_gpu)
            lines.append(f"  {number}. {speed:>9} tok/s/GPU  {rung.memory.total:6.1f} GiB  {_knob_line(rung.knobs)}")
    if plan.alternatives:
        lines.append("top alternatives:")
        for alternative in plan.alternatives:
            speed = format_speed(alternative.estimate.tokens_per_second_per_gpu)
            lines.append(
                f"  {speed:>9} tok/s/GPU  {alternative.memory.total:6.1f} GiB  {_knob_line(alternative.knobs)}"
            )
    return "\n".join(lines)


def render_what_if(what_if: WhatIf) -> str:
    """``btk estimate``'s text: where the knobs came from, their evaluation and the global batch."""
    changed = f"; set: {', '.join(what_if.changed)}" if what_if.changed else ""
    source = "the plan for this cluster" if what_if.start == "plan" else "micro-batch 1 (no plan fits this cluster)"
    lines = [f"starting from {source}{changed}", render_evaluation(what_if.evaluation)]
    batch = what_if.global_batch
    if what_if.accumulation_recomputed:
        lines.append(
            f"gradient accumulation {what_if.evaluation.knobs.gradient_accumulation_steps}: recomputed to keep the "
            f"profile's {batch.requested_tokens:,}-token global batch"
        )
    elif batch.planned_tokens != batch.requested_tokens:
        lines.append(
            f"note: global batch {batch.planned_tokens:,} tokens, not the profile's {batch.requested_tokens:,}"
        )
    if what_if.evaluation.fits:
        return "\n".join(lines)
    if what_if.nearest is None:
        lines.append("no searched knob set fits this cluster at this seq_len: add nodes or shorten the sequence")
        return "\n".join(lines)
    changes = what_if.changed_to_fit()
    lines.append(f"nearest knobs that fit ({len(changes)} changed: {', '.join(changes)}):")
    lines.append(render_evaluation(what_if.nearest))
    return "\n".join(lines)


def _compare_knobs(comparison: InstanceComparison) -> str:
    if comparison.planned is None:
        return ""
    k = comparison.planned.knobs
    return (f"mb={k.micro_batch_size} {k.precision} ac={k.activation_checkpointing} {k.sharding} "
            f"tp={k.tensor_parallel}{context_parallel_suffix(k)}")


def _planned_cell(text: Callable[[PlannedFigures], str], missing: str = "") -> Callable[[InstanceComparison], str]:
    """A cell from the planned figures, or ``missing`` where no knob set fits."""
    return lambda comparison: missing if comparison.planned is None else text(comparison.planned)


def _cost_cell(text: Callable[[TrainingCost], str]) -> Callable[[PlannedFigures], str]:
    """A cell from the cost of training ``training.total_tokens`` (``-`` when the profile sets none)."""
    return lambda planned: "-" if planned.training_cost is None else text(planned.training_cost)


def _longest(comparison: InstanceComparison) -> str:
    return f"{comparison.longest_seq_len_one_node:,}" if comparison.longest_seq_len_one_node else "does not fit"


def _rank(comparison: InstanceComparison) -> str:
    """``1``; ``1-3`` where the error bands leave the place open; ``?`` outside the evidence; ``-`` misfit."""
    rank = comparison.cost_rank
    if comparison.planned is None:
        return "-"
    if rank is None:
        return "?"
    return rank.label()


COMPARE_TABLE: Table[InstanceComparison] = Table(
    [
        Column("rank", _rank, "right", 5),
        Column("instance type", lambda c: c.instance_type, "left", 22),
        Column("GPU", lambda c: c.gpu, "left", 12),
        Column(
            "tok/s/GPU", _planned_cell(lambda p: format_speed(p.tokens_per_second_per_gpu), "does not fit"), "right", 10
        ),
        Column("tok/s/node", _planned_cell(lambda p: format_speed(p.tokens_per_second_per_node)), "right", 11),
        Column("MFU", _planned_cell(lambda p: format_mfu(p.mfu)), "right", 6),
        Column("$/B tokens", _planned_cell(lambda p: f"{p.usd_per_billion_tokens:,.0f}"), "right", 11),
        Column("GiB", _planned_cell(lambda p: f"{p.memory_gib:.1f}"), "right", 6),
        Column("days", _planned_cell(_cost_cell(lambda c: f"{c.on_demand_days:,.1f}")), "right", 6),
        Column("$ to train", _planned_cell(_cost_cell(lambda c: f"{c.on_demand_usd:,.0f}")), "right", 11),
        Column("longest seq (1 node, TP 1)", _longest, "right", 27),
        Column("knobs", _compare_knobs, gap="  "),
    ],
    gap=" ",
    rule="header",
)


def _usd_per_billion(comparison: InstanceComparison) -> str:
    return "" if comparison.planned is None else format_usd(comparison.planned.usd_per_billion_tokens)


def _ranking_lines(comparisons: Sequence[InstanceComparison]) -> list[str]:
    """What the rank column means, and, for each row, the costlier rows the models cannot tell it apart from."""
    lines = [
        "rank: by $ per billion tokens, cheapest first; 'N-M': within the error bands the row can take any place "
        "from N to M (it is indistinguishable from the rows named below: the costs differ by less than the wider "
        "of their bands); '?': outside the published evidence, not ranked"
    ]
    position = {c.instance_type: index for index, c in enumerate(comparisons)}
    for row in comparisons:
        rank = row.cost_rank
        if rank is None:
            continue
        costlier = [name for name in rank.indistinguishable_from if position[name] > position[row.instance_type]]
        if costlier:
            others = ", ".join(f"{name} {_usd_per_billion(comparisons[position[name]])}" for name in costlier)
            lines.append(
                f"{row.instance_type} {_usd_per_billion(row)} per billion tokens is indistinguishable from {others}"
            )
    return lines


def render_compare(profile: str, nodes: int, comparisons: Sequence[InstanceComparison]) -> str:
    lines = [f"{profile} on {nodes} node(s) of each instance type, cheapest first", ""]
    costs = [c.planned.training_cost for c in comparisons if c.planned is not None and c.planned.training_cost]
    notes = ["", *_ranking_lines(comparisons), f"MFU: of the GPU's {MFU_PEAK} peak, whatever the row's precision"]
    if costs:
        notes.append(
            f"days, $ to train: {format_tokens(costs[0].total_tokens)} tokens on demand at the catalog price; "
            "--format json adds the training plans it takes (their fees are not in the catalog)"
        )
    bands = ["error bands (how far the model missed published runs it was not fitted to):"]
    bands += [f"  {c.instance_type:22} {c.describe_band()}" for c in comparisons]
    corrected = [c.instance_type for c in comparisons if c.correction is not None]
    if corrected:
        notes.append(f"corrected by the team's measured runs (speed, MFU and costs): {', '.join(corrected)}")
    return "\n".join(lines + COMPARE_TABLE.text(comparisons) + notes + bands)
