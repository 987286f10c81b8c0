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

LLAMA32_1B = ModelProfile(
    name="llama3.2-1b",
    family="llama",
    description="Llama 3.2 1B: small, tied embeddings, large vocabulary",
    architecture=ModelArchitecture(
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=8192,
        vocab_size=LLAMA3_VOCAB,
        tied_embeddings=True,
        max_context=131072,
        rope_theta=500000.0,
        rope_scaling=LLAMA32_ROPE,
    ),
    training=TrainingIntent(seq_len=8192, global_batch_tokens=2_097_152, total_tokens=100_000_000_000),
    published_parameter_count=1_235_814_400,
    source="huggingface.co/meta-llama/Llama-3.2-1B config.json",
    hf_model_id="meta-llama/Llama-3.2-1B",
)

LLAMA32_3B = ModelProfile(
    name="llama3.2-3b",
    family="llama",
    description="Llama 3.2 3B: tied embeddings",
    architecture=ModelArchitecture(
        num_layers=28,
        hidden_size=3072,
        num_attention_heads=24,
        num_kv_heads=8,
        ffn_hidden_size=8192,
        vocab_size=LLAMA3_VOCAB,
        tied_embeddings=True,
        max_context=131072,
        rope_theta=500000.0,
        rope_scaling=LLAMA32_ROPE,
    ),
    training=TrainingIntent(seq_len=8192, global_batch_tokens=2_097_152, total_tokens=200_000_000_000),
    published_parameter_count=3_212_749_824,
    source="huggingface.co/meta-llama/Llama-3.2-3B config.json",
    hf_model_id="meta-llama/Llama-3.2-3B",
)

LLAMA31_8B = ModelProfile(
    name="llama3.1-8b",
    family="llama",
    description="Llama 3.1 8B",
    architecture=ModelArchitecture(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
        vocab_size=LLAMA3_VOCAB,
        tied_embeddings=False,
        max_context=131072,
        rope_theta=500000.0,
        rope_scaling=LLAMA31_ROPE,
    ),
    training=TrainingIntent(seq_len=8192, global_batch_tokens=4_194_304, total_tokens=300_000_000_000),
    published_parameter_count=8_030_261_248,
    source="huggingface.co/meta-llama/Llama-3.1-8B config.json",
    hf_model_id="meta-llama/Llama-3.1-8B",
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
