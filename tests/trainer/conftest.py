"""Shared fixtures for the trainer tests: import btk_trainer from containers/, tiny architectures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CONTAINERS = Path(__file__).resolve().parents[2] / "containers"
if str(CONTAINERS) not in sys.path:
    sys.path.insert(0, str(CONTAINERS))

from trainer_fixtures import tiny_llama, tiny_qwen  # noqa: E402

from btk.profile import ModelArchitecture  # noqa: E402


@pytest.fixture
def llama_arch() -> ModelArchitecture:
    return tiny_llama()


@pytest.fixture
def qwen_arch() -> ModelArchitecture:
    return tiny_qwen()
