"""Shared fixtures for the trainer tests: tiny architectures (btk_trainer is on pytest's pythonpath)."""

from __future__ import annotations

import pytest
from trainer_fixtures import tiny_llama, tiny_qwen

from btk.profile import ModelArchitecture


@pytest.fixture
def llama_arch() -> ModelArchitecture:
    return tiny_llama()


@pytest.fixture
def qwen_arch() -> ModelArchitecture:
    return tiny_qwen()
