"""Every ``btk`` sub-command, in-process, on generated hostile argv.

Each generated command line mixes valid arguments (naming the fixture catalog of
:mod:`cli_fixtures`) with hostile ones: garbage and empty strings, line breaks, control
characters, undecodable bytes, huge/negative/NaN numbers, odd dates, ``--``, paths onto
directories, below files, with missing parents or onto a full disk. Whatever it gets,
``btk`` must

- exit 0 with output when every argument is valid,
- exit 2 with nothing on stdout and exactly one line on stderr starting ``btk`` when any
  argument is invalid (never silent acceptance),
- never raise anything but ``SystemExit`` (a traceback fails the test),
- never reach AWS: the client factories are stubbed with an empty SageMaker.

Arguments whose validity the test cannot know in advance (a generated string that happens
to parse as a date) may go either way, but still only as above.

``btk doctor`` reads the same empty stand-in for every service; exit 1 (a check failed) counts as
a valid answer there.

Generated cases per run: top level 60, profiles 60, plan 260, estimate 200, compare 140,
capacity search 200, capacity show 60, report 200, profile import 120, doctor 60, evidence 120, rehearse 40,
bootstrap 60: 1,580 in all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cli_fixtures import (
    ENVIRONMENTS,
    ON_DEMAND_ENV,
    PROFILE,
    EmptySageMaker,
    assert_one_line_error,
    btk,
    install,
)
from example_budget import capped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from btk.cli.arguments import max_nodes
from btk.environment import TRAINING_PLAN_INSTANCE_COUNTS, ReservePlanCapacity, is_sellable_plan_duration
from btk.hardware import INSTANCE_TYPES
from btk.knobs import CHECKPOINTING_MODES, KNOB_FIELDS
from btk.profile import PROFILE_NAME


def fuzz(examples: int) -> settings:
    """``examples`` generated cases, no deadline (the first plan warms caches), fixtures shared across them."""
    return settings(
        max_examples=capped(examples),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@dataclass(frozen=True)
class Arg:
    """Some argv words and whether they are valid (None: the test cannot tell in advance)."""

    words: tuple[str, ...]
    valid: bool | None = True


def flat(args: list[Arg]) -> list[str]:
    return [word for arg in args for word in arg.words]


def check(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, command: list[str], args: list[Arg]) -> None:
    """Run ``btk command args`` and hold it to the module's contract."""
    sagemaker.calls.clear()
    argv = command + flat(args)
    outcome = btk(capsys, argv)
    invalid = any(arg.valid is False for arg in args)
    if invalid:
        expected = {2}
    elif all(arg.valid for arg in args):
        expected = {0}
    else:
        expected = {0, 2}
    if outcome.code == 0 and outcome.out.startswith("usage:") and any(_asks_for_help(word) for word in argv):
        return  # a generated `-h` is a valid request for help
    assert outcome.code in expected, (argv, outcome)
    if outcome.code == 0:
        assert outcome.out.strip(), (argv, outcome)
        assert "Traceback" not in outcome.err
    else:
        assert_one_line_error(outcome)
    if invalid:
        assert sagemaker.calls == [], (argv, "invalid input reached AWS")


def _asks_for_help(word: str) -> bool:
    return word.startswith("-h") or (word.startswith("--h") and "--help".startswith(word.split("=")[0]))


# --------------------------------------------------------------------------- hostile values

NASTY = [
    "", " ", "\n", "a\nb", "\t", "\r", "\x1b[31m", "--", "-", "-1", "0", "00", "+0", "nan", "NaN", "inf", "-inf",
    "1e309", "9" * 400, "-" + "9" * 400, "1.5", "0x10", "1_000", "١٢", "☃", "\u202e", "\udcff", "\udcfe\n",
    "😀" * 3, "'", '"', "\\", "%s", "{}", "$(true)", "../..", "/", "/dev/null", "/dev/full", "C:\\x", "=", "a=b",
    "x" * 300,
]  # fmt: skip
#: Valid ISO-8601 that lies outside years 1 to 9999 once in UTC.
FAR_DATES = ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59")
DATES = [
    *FAR_DATES, "0001-01-01", "9999-12-31", "2024-02-30",
    "2024-13-01", "2024-01-01T25:00", "1970-01-01T00:00:00Z", "2031-01-05T00:00:00Z", "2031-01-05T00:00:00+14:00",
    "2024-01-01T00:00:00-00:00", "20240101", "2024-W01", "2024-001", "-2024-01-01", "2024-01-01T00:00:00.123456789",
]  # fmt: skip
#: The values that broke ``btk`` before, drawn more often than the rest.
CLASSICS = ["", " ", "\n", "--", "9" * 400, "nan", "-1", "0", "0001-01-01T00:00:00+01:00", "\udcff"]
TEXT = st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=12)
GARBAGE = st.one_of(
    st.sampled_from(CLASSICS),
    st.sampled_from(NASTY + DATES),
    TEXT,
    st.integers().map(str),
    st.floats().map(str),
    st.decimals().map(str),
)


def bad_values(is_valid: Callable[[str], bool]) -> st.SearchStrategy[str]:
    """Garbage that ``is_valid`` rejects."""
    return GARBAGE.filter(lambda value: not is_valid(value))


def option(name: str, value: str, valid: bool | None) -> st.SearchStrategy[list[Arg]]:
    """``--name value`` or ``--name=value`` (the second form is the only way to pass ``--`` as a value)."""
    return st.sampled_from([[Arg((name, value), valid)], [Arg((f"{name}={value}",), valid)]])


Part = Callable[[bool], st.SearchStrategy[list[Arg]]]
"""Some arguments of a command line: given whether they are the hostile part, their strategy."""


@dataclass(frozen=True)
class Opt:
    """An option: absent or valid; hostile: a bad value, one that may go either way, or missing when required."""

    name: str
    good: tuple[str, ...]
    is_valid: Callable[[str], bool]
    unsure: tuple[str, ...] = ()
    required: bool = False
    bad: tuple[str, ...] = ()
    """Bad values to draw twice as often as garbage."""

    def __call__(self, hostile: bool) -> st.SearchStrategy[list[Arg]]:
        if not hostile:
            valid = st.sampled_from(self.good).flatmap(lambda v: option(self.name, v, True))
            return valid if self.required else st.one_of(st.just([]), valid)
        choices = [bad_values(self.is_valid).flatmap(lambda v: option(self.name, v, False))]
        if self.bad:
            listed = st.sampled_from(self.bad).flatmap(lambda v: option(self.name, v, False))
            choices += [listed, listed]
        if self.unsure:
            choices.append(st.sampled_from(self.unsure).flatmap(lambda v: option(self.name, v, None)))
        if self.required:
            choices.append(st.just([Arg((), False)]))
        return st.one_of(choices)


@dataclass(frozen=True)
class Positional:
    """A positional argument; hostile ones that argparse would read as an option (``--json``) are left out."""

    good: tuple[str, ...]
    is_valid: Callable[[str], bool]

    def __call__(self, hostile: bool) -> st.SearchStrategy[list[Arg]]:
        if not hostile:
            return st.sampled_from(self.good).map(lambda v: [Arg((v,))])
        bad = bad_values(self.is_valid).filter(lambda v: not v.startswith("-") or not v.strip("-")[:1].isalpha())
        return bad.map(lambda v: [Arg((v,), False)])


@dataclass(frozen=True)
class Formats:
    """``--format`` (or ``--json``) with one of ``formats``, or absent."""

    formats: tuple[str, ...]

    def __call__(self, hostile: bool) -> st.SearchStrategy[list[Arg]]:
        spelled_out = Opt("--format", self.formats, self.formats.__contains__)(hostile)
        return spelled_out if hostile else st.one_of(st.just([Arg(("--json",))]), spelled_out)


STRAY = ["--bogus", "-x", "--nodes", "--format", "extra", "--set", "a\nb", "--=x", "--json=1"]


def stray(hostile: bool) -> st.SearchStrategy[list[Arg]]:
    """A word no command takes there (nothing unless this is the hostile part)."""
    return st.sampled_from(STRAY).map(lambda word: [Arg((word,), False)]) if hostile else st.just([])


def command_line(*parts: Part, head: tuple[Part, ...] = ()) -> st.SearchStrategy[list[Arg]]:
    """``head`` then ``parts`` in any order: valid throughout in one case of four, else with one hostile part.

    One hostile part at a time, the rest valid, so that a value that is silently accepted
    shows as exit 0 where exit 2 was due.
    """
    every = (*head, *parts, stray)

    def build(hostile_part: int) -> st.SearchStrategy[list[Arg]]:
        drawn = [part(index == hostile_part) for index, part in enumerate(every)]
        options = st.tuples(*drawn[len(head) :]).map(_flatten).flatmap(st.permutations)
        return st.tuples(st.tuples(*drawn[: len(head)]).map(_flatten), options).map(
            lambda both: both[0] + list(both[1])
        )

    return st.one_of(st.just(-1), st.integers(0, len(every) - 1), st.integers(0, len(every) - 1)).flatmap(build)


def _flatten(parts: Iterable[list[Arg]]) -> list[Arg]:
    return [arg for part in parts for arg in part]


# --------------------------------------------------------------------------- what is valid


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _is_plan_count(value: str) -> bool:
    return _is_int(value) and int(value) in TRAINING_PLAN_INSTANCE_COUNTS


def is_profile(value: str) -> bool:
    return value == PROFILE.name


def is_environment(value: str) -> bool:
    return value in ENVIRONMENTS


ALIASES = [alias for instance in INSTANCE_TYPES.values() for alias in instance.aliases]


def is_instance(value: str) -> bool:
    return value in INSTANCE_TYPES or value.lower() in ALIASES or f"ml.{value}" in INSTANCE_TYPES


def is_node_count(value: str) -> bool:
    return _is_int(value) and 1 <= int(value) <= max_nodes()


def utc_instant(value: str) -> datetime | None:
    """``value`` as an ISO-8601 instant in UTC (no zone: UTC); None when it is none or lies outside years 1-9999."""
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def parses_as_time(value: str) -> bool:
    return utc_instant(value) is not None


NODES = tuple(str(n) for n in (1, 2, 3, 8, 17, max_nodes()))
PROFILES = (PROFILE.name,)
ENV_NAMES = tuple(ENVIRONMENTS)
TABLE_OR_JSON = Formats(("table", "json"))
NODES_OPTION = Opt("--nodes", NODES, is_node_count)
INSTANCE_OPTION = Opt("--instance", tuple(INSTANCE_TYPES), is_instance)
PROFILE_ARGUMENT = Positional(PROFILES, is_profile)


@pytest.fixture
def sagemaker(monkeypatch: pytest.MonkeyPatch) -> EmptySageMaker:
    return install(monkeypatch)


@pytest.fixture(scope="module")
def plot_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths for ``--plot``: only ``writable`` may be written (plan, compare); ``report --plot`` takes none of them."""
    root = tmp_path_factory.mktemp("plots")
    (root / "folder.png").mkdir()
    (root / "file.txt").write_text("x")
    (root / "full.png").symlink_to("/dev/full")
    return {
        "writable": str(root / "plan.png"),
        "directory": str(root),
        "directory named .png": str(root / "folder.png"),
        "below a file": str(root / "file.txt" / "plan.png"),
        "missing parent": str(root / "missing" / "plan.png"),
        "no .png": str(root / "plan"),
        "full disk": str(root / "full.png"),
        "file": str(root / "file.txt"),
        "empty": "",
    }


# --------------------------------------------------------------------------- the commands


COMMANDS = ("profiles", "plan", "estimate", "compare", "capacity", "report")


@fuzz(60)
@given(argv=st.one_of(st.just([]), st.lists(GARBAGE, min_size=1, max_size=3)))
def test_top_level(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, argv: list[str]) -> None:
    words = [Arg((word,), False) for word in argv] or [Arg((), False)]
    if any(word in COMMANDS for word in argv):  # `btk -- profiles` runs the command
        words = [Arg((word,), None) for word in argv]
    check(capsys, sagemaker, [], words)


@fuzz(60)
@given(args=command_line(TABLE_OR_JSON))
def test_profiles(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    check(capsys, sagemaker, ["profiles"], args)


@st.composite
def plan_target(draw: st.DrawFn, hostile: bool) -> list[Arg]:
    """A PROFILE, --env, or both (the profile on the environment's cluster); hostile: a bad one or neither."""
    targets = ["bad profile", "bad env", "neither"] if hostile else ["profile", "profile", "env", "both"]
    target = draw(st.sampled_from(targets))
    args: list[Arg] = []
    if target in ("profile", "both", "bad profile"):
        args += draw(PROFILE_ARGUMENT(target == "bad profile"))
    if target in ("env", "both", "bad env"):
        args += draw(Opt("--env", ENV_NAMES, is_environment, required=True)(target == "bad env"))
    if target == "neither":
        args.append(Arg((), False))
    return args


def plot_option(paths: dict[str, str]) -> Part:
    """``--plot``: mostly absent, onto a writable file now and then (a PNG takes a while); hostile: the other paths."""

    def strategy(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        cases = [case for case in paths if case != "writable"] if hostile else [None] * 8 + ["writable"]
        return st.sampled_from(cases).map(
            lambda case: [] if case is None else [Arg(("--plot", paths[case]), case == "writable")]
        )

    return strategy


@fuzz(260)
@given(data=st.data())
def test_plan(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, plot_paths: dict[str, str], data: st.DataObject
) -> None:
    args = data.draw(
        command_line(INSTANCE_OPTION, NODES_OPTION, TABLE_OR_JSON, plot_option(plot_paths), pins_option,
                     head=(plan_target,))
    )
    check(capsys, sagemaker, ["plan"], args)


BOOL_KNOBS = ("compile", "fused_loss")
GOOD_SETTINGS = (
    *(f"micro_batch_size={n}" for n in (1, 2, 4)),
    *(f"activation_checkpointing={mode}" for mode in CHECKPOINTING_MODES),
    *(f"{knob}={value}" for knob in BOOL_KNOBS for value in ("true", "false", "1", "0")),
)
#: Not one knob takes any of these (seq_len is left out: its bounds depend on the profile).
BAD_KNOB_VALUES = ("", " ", "-1", "nan", "x", "9" * 400, "1.5", "1e3", "inf", "\n")


def bad_setting() -> st.SearchStrategy[str]:
    unknown_key = bad_values(lambda v: v.strip() in KNOB_FIELDS).map(lambda key: f"{key}=1")
    knobs = [knob for knob in KNOB_FIELDS if knob != "seq_len"]
    bad_value = st.tuples(st.sampled_from(knobs), st.sampled_from(BAD_KNOB_VALUES)).map("=".join)
    no_equals = bad_values(lambda v: "=" in v)
    return st.one_of(unknown_key, bad_value, no_equals)


def settings_option(hostile: bool) -> st.SearchStrategy[list[Arg]]:
    """Up to three ``--set KEY=VALUE``, each knob once (twice is refused); hostile: one of them bad."""
    good = st.lists(Opt("--set", GOOD_SETTINGS, GOOD_SETTINGS.__contains__, required=True)(False), max_size=2,
                    unique_by=lambda args: args[-1].words[-1].removeprefix("--set=").partition("=")[0])
    if not hostile:
        return good.map(_flatten)
    bad = bad_setting().flatmap(lambda v: option("--set", v, False))
    return st.tuples(good.map(_flatten), bad).map(lambda both: both[0] + both[1]).flatmap(st.permutations).map(list)


def pins_option(hostile: bool) -> st.SearchStrategy[list[Arg]]:
    """``--set`` for plan and compare: the same values, but a good one is a pin the search may not satisfy (a
    plan that cannot fit is one line, exit 2), so its outcome is not known in advance."""
    return settings_option(hostile).map(
        lambda args: [arg if arg.valid is False else dataclasses.replace(arg, valid=None) for arg in args])


@fuzz(200)
@given(args=command_line(INSTANCE_OPTION, NODES_OPTION, settings_option, TABLE_OR_JSON, head=(PROFILE_ARGUMENT,)))
def test_estimate(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    check(capsys, sagemaker, ["estimate"], args)


def is_instance_list(value: str) -> bool:
    names = [name.strip() for name in value.split(",") if name.strip()]
    return bool(names) and all(is_instance(name) for name in names)


def is_token_count(value: str) -> bool:
    """A whole number of tokens, 1 to 10^18, in ASCII digits with an optional K/M/B/T suffix (``1.4T``)."""
    from decimal import Decimal

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]*)([KMBTkmbt]?)\s*", value)
    if match is None or not any(ch.isdigit() for ch in match[1]) or len(match[1]) > 20:
        return False
    tokens = Decimal(match[1]) * {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}[match[2].lower()]
    return tokens == tokens.to_integral_value() and 1 <= tokens <= 10**18


TOTAL_TOKENS_OPTION = Opt("--total-tokens", ("300B", "1", "1.4T", " 2000000 ", "5k"), is_token_count,
                          bad=("0", "1.5", "1e9", "3X", "2000000P"))
INSTANCE_LISTS = tuple(",".join(names) for names in (INSTANCE_TYPES, list(INSTANCE_TYPES)[:2], ["p5", " b200 "]))


@fuzz(140)
@given(data=st.data())
def test_compare(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, plot_paths: dict[str, str], data: st.DataObject
) -> None:
    instances = Opt("--instances", INSTANCE_LISTS, is_instance_list)
    args = data.draw(
        command_line(instances, NODES_OPTION, TOTAL_TOKENS_OPTION, TABLE_OR_JSON, plot_option(plot_paths),
                     pins_option, head=(PROFILE_ARGUMENT,))
    )
    check(capsys, sagemaker, ["compare"], args)


GOOD_TIMES = ("2031-01-05T00:00:00Z", "2031-02-01T00:00:00+00:00", "2031-03-01", "2031-01-10T12:00:00-05:00")
ODD_TIMES = tuple(date for date in DATES if parses_as_time(date))
#: Bad times, the far ones weighted up: they once escaped as OverflowError.
BAD_TIMES = FAR_DATES * 4 + tuple(date for date in DATES if not parses_as_time(date))
DURATIONS = tuple(str(hours) for hours in (24, 168, 336, 4368))


def _given(args: list[Arg], name: str) -> Arg | None:
    """The argument that sets option ``name``, if any."""
    for arg in args:
        if arg.words[:1] == (name,) or (len(arg.words) == 1 and arg.words[0].startswith(f"{name}=")):
            return arg
    return None


def _value(arg: Arg) -> str:
    return arg.words[1] if len(arg.words) == 2 else arg.words[0].split("=", 1)[1]


def _window_is_empty(args: list[Arg]) -> bool:
    """Valid --end-before (and --start-after, else the environment's start) with the end not after the start."""
    env, start, end = (_given(args, name) for name in ("--env", "--start-after", "--end-before"))
    if end is None or not end.valid or (start is not None and not start.valid):
        return False
    environment = ENVIRONMENTS.get(_value(env)) if env is not None and env.valid else None
    reserve = environment.capacity if environment and isinstance(environment.capacity, ReservePlanCapacity) else None
    begin = _instant(_value(start)) if start else (reserve.start_after if reserve else datetime.now(UTC))
    return _instant(_value(end)) <= begin


def _instant(text: str) -> datetime:
    moment = utc_instant(text)
    assert moment is not None
    return moment


ENV_OPTION = Opt("--env", ENV_NAMES, is_environment, required=True)


@fuzz(200)
@given(
    args=command_line(
        ENV_OPTION,
        Opt("--profile", PROFILES, is_profile, required=True),
        Opt("--start-after", GOOD_TIMES, parses_as_time, unsure=ODD_TIMES, bad=BAD_TIMES),
        Opt("--end-before", GOOD_TIMES, parses_as_time, unsure=ODD_TIMES, bad=BAD_TIMES),
        Opt("--duration-hours", DURATIONS, lambda v: _is_int(v) and is_sellable_plan_duration(int(v))),
        Opt("--instance-count", tuple(map(str, TRAINING_PLAN_INSTANCE_COUNTS)), _is_plan_count),
        TABLE_OR_JSON,
    )
)
def test_capacity_search(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    if _window_is_empty(args):
        args = [*args, Arg((), False)]
    check(capsys, sagemaker, ["capacity", "search"], args)


@fuzz(60)
@given(args=command_line(ENV_OPTION, TABLE_OR_JSON))
def test_capacity_show(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    check(capsys, sagemaker, ["capacity", "show"], args)


_DURATION = re.compile(r"^(\d{1,5})([hdw])$")


def is_since(value: str) -> bool:
    """A positive duration or a date before now (the test's own reading of ``--since``)."""
    match = _DURATION.match(value.strip().lower())
    if match is not None:
        return int(match.group(1)) > 0
    moment = utc_instant(value)
    return moment is not None and moment < datetime.now(UTC)


SINCE = ("30d", "12h", "2w", "99999h", "2024-01-01", "2024-06-01T00:00:00+00:00", "0001-01-02")


def json_schema_or_report(paths: dict[str, str]) -> st.SearchStrategy[list[Arg]]:
    """``--json-schema`` alone (refused with any other option) or a report window."""
    others = [[], ["--env", ENV_NAMES[0]], ["--since", "2d"], ["--format", "json"]]
    schema = st.sampled_from(others).map(lambda extra: [Arg(("--json-schema",)), Arg(tuple(extra), not extra)])

    def plot(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        """Absent (a report's three charts take a while); hostile: onto a file, below a file, empty."""
        if not hostile:
            return st.just([])
        return st.sampled_from(["file", "below a file", "empty"]).map(
            lambda case: [Arg(("--plot", paths[case]), False)]
        )

    window = command_line(
        ENV_OPTION,
        Opt("--profile", PROFILES, is_profile),
        Opt("--since", SINCE, is_since, bad=FAR_DATES * 4 + tuple(date for date in DATES if not is_since(date))),
        Formats(("table", "markdown", "json")),
        plot,
    )
    return st.one_of(schema, window, window, window)


@fuzz(200)
@given(data=st.data())
def test_report(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, plot_paths: dict[str, str], data: st.DataObject
) -> None:
    check(capsys, sagemaker, ["report"], data.draw(json_schema_or_report(plot_paths)))


IMPORTABLE = str(Path(__file__).resolve().parents[1] / "hf_configs" / "qwen3-8b.json")


@fuzz(120)
@given(
    args=command_line(
        Opt("--name", ("imported-qwen3", "q3"), lambda value: PROFILE_NAME.fullmatch(value) is not None, required=True),
        Formats(("python", "json")),
        head=(Positional((IMPORTABLE,), IMPORTABLE.__eq__),),
    )
)
def test_profile(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    check(capsys, sagemaker, ["profile", "import"], args)


@pytest.fixture(scope="module")
def evidence_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A valid runs file, a store to write, and places that are not evidence files."""
    from btk.hardware import get_instance_type
    from btk.planner.search import plan_profile

    root = tmp_path_factory.mktemp("evidence")
    knobs = plan_profile(PROFILE, get_instance_type("ml.p6-b200.48xlarge")).knobs
    run = {"id": "fuzz-1", "kind": "run", "profile": PROFILE.name, "architecture": PROFILE.architecture.model_dump(
        mode="json"), "instance_type": "ml.p6-b200.48xlarge", "nodes": 1, "knobs": knobs.model_dump(mode="json"),
        "tokens_per_second_per_gpu": 1000.0}
    (root / "runs.json").write_text(json.dumps({"version": 1, "runs": [run]}))
    (root / "folder").mkdir()
    (root / "not-json.json").write_text("{")
    return {"runs": str(root / "runs.json"), "store": str(root / "store.json"), "new store": str(root / "new.json"),
            "folder": str(root / "folder"), "not json": str(root / "not-json.json"),
            "absent": str(root / "absent.json"), "below a file": str(root / "runs.json" / "x.json"),
            "export": str(root / "export.json")}


def evidence_command_lines(paths: dict[str, str]) -> st.SearchStrategy[tuple[list[str], list[Arg]]]:
    """``evidence import FILE``, ``list``, ``export FILE``, ``push`` or ``pull --env ENV``, always with a store in a
    temporary folder (never the default one here); the hostile part: a store that is not one (a folder, not JSON,
    below a file), a runs file that is not one, a bad environment, a bad format, a stray word.
    Export writes a new file: the first export to a path passes, a later one is refused, so either exit is right
    there."""
    def store(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        good, bad = (paths["store"], paths["new store"]), (paths["folder"], paths["not json"], paths["below a file"])
        return st.sampled_from(bad if hostile else good).flatmap(lambda value: option("--evidence", value,
                                                                                      not hostile))

    def runs(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        bad = (paths["folder"], paths["not json"], paths["absent"], paths["below a file"])
        return st.sampled_from(bad if hostile else (paths["runs"],)).map(lambda value: [Arg((value,), not hostile)])

    def target(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        places = (paths["export"], paths["folder"], paths["not json"], paths["below a file"])
        return st.sampled_from(places).map(lambda value: [Arg((value,), None)])

    imported = command_line(store, head=(runs,)).map(lambda args: (["evidence", "import"], args))
    listed = command_line(store, TABLE_OR_JSON).map(lambda args: (["evidence", "list"], args))
    def deployed_env(hostile: bool) -> st.SearchStrategy[list[Arg]]:
        """A known environment may go either way: the empty account has no stack to push to (one line)."""
        if hostile:
            return ENV_OPTION(True)
        return st.sampled_from(ENV_NAMES).flatmap(lambda name: option("--env", name, None))

    exported = command_line(store, head=(target,)).map(lambda args: (["evidence", "export"], args))
    shared = [command_line(store, deployed_env).map(lambda args, verb=verb: (["evidence", verb], args))
              for verb in ("push", "pull")]
    return st.one_of(imported, listed, exported, *shared)


#: Rehearsing on demand: the reserve environment rehearses every execution itself (refused in one line).
REHEARSE_ENV_OPTION = Opt("--env", (ON_DEMAND_ENV.name,), lambda value: value == ON_DEMAND_ENV.name, required=True,
                          bad=tuple(name for name in ENV_NAMES if name != ON_DEMAND_ENV.name))


@fuzz(40)
@given(args=command_line(REHEARSE_ENV_OPTION, head=(PROFILE_ARGUMENT,)))
def test_rehearse(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, args: list[Arg]) -> None:
    """Started without waiting (the stand-in has no execution to wait for): valid input starts one, exit 0."""
    check(capsys, sagemaker, ["rehearse", "--no-wait"], args)


@fuzz(120)
@given(data=st.data())
def test_evidence(capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, evidence_paths: dict[str, str],
                  data: st.DataObject) -> None:
    command, args = data.draw(evidence_command_lines(evidence_paths))
    check(capsys, sagemaker, command, args)


@dataclass
class EmptyAccount(EmptySageMaker):
    """The empty stand-in for every service, with an identity (the doctor needs one to start)."""

    def get_caller_identity(self, **parameters: Any) -> dict[str, Any]:
        self.calls.append("get_caller_identity")
        return {
            "UserId": "AROAFUZZ:fuzz",
            "Account": "123456789012",
            "Arn": "arn:aws:sts::123456789012:assumed-role/f/z",
        }


@fuzz(60)
@given(args=command_line(ENV_OPTION, TABLE_OR_JSON))
def test_doctor(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, monkeypatch: pytest.MonkeyPatch, args: list[Arg]
) -> None:
    account = EmptyAccount(calls=sagemaker.calls)
    monkeypatch.setattr("btk.doctor.aws.client_factory", lambda region, credentials=None: lambda service: account)
    sagemaker.calls.clear()
    outcome = btk(capsys, ["doctor", *flat(args)])
    if any(arg.valid is False for arg in args):
        assert outcome.code == 2, (args, outcome)
        assert_one_line_error(outcome)
        assert sagemaker.calls == [], (args, "invalid input reached AWS")
    else:
        assert outcome.code in (0, 1), (args, outcome)
        assert outcome.out.strip() and "Traceback" not in outcome.err, (args, outcome)


@dataclass(frozen=True)
class Flag:
    """An option without a value: absent or given; hostile: given a value (``--yes=…``)."""

    name: str

    def __call__(self, hostile: bool) -> st.SearchStrategy[list[Arg]]:
        if not hostile:
            return st.sampled_from([[], [Arg((self.name,))]])
        return GARBAGE.map(lambda value: [Arg((f"{self.name}={value}",), False)])


ACCOUNT_OPTION = Opt("--account", ("123456789012", "000000000001"), lambda text: re.fullmatch(r"[0-9]{12}", text)
                     is not None)


@fuzz(60)
@given(args=command_line(ENV_OPTION, ACCOUNT_OPTION, Flag("--yes"), Flag("--dry-run")))
def test_bootstrap(
    capsys: pytest.CaptureFixture[str], sagemaker: EmptySageMaker, monkeypatch: pytest.MonkeyPatch, args: list[Arg]
) -> None:
    """Invalid input runs nothing; valid input runs the two commands it prints (none with --dry-run)."""
    import subprocess

    ran: list[list[str]] = []

    def run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr("btk.cli.bootstrap.subprocess.run", run)
    outcome = btk(capsys, ["bootstrap", *flat(args)])
    if any(arg.valid is False for arg in args):
        assert_one_line_error(outcome)
        assert ran == [], (args, "invalid input ran a command")
    else:
        assert outcome.code == 0, (args, outcome)
        printed = [line for line in outcome.out.splitlines() if line.startswith("$ ")]
        assert len(printed) == 2, (args, outcome)
        assert len(ran) == (0 if _given(args, "--dry-run") else 2), (args, ran)


def _sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_sub_command_is_fuzzed() -> None:
    """A new sub-command needs its own test here."""
    from btk.cli import build_parser

    commands = _sub_commands(build_parser())
    fuzzed = {f"test_{name}" for name in commands if name != "capacity"}
    fuzzed |= {f"test_capacity_{name}" for name in _sub_commands(commands["capacity"])}
    assert fuzzed <= set(globals())
