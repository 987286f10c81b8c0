"""Every precision x {Llama (no bias), Qwen (q/k/v bias, tied)}: train, save, resume in a fresh process, export.

Two process groups of 2 CPU ranks (tests/trainer/dist_worker.py): the first trains each case
uninterrupted (exported to Hugging Face safetensors) and once stopped by SIGTERM at step 2
(checkpointed); the second, a fresh process, resumes each checkpoint to the end. On CPU the
fp8 matmuls run in torch's ``_scaled_mm`` emulation and MXFP8 in torchao's emulation, so these
prove the wiring (bias, gradients, DCP save/load, export), not the GPU kernels.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer.model import Decoder, load_safetensors
from test_distributed import run_scenario
from trainer_fixtures import tiny_llama, tiny_qwen

pytestmark = pytest.mark.slow
CASES = [f"{precision}-{arch}" for precision in ("bf16", "fp8_tensorwise", "fp8_rowwise", "mxfp8")
         for arch in ("llama", "qwen")]


@pytest.fixture(scope="module")
def precisions(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("precisions")
    saved = run_scenario("precisions_save", workdir, dataset)
    resumed = run_scenario("precisions_resume", workdir, dataset)
    return workdir, saved, resumed


@pytest.mark.parametrize("case", CASES)
def test_trains_and_checkpoints(precisions: tuple[Path, dict[str, Any], dict[str, Any]], case: str) -> None:
    """Forward, backward and optimizer steps give finite, falling losses; SIGTERM at step 2 saves step 2."""
    _, saved, _ = precisions
    losses = saved[case]["straight_losses"]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert saved[case]["stopped_at"] == saved[case]["saved"] == 2


@pytest.mark.parametrize("case", CASES)
def test_resume_in_a_fresh_process_equals_the_uninterrupted_run(
    precisions: tuple[Path, dict[str, Any], dict[str, Any]], case: str
) -> None:
    _, saved, resumed = precisions
    result = resumed[case]
    assert result["resumed_from"] == 2 and result["steps"] == 4
    assert result["bit_identical"], case
    assert [result["losses"][str(step)] for step in (3, 4)] == saved[case]["straight_losses"][2:]


def _hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    config = json.loads((directory / "config.json").read_text())
    cls = transformers.Qwen2ForCausalLM if config["model_type"] == "qwen2" else transformers.LlamaForCausalLM
    model = cls.from_pretrained(str(directory), torch_dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=tokens).logits
    return logits


@pytest.mark.parametrize("case", CASES)
def test_export_loads_in_transformers(precisions: tuple[Path, dict[str, Any], dict[str, Any]], case: str) -> None:
    """The exported weights are the trained ones (bf16), transformers loads them, logits match ours."""
    from safetensors.torch import load_file

    workdir, _, _ = precisions
    exported = workdir / f"straight_{case}"
    trained = torch.load(workdir / f"straight_{case}.pt")
    tensors = load_file(str(exported / "model.safetensors"))
    arch = tiny_qwen() if case.endswith("qwen") else tiny_llama()
    assert set(tensors) == set(trained) - ({"lm_head.weight"} if arch.tied_embeddings else set())
    assert all(torch.equal(tensors[name], trained[name].to(torch.bfloat16)) for name in tensors)
    resumed = load_file(str(workdir / f"resumed_{case}" / "model.safetensors"))
    assert all(torch.equal(resumed[name], tensors[name]) for name in tensors)

    ours = Decoder(arch)
    load_safetensors(ours, exported)
    tokens = torch.randint(0, arch.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        actual = ours.logits(tokens)
    torch.testing.assert_close(actual, _hf_logits(exported, tokens), atol=1e-5, rtol=1e-5)
