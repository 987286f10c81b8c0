"""The SageMaker hyperparameters of a training job: knobs + architecture + schedule.

The pipeline writes them, the trainer reads them back; both through this module. Keys:

* the :class:`~btk.knobs.TrainingKnobs` fields, unprefixed (exactly what ``btk plan --json``
  reports under ``knobs``);
* ``arch.<field>`` for the :class:`~btk.profile.ModelArchitecture`;
* ``train.<field>`` for the :class:`~btk.profile.TrainingIntent` (learning rate, ...);
* ``job.<field>`` for :class:`JobSettings` (profile name, checkpointing cadence, seed).

Values are strings (SageMaker's contract); nested values are compact JSON, ``None`` is
the empty string. The round trip is lossless (tested).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from btk.errors import BtkError, one_line
from btk.knobs import TrainingKnobs, encode_value, knobs_from_hyperparameters, knobs_to_hyperparameters
from btk.profile import ModelArchitecture, TrainingIntent


class JobSettings(BaseModel):
    """Per-job settings that are neither knobs nor architecture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str
    seed: int = Field(default=1234, ge=0)
    checkpoint_interval_steps: int = Field(default=500, ge=1)
    keep_last_checkpoints: int = Field(default=3, ge=1)
    log_interval_steps: int = Field(default=10, ge=1)
    init_from: str | None = Field(
        default=None, description="directory of a Hugging Face safetensors checkpoint to fine-tune"
    )
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many steps (else from total tokens)")
    collective_timeout_minutes: int = Field(
        default=30,
        ge=1,
        le=24 * 60,
        description="how long a rank waits in a collective; covers rank 0 reading a pretrained checkpoint "
        "and writing the final model while the others wait (NCCL's default is 10)",
    )
    planned_data_parallel: int | None = Field(
        default=None,
        ge=1,
        description="data-parallel ranks the knobs were planned for; a job with another count (InstanceCount "
        "override) rescales gradient accumulation to keep the planned global batch",
    )


class JobHyperparameters(BaseModel):
    """Everything a training job needs to know, as typed values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knobs: TrainingKnobs
    architecture: ModelArchitecture
    training: TrainingIntent
    job: JobSettings


_SECTIONS: dict[str, str] = {"arch.": "architecture", "train.": "training", "job.": "job"}


def _encode(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    if isinstance(value, float):
        return repr(value)
    return encode_value(value)


def _decode(text: str) -> Any:
    if text == "":
        return None
    if text.startswith("{"):
        return json.loads(text)
    return text


def to_hyperparameters(spec: JobHyperparameters) -> dict[str, str]:
    """Flatten to SageMaker's ``dict[str, str]``."""
    result = knobs_to_hyperparameters(spec.knobs)
    for prefix, attribute in _SECTIONS.items():
        section: BaseModel = getattr(spec, attribute)
        for name in type(section).model_fields:
            result[f"{prefix}{name}"] = _encode(getattr(section, name))
    return result


def from_hyperparameters(hyperparameters: dict[str, str]) -> JobHyperparameters:
    """Parse SageMaker's ``hyperparameters.json`` back; one-line error naming the key."""
    knobs = knobs_from_hyperparameters(hyperparameters)
    sections: dict[str, dict[str, Any]] = {attribute: {} for attribute in _SECTIONS.values()}
    for key, value in hyperparameters.items():
        for prefix, attribute in _SECTIONS.items():
            if key.startswith(prefix):
                try:
                    sections[attribute][key.removeprefix(prefix)] = _decode(str(value))
                except json.JSONDecodeError:
                    raise BtkError(f"hyperparameter {key}: not valid JSON") from None
    try:
        return JobHyperparameters(knobs=knobs, **sections)
    except ValidationError as error:
        message = one_line(error)
        for prefix, attribute in _SECTIONS.items():
            message = message.replace(f"{attribute}.", prefix)
        raise BtkError(f"invalid hyperparameters: {message}") from None
