"""Qwen2.5-family profiles (QKV bias, grouped-query attention, 152k vocabulary).

Shapes come from each checkpoint's Hugging Face ``config.json``; the published parameter
counts are those the safetensors indexes report.
"""

from __future__ import annotations

from btk.profile import ModelArchitecture, ModelProfile, TrainingIntent

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

PROFILES = (QWEN25_7B, QWEN25_14B, QWEN25_32B)
