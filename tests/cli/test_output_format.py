"""One output flag on every command: ``--format`` (table by default, json everywhere) and ``--json`` as its alias."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import fixture_catalog
import pytest

from btk.cli import build_parser, main


@pytest.fixture(autouse=True)
def _fixture_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_catalog.install(monkeypatch)


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every runnable command, as the words that name it (``("capacity", "show")``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaf_commands(sub, (*path, name))
            return
    yield path


def subparser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


COMMANDS = sorted(leaf_commands(build_parser()))
#: Commands that run something rather than print a result (``btk bootstrap`` runs the CDK CLI; ``btk evidence
#: import``, ``export``, ``push`` and ``pull`` write the team's evidence and say how many runs they wrote; ``btk
#: rehearse`` starts a pipeline execution and says how it went).
ACTIONS = [("bootstrap",), ("evidence", "export"), ("evidence", "import"), ("evidence", "pull"), ("evidence", "push"),
           ("rehearse",)]


def test_every_command_is_covered() -> None:
    assert COMMANDS == [
        ("bootstrap",),
        ("capacity", "search"),
        ("capacity", "show"),
        ("compare",),
        ("doctor",),
        ("estimate",),
        ("evidence", "export"),
        ("evidence", "import"),
        ("evidence", "list"),
        ("evidence", "pull"),
        ("evidence", "push"),
        ("plan",),
        ("profile", "import"),
        ("profiles",),
        ("rehearse",),
        ("report",),
    ]


QWEN3_CONFIG = Path(__file__).resolve().parents[1] / "hf_configs" / "qwen3-8b.json"
# What a command prints by default when it is not a table: `btk profile import` prints a module to commit.
DEFAULT_FORMAT = {("profile", "import"): "python"}


@pytest.mark.parametrize("words", [words for words in COMMANDS if words not in ACTIONS], ids=" ".join)
def test_format_defaults_to_table_and_json_is_its_alias(words: tuple[str, ...]) -> None:
    parser = subparser(words)
    options = {option: action for action in parser._actions for option in action.option_strings}
    default = DEFAULT_FORMAT.get(words, "table")
    assert {default, "json"} <= set(options["--format"].choices or ())
    assert options["--format"].dest == options["--json"].dest == "output_format"
    assert parser.get_default("output_format") == default


@pytest.mark.parametrize(
    "argv",
    [
        ["profiles"],
        ["plan", "llama3.2-1b"],
        ["estimate", "llama3.2-1b"],
        ["compare", "llama3.2-1b", "--instances", "ml.p5.48xlarge"],
        ["capacity", "show", "--env", "dev"],
        ["profile", "import", str(QWEN3_CONFIG), "--name", "qwen3-8b"],
    ],
    ids=lambda argv: argv[0] if argv[0] not in ("capacity", "profile") else " ".join(argv[:2]),
)
def test_json_prints_exactly_what_format_json_prints(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main([*argv, "--format", "json"]) == 0
    spelled_out = capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    assert capsys.readouterr().out == spelled_out
    assert spelled_out.lstrip().startswith(("{", "["))


def test_format_and_json_together_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "llama3.2-1b", "--format", "json", "--json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not allowed with argument" in err
