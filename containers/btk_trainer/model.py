"""A dense decoder (Llama, Mistral, Qwen2, Qwen3, OLMo 2, Granite, SmolLM3, Phi-3 layouts) with Hugging Face names.

Model code only: no parallelism, no precision tricks (those are applied from outside by
:mod:`btk_trainer.parallelize`, torchtitan style). The parameter names match Hugging Face's
``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` /
``Olmo2ForCausalLM`` (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``,
``...self_attn.q_norm.weight``, ``...post_feedforward_layernorm.weight``, ``model.norm.weight``,
``lm_head.weight``), so a Hugging Face safetensors checkpoint loads with :func:`load_safetensors`
as it is, and :func:`export_hf` writes one back with the ``config.json`` of the architecture's
family (:attr:`btk.profile.ModelArchitecture.hf_model_type`). Phi-3's checkpoints stack q/k/v and
gate/up into one matrix each: they are split when loaded and stacked when exported
(:func:`from_hf_state_dict`, :func:`to_hf_state_dict`); the model itself keeps one layout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own spelling, as in torchtitan and transformers)
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from btk.loss_chunks import loss_chunk_tokens
from btk.profile import AnyRopeScaling, ModelArchitecture, YarnRopeScaling


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
    """

    def __init__(self, dim: int, eps: float, *, scale_in_fp32: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (self.weight * hidden).to(dtype)
        return self.weight * hidden.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: AnyRopeScaling | None) -> torch.Tensor:
    """RoPE inverse frequencies (fp32), with Llama 3.1's or YaRN's frequency scaling when given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
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
                      documents: torch.Tensor | None) -> Callable[[Any, Any, Any, Any], Any]:
    """The causal rule for queries and keys that are not one contiguous window (each side's tokens named by their
    positions in the sequence), within documents when ``documents`` (batch, seq) is given: a ``mask_mod``."""

    def mask_mod(batch: Any, head: Any, query: Any, key: Any) -> Any:
        query_position, key_position = query_positions[query], key_positions[key]
        causal = query_position >= key_position
        if documents is None:
            return causal
        return causal & (documents[batch, query_position] == documents[batch, key_position])

    return mask_mod


def dense_positioned_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                          documents: torch.Tensor | None) -> torch.Tensor:
    """:func:`positioned_causal`'s rule spelled out: (batch or 1, 1, queries, keys) bool, True where attended."""
    causal = query_positions[:, None] >= key_positions[None, :]
    if documents is None:
        return causal[None, None]
    same = documents[:, query_positions, None] == documents[:, None, key_positions]
    return (causal & same)[:, None]


_compiled_flex_attention: Any = None


def flex_attention_compiled() -> Any:
    """``flex_attention`` compiled once per process: uncompiled it builds the full score matrix (inside a compiled
    block the call is traced into the block's graph either way, as torchtitan does)."""
    global _compiled_flex_attention
    if _compiled_flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex_attention = torch.compile(flex_attention)
    return _compiled_flex_attention


def scales_norms_in_fp32(arch: ModelArchitecture) -> bool:
    """Whether the architecture's norms scale before casting back (OLMo 2's ``Olmo2RMSNorm``, all of its norms)."""
    return arch.norms_scale_in_fp32


class Attention(nn.Module):
    """Grouped-query causal self-attention through ``scaled_dot_product_attention``.

    Head counts are derived from the projection widths at run time, so the same code runs
    on a tensor-parallel shard of the heads. QK-norm (``arch.qk_norm``): ``head`` normalises
    each head of the split q and k (Qwen3), ``projection`` the whole projection output before
    the split (OLMo 2; under tensor parallelism its mean runs over the heads of every rank).
    """

    def __init__(self, arch: ModelArchitecture, *, rope: bool = True) -> None:
        super().__init__()
        self.head_dim = arch.effective_head_dim
        self.rope = rope  # False: this block attends without rotary embeddings (SmolLM3's NoPE blocks)
        self.scale = arch.attention_multiplier  # None: 1/sqrt(head_dim), SDPA's own default
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
        fp32_scale = scales_norms_in_fp32(arch)
        if arch.qk_norm == "head":
            self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, scale_in_fp32=fp32_scale)
            self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, scale_in_fp32=fp32_scale)
        elif arch.qk_norm == "projection":
            self.q_norm = RMSNorm(arch.attention_width, arch.rms_norm_eps, scale_in_fp32=fp32_scale)
            self.k_norm = RMSNorm(arch.kv_dim, arch.rms_norm_eps, scale_in_fp32=fp32_scale)

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
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.gather_keys is not None:
            k, v = self.gather_keys(k), self.gather_keys(v)
        # enable_gqa: each group of query heads reads its K/V head in place, no repeated copy.
        gqa = self.num_groups > 1
        if mask is None:
            with sdpa_kernel(attention_backends(x.device.type), set_priority=True):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        elif isinstance(mask, torch.Tensor):
            with sdpa_kernel(attention_backends(x.device.type), set_priority=True):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        else:
            out = flex_attention_compiled()(q, k, v, block_mask=mask, scale=self.scale, enable_gqa=gqa)
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
            init.ones(self.q_norm.weight)
            init.ones(self.k_norm.weight)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.hidden_size, arch.ffn_hidden_size, bias=False)
        self.up_proj = nn.Linear(arch.hidden_size, arch.ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(arch.ffn_hidden_size, arch.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out

    def init_weights(self, init: ParameterInit, std: float, depth_std: float) -> None:
        init.normal(self.gate_proj.weight, std)
        init.normal(self.up_proj.weight, std)
        init.normal(self.down_proj.weight, depth_std)


class DecoderLayer(nn.Module):
    """Transformer block, its norms before each sublayer (``pre``) or after it (``post``, OLMo 2).

    Hugging Face names the norms by position: pre-norm blocks have ``input_layernorm`` (before
    attention) and ``post_attention_layernorm`` (before the MLP); OLMo 2's post-norm blocks have
    ``post_attention_layernorm`` (on attention's output) and ``post_feedforward_layernorm`` (on
    the MLP's output).
    """

    def __init__(self, arch: ModelArchitecture, layer_index: int = 0) -> None:
        super().__init__()
        self.pre_norm = arch.norm_placement == "pre"
        self.residual_multiplier = arch.residual_multiplier  # Granite scales each sublayer's output
        fp32_scale = scales_norms_in_fp32(arch)
        if self.pre_norm:
            self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, scale_in_fp32=fp32_scale)
        self.self_attn = Attention(arch, rope=arch.uses_rope(layer_index))
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, scale_in_fp32=fp32_scale)
        self.mlp = MLP(arch)
        if not self.pre_norm:
            self.post_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, scale_in_fp32=fp32_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: AttentionMask = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self._residual(self.self_attn(self.input_layernorm(x), cos, sin, mask))
            out: torch.Tensor = x + self._residual(self.mlp(self.post_attention_layernorm(x)))
            return out
        x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin, mask))
        post: torch.Tensor = x + self.post_feedforward_layernorm(self.mlp(x))
        return post

    def _residual(self, sublayer_output: torch.Tensor) -> torch.Tensor:
        """What a sublayer adds to the residual stream (no multiply where the multiplier is 1)."""
        if self.residual_multiplier == 1.0:
            return sublayer_output
        return sublayer_output * self.residual_multiplier

    def norms(self) -> list[RMSNorm]:
        """The block's two residual-stream norms."""
        if self.pre_norm:
            return [self.input_layernorm, self.post_attention_layernorm]
        return [self.post_attention_layernorm, self.post_feedforward_layernorm]

    def init_weights(self, init: ParameterInit, std: float, depth_std: float) -> None:
        for norm in self.norms():
            init.ones(norm.weight)
        self.self_attn.init_weights(init, std, depth_std)
        self.mlp.init_weights(init, std, depth_std)


class DecoderBody(nn.Module):
    """``model.*`` in Hugging Face naming: embeddings, blocks, final norm."""

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(arch, index) for index in range(arch.num_layers)])
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, scale_in_fp32=scales_norms_in_fp32(arch))


LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ChunkKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
"""``(hidden rows, head weight, targets, scale) -> (summed loss in fp32, scale x its gradient w.r.t. the logits)``."""


def eager_cross_entropy(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss with the micro-batch's logits whole: logits in the compute dtype, upcast to fp32,
    then cross-entropy (the reference :class:`ChunkedCrossEntropy` is tested against)."""
    logits = F.linear(hidden, head_weight)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def cross_entropy_chunk(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of :class:`ChunkedCrossEntropy`: its summed loss (fp32) and ``scale`` x the loss's gradient
    w.r.t. its logits, in the hidden states' dtype.

    The logits are computed in the compute dtype and upcast to fp32, as :func:`eager_cross_entropy`;
    their gradient is ``softmax - one_hot(target)``, built in place in the fp32 logits.
    """
    logits = F.linear(hidden, head_weight).float()
    picked = logits.gather(-1, targets[:, None])
    log_normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
    loss = (log_normaliser - picked).sum()
    gradient = logits.sub_(log_normaliser).exp_()
    gradient.scatter_add_(-1, targets[:, None], torch.full_like(picked, -1.0))
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

    def __init__(self, kernel: ChunkKernel = cross_entropy_chunk) -> None:
        self.kernel = kernel

    def __call__(self, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        chunk = loss_chunk_tokens(targets.numel(), head_weight.shape[0], head_weight.shape[1])
        loss: torch.Tensor = _ChunkedCrossEntropyFunction.apply(  # type: ignore[no-untyped-call]  # torch's apply is unannotated
            hidden, head_weight, targets, self.kernel, chunk)
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
        self.loss_fn: LossFn = ChunkedCrossEntropy()
        #: Set by context parallelism (:mod:`btk_trainer.context_parallel`): which positions of each sequence
        #: this rank computes, and of the keys its attention layers gather; None: every position.
        self.sequence_shard: SequenceShard | None = None
        self._rope_cache: dict[tuple[int, str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def tie_weights(self) -> None:
        """Share the head with the embedding when tied (``to_empty`` on plain tensors unties them)."""
        if self.arch.tied_embeddings and self.lm_head.weight is not self.model.embed_tokens.weight:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def weights_tied(self) -> bool:
        return self.lm_head.weight is self.model.embed_tokens.weight

    def rope(self, seq_len: int, device: torch.device, dtype: torch.dtype = torch.float32,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The position tables, computed in fp32 and cast to ``dtype`` once, then shared by every block.

        Cast here, not in each block: :func:`apply_rope` casts them, and so does FSDP2 with a block's
        floating-point inputs (to its ``param_dtype``); a copy made in each block is saved for that block's
        backward, ``4 x head_dim`` bytes per position per block for tables that are the same in every block.
        """
        key = (seq_len, str(device), str(dtype))
        if key not in self._rope_cache:
            cos, sin = rope_tables(
                seq_len, self.arch.effective_head_dim, self.arch.rope_theta, self.arch.rope_scaling, device
            )
            self._rope_cache[key] = (cos.to(dtype), sin.to(dtype))
        return self._rope_cache[key]

    @staticmethod
    def attention_mask(documents: torch.Tensor | None) -> AttentionMask:
        """The attention mask of a micro-batch's documents, built once and shared by every block; None: causal.

        On CUDA a ``BlockMask`` for ``flex_attention`` (blocks of 128 x 128 positions that no query
        attends are skipped, so the cost follows the documents' lengths); elsewhere the dense mask
        SDPA takes (``flex_attention`` has no CPU backward in torch 2.13). Both apply
        :func:`same_document_causal`'s rule.
        """
        if documents is None:
            return None
        if documents.device.type != "cuda":
            return dense_document_mask(documents)
        from torch.nn.attention.flex_attention import create_block_mask

        batch, seq = documents.shape
        return create_block_mask(same_document_causal(documents), batch, None, seq, seq, device=documents.device)

    @staticmethod
    def positioned_attention_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                                  documents: torch.Tensor | None) -> AttentionMask:
        """:meth:`attention_mask` for a rank that computes some positions of each sequence and attends to keys
        gathered in another order (context parallelism): a ``BlockMask`` on CUDA, a dense mask elsewhere."""
        if query_positions.device.type != "cuda":
            return dense_positioned_mask(query_positions, key_positions, documents)
        from torch.nn.attention.flex_attention import create_block_mask

        batch = None if documents is None else documents.shape[0]
        return create_block_mask(positioned_causal(query_positions, key_positions, documents), batch, None,
                                 len(query_positions), len(key_positions), device=query_positions.device)

    def hidden(self, tokens: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states as the head reads them (after the last norm, divided by ``logits_scaling``: the
        head is linear, so its logits are divided), shape (batch, seq, hidden); ``documents`` (batch, seq): attend
        within each document only (:meth:`attention_mask`). Under context parallelism ``tokens`` and
        ``documents`` are whole sequences and the hidden states those of this rank's positions."""
        seq = tokens.shape[1]
        shard = self.sequence_shard
        positions = None if shard is None else shard.positions(seq, tokens.device)
        x = self.model.embed_tokens(tokens if positions is None else tokens[:, positions])
        if self.arch.embedding_multiplier != 1.0:
            x = x * self.arch.embedding_multiplier
        cos, sin = self.rope(seq, tokens.device, x.dtype)
        if shard is None or positions is None:
            mask = self.attention_mask(documents)
        else:
            cos, sin = cos[positions], sin[positions]
            mask = self.positioned_attention_mask(positions, shard.key_positions(seq, tokens.device), documents)
        if isinstance(mask, torch.Tensor):
            mask = additive_mask(mask, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        normed: torch.Tensor = self.model.norm(x)
        if self.arch.logits_scaling != 1.0:
            normed = normed / self.arch.logits_scaling
        return normed

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden(tokens, documents)
        if targets is None:
            logits: torch.Tensor = self.lm_head(hidden)
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
        init.ones(self.model.norm.weight)
        if not self.weights_tied:
            init.normal(self.lm_head.weight, std)
        init.check_complete()

HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
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
