"""``--plot DIR``: PNG charts of a report (matplotlib with the Agg backend, imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from btk.errors import BtkError
from btk.report.schema import Report

CHART_FILES = ("cost_per_successful_run.png", "predicted_vs_achieved_tokens.png", "capacity_wait.png")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BtkError("--plot needs matplotlib: pip install 'blackwell-training-kit[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _cost_per_success(plt: Any, report: Report, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [name for name, group in report.by_profile.items() if group.runs]
    values = [report.by_profile[name].cost_per_successful_run_usd for name in names]
    if names:
        heights = [value or 0.0 for value in values]
        bars = ax.bar(names, heights, color=["#4c72b0" if value is not None else "#c44e52" for value in values])
        for bar, value, name in zip(bars, values, names, strict=True):
            group = report.by_profile[name]
            label = f"${value:,.0f}" if value is not None else "no success"
            ax.annotate(
                f"{label}\n{group.successes}/{group.runs - group.running} ok",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylabel("USD per successful run (failed runs included)")
        ax.margins(y=0.25)
    else:
        _empty(ax, "no runs")
    ax.set_title(f"Cost per successful run — {report.environment}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _predicted_vs_achieved(plt: Any, report: Report, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    points = [
        (run.predicted_tokens_per_second_per_gpu, run.achieved_tokens_per_second_per_gpu, run.profile)
        for run in report.runs
        if run.predicted_tokens_per_second_per_gpu is not None and run.achieved_tokens_per_second_per_gpu is not None
    ]
    if points:
        for profile in dict.fromkeys(point[2] for point in points):
            xs = [p for p, _, name in points if name == profile]
            ys = [a for _, a, name in points if name == profile]
            ax.scatter(xs, ys, label=profile)
        top = max(max(p, a) for p, a, _ in points) * 1.1
        ax.plot([0, top], [0, top], linestyle="--", color="grey", linewidth=1, label="prediction = achieved")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("predicted tokens/s per GPU (planner)")
        ax.set_ylabel("achieved tokens/s per GPU (final metric)")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no run with both a prediction and metrics")
    ax.set_title("Planner prediction vs achieved")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _capacity_wait(plt: Any, report: Report, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    waits = [run.capacity_wait_seconds / 3600 for run in report.runs if run.capacity_wait_seconds is not None]
    if waits:
        ax.hist(waits, bins=min(20, max(5, len(waits))), color="#55a868", edgecolor="white")
        ax.set_xlabel("hours waiting for capacity (Starting/Pending/LaunchingMLInstances)")
        ax.set_ylabel("runs")
    else:
        _empty(ax, "no status transitions recorded")
    ax.set_title(f"Capacity wait — {report.environment}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_plot_directory(directory: Path) -> None:
    """One line when ``directory`` (or a folder above it) exists but is not a directory: checked before AWS."""
    for folder in (directory, *directory.parents):
        if folder.exists():
            if not folder.is_dir():
                raise BtkError(f"--plot {str(directory)!r}: {str(folder)!r} is not a directory")
            return


def write_plots(report: Report, directory: Path) -> list[Path]:
    """Write the three charts into ``directory`` (created if missing); returns their paths."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BtkError(f"--plot {str(directory)!r}: cannot create the directory ({error.strerror})") from None
    plt = _pyplot()
    paths = [directory / name for name in CHART_FILES]
    for draw, path in zip((_cost_per_success, _predicted_vs_achieved, _capacity_wait), paths, strict=True):
        try:
            draw(plt, report, path)
        except OSError as error:
            plt.close("all")
            raise BtkError(f"--plot {str(directory)!r}: cannot write {path.name} ({error.strerror or error})") from None
    return paths
