"""Fixture profiles and environments for the tests of machinery (planner, CLI, report, capacity).

``profiles/`` and ``environments.py`` belong to the user, so a test of the toolkit's
behaviour must not depend on what they hold. The profiles here copy the shapes of published
checkpoints (Llama 3.2 1B and 3B, Llama 3.1 8B, LLaMA 65B, Qwen2.5 14B and 32B), so the
numbers the tests pin are those of real architectures; the environments mirror a
dev / staging / prod ladder. :func:`install` points :mod:`btk.catalog` at them for code that
looks names up; tests that take a profile directly use :data:`PROFILES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from btk import catalog
from btk.environment import DataStageConfig, EnvironmentConfig
from btk.profile import ModelArchitecture, ModelProfile, RopeScaling, TrainingIntent, YarnRopeScaling

_LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _llama3(
    name: str, *, layers: int, hidden: int, heads: int, ffn: int, tied: bool, rope: RopeScaling,
    global_batch_tokens: int, total_tokens: int,
) -> ModelProfile:  # fmt: skip
    return ModelProfile(
        name=name,
        family="llama",
        architecture=ModelArchitecture(
            num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=8, ffn_hidden_size=ffn,
            vocab_size=128256, tied_embeddings=tied, max_context=131072, rope_theta=500000.0, rope_scaling=rope,
        ),
        training=TrainingIntent(seq_len=8192, global_batch_tokens=global_batch_tokens, total_tokens=total_tokens),
    )


def _qwen25(name: str, *, layers: int, heads: int, ffn: int) -> ModelProfile:
    return ModelProfile(
        name=name,
        family="qwen",
        architecture=ModelArchitecture(
            num_layers=layers, hidden_size=5120, num_attention_heads=heads, num_kv_heads=8, ffn_hidden_size=ffn,
            vocab_size=152064, max_context=32768, attention_bias=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
        training=TrainingIntent(seq_len=8192, global_batch_tokens=4_194_304, total_tokens=300_000_000_000),
    )


LLAMA_1B = _llama3(
    "llama3.2-1b", layers=16, hidden=2048, heads=32, ffn=8192, tied=True, rope=_LLAMA32_ROPE,
    global_batch_tokens=2_097_152, total_tokens=100_000_000_000,
)  # fmt: skip
LLAMA_3B = _llama3(
    "llama3.2-3b", layers=28, hidden=3072, heads=24, ffn=8192, tied=True, rope=_LLAMA32_ROPE,
    global_batch_tokens=2_097_152, total_tokens=200_000_000_000,
)  # fmt: skip
LLAMA_8B = _llama3(
    "llama3.1-8b", layers=32, hidden=4096, heads=32, ffn=14336, tied=False, rope=_LLAMA31_ROPE,
    global_batch_tokens=4_194_304, total_tokens=300_000_000_000,
)  # fmt: skip
LLAMA_65B = ModelProfile(
    name="llama-65b",
    family="llama",
    architecture=ModelArchitecture(
        num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=64, ffn_hidden_size=22016,
        vocab_size=32000, max_context=2048, rope_theta=10000.0,
    ),
    training=TrainingIntent(
        seq_len=2048, global_batch_tokens=4_194_304, total_tokens=1_400_000_000_000, learning_rate=1.5e-4
    ),
)
QWEN_14B = _qwen25("qwen2.5-14b", layers=48, heads=40, ffn=13824)
QWEN_32B = _qwen25("qwen2.5-32b", layers=64, heads=40, ffn=27648)

QWEN_32B_YARN = QWEN_32B.model_copy(update={
    "name": "qwen2.5-32b-128k",
    "architecture": QWEN_32B.architecture.model_copy(update={
        "max_context": 131072, "rope_scaling": YarnRopeScaling(factor=4.0, original_max_position_embeddings=32768)}),
    "training": TrainingIntent(seq_len=131072, global_batch_tokens=4_194_304, total_tokens=20_000_000_000),
})
"""Qwen2.5 32B with YaRN to 131,072 tokens, as its model card sets it (not in :data:`PROFILES`, which the tests
of the catalog's listings read)."""

PROFILES: dict[str, ModelProfile] = {
    profile.name: profile for profile in (LLAMA_1B, LLAMA_3B, LLAMA_8B, LLAMA_65B, QWEN_14B, QWEN_32B)
}

DEV = EnvironmentConfig(
    name="dev",
    availability_zone="us-east-1a",
    profiles=(LLAMA_1B.name, LLAMA_3B.name),
    data_stage=DataStageConfig(mode="s3", checkpoint_expiration_days=14),
    managed_spot=False,
    retain_data=False,
    log_retention_days=14,
)
STAGING = EnvironmentConfig(
    name="staging",
    availability_zone="us-east-1a",
    profiles=(LLAMA_1B.name, LLAMA_3B.name, LLAMA_8B.name),
    data_stage=DataStageConfig(mode="fsx", fsx_storage_capacity_gib=1200, fsx_throughput_per_tib=250),
    retain_data=False,
    log_retention_days=30,
    vpc_cidr="10.81.0.0/16",
)
PROD = EnvironmentConfig(
    name="prod",
    availability_zone="us-east-1a",
    profiles=(LLAMA_8B.name, QWEN_14B.name, QWEN_32B.name),
    instance_count=2,
    data_stage=DataStageConfig(mode="fsx", fsx_storage_capacity_gib=4800, fsx_throughput_per_tib=500),
    retain_data=True,
    log_retention_days=365,
    vpc_cidr="10.82.0.0/16",
)

ENVIRONMENTS: dict[str, EnvironmentConfig] = {env.name: env for env in (DEV, STAGING, PROD)}


def install(monkeypatch: pytest.MonkeyPatch, *extra: EnvironmentConfig) -> None:
    """Point :mod:`btk.catalog` at :data:`PROFILES` and :data:`ENVIRONMENTS` (plus ``extra``)."""
    environments = {**ENVIRONMENTS, **{env.name: env for env in extra}}
    monkeypatch.setattr(catalog, "all_profiles", lambda: dict(PROFILES))
    monkeypatch.setattr(catalog, "all_environments", lambda: dict(environments))


@contextmanager
def installed(*extra: EnvironmentConfig) -> Iterator[None]:
    """:func:`install` for a module-scoped fixture, which outlives one test's ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        install(monkeypatch, *extra)
        yield
