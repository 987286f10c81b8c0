"""Unit checks of the trainer's pieces that need no process group."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from btk_trainer.layout import accumulation_for, mesh_shape
from btk_trainer.model import Decoder
from btk_trainer.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    apply_fused_loss,
    apply_low_precision,
    check_precision,
    selective_policy,
)
from btk_trainer.train import learning_rate, peak_bf16_tflops, setup_distributed

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


def test_mxfp8_swaps_only_32_aligned_linears() -> None:
    """MXFP8 scales blocks of 32 elements: a 48-wide FFN stays bf16 under mxfp8, not under fp8."""
    pytest.importorskip("torchao")
    arch = ModelArchitecture(num_layers=1, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                             ffn_hidden_size=48, vocab_size=128, max_context=256)
    assert apply_low_precision(Decoder(arch), "fp8_tensorwise", fsdp_float8_all_gather=False) == 7
    assert apply_low_precision(Decoder(arch), "mxfp8", fsdp_float8_all_gather=False) == 4  # q, k, v, o


def test_selective_policy_recomputes_every_other_matmul() -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    class Ctx:
        is_recompute = False

    policy = selective_policy()
    mm = torch.ops.aten.mm.default
    decisions = [policy(Ctx(), mm) for _ in range(4)]
    assert decisions == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    # float8 linears (_scaled_mm) count alike: fp8 + selective keeps the same share as bf16.
    fp8 = [policy(Ctx(), op) for op in (torch.ops.aten._scaled_mm.default, torch.ops.aten.mm.default) * 2]
    assert fp8 == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE] * 2
    assert policy(Ctx(), torch.ops.aten.add.Tensor) == CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("cuda", "nccl")])
def test_process_group_gets_the_job_timeout(device: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    import torch.distributed as dist

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    setup_distributed(torch.device(device, 0) if device == "cuda" else torch.device(device), 45)
    (call,) = calls
    assert call["backend"] == backend and call["timeout"] == datetime.timedelta(minutes=45)


def test_learning_rate_schedule() -> None:
    lr = [learning_rate(s, peak=1.0, warmup=10, total=110, min_ratio=0.1) for s in range(1, 111)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert lr[59] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lr[9:]))


def test_no_gpu_means_zero_peak() -> None:
    assert peak_bf16_tflops(torch.device("cpu")) == 0.0


@pytest.mark.parametrize(
    ("device_name", "peak"),
    [
        ("NVIDIA B200", 2250.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", 0.0),  # not in the catalog: MFU 0, not a wrong figure
    ],
)
def test_peak_is_found_by_the_cuda_device_name(
    device_name: str, peak: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    assert peak_bf16_tflops(torch.device("cuda", 0)) == peak


@pytest.mark.parametrize(
    ("planned", "actual", "steps", "global_batch"),
    [
        (None, 16, 16, 512),  # no plan recorded: the knobs as given
        (32, 32, 16, 1024),  # the planned size
        (32, 16, 32, 1024),  # half the nodes: twice the accumulation, same global batch
        (32, 64, 8, 1024),  # twice the nodes: half
        (32, 1024, 1, 2048),  # more ranks than the batch needs: one micro-batch each, the batch grows
        (32, 24, 22, 1056),  # 1024 over 48 per micro-step does not divide: rounded up, never smaller
    ],
)
def test_accumulation_keeps_the_planned_global_batch(
    planned: int | None, actual: int, steps: int, global_batch: int
) -> None:
    result = accumulation_for(knobs(micro_batch_size=2, gradient_accumulation_steps=16), planned, actual)
    assert (result.steps, result.global_batch) == (steps, global_batch)
    assert result.rescaled == (steps != 16)
    assert result.planned_global_batch == (None if planned is None else 2 * 16 * planned)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor on CPU needs a C++ compiler")
def test_inductor_compiles_selective_ac_blocks_and_fused_loss() -> None:
    """The GPU's compile path through Inductor (C++ here, Triton there): same loss and gradients as eager.

    Inductor's min-cut partitioner honours the selective-AC policy's save/recompute tags; the
    aot_eager checks in the gloo tests do not reach it.
    """
    from trainer_fixtures import tiny_llama

    eager, compiled = Decoder(tiny_llama()), Decoder(tiny_llama())
    eager.init_weights(seed=1)
    compiled.load_state_dict(eager.state_dict())
    apply_activation_checkpointing(compiled, "selective")
    apply_compile(compiled)
    apply_fused_loss(compiled)
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    try:
        compiled_loss = compiled(tokens, tokens)
        compiled_loss.backward()
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs >= 2  # a block (shared by both) and the loss really went through the compiler
    eager_loss = eager(tokens, tokens)
    eager_loss.backward()
    assert abs(compiled_loss.item() - eager_loss.item()) <= 1e-6
    reference = {name: parameter.grad for name, parameter in eager.named_parameters()}
    for name, parameter in compiled.named_parameters():
        plain = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        assert parameter.grad is not None and torch.allclose(parameter.grad, reference[plain], atol=1e-6), name


def test_bench_script_runs_on_cpu(tmp_path: Path) -> None:
    """The exact script the H200 run uses, with the toy architecture on CPU: every case lands in the files."""
    out = tmp_path / "out"
    completed = subprocess.run(
        ["bash", str(ROOT / "containers" / "bench" / "run_h200.sh"), "--tiny", "--device", "cpu",
         "--warmup", "1", "--steps", "2"],
        capture_output=True, text=True, timeout=240, check=False,
        env={"OUT": str(out), "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable,
             "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"},
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "bench exit status: 0" in completed.stdout
    assert f"torch {torch.__version__}" in (out / "env.txt").read_text()
    report = json.loads((out / "results.json").read_text())
    assert report["instance"] == "ml.p5en.48xlarge (1 GPU)" and report["steps"] == 2
    cases = [(case["profile"], case["label"]) for case in report["cases"]]
    expected = ["planned knobs, bf16", "planned knobs, fp8_tensorwise", "planner's choice", "legacy baseline"]
    assert cases == [(profile, label) for profile in ("llama3.2-3b", "llama3.2-1b") for label in expected]
    for case in report["cases"]:
        assert case["predicted"]["tokens_per_second_per_gpu"] > 0
        if case["knobs"]["precision"] != "bf16":  # fp8 cannot run on CPU: the case says why, the rest still run
            assert "needs an NVIDIA GPU" in case["error"] and "measured" not in case
            continue
        assert case["measured"]["tokens_per_second_per_gpu"] > 0
    assert [c["profile"] for c in report["comparisons"]] == ["llama3.2-3b", "llama3.2-1b"]
    assert all(c["measured_ratio"] > 0 and c["predicted_ratio"] > 0 for c in report["comparisons"])
    table = (out / "performance.md").read_text()
    assert "| llama3.2-1b | legacy baseline |" in table and "planned / baseline measured" in table
    assert (out / "bench.log").read_text().count("btk_metric step=") >= 3 * 3  # metric lines reach the log


def test_bench_predict_only_trains_nothing(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "btk_trainer.bench", "--profile", "llama3.2-3b", "--gpus", "1", "--device", "cpu",
         "--precision", "bf16", "--compare", "--predict-only", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": f"{ROOT / 'containers'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert all("measured" not in case and case["note"] == "prediction only" for case in report["cases"])
    assert report["cases"][0]["knobs"]["seq_len"] == 8192  # the real profile, not the toy
    assert all(case["predicted"]["fits"] for case in report["cases"])
    (comparison,) = report["comparisons"]
    assert "measured_ratio" not in comparison and comparison["predicted_ratio"] > 1.0
    assert "btk_metric" not in completed.stdout


def test_hadolint_clean() -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint not installed (make setup installs it)")
    completed = subprocess.run([str(hadolint), str(ROOT / "containers" / "Dockerfile")], capture_output=True,
                               text=True, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
