"""A dense decoder (Llama, Mistral, Qwen2, Qwen3, OLMo 2, Granite, SmolLM3, Phi-3, Gemma 2/3 layouts) with Hugging
Face names.

Model code only: no parallelism, no precision tricks (those are applied from outside by
:mod:`btk_trainer.parallelize`, torchtitan style). The parameter names match Hugging Face's ``LlamaForCausalLM``
/ ``MistralForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``Olmo2ForCausalLM`` /
``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` (``model.embed_tokens.weight``,
``model.layers.N.self_attn.q_proj.weight``, ``...self_attn.q_norm.weight``,
``...post_feedforward_layernorm.weight``, ``model.norm.weight``, ``lm_head.weight``), so a Hugging Face
safetensors checkpoint loads with :func:`load_safetensors` as it is, and :func:`export_hf` writes one back with
the ``config.json`` of the architecture's family (:attr:`btk.profile.ModelArchitecture.hf_model_type`). Phi-3's
checkpoints stack q/k/v and gate/up into one matrix each: they are split when loaded and stacked when exported
(:func:`from_hf_state_dict`, :func:`to_hf_state_dict`); the model itself keeps one layout.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own spelling, as in torchtitan and transformers)
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from btk.loss_chunks import loss_chunk_tokens
from btk.profile import AnyRopeScaling, LinearRopeScaling, ModelArchitecture, YarnRopeScaling


class ParameterInit:
    """Fills parameters for :meth:`Decoder.init_weights`, the same values under any layout.

    Each parameter is drawn in full (fp32) from its own generator, seeded by ``seed`` and the
    parameter's position in the model, and then only this rank's shard is kept. The same seed
    therefore gives the same model whether it is plain, FSDP-sharded or split by tensor
    parallelism, and whatever wraps the blocks (activation checkpointing, compile, float8).
    """

    def __init__(self, model: nn.Module, seed: int) -> None:
        self.seed = seed
        self._index = {id(parameter): index for index, parameter in enumerate(model.parameters())}
        self._pending = set(self._index)

    def normal(self, parameter: torch.Tensor, std: float) -> None:
        generator = torch.Generator(device=parameter.device).manual_seed(self.seed * 1_000_003 + self._take(parameter))
        full = torch.empty(parameter.shape, device=parameter.device).normal_(0.0, std, generator=generator)
        self._fill(parameter, full)

    def ones(self, parameter: torch.Tensor) -> None:
        self._take(parameter)
        self._fill(parameter, torch.ones(parameter.shape, device=parameter.device))

    def zeros(self, parameter: torch.Tensor) -> None:
        self._take(parameter)
        self._fill(parameter, torch.zeros(parameter.shape, device=parameter.device))

    def check_complete(self) -> None:
        """A parameter no block initialised would keep ``to_empty``'s garbage: refuse it."""
        if self._pending:
            raise RuntimeError(f"init_weights left {len(self._pending)} parameter(s) uninitialised")

    def _take(self, parameter: torch.Tensor) -> int:
        index = self._index[id(parameter)]
        self._pending.discard(id(parameter))
        return index

    @staticmethod
    def _fill(parameter: torch.Tensor, full: torch.Tensor) -> None:
        # A sharded parameter is a DTensor: keep the slice of the full tensor this rank holds.
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(parameter, DTensor):
            local = distribute_tensor(full, parameter.device_mesh, parameter.placements, src_data_rank=None)
            parameter.to_local().copy_(local.to_local())
        else:
            parameter.copy_(full)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32 like Hugging Face's.

    ``scale_in_fp32``: multiply by the weight before casting back to the input's dtype, as
    OLMo 2's norm does (``Olmo2RMSNorm``); Llama, Mistral and Qwen cast first, then scale.
    ``offset``: scale by ``1 + weight`` in fp32, the weight starting at zero (``Gemma2RMSNorm``).
    """

    def __init__(self, dim: int, eps: float, *, scale_in_fp32: bool = False, offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32 or offset
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (hidden * (1.0 + self.weight.float())).to(dtype)
        if self.scale_in_fp32:
            return (self.weight * hidden).to(dtype)
        return self.weight * hidden.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight) if self.offset else nn.init.ones_(self.weight)

    def init_weights(self, init: ParameterInit) -> None:
        """The identity norm: a weight of one, or of zero where the norm scales by ``1 + weight``."""
        if self.offset:
            init.zeros(self.weight)
        else:
            init.ones(self.weight)


def block_norm(arch: ModelArchitecture, dim: int | None = None) -> RMSNorm:
    """An RMSNorm of the architecture's kind over ``dim`` (default ``hidden_size``)."""
    return RMSNorm(arch.hidden_size if dim is None else dim, arch.rms_norm_eps,
                   scale_in_fp32=arch.norms_scale_in_fp32, offset=arch.is_gemma)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: AnyRopeScaling | None) -> torch.Tensor:
    """RoPE inverse frequencies (fp32), with Llama 3.1's, YaRN's or linear frequency scaling when given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if isinstance(scaling, LinearRopeScaling):
        return inv_freq / scaling.factor
    if isinstance(scaling, YarnRopeScaling):
        return _yarn_frequencies(inv_freq, head_dim, theta, scaling)
    old_context = scaling.original_max_position_embeddings
    low_wavelen = old_context / scaling.low_freq_factor
    high_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_frequencies(inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: YarnRopeScaling) -> torch.Tensor:
    """YaRN's blend of the original frequencies (kept where a wavelength makes more than ``beta_fast`` turns over
    the original context) and the interpolated ones (divided by ``factor`` below ``beta_slow`` turns), ramped
    linearly over the dimensions between."""

    def dimension(turns: float) -> float:  # the dimension pair whose frequency makes ``turns`` over the context
        context = scaling.original_max_position_embeddings
        return head_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of one dimension: a step
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp
    return inv_freq / scaling.factor * (1 - kept) + inv_freq * kept


def rope_tables(
    seq_len: int, head_dim: int, theta: float, scaling: AnyRopeScaling | None, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` tables of shape (seq_len, head_dim), fp32 (Hugging Face layout); YaRN scales both by
    its attention factor (:attr:`~btk.profile.YarnRopeScaling.cos_sin_scale`)."""
    inv_freq = rope_inverse_frequencies(head_dim, theta, scaling).to(device)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    if isinstance(scaling, YarnRopeScaling):
        return emb.cos() * scaling.cos_sin_scale, emb.sin() * scaling.cos_sin_scale
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape (batch, heads, seq, head_dim) by the position tables."""
    dtype = x.dtype
    cos = cos.to(dtype)[None, None]
    sin = sin.to(dtype)[None, None]
    return x * cos + _rotate_half(x) * sin


def attention_backends(device_type: str) -> list[SDPBackend]:
    """SDPA backends in order of preference: on GPUs cuDNN, then flash, then memory-efficient (as torchtitan);
    math last everywhere, so a backend that is missing or refuses the shapes falls back instead of failing."""
    if device_type == "cuda":
        return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]  # CPU: torch's flash kernel for CPU, else math


class SequenceShard(Protocol):
    """Which positions of each sequence one rank computes (context parallelism, :mod:`btk_trainer.context_parallel`)."""

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """This rank's positions (int64), in the order its hidden states hold them."""
        ...

    def key_positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """The positions of the keys its attention layers gather, in gathered order."""
        ...


AttentionMask = Any
"""What :meth:`Decoder.attention_mask` makes of a micro-batch's documents: a ``BlockMask`` for
``flex_attention`` on CUDA, a dense boolean (batch, 1, seq, seq) mask for SDPA elsewhere; None for
plain causal attention over the whole window."""


def same_document_causal(documents: torch.Tensor) -> Callable[[Any, Any, Any, Any], Any]:
    """The mask rule of document masking as a ``flex_attention`` ``mask_mod``: a query attends to a key at or
    before it in the same document (``documents``: (batch, seq), :func:`btk_trainer.data.document_ids`)."""

    def mask_mod(batch: Any, head: Any, query: Any, key: Any) -> Any:
        return (query >= key) & (documents[batch, query] == documents[batch, key])

    return mask_mod


def dense_document_mask(documents: torch.Tensor) -> torch.Tensor:
    """The same rule as :func:`same_document_causal`, spelled out: (batch, 1, seq, seq) bool, True where attended."""
    seq = documents.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=documents.device).tril()
    return (causal & (documents[:, :, None] == documents[:, None, :]))[:, None]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attended) as the additive one SDPA adds to the scores, in the activations' dtype.

    Made once per micro-batch and shared by every block: SDPA's CPU kernel converts a boolean mask to this
    form itself, and the converted copy is what it saves for backward, one per block (a dense mask is the
    path off CUDA: the CPU tests and the full-size dry run).
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def positioned_causal(query_positions: torch.Tensor, key_positions: torch.Tensor,
                      documents: torch.Tensor | None, window: int | None = None) -> Callable[[Any, Any, Any, Any], Any]:
    """The causal rule for queries and keys named by their positions in the sequence (context parallelism: not one
    contiguous window), within documents when ``documents`` (batch, seq) is given and within the ``window`` most
    recent positions when given (a sliding window, Hugging Face's ``q - k < window``): a ``mask_mod``."""

    def mask_mod(batch: Any, head: Any, query: Any, key: Any) -> Any:
        query_position, key_position = query_positions[query], key_positions[key]
        allowed = query_position >= key_position
        if window is not None:
            allowed = allowed & (query_position - key_position < window)
        if documents is None:
            return allowed
        return allowed & (documents[batch, query_position] == documents[batch, key_position])

    return mask_mod


def dense_positioned_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                          documents: torch.Tensor | None, window: int | None = None) -> torch.Tensor:
    """:func:`positioned_causal`'s rule spelled out: (batch or 1, 1, queries, keys) bool, True where attended."""
    distance = query_positions[:, None] - key_positions[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    if documents is None:
        return allowed[None, None]
    same = documents[:, query_positions, None] == documents[:, None, key_positions]
    return (allowed & same)[:, None]


_compiled_flex_attention: Any = None


def flex_attention_compiled() -> Any:
    """``flex_attention`` compiled once per process: uncompiled it builds the full score matrix (inside a compiled
    block the call is traced into the block's graph either way, as torchtitan does)."""
    global _compiled_flex_attention
    if _compiled_flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex_attention = torch.compile(flex_attention)
    return _compiled_flex_attention


def soft_capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                          scale: float | None, softcap: float) -> torch.Tensor:
    """Attention with the scores soft-capped (``c * tanh(scores / c)``, Gemma 2), written out as transformers' eager
    Gemma attention computes it: no fused kernel takes a cap off CUDA. ``mask``: additive, None for causal."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        seq = q.shape[2]
        mask = torch.full((seq, seq), float("-inf"), dtype=scores.dtype, device=q.device).triu(1)
    probabilities = torch.softmax((scores + mask).float(), dim=-1).to(q.dtype)
    return torch.matmul(probabilities, v)


def soft_cap_score(softcap: float) -> Callable[[Any, Any, Any, Any, Any], Any]:
    """Gemma 2's attention soft-capping as a ``flex_attention`` ``score_mod``."""

    def score_mod(score: Any, batch: Any, head: Any, query: Any, key: Any) -> Any:
        return torch.tanh(score / softcap) * softcap

    return score_mod


class Attention(nn.Module):
    """Grouped-query causal self-attention through ``scaled_dot_product_attention`` (``flex_attention`` under a block
    mask on CUDA).

    Head counts are derived from the projection widths at run time, so the same code runs
    on a tensor-parallel shard of the heads. QK-norm (``arch.qk_norm``): ``head`` normalises
    each head of the split q and k (Qwen3, Gemma 3), ``projection`` the whole projection output before
    the split (OLMo 2; under tensor parallelism its mean runs over the heads of every rank). A block
    with a sliding window (:meth:`~btk.profile.ModelArchitecture.window`) is handed a mask that
    holds it; soft-capped scores (Gemma 2) take :func:`soft_capped_attention` off CUDA and
    ``flex_attention`` with :func:`soft_cap_score` on CUDA.
    """

    #: Off CUDA, whether soft-capped attention is computed as written (every score kept for backward). The
    #: full-size dry run turns it off: it measures memory, and what a GPU's ``flex_attention`` keeps for
    #: backward is what SDPA keeps (the output and log-sum-exp), so it attends through SDPA, uncapped.
    exact_soft_capping_off_cuda: bool = True

    def __init__(self, arch: ModelArchitecture, *, rope: bool = True, window: int | None = None) -> None:
        super().__init__()
        self.head_dim = arch.effective_head_dim
        self.rope = rope  # False: this block attends without rotary embeddings (SmolLM3's NoPE blocks)
        self.window = window  # the block's sliding window; its mask holds it
        self.softcap = arch.attn_logit_softcapping
        self.scale = arch.attention_scale  # None: 1/sqrt(head_dim), SDPA's own default
        self.num_groups = arch.num_attention_heads // arch.num_kv_heads
        self.qk_norm = arch.qk_norm
        #: Set by context parallelism (:mod:`btk_trainer.context_parallel`): gathers every rank's keys (or
        #: values) of the sequence along dim 2; None: this rank holds the whole sequence.
        self.gather_keys: Callable[[torch.Tensor], torch.Tensor] | None = None
        h = arch.hidden_size
        self.q_proj = nn.Linear(h, arch.attention_width, bias=arch.attention_bias)
        self.k_proj = nn.Linear(h, arch.kv_dim, bias=arch.attention_bias)
        self.v_proj = nn.Linear(h, arch.kv_dim, bias=arch.attention_bias)
        self.o_proj = nn.Linear(arch.attention_width, h, bias=arch.attention_output_bias)
        if arch.qk_norm == "head":
            self.q_norm, self.k_norm = block_norm(arch, self.head_dim), block_norm(arch, self.head_dim)
        elif arch.qk_norm == "projection":
            self.q_norm, self.k_norm = block_norm(arch, arch.attention_width), block_norm(arch, arch.kv_dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, width) -> (batch, seq, heads, head_dim)."""
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: AttentionMask = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qk_norm == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.window is not None and mask is None:  # without its mask a windowed block would attend to everything
            raise ValueError("a block with a sliding window attends through its mask (Decoder.attention_mask)")
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.gather_keys is not None:
            k, v = self.gather_keys(k), self.gather_keys(v)
        # enable_gqa: each group of query heads reads its K/V head in place, no repeated copy.
        gqa = self.num_groups > 1
        if mask is not None and not isinstance(mask, torch.Tensor):  # a BlockMask (CUDA)
            score_mod = None if self.softcap is None else soft_cap_score(self.softcap)
            out = flex_attention_compiled()(q, k, v, block_mask=mask, score_mod=score_mod, scale=self.scale,
                                            enable_gqa=gqa)
        elif self.softcap is not None and self.exact_soft_capping_off_cuda:
            out = soft_capped_attention(q, k, v, mask, self.scale, self.softcap)
        elif mask is None:
            with sdpa_kernel(attention_backends(x.device.type), set_priority=True):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        else:
            with sdpa_kernel(attention_backends(x.device.type), set_priority=True):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
        return projected

    def init_weights(self, init: ParameterInit, std: float, depth_std: float) -> None:
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            init.normal(projection.weight, std)
            if projection.bias is not None:
                init.zeros(projection.bias)
        init.normal(self.o_proj.weight, depth_std)
        if self.o_proj.bias is not None:
            init.zeros(self.o_proj.bias)
        if self.qk_norm != "none":
            self.q_norm.init_weights(init)
            self.k_norm.init_weights(init)


class MLP(nn.Module):
    """Gated feed-forward: SwiGLU, or Gemma's GeGLU (GELU, tanh approximation)."""

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.gelu = arch.is_gemma
        self.gate_proj = nn.Linear(arch.hidden_size, arch.ffn_hidden_size, bias=False)
        self.up_proj = nn.Linear(arch.hidden_size, arch.ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(arch.ffn_hidden_size, arch.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        activated = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        out: torch.Tensor = self.down_proj(activated * self.up_proj(x))
        return out

    def init_weights(self, init: ParameterInit, std: float, depth_std: float) -> None:
        init.normal(self.gate_proj.weight, std)
        init.normal(self.up_proj.weight, std)
        init.normal(self.down_proj.weight, depth_std)


class DecoderLayer(nn.Module):
    """Transformer block, its norms before each sublayer (``pre``), after it (``post``, OLMo 2) or both
    (``sandwich``, Gemma).

    Hugging Face names the norms by position: pre-norm blocks have ``input_layernorm`` (before
    attention) and ``post_attention_layernorm`` (before the MLP); OLMo 2's post-norm blocks have
    ``post_attention_layernorm`` (on attention's output) and ``post_feedforward_layernorm`` (on
    the MLP's output); Gemma's have ``input_layernorm``, ``post_attention_layernorm`` (on attention's
    output), ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm``.
    """

    def __init__(self, arch: ModelArchitecture, layer_index: int = 0) -> None:
        super().__init__()
        self.placement = arch.norm_placement
        self.residual_multiplier = arch.residual_multiplier  # Granite scales each sublayer's output
        if self.placement != "post":
            self.input_layernorm = block_norm(arch)
        self.self_attn = Attention(arch, rope=arch.uses_rope(layer_index), window=arch.window(layer_index))
        self.post_attention_layernorm = block_norm(arch)
        if self.placement == "sandwich":
            self.pre_feedforward_layernorm = block_norm(arch)
        self.mlp = MLP(arch)
        if self.placement != "pre":
            self.post_feedforward_layernorm = block_norm(arch)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: AttentionMask = None) -> torch.Tensor:
        if self.placement == "pre":
            x = x + self._residual(self.self_attn(self.input_layernorm(x), cos, sin, mask))
            out: torch.Tensor = x + self._residual(self.mlp(self.post_attention_layernorm(x)))
            return out
        if self.placement == "sandwich":
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask))
            both: torch.Tensor = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
            return both
        x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, mask))
        post: torch.Tensor = x + self.post_feedforward_layernorm(self.mlp(x))
        return post

    def _residual(self, sublayer_output: torch.Tensor) -> torch.Tensor:
        """What a sublayer adds to the residual stream (no multiply where the multiplier is 1)."""
        if self.residual_multiplier == 1.0:
            return sublayer_output
        return sublayer_output * self.residual_multiplier

    def norms(self) -> list[RMSNorm]:
        """The block's residual-stream norms (two, or Gemma's four)."""
        if self.placement == "pre":
            return [self.input_layernorm, self.post_attention_layernorm]
        if self.placement == "sandwich":
            return [self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm,
                    self.post_feedforward_layernorm]
        return [self.post_attention_layernorm, self.post_feedforward_layernorm]

    def init_weights(self, init: ParameterInit, std: float, depth_std: float) -> None:
        for norm in self.norms():
            norm.init_weights(init)
        self.self_attn.init_weights(init, std, depth_std)
        self.mlp.init_weights(init, std, depth_std)


class DecoderBody(nn.Module):
    """``model.*`` in Hugging Face naming: embeddings, blocks, final norm."""

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(arch, index) for index in range(arch.num_layers)])
        self.norm = block_norm(arch)


LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ChunkKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
"""``(hidden rows, head weight, targets, scale) -> (summed loss in fp32, scale x its gradient w.r.t. the logits)``."""


def soft_capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(logits / softcap)`` (Gemma 2's final logits), the logits themselves without a cap."""
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def eager_cross_entropy(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                        softcap: float | None = None) -> torch.Tensor:
    """Mean next-token loss with the micro-batch's logits whole: logits in the compute dtype (soft-capped when
    ``softcap`` is given), upcast to fp32, then cross-entropy (the reference :class:`ChunkedCrossEntropy` is tested
    against)."""
    logits = soft_capped(F.linear(hidden, head_weight), softcap)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def cross_entropy_chunk(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                        scale: float, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of :class:`ChunkedCrossEntropy`: its summed loss (fp32) and ``scale`` x the loss's gradient
    w.r.t. its logits, in the hidden states' dtype.

    The logits are computed in the compute dtype and upcast to fp32, as :func:`eager_cross_entropy`;
    their gradient is ``softmax - one_hot(target)``, built in place in the fp32 logits. With ``softcap``
    the loss reads the capped logits ``c tanh(z / c)``, and the gradient w.r.t. ``z`` is multiplied by
    the cap's derivative ``1 - (capped / c)^2``.
    """
    logits = F.linear(hidden, head_weight).float()
    derivative = None
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
        derivative = 1.0 - (logits / softcap).square()
    picked = logits.gather(-1, targets[:, None])
    log_normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
    loss = (log_normaliser - picked).sum()
    gradient = logits.sub_(log_normaliser).exp_()
    gradient.scatter_add_(-1, targets[:, None], torch.full_like(picked, -1.0))
    if derivative is not None:
        gradient.mul_(derivative)
    return loss, gradient.mul_(scale).to(hidden.dtype)


def _accumulate_weight_gradient(total: torch.Tensor, logits_gradient: torch.Tensor, hidden: torch.Tensor) -> None:
    """``total += logits_gradient^T @ hidden`` in fp32, never with a temporary the size of the weight.

    On CUDA, cuBLAS accumulates the bf16 products straight into the fp32 total; elsewhere (where
    ``addmm`` has no ``out_dtype``) the chunk's operands are upcast, chunk-sized copies.
    """
    if logits_gradient.dtype == total.dtype:
        total.addmm_(logits_gradient.t(), hidden)
    elif total.device.type == "cuda":
        torch.addmm(total, logits_gradient.t(), hidden, out_dtype=total.dtype, out=total)
    else:
        total.addmm_(logits_gradient.t().to(total.dtype), hidden.to(total.dtype))


def chunked_linear_cross_entropy(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                                 kernel: ChunkKernel, chunk_tokens: int, *, gradients: bool
                                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(mean loss, its gradient w.r.t. ``hidden``, w.r.t. ``head_weight``) of rows ``hidden`` (tokens x hidden),
    ``chunk_tokens`` rows at a time; plain tensors, no autograd (``gradients=False``: the loss only).

    The head weight's gradient is summed over the chunks in fp32 and returned in the weight's dtype.
    """
    tokens = hidden.shape[0]
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    hidden_gradient = torch.empty_like(hidden) if gradients else None
    weight_gradient = torch.zeros(head_weight.shape, dtype=torch.float32, device=hidden.device) if gradients else None
    for start in range(0, tokens, chunk_tokens):
        rows = hidden[start:start + chunk_tokens]
        loss, logits_gradient = kernel(rows, head_weight, targets[start:start + chunk_tokens], 1.0 / tokens)
        total += loss
        if hidden_gradient is not None and weight_gradient is not None:
            torch.mm(logits_gradient, head_weight, out=hidden_gradient[start:start + chunk_tokens])
            _accumulate_weight_gradient(weight_gradient, logits_gradient, rows)
        del logits_gradient
    if weight_gradient is not None:
        weight_gradient = weight_gradient.to(head_weight.dtype)
    return total / tokens, hidden_gradient, weight_gradient


class _ChunkedCrossEntropyFunction(torch.autograd.Function):
    """The gradients are computed in forward, chunk by chunk; backward scales them by the loss's gradient."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                kernel: ChunkKernel, chunk_tokens: int) -> torch.Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1])
        loss, hidden_gradient, weight_gradient = chunked_linear_cross_entropy(
            rows, head_weight, targets.reshape(-1), kernel, chunk_tokens,
            gradients=ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        ctx.shape = hidden.shape
        ctx.save_for_backward(hidden_gradient, weight_gradient)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden_gradient, weight_gradient = ctx.saved_tensors
        hidden_gradient = hidden_gradient.mul_(grad_loss).view(ctx.shape)
        weight_gradient = weight_gradient.mul_(grad_loss) if ctx.needs_input_grad[1] else None
        return hidden_gradient, weight_gradient, None, None, None


class ChunkedCrossEntropy:
    """The mean next-token loss (a :data:`LossFn`) that never holds a micro-batch's logits whole.

    The tokens are cut into chunks of :func:`btk.loss_chunks.loss_chunk_tokens` (Liger-Kernel's
    rule: about as many logits per chunk as the micro-batch has hidden-state elements); each
    chunk's logits become its loss and the gradient of that loss w.r.t. the hidden states and the
    head weight (``kernel``, :func:`cross_entropy_chunk`) and are freed before the next chunk, as
    torchtitan's ``ChunkedLossWrapper`` runs each chunk's backward inside the forward. Backward
    then only scales the gradients. Same loss and gradients as :func:`eager_cross_entropy` (up to
    the order of fp32 sums); :func:`btk_trainer.parallelize.apply_fused_loss` compiles ``kernel``.
    """

    def __init__(self, kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]] = cross_entropy_chunk,
                 softcap: float | None = None) -> None:
        self.kernel = kernel
        self.softcap = softcap  # the final logits' soft cap (Gemma 2), passed to the kernel

    def __call__(self, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        chunk = loss_chunk_tokens(targets.numel(), head_weight.shape[0], head_weight.shape[1])
        kernel = self.kernel if self.softcap is None else functools.partial(self.kernel, softcap=self.softcap)
        loss: torch.Tensor = _ChunkedCrossEntropyFunction.apply(  # type: ignore[no-untyped-call]  # torch's apply is unannotated
            hidden, head_weight, targets, kernel, chunk)
        return loss


class OutputHead(nn.Linear):
    """The output projection (``lm_head``); given targets it returns the loss of ``loss_fn`` instead of logits.

    The loss is computed inside the head's own ``forward`` so that whatever wraps the head
    (an FSDP group of its own) sees it run and has its weight gathered.
    """

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                loss_fn: LossFn | None = None) -> torch.Tensor:
        if targets is None or loss_fn is None:
            return super().forward(hidden)
        return loss_fn(hidden, self.weight, targets)


class Decoder(nn.Module):
    """The causal language model.

    ``forward(tokens)`` returns logits; ``forward(tokens, targets)`` returns the mean loss,
    computed by ``self.loss_fn`` (:class:`ChunkedCrossEntropy`: never the micro-batch's logits
    whole) from the final hidden states and the head weight, so the trainer can compile its chunk
    kernel (the fused loss) or swap in the vocabulary-parallel one under tensor parallelism. The
    loss runs inside the head's ``forward`` (:class:`OutputHead`) so FSDP's hooks have its weight gathered.
    """

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.arch = arch
        self.model = DecoderBody(arch)
        self.lm_head = OutputHead(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tied_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.loss_fn: LossFn = ChunkedCrossEntropy(softcap=arch.final_logit_softcapping)
        #: Set by context parallelism (:mod:`btk_trainer.context_parallel`): which positions of each sequence
        #: this rank computes, and of the keys its attention layers gather; None: every position.
        self.sequence_shard: SequenceShard | None = None
        self._rope_cache: dict[tuple[int, str, str, float, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def tie_weights(self) -> None:
        """Share the head with the embedding when tied (``to_empty`` on plain tensors unties them)."""
        if self.arch.tied_embeddings and self.lm_head.weight is not self.model.embed_tokens.weight:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def weights_tied(self) -> bool:
        return self.lm_head.weight is self.model.embed_tokens.weight

    def rope(self, seq_len: int, device: torch.device, dtype: torch.dtype = torch.float32, layer_index: int = 0,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The position tables of block ``layer_index``'s RoPE (:meth:`~btk.profile.ModelArchitecture.rope_base`:
        the same for every block but Gemma 3's windowed ones), computed in fp32 and cast to ``dtype`` once, then
        shared by every block that rotates alike.

        Cast here, not in each block: :func:`apply_rope` casts them, and so does FSDP2 with a block's
        floating-point inputs (to its ``param_dtype``); a copy made in each block is saved for that block's
        backward, ``4 x head_dim`` bytes per position per block for tables that are the same in every block.
        """
        theta, scaling = self.arch.rope_base(layer_index)
        key = (seq_len, str(device), str(dtype), theta, repr(scaling))
        if key not in self._rope_cache:
            cos, sin = rope_tables(seq_len, self.arch.effective_head_dim, theta, scaling, device)
            self._rope_cache[key] = (cos.to(dtype), sin.to(dtype))
        return self._rope_cache[key]

    def attention_mask(self, documents: torch.Tensor | None, window: int | None = None,
                       seq_len: int | None = None, device: torch.device | None = None) -> AttentionMask:
        """The attention mask of a micro-batch's documents (and of a block's sliding ``window``), built once and
        shared by every block it applies to; None: plain causal attention over the whole window.

        On CUDA a ``BlockMask`` for ``flex_attention`` (blocks of 128 x 128 positions that no query
        attends are skipped, so the cost follows the documents' lengths and the window); elsewhere the
        dense mask SDPA takes (``flex_attention`` has no CPU backward in torch 2.13). Both apply
        :func:`positioned_causal`'s rule over the positions in order. Soft-capped attention on CUDA
        always takes a block mask (its ``score_mod`` is a ``flex_attention`` one).
        """
        if documents is not None:
            seq_len, device = documents.shape[1], documents.device
        if seq_len is None or device is None:
            raise ValueError("attention_mask needs the documents or the sequence length and device")
        cuda = device.type == "cuda"
        if documents is None and window is None and not (cuda and self.arch.attn_logit_softcapping is not None):
            return None
        positions = torch.arange(seq_len, device=device)
        return self.positioned_attention_mask(positions, positions, documents, window)

    @staticmethod
    def positioned_attention_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                                  documents: torch.Tensor | None, window: int | None = None) -> AttentionMask:
        """:meth:`attention_mask` for a rank that computes some positions of each sequence and attends to keys
        gathered in another order (context parallelism): a ``BlockMask`` on CUDA, a dense mask elsewhere."""
        if query_positions.device.type != "cuda":
            return dense_positioned_mask(query_positions, key_positions, documents, window)
        from torch.nn.attention.flex_attention import create_block_mask

        batch = None if documents is None else documents.shape[0]
        return create_block_mask(positioned_causal(query_positions, key_positions, documents, window), batch, None,
                                 len(query_positions), len(key_positions), device=query_positions.device)

    def embedding_scale(self, dtype: torch.dtype) -> float:
        """What the token embeddings are multiplied by: Granite's ``embedding_multiplier``, or Gemma's
        ``sqrt(hidden_size)`` rounded to the compute dtype first, as transformers' Gemma rounds it."""
        if not self.arch.is_gemma:
            return self.arch.embedding_multiplier
        return rounded_to(dtype, math.sqrt(self.arch.hidden_size))

    def hidden(self, tokens: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states as the head reads them (after the last norm, divided by ``logits_scaling``: the
        head is linear, so its logits are divided), shape (batch, seq, hidden); ``documents`` (batch, seq): attend
        within each document only (:meth:`attention_mask`). Under context parallelism ``tokens`` and
        ``documents`` are whole sequences and the hidden states those of this rank's positions."""
        seq = tokens.shape[1]
        shard = self.sequence_shard
        positions = None if shard is None else shard.positions(seq, tokens.device)
        x = self.model.embed_tokens(tokens if positions is None else tokens[:, positions])
        scale = self.embedding_scale(x.dtype)
        if scale != 1.0:
            x = x * scale
        masks: dict[int | None, AttentionMask] = {}
        for index, layer in enumerate(self.model.layers):
            window = self.arch.window(index)
            if window not in masks:
                if shard is None or positions is None:
                    mask = self.attention_mask(documents, window, seq, tokens.device)
                else:
                    mask = self.positioned_attention_mask(positions, shard.key_positions(seq, tokens.device),
                                                          documents, window)
                masks[window] = additive_mask(mask, x.dtype) if isinstance(mask, torch.Tensor) else mask
            cos, sin = self.rope(seq, tokens.device, x.dtype, index)
            if positions is not None:
                cos, sin = cos[positions], sin[positions]
            x = layer(x, cos, sin, masks[window])
        normed: torch.Tensor = self.model.norm(x)
        if self.arch.logits_scaling != 1.0:
            normed = normed / self.arch.logits_scaling
        return normed

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden(tokens, documents)
        if targets is None:
            logits: torch.Tensor = soft_capped(self.lm_head(hidden), self.arch.final_logit_softcapping)
            return logits
        if self.sequence_shard is not None:  # this rank's positions: its mean loss is over its own tokens
            targets = targets[:, self.sequence_shard.positions(targets.shape[1], targets.device)]
        loss: torch.Tensor = self.lm_head(hidden, targets, self.loss_fn)
        return loss

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self(tokens)
        return out

    @torch.no_grad()
    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """The one initialisation, for a plain model and a parallelised one alike (see :class:`ParameterInit`).

        Matrices are normal(0, ``std``); the projections that write into the residual stream
        (``o_proj``, ``down_proj``) use ``std / sqrt(2 * num_layers)`` so its variance does not
        grow with depth; norms start at one, biases at zero. Each block initialises its own
        parameters (through whatever wraps it: activation checkpointing and compile forward
        attribute lookups).
        """
        init = ParameterInit(self, seed)
        depth_std = std / math.sqrt(2 * self.arch.num_layers)
        init.normal(self.model.embed_tokens.weight, std)
        for layer in self.model.layers:
            cast(DecoderLayer, layer).init_weights(init, std, depth_std)  # or a wrapper forwarding to one
        self.model.norm.init_weights(init)
        if not self.weights_tied:
            init.normal(self.lm_head.weight, std)
        init.check_complete()

def rounded_to(dtype: torch.dtype, value: float) -> float:
    """``value`` rounded to ``dtype`` (nearest, ties to even) as a Python float, computed without a tensor (the dry
    run builds its model among fake tensors, which hold no value)."""
    if dtype == torch.float16:
        return float(struct.unpack("<e", struct.pack("<e", value))[0])
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return float(struct.unpack("<f", struct.pack("<I", bits))[0])
    if dtype == torch.float32:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    return value


HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
"""The ``architectures`` entry of each ``model_type`` :func:`hf_config` writes (Mistral's block is Llama's)."""


def hf_config(arch: ModelArchitecture, dtype: str = "bfloat16") -> dict[str, Any]:
    """A Hugging Face ``config.json`` for the architecture, in the family that holds its block layout.

    ``btk profile import`` reads it back to the same architecture (tested), and transformers
    builds the same model from it (the parity tests).
    """
    model_type = arch.hf_model_type
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": arch.rope_theta}
    if arch.rope_scaling is not None:
        rope = {**arch.rope_scaling.model_dump(exclude_none=True), "rope_theta": arch.rope_theta}
    config: dict[str, Any] = {
        "architectures": [HF_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.effective_head_dim,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_context,
        "rms_norm_eps": arch.rms_norm_eps,
        # Both spellings: rope_theta/rope_scaling (transformers 4.x) and rope_parameters (5.x).
        "rope_theta": arch.rope_theta,
        "rope_scaling": arch.rope_scaling.model_dump(exclude_none=True) if arch.rope_scaling else None,
        "rope_parameters": rope,
        "tie_word_embeddings": arch.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": dtype,
    }
    if model_type in ("olmo2", "smollm3", "phi3"):
        # The trainer's embedding has no padding row (documents are packed, no pad token is
        # trained); these config classes would otherwise default pad_token_id to a token id and
        # freeze that row.
        config["pad_token_id"] = None
    if model_type not in ("qwen2", "phi3"):  # Qwen2 builds its q/k/v biases in, Phi-3 has none
        config["attention_bias"] = arch.attention_bias
    if model_type in ("llama", "granite", "smollm3"):
        config["mlp_bias"] = False
    if model_type == "granite":
        config.update(embedding_multiplier=arch.embedding_multiplier, residual_multiplier=arch.residual_multiplier,
                      logits_scaling=arch.logits_scaling,
                      attention_multiplier=arch.attention_multiplier or arch.effective_head_dim ** -0.5)
    if model_type == "smollm3":
        config.update(no_rope_layer_interval=arch.no_rope_interval, use_sliding_window=False)
    if arch.is_gemma:
        config.update(_gemma_config(arch))
    return config


def _gemma_config(arch: ModelArchitecture) -> dict[str, Any]:
    """What a Gemma 2 or 3 ``config.json`` adds: its activation, query scale, windows per block, soft caps and, for
    Gemma 3, the windowed blocks' RoPE (both spellings again: ``rope_local_base_freq`` for transformers 4.x,
    ``rope_parameters`` per attention type for 5.x)."""
    layer_types = ["full_attention" if arch.window(index) is None else "sliding_attention"
                   for index in range(arch.num_layers)]
    config: dict[str, Any] = {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": arch.query_pre_attn_scalar or arch.effective_head_dim,
        "sliding_window": arch.sliding_window,
        "layer_types": layer_types,
        "attn_logit_softcapping": arch.attn_logit_softcapping,
        "final_logit_softcapping": arch.final_logit_softcapping,
        "use_bidirectional_attention": False,
        "pad_token_id": None,  # the trainer's embedding has no padding row (Gemma's config would freeze row 0)
    }
    if arch.hf_model_type == "gemma3_text":
        local_theta = arch.local_rope_theta or arch.rope_theta
        full = {"rope_type": "default", "rope_theta": arch.rope_theta}
        if arch.rope_scaling is not None:
            full = {**arch.rope_scaling.model_dump(exclude_none=True), "rope_theta": arch.rope_theta}
        config.update(rope_local_base_freq=local_theta, rope_parameters={
            "full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}})
    return config


FUSED_PROJECTIONS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}
"""Phi-3's fused projections (:attr:`~btk.profile.ModelArchitecture.fused_projections`) and the trainer's own
projections each stacks along its output dimension, in order."""


def _fused_parts(arch: ModelArchitecture, fused: str) -> list[tuple[str, int]]:
    """(trainer name, output width) of each projection ``fused`` stacks."""
    widths = {"q_proj": arch.attention_width, "k_proj": arch.kv_dim, "v_proj": arch.kv_dim,
              "gate_proj": arch.ffn_hidden_size, "up_proj": arch.ffn_hidden_size}
    module = fused.split(".")[0]
    return [(f"{module}.{part}", widths[part]) for part in FUSED_PROJECTIONS[fused]]


def from_hf_state_dict(state: dict[str, torch.Tensor], arch: ModelArchitecture) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict in the trainer's names: Phi-3's fused projections split into the trainer's
    (torchtitan's way: the model keeps one layout, checkpoints are converted at the boundary). A fused tensor
    whose rows do not add up is left as it is, for the caller to report by name."""
    if not arch.fused_projections:
        return state
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        fused = next((key for key in FUSED_PROJECTIONS if name.endswith(f".{key}.weight")), None)
        parts = _fused_parts(arch, fused) if fused else []
        if not fused or tensor.shape[0] != sum(width for _, width in parts):
            converted[name] = tensor
            continue
        prefix = name.removesuffix(f"{fused}.weight")
        pieces = torch.split(tensor, [width for _, width in parts])
        for (part, _), piece in zip(parts, pieces, strict=True):
            converted[f"{prefix}{part}.weight"] = piece
    return converted


def to_hf_state_dict(state: dict[str, torch.Tensor], arch: ModelArchitecture) -> dict[str, torch.Tensor]:
    """The trainer's state dict in Hugging Face's names (the inverse of :func:`from_hf_state_dict`)."""
    if not arch.fused_projections:
        return state
    converted = dict(state)
    for name in [name for name in state if name.endswith(".self_attn.q_proj.weight") or
                 name.endswith(".mlp.gate_proj.weight")]:
        fused = "self_attn.qkv_proj" if name.endswith("q_proj.weight") else "mlp.gate_up_proj"
        prefix = name.removesuffix(f"{_fused_parts(arch, fused)[0][0]}.weight")
        pieces = [converted.pop(f"{prefix}{part}.weight") for part, _ in _fused_parts(arch, fused)]
        converted[f"{prefix}{fused}.weight"] = torch.cat(pieces)
    return converted


def load_safetensors(model: Decoder, directory: Path) -> None:
    """Load Hugging Face safetensors weights (one file or sharded with an index) into ``model``.

    Missing or unexpected names are an error naming them; a tied model accepts a checkpoint
    with or without ``lm_head.weight``.
    """
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"init_from {directory}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    state = from_hf_state_dict(state, model.arch)
    if model.arch.tied_embeddings:
        state.pop("lm_head.weight", None)
    expected = {name for name, _ in model.named_parameters()}
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected - {"lm_head.weight"})
    if missing or unexpected:
        raise ValueError(f"init_from {directory}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            source = state[name]
            if tuple(source.shape) != tuple(parameter.shape):
                raise ValueError(f"init_from {directory}: {name} has shape {tuple(source.shape)}, "
                                 f"the architecture expects {tuple(parameter.shape)}")
            parameter.copy_(source.to(parameter.dtype))


def export_hf(state: dict[str, torch.Tensor], arch: ModelArchitecture, directory: Path,
              dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``model.safetensors`` + ``config.json`` (Hugging Face layout) from a full state dict."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to(dtype).contiguous() for name, tensor in to_hf_state_dict(state, arch).items()}
    if arch.tied_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = str(dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(hf_config(arch, dtype_name), indent=2) + "\n")
