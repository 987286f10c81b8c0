"""Lookup of the user's profiles (``profiles/``) and environments (``environments.py``).

The user-editable modules live at the repository root; this module imports them lazily so
that the rest of the core does not depend on them.
"""

from __future__ import annotations

import difflib
import importlib
from functools import lru_cache
from types import ModuleType

from pydantic import ValidationError

from btk.environment import EnvironmentConfig
from btk.errors import BtkError, UnknownNameError, one_line
from btk.profile import ModelProfile


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"


def _import_user_module(name: str, where: str) -> ModuleType:
    """Import ``profiles`` or ``environments``; an invalid definition is a one-line error."""
    try:
        return importlib.import_module(name)
    except ValidationError as error:
        raise BtkError(one_line(error, f"{where}: {error.title}: ")) from None


@lru_cache(maxsize=1)
def all_profiles() -> dict[str, ModelProfile]:
    """Every profile in ``profiles/``, by name; duplicate names are an error."""
    module = _import_user_module("profiles", "profiles/")
    catalog: dict[str, ModelProfile] = {}
    for profile in module.PROFILES:
        if profile.name in catalog:
            raise UnknownNameError(f"profile name {profile.name!r} is defined twice in profiles/")
        catalog[profile.name] = profile
    return catalog


def get_profile(name: str) -> ModelProfile:
    """The profile called ``name``; an unknown name suggests close ones."""
    catalog = all_profiles()
    if name in catalog:
        return catalog[name]
    raise UnknownNameError(f"unknown profile {name!r}{_suggest(name, sorted(catalog))}")


@lru_cache(maxsize=1)
def all_environments() -> dict[str, EnvironmentConfig]:
    """Every environment in ``environments.py``, by name."""
    module = _import_user_module("environments", "environments.py")
    return {env.name: env for env in module.ENVIRONMENTS}


def get_environment(name: str) -> EnvironmentConfig:
    environments = all_environments()
    if name in environments:
        return environments[name]
    raise UnknownNameError(f"unknown environment {name!r}{_suggest(name, sorted(environments))}")
