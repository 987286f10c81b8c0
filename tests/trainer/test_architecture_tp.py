"""Tensor parallelism (TP=2, sequence parallel, loss-parallel head) on the newer block layouts, CPU gloo.

Mistral NeMo's heads wider than hidden / heads, Qwen3's per-head QK-norm, OLMo 2's
whole-projection QK-norm with post-sublayer norms, Granite's multipliers (on the sequence-sharded
embedding output, the residual adds and the loss-parallel head's input) and SmolLM3's block without
RoPE, Gemma 2's sandwich norms with soft-capped attention and logits (the vocabulary-parallel loss caps each
rank's shard) and Gemma 3's per-head QK-norm beside windowed blocks: the loss and every gradient equal the plain
model's on the same batch, eager and compiled (aot_eager), under every checkpointing mode
(tests/trainer/architecture_tp_worker.py). Tolerance: fp32, 1e-6 (TP only reorders sums); the
QK-norm weights' gradients are about 2e-3, so a norm left unsharded misses by far more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("architecture_tp_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("architecture_tp")
    completed = subprocess.run([sys.executable, str(WORKER), str(workdir)], capture_output=True, text=True,
                               timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    loaded: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    return loaded


@pytest.mark.parametrize("architecture", ["mistral-nemo", "qwen3", "olmo2", "granite", "smollm3", "gemma2", "gemma3"])
@pytest.mark.parametrize("mode", ["none/eager", "selective/eager", "full/eager", "selective/aot_eager"])
def test_tensor_parallel_matches_the_plain_model(results: dict[str, Any], architecture: str, mode: str) -> None:
    case = results[f"{architecture}/{mode}"]
    assert case["names_match"]
    assert case["loss_diff"] <= 1e-6
    assert case["max_abs_diff"] <= 1e-6


def test_per_head_norms_outside_the_plan_would_be_caught(results: dict[str, Any]) -> None:
    """Left out of the plan, Qwen3's per-head norms still run, but each rank's copy of a weight gets only its
    heads' gradient: off by far more than the tolerance. (OLMo 2's whole-projection norms cannot even run on
    a rank's slice of the projection.)"""
    assert results["qwen3/none/eager"]["qk_norm_grad"] > 1e-3
    assert results["qwen3/without_qk_norm_plan"]["max_abs_diff"] > 1e-4
