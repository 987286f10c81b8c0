"""The training loop's pieces and its contract: schedule, MFU peak, process group, init, exit status."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from btk_trainer.checkpoint import complete_checkpoints
from btk_trainer.model import Decoder
from btk_trainer.stopping import (
    CAPACITY_BLOCK_ENV,
    CAPACITY_BLOCK_SAFETY_MARGIN,
    CAPACITY_BLOCK_TERMINATION_LEAD,
)
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
from trainer_fixtures import sigterm_after, tiny_qwen, tiny_spec

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


@pytest.mark.usefixtures("one_rank")
def test_stop_with_a_checkpoint_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = train(RunConfig(spec=tiny_spec(), max_steps=10, device="cpu", checkpoint_dir=tmp_path / "ckpt",
                             on_step_end=sigterm_after(2)))
    assert result.interrupted and result.steps_done == result.saved_step == 2
    assert [step for step, _ in complete_checkpoints(tmp_path / "ckpt")] == [2]
    assert "btk: SIGTERM: checkpoint at step 2 written" in capsys.readouterr().out
    assert exit_code(result) == 0


@pytest.mark.usefixtures("one_rank")
def test_stop_without_a_checkpoint_is_not_success(capsys: pytest.CaptureFixture[str]) -> None:
    result = train(RunConfig(spec=tiny_spec(), max_steps=10, device="cpu", on_step_end=sigterm_after(2)))
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


def _sigterm_at_micro_batch(stop_step: int, micro: int) -> Callable[[int, int], None]:
    def hook(step: int, index: int) -> None:
        if (step, index) == (stop_step, micro):
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


@pytest.mark.usefixtures("one_rank")
def test_sigterm_between_micro_batches_drops_the_partial_step(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM inside step 3's accumulation: no update, step 2 saved at once, the resumed run is bit-identical."""
    spec = tiny_spec(gradient_accumulation_steps=4, job={"checkpoint_interval_steps": 100})
    straight = train(RunConfig(spec=spec, max_steps=5, device="cpu", return_state=True))
    stopped = train(RunConfig(spec=spec, max_steps=5, device="cpu", checkpoint_dir=tmp_path / "ckpt",
                              on_micro_batch=_sigterm_at_micro_batch(3, 2)))
    out = capsys.readouterr().out
    assert stopped.interrupted and stopped.dropped_step == 3
    assert stopped.steps_done == stopped.saved_step == 2 and exit_code(stopped) == 0
    assert "btk: checkpoint step 2 written in" in out
    assert "btk: SIGTERM: checkpoint at step 2 written, exiting (step 3 cut short" in out
    resumed = train(RunConfig(spec=spec, max_steps=5, device="cpu", checkpoint_dir=tmp_path / "ckpt",
                              return_state=True))
    assert resumed.resumed_from == 2 and resumed.steps_done == 5
    assert resumed.losses == {step: loss for step, loss in straight.losses.items() if step > 2}
    final, reference = resumed.final_state or {}, straight.final_state or {}
    assert sorted(final) == sorted(reference) and all(torch.equal(final[k], reference[k]) for k in reference)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("scale", [1, 1000], ids=["epoch-seconds", "epoch-milliseconds"])
def test_capacity_block_end_checkpoints_and_exits_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], scale: int) -> None:
    """A training-plan job whose deadline (block end - termination lead - margin) has passed stops by itself."""
    ends = time.time() + CAPACITY_BLOCK_TERMINATION_LEAD + CAPACITY_BLOCK_SAFETY_MARGIN - 1
    monkeypatch.setenv(CAPACITY_BLOCK_ENV, str(int(ends * scale)))
    result = train(RunConfig(spec=tiny_spec(), max_steps=10, device="cpu", checkpoint_dir=tmp_path / "ckpt"))
    assert result.interrupted and result.stop_reason.deadline_passed and not result.stop_reason.signalled
    assert result.steps_done == result.saved_step == 1 and exit_code(result) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("btk: capacity block ends ") and "checkpoint at step 1 written, exiting" in lines[-1]
    (announced,) = [line for line in lines if "run stops by" in line]  # the parsed deadline, logged at start
    assert ("milliseconds" if scale == 1000 else "seconds") in announced


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("scale", [1, 1000], ids=["epoch-seconds", "epoch-milliseconds"])
def test_a_capacity_block_hours_away_does_not_stop_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           scale: int) -> None:
    """A block ending in 3 hours, in either unit, leaves a short run alone (misread, it stops at once)."""
    monkeypatch.setenv(CAPACITY_BLOCK_ENV, str(int((time.time() + 3 * 3600) * scale)))
    result = train(RunConfig(spec=tiny_spec(), max_steps=3, device="cpu", checkpoint_dir=tmp_path / "ckpt"))
    assert not result.interrupted and result.steps_done == 3 and exit_code(result) == 0


@pytest.mark.usefixtures("one_rank")
def test_an_unreadable_capacity_block_is_a_warning_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CAPACITY_BLOCK_ENV, "tomorrow")
    result = train(RunConfig(spec=tiny_spec(), max_steps=2, device="cpu"))
    assert not result.interrupted and result.steps_done == 2
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warning == (f"btk: warning: {CAPACITY_BLOCK_ENV}='tomorrow' is not an epoch timestamp; the run will not "
                       "stop by itself before its capacity ends")


def _poison_losses(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """The loss (hence every gradient) of the given steps becomes NaN, as in a diverged run."""
    from btk_trainer import train as train_module

    real, calls = train_module.forward_backward, itertools.count(1)

    def poisoned(model: Decoder, *args: object, **kwargs: object) -> torch.Tensor | None:
        step = next(calls)
        if step in steps:
            loss = real(model, *args, **kwargs)  # type: ignore[arg-type]
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.grad.fill_(float("nan"))
            return None if loss is None else loss * float("nan")
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(train_module, "forward_backward", poisoned)


@pytest.mark.usefixtures("one_rank")
def test_a_nonfinite_step_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    _poison_losses(monkeypatch, {2})
    result = train(RunConfig(spec=tiny_spec(), max_steps=4, device="cpu", return_state=True))
    assert result.steps_done == 4 and result.nonfinite_steps == 1
    assert math.isnan(result.losses[2]) and all(math.isfinite(result.losses[s]) for s in (1, 3, 4))
    assert [m["nonfinite_steps"] for m in result.metrics] == [0, 1, 1, 1]
    assert all(torch.isfinite(value).all() for value in (result.final_state or {}).values())  # no NaN update


@pytest.mark.usefixtures("one_rank")
def test_divergence_fails_the_job_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Past job.max_nonfinite_steps the job fails (exit 2) with the step and what to try in the failure file."""
    from btk.metrics import parse_metric_line

    _poison_losses(monkeypatch, set(range(3, 100)))
    spec = tiny_spec(job={"max_steps": 10, "max_nonfinite_steps": 2})
    (tmp_path / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    code = main(["--hyperparameters", str(tmp_path / "hyperparameters.json"), "--failure-file", str(tmp_path / "f")])
    failure = (tmp_path / "f").read_text()
    assert code == 2 and len(failure.strip().splitlines()) == 1
    assert "not finite at step 5" in failure and "learning_rate" in failure and "bf16" in failure
    parsed = [parse_metric_line(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["nonfinite_steps"] for p in parsed if p] == [0, 0, 1, 2]  # visible although loss=nan


@pytest.mark.usefixtures("one_rank")
def test_a_sigterm_whose_save_cannot_meet_the_kill_keeps_the_background_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SageMaker kills the job SIGTERM_GRACE_SECONDS after its SIGTERM; made 0 here, no save fits: the background
    save of step 2 is finished, step 3's is not started, the log says why and from where a restart resumes, the
    exit status says the last step was not saved, and a restart resumes from step 2."""
    import btk_trainer.stopping

    monkeypatch.setattr(btk_trainer.stopping, "SIGTERM_GRACE_SECONDS", 0.0)
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    result = train(RunConfig(spec=spec, max_steps=10, device="cpu", checkpoint_dir=tmp_path / "ckpt",
                             on_step_end=sigterm_after(3)))
    assert result.interrupted and result.steps_done == 3 and result.saved_step == 2
    assert [step for step, _ in complete_checkpoints(tmp_path / "ckpt")] == [2]
    out = capsys.readouterr().out
    assert "btk: checkpoint step 3 not written: the latest save took" in out
    assert "a restart resumes from step 2" in out
    assert ("btk: SIGTERM at step 3: its checkpoint could not be written before the deadline, steps after 2 are "
            "lost") in out
    assert exit_code(result) == EXIT_STOPPED_UNSAVED
    monkeypatch.undo()
    resumed = train(RunConfig(spec=spec, max_steps=4, device="cpu", checkpoint_dir=tmp_path / "ckpt"))
    assert resumed.resumed_from == 2 and resumed.steps_done == 4


@pytest.mark.usefixtures("one_rank")
def test_a_run_on_packed_documents_says_how_they_share_the_windows(
        dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Once, after the first metric line: documents per window and the share of windows mixing documents, counted
    from the boundaries the batches carry (the dataset's documents are shorter than a window, so every one mixes)."""
    import re

    train(RunConfig(spec=tiny_spec(), data_dir=dataset, max_steps=2, device="cpu"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "packed windows" in line]
    assert len(lines) == 1
    found = re.fullmatch(r"btk: packed windows hold (\d+\.\d\d) documents on average, (\d+)% of them more than one "
                         r"\((\d+) windows read; attention is causal over the whole window\)", lines[0])
    assert found is not None and float(found[1]) > 1.0 and found[2] == "100" and int(found[3]) > 0


@pytest.mark.usefixtures("one_rank")
def test_a_finished_run_ends_with_how_far_its_loss_fell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The last metric line is the loss of the first metric line minus the last's: what a rehearsal's gate reads."""
    from btk.metrics import parse_metric_line

    spec = tiny_spec(job={"max_steps": 8, "checkpoint_interval_steps": 100})
    (tmp_path / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    assert main(["--hyperparameters", str(tmp_path / "hyperparameters.json")]) == 0
    parsed = [values for line in capsys.readouterr().out.splitlines() if (values := parse_metric_line(line))]
    losses = [values["loss"] for values in parsed if "loss" in values]
    once = {key: value for values in parsed if "step" not in values for key, value in values.items()}
    assert len(losses) == 8 and sum("step" not in values for values in parsed) == len(once) == 3  # one line each
    assert once["loss_drop"] == pytest.approx(losses[0] - losses[-1], abs=2e-6)
    assert once["loss_drop"] > 0  # a learning rate of 3e-3 on a tiny model: the loss falls in 8 steps
    assert once["first_step_seconds"] > 0  # to the millisecond: a tiny model's first step can take less than 50 ms
    step_seconds = [1 / values["tokens_per_second_per_gpu"] for values in parsed[1:8]]  # windows after the first
    spread = (max(step_seconds) - min(step_seconds)) / statistics.median(step_seconds)
    assert once["step_time_spread"] == pytest.approx(spread, rel=0.01, abs=1e-4)  # printed to 4 decimals
    assert "peak_reserved_gib" not in once  # a GPU's figure: not printed on a CPU
