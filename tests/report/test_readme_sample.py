"""The README's sample report is the one docs/report.md holds (which a test regenerates)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _section(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_readme_sample_tables_come_from_the_rendered_sample() -> None:
    readme = _section((REPO / "README.md").read_text(), "## Five-minute tour")
    rows = [line for line in readme if line.startswith("| ") and not line.startswith("| profile")]  # step 6's tables
    assert len(rows) >= 6, "the README should show per-profile and overall rows of both tables"
    rendered = (REPO / "docs" / "report.md").read_text().splitlines()
    missing = [row for row in rows if row not in rendered]
    assert not missing, f"README rows not in docs/report.md's generated sample (copy them again): {missing}"
