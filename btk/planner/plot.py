"""``btk plan --plot`` and ``btk compare --plot``: the planner's answers as figures (matplotlib).

A bar's label names every knob that differs between the bars of its figure, so no two bars
read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from btk.errors import BtkError
from btk.knobs import KNOB_FIELDS, TrainingKnobs
from btk.planner.search import Evaluation, Plan

if TYPE_CHECKING:
    from btk.planner.compare import InstanceComparison

PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "other")
#: How a knob reads in a bar label.
SHORT_NAMES = {
    "micro_batch_size": "mb",
    "gradient_accumulation_steps": "ga",
    "seq_len": "seq",
    "precision": "",
    "activation_checkpointing": "ac=",
    "sharding": "",
    "tensor_parallel": "tp",
    "compile": "compile=",
    "fused_loss": "fused_loss=",
}


def _knob_text(knobs: TrainingKnobs, name: str) -> str:
    value = getattr(knobs, name)
    if isinstance(value, bool):
        value = "on" if value else "off"
    return f"{SHORT_NAMES.get(name, name + '=')}{value}"


def knob_labels(knobs: Sequence[TrainingKnobs], per_line: int = 2) -> list[str]:
    """One label per knob set naming every knob that differs between them (``per_line`` knobs a line)."""
    differing = [name for name in KNOB_FIELDS if len({getattr(k, name) for k in knobs}) > 1]
    labels = []
    for k in knobs:
        words = [_knob_text(k, name) for name in differing]
        lines = [" ".join(words[i : i + per_line]) for i in range(0, len(words), per_line)]
        labels.append("\n".join(lines))
    return labels


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


def plot_paths(path: Path, names: Sequence[str]) -> list[Path]:
    """Where each of several figures goes: ``path`` for one, else ``STEM-NAME.png`` beside it per name."""
    if len(names) == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{name}{path.suffix}") for name in names]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _right_axis_line(axis: Any, values: Sequence[float], label: str) -> None:
    """``values`` as a black line over the bars, on a second y axis that starts at zero."""
    right = axis.twinx()
    right.plot(range(len(values)), values, "ko-", label=label)
    right.set_ylabel(label)
    right.set_ylim(bottom=0)


def _save(figure: Any, axis: Any, title: str, target: Path, plt: Any) -> Path:
    """Title the figure, write it to ``target`` (a write error is one line) and close it."""
    axis.set_title(title)
    figure.tight_layout()
    try:
        figure.savefig(target, dpi=110)
    except OSError as error:
        raise BtkError(f"--plot {str(target)!r}: cannot write the file ({error.strerror or error})") from None
    finally:
        plt.close(figure)
    return target


def _plotted(plan: Plan, top: int) -> list[Evaluation]:
    """The chosen plan, its alternatives, the fastest other feasible candidates up to ``top``, the baseline."""
    chosen = [plan.evaluation, *plan.alternatives]
    feasible = sorted((c for c in plan.candidates if c.fits), key=lambda c: -c.estimate.tokens_per_second_per_gpu)
    for candidate in feasible:
        if len(chosen) >= top:
            break
        if candidate not in chosen:
            chosen.append(candidate)
    if plan.baseline is not None and plan.baseline not in chosen:
        chosen.append(plan.baseline)
    return chosen


def plot_plan(plan: Plan, path: str | Path, top: int = 8) -> Path:
    """Write a PNG: stacked per-GPU memory (left axis) and tokens/s/GPU (right axis)."""
    plt = _pyplot()
    target = check_plot_path(str(path))
    chosen = _plotted(plan, top)
    labels = knob_labels([c.knobs for c in chosen])
    if plan.baseline is not None and chosen[-1] == plan.baseline:
        labels[-1] = f"legacy baseline\n{labels[-1]}"
    labels[0] = f"chosen\n{labels[0]}"
    figure, axis = plt.subplots(figsize=(max(8, 1.5 * len(chosen)), 6))
    bottoms = [0.0] * len(chosen)
    for part in PARTS:
        heights = [getattr(c.memory, part) for c in chosen]
        axis.bar(range(len(chosen)), heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axis.axhline(plan.evaluation.budget_gib, color="black", linestyle="--", linewidth=1, label="budget")
    axis.set_ylabel("peak memory per GPU (GiB)")
    axis.set_xticks(range(len(chosen)), labels, fontsize=7)
    _right_axis_line(axis, [c.estimate.tokens_per_second_per_gpu for c in chosen], "tokens/s per GPU")
    axis.legend(loc="upper right", fontsize=7)
    title = f"{plan.profile.name} on {plan.nodes} x {plan.instance.name}: chosen plan first"
    return _save(figure, axis, title, target, plt)


def plot_plans(plans: Sequence[Plan], path: str | Path) -> list[Path]:
    """One PNG per plan (:func:`plot_paths`); the paths written, in order."""
    targets = plot_paths(check_plot_path(str(path)), [plan.profile.name for plan in plans])
    return [plot_plan(plan, target) for plan, target in zip(plans, targets, strict=True)]


def plot_compare(profile: str, nodes: int, comparisons: Sequence[InstanceComparison], path: str | Path) -> Path:
    """Write a PNG: tokens/s/GPU per instance type (bars) and dollars per billion tokens (right axis)."""
    plt = _pyplot()
    target = check_plot_path(str(path))
    fitting = [c for c in comparisons if c.planned is not None]
    knob_lines = knob_labels([c.planned.knobs for c in fitting if c.planned is not None])
    labels = [f"{c.instance_type}\n{knobs}" for c, knobs in zip(fitting, knob_lines, strict=True)]
    labels += [f"{c.instance_type}\ndoes not fit" for c in comparisons if c.planned is None]
    speeds = [c.planned.tokens_per_second_per_gpu for c in fitting if c.planned is not None]
    prices = [c.planned.usd_per_billion_tokens for c in fitting if c.planned is not None]
    figure, axis = plt.subplots(figsize=(max(8, 2.0 * len(labels)), 5.5))
    axis.bar(range(len(speeds)), speeds, color="tab:blue", label="tokens/s/GPU")
    axis.set_ylabel("tokens/s per GPU")
    axis.set_xticks(range(len(labels)), labels, fontsize=7)
    _right_axis_line(axis, prices, "$ per billion tokens (on demand)")
    figure.legend(loc="upper right", fontsize=7)
    return _save(figure, axis, f"{profile} on {nodes} node(s) of each instance type", target, plt)
