"""A profile with the newer architecture fields written out at their defaults (for the tests that compare)."""

from __future__ import annotations

from typing import Any

from btk.profile import ModelArchitecture, ModelProfile


def with_explicit_defaults(profile: ModelProfile) -> ModelProfile:
    """``profile`` with every field of ``LEFT_OUT_AT_DEFAULT`` it does not set written out (head_dim as hidden /
    heads): the same architecture, stated rather than implied."""
    arch = profile.architecture
    explicit: dict[str, Any] = {name: getattr(arch, name) for name in ModelArchitecture.LEFT_OUT_AT_DEFAULT}
    explicit["head_dim"] = arch.effective_head_dim
    return ModelProfile.model_validate(profile.model_dump() | {"architecture": arch.model_dump() | explicit})
