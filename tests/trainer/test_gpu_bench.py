"""The GPU benchmark's pieces that run anywhere: its locks, its refusals, the pre-check and torchtitan's side.

The whole script (``make gpu-bench-readiness``: both environments built from the locks, up to the first CUDA
call) is a stage of ``make test`` of its own, beside the tests; these check its parts and its bad input.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import fixture_catalog as fc
import pytest
import torch
from btk_trainer import gpu_precheck, titan_baseline
from btk_trainer.gpu_precheck import Check, checks_for, reference, run_check
from btk_trainer.titan_baseline import (
    FLAVORS,
    TitanStep,
    flavor_for,
    not_comparable,
    parse_steps,
    run_environment,
    timed_figures,
    titan_argv,
)
from test_image_pins import _lock_hashes, lock_pins
from trainer_fixtures import tiny_gemma2, tiny_llama

from btk.errors import BtkError
from btk.profile import ModelArchitecture
from btk.training_environment import TRAINING_PROCESS_ENVIRONMENT, export_lines
from training_constructs.pipeline_definition import job_environment

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_bench.sh"
IMAGE_LOCK = ROOT / "containers" / "requirements.lock"
TITAN_LOCK = ROOT / "containers" / "bench" / "torchtitan.lock"
TORCH_STACK = re.compile(r"^(torch|torchao|triton|nvidia-[a-z0-9-]+|cuda-[a-z-]+)$")


def test_torchtitans_environment_runs_on_the_images_torch_stack() -> None:
    """torch, torchao, triton and every CUDA wheel at the image's versions; torchtitan pinned; all hashed."""
    image, titan = lock_pins(IMAGE_LOCK.read_text()), lock_pins(TITAN_LOCK.read_text())
    stack = {name: version for name, version in image.items() if TORCH_STACK.match(name)}
    assert len(stack) > 10 and {"torch", "torchao", "triton", "nvidia-nccl-cu13"} <= set(stack)
    assert {name: titan.get(name) for name in stack} == stack
    image_hashes, titan_hashes = _lock_hashes(IMAGE_LOCK.read_text()), _lock_hashes(TITAN_LOCK.read_text())
    assert all(titan_hashes[name] == image_hashes[name] for name in stack)  # the same wheels, every platform
    assert titan["torchtitan"] == "0.3.0"
    entries = re.split(r"\n(?=[a-z0-9])", TITAN_LOCK.read_text().split("\n", 2)[2])
    assert all("--hash=sha256:" in entry for entry in entries if "==" in entry)


def _script(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"),
           "GPU_BENCH_VENV": str(tmp_path / "venv"), "GPU_BENCH_TITAN_VENV": str(tmp_path / "titan"), **variables}
    return subprocess.run(["bash", str(SCRIPT), "--until-cuda"], capture_output=True, text=True, timeout=600,
                          check=False, env=env)


def test_a_python_other_than_the_images_is_refused_in_one_line(tmp_path: Path) -> None:
    completed = _script(tmp_path, PYTHON=sys.executable if sys.version_info[:2] != (3, 12) else "/bin/false")
    assert completed.returncode == 2
    [line] = completed.stderr.strip().splitlines()
    assert line.startswith("btk-gpu-bench: the locks are for Python 3.12 (the image's)") and "set PYTHON" in line
    assert not (tmp_path / "venv").exists()


def test_a_pin_missing_from_the_index_stops_before_anything_is_installed(tmp_path: Path) -> None:
    """The index is asked for every pin first (metadata only): a missing one is one line naming it, exit 3."""
    lock = tmp_path / "requirements.lock"
    lock.write_text(re.sub(r"^torchao==\S+ \\$", "torchao==0.18.99 \\\\", IMAGE_LOCK.read_text(), flags=re.M))
    completed = _script(tmp_path, GPU_BENCH_LOCK=str(lock))  # the script finds a Python 3.12 itself
    if completed.returncode == 2 and "set PYTHON" in completed.stderr:
        pytest.skip("no Python 3.12 here")
    assert completed.returncode == 3, completed.stdout + completed.stderr
    [line] = [line for line in completed.stderr.splitlines() if line.startswith("btk-gpu-bench:")]
    assert line == f"btk-gpu-bench: the index (https://pypi.org/simple) lacks torchao==0.18.99, a pin of {lock}"
    assert not list((tmp_path / "venv" / "lib").glob("python3.12/site-packages/torch"))


def test_the_benchmark_exports_what_every_training_job_runs_with() -> None:
    """One source for the pipeline and the benchmark; the shell reads back exactly the values."""
    assert all(job_environment("ml.p6-b200.48xlarge")[name] == value
               for name, value in TRAINING_PROCESS_ENVIRONMENT.items())
    assert TRAINING_PROCESS_ENVIRONMENT["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert TRAINING_PROCESS_ENVIRONMENT["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"
    names = " ".join(TRAINING_PROCESS_ENVIRONMENT)
    printed = subprocess.run(["bash", "-c", f'eval "$1"; for n in {names}; do printf "%s=%s\\n" "$n" "${{!n}}"; done',
                              "-", export_lines(TRAINING_PROCESS_ENVIRONMENT)],
                             capture_output=True, text=True, check=True).stdout
    assert dict(line.split("=", 1) for line in printed.splitlines()) == TRAINING_PROCESS_ENVIRONMENT


# The pre-check: its comparison, run on the CPU in place of the GPU (the same code below the device).


@pytest.fixture(autouse=True)
def math_attention_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU standing in for the GPU attends through SDPA's math kernel: torch's CPU flash kernel in bf16 fails
    when ATEN_CPU_CAPABILITY=avx2 is forced on an AVX-512 host ("pack_vnni2 is only supported when avx512 is
    supported"), and which CPU kernel runs is not what these tests are about."""
    import btk_trainer.model as model
    from torch.nn.attention import SDPBackend

    monkeypatch.setattr(model, "attention_backends",
                        lambda device_type: [SDPBackend.MATH])


@pytest.mark.parametrize("precision", ["bf16", "fp8_tensorwise", "fp8_rowwise", "mxfp8"])
def test_each_path_passes_where_the_kernels_are_right(precision: str) -> None:
    for check in checks_for([precision]):
        result = run_check(check, reference(check), (10, 0), device="cpu")
        assert result.status == "passed", result


def test_attention_that_ignores_the_documents_fails_naming_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken mask on the device side (here: the documents dropped) is caught by the gradients' direction."""
    check = Check("document mask", "bf16", True)
    expected = reference(check)
    real = gpu_precheck.loss_and_gradients
    monkeypatch.setattr(gpu_precheck, "loss_and_gradients",
                        lambda model, batch, documents, device: real(model, batch, False, device))
    result = run_check(check, expected, (10, 0), device="cpu")
    assert result.status == "failed" and result.name == "document mask" and "gradient cosine" in result.detail


def test_a_kernel_error_is_one_line_and_a_precision_the_gpu_lacks_is_not_applicable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nsecond line")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", broken)
    check = Check("attention", "bf16", False)
    result = run_check(check, (6.0, torch.ones(3)), (9, 0), device="cpu")
    assert result.status == "failed" and result.detail == "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling " \
                                                          "cublasLtMatmul"
    assert run_check(Check("mxfp8", "mxfp8", True), (6.0, torch.ones(3)), (9, 0)).status == "not applicable"


def test_the_precheck_without_a_gpu_stops_before_its_first_cuda_call(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_precheck.main(["--precision", "fp8_rowwise", "--json", str(tmp_path / "p.json")]) == 1
    assert gpu_precheck.main(["--precision", "fp8_rowwise", "--until-cuda"]) == 0
    [line, _] = capsys.readouterr().out.splitlines()
    assert "stopping before the first CUDA call; 3 paths ready (attention, document mask, fp8_rowwise)" in line
    assert gpu_precheck.main(["--precision", "fp16"]) == 2
    assert capsys.readouterr().err.startswith("btk-gpu-precheck: --precision fp16: one of bf16")


# torchtitan's side: which cases it can train the same way, its arguments, its log.


def test_torchtitans_flavors_are_the_published_llama_3_models() -> None:
    """Each flavor's parameter count is the published one (Meta's model cards), so a profile of that shape is
    the same model; another family's layout on the same widths is not a flavor."""
    published = {"1B": 1_235_814_400, "3B": 3_212_749_824, "8B": 8_030_261_248, "70B": 70_553_706_496}
    for name, widths in FLAVORS.items():
        arch = ModelArchitecture(**widths, max_context=131072)
        assert arch.parameter_count == published[name]
        assert flavor_for(arch) == name
        assert flavor_for(arch.model_copy(update={"qk_norm": "per_head"})) is None
    assert flavor_for(fc.LLAMA_8B.architecture) == "8B"
    assert flavor_for(tiny_llama()) is None and flavor_for(tiny_gemma2()) is None


def _case(**knobs: Any) -> dict[str, Any]:
    base = {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "seq_len": 8192, "precision": "bf16",
            "activation_checkpointing": "selective", "tensor_parallel": 1, "compile": True, "context_parallel": 1}
    return {"number": 1, "profile": "p", "label": "l", "status": "measured", "knobs": {**base, **knobs}}


@pytest.mark.parametrize(("knobs", "why"), [
    ({"precision": "fp8_tensorwise"}, "no fp8_tensorwise recipe"),
    ({"precision": "mxfp8"}, "no mxfp8 recipe"),
    ({"tensor_parallel": 2}, "tensor or context parallelism"),
    ({"gradient_accumulation_steps": 2}, "gradient accumulation"),
])
def test_cases_torchtitan_cannot_train_alike_say_why(knobs: dict[str, Any], why: str) -> None:
    arch = fc.LLAMA_8B.architecture
    assert not_comparable(_case(), arch) is None and not_comparable(_case(precision="fp8_rowwise"), arch) is None
    assert why in (not_comparable(_case(**knobs), arch) or "")
    assert "no Llama 3 flavor" in (not_comparable(_case(), tiny_llama()) or "")
    pending = {**_case(), "status": "pending"}
    assert not_comparable(pending, arch) == "the trainer did not measure it"
    assert not_comparable(pending, arch, planned=True) is None


def test_torchtitans_arguments_carry_the_cases_knobs(tmp_path: Path) -> None:
    argv = titan_argv(_case(compile=False, activation_checkpointing="full")["knobs"],
                      (tmp_path / "tok", tmp_path / "data"), 12, tmp_path / "dump")
    flags = dict(zip(argv[::2], argv[1::2], strict=False))
    assert flags["--training.seq_len"] == "8192" and flags["--training.local_batch_size"] == "2"
    assert flags["--training.steps"] == "12" and flags["--config"] == "btk_case"
    assert "--compile.no-enable" in argv and argv[-1] == "activation-checkpoint:full"


def test_torchtitans_dataset_cache_is_its_work_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hugging Face datasets' Arrow copy of the generated documents goes under the work folder, whatever the
    user's environment says, and nothing is fetched."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "users-own"))
    environment = run_environment(_case(), "3B", tmp_path / "work")
    assert environment["HF_DATASETS_CACHE"] == str(tmp_path / "work" / "hf-datasets-cache")
    assert environment["HF_DATASETS_OFFLINE"] == environment["HF_HUB_OFFLINE"] == "1"


#: torchtitan 0.3.0's step line (torchtitan/components/metrics.py's format, colours off), as it prints it.
TITAN_LOG = """\
[titan] 2026-12-05 12:00:01,000 - root - INFO - step:  1  loss: 12.04210  grad_norm:  3.1000  memory: 61.20GiB(43.80%)  tps: 1,020  tflops: 62.10  mfu: 6.28%
[titan] 2026-12-05 12:00:02,000 - root - INFO - step:  2  loss: 11.50000  grad_norm:  2.9000  memory: 63.00GiB(45.09%)  tps: 20,000  tflops: 900.00  mfu: 91.00%
[titan] 2026-12-05 12:00:03,000 - root - INFO - \x1b[31mstep:  3  \x1b[32mloss: 11.00000  grad_norm:  2.5000  memory: 63.50GiB(45.45%)  tps: 40,000  tflops: 1,000.00  mfu: N/A
[titan] 2026-12-05 12:00:04,000 - root - INFO - step:  4  loss: 10.50000  grad_norm:  2.0000  memory: 62.00GiB(44.37%)  tps: 10,000  tflops: 990.00  mfu: N/A
"""  # noqa: E501


def test_torchtitans_log_gives_time_weighted_tokens_per_second_after_the_warm_up() -> None:
    steps = parse_steps(TITAN_LOG)
    assert [step.step for step in steps] == [1, 2, 3, 4]
    assert steps[0] == TitanStep(1, 61.2, 1020.0)
    tokens, peak = timed_figures(steps, warmup=2, tokens_per_step=16384)
    assert tokens == pytest.approx(2 * 16384 / (16384 / 40_000 + 16384 / 10_000))  # 16,000: not the mean 25,000
    assert peak == 63.5
    with pytest.raises(BtkError, match="none after the 4 warm-up steps"):
        timed_figures(steps, warmup=4, tokens_per_step=16384)


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert titan_baseline.main(["--results", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("btk-titan: ")
    (tmp_path / "r.json").write_text("{}")
    assert titan_baseline.main(["--results", str(tmp_path / "r.json"), "--warmup", "5", "--steps", "5"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == "btk-titan: --warmup 5 --steps 5: warm-up from 1 to fewer than the steps"


def test_the_benchmarks_shell_scripts_pass_shellcheck() -> None:
    scripts = [SCRIPT, *sorted((ROOT / "containers" / "bench").glob("*.sh"))]
    shellcheck = Path(sys.executable).parent / "shellcheck"
    completed = subprocess.run([str(shellcheck), *map(str, scripts)], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stdout
