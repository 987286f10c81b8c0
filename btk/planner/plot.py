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

TICK_FONT_SIZE = 7
TICK_CHAR_INCHES = 0.075
"""Width of one tick-label character at ``TICK_FONT_SIZE`` points, with room to spare (DejaVu Sans averages
about 0.6 em, 0.058 in at 7 pt)."""
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


def _right_axis_line(
    axis: Any, values: Sequence[float], label: str, bands: Sequence[float | None] = (), band_label: str = ""
) -> Any:
    """``values`` as a black line over the bars, with their error bands where given, on a second y axis that
    starts at zero and reaches the top of every band; that axis."""
    right = axis.twinx()
    right.plot(range(len(values)), values, "ko-", label=label)
    if bands:
        _band_bars(right, values, bands, band_label)
    right.set_ylabel(label)
    right.set_ylim(bottom=0)
    return right


def _band_bars(axis: Any, values: Sequence[float], bands: Sequence[float | None], label: str) -> None:
    """Each value's error band as an error bar (clipped at zero); a value without a band gets none."""
    labelled = False
    for x, (value, band) in enumerate(zip(values, bands, strict=True)):
        if band is None:
            continue
        axis.errorbar([x], [value], yerr=[[min(value * band, value)], [value * band]], fmt="none", ecolor="black",
                      elinewidth=1, capsize=6, label=None if labelled else label)
        labelled = True


def _figure_width(labels: Sequence[str]) -> float:
    """Inches: every bar as wide as its longest label line at the tick font, so no two labels overlap."""
    longest = max(len(line) for label in labels for line in label.splitlines())
    return max(8.0, len(labels) * max(1.5, TICK_CHAR_INCHES * longest + 0.3))


def _legend(figure: Any, axes: Sequence[Any]) -> None:
    """One legend for every axis, below the figure: it covers neither the bars nor the title."""
    handles, names = [], []
    for axis in axes:
        more_handles, more_names = axis.get_legend_handles_labels()
        handles += more_handles
        names += more_names
    figure.legend(handles, names, loc="outside lower center", ncols=min(5, len(names)), fontsize=7)


def _save(figure: Any, target: Path) -> Path:
    """Write the figure to ``target`` (a write error is one line) and close it."""
    plt = _pyplot()
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


def plan_figure(plan: Plan, top: int = 8) -> Any:
    """Stacked per-GPU memory (left axis) and tokens/s/GPU with its error band (right axis), titled."""
    plt = _pyplot()
    chosen = _plotted(plan, top)
    labels = knob_labels([c.knobs for c in chosen], per_line=1)
    if plan.baseline is not None and chosen[-1] == plan.baseline:
        labels[-1] = f"legacy baseline\n{labels[-1]}"
    labels[0] = f"chosen\n{labels[0]}"
    figure, axis = plt.subplots(figsize=(_figure_width(labels), 6.5), layout="constrained")
    bottoms = [0.0] * len(chosen)
    for part in PARTS:
        heights = [getattr(c.memory, part) for c in chosen]
        axis.bar(range(len(chosen)), heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axis.axhline(plan.evaluation.budget_gib, color="black", linestyle="--", linewidth=1, label="budget")
    axis.set_ylabel("peak memory per GPU (GiB)")
    axis.set_xticks(range(len(chosen)), labels, fontsize=TICK_FONT_SIZE)
    speeds = [c.estimate.tokens_per_second_per_gpu for c in chosen]
    right = _right_axis_line(axis, speeds, "tokens/s per GPU", [plan.band.tokens_per_second] * len(speeds),
                             f"tokens/s error band ({_band_text(plan)})")
    _legend(figure, [axis, right])
    axis.set_title(f"{plan.profile.name} on {plan.nodes} x {plan.instance.name}: chosen plan first")
    return figure


def _band_text(plan: Plan) -> str:
    band = plan.band.tokens_per_second
    return "outside the published evidence: none" if band is None else f"±{band:.1%}"


def plot_plan(plan: Plan, path: str | Path, top: int = 8) -> Path:
    """Write :func:`plan_figure` as a PNG."""
    target = check_plot_path(str(path))
    figure = plan_figure(plan, top)
    return _save(figure, target)


def plot_plans(plans: Sequence[Plan], path: str | Path) -> list[Path]:
    """One PNG per plan (:func:`plot_paths`); the paths written, in order."""
    targets = plot_paths(check_plot_path(str(path)), [plan.profile.name for plan in plans])
    return [plot_plan(plan, target) for plan, target in zip(plans, targets, strict=True)]


def compare_figure(profile: str, nodes: int, comparisons: Sequence[InstanceComparison]) -> Any:
    """Tokens/s/GPU per instance type (bars, each with its error band) and $ per billion tokens (right axis)."""
    plt = _pyplot()
    fitting = [c for c in comparisons if c.planned is not None]
    knob_lines = knob_labels([c.planned.knobs for c in fitting if c.planned is not None], per_line=1)
    labels = [f"{c.instance_type}\n{knobs}".rstrip() for c, knobs in zip(fitting, knob_lines, strict=True)]
    labels += [f"{c.instance_type}\ndoes not fit" for c in comparisons if c.planned is None]
    speeds = [c.planned.tokens_per_second_per_gpu for c in fitting if c.planned is not None]
    prices = [c.planned.usd_per_billion_tokens for c in fitting if c.planned is not None]
    figure, axis = plt.subplots(figsize=(_figure_width(labels), 6.0), layout="constrained")
    axis.bar(range(len(speeds)), speeds, color="tab:blue", label="tokens/s/GPU")
    _band_bars(axis, speeds, [c.speed_band for c in fitting], "tokens/s error band")
    axis.set_ylabel("tokens/s per GPU")
    axis.set_xticks(range(len(labels)), labels, fontsize=TICK_FONT_SIZE)
    right = _right_axis_line(axis, prices, "$ per billion tokens (on demand)")
    _legend(figure, [axis, right])
    axis.set_title(f"{profile} on {nodes} node(s) of each instance type")
    return figure


def plot_compare(profile: str, nodes: int, comparisons: Sequence[InstanceComparison], path: str | Path) -> Path:
    """Write :func:`compare_figure` as a PNG."""
    target = check_plot_path(str(path))
    figure = compare_figure(profile, nodes, comparisons)
    return _save(figure, target)
