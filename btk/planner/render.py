"""Human-readable tables for plans, estimates and comparisons (plain text, no deps)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from btk.planner.band import band_for
from btk.planner.compare import InstanceComparison, PlannedFigures
from btk.planner.search import Evaluation, Plan
from btk.table import Column, Table

MEMORY_ROWS = ("parameters", "gradients", "optimizer", "activations", "logits", "other", "total", "capacity")


def _knob_line(evaluation: Evaluation) -> str:
    k = evaluation.knobs
    return (
        f"mb={k.micro_batch_size} ga={k.gradient_accumulation_steps} seq={k.seq_len} {k.precision} "
        f"ac={k.activation_checkpointing} {k.sharding} tp={k.tensor_parallel} "
        f"compile={'on' if k.compile else 'off'} fused_loss={'on' if k.fused_loss else 'off'}"
    )


def render_evaluation(evaluation: Evaluation) -> str:
    e, m = evaluation.estimate, evaluation.memory
    lines = [f"  knobs     {_knob_line(evaluation)}"]
    lines.append("  memory    " + "  ".join(f"{name} {getattr(m, name):.1f}" for name in MEMORY_ROWS) + " GiB")
    lines.append(
        f"  estimate  {e.tokens_per_second_per_gpu:,.0f} tokens/s/GPU  MFU {e.mfu:.1%}  step {e.step_seconds:.2f} s  "
        f"${e.usd_per_billion_tokens:,.0f} per billion tokens  (fits: {'yes' if evaluation.fits else 'NO'})"
    )
    return "\n".join(lines)


def render_plan(plan: Plan) -> str:
    best = plan.evaluation
    header = (
        f"{plan.profile.name} ({plan.profile.parameter_count / 1e9:.2f}B) on {plan.nodes} x {plan.instance.name} "
        f"({plan.nodes * plan.instance.gpus_per_node} x {plan.instance.gpu.name}, budget {best.budget_gib:.0f} GiB/GPU)"
    )
    lines = [header, f"error band: {band_for(plan.instance).describe()}", "plan:", render_evaluation(best), "why:"]
    lines += [f"  - {line}" for line in plan.explanations]
    if plan.baseline is not None:
        lines += [
            "legacy baseline (full checkpointing, micro-batch 1, bf16, full shard, eager loss):",
            render_evaluation(plan.baseline),
        ]
        lines.append(f"speed-up over the legacy baseline: {plan.speedup_vs_baseline:.2f}x")
    else:
        lines.append("legacy baseline: does not fit on this cluster")
    if plan.alternatives:
        lines.append("top alternatives:")
        for alternative in plan.alternatives:
            est = alternative.estimate
            lines.append(
                f"  {est.tokens_per_second_per_gpu:>9,.0f} tok/s/GPU  {alternative.memory.total:6.1f} GiB  {_knob_line(alternative)}"
            )
    return "\n".join(lines)


def _compare_knobs(comparison: InstanceComparison) -> str:
    if comparison.planned is None:
        return ""
    k = comparison.planned.knobs
    return f"mb={k.micro_batch_size} {k.precision} ac={k.activation_checkpointing} {k.sharding} tp={k.tensor_parallel}"


def _planned_cell(text: Callable[[PlannedFigures], str], missing: str = "") -> Callable[[InstanceComparison], str]:
    """A cell from the planned figures, or ``missing`` where no knob set fits."""
    return lambda comparison: missing if comparison.planned is None else text(comparison.planned)


def _longest(comparison: InstanceComparison) -> str:
    return f"{comparison.longest_seq_len_one_node:,}" if comparison.longest_seq_len_one_node else "does not fit"


COMPARE_TABLE: Table[InstanceComparison] = Table(
    [
        Column("instance type", lambda c: c.instance_type, "left", 22),
        Column(
            "tok/s/GPU", _planned_cell(lambda p: f"{p.tokens_per_second_per_gpu:,.0f}", "does not fit"), "right", 10
        ),
        Column("tok/s/node", _planned_cell(lambda p: f"{p.tokens_per_second_per_node:,.0f}"), "right", 11),
        Column("MFU", _planned_cell(lambda p: f"{p.mfu:.1%}"), "right", 6),
        Column("$/B tokens", _planned_cell(lambda p: f"{p.usd_per_billion_tokens:,.0f}"), "right", 11),
        Column("GiB", _planned_cell(lambda p: f"{p.memory_gib:.1f}"), "right", 6),
        Column("longest seq (1 node, TP 1)", _longest, "right", 27),
        Column("knobs", _compare_knobs, gap="  "),
    ],
    gap=" ",
    rule="header",
)


def render_compare(profile: str, nodes: int, comparisons: Sequence[InstanceComparison]) -> str:
    lines = [f"{profile} on {nodes} node(s) of each instance type", ""]
    bands = ["", "error bands (how far the model missed published runs it was not fitted to):"]
    bands += [f"  {c.instance_type:22} {c.band.describe()}" for c in comparisons]
    return "\n".join(lines + COMPARE_TABLE.text(comparisons) + bands)
