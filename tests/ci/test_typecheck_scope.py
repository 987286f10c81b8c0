"""The type check skips the parts of aws_cdk and other large packages the kit never calls (pyproject.toml's
mypy overrides): every module the kit's own code imports must still be followed, or what it calls there is
silently `Any`. Read with mypy's own config parser, so the precedence between the overrides is mypy's."""
from __future__ import annotations

import ast
import importlib.util
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from mypy.config_parser import parse_config_file
from mypy.options import Options

ROOT = Path(__file__).resolve().parents[2]

# Imported by the kit on purpose, typed `Any` where used (transformers' config and model classes, looked up by
# model type).
UNFOLLOWED_BY_DESIGN = {"transformers": {"btk/hf_import.py", "btk/hf_proof.py"}}


def _typecheck_targets() -> list[Path]:
    """The paths `make typecheck` hands mypy, read from the Makefile's recipe."""
    recipe = re.search(r"^typecheck:.*\n\t\$\(VENV\)/bin/mypy (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe, "Makefile: no `typecheck` recipe running mypy"
    return [ROOT / part for part in recipe.group(1).split()]


def _python_files() -> Iterator[Path]:
    for target in _typecheck_targets():
        yield from (sorted(target.rglob("*.py")) if target.is_dir() else [target])


def _is_submodule(package: str, name: str) -> bool:
    spec = importlib.util.find_spec(package)
    where = spec.submodule_search_locations if spec else None
    return bool(where) and any((Path(folder) / name).is_dir() or (Path(folder) / f"{name}.py").is_file()
                               for folder in where or [])


def _imported_modules(path: Path) -> Iterator[str]:
    """Every module a file imports, `from package import submodule` included."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module != "__future__":
            yield node.module
            if "." not in node.module:  # `from aws_cdk import aws_iam`: finding a top-level package imports nothing
                yield from (f"{node.module}.{alias.name}" for alias in node.names
                            if _is_submodule(node.module, alias.name))


@pytest.fixture(scope="module")
def mypy_options() -> Options:
    options = Options()
    errors = io.StringIO()
    parse_config_file(options, lambda: None, str(ROOT / "pyproject.toml"), io.StringIO(), errors)
    assert not errors.getvalue(), errors.getvalue()
    return options


def test_every_module_the_kit_imports_is_followed(mypy_options: Options) -> None:
    unfollowed = []
    for path in _python_files():
        relative = path.relative_to(ROOT).as_posix()
        for module in sorted(set(_imported_modules(path))):
            if mypy_options.clone_for_module(module).follow_imports == "normal":
                continue
            if relative not in UNFOLLOWED_BY_DESIGN.get(module.split(".")[0], set()):
                unfollowed.append(f"{relative}: {module}")
    assert not unfollowed, f"imported but skipped by pyproject.toml's mypy overrides: {unfollowed}"


def test_the_overrides_skip_what_they_say(mypy_options: Options) -> None:
    """A guard on the test above: the overrides are read (a service module the kit does not use is skipped),
    the kit's modules and the trainer's torch are followed."""
    assert mypy_options.clone_for_module("aws_cdk.aws_quicksight").follow_imports == "skip"
    assert mypy_options.clone_for_module("aws_cdk.aws_iam").follow_imports == "normal"
    assert mypy_options.clone_for_module("aws_cdk").follow_imports == "normal"
    assert mypy_options.clone_for_module("torch.distributed").follow_imports == "normal"
    assert mypy_options.clone_for_module("btk.cli").follow_imports == "normal"


def test_the_scan_sees_submodule_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from aws_cdk import Stack, aws_quicksight as qs\nimport aws_cdk.aws_iam\n")
    assert set(_imported_modules(probe)) == {"aws_cdk", "aws_cdk.aws_quicksight", "aws_cdk.aws_iam"}
