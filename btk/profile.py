"""Model profiles: the architecture of a decoder model and what a team wants to train.

A profile is a small typed definition (see ``profiles/``); the planner derives the knobs
from it. Parameter counts are exact for Llama/Qwen2-style decoders (RMSNorm, RoPE, GQA,
SwiGLU, optional QKV bias, optional tied embeddings) and checked in tests against the
counts published with the checkpoints.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from btk.errors import FieldError
from btk.knobs import (
    MAX_GRADIENT_ACCUMULATION_STEPS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SEQ_LEN,
    ActivationCheckpointing,
    Precision,
    Sharding,
)

MAX_GLOBAL_BATCH_TOKENS = 1 << 30
"""About a billion tokens per optimizer step: 64x the largest published batch (Llama 3 405B, 16M)."""

PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9.\-]{1,62}$"
"""A profile name: a lower-case slug of 2-63 characters (pydantic's regex engine: ``$`` is the end of text)."""
PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN.removeprefix("^").removesuffix("$"))
"""The same rule for Python's ``re``; use it with ``fullmatch`` (``$`` would accept a trailing newline)."""


class RopeScaling(BaseModel):
    """Llama 3.1-style RoPE frequency scaling (``rope_type: llama3`` in Hugging Face)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rope_type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(gt=0)


class ModelArchitecture(BaseModel):
    """Shape of a Llama/Qwen-style decoder-only transformer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=8, le=65536)
    num_attention_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    ffn_hidden_size: int = Field(ge=8, le=262144)
    vocab_size: int = Field(ge=2, le=1_048_576)
    tied_embeddings: bool = False
    max_context: int = Field(ge=16, le=1_048_576)
    attention_bias: bool = False
    rope_theta: float = Field(default=500000.0, gt=0)
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = Field(default=1e-5, gt=0, lt=1)

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelArchitecture:
        if self.hidden_size % self.num_attention_heads:
            raise FieldError(
                "num_attention_heads",
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                f"({self.hidden_size}); pick a head count that divides it",
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise FieldError(
                "num_kv_heads",
                f"num_kv_heads ({self.num_kv_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads}) for grouped-query attention",
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise FieldError(
                "num_attention_heads", "head dimension (hidden_size / num_attention_heads) must be even for RoPE"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection output."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_parameters_per_layer(self) -> int:
        h, kv = self.hidden_size, self.kv_dim
        weights = h * h + 2 * h * kv + h * h  # wq, wk, wv, wo
        bias = (h + 2 * kv) if self.attention_bias else 0
        return weights + bias

    @property
    def mlp_parameters_per_layer(self) -> int:
        return 3 * self.hidden_size * self.ffn_hidden_size  # gate, up, down

    @property
    def parameters_per_layer(self) -> int:
        norms = 2 * self.hidden_size
        return self.attention_parameters_per_layer + self.mlp_parameters_per_layer + norms

    @property
    def embedding_parameters(self) -> int:
        """Input embedding table (the output head shares it when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def output_parameters(self) -> int:
        """Parameters of the output head that are not shared with the embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def parameter_count(self) -> int:
        """Exact number of parameters (what Hugging Face's ``num_parameters()`` reports)."""
        final_norm = self.hidden_size
        return (
            self.embedding_parameters
            + self.num_layers * self.parameters_per_layer
            + final_norm
            + self.output_parameters
        )

    @property
    def matmul_parameters(self) -> int:
        """Parameters that take part in a matmul per token: blocks plus the output head.

        The embedding lookup is not a matmul; the output projection is one even when its
        weight is tied to the embedding. This is the ``N`` of the ``6N`` FLOPs rule.
        """
        linear_per_layer = self.attention_parameters_per_layer + self.mlp_parameters_per_layer
        return self.num_layers * linear_per_layer + self.vocab_size * self.hidden_size


class TrainingIntent(BaseModel):
    """What the team wants to train: sequence length, global batch, budget, schedule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(ge=16, le=MAX_SEQ_LEN)
    global_batch_tokens: int = Field(
        ge=16, le=MAX_GLOBAL_BATCH_TOKENS, description="target tokens per optimizer step"
    )
    total_tokens: int | None = Field(default=None, ge=1, description="training budget in tokens")
    learning_rate: float = Field(default=3e-4, gt=0, lt=1)
    min_learning_rate_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=200, ge=0)
    weight_decay: float = Field(default=0.1, ge=0, lt=1)
    max_grad_norm: float = Field(default=1.0, gt=0)


class KnobPins(BaseModel):
    """Knobs a profile fixes; the planner honours every pin or fails naming it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int | None = Field(default=None, ge=1, le=MAX_MICRO_BATCH_SIZE)
    gradient_accumulation_steps: int | None = Field(default=None, ge=1, le=MAX_GRADIENT_ACCUMULATION_STEPS)
    precision: Precision | None = None
    activation_checkpointing: ActivationCheckpointing | None = None
    sharding: Sharding | None = None
    tensor_parallel: int | None = None
    compile: bool | None = None
    fused_loss: bool | None = None

    def as_dict(self) -> dict[str, object]:
        return {key: value for key, value in self.model_dump().items() if value is not None}


class ModelProfile(BaseModel):
    """A model family member plus the team's training intent and optional pinned knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="lower-case slug used on the CLI and in resource names")
    family: str = Field(min_length=1, max_length=32)
    description: str = ""
    architecture: ModelArchitecture
    training: TrainingIntent
    pinned: KnobPins = KnobPins()
    published_parameter_count: int | None = Field(
        default=None, description="count published with the checkpoint, checked in tests"
    )
    source: str = Field(default="", description="where the architecture numbers come from")
    hf_model_id: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelProfile:
        if not PROFILE_NAME.fullmatch(self.name):
            raise FieldError("name", f"name {self.name!r} must be a lower-case slug (letters, digits, '.', '-')")
        if self.training.seq_len > self.architecture.max_context:
            raise FieldError(
                "training.seq_len",
                f"training.seq_len ({self.training.seq_len}) exceeds architecture.max_context "
                f"({self.architecture.max_context}); lower seq_len or raise max_context",
            )
        if self.training.global_batch_tokens < self.training.seq_len:
            raise FieldError(
                "training.global_batch_tokens",
                "training.global_batch_tokens must hold at least one sequence of training.seq_len",
            )
        tp = self.pinned.tensor_parallel
        if tp is not None:
            if tp not in (1, 2, 4, 8):
                raise FieldError("pinned.tensor_parallel", "pinned.tensor_parallel must be one of 1, 2, 4, 8")
            if self.architecture.num_kv_heads % tp:
                raise FieldError(
                    "pinned.tensor_parallel",
                    f"pinned.tensor_parallel ({tp}) must divide num_kv_heads ({self.architecture.num_kv_heads})",
                )
        return self

    @property
    def parameter_count(self) -> int:
        return self.architecture.parameter_count
