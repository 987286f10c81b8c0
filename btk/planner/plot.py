"""``btk plan --plot``: memory breakdown and throughput of the top candidates (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from btk.errors import BtkError
from btk.planner.search import Evaluation, Plan

PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "other")


def _label(evaluation: Evaluation) -> str:
    k = evaluation.knobs
    return f"mb{k.micro_batch_size} {k.precision}\nac={k.activation_checkpointing} tp{k.tensor_parallel}"


def plot_plan(plan: Plan, path: str, top: int = 8) -> Path:
    """Write a PNG: stacked per-GPU memory (left axis) and tokens/s/GPU (right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = Path(path)
    if target.suffix.lower() != ".png":
        raise BtkError(f"--plot {path}: the file name must end in .png")
    if not target.parent.exists():
        raise BtkError(f"--plot {path}: directory {target.parent} does not exist")
    chosen = [plan.evaluation, *plan.alternatives]
    feasible = sorted((c for c in plan.candidates if c.fits), key=lambda c: -c.estimate.tokens_per_second_per_gpu)
    for candidate in feasible:
        if len(chosen) >= top:
            break
        if candidate not in chosen:
            chosen.append(candidate)
    if plan.baseline is not None:
        chosen.append(plan.baseline)
    labels = [_label(c) for c in chosen]
    if plan.baseline is not None:
        labels[-1] = "legacy\nbaseline"
    figure, axis = plt.subplots(figsize=(max(8, 1.4 * len(chosen)), 5.5))
    bottoms = [0.0] * len(chosen)
    for part in PARTS:
        heights = [getattr(c.memory, part) for c in chosen]
        axis.bar(range(len(chosen)), heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axis.axhline(plan.evaluation.budget_gib, color="black", linestyle="--", linewidth=1, label="budget")
    axis.set_ylabel("peak memory per GPU (GiB)")
    axis.set_xticks(range(len(chosen)), labels, fontsize=7)
    speed = axis.twinx()
    speed.plot(range(len(chosen)), [c.estimate.tokens_per_second_per_gpu for c in chosen], "ko-", label="tokens/s/GPU")
    speed.set_ylabel("tokens/s per GPU")
    speed.set_ylim(bottom=0)
    axis.set_title(f"{plan.profile.name} on {plan.nodes} x {plan.instance.name}: chosen plan first")
    axis.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target
