"""Shared fixtures for the trainer tests: tiny architectures, a small dataset (btk_trainer on the pythonpath)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from trainer_fixtures import one_rank_env, tiny_llama, tiny_qwen

from btk.profile import ModelArchitecture


@pytest.fixture
def llama_arch() -> ModelArchitecture:
    return tiny_llama()


@pytest.fixture
def qwen_arch() -> ModelArchitecture:
    return tiny_qwen()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few thousand tokens of learnable word rotations in shards of 4000 tokens (vocab within tiny_llama's)."""
    from btk_trainer.tokenize import tokenize_to_shards
    from test_data import WORDS, make_tokenizer, write_jsonl

    root = tmp_path_factory.mktemp("data")
    docs = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 40  # learnable rotations
    tokenize_to_shards([write_jsonl(root / "a.jsonl", docs)], make_tokenizer(root / "tok.json"), root / "ds",
                       shard_tokens=4000)
    return root / "ds"


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment torchrun gives a 1-process job; the process group is torn down afterwards."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", raising=False)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
