"""The figures of `--plot`, read back from matplotlib: no two tick labels overlap, the legend covers neither
the title nor the labels, and tokens/s carries its error band (or none outside the evidence)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fixture_catalog import PROFILES

from btk.hardware import get_instance_type
from btk.planner.compare import compare_instances
from btk.planner.plot import compare_figure, plan_figure
from btk.planner.search import plan_profile

B200 = get_instance_type("ml.p6-b200.48xlarge")


def _boxes(figure: Any) -> tuple[list[Any], Any, Any]:
    """The drawn extents of the x tick labels, the title and the legend, in display pixels."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    axis = figure.axes[0]
    ticks = [label.get_window_extent(renderer) for label in axis.get_xticklabels() if label.get_text()]
    return ticks, axis.title.get_window_extent(renderer), figure.legends[0].get_window_extent(renderer)


def _assert_laid_out(figure: Any) -> None:
    ticks, title, legend = _boxes(figure)
    assert len(ticks) >= 2
    for left, right in itertools.pairwise(ticks):
        assert left.x1 <= right.x0, f"tick labels overlap: {left} and {right}"
    assert not legend.overlaps(title), "the legend covers the title"
    assert not any(legend.overlaps(tick) for tick in ticks), "the legend covers a tick label"


def _error_bars(axis: Any) -> list[tuple[float, float, float]]:
    """(x, bottom, top) of every vertical error bar drawn on ``axis``."""
    bars = []
    for container in axis.containers:
        if type(container).__name__ == "ErrorbarContainer":
            (segments,) = [c.get_segments() for c in container.lines[2]]
            bars += [(seg[0][0], seg[0][1], seg[1][1]) for seg in segments]
    return bars


@pytest.mark.parametrize("name", ["llama3.2-1b", "llama3.1-8b", "qwen2.5-32b"])
def test_plan_figure_is_legible_and_draws_the_speed_band(name: str) -> None:
    plan = plan_profile(PROFILES[name], B200, 1)
    figure = plan_figure(plan)
    _assert_laid_out(figure)
    right = figure.axes[1]
    speeds = list(right.lines[0].get_ydata())
    band = plan.band.tokens_per_second
    bars = _error_bars(right)
    if band is None:
        assert bars == []
        return
    assert [x for x, _, _ in bars] == list(range(len(speeds)))
    for (_, bottom, top), speed in zip(bars, speeds, strict=True):
        assert top == pytest.approx(speed * (1 + band)) and bottom == pytest.approx(max(0.0, speed * (1 - band)))
    assert right.get_ylim()[1] >= max(top for _, _, top in bars), "the top of a band is cut off"


def test_compare_figure_is_legible_and_draws_each_rows_band() -> None:
    instances = [get_instance_type(n) for n in ("ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5en.48xlarge", B200.name)]
    rows = compare_instances(PROFILES["llama3.1-8b"], instances, 1)
    figure = compare_figure("llama3.1-8b", 1, rows)
    _assert_laid_out(figure)
    fitting = [row for row in rows if row.planned is not None]
    expected = [
        (x, max(0.0, speed * (1 - band)), speed * (1 + band))
        for x, row in enumerate(fitting)
        if row.planned is not None
        and (band := row.band.tokens_per_second) is not None
        and (speed := row.planned.tokens_per_second_per_gpu)
    ]
    drawn = _error_bars(figure.axes[0])
    assert expected and len(drawn) == len(expected)
    for got, want in zip(drawn, expected, strict=True):
        assert got == pytest.approx(want)
