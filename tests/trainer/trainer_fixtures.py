"""Tiny architectures and jobs shared by the trainer tests and their worker processes.

A uniquely named module rather than ``conftest``: ``from conftest import ...`` resolves to
whichever test folder's conftest was imported first when several folders run together.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from btk.hyperparameters import JobHyperparameters, JobSettings
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture, RopeScaling, TrainingIntent, YarnRopeScaling

#: How the multi-process tests start their ranks: as forks of the launcher script, which has imported torch
#: and the trainer and done nothing else (no thread, no accelerator), so no rank imports them again
#: (about 2 CPU-seconds a rank; ``spawn`` would re-import everything in each).
RANK_START_METHOD = "fork"


def tiny_llama(**overrides: object) -> ModelArchitecture:
    """A Llama-3-like toy: GQA, llama3 rope scaling, untied head."""
    values: dict[str, object] = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_kv_heads": 2,
        "ffn_hidden_size": 96,
        "vocab_size": 128,
        "tied_embeddings": False,
        "max_context": 256,
        "attention_bias": False,
        "rope_theta": 500000.0,
        "rope_scaling": RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
        ),
        "rms_norm_eps": 1e-5,
    }
    values.update(overrides)
    return ModelArchitecture.model_validate(values)


def tiny_qwen(**overrides: object) -> ModelArchitecture:
    """A Qwen2-like toy: qkv bias, tied embeddings, no rope scaling."""
    values: dict[str, object] = {
        "attention_bias": True,
        "tied_embeddings": True,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
    }
    values.update(overrides)
    return tiny_llama(**values)


def tiny_qwen_yarn(**overrides: object) -> ModelArchitecture:
    """The Qwen2 toy with YaRN as Qwen2.5's model cards set it (factor 4 over the original context), the original
    context and RoPE base chosen so that the ramp spans dimensions 2 to 6 of the toy's 8 frequencies."""
    values: dict[str, object] = {
        "rope_theta": 10000.0,
        "rope_scaling": YarnRopeScaling(factor=4.0, original_max_position_embeddings=4096),
        "max_context": 16384,
    }
    values.update(overrides)
    return tiny_qwen(**values)


def tiny_mistral_nemo(**overrides: object) -> ModelArchitecture:
    """A Mistral NeMo-like toy: head_dim (32) wider than hidden_size / heads (16), no biases, no rope scaling."""
    values: dict[str, object] = {"head_dim": 32, "rope_theta": 1000000.0, "rope_scaling": None}
    values.update(overrides)
    return tiny_llama(**values)


def tiny_qwen3(**overrides: object) -> ModelArchitecture:
    """A Qwen3-like toy: per-head QK-norm, head_dim (32) wider than hidden_size / heads, tied embeddings."""
    values: dict[str, object] = {
        "head_dim": 32,
        "qk_norm": "head",
        "tied_embeddings": True,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
    }
    values.update(overrides)
    return tiny_llama(**values)


def tiny_olmo2(**overrides: object) -> ModelArchitecture:
    """An OLMo 2-like toy: QK-norm over the whole projections, norms after each sublayer, full multi-head attention."""
    values: dict[str, object] = {
        "num_kv_heads": 4,
        "qk_norm": "projection",
        "norm_placement": "post",
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
    }
    values.update(overrides)
    return tiny_llama(**values)


def tiny_granite(**overrides: object) -> ModelArchitecture:
    """A Granite 3.x-like toy: Llama's block with the embedding, attention, residual and logits multipliers, tied."""
    values: dict[str, object] = {
        "tied_embeddings": True,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.05,
        "residual_multiplier": 0.22,
        "logits_scaling": 16.0,
    }
    values.update(overrides)
    return tiny_llama(**values)


def tiny_smollm3(**overrides: object) -> ModelArchitecture:
    """A SmolLM3-like toy: the second of its two blocks attends without RoPE, tied embeddings."""
    values: dict[str, object] = {"no_rope_interval": 2, "tied_embeddings": True, "rope_scaling": None,
                                 "rope_theta": 5000000.0, "rms_norm_eps": 1e-6}
    values.update(overrides)
    return tiny_llama(**values)


def tiny_phi3(**overrides: object) -> ModelArchitecture:
    """A Phi-3/Phi-4-like toy: checkpoints with fused qkv_proj and gate_up_proj, no RoPE scaling."""
    values: dict[str, object] = {"fused_projections": True, "rope_scaling": None, "rope_theta": 250000.0}
    values.update(overrides)
    return tiny_llama(**values)


def tiny_gemma2(**overrides: object) -> ModelArchitecture:
    """A Gemma 2-like toy: four (1 + w) norms per block, GeGLU, embeddings times sqrt(hidden), the first block windowed
    (7 positions) and the second full, attention scores and logits soft-capped, queries scaled by 1/sqrt(24) with
    heads of 16 (Gemma 2 27B's 144 beside 128), tied embeddings."""
    values: dict[str, object] = {
        "norm_placement": "sandwich", "tied_embeddings": True, "rope_scaling": None, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "sliding_window": 7, "full_attention_interval": 2, "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 24,
    }
    values.update(overrides)
    return tiny_llama(**values)


def tiny_gemma3(**overrides: object) -> ModelArchitecture:
    """A Gemma 3-like toy: Gemma 2's block without soft caps, per-head QK-norm (1 + w), heads (24) wider than
    hidden / heads, the windowed block rotating with its own RoPE base (10,000 beside 1,000,000), one KV head."""
    values: dict[str, object] = {
        "qk_norm": "head", "head_dim": 24, "num_kv_heads": 1, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "query_pre_attn_scalar": None, "rope_theta": 1000000.0,
        "local_rope_theta": 10000.0,
    }
    values.update(overrides)
    return tiny_gemma2(**values)


def tiny_spec(**knob_values: Any) -> JobHyperparameters:
    """A whole job on :func:`tiny_llama`: 32-token windows, warmup 2, clipping at 1.0, a checkpoint every 3 steps.

    Keyword arguments override knobs; ``job={...}`` overrides job settings.
    """
    job = knob_values.pop("job", {})
    knobs = TrainingKnobs(**{"micro_batch_size": 2, "seq_len": 32, "compile": False, "fused_loss": False,
                             **knob_values})
    intent = TrainingIntent(seq_len=knobs.seq_len, global_batch_tokens=4096, learning_rate=3e-3, warmup_steps=2,
                            weight_decay=0.1, max_grad_norm=1.0)
    settings = JobSettings(**{"profile": "tiny", "seed": 11, "checkpoint_interval_steps": 3,
                              "keep_last_checkpoints": 2, "log_interval_steps": 1, **job})
    return JobHyperparameters(knobs=knobs, architecture=tiny_llama(), training=intent, job=settings)


def masked(spec: JobHyperparameters) -> JobHyperparameters:
    """``spec`` with ``train.document_masking`` on."""
    return spec.model_copy(update={"training": spec.training.model_copy(update={"document_masking": True})})


def sigterm_after(stop: int) -> Callable[[int], None]:
    """A step hook that sends this process a real SIGTERM right after step ``stop``."""

    def hook(step: int) -> None:
        if step == stop:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def one_rank_env() -> dict[str, str]:
    """The environment torchrun gives a 1-process job, on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
