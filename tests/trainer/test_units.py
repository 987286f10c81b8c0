"""Unit checks of the trainer's pieces that need no process group."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from btk_trainer.layout import mesh_shape
from btk_trainer.model import Decoder
from btk_trainer.parallelize import apply_low_precision, check_precision, selective_policy
from btk_trainer.train import learning_rate, peak_bf16_tflops

from btk.errors import BtkError
from btk.knobs import TrainingKnobs
from btk.profile import ModelArchitecture

ROOT = Path(__file__).resolve().parents[2]


def knobs(**values: object) -> TrainingKnobs:
    return TrainingKnobs.model_validate({"micro_batch_size": 1, "seq_len": 128, **values})


def test_mesh_shapes() -> None:
    assert mesh_shape(16, 2, knobs()) == mesh_shape(16, 2, knobs(sharding="full_shard"))
    full = mesh_shape(16, 2, knobs())
    assert (full.dp_replicate, full.dp_shard, full.tp) == (1, 16, 1)
    hybrid = mesh_shape(32, 4, knobs(sharding="hybrid_shard", tensor_parallel=2))
    assert (hybrid.dp_replicate, hybrid.dp_shard, hybrid.tp, hybrid.dp) == (4, 4, 2, 16)
    plain = mesh_shape(8, 1, knobs(sharding="no_shard"))
    assert (plain.dp_replicate, plain.dp_shard) == (8, 1)
    with pytest.raises(BtkError, match="tensor_parallel=4 must divide the 6 GPUs"):
        mesh_shape(6, 1, knobs(tensor_parallel=4))
    with pytest.raises(BtkError, match="hybrid_shard needs the 9 data-parallel ranks"):
        mesh_shape(9, 2, knobs(sharding="hybrid_shard"))


def test_precision_checks() -> None:
    check_precision("bf16", None)
    check_precision("fp8_rowwise", (9, 0))
    check_precision("mxfp8", (10, 0))
    with pytest.raises(BtkError, match=r"mxfp8 needs a Blackwell GPU .* this GPU is 9.0"):
        check_precision("mxfp8", (9, 0))
    with pytest.raises(BtkError, match=r"needs compute capability >= 8.9.*8.0"):
        check_precision("fp8_tensorwise", (8, 0))
    with pytest.raises(BtkError, match="needs an NVIDIA GPU"):
        check_precision("fp8_tensorwise", None)


@pytest.mark.parametrize("precision", ["fp8_tensorwise", "fp8_rowwise"])
def test_float8_swaps_block_linears_not_the_head(llama_arch: ModelArchitecture, precision: str) -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = Decoder(llama_arch)
    assert apply_low_precision(model, precision, fsdp_float8_all_gather=False) == 7 * llama_arch.num_layers
    swapped = [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]
    assert len(swapped) == 7 * llama_arch.num_layers
    assert "lm_head" not in " ".join(swapped) and type(model.lm_head) is torch.nn.Linear
    assert apply_low_precision(Decoder(llama_arch), "bf16", fsdp_float8_all_gather=False) == 0


def test_selective_policy_recomputes_every_other_matmul() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    class Ctx:
        is_recompute = False

    policy = selective_policy()
    mm = torch.ops.aten.mm.default
    decisions = [policy(Ctx(), mm) for _ in range(4)]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    assert policy(Ctx(), torch.ops.aten.add.Tensor) == CheckpointPolicy.PREFER_RECOMPUTE


def test_learning_rate_schedule() -> None:
    lr = [learning_rate(s, peak=1.0, warmup=10, total=110, min_ratio=0.1) for s in range(1, 111)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert lr[59] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lr[9:]))


def test_no_gpu_means_zero_peak() -> None:
    assert peak_bf16_tflops(torch.device("cpu")) == 0.0


def test_bench_tiny_on_cpu(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "btk_trainer.bench", "--profile", "llama3.2-1b", "--tiny", "--device", "cpu",
         "--gpus", "1", "--precision", "bf16", "--compare", "--warmup", "1", "--steps", "2",
         "--json", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md")],
        capture_output=True, text=True, timeout=240, check=False,
        env={"PYTHONPATH": f"{ROOT / 'containers'}:{ROOT}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    labels = [case["label"] for case in report["cases"]]
    assert labels == ["planned knobs, bf16", "planner's choice", "legacy baseline"]
    for case in report["cases"]:
        if "error" in case:  # the planner may pick fp8 for the toy, which CPU cannot run
            assert "fp8" in case["knobs"]["precision"] and "needs an NVIDIA GPU" in case["error"]
            continue
        assert case["measured"]["tokens_per_second_per_gpu"] > 0
        assert case["predicted"]["tokens_per_second_per_gpu"] > 0
    assert "| llama3.2-1b | legacy baseline |" in (tmp_path / "r.md").read_text()


def test_hadolint_clean() -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint not installed (make setup installs it)")
    completed = subprocess.run([str(hadolint), str(ROOT / "containers" / "Dockerfile")], capture_output=True,
                               text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
