"""Lookup of the user's profiles (``profiles/``) and environments (``environments.py``).

The user-editable modules live at the repository root; this module imports them lazily so
that the rest of the core does not depend on them. A definition that fails validation while
they import is reported in one line naming the file, the profile or environment, and the
field: ``profiles/llama.py: profile 'mistral-7b': architecture.num_attention_heads: ...``. Every
other fault of those files is one line naming the file too: a module that is missing, a
directory, a dangling link or unreadable, and any exception its code raises while importing
(``profiles/qwen.py: defines no PROFILES, which profiles/__init__.py:14 reads``).
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from btk.environment import EnvironmentConfig
from btk.errors import BtkError, UnknownNameError, one_line, printable
from btk.profile import ModelProfile


@dataclass(frozen=True)
class UserModule:
    """One of the user's modules: what it is called, what it defines, how errors name it.

    ``path``: where it lives, relative to the repository root (``environments.py``, ``profiles``).
    """

    module: str
    noun: str
    root: type[BaseModel]
    collection: str
    path: str


PROFILES = UserModule("profiles", "profile", ModelProfile, "PROFILES", "profiles")
ENVIRONMENTS = UserModule("environments", "environment", EnvironmentConfig, "ENVIRONMENTS", "environments.py")
ENVIRONMENTS_FILE = ENVIRONMENTS.path
#: The repository root: the user's modules sit beside ``btk/`` (the package installs them from there).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
_CANNOT_IMPORT = re.compile(r"cannot import name '([^']+)'")


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"


def _module_location(module: str) -> tuple[Path, Path]:
    """(the directory the display paths are relative to, the file or package of ``module``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise BtkError(f"{module}: not found; run from the repository root")
    origin = Path(spec.origin).resolve()
    location = origin.parent if spec.submodule_search_locations else origin
    return location.parent, location


def _user_frames(error: BaseException, location: Path) -> list[tuple[FrameType, traceback.FrameSummary]]:
    """The traceback's frames that run code in ``location`` (a file, or a package's directory)."""
    pairs = zip(traceback.walk_tb(error.__traceback__), traceback.extract_tb(error.__traceback__), strict=True)
    return [
        (frame, summary)
        for (frame, _), summary in pairs
        if Path(summary.filename).resolve() == location or location in Path(summary.filename).resolve().parents
    ]


@lru_cache(maxsize=32)
def _syntax_tree(filename: str) -> ast.Module:
    return ast.parse(Path(filename).read_text(encoding="utf-8"))


def _encloses(node: ast.expr, summary: traceback.FrameSummary) -> bool:
    if summary.lineno is None or node.end_lineno is None or node.end_col_offset is None:
        return False
    start = (node.lineno, node.col_offset)
    end = (node.end_lineno, node.end_col_offset)
    here = (summary.lineno, summary.colno or 0)
    there = (summary.end_lineno or summary.lineno, summary.end_colno or 0)
    return start <= here and there <= end


def _name_values(node: ast.expr) -> Iterator[ast.expr]:
    """The expressions a call's ``name=`` keyword or a dict's ``"name"`` key gives."""
    if isinstance(node, ast.Call):
        yield from (keyword.value for keyword in node.keywords if keyword.arg == "name")
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "name":
                yield value


def _resolve(value: ast.expr, frame: FrameType) -> str | None:
    """A literal, or a variable's value in ``frame``; ``None`` for anything computed."""
    if isinstance(value, ast.Constant):
        resolved: Any = value.value
    elif isinstance(value, ast.Name):
        resolved = frame.f_locals.get(value.id, frame.f_globals.get(value.id))
    else:
        return None
    return resolved if isinstance(resolved, str) else None


def _owner_in_source(frames: list[tuple[FrameType, traceback.FrameSummary]]) -> str | None:
    """The ``name=`` of the innermost call or dict around the failing expression, frame by frame."""
    for frame, summary in reversed(frames):
        enclosing = [
            node
            for node in ast.walk(_syntax_tree(summary.filename))
            if isinstance(node, ast.Call | ast.Dict) and _encloses(node, summary)
        ]
        enclosing.sort(key=lambda node: (node.lineno, node.col_offset), reverse=True)
        for node in enclosing:
            for value in _name_values(node):
                name = _resolve(value, frame)
                if name is not None:
                    return name
    return None


def _owner_in_input(error: ValidationError, user: UserModule) -> str | None:
    """The ``name`` the failing profile or environment was given, when pydantic kept it."""
    if error.title != user.root.__name__:
        return None
    for item in error.errors():
        given = item.get("input")
        if isinstance(given, dict) and isinstance(given.get("name"), str):
            return str(given["name"])
    return None


def definition_error(error: ValidationError, user: UserModule) -> BtkError:
    """One line for a definition of ``user`` that failed while the module imported."""
    base, location = _module_location(user.module)
    frames = _user_frames(error, location)
    fields = one_line(error, root=user.root)
    if not frames:
        return BtkError(f"{location.relative_to(base).as_posix()}: {fields}")
    innermost = frames[-1][1]
    where = Path(innermost.filename).resolve().relative_to(base).as_posix()
    owner = _owner_in_input(error, user) or _owner_in_source(frames)
    if owner is None:
        return BtkError(f"{where}:{innermost.lineno}: {fields}")
    return BtkError(f"{where}: {user.noun} {owner!r}: {fields}")


def _import_user_module(user: UserModule) -> ModuleType:
    """Import ``profiles`` or ``environments``; anything that stops it is a one-line error naming the file.

    An invalid definition names the field (:func:`definition_error`); a module that is missing,
    a directory, a dangling link or unreadable names what it is; any other exception its code
    raises names the file and line (:func:`code_error`).
    """
    try:
        module = importlib.import_module(user.module)
    except ValidationError as error:
        raise definition_error(error, user) from None
    except ModuleNotFoundError as error:
        if error.name != user.module:
            raise code_error(error, user) from None
        raise missing_module_error(user) from None
    except OSError as error:
        where = _relative(Path(error.filename), _module_location(user.module)[0]) if error.filename else user.path
        raise BtkError(printable(f"{where}: cannot be read ({error.strerror or error})")) from None
    except Exception as error:  # the user's own code: any mistake in it is theirs to fix, in one line
        raise code_error(error, user) from None
    return module


def _relative(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` when it is inside it (as errors name files), else as it is."""
    resolved = path.resolve()
    return resolved.relative_to(base).as_posix() if resolved.is_relative_to(base) else str(path)


def missing_module_error(user: UserModule) -> BtkError:
    """One line for a user module the import system did not find: a dangling link, a directory, or nothing.

    The places looked at are those an import searches (each directory on the Python path), then
    the repository root beside ``btk/``, where the package installs them from.
    """
    file_expected = user.path.endswith(".py")
    directories = [Path(entry or ".") for entry in sys.path if isinstance(entry, str)]
    for place in (directory / user.path for directory in [*directories, PROJECT_ROOT]):
        if place.is_symlink() and not place.exists():
            return BtkError(printable(f"{user.path}: a symbolic link to {os.readlink(place)}, which does not exist"))
        if file_expected and place.is_dir():
            return BtkError(printable(f"{user.path}: is a directory ({place}), not a Python file"))
        if not file_expected and place.is_file():
            return BtkError(printable(f"{user.path}: is a file ({place}), not the package directory {user.path}/"))
    return BtkError(printable(f"{user.path}: not found; btk reads it from the repository root ({PROJECT_ROOT})"))


def code_error(error: Exception, user: UserModule) -> BtkError:
    """One line for an exception the user's module raised while it imported: the file and line, and the error."""
    base, location = _module_location(user.module)
    if isinstance(error, AttributeError) and isinstance(error.obj, ModuleType) and error.obj.__file__:
        # e.g. an empty family module that profiles/__init__.py reads PROFILES from
        source = _relative(Path(error.obj.__file__), base)
        return BtkError(
            printable(f"{source}: defines no {error.name}, which {_raised_at(error, base, location)} reads")
        )
    missing = _CANNOT_IMPORT.match(str(error)) if isinstance(error, ImportError) else None
    if missing is not None and isinstance(error, ImportError) and error.name == user.module:
        # `from profiles import mistral` with no profiles/mistral.py: Python blames a circular import
        where = _raised_at(error, base, location)
        return BtkError(printable(f"{where}: {user.module} has no module or name {missing.group(1)!r}"))
    if isinstance(error, SyntaxError) and error.filename:
        where = f"{_relative(Path(error.filename), base)}:{error.lineno}"
        return BtkError(printable(f"{where}: {type(error).__name__}: {error.msg}"))
    what = str(error) if isinstance(error, BtkError) else f"{type(error).__name__}: {error}"
    return BtkError(printable(f"{_raised_at(error, base, location)}: {what}"))


def _raised_at(error: Exception, base: Path, location: Path) -> str:
    """``file:line`` of the innermost frame of the user's code in ``error``'s traceback (else the module's path)."""
    frames = _user_frames(error, location)
    if not frames:
        return _relative(location, base)
    innermost = frames[-1][1]
    return f"{_relative(Path(innermost.filename), base)}:{innermost.lineno}"


def _definitions(user: UserModule) -> tuple[Any, ...]:
    """The module's collection (``PROFILES``, ``ENVIRONMENTS``), checked to hold only ``user.root``."""
    collection = getattr(_import_user_module(user), user.collection, None)
    if not isinstance(collection, tuple | list) or not all(isinstance(item, user.root) for item in collection):
        raise BtkError(f"{_display_name(user)}: {user.collection} must be a tuple of {user.root.__name__}")
    return tuple(collection)


def _display_name(user: UserModule) -> str:
    """``environments.py`` or ``profiles/``."""
    _, location = _module_location(user.module)
    return location.name if location.is_file() else f"{location.name}/"


def _by_name(user: UserModule) -> dict[str, Any]:
    """The module's definitions by name; a name defined twice is an error naming where each one is."""
    found: dict[str, Any] = {}
    for definition in _definitions(user):
        if definition.name in found:
            first = found[definition.name]
            places = " and ".join(dict.fromkeys(defined_in(user, item) for item in (first, definition)))
            raise UnknownNameError(
                f"{_display_name(user)}: {user.noun} name {definition.name!r} is defined twice ({places}): "
                f"rename one of them"
            )
        found[definition.name] = definition
    return found


def defined_in(user: UserModule, definition: Any) -> str:
    """The file of the user's code that holds ``definition`` in a collection (``profiles/llama.py``): the
    loaded module of ``user``'s package whose collection holds that very object, else the package itself."""
    base, _ = _module_location(user.module)
    prefix = f"{user.module}."
    for name, module in sorted(sys.modules.items()):
        if not name.startswith(prefix) or module is None:
            continue
        collection = getattr(module, user.collection, None)
        if isinstance(collection, tuple | list) and any(item is definition for item in collection):
            origin = getattr(module, "__file__", None)
            if origin:
                return _relative(Path(origin), base)
    return _display_name(user)


def profile_defined_in(name: str) -> str | None:
    """Where profile ``name`` is defined (``profiles/llama.py``), or ``None`` when no profile has that name."""
    profile = all_profiles().get(name)
    return None if profile is None else defined_in(PROFILES, profile)


@lru_cache(maxsize=1)
def all_profiles() -> dict[str, ModelProfile]:
    """Every profile in ``profiles/``, by name; duplicate names are an error."""
    return _by_name(PROFILES)


def get_profile(name: str) -> ModelProfile:
    """The profile called ``name``; an unknown name suggests close ones."""
    catalog = all_profiles()
    if name in catalog:
        return catalog[name]
    raise UnknownNameError(f"unknown profile {name!r}{_suggest(name, sorted(catalog))}")


def environment_profiles(env: EnvironmentConfig) -> dict[str, ModelProfile]:
    """The profiles ``env`` trains, by name; one that ``profiles/`` lacks is an error naming the environment
    and the file that lists it."""
    try:
        return {name: get_profile(name) for name in env.profiles}
    except UnknownNameError as error:
        raise UnknownNameError(
            f"{_display_name(ENVIRONMENTS)}: environment {env.name!r}: profiles: {error}: add it to "
            f"{_display_name(PROFILES)} or remove it from the environment"
        ) from None


@lru_cache(maxsize=1)
def all_environments() -> dict[str, EnvironmentConfig]:
    """Every environment in ``environments.py``, by name; duplicate names are an error."""
    return _by_name(ENVIRONMENTS)


def get_environment(name: str) -> EnvironmentConfig:
    environments = all_environments()
    if name in environments:
        return environments[name]
    raise UnknownNameError(f"unknown environment {name!r}{_suggest(name, sorted(environments))}")


def environment_error(name: str, error: ValidationError, source: str = ENVIRONMENTS_FILE) -> BtkError:
    """One line for environment ``name`` that failed validation (``source``: where its values came from)."""
    return BtkError(f"{source}: environment {name!r}: {one_line(error, root=EnvironmentConfig)}")


def default_environment_name() -> str:
    """``DEFAULT_ENVIRONMENT`` of ``environments.py``: the environment chosen without ``-c env=``."""
    name = getattr(_import_user_module(ENVIRONMENTS), "DEFAULT_ENVIRONMENT", None)
    if not isinstance(name, str) or name not in all_environments():
        raise BtkError(f"{ENVIRONMENTS_FILE}: DEFAULT_ENVIRONMENT must name one of ENVIRONMENTS (got {name!r})")
    return name
