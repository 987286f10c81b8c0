"""Model profiles: the architecture of a decoder model and what a team wants to train.

A profile is a small typed definition (see ``profiles/``); the planner derives the knobs
from it. The architecture covers the dense decoders of the Llama 3.x, Mistral / Mistral NeMo,
Qwen2.5, Qwen3, OLMo 2, Granite 3, SmolLM3, Phi-3/4 and Gemma 2/3 families (RMSNorm, RoPE with Llama 3.1
YaRN or linear scaling, GQA, SwiGLU or Gemma's GeGLU; optional QKV and output biases, a head width other than
``hidden_size / num_attention_heads``, QK-norm per head or over the whole projection, norms before, after
or on both sides of each sublayer, tied embeddings, Gemma's sliding windows and logit soft-capping).
Parameter counts are exact for all of them and checked against the counts published with the
checkpoints. What the trainer does not implement (mixture-of-experts, vision towers, per-layer
attention patterns other than Gemma's) is refused when a profile is loaded, in one line naming
the field (:data:`UNSUPPORTED_FEATURES`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from btk.errors import FieldError
from btk.knobs import (
    MAX_GRADIENT_ACCUMULATION_STEPS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SEQ_LEN,
    TENSOR_PARALLEL_DEGREES,
    ActivationCheckpointing,
    Precision,
    Sharding,
    context_parallel_problem,
)

MIN_VOCAB_SIZE = max(TENSOR_PARALLEL_DEGREES)
"""The loss-parallel head gives each tensor-parallel rank ``vocab // tp`` of the vocabulary: at the largest degree
the planner may choose, every rank must hold at least one token's logits."""

MAX_GLOBAL_BATCH_TOKENS = 1 << 30
"""About a billion tokens per optimizer step: 64x the largest published batch (Llama 3 405B, 16M)."""

PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9.\-]{1,62}$"
"""A profile name: a lower-case slug of 2-63 characters (pydantic's regex engine: ``$`` is the end of text)."""
PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN.removeprefix("^").removesuffix("$"))
"""The same rule for Python's ``re``; use it with ``fullmatch`` (``$`` would accept a trailing newline)."""


QkNorm = Literal["none", "head", "projection"]
"""RMSNorm on the query and key projections: ``head`` normalises each head over ``head_dim`` with
one weight of ``head_dim`` shared by the heads (Qwen3's ``q_norm``/``k_norm``); ``projection``
normalises the whole projection output, all heads together, with one weight per element
(OLMo 2's ``q_norm`` over ``heads·head_dim`` and ``k_norm`` over ``kv_heads·head_dim``, applied
before the heads are split)."""

NormPlacement = Literal["pre", "post", "sandwich"]
"""Where each block's RMSNorms sit: ``pre`` normalises a sublayer's input
(``x + attn(norm(x))``, Llama/Qwen/Mistral); ``post`` normalises its output before the residual
add (``x + norm(attn(x))``, OLMo 2); ``sandwich`` does both, four norms per block
(``x + norm(attn(norm(x)))``: Gemma 2 and 3's block, which also brings its other fixed parts:
norms that scale by ``1 + weight``, GeGLU with tanh-approximated GELU, and token embeddings
multiplied by ``sqrt(hidden_size)``)."""

UNSUPPORTED_FEATURES: dict[str, str] = {
    "num_experts": "mixture-of-experts",
    "num_local_experts": "mixture-of-experts",
    "n_routed_experts": "mixture-of-experts",
    "moe_intermediate_size": "mixture-of-experts",
    "vision_config": "a vision tower (multimodal model)",
    "audio_config": "an audio tower (multimodal model)",
    "text_config": "a multimodal wrapper around the language model",
    "layer_types": "per-layer attention types (give sliding_window and full_attention_interval, Gemma's pattern)",
}
"""Architecture features the trainer does not implement, by the field that asks for them.

A profile that names one is refused at load (never planned as something else); ``btk profile
import`` refuses a ``config.json`` that turns one on."""

HF_LAYOUTS: dict[tuple[str, str, bool, bool], str] = {
    ("none", "pre", False, False): "llama",
    ("none", "pre", True, True): "llama",
    ("none", "pre", True, False): "qwen2",
    ("head", "pre", False, False): "qwen3",
    ("head", "pre", True, True): "qwen3",
    ("projection", "post", False, False): "olmo2",
    ("projection", "post", True, True): "olmo2",
    ("none", "sandwich", False, False): "gemma2",
    ("none", "sandwich", True, True): "gemma2",
    ("head", "sandwich", False, False): "gemma3_text",
    ("head", "sandwich", True, True): "gemma3_text",
}
"""The Hugging Face ``model_type`` that holds each block layout, keyed by
``(qk_norm, norm_placement, attention_bias, attention_output_bias)``; Mistral's layout is Llama's.
Exported checkpoints use it, so a profile can only describe a layout one of these implements.
Three families keep Llama's layout and add one thing (:data:`LLAMA_VARIANTS`)."""

LLAMA_VARIANTS: dict[str, tuple[str, str]] = {
    "granite": ("embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling",
                "Granite 3.x's scalar multipliers"),
    "smollm3": ("no_rope_interval", "SmolLM3's layers without RoPE"),
    "phi3": ("fused_projections", "Phi-3/Phi-4's fused q/k/v and gate/up checkpoint layout"),
}
"""Hugging Face families whose block is Llama's (no QK-norm, norms before the sublayers, no biases or
biases on all four projections) plus what the profile fields named here describe; each is exported
as its own ``model_type``, so an architecture uses at most one of them."""


MAX_ROPE_THETA = 1e9
MAX_ROPE_SCALING_FACTOR = 1024.0
MAX_GRAD_NORM = 1e4


class RopeScaling(BaseModel):
    """Llama 3.1-style RoPE frequency scaling (``rope_type: llama3`` in Hugging Face)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rope_type: Literal["llama3"] = "llama3"
    # Llama 3.1: factor 8, 1 and 4 (3.2: factor 32). A factor below 1 would shrink the context,
    # and a vanishing one sends the scaled frequencies to infinity (NaN from the first step).
    factor: float = Field(ge=1, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    low_freq_factor: float = Field(gt=0, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    high_freq_factor: float = Field(gt=0, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    original_max_position_embeddings: int = Field(ge=16, le=1_048_576)

    @model_validator(mode="after")
    def _band_is_ordered(self) -> RopeScaling:
        # The smoothing between the two wavelength bounds divides by (high - low).
        if self.high_freq_factor <= self.low_freq_factor:
            raise FieldError(
                "high_freq_factor",
                f"rope_scaling.high_freq_factor ({self.high_freq_factor:g}) must be above low_freq_factor "
                f"({self.low_freq_factor:g}); Llama 3.1 uses 4 and 1",
            )
        return self


class YarnRopeScaling(BaseModel):
    """YaRN RoPE scaling (``rope_type: yarn`` in Hugging Face; Peng et al., "YaRN: Efficient Context Window
    Extension of Large Language Models", 2023), as transformers computes it.

    Qwen2.5's model cards extend their 32,768-token context to 131,072 with ``factor`` 4 over
    ``original_max_position_embeddings`` 32,768. Frequencies whose wavelength is short next to the original
    context are kept (``beta_fast`` rotations), long ones are divided by ``factor`` (``beta_slow``), the band
    between is ramped; the position tables are scaled by ``attention_factor`` (None: ``0.1 ln(factor) + 1``, or
    the ratio ``mscale`` / ``mscale_all_dim`` makes of it when both are given).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rope_type: Literal["yarn"] = "yarn"
    factor: float = Field(ge=1, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    original_max_position_embeddings: int = Field(ge=16, le=1_048_576)
    # Rotations per original context bounding the ramp: the paper's 32 and 1 are transformers' defaults.
    beta_fast: float = Field(default=32.0, gt=0, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    beta_slow: float = Field(default=1.0, gt=0, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)
    attention_factor: float | None = Field(default=None, gt=0, le=16, allow_inf_nan=False)
    mscale: float | None = Field(default=None, gt=0, le=16, allow_inf_nan=False)
    mscale_all_dim: float | None = Field(default=None, gt=0, le=16, allow_inf_nan=False)
    truncate: bool = True

    @model_validator(mode="after")
    def _ramp_is_ordered(self) -> YarnRopeScaling:
        # The ramp runs from beta_fast's dimension up to beta_slow's: reversed, it keeps the long wavelengths.
        if self.beta_fast < self.beta_slow:
            raise FieldError(
                "beta_fast",
                f"rope_scaling.beta_fast ({self.beta_fast:g}) must be at least beta_slow ({self.beta_slow:g}); "
                "YaRN uses 32 and 1",
            )
        return self

    @property
    def scaled_context(self) -> int:
        """The context the scaling is for: ``factor`` x ``original_max_position_embeddings``."""
        return int(self.factor * self.original_max_position_embeddings)

    @property
    def cos_sin_scale(self) -> float:
        """What the position tables are multiplied by (transformers' ``attention_factor``, resolved)."""
        if self.attention_factor is not None:
            return self.attention_factor

        def magnitude(scale: float) -> float:
            return 1.0 if self.factor <= 1 else 0.1 * scale * math.log(self.factor) + 1.0

        if self.mscale and self.mscale_all_dim:
            return magnitude(self.mscale) / magnitude(self.mscale_all_dim)
        return magnitude(1.0)


class LinearRopeScaling(BaseModel):
    """Linear RoPE scaling, position interpolation (``rope_type: linear`` in Hugging Face; Chen et al., "Extending
    Context Window of Large Language Models via Positional Interpolation", 2023): every frequency divided by
    ``factor``. Gemma 3 4B, 12B and 27B scale their full blocks' RoPE so, by 8."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rope_type: Literal["linear"] = "linear"
    factor: float = Field(ge=1, le=MAX_ROPE_SCALING_FACTOR, allow_inf_nan=False)


def _rope_type(value: Any) -> str:
    """The ``rope_type`` a RoPE scaling is read as: a Llama 3 one when a mapping does not say."""
    if isinstance(value, dict):
        return str(value.get("rope_type", "llama3"))
    return str(getattr(value, "rope_type", "llama3"))


AnyRopeScaling = Annotated[
    Annotated[RopeScaling, Tag("llama3")] | Annotated[YarnRopeScaling, Tag("yarn")]
    | Annotated[LinearRopeScaling, Tag("linear")],
    Discriminator(_rope_type, custom_error_type="rope_type",
                  custom_error_message="rope_type must be 'llama3' (Llama 3.1's scaling), 'yarn' or 'linear'"),
]
"""A profile's RoPE scaling: Llama 3's (:class:`RopeScaling`), YaRN (:class:`YarnRopeScaling`) or linear
(:class:`LinearRopeScaling`), by ``rope_type``."""


GEMMA_FIELDS = ("sliding_window", "full_attention_interval", "attn_logit_softcapping", "final_logit_softcapping",
                "query_pre_attn_scalar", "local_rope_theta")
"""Architecture fields that only Gemma's block (``norm_placement`` ``sandwich``) has; each is None elsewhere."""


class ModelArchitecture(BaseModel):
    """Shape of a dense decoder-only transformer (Llama, Mistral, Qwen2/3, OLMo 2, Granite 3, SmolLM3, Phi-3/4,
    Gemma 2/3).

    The fields after ``rms_norm_eps`` came with the Qwen3, Mistral NeMo, OLMo 2, Granite, SmolLM3, Phi-3 and Gemma
    families;
    their defaults describe the Llama/Qwen2 block every earlier profile meant, and at their
    defaults they are left out of job hyperparameters (:attr:`LEFT_OUT_AT_DEFAULT`), so a
    profile that does not use them plans, synthesizes and trains exactly as before.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    LEFT_OUT_AT_DEFAULT: ClassVar[tuple[str, ...]] = (
        "head_dim", "qk_norm", "norm_placement", "attention_output_bias", "embedding_multiplier",
        "attention_multiplier", "residual_multiplier", "logits_scaling", "no_rope_interval", "fused_projections",
        *GEMMA_FIELDS,
    )

    num_layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=8, le=65536)
    num_attention_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    ffn_hidden_size: int = Field(ge=8, le=262144)
    vocab_size: int = Field(ge=MIN_VOCAB_SIZE, le=1_048_576)
    tied_embeddings: bool = False
    max_context: int = Field(ge=16, le=1_048_576)
    attention_bias: bool = Field(default=False, description="biases on the q, k and v projections")
    # RoPE base: 1e4 (Llama 2) to 1e6 (Qwen2.5/3, Mistral NeMo) in published models. At or below
    # 1 every frequency is at least 1 radian per token; unbounded, the frequencies underflow to 0.
    rope_theta: float = Field(default=500000.0, gt=1, le=MAX_ROPE_THETA, allow_inf_nan=False)
    rope_scaling: AnyRopeScaling | None = None
    rms_norm_eps: float = Field(default=1e-5, gt=0, le=1e-2, allow_inf_nan=False)
    head_dim: int | None = Field(
        default=None,
        ge=2,
        le=4096,
        description="width of one attention head; None (the default) is hidden_size / num_attention_heads, "
        "and giving that value is the same architecture (stored as None)",
    )
    qk_norm: QkNorm = Field(default="none", description="RMSNorm on q and k (see QkNorm); default none")
    norm_placement: NormPlacement = Field(default="pre", description="norms before or after each sublayer; default pre")
    attention_output_bias: bool = Field(default=False, description="a bias on the output projection; default none")
    # Granite 3.x (GraniteForCausalLM): four scalars around Llama's block; the defaults are Llama's.
    embedding_multiplier: float = Field(
        default=1.0, gt=0, le=1e4, allow_inf_nan=False,
        description="the token embeddings are multiplied by it before the first block; default 1 (Granite: 12)",
    )
    attention_multiplier: float | None = Field(
        default=None, gt=0, le=1e4, allow_inf_nan=False,
        description="the attention scores' scale q.k * s; None (the default) is 1/sqrt(head_dim) (Granite: 1/128)",
    )
    residual_multiplier: float = Field(
        default=1.0, gt=0, le=1e4, allow_inf_nan=False,
        description="each sublayer's output is multiplied by it before the residual add; default 1 (Granite: 0.22)",
    )
    logits_scaling: float = Field(
        default=1.0, gt=0, le=1e4, allow_inf_nan=False,
        description="the logits are divided by it (loss included); default 1 (Granite: 16)",
    )
    no_rope_interval: int | None = Field(
        default=None, ge=1, le=512,
        description="every n-th block (the n-th, 2n-th, ...) attends without rotary embeddings; None (the "
        "default): RoPE in every block (SmolLM3: 4)",
    )
    fused_projections: bool = Field(
        default=False,
        description="the Hugging Face checkpoint stores q/k/v as one qkv_proj and gate/up as one gate_up_proj "
        "(Phi-3/Phi-4); the math is Llama's, and the trainer splits and fuses them at load and export",
    )
    # Gemma 2 and 3 (norm_placement "sandwich"): GEMMA_FIELDS, None elsewhere.
    sliding_window: int | None = Field(
        default=None, ge=1, le=1_048_576,
        description="windowed blocks attend to this many most recent positions, their own included; None (the "
        "default): every block attends to the whole context (Gemma 2: 4096, Gemma 3: 512 or 1024)",
    )
    full_attention_interval: int | None = Field(
        default=None, ge=1, le=512,
        description="with sliding_window, every n-th block (the n-th, 2n-th, ...) attends to the whole context and "
        "the others within the window; None: every block is windowed (Gemma 2: 2, Gemma 3: 6)",
    )
    attn_logit_softcapping: float | None = Field(
        default=None, gt=0, le=1e4, allow_inf_nan=False,
        description="attention scores become c * tanh(scores / c); None (the default): no cap (Gemma 2: 50)",
    )
    final_logit_softcapping: float | None = Field(
        default=None, gt=0, le=1e4, allow_inf_nan=False,
        description="the logits become c * tanh(logits / c), loss included; None (the default): no cap (Gemma 2: 30)",
    )
    query_pre_attn_scalar: int | None = Field(
        default=None, ge=1, le=1_048_576,
        description="the attention scores are scaled by 1/sqrt of it; None (the default): head_dim, and giving "
        "that value is the same architecture (stored as None) (Gemma 2 27B: 144 with heads of 128)",
    )
    local_rope_theta: float | None = Field(
        default=None, gt=1, le=MAX_ROPE_THETA, allow_inf_nan=False,
        description="RoPE base of the windowed blocks, which take no rope_scaling; the full blocks keep rope_theta "
        "and rope_scaling; None (the default): every block rotates alike (Gemma 3: 10,000 beside 1,000,000)",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, feature in UNSUPPORTED_FEATURES.items():
                if name in data:
                    raise FieldError(name, f"{feature} is not supported by the trainer; remove {name}")
        return data

    @field_validator("head_dim")
    @classmethod
    def _derived_head_dim_is_the_default(cls, value: int | None, info: ValidationInfo) -> int | None:
        hidden, heads = info.data.get("hidden_size"), info.data.get("num_attention_heads")
        if value is not None and isinstance(hidden, int) and isinstance(heads, int) and hidden == heads * value:
            return None
        return value

    @field_validator("query_pre_attn_scalar")
    @classmethod
    def _head_width_scalar_is_the_default(cls, value: int | None, info: ValidationInfo) -> int | None:
        hidden, heads = info.data.get("hidden_size"), info.data.get("num_attention_heads")
        head_dim = info.data.get("head_dim")
        if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
            head_dim = hidden // heads
        return None if value is not None and value == head_dim else value

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelArchitecture:
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
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
        if self.effective_head_dim % 2:
            field = "head_dim" if self.head_dim is not None else "num_attention_heads"
            raise FieldError(field, f"head dimension ({self.effective_head_dim}) must be even for RoPE")
        layout = (self.qk_norm, self.norm_placement, self.attention_bias, self.attention_output_bias)
        if layout not in HF_LAYOUTS:
            raise FieldError(_layout_field(self), _layout_problem(self))
        variants = self.llama_variants
        if len(variants) > 1:
            fields = " and ".join(self._set_field(name) for name in variants)
            raise FieldError(self._set_field(variants[1]),
                             f"{fields} are features of different families ({', '.join(variants)}); no Hugging Face "
                             "family has both")
        if variants and HF_LAYOUTS[layout] != "llama":
            name = variants[0]
            raise FieldError(self._set_field(name),
                             f"{LLAMA_VARIANTS[name][1]} come with Llama's block, not {HF_LAYOUTS[layout]}'s "
                             "(QK-norm, post-norm, Gemma's sandwich norms or q/k/v-only biases)")
        if self.fused_projections and self.attention_bias:
            raise FieldError("fused_projections", "Phi-3's fused projections have no biases; set attention_bias "
                             "and attention_output_bias to false")
        self._gemma_fields_fit()
        return self

    def _gemma_fields_fit(self) -> None:
        """Gemma's fields come with its block, and with each other as Gemma has them."""
        given = [name for name in GEMMA_FIELDS if getattr(self, name) is not None]
        if given and self.norm_placement != "sandwich":
            raise FieldError(given[0], f"{given[0]} is a feature of Gemma's block; it needs norm_placement "
                             "'sandwich' (norms on both sides of each sublayer)")
        if self.full_attention_interval is not None and self.sliding_window is None:
            raise FieldError("full_attention_interval", "full_attention_interval alternates windowed and full "
                             "blocks: give sliding_window too")
        if self.local_rope_theta is not None and (self.sliding_window is None or self.qk_norm != "head"):
            raise FieldError("local_rope_theta", "local_rope_theta is the RoPE base of Gemma 3's windowed blocks: "
                             "it needs sliding_window and Gemma 3's qk_norm 'head'")

    @property
    def llama_variants(self) -> list[str]:
        """The :data:`LLAMA_VARIANTS` whose fields this architecture sets away from Llama's."""
        granite = (self.embedding_multiplier, self.attention_multiplier, self.residual_multiplier,
                   self.logits_scaling) != (1.0, None, 1.0, 1.0)
        flags = {"granite": granite, "smollm3": self.no_rope_interval is not None, "phi3": self.fused_projections}
        return [name for name, on in flags.items() if on]

    def _set_field(self, variant: str) -> str:
        """The first field of :data:`LLAMA_VARIANTS` ``variant`` this architecture sets away from its default."""
        names = [name.strip() for name in LLAMA_VARIANTS[variant][0].split(",")]
        fields = type(self).model_fields
        return next((name for name in names if getattr(self, name) != fields[name].default), names[0])

    def window(self, layer_index: int) -> int | None:
        """The sliding window of block ``layer_index`` (from 0), None where it attends to the whole context."""
        if self.sliding_window is None:
            return None
        interval = self.full_attention_interval
        return None if interval is not None and (layer_index + 1) % interval == 0 else self.sliding_window

    def rope_base(self, layer_index: int) -> tuple[float, AnyRopeScaling | None]:
        """(theta, scaling) of block ``layer_index``'s RoPE: Gemma 3's windowed blocks take ``local_rope_theta``
        unscaled, every other block ``rope_theta`` and ``rope_scaling``."""
        if self.local_rope_theta is not None and self.window(layer_index) is not None:
            return self.local_rope_theta, None
        return self.rope_theta, self.rope_scaling

    @property
    def is_gemma(self) -> bool:
        """Gemma 2 or 3's block (``norm_placement`` ``sandwich``): four norms that scale by ``1 + weight``, GeGLU,
        embeddings multiplied by ``sqrt(hidden_size)``."""
        return self.norm_placement == "sandwich"

    @property
    def norms_per_block(self) -> int:
        """Residual-stream RMSNorms in one block: two, or Gemma's four."""
        return 4 if self.is_gemma else 2

    @property
    def attention_scale(self) -> float | None:
        """What the attention scores are multiplied by; None: ``1/sqrt(head_dim)`` (SDPA's default)."""
        if self.query_pre_attn_scalar is not None:
            scale: float = float(self.query_pre_attn_scalar) ** -0.5  # as transformers' Gemma computes it
            return scale
        return self.attention_multiplier

    def attention_span(self, seq_len: int) -> float:
        """Keys attended per query summed over the blocks, counted so that a causal block over ``seq_len`` tokens
        is ``seq_len`` (twice its mean: the ``12·L·a·s`` of the FLOPs convention, ``L·s`` without windows); a window
        of ``w`` below ``seq_len`` counts ``(w(w+1) + 2(s-w)w) / (s+1)``, its own mean keys against a causal block's."""
        window = self.sliding_window
        if window is None or window >= seq_len:
            return float(self.num_layers * seq_len)
        interval = self.full_attention_interval
        windowed = self.num_layers - (self.num_layers // interval if interval is not None else 0)
        windowed_span = (window * (window + 1) + 2 * (seq_len - window) * window) / (seq_len + 1)
        return (self.num_layers - windowed) * seq_len + windowed * windowed_span

    def uses_rope(self, layer_index: int) -> bool:
        """Whether block ``layer_index`` (from 0) rotates q and k (:attr:`no_rope_interval`)."""
        return self.no_rope_interval is None or (layer_index + 1) % self.no_rope_interval != 0

    @property
    def effective_head_dim(self) -> int:
        """Width of one attention head: ``head_dim``, else ``hidden_size / num_attention_heads``."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def attention_width(self) -> int:
        """Width of the query projection and of attention's output: heads × head_dim (not always hidden_size)."""
        return self.num_attention_heads * self.effective_head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection output."""
        return self.num_kv_heads * self.effective_head_dim

    @property
    def hf_model_type(self) -> str:
        """The Hugging Face ``model_type`` whose block this architecture is (:data:`HF_LAYOUTS`,
        :data:`LLAMA_VARIANTS`)."""
        variants = self.llama_variants
        if variants:
            return variants[0]
        return HF_LAYOUTS[(self.qk_norm, self.norm_placement, self.attention_bias, self.attention_output_bias)]

    @property
    def norms_scale_in_fp32(self) -> bool:
        """Whether every RMSNorm multiplies by its weight before casting back to the compute dtype (OLMo 2's
        ``Olmo2RMSNorm``, Gemma's); Llama, Mistral and Qwen cast first, then scale."""
        return self.hf_model_type == "olmo2" or self.is_gemma

    @property
    def attention_parameters_per_layer(self) -> int:
        """Projection weights and biases of one attention block (its QK-norm weights are norms)."""
        h, q, kv = self.hidden_size, self.attention_width, self.kv_dim
        weights = h * q + 2 * h * kv + q * h  # wq, wk, wv, wo
        bias = (q + 2 * kv) if self.attention_bias else 0
        return weights + bias + (h if self.attention_output_bias else 0)

    @property
    def mlp_parameters_per_layer(self) -> int:
        return 3 * self.hidden_size * self.ffn_hidden_size  # gate, up, down

    @property
    def qk_norm_parameters_per_layer(self) -> int:
        """Weights of one block's q_norm and k_norm."""
        if self.qk_norm == "head":
            return 2 * self.effective_head_dim
        if self.qk_norm == "projection":
            return self.attention_width + self.kv_dim
        return 0

    @property
    def parameters_per_layer(self) -> int:
        norms = self.norms_per_block * self.hidden_size + self.qk_norm_parameters_per_layer
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


def _layout_field(arch: ModelArchitecture) -> str:
    """The field to name when a block layout matches no Hugging Face family."""
    if arch.norm_placement == "post" and arch.qk_norm != "projection":
        return "norm_placement"
    if arch.qk_norm == "projection" and arch.norm_placement != "post":
        return "qk_norm"
    return "attention_output_bias"


def _layout_problem(arch: ModelArchitecture) -> str:
    field = _layout_field(arch)
    if field == "norm_placement":
        return "norm_placement 'post' is OLMo 2's block and needs qk_norm 'projection'"
    if field == "qk_norm":
        return "qk_norm 'projection' is OLMo 2's block and needs norm_placement 'post'"
    return (
        f"attention_output_bias {arch.attention_output_bias} with attention_bias {arch.attention_bias} matches no "
        "supported family: only Qwen2 (qk_norm 'none') has q/k/v biases without an output bias"
    )


class TrainingIntent(BaseModel):
    """What the team wants to train: sequence length, global batch, budget, schedule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Left out of job hyperparameters at their defaults: jobs of profiles that do not set them are unchanged.
    LEFT_OUT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("document_masking",)

    seq_len: int = Field(ge=16, le=MAX_SEQ_LEN)
    global_batch_tokens: int = Field(
        ge=16, le=MAX_GLOBAL_BATCH_TOKENS, description="target tokens per optimizer step"
    )
    total_tokens: int | None = Field(default=None, ge=1, description="training budget in tokens")
    learning_rate: float = Field(default=3e-4, gt=0, lt=1, allow_inf_nan=False)
    min_learning_rate_ratio: float = Field(default=0.1, ge=0, le=1, allow_inf_nan=False)
    warmup_steps: int = Field(default=200, ge=0)
    weight_decay: float = Field(default=0.1, ge=0, lt=1, allow_inf_nan=False)
    # Clipping at 1.0 is the rule for LLM pre-training; a bound in the thousands never clips.
    max_grad_norm: float = Field(default=1.0, gt=0, le=MAX_GRAD_NORM, allow_inf_nan=False)
    document_masking: bool = Field(
        default=False,
        description="attend within each packed document only (its tokens, up to its end-of-document token), as "
        "long-context recipes do; off: causal attention over the whole window, documents seeing the ones before",
    )


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
    context_parallel: int | None = None

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
        default=None,
        ge=1,
        description="count published with the checkpoint; when given, the architecture must match it exactly",
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
        self._check_context_parallel_pin()
        published, counted = self.published_parameter_count, self.parameter_count
        if published is not None and published != counted:
            raise FieldError(
                "published_parameter_count",
                f"published_parameter_count ({published:,}) differs from the architecture's {counted:,} "
                f"({counted - published:+,}): the architecture is not the published model; check head_dim, "
                "qk_norm, tied_embeddings and the biases against its config.json",
            )
        return self

    def _check_context_parallel_pin(self) -> None:
        """A pinned context-parallel degree the trainer can run with the profile's sequence and sharding pin."""
        cp = self.pinned.context_parallel
        sharding = self.pinned.sharding or ""  # not pinned: the search picks one that suits
        problem = None if cp is None else context_parallel_problem(cp, self.training.seq_len, sharding)
        if problem:
            raise FieldError("pinned.context_parallel", f"pinned.{problem}")

    @property
    def parameter_count(self) -> int:
        return self.architecture.parameter_count
