"""Configuration errors name the file, the profile or environment, and the field, in one line.

Every case writes its own ``profiles/`` package or ``environments.py`` under ``tmp_path`` and
loads it through ``btk.catalog``, the path ``btk`` and ``app.py`` take; the real modules are
never edited.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
from stack_synth import REPO

from app import load_environment, training_instance_types
from btk import catalog
from btk.errors import BtkError

USER_MODULES = ("profiles", "environments")

ARCH = (
    "ModelArchitecture(num_layers=2, hidden_size=4096, num_attention_heads={heads}, num_kv_heads=2, "
    "ffn_hidden_size=128, vocab_size=256, max_context=4096)"
)
PROFILE = (
    "ModelProfile(name={name}, family='test', architecture=" + ARCH + ", "
    "training=TrainingIntent(seq_len={seq_len}, global_batch_tokens=65536))"
)
PROFILE_IMPORTS = "from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent\n"
ENV_IMPORTS = "from btk.environment import DataStageConfig, EnvironmentConfig, ReservePlanCapacity\n"


def _environment(env: str, **fields: str) -> str:
    values = {"name": repr(env), "availability_zone": "'us-east-1a'", "profiles": "('tiny-1b',)", **fields}
    return "EnvironmentConfig(" + ", ".join(f"{key}={value}" for key, value in values.items()) + ")"


@pytest.fixture
def user_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory that stands in for the repository root's user modules while the test runs."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in USER_MODULES}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    catalog.all_profiles.cache_clear()
    catalog.all_environments.cache_clear()
    (tmp_path / "profiles").mkdir()
    _write(tmp_path / "profiles" / "__init__.py", PROFILE_IMPORTS + "PROFILES = (" + PROFILE.format(
        name="'tiny-1b'", heads=32, seq_len=2048) + ",)\n")
    yield tmp_path
    for name in [name for name in sys.modules if name.split(".")[0] in USER_MODULES]:
        del sys.modules[name]
    sys.modules.update(saved)
    catalog.all_profiles.cache_clear()
    catalog.all_environments.cache_clear()


def _write(path: Path, text: str) -> None:
    path.write_text(dedent(text), encoding="utf-8")


def _environments(root: Path, *definitions: str, default: str = "dev") -> None:
    names = ", ".join(f"E{index}" for index in range(len(definitions)))
    body = "".join(f"E{index} = {definition}\n" for index, definition in enumerate(definitions))
    tail = f"ENVIRONMENTS = ({names},)\nDEFAULT_ENVIRONMENT = {default!r}\n"
    _write(root / "environments.py", f"{ENV_IMPORTS}{body}{tail}")


def _error(load: object) -> str:
    assert callable(load)
    with pytest.raises(BtkError) as caught:
        load()
    message = str(caught.value)
    assert "\n" not in message and "(root)" not in message
    return message


def test_a_bad_architecture_in_a_helper_names_file_profile_and_field(user_root: Path) -> None:
    """The profile's name is found through the family helper's ``name=name``, as profiles/llama.py writes it."""
    _write(user_root / "profiles" / "__init__.py", "from profiles.llama import PROFILES\n")
    _write(
        user_root / "profiles" / "llama.py",
        PROFILE_IMPORTS
        + "def _family(name: str, heads: int) -> ModelProfile:\n"
        + "    return " + PROFILE.format(name="name", heads="heads", seq_len=2048) + "\n"
        + "GOOD = _family('tiny-1b', 32)\n"
        + "BAD = _family('mistral-7b', 30)\n"
        + "PROFILES = (GOOD, BAD)\n",
    )
    assert _error(catalog.all_profiles) == (
        "profiles/llama.py: profile 'mistral-7b': architecture.num_attention_heads: num_attention_heads (30) "
        "must divide hidden_size (4096); pick a head count that divides it"
    )


def test_a_bad_profile_written_inline_names_the_field_its_validator_names(user_root: Path) -> None:
    _write(
        user_root / "profiles" / "__init__.py",
        PROFILE_IMPORTS + "PROFILES = (" + PROFILE.format(name="'long-ctx'", heads=32, seq_len=8192) + ",)\n",
    )
    message = _error(catalog.all_profiles)
    assert message.startswith("profiles/__init__.py: profile 'long-ctx': training.seq_len: training.seq_len (8192)")


def test_a_definition_without_a_name_in_reach_names_file_and_line(user_root: Path) -> None:
    _write(
        user_root / "profiles" / "__init__.py",
        PROFILE_IMPORTS + "\nARCH = " + ARCH.format(heads=30) + "\nPROFILES = ()\n",
    )
    assert _error(catalog.all_profiles).startswith(
        "profiles/__init__.py:3: architecture.num_attention_heads: num_attention_heads (30)"
    )


def test_a_bad_fsx_size_names_file_environment_and_field_as_the_docs_show(user_root: Path) -> None:
    """The line is the one README.md and docs/deploy.md print for the same mistake."""
    _environments(
        user_root,
        _environment("dev"),
        _environment("prod", data_stage="DataStageConfig(mode='fsx', fsx_storage_capacity_gib=1300)"),
    )
    message = _error(catalog.all_environments)
    assert message == (
        "environments.py: environment 'prod': data_stage.fsx_storage_capacity_gib: 1300 GiB is not a valid "
        "PERSISTENT_2 size: use 1200 or a multiple of 2400"
    )
    for document in ("README.md", "docs/deploy.md"):
        text = " ".join((REPO / document).read_text(encoding="utf-8").split())
        assert f"btk: error: {message}" in text, document


def test_the_cdk_entry_point_reports_a_bad_environment_the_same_way(user_root: Path) -> None:
    _environments(user_root, _environment("dev"), _environment("staging", instance_type="'p9'"))
    message = _error(lambda: load_environment({"env": "dev"}))
    assert message.startswith(
        "environments.py: environment 'staging': instance_type: 'p9' is not a SageMaker instance type name"
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"vpc_cidr": "'banana'"}, "vpc_cidr: 'banana' is not an IPv4 network"),
        ({"tags": "{'aws:owner': 'me'}"}, "tags: key 'aws:owner' starts with 'aws:'"),
        ({"name": "'dev\\n'"}, "name: must be a lower-case slug"),
        ({"capacity": "ReservePlanCapacity(start_after='2027-01-04T00:00:00Z', duration_hours=48, "
                      "instance_count=2, max_upfront_fee=float('inf'), purchase_approved=True)"},
         "capacity.max_upfront_fee: Input should be a finite number"),
    ],
)
def test_environment_fields_are_named_with_their_path(user_root: Path, fields: dict[str, str], expected: str) -> None:
    _environments(user_root, _environment("dev", **fields))
    message = _error(catalog.all_environments)
    assert re.match(r"environments\.py(:\d+)?: ", message)
    assert expected in message


def test_a_model_level_rule_of_an_environment_names_its_field(user_root: Path) -> None:
    _environments(user_root, _environment("dev", capacity="ReservePlanCapacity("
                  "start_after='2027-01-04T00:00:00Z', end_before='2027-01-05T00:00:00Z', duration_hours=48, "
                  "instance_count=2, max_upfront_fee=1000.0, purchase_approved=True)"))
    message = _error(catalog.all_environments)
    assert message.startswith("environments.py: environment 'dev': capacity.end_before: end_before (2027-01-05")


def test_two_environments_with_one_name_are_refused(user_root: Path) -> None:
    _environments(user_root, _environment("dev"), _environment("dev"))
    assert _error(catalog.all_environments) == (
        "environments.py: environment name 'dev' is defined twice (environments.py): rename one of them")


def test_one_profile_name_in_two_family_modules_names_both(user_root: Path) -> None:
    _write(
        user_root / "profiles" / "__init__.py",
        "from profiles import llama, qwen\nFAMILY_MODULES = (llama, qwen)\n"
        "PROFILES = tuple(profile for module in FAMILY_MODULES for profile in module.PROFILES)\n",
    )
    for module in ("llama", "qwen"):
        _write(user_root / "profiles" / f"{module}.py", PROFILE_IMPORTS + "PROFILES = (" + PROFILE.format(
            name="'tiny-1b'", heads=32, seq_len=2048) + ",)\n")
    assert _error(catalog.all_profiles) == (
        "profiles/: profile name 'tiny-1b' is defined twice (profiles/llama.py and profiles/qwen.py): "
        "rename one of them")


def test_a_default_environment_that_does_not_exist_is_named(user_root: Path) -> None:
    _environments(user_root, _environment("dev"), default="prod")
    assert _error(lambda: load_environment({})).startswith("environments.py: DEFAULT_ENVIRONMENT must name one of")


def test_a_broken_profile_is_not_reported_as_the_environments_fault(user_root: Path) -> None:
    _environments(user_root, _environment("dev"))
    _write(
        user_root / "profiles" / "__init__.py",
        PROFILE_IMPORTS + "PROFILES = (" + PROFILE.format(name="'tiny-1b'", heads=30, seq_len=2048) + ",)\n",
    )
    assert _error(lambda: load_environment({"env": "dev"})).startswith(
        "profiles/__init__.py: profile 'tiny-1b': architecture.num_attention_heads:"
    )


def test_a_collection_of_the_wrong_type_is_named(user_root: Path) -> None:
    _write(user_root / "environments.py", "ENVIRONMENTS = ('dev',)\nDEFAULT_ENVIRONMENT = 'dev'\n")
    assert _error(catalog.all_environments) == "environments.py: ENVIRONMENTS must be a tuple of EnvironmentConfig"


def test_an_instance_type_sagemaker_does_not_train_on_is_named_by_the_entry_point(user_root: Path) -> None:
    _environments(user_root, _environment("dev", instance_type="'ml.p9.48xlarge'"))
    assert _error(lambda: load_environment({"env": "dev"})) == (
        "environments.py: environment 'dev': instance_type: ml.p9.48xlarge is not a SageMaker training instance "
        "type (botocore's TrainingInstanceType)"
    )


def test_every_catalogued_instance_type_is_one_sagemaker_trains_on() -> None:
    # The entry point asks botocore only about instance types outside the catalog.
    from btk.hardware import INSTANCE_TYPES

    assert set(INSTANCE_TYPES) <= set(training_instance_types())


def test_planning_an_environment_on_an_uncatalogued_instance_names_it(user_root: Path) -> None:
    from btk.planner.search import plan_environment

    _environments(user_root, _environment("dev", instance_type="'ml.g5.48xlarge'"))
    with pytest.raises(BtkError, match=r"^environment 'dev': instance_type: instance type 'ml.g5.48xlarge' is not"):
        plan_environment(catalog.get_environment("dev"))


@pytest.fixture
def only_user_root(user_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``user_root`` as the only place the user's modules can come from: the repository root (on the Python
    path, and mapped by the editable install's finder) is hidden, so a module missing there is missing."""
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if Path(entry or ".").resolve() != REPO])
    finders = [finder for finder in sys.meta_path if "__editable__" not in getattr(finder, "__module__", "")]
    monkeypatch.setattr(sys, "meta_path", finders)
    importlib.invalidate_caches()
    assert importlib.util.find_spec("environments") is None, "the repository's environments.py is still reachable"
    return user_root


def test_a_missing_environments_file_is_named(only_user_root: Path) -> None:
    assert _error(catalog.all_environments) == (
        f"environments.py: not found; btk reads it from the repository root ({catalog.PROJECT_ROOT})"
    )


def test_an_environments_file_that_is_a_directory_is_named(only_user_root: Path) -> None:
    (only_user_root / "environments.py").mkdir()
    assert _error(catalog.all_environments) == (
        f"environments.py: is a directory ({only_user_root / 'environments.py'}), not a Python file"
    )


def test_an_environments_file_that_is_a_dangling_link_is_named(only_user_root: Path) -> None:
    (only_user_root / "environments.py").symlink_to(only_user_root / "gone.py")
    assert _error(catalog.default_environment_name) == (
        f"environments.py: a symbolic link to {only_user_root / 'gone.py'}, which does not exist"
    )


def test_an_unreadable_environments_file_is_named_not_blamed_on_the_output(
    only_user_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read permission is refused by injection: the tests may run as root, who reads any file."""
    import importlib.machinery

    from btk.cli import main

    _environments(only_user_root, _environment("dev"))
    (only_user_root / "environments.py").chmod(0)
    read = importlib.machinery.SourceFileLoader.get_data

    def denied(self: Any, path: str) -> bytes:
        if Path(path).name.startswith("environments."):
            raise PermissionError(13, "Permission denied", path)
        return read(self, path)

    monkeypatch.setattr(importlib.machinery.SourceFileLoader, "get_data", denied)
    assert _error(catalog.all_environments) == "environments.py: cannot be read (Permission denied)"
    assert main(["plan", "--env", "dev"]) == 2
    assert capsys.readouterr() == ("", "btk: error: environments.py: cannot be read (Permission denied)\n")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("ENVIRONMENTS = (\n", "environments.py:1: SyntaxError: '(' was never closed"),
        ("X = 1\nENVIRONMENTS = (DEV,)\n", "environments.py:2: NameError: name 'DEV' is not defined"),
        ("import not_a_module_anywhere\n", "environments.py:1: ModuleNotFoundError: No module named "
                                           "'not_a_module_anywhere'"),
        ("raise RuntimeError('a\\nb')\n", "environments.py:1: RuntimeError: a\\nb"),
    ],
)
def test_code_in_environments_that_raises_is_one_line_naming_file_and_line(
    user_root: Path, source: str, expected: str
) -> None:
    _write(user_root / "environments.py", source)
    assert _error(catalog.all_environments) == expected


def test_an_empty_family_module_is_named(user_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from btk.cli import main

    _write(
        user_root / "profiles" / "__init__.py",
        "from profiles import llama, qwen\nFAMILY_MODULES = (llama, qwen)\n"
        "PROFILES = tuple(profile for module in FAMILY_MODULES for profile in module.PROFILES)\n",
    )
    _write(user_root / "profiles" / "llama.py", PROFILE_IMPORTS + "PROFILES = (" + PROFILE.format(
        name="'tiny-1b'", heads=32, seq_len=2048) + ",)\n")
    _write(user_root / "profiles" / "qwen.py", "")
    expected = "profiles/qwen.py: defines no PROFILES, which profiles/__init__.py:3 reads"
    assert _error(catalog.all_profiles) == expected
    assert main(["profiles"]) == 2
    assert capsys.readouterr() == ("", f"btk: error: {expected}\n")


def test_a_family_module_that_does_not_exist_is_named(user_root: Path) -> None:
    _write(user_root / "profiles" / "__init__.py", "from profiles import mistral\nPROFILES = mistral.PROFILES\n")
    assert _error(catalog.all_profiles) == "profiles/__init__.py:1: profiles has no module or name 'mistral'"
