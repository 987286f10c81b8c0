"""The knob ladder: an out-of-memory before the first checkpoint restarts the job on the next rung.

The trainer's ``main`` is run as torchrun runs it on one node: a first attempt, then restarts
with ``TORCHELASTIC_RESTART_COUNT`` counting up. The out-of-memory is injected where a GPU raises
it, in an optimizer step, as ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer import train as train_module
from btk_trainer.entrypoint import build_launch
from btk_trainer.ladder import EXIT_STEP_DOWN, LadderState, step_down
from btk_trainer.train import RunConfig, main, train
from trainer_fixtures import tiny_spec

from btk.hyperparameters import JobHyperparameters, KnobLadder, to_hyperparameters
from btk.knobs import knobs_from_hyperparameters

FIXTURES = Path(__file__).with_name("fixtures")


def _laddered() -> JobHyperparameters:
    """mb=4 ga=1, then mb=2 ga=2, then mb=1 ga=4 with full activation checkpointing: the same 4 windows a step."""
    spec = tiny_spec(micro_batch_size=4, job={"checkpoint_interval_steps": 3, "max_steps": 4})
    plan = spec.knobs
    rungs = (plan.model_copy(update={"micro_batch_size": 2, "gradient_accumulation_steps": 2}),
             plan.model_copy(update={"micro_batch_size": 1, "gradient_accumulation_steps": 4,
                                     "activation_checkpointing": "full"}))
    return spec.model_copy(update={"job": spec.job.model_copy(update={"knob_ladder": KnobLadder(rungs=rungs)})})


def _out_of_memory_above(monkeypatch: pytest.MonkeyPatch, micro_batch_size: int) -> list[int]:
    """Every optimizer step with a micro-batch larger than ``micro_batch_size`` runs out of memory; returns the
    micro-batch sizes of the steps that ran."""
    ran: list[int] = []
    step = train_module.Trainer.train_step

    def maybe_out_of_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        size = self.spec.knobs.micro_batch_size
        if size > micro_batch_size:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} GiB. GPU 0 has 0 GiB free")
        ran.append(size)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(train_module.Trainer, "train_step", maybe_out_of_memory)
    return ran


def _attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restart: int, spec: JobHyperparameters) -> int:
    hyperparameters = tmp_path / "hyperparameters.json"
    hyperparameters.write_text(json.dumps(to_hyperparameters(spec)))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
    return main([f"--hyperparameters={hyperparameters}", f"--checkpoint-dir={tmp_path / 'ckpt'}",
                 f"--model-dir={tmp_path / 'model'}", f"--ladder-state={tmp_path / 'ladder.json'}",
                 f"--failure-file={tmp_path / 'failure'}"])


@pytest.mark.usefixtures("one_rank")
def test_an_out_of_memory_before_the_first_checkpoint_restarts_on_the_next_rung(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _laddered()
    ran = _out_of_memory_above(monkeypatch, 2)
    assert _attempt(tmp_path, monkeypatch, 0, spec) == EXIT_STEP_DOWN
    out = capsys.readouterr().out
    assert ("btk: out of memory before the first checkpoint on knob rung 0 of 2 (CUDA out of memory); restarting "
            "on rung 1: micro_batch_size=2 gradient_accumulation_steps=2") in out
    state = LadderState.model_validate_json((tmp_path / "ladder.json").read_text())
    assert state.rung == 1 and state.attempt == 1
    assert _attempt(tmp_path, monkeypatch, 1, spec) == 0  # torchrun's restart
    out = capsys.readouterr().out
    assert "btk: knob ladder rung 1 of 2 (the previous attempt: out of memory before the first checkpoint" in out
    assert ran == [2, 2, 2, 2] and (tmp_path / "model" / "model.safetensors").is_file()


@pytest.mark.usefixtures("one_rank")
def test_the_last_rung_running_out_of_memory_fails_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _laddered()
    _out_of_memory_above(monkeypatch, 0)
    assert [_attempt(tmp_path, monkeypatch, restart, spec) for restart in range(3)] == [EXIT_STEP_DOWN] * 2 + [2]
    failure = (tmp_path / "failure").read_text()
    assert "out of memory before the first checkpoint on knob rung 2 of 2" in failure
    assert "no leaner rung is left (job.knob_ladder)" in failure and "\n" not in failure.strip()


@pytest.mark.usefixtures("one_rank")
def test_a_restart_after_another_failure_is_not_trained_again(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun restarts after any failure; only the ladder's own restarts train."""
    assert _attempt(tmp_path, monkeypatch, 1, _laddered()) == 2
    assert "follows a failure other than running out of memory" in (tmp_path / "failure").read_text()


@pytest.mark.usefixtures("one_rank")
def test_past_the_first_checkpoint_the_knobs_do_not_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _laddered()
    train(RunConfig(spec=spec, max_steps=3, device="cpu", checkpoint_dir=tmp_path / "ckpt"))  # checkpoint at step 3
    _out_of_memory_above(monkeypatch, 2)
    assert _attempt(tmp_path, monkeypatch, 0, spec) == 2
    failure = (tmp_path / "failure").read_text()
    assert "after the job's checkpoint of step 3: the knobs do not change past a checkpoint" in failure
    assert not (tmp_path / "ladder.json").exists()


def test_a_multi_node_job_names_the_next_rung_instead_of_restarting(tmp_path: Path) -> None:
    restarts, line = step_down(tmp_path / "ladder.json", _laddered(), 0, 0, "CUDA out of memory", can_restart=False)
    assert not restarts and not (tmp_path / "ladder.json").exists()
    assert line.endswith("this job cannot restart itself (multi-node): plan it with micro_batch_size=2 "
                         "gradient_accumulation_steps=2 activation_checkpointing=none sharding=full_shard, the next "
                         "rung")


@pytest.mark.usefixtures("one_rank")
def test_every_rung_trains_the_same_windows_in_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a step learns from does not change with the rung: the same windows, split differently."""
    from btk_trainer.data import ResumableSampler

    spec = _laddered()
    seen: list[list[int]] = []
    draw: Callable[[ResumableSampler], list[int]] = ResumableSampler.next_indices

    def recording(self: ResumableSampler) -> list[int]:
        indices = draw(self)
        seen[-1].extend(indices)
        return indices

    monkeypatch.setattr(ResumableSampler, "next_indices", recording)
    steps = []
    for rung in range(3):
        from btk_trainer.ladder import on_rung

        seen.clear()
        seen.append([])
        train(RunConfig(spec=on_rung(spec, rung), max_steps=2, device="cpu"))
        steps.append(sorted(seen[0]))
    assert steps[0] == steps[1] == steps[2] and len(steps[0]) == 8


def test_one_node_restarts_once_per_rung_and_several_nodes_never(tmp_path: Path) -> None:
    for fixture, restarts in (("one_node", 2), ("four_nodes", None)):
        config = tmp_path / fixture
        shutil.copytree(FIXTURES / fixture, config)
        hyperparameters = json.loads((config / "hyperparameters.json").read_text())
        knobs = knobs_from_hyperparameters(hyperparameters)
        rungs = [knobs.model_copy(update={"activation_checkpointing": mode}) for mode in ("selective", "full")]
        hyperparameters["job.knob_ladder"] = json.dumps({"rungs": [rung.model_dump(mode="json") for rung in rungs]})
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
        (tmp_path / "train").mkdir(exist_ok=True)
        plan = build_launch(config, {"BTK_NUM_GPUS": "8"}, data_dir=tmp_path / "train")
        found = [arg for arg in plan.command if arg.startswith("--max-restarts")]
        assert found == ([f"--max-restarts={restarts}"] if restarts else [])
        assert "--ladder-state=/tmp/btk/knob_ladder.json" in plan.command


@pytest.mark.usefixtures("one_rank")
def test_a_job_starts_on_the_rung_its_rehearsal_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``job.start_rung`` (the pipeline hands the long run its rehearsal's ``train:knob_rung``, a float, as text):
    the first attempt trains on that rung, says so, and reports it; a step down from there goes on down."""
    laddered = _laddered()
    spec = laddered.model_copy(update={"job": laddered.job.model_copy(update={"start_rung": 1})})
    from btk.hyperparameters import from_hyperparameters

    hyperparameters = to_hyperparameters(spec)
    assert hyperparameters["job.start_rung"] == "1"
    assert from_hyperparameters({**hyperparameters, "job.start_rung": "1.0"}) == spec
    assert "job.start_rung" not in to_hyperparameters(laddered)  # left out at its default
    ran = _out_of_memory_above(monkeypatch, 1)
    assert _attempt(tmp_path, monkeypatch, 0, spec) == EXIT_STEP_DOWN
    out = capsys.readouterr().out
    assert "btk: knob ladder rung 1 of 2 (the job starts on it (job.start_rung): its rehearsal held rung 1)" in out
    assert "btk_metric knob_rung=1" in out.splitlines()
    assert "on knob rung 1 of 2 (CUDA out of memory); restarting on rung 2" in out
    assert _attempt(tmp_path, monkeypatch, 1, spec) == 0
    assert "btk_metric knob_rung=2" in capsys.readouterr().out.splitlines()
    assert ran == [1, 1, 1, 1]


@pytest.mark.usefixtures("one_rank")
def test_a_laddered_job_on_its_plan_reports_rung_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A rehearsal that held the plan's own knobs says so in its metrics: the pipeline reads the rung it held."""
    laddered = _laddered()
    spec = laddered.model_copy(update={"job": laddered.job.model_copy(update={"max_steps": 1})})
    assert _attempt(tmp_path, monkeypatch, 0, spec) == 0
    out = capsys.readouterr().out.splitlines()
    assert "btk_metric knob_rung=0" in out and not any(line.startswith("btk: knob ladder rung") for line in out)


@pytest.mark.parametrize(("start", "message"), [
    ("3", "job.start_rung: rung 3 is past the knob ladder's last (2; job.knob_ladder)"),
    ("1.5", "job.start_rung"), ("-1", "job.start_rung"), ("one", "job.start_rung"),
])
def test_a_start_rung_off_the_ladder_is_one_line(start: str, message: str) -> None:
    from btk.errors import BtkError
    from btk.hyperparameters import from_hyperparameters

    hyperparameters = {**to_hyperparameters(_laddered()), "job.start_rung": start}
    with pytest.raises(BtkError) as raised:
        from_hyperparameters(hyperparameters)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_one_node_restarts_once_per_rung_below_the_start(tmp_path: Path) -> None:
    config = tmp_path / "one_node"
    shutil.copytree(FIXTURES / "one_node", config)
    hyperparameters = json.loads((config / "hyperparameters.json").read_text())
    knobs = knobs_from_hyperparameters(hyperparameters)
    rungs = [knobs.model_copy(update={"activation_checkpointing": mode}) for mode in ("selective", "full")]
    hyperparameters["job.knob_ladder"] = json.dumps({"rungs": [rung.model_dump(mode="json") for rung in rungs]})
    hyperparameters["job.start_rung"] = "1.0"
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (tmp_path / "train").mkdir()
    plan = build_launch(config, {"BTK_NUM_GPUS": "8"}, data_dir=tmp_path / "train")
    assert [arg for arg in plan.command if arg.startswith("--max-restarts")] == ["--max-restarts=1"]


@pytest.mark.usefixtures("one_rank")
def test_a_job_that_resumes_trains_on_the_rung_its_checkpoints_were_written_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A job steps down to rung 1 and checkpoints there; the next job of the execution (a retry after a capacity
    error: a new job, its first attempt) resumes on rung 1, not on the rung it would start on (the plan's)."""
    from btk_trainer.ladder import RUNG_RECORD

    spec = _laddered()
    ran = _out_of_memory_above(monkeypatch, 2)
    assert _attempt(tmp_path, monkeypatch, 0, spec) == EXIT_STEP_DOWN
    assert json.loads((tmp_path / "ckpt" / RUNG_RECORD).read_text()) == {"rung": 0}
    stopped = spec.model_copy(update={"job": spec.job.model_copy(update={"max_steps": 3})})
    assert _attempt(tmp_path, monkeypatch, 1, stopped) == 0  # rung 1: checkpoint at step 3, then the job ends
    assert json.loads((tmp_path / "ckpt" / RUNG_RECORD).read_text()) == {"rung": 1}
    capsys.readouterr()
    ran.clear()
    assert _attempt(tmp_path, monkeypatch, 0, spec) == 0  # the retry: resumes from step 3 on rung 1
    out = capsys.readouterr().out
    assert ("btk: knob ladder rung 1 of 2 (its checkpoints up to step 3 were written on it: the knobs do not change "
            "past one)") in out
    assert "btk_metric knob_rung=1" in out.splitlines() and ran == [2]


def test_a_record_the_ladder_does_not_have_leaves_the_rung(tmp_path: Path) -> None:
    from btk_trainer.ladder import RUNG_RECORD, resumed_rung

    spec = _laddered()
    assert resumed_rung(tmp_path, spec, 0) == (0, None)  # no checkpoint
    (tmp_path / "step_00000003").mkdir()
    (tmp_path / "step_00000003" / "COMPLETE").write_text("{}")
    assert resumed_rung(tmp_path, spec, 0) == (0, None)  # no record (a job from before records existed)
    for text in ('{"rung": 7}', '{"rung": -1}', "{", '{"rung": 1, "x": 2}'):
        (tmp_path / RUNG_RECORD).write_text(text)
        assert resumed_rung(tmp_path, spec, 0) == (0, None), text
    (tmp_path / RUNG_RECORD).write_text('{"rung": 2}')
    assert resumed_rung(tmp_path, spec, 0)[0] == 2
