"""Human-readable tables for plans, estimates and comparisons (plain text, no deps)."""

from __future__ import annotations

from typing import Any

from btk.planner.search import Evaluation, Plan

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
    lines = [header, "plan:", render_evaluation(best), "why:"]
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


def render_compare(profile: str, nodes: int, rows: list[dict[str, Any]]) -> str:
    lines = [f"{profile} on {nodes} node(s) of each instance type", ""]
    header = f"{'instance type':<22} {'tok/s/GPU':>10} {'tok/s/node':>11} {'MFU':>6} {'$/B tokens':>11} {'GiB':>6} {'longest seq (1 node, TP 1)':>27}  knobs"
    lines += [header, "-" * len(header)]
    for row in rows:
        longest = f"{row['longest_seq_len_one_node']:,}" if row["longest_seq_len_one_node"] else "does not fit"
        if not row["fits"]:
            lines.append(
                f"{row['instance_type']:<22} {'does not fit':>10} {'':>11} {'':>6} {'':>11} {'':>6} {longest:>27}"
            )
            continue
        k = row["knobs"]
        knobs = f"mb={k['micro_batch_size']} {k['precision']} ac={k['activation_checkpointing']} {k['sharding']} tp={k['tensor_parallel']}"
        lines.append(
            f"{row['instance_type']:<22} {row['tokens_per_second_per_gpu']:>10,.0f} {row['tokens_per_second_per_node']:>11,.0f} "
            f"{row['mfu']:>6.1%} {row['usd_per_billion_tokens']:>11,.0f} {row['memory_gib']:>6.1f} {longest:>27}  {knobs}"
        )
    return "\n".join(lines)
