"""Pipeline definitions of the user's profiles do not change with the architecture fields' defaults.

For every profile of the user's catalog (whatever it holds), the definition built with the
newer architecture fields written out at their defaults equals the one built without them, and
holds none of their keys unless the profile uses them; an imported Qwen3 / Mistral NeMo profile's
definition carries its head width and QK-norm to the job (tests/hf_configs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fixture_catalog as fc
import pytest
from architecture_defaults import with_explicit_defaults
from test_pipeline_definition import _spec as pipeline_spec

from btk.catalog import all_profiles
from btk.hf_import import profile_from_config
from btk.hyperparameters import from_hyperparameters
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture, ModelProfile
from training_constructs.pipeline_definition import STEP_TRAIN, build_pipeline_definition

CONFIGS = Path(__file__).resolve().parents[1] / "hf_configs"


def _definition(profile: ModelProfile) -> str:
    """The definition test_pipeline_definition builds, for ``profile`` in an environment of its own."""
    environment = fc.STAGING.model_copy(update={"profiles": (profile.name,)})
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=profile.training.seq_len)
    return build_pipeline_definition(pipeline_spec(environment=environment, profile=profile, knobs=knobs))


def _hyperparameters(definition: str) -> dict[str, Any]:
    condition = json.loads(definition)["Steps"][-1]["Arguments"]
    step = next(s for s in condition["IfSteps"] + condition["ElseSteps"] if s["Name"] == STEP_TRAIN)
    hyperparameters: dict[str, Any] = step["Arguments"]["HyperParameters"]
    return hyperparameters


@pytest.mark.parametrize("name", sorted(all_profiles()))
def test_definitions_do_not_change_with_explicit_defaults(name: str) -> None:
    profile = all_profiles()[name]
    definition = _definition(profile)
    assert _definition(with_explicit_defaults(profile)) == definition
    keys = set(_hyperparameters(definition))
    for field in ModelArchitecture.LEFT_OUT_AT_DEFAULT:
        at_default = getattr(profile.architecture, field) == ModelArchitecture.model_fields[field].default
        assert (f"arch.{field}" in keys) != at_default


@pytest.mark.parametrize(("config", "name"), [("qwen3-4b.json", "qwen3-4b"),
                                              ("mistral-nemo-base-2407.json", "mistral-nemo-12b")])
def test_imported_profiles_reach_the_job_whole(config: str, name: str) -> None:
    profile = profile_from_config(json.loads((CONFIGS / config).read_text()), name)
    hyperparameters = _hyperparameters(_definition(profile))
    assert hyperparameters["arch.head_dim"] == "128"
    spec = from_hyperparameters({key: str(value) for key, value in hyperparameters.items()
                                 if isinstance(value, str | int | float)})
    assert spec.architecture == profile.architecture
