"""``TrainingKnobs``: the one definition of the tuning knobs.

The planner produces it, the pipeline passes it to the training job as SageMaker
hyperparameters (a ``dict[str, str]``), and the trainer parses it back with this same
model. :func:`knobs_to_hyperparameters` / :func:`knobs_from_hyperparameters` are the only
codec; the round trip is lossless (tested, including with hypothesis).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from btk.errors import BtkError, one_line

Precision = Literal["bf16", "fp8_tensorwise", "fp8_rowwise", "mxfp8"]
ActivationCheckpointing = Literal["none", "selective", "full"]
Sharding = Literal["full_shard", "hybrid_shard", "no_shard"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
CHECKPOINTING_MODES: tuple[str, ...] = get_args(ActivationCheckpointing)
SHARDING_MODES: tuple[str, ...] = get_args(Sharding)
TENSOR_PARALLEL_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
CONTEXT_PARALLEL_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
TENSOR_PARALLEL_PRECISIONS: tuple[str, ...] = ("bf16", "fp8_tensorwise")
"""Precisions the trainer can shard with tensor parallelism: torchao's float8 tensor-parallel
styles (``Float8ColwiseParallel``/``Float8RowwiseParallel``) cover tensorwise scaling only;
rowwise and MXFP8 scales are per row/block and have no tensor-parallel layout there."""
MAX_MICRO_BATCH_SIZE = 4096
MAX_GRADIENT_ACCUMULATION_STEPS = 65536
MAX_SEQ_LEN = 1_048_576


class TrainingKnobs(BaseModel):
    """The knobs that decide memory use and speed of one training run.

    Attributes:
        micro_batch_size: sequences per GPU per forward/backward pass.
        gradient_accumulation_steps: micro-batches accumulated before each optimizer step.
        seq_len: tokens per sequence.
        precision: matmul precision of the linear layers. ``bf16`` everywhere, or float8
            training through torchao (``fp8_tensorwise``/``fp8_rowwise``: Hopper and newer;
            ``mxfp8``: Blackwell only). Master weights and optimizer state stay fp32.
        activation_checkpointing: ``none`` keeps every activation, ``selective`` recomputes
            every other matmul and the cheap element-wise ops (torchtitan's per-op policy),
            ``full`` keeps only each block's input and recomputes the block.
        sharding: FSDP2 ``full_shard`` over all data-parallel GPUs, ``hybrid_shard`` (shard
            within a node, replicate across nodes) or ``no_shard`` (plain data parallel).
        tensor_parallel: tensor-parallel degree inside a node (1 = off).
        context_parallel: how many GPUs of a node share each sequence (1 = off): each holds
            ``seq_len / context_parallel`` of its tokens (two chunks, one from each end, so the
            causal attention's work is even) and gathers the keys and values of the others in
            every attention layer. ``seq_len`` must split into ``2 x context_parallel`` chunks.
        compile: ``torch.compile`` each transformer block.
        fused_loss: compute the cross-entropy in a fused/compiled kernel so fp32 logits are
            never materialised (False models the eager fp32 ``cross_entropy`` most older
            training scripts use).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int = Field(ge=1, le=MAX_MICRO_BATCH_SIZE)
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=MAX_GRADIENT_ACCUMULATION_STEPS)
    seq_len: int = Field(ge=16, le=MAX_SEQ_LEN)
    precision: Precision = "bf16"
    activation_checkpointing: ActivationCheckpointing = "none"
    sharding: Sharding = "full_shard"
    tensor_parallel: int = 1
    compile: bool = True
    fused_loss: bool = True
    context_parallel: int = 1

    LEFT_OUT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("context_parallel",)
    """Knobs added after the first release: left out of the hyperparameters at their default, so the
    jobs and pipelines of earlier plans are unchanged."""

    @field_validator("tensor_parallel")
    @classmethod
    def _tensor_parallel_degree(cls, value: int) -> int:
        if value not in TENSOR_PARALLEL_DEGREES:
            raise ValueError(f"must be one of {', '.join(map(str, TENSOR_PARALLEL_DEGREES))}")
        return value

    @field_validator("context_parallel")
    @classmethod
    def _context_parallel_degree(cls, value: int) -> int:
        if value not in CONTEXT_PARALLEL_DEGREES:
            raise ValueError(f"must be one of {', '.join(map(str, CONTEXT_PARALLEL_DEGREES))}")
        return value

    @model_validator(mode="after")
    def _combination_runs(self) -> TrainingKnobs:
        problem = knob_combination_problem(self.precision, self.tensor_parallel)
        if problem:
            raise ValueError(problem)
        problem = context_parallel_problem(self.context_parallel, self.seq_len, self.sharding)
        if problem:
            raise ValueError(problem)
        return self

    def tokens_per_micro_batch(self) -> int:
        """Tokens one GPU processes per micro-batch (its share of each sequence under context parallelism)."""
        return self.micro_batch_size * self.seq_len // self.context_parallel


KNOB_FIELDS: tuple[str, ...] = tuple(TrainingKnobs.model_fields)


def knob_combination_problem(precision: str, tensor_parallel: int) -> str | None:
    """Why this precision and tensor-parallel degree cannot train together; ``None`` when they can.

    The one rule for every consumer: the planner's search skips such pairs, ``TrainingKnobs``
    refuses them (so ``btk estimate``, the pipeline at synth and the entrypoint before torchrun
    all say so in one line), and the trainer asks it again before it shards the model.
    """
    if tensor_parallel > 1 and precision not in TENSOR_PARALLEL_PRECISIONS:
        return (
            f"precision {precision} with tensor_parallel {tensor_parallel}: tensor parallelism supports only "
            f"{' and '.join(TENSOR_PARALLEL_PRECISIONS)}; change precision or set tensor_parallel 1"
        )
    return None


def context_parallel_problem(context_parallel: int, seq_len: int, sharding: str) -> str | None:
    """Why ``context_parallel`` cannot train sequences of ``seq_len`` under ``sharding``; ``None`` when it can.

    The one rule for every consumer, as :func:`knob_combination_problem`: ``TrainingKnobs``, a profile's
    ``pinned.context_parallel`` and the planner's search.
    """
    if context_parallel not in CONTEXT_PARALLEL_DEGREES:
        return f"context_parallel must be one of {', '.join(map(str, CONTEXT_PARALLEL_DEGREES))}"
    if context_parallel > 1 and sharding == "no_shard":  # the ranks of one sequence reduce its gradients as shards
        return f"context_parallel {context_parallel} needs sharding full_shard or hybrid_shard, not no_shard"
    chunks = 2 * context_parallel
    if context_parallel > 1 and seq_len % chunks:
        return (f"context_parallel {context_parallel} splits each sequence into {chunks} equal chunks: "
                f"seq_len {seq_len} must be a multiple of {chunks}")
    return None


def encode_value(value: Any) -> str:
    """Encode one hyperparameter value as SageMaker's string form (bools as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def knobs_as_json(knobs: TrainingKnobs) -> dict[str, Any]:
    """The knobs a job is given, as a JSON object: ``LEFT_OUT_AT_DEFAULT`` knobs only where they differ from their
    default, so the jobs and ladders of earlier plans are unchanged."""
    return {name: value for name, value in knobs.model_dump(mode="json").items()
            if name not in TrainingKnobs.LEFT_OUT_AT_DEFAULT or value != TrainingKnobs.model_fields[name].default}


def knobs_to_hyperparameters(knobs: TrainingKnobs) -> dict[str, str]:
    """Serialise the knobs as SageMaker hyperparameters (string keys, string values), as :func:`knobs_as_json`."""
    return {name: encode_value(value) for name, value in knobs_as_json(knobs).items()}


def knobs_from_hyperparameters(hyperparameters: dict[str, str]) -> TrainingKnobs:
    """Parse knobs back from SageMaker hyperparameters; extra keys are ignored.

    Raises:
        BtkError: one line naming every field at fault.
    """
    values = {name: hyperparameters[name] for name in KNOB_FIELDS if name in hyperparameters}
    return parse_knobs(values)


def parse_knobs(values: dict[str, Any]) -> TrainingKnobs:
    """Validate knob values given as strings or typed values; one-line error on failure."""
    try:
        return TrainingKnobs.model_validate(values)
    except ValidationError as error:
        raise BtkError(one_line(error, "invalid knobs: ")) from None
