"""The one table writer behind every ``btk`` command's text and Markdown tables.

A :class:`Table` is a list of :class:`Column` s, each with a header, a function that turns a
row into its cell text, an alignment and a least width; rows are any typed value. A column is
as wide as its widest cell (never narrower than ``width``), so a long value widens the
column instead of pushing the rest of its row out of line. Lines carry no trailing spaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

RowT = TypeVar("RowT")

Align = Literal["left", "right"]
Rule = Literal["none", "header", "columns"]
"""The line under the header: none; dashes as long as the header line; dashes per column."""


@dataclass(frozen=True)
class Column(Generic[RowT]):
    """One column: its header, how a row becomes its cell, and how the cell lines up."""

    header: str
    cell: Callable[[RowT], str]
    align: Align = "left"
    width: int = 0
    """The least width; the default fits the header and the widest cell."""
    gap: str | None = None
    """Space before this column; None: the table's gap (a free-text last column may want more)."""


@dataclass(frozen=True)
class Table(Generic[RowT]):
    """Columns plus the layout every row shares."""

    columns: Sequence[Column[RowT]]
    gap: str = "  "
    """Between neighbouring columns."""
    rule: Rule = "columns"

    def cells(self, rows: Iterable[RowT]) -> list[list[str]]:
        """Each row's cell texts, in column order."""
        return [[column.cell(row) for column in self.columns] for row in rows]

    def text(self, rows: Iterable[RowT]) -> list[str]:
        """Plain-text lines: the header, the rule (unless ``none``), then one line per row."""
        body = self.cells(rows)
        headers = [column.header for column in self.columns]
        widths = [
            max(column.width, len(column.header), *(len(cells[index]) for cells in body))
            for index, column in enumerate(self.columns)
        ]

        gaps = ["", *(self.gap if column.gap is None else column.gap for column in self.columns[1:])]

        def line(cells: Sequence[str]) -> str:
            return "".join(
                gap + (cell.ljust(width) if column.align == "left" else cell.rjust(width))
                for cell, width, gap, column in zip(cells, widths, gaps, self.columns, strict=True)
            ).rstrip()

        header = line(headers)
        rule = {"none": [], "header": ["-" * len(header)], "columns": [line(["-" * width for width in widths])]}
        return [header, *rule[self.rule], *(line(cells) for cells in body)]

    def markdown(self, rows: Iterable[RowT]) -> list[str]:
        """A GitHub Markdown table; right-aligned columns get ``---:``."""

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        rule = "|" + "|".join("---" if column.align == "left" else "---:" for column in self.columns) + "|"
        return [line([column.header for column in self.columns]), rule, *(line(cells) for cells in self.cells(rows))]
