"""``btk plan --plot``: memory breakdown and throughput of the top candidates (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from btk.errors import BtkError
from btk.planner.search import Evaluation, Plan

PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "other")


def _label(evaluation: Evaluation) -> str:
    k = evaluation.knobs
    return f"mb{k.micro_batch_size} {k.precision}\nac={k.activation_checkpointing} tp{k.tensor_parallel}"


def check_plot_path(path: str) -> Path:
    """``path`` as the PNG to write, or a one-line error: checked before the planner runs."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise BtkError(f"--plot {path!r}: the file name must end in .png")
    if target.is_dir():
        raise BtkError(f"--plot {path!r} is a directory: give a FILE.png inside it")
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        raise BtkError(f"--plot {path!r}: {str(target.parent)!r} {what}")
    return target


def plot_plan(plan: Plan, path: str | Path, top: int = 8) -> Path:
    """Write a PNG: stacked per-GPU memory (left axis) and tokens/s/GPU (right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = check_plot_path(str(path))
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
    try:
        figure.savefig(target, dpi=110)
    except OSError as error:
        raise BtkError(f"--plot {str(path)!r}: cannot write the file ({error.strerror or error})") from None
    finally:
        plt.close(figure)
    return target
