"""Qwen2.5-family profiles (QKV bias, grouped-query attention, 152k vocabulary).

Shapes come from each checkpoint's Hugging Face ``config.json``; the published parameter
counts are those the safetensors indexes report.
"""

from __future__ import annotations

from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent, YarnRopeScaling

QWEN25_VOCAB = 152064


def _qwen25(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    published: int,
    total_tokens: int,
    hf_id: str,
) -> ModelProfile:
    return ModelProfile(
        name=name,
        family="qwen",
        description=f"Qwen2.5 {name.split('-')[-1].upper()}",
        architecture=ModelArchitecture(
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            ffn_hidden_size=ffn,
            vocab_size=QWEN25_VOCAB,
            tied_embeddings=False,
            max_context=32768,
            attention_bias=True,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
        ),
        training=TrainingIntent(seq_len=8192, global_batch_tokens=4_194_304, total_tokens=total_tokens),
        published_parameter_count=published,
        source=f"huggingface.co/{hf_id} config.json",
        hf_model_id=hf_id,
    )


QWEN25_7B = _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944, 7_615_616_512, 300_000_000_000, "Qwen/Qwen2.5-7B")
QWEN25_14B = _qwen25("qwen2.5-14b", 48, 5120, 40, 8, 13824, 14_770_033_664, 300_000_000_000, "Qwen/Qwen2.5-14B")
QWEN25_32B = _qwen25("qwen2.5-32b", 64, 5120, 40, 8, 27648, 32_763_876_352, 300_000_000_000, "Qwen/Qwen2.5-32B")

# Qwen2.5 32B at 131,072 tokens: the model card's "Processing Long Texts" adds YaRN with factor 4 over the
# 32,768-token context. A separate profile because YaRN changes every position's rotation (the card advises it
# only where long texts are needed); the training intent is a long-context extension stage to edit.
QWEN25_32B_128K = QWEN25_32B.model_copy(update={
    "name": "qwen2.5-32b-128k",
    "description": "Qwen2.5 32B with YaRN to 131,072 tokens",
    "architecture": QWEN25_32B.architecture.model_copy(update={
        "max_context": 131072,
        "rope_scaling": YarnRopeScaling(factor=4.0, original_max_position_embeddings=32768),
    }),
    "training": TrainingIntent(seq_len=131072, global_batch_tokens=4_194_304, total_tokens=20_000_000_000),
})

PROFILES = (QWEN25_7B, QWEN25_14B, QWEN25_32B, QWEN25_32B_128K)
