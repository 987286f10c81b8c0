"""The one table writer: widths, alignment, gaps, rules and Markdown."""

from __future__ import annotations

from btk.table import Column, Table

ROWS = [("alpha", 1.5), ("b", 1234.25)]
NAME: Column[tuple[str, float]] = Column("name", lambda row: row[0])
VALUE: Column[tuple[str, float]] = Column("value", lambda row: f"{row[1]:,.2f}", "right")


def test_columns_are_as_wide_as_their_widest_cell_and_lines_have_no_trailing_spaces() -> None:
    assert Table([NAME, VALUE]).text(ROWS) == [
        "name      value",
        "-----  --------",
        "alpha      1.50",
        "b      1,234.25",
    ]
    assert Table([VALUE, NAME], rule="none").text(ROWS) == ["   value  name", "    1.50  alpha", "1,234.25  b"]


def test_least_width_gap_and_a_rule_under_the_whole_header() -> None:
    wide = Column("name", NAME.cell, width=8)
    note = Column("note", lambda row: "big" if row[1] > 100 else "", gap="   ")
    assert Table([wide, VALUE, note], gap=" ", rule="header").text(ROWS) == [
        "name        value   note",
        "------------------------",
        "alpha        1.50",
        "b        1,234.25   big",
    ]


def test_markdown_marks_right_aligned_columns_and_escapes_pipes() -> None:
    piped = Column("a|b", lambda row: row[0] + "|")
    assert Table([piped, VALUE]).markdown(ROWS[:1]) == ["| a\\|b | value |", "|---|---:|", "| alpha\\| | 1.50 |"]
