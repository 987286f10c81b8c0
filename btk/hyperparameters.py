"""The SageMaker hyperparameters of a training job: knobs + architecture + schedule.

The pipeline writes them, the trainer reads them back; both through this module. Keys:

* the :class:`~btk.knobs.TrainingKnobs` fields, unprefixed (exactly what ``btk plan --json``
  reports under ``knobs``);
* ``arch.<field>`` for the :class:`~btk.profile.ModelArchitecture` (the fields it lists in
  ``LEFT_OUT_AT_DEFAULT`` only when not at their default, so the jobs of profiles that do not use
  them keep exactly the hyperparameters they had before those fields existed);
* ``train.<field>`` for the :class:`~btk.profile.TrainingIntent` (learning rate, ...; the fields it
  lists in ``LEFT_OUT_AT_DEFAULT`` only when not at their default);
* ``job.<field>`` for :class:`JobSettings` (profile name, checkpointing cadence, seed; the fields
  it lists in ``LEFT_OUT_AT_DEFAULT`` likewise only when not at their default).

Values are strings (SageMaker's contract); nested values (fields whose type is a model)
are compact JSON, ``None`` is the empty string. Decoding follows each field's declared type,
never the text's look, so a string that happens to start with ``{`` stays a string; an
optional string field refuses the empty string, which would read back as ``None``. The
round trip is lossless (tested with hypothesis). Unknown keys are refused with the list of
known ones, so a misspelt hyperparameter cannot silently train with the default; keys in
SageMaker's own ``sagemaker_`` namespace (which its framework containers add) are ignored.
"""

from __future__ import annotations

import json
import types
from typing import Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from btk.errors import BtkError, FieldError, models_in, one_line
from btk.jsonfile import parse_json
from btk.knobs import (
    KNOB_FIELDS,
    TrainingKnobs,
    encode_value,
    knobs_as_json,
    knobs_from_hyperparameters,
    knobs_to_hyperparameters,
)
from btk.profile import PROFILE_NAME_PATTERN, ModelArchitecture, TrainingIntent

SAGEMAKER_RESERVED_PREFIX = "sagemaker_"


MAX_LADDER_RUNGS = 4


class KnobLadder(BaseModel):
    """Knob sets a job steps down to, in order, when it runs out of memory before its first checkpoint.

    Planned by ``btk plan`` (:func:`btk.planner.search.knob_ladder`): each trains the same tokens per
    optimizer step, sequence, precision and tensor parallelism as the plan, with less memory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rungs: tuple[TrainingKnobs, ...] = Field(min_length=1, max_length=MAX_LADDER_RUNGS)


class JobSettings(BaseModel):
    """Per-job settings that are neither knobs nor architecture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    LEFT_OUT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("async_tensor_parallel", "knob_ladder", "start_rung")

    profile: str = Field(pattern=PROFILE_NAME_PATTERN, description="the profile's name")
    seed: int = Field(default=1234, ge=0)
    checkpoint_interval_steps: int = Field(default=500, ge=1)
    keep_last_checkpoints: int = Field(default=3, ge=1)
    log_interval_steps: int = Field(default=10, ge=1)
    init_from: str | None = Field(
        default=None,
        min_length=1,
        description="directory of a Hugging Face safetensors checkpoint to fine-tune"
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
    max_nonfinite_steps: int = Field(
        default=3,
        ge=0,
        description="optimizer steps with a NaN/inf loss or gradient norm that are skipped (update dropped) before "
        "the job fails; 3 rides out a rare fp8 overflow, while a diverged run fails within 4 steps",
    )
    async_tensor_parallel: bool = Field(
        default=False,
        description="overlap tensor parallelism's collectives with its matmuls (Inductor's micro-pipeline pass on "
        "symmetric memory; compiled blocks on CUDA only). Off unless asked for, as torchtitan has it: the planner "
        "predicts plain tensor parallelism, and the overlap's gain and memory are not measured on this stack",
    )
    knob_ladder: KnobLadder | None = Field(
        default=None,
        description="knob sets to step down to, in order, when the job runs out of memory before its first "
        "checkpoint (single-node jobs: torchrun restarts the processes on the next rung)",
    )
    start_rung: int = Field(
        default=0,
        ge=0,
        le=MAX_LADDER_RUNGS,
        description="the knob-ladder rung the job starts on (0: the plan's own knobs): the pipeline hands the long "
        "run the rung its rehearsal held, so a plan that ran out of memory in the rehearsal does not again",
    )

    @field_validator("start_rung", mode="before")
    @classmethod
    def _whole_number_text(cls, value: Any) -> Any:
        """Accept ``"1.0"``: the pipeline passes the rehearsal's ``train:knob_rung`` metric, a float, as text."""
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return value  # pydantic's own message
            if number.is_integer():
                return int(number)
        return value


class JobHyperparameters(BaseModel):
    """Everything a training job needs to know, as typed values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knobs: TrainingKnobs
    architecture: ModelArchitecture
    training: TrainingIntent
    job: JobSettings

    @model_validator(mode="after")
    def _ladder_keeps_the_batch(self) -> JobHyperparameters:
        """Every rung trains what the plan trains: the same tokens per step per data-parallel rank, sequence,
        precision and tensor parallelism (a step down changes memory, never what is learned)."""
        ladder = self.job.knob_ladder
        if self.job.start_rung > (len(ladder.rungs) if ladder is not None else 0):
            raise FieldError("job.start_rung", f"rung {self.job.start_rung} is past the knob ladder's last "
                             f"({len(ladder.rungs) if ladder is not None else 0}; job.knob_ladder)")
        if ladder is None:
            return self
        plan = self.knobs
        for index, rung in enumerate(ladder.rungs, start=1):
            for name in ("seq_len", "precision", "tensor_parallel"):
                if getattr(rung, name) != getattr(plan, name):
                    raise FieldError("job.knob_ladder", f"rung {index} changes {name} "
                                     f"({getattr(plan, name)} -> {getattr(rung, name)}); a rung may change memory "
                                     "knobs only")
            if rung.micro_batch_size * rung.gradient_accumulation_steps != (
                    plan.micro_batch_size * plan.gradient_accumulation_steps):
                raise FieldError("job.knob_ladder", f"rung {index} trains "
                                 f"{rung.micro_batch_size} x {rung.gradient_accumulation_steps} sequences per step "
                                 f"and rank, the plan {plan.micro_batch_size} x {plan.gradient_accumulation_steps}; "
                                 "keep the global batch")
        return self

    @model_validator(mode="after")
    def _sequences_fit_the_model(self) -> JobHyperparameters:
        if self.knobs.seq_len > self.architecture.max_context:
            raise FieldError(
                "seq_len",
                f"seq_len ({self.knobs.seq_len}) exceeds arch.max_context ({self.architecture.max_context}): "
                "RoPE positions past the model's context were never trained; lower seq_len",
            )
        return self


_SECTIONS: dict[str, str] = {"arch.": "architecture", "train.": "training", "job.": "job"}


def _encode(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, KnobLadder):  # each rung as the knobs are written: earlier ladders' text unchanged
        return json.dumps({"rungs": [knobs_as_json(rung) for rung in value.rungs]}, sort_keys=True,
                          separators=(",", ":"))
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    if isinstance(value, float):
        return repr(value)
    return encode_value(value)


def _takes_model(model: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``model`` holds a nested model (encoded as JSON)."""
    return bool(models_in(model.model_fields[name].annotation))


def _takes_none(model: type[BaseModel], name: str) -> bool:
    annotation = model.model_fields[name].annotation
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _decode(model: type[BaseModel], name: str, key: str, text: str) -> Any:
    if text == "" and _takes_none(model, name):
        return None
    if _takes_model(model, name):
        return parse_json(text, f"hyperparameter {key}")
    return text


def _left_out(section: BaseModel, name: str) -> bool:
    """Whether field ``name`` is one its model leaves out of the hyperparameters at its default, and is at it."""
    model = type(section)
    optional: tuple[str, ...] = getattr(model, "LEFT_OUT_AT_DEFAULT", ())
    return name in optional and getattr(section, name) == model.model_fields[name].default


def to_hyperparameters(spec: JobHyperparameters) -> dict[str, str]:
    """Flatten to SageMaker's ``dict[str, str]``."""
    result = knobs_to_hyperparameters(spec.knobs)
    for prefix, attribute in _SECTIONS.items():
        section: BaseModel = getattr(spec, attribute)
        for name in type(section).model_fields:
            if not _left_out(section, name):
                result[f"{prefix}{name}"] = _encode(getattr(section, name))
    return result


def known_keys() -> tuple[str, ...]:
    """Every hyperparameter key a job understands, in a stable order."""
    keys = list(KNOB_FIELDS)
    for prefix, attribute in _SECTIONS.items():
        section_model = JobHyperparameters.model_fields[attribute].annotation
        assert isinstance(section_model, type) and issubclass(section_model, BaseModel)
        keys.extend(f"{prefix}{name}" for name in section_model.model_fields)
    return tuple(keys)


def from_hyperparameters(hyperparameters: dict[str, str]) -> JobHyperparameters:
    """Parse SageMaker's ``hyperparameters.json`` back; one-line error naming the key."""
    known = known_keys()
    unknown = sorted(
        key for key in hyperparameters if key not in known and not key.startswith(SAGEMAKER_RESERVED_PREFIX)
    )
    if unknown:
        raise BtkError(
            f"unknown hyperparameter {', '.join(map(repr, unknown[:5]))}"
            f"{' and more' if len(unknown) > 5 else ''}; known keys: {', '.join(known)}"
        )
    knobs = knobs_from_hyperparameters(hyperparameters)
    sections: dict[str, dict[str, Any]] = {attribute: {} for attribute in _SECTIONS.values()}
    for key, value in hyperparameters.items():
        for prefix, attribute in _SECTIONS.items():
            if key.startswith(prefix):
                section_model = JobHyperparameters.model_fields[attribute].annotation
                assert isinstance(section_model, type) and issubclass(section_model, BaseModel)
                name = key.removeprefix(prefix)
                sections[attribute][name] = _decode(section_model, name, key, str(value))
    try:
        return JobHyperparameters(knobs=knobs, **sections)
    except ValidationError as error:
        message = one_line(error, root=JobHyperparameters)
        for prefix, attribute in _SECTIONS.items():
            message = message.replace(f"{attribute}.", prefix)
        raise BtkError(f"invalid hyperparameters: {message}") from None
