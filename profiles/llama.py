"""Llama-family profiles (Meta Llama 1, 3.1 and 3.2 architectures).

Shapes come from each checkpoint's Hugging Face ``config.json``; the published parameter
counts are those the model cards / safetensors index report.
"""

from __future__ import annotations

from btk.profile import ModelArchitecture, ModelProfile, RopeScaling, TrainingIntent

LLAMA3_VOCAB = 128256
LLAMA31_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _llama3(
    name: str,
    hf_id: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    ffn: int,
    tied: bool,
    rope: RopeScaling,
    global_batch_tokens: int,
    total_tokens: int,
    published: int,
    description: str,
) -> ModelProfile:
    """A Llama 3.x profile: GQA with 8 KV heads, 128k vocabulary and context, RoPE θ 500k."""
    return ModelProfile(
        name=name,
        family="llama",
        description=description,
        architecture=ModelArchitecture(
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=8,
            ffn_hidden_size=ffn,
            vocab_size=LLAMA3_VOCAB,
            tied_embeddings=tied,
            max_context=131072,
            rope_theta=500000.0,
            rope_scaling=rope,
        ),
        training=TrainingIntent(seq_len=8192, global_batch_tokens=global_batch_tokens, total_tokens=total_tokens),
        published_parameter_count=published,
        source=f"huggingface.co/{hf_id} config.json",
        hf_model_id=hf_id,
    )


LLAMA32_1B = _llama3(
    "llama3.2-1b", "meta-llama/Llama-3.2-1B", layers=16, hidden=2048, heads=32, ffn=8192, tied=True,
    rope=LLAMA32_ROPE, global_batch_tokens=2_097_152, total_tokens=100_000_000_000, published=1_235_814_400,
    description="Llama 3.2 1B: small, tied embeddings, large vocabulary",
)
LLAMA32_3B = _llama3(
    "llama3.2-3b", "meta-llama/Llama-3.2-3B", layers=28, hidden=3072, heads=24, ffn=8192, tied=True,
    rope=LLAMA32_ROPE, global_batch_tokens=2_097_152, total_tokens=200_000_000_000, published=3_212_749_824,
    description="Llama 3.2 3B: tied embeddings",
)
LLAMA31_8B = _llama3(
    "llama3.1-8b", "meta-llama/Llama-3.1-8B", layers=32, hidden=4096, heads=32, ffn=14336, tied=False,
    rope=LLAMA31_ROPE, global_batch_tokens=4_194_304, total_tokens=300_000_000_000, published=8_030_261_248,
    description="Llama 3.1 8B",
)

LLAMA_65B = ModelProfile(
    name="llama-65b",
    family="llama",
    description="LLaMA 65B (Touvron et al. 2023): the ~64B dense class, full multi-head attention",
    architecture=ModelArchitecture(
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=64,
        ffn_hidden_size=22016,
        vocab_size=32000,
        tied_embeddings=False,
        max_context=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    ),
    training=TrainingIntent(
        seq_len=2048, global_batch_tokens=4_194_304, total_tokens=1_400_000_000_000, learning_rate=1.5e-4
    ),
    published_parameter_count=65_285_660_672,
    source="LLaMA paper (arXiv 2302.13971) table 2; huggingface.co/huggyllama/llama-65b config.json",
    hf_model_id="huggyllama/llama-65b",
)

PROFILES = (LLAMA32_1B, LLAMA32_3B, LLAMA31_8B, LLAMA_65B)
