"""The training loop's pieces and its contract: schedule, MFU peak, process group, init, exit status."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from btk_trainer.checkpoint import complete_checkpoints
from btk_trainer.model import Decoder
from btk_trainer.train import (
    EXIT_STOPPED_UNSAVED,
    RunConfig,
    RunResult,
    exit_code,
    learning_rate,
    main,
    peak_bf16_tflops,
    setup_distributed,
    train,
)
from trainer_fixtures import tiny_qwen, tiny_spec

from btk.hyperparameters import JobHyperparameters, to_hyperparameters


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("cuda", "nccl")])
def test_process_group_gets_the_job_timeout(device: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
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
    ("result", "code"),
    [
        (RunResult(steps_done=8, interrupted=False, resumed_from=None), 0),  # finished
        (RunResult(steps_done=5, interrupted=True, resumed_from=None, saved_step=5), 0),  # stopped, saved
        (RunResult(steps_done=5, interrupted=True, resumed_from=3, saved_step=3), EXIT_STOPPED_UNSAVED),
        (RunResult(steps_done=5, interrupted=True, resumed_from=None), EXIT_STOPPED_UNSAVED),  # nowhere to save
    ],
)
def test_exit_code(result: RunResult, code: int) -> None:
    assert exit_code(result) == code


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment torchrun gives a 1-process job; the process group is torn down afterwards."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("spec", [tiny_spec(), tiny_spec().model_copy(update={"architecture": tiny_qwen()})],
                         ids=["llama-untied", "qwen-tied"])
def test_training_initialises_through_the_model(spec: JobHyperparameters) -> None:
    """One seed, one model: train()'s weights before step 1 are ``Decoder.init_weights`` of a plain model."""
    initial = train(RunConfig(spec=spec, max_steps=0, device="cpu", return_state=True)).final_state or {}
    plain = Decoder(spec.architecture)
    plain.init_weights(spec.job.seed)
    expected = plain.state_dict()
    assert sorted(initial) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(initial[name], value), name


def _sigterm_after(stop: int) -> Callable[[int], None]:
    def hook(step: int) -> None:
        if step == stop:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


@pytest.mark.usefixtures("one_rank")
def test_stop_with_a_checkpoint_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = train(RunConfig(spec=tiny_spec(), max_steps=10, device="cpu", checkpoint_dir=tmp_path / "ckpt",
                             on_step_end=_sigterm_after(2)))
    assert result.interrupted and result.steps_done == result.saved_step == 2
    assert [step for step, _ in complete_checkpoints(tmp_path / "ckpt")] == [2]
    assert "btk: SIGTERM: checkpoint at step 2 written" in capsys.readouterr().out
    assert exit_code(result) == 0


@pytest.mark.usefixtures("one_rank")
def test_stop_without_a_checkpoint_is_not_success(capsys: pytest.CaptureFixture[str]) -> None:
    result = train(RunConfig(spec=tiny_spec(), max_steps=10, device="cpu", on_step_end=_sigterm_after(2)))
    assert result.interrupted and result.steps_done == 2 and result.saved_step is None
    assert "no checkpoint directory, progress lost" in capsys.readouterr().out
    assert exit_code(result) == EXIT_STOPPED_UNSAVED != 0


@pytest.mark.usefixtures("one_rank")
def test_main_exits_0_after_the_last_step(tmp_path: Path) -> None:
    spec = tiny_spec(job={"max_steps": 2})
    (tmp_path / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    code = main(["--hyperparameters", str(tmp_path / "hyperparameters.json"), "--model-dir", str(tmp_path / "model"),
                 "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert code == 0 and (tmp_path / "model" / "model.safetensors").is_file()
    assert not dist.is_initialized()  # main tears its process group down


@pytest.mark.usefixtures("one_rank")
def test_main_lets_an_unexpected_error_fail_the_process(tmp_path: Path) -> None:
    """Not a user error: no failure line, the exception (exit 1 with its traceback) reaches torchrun."""
    spec = tiny_spec(job={"max_steps": 2, "init_from": str(tmp_path / "no-weights")})
    (tmp_path / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors files"):
        main(["--hyperparameters", str(tmp_path / "hyperparameters.json"), "--failure-file", str(tmp_path / "f")])
    assert not (tmp_path / "f").exists() and not dist.is_initialized()
