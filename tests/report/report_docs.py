"""Keep docs/report.md's generated blocks (sample report, JSON schema) current.

Run ``.venv/bin/python tests/report/report_docs.py`` after changing the report's output;
``test_report_output.py`` fails while the file is stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from report_fixtures import fixture_report
from retry_fixtures import retry_report

from btk.report.render import render_markdown, render_text
from btk.report.schema import report_json_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "report.md"


def blocks() -> dict[str, str]:
    """The generated text of each marked block, by marker name."""
    report = fixture_report()
    return {
        "sample-markdown": render_markdown(report),
        "sample-table": "```text\n$ btk report --env dev\n" + render_text(report) + "```\n",
        "sample-retries": render_markdown(retry_report()),
        "schema": "```json\n" + json.dumps(report_json_schema(), indent=2) + "\n```\n",
    }


def block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.DOTALL)


def current_blocks(text: str) -> dict[str, str]:
    found = {}
    for name in blocks():
        match = block_pattern(name).search(text)
        found[name] = match.group(2) if match else ""
    return found


def main() -> None:
    text = DOC.read_text()
    for name, body in blocks().items():
        text, count = block_pattern(name).subn(lambda m, body=body: m.group(1) + body + m.group(3), text)
        if count != 1:
            raise SystemExit(f"docs/report.md: marker generated:{name} missing")
    DOC.write_text(text)


if __name__ == "__main__":
    main()
