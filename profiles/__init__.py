"""The user's model profiles, one module per family.

To add a profile, define a :class:`btk.profile.ModelProfile` in the family's module (or a
new module listed in ``FAMILY_MODULES``) and add it to that module's ``PROFILES`` tuple.
"""

from __future__ import annotations

from btk.profile import ModelProfile
from profiles import llama, qwen

FAMILY_MODULES = (llama, qwen)

PROFILES: tuple[ModelProfile, ...] = tuple(profile for module in FAMILY_MODULES for profile in module.PROFILES)
