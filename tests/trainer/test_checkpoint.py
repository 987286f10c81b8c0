"""The checkpointer: save policy, trainer state, manifest verification and fallback, kills mid-write.

The multi-rank DCP protocol runs in test_distributed.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from btk_trainer.checkpoint import (
    COMPLETE,
    MANIFEST,
    Checkpointer,
    TrainerState,
    complete_checkpoints,
    step_dir_name,
    verify_checkpoint,
)
from btk_trainer.data import ResumableSampler
from btk_trainer.model import Decoder
from btk_trainer.train import RunConfig, main, train
from checkpoint_faults import PHASES, TORCH_WRITE_FAILED, fill_disk
from trainer_fixtures import one_rank_env, sigterm_after, tiny_spec

from btk.errors import BtkError
from btk.hyperparameters import JobHyperparameters, to_hyperparameters

WORKER = Path(__file__).with_name("dist_worker.py")
FAULT_WORKER = Path(__file__).with_name("checkpoint_fault_worker.py")


def _checkpointer(root: Path | None, interval: int = 3) -> Checkpointer:
    model = torch.nn.Linear(2, 2)
    sampler = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0)
    return Checkpointer(root, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        state=TrainerState(sampler), interval=interval, keep=2, local_rank=0)


def test_saves_every_interval_and_on_a_stop(tmp_path: Path) -> None:
    checkpointer = _checkpointer(tmp_path, interval=3)
    assert [step for step in range(1, 10) if checkpointer.should_save(step, stop_requested=False)] == [3, 6, 9]
    assert checkpointer.should_save(4, stop_requested=True)


def test_never_saves_one_step_twice(tmp_path: Path) -> None:
    checkpointer = _checkpointer(tmp_path)
    checkpointer.last_saved = 6  # resumed from step 6 (or just saved it)
    assert not checkpointer.should_save(6, stop_requested=True)
    assert checkpointer.should_save(7, stop_requested=True)


def test_without_a_directory_nothing_is_saved() -> None:
    checkpointer = _checkpointer(None)
    assert not any(checkpointer.should_save(step, stop_requested=True) for step in range(1, 10))
    assert checkpointer.resume() is None
    with pytest.raises(RuntimeError, match="no checkpoint directory"):
        checkpointer.save()


def test_trainer_state_round_trip() -> None:
    sampler = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=2, seed=4)
    for _ in range(5):
        sampler.next_indices()
    state = TrainerState(sampler, step=5)
    state.nonfinite_steps = 2
    saved: dict[str, Any] = state.state_dict()
    assert saved == {"step": 5, "sampler": sampler.state_dict(), "nonfinite_steps": 2}

    fresh = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=2, seed=4)
    restored = TrainerState(fresh)
    restored.load_state_dict(saved)
    assert restored.step == 5 and restored.nonfinite_steps == 2 and fresh.next_indices() == sampler.next_indices()
    older = TrainerState(ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=2, seed=4))
    older.load_state_dict({"step": 5, "sampler": sampler.state_dict()})  # saved before the counter existed
    assert older.nonfinite_steps == 0


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _marker_only(checkpoint: Path) -> None:
    for child in checkpoint.iterdir():
        if child.name != COMPLETE:
            child.unlink()


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "flipped distcp bytes": (lambda c: _flip_middle_byte(c / "__0_0.distcp"), "__0_0.distcp fails its sha256"),
    "truncated distcp": (lambda c: _truncate(c / "__0_0.distcp"), "__0_0.distcp has"),
    "emptied distcp": (lambda c: (c / "__0_0.distcp").write_bytes(b""), "__0_0.distcp has 0 bytes"),
    "deleted distcp": (lambda c: (c / "__0_0.distcp").unlink(), "__0_0.distcp missing"),
    "garbled metadata": (lambda c: _flip_middle_byte(c / ".metadata"), ".metadata fails its sha256"),
    "garbled rng": (lambda c: _flip_middle_byte(c / "rng_rank00000.pt"), "rng_rank00000.pt fails its sha256"),
    "garbled manifest": (lambda c: _flip_middle_byte(c / MANIFEST), "MANIFEST.json does not match"),
    "marker only": (_marker_only, "MANIFEST.json missing"),
}
_STRAIGHT: dict[str, dict[str, torch.Tensor]] = {}


def _straight_run(spec: JobHyperparameters, steps: int, data_dir: Path | None = None) -> dict[str, torch.Tensor]:
    key = f"{spec.model_dump_json()}-{steps}-{data_dir}"
    if key not in _STRAIGHT:
        run = train(RunConfig(spec=spec, data_dir=data_dir, max_steps=steps, device="cpu", return_state=True))
        _STRAIGHT[key] = run.final_state or {}
    return _STRAIGHT[key]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a partial S3 restore or a bad disk leaves, still marked COMPLETE: resume from the step before it."""
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    root = tmp_path / "ckpt"
    train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(4)))
    assert [step for step, _ in complete_checkpoints(root)] == [2, 4]
    assert verify_checkpoint(root / step_dir_name(4)) is None
    damage_fn, finding = DAMAGE[damage]
    damage_fn(root / step_dir_name(4))
    assert finding in (verify_checkpoint(root / step_dir_name(4)) or "")
    capsys.readouterr()
    resumed = train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, return_state=True))
    assert f"checkpoint {root / step_dir_name(4)} is not usable ({finding}" in capsys.readouterr().out
    assert resumed.resumed_from == 2 and resumed.steps_done == 6
    assert _equal(resumed.final_state or {}, _straight_run(spec, 6))


@pytest.mark.usefixtures("one_rank")
def test_no_checkpoint_that_verifies_is_one_line_error(tmp_path: Path) -> None:
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    root = tmp_path / "ckpt"
    train(RunConfig(spec=spec, max_steps=3, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(2)))
    _flip_middle_byte(root / step_dir_name(2) / "__0_0.distcp")
    with pytest.raises(BtkError, match=r"no checkpoint under .* verifies \(step_00000002: __0_0.distcp fails"):
        train(RunConfig(spec=spec, max_steps=3, device="cpu", checkpoint_dir=root))


def test_pruning_removes_the_marker_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between the two deletions leaves a directory that no longer counts as complete."""
    from btk_trainer import checkpoint

    old = tmp_path / step_dir_name(1)
    old.mkdir()
    (old / COMPLETE).write_text("{}")
    (old / "__0_0.distcp").write_bytes(b"x")

    def killed(path: Path, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # stands in for the kill: nothing after this runs

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint._remove(old)
    assert (old / "__0_0.distcp").exists() and complete_checkpoints(tmp_path) == []


@pytest.mark.slow
def test_kill_9_mid_checkpoint_resumes_from_the_previous_complete_one(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while step 4's DCP files are written, and while step 6's save prunes step 4: resume exactly."""
    completed = subprocess.run([sys.executable, str(WORKER), "kill", str(tmp_path), str(dataset)],
                               capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "killed_write").read_text() == "SIGKILL"
    assert (tmp_path / "killed_prune").read_text() == "SIGKILL"
    write, prune = tmp_path / "ckpt_write", tmp_path / "ckpt_prune"
    assert [step for step, _ in complete_checkpoints(write)] == [2]  # step 4 never got its marker
    assert (write / ".step_00000004.tmp").is_dir()
    assert [step for step, _ in complete_checkpoints(prune)] == [6]  # step 4 lost its marker first
    assert (prune / step_dir_name(4)).is_dir()
    for case, root, expected in (("write", write, 2), ("prune", prune, 6)):
        spec = tiny_spec(job={"checkpoint_interval_steps": 2, "keep_last_checkpoints": 1 if case == "prune" else 2})
        for key, value in one_rank_env().items():
            monkeypatch.setenv(key, value)
        try:
            resumed = train(RunConfig(spec=spec, data_dir=dataset, max_steps=8, device="cpu", checkpoint_dir=root,
                                      return_state=True))
            assert resumed.resumed_from == expected and resumed.steps_done == 8
            assert _equal(resumed.final_state or {}, _straight_run(spec, 8, dataset))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _hyperparameters(tmp_path: Path, spec: JobHyperparameters) -> Path:
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps(to_hyperparameters(spec)))
    return path


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("phase", PHASES)
def test_a_full_disk_ends_the_job_with_one_line_and_keeps_the_last_checkpoint(
    phase: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while step 4 is written (its tensor files, RNG file, manifest or marker): the job fails
    with one line in the failure file, step 2 stays complete and verified, nothing of step 4 is left that a
    resume could take, and a restart resumes from step 2 bit-identical to an uninterrupted run."""
    spec = tiny_spec(job={"checkpoint_interval_steps": 2, "max_steps": 6})
    root, failure = tmp_path / "ckpt", tmp_path / "failure"
    fill_disk(monkeypatch, phase, ".step_00000004.tmp")
    code = main(["--hyperparameters", str(_hyperparameters(tmp_path, spec)), "--checkpoint-dir", str(root),
                 "--failure-file", str(failure)])
    lines = failure.read_text().splitlines()
    assert code == 2 and len(lines) == 1, lines
    cause = {
        "data": f"No space left on device: {root}/.step_00000004.tmp/__0_0.distcp (rank 0)",
        "rng": f"RuntimeError: {TORCH_WRITE_FAILED} (rank 0)",
        "manifest": f"No space left on device: {root}/.step_00000004.tmp/{MANIFEST} (rank 0)",
        "marker": f"No space left on device: {root}/.step_00000004.tmp/{COMPLETE} (rank 0)",
    }[phase]
    assert lines[0].startswith(f"btk: error: checkpoint step 4 could not be written under {root} ({cause}; ")
    assert "GiB free there); the last complete one, step_00000002, is kept: free space" in lines[0]
    assert [step for step, _ in complete_checkpoints(root)] == [2]
    assert verify_checkpoint(root / step_dir_name(2)) is None
    assert sorted(child.name for child in root.iterdir()) == [step_dir_name(2)]  # no step 4, no temp directory
    monkeypatch.undo()
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    resumed = train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, return_state=True))
    assert resumed.resumed_from == 2 and resumed.steps_done == 6
    assert _equal(resumed.final_state or {}, _straight_run(spec, 6))


@pytest.mark.usefixtures("one_rank")
def test_a_marker_that_is_a_directory_is_skipped_then_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``COMPLETE`` restored as a directory: not a complete checkpoint (resume from the one before), and the
    re-save of its step replaces it (deleting such a marker used to raise IsADirectoryError)."""
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    root = tmp_path / "ckpt"
    train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(4)))
    marker = root / step_dir_name(4) / COMPLETE
    marker.unlink()
    marker.mkdir()
    capsys.readouterr()
    resumed = train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, return_state=True))
    assert f"checkpoint {root / step_dir_name(4)} is not usable (COMPLETE is not a file); skipped" in (
        capsys.readouterr().out)
    assert resumed.resumed_from == 2 and resumed.steps_done == 6
    assert _equal(resumed.final_state or {}, _straight_run(spec, 6))
    assert verify_checkpoint(root / step_dir_name(4)) is None and marker.is_file()


@pytest.mark.usefixtures("one_rank")
def test_checkpoint_files_that_cannot_be_read_fall_back_to_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read permission refused (by injection: the tests may run as root) on a data file of the newest
    checkpoint, then on its marker: each is skipped like a damaged one, never a PermissionError."""
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    root = tmp_path / "ckpt"
    train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(4)))
    newest = root / step_dir_name(4)
    real_open, real_is_file = Path.open, Path.is_file
    denied: set[Path] = {newest / "__0_0.distcp"}

    def open_(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self in denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_open(self, *args, **kwargs)

    def is_file(self: Path) -> bool:
        if self in denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_is_file(self)

    monkeypatch.setattr(Path, "open", open_)
    assert verify_checkpoint(newest) == f"cannot be read (Permission denied: {newest / '__0_0.distcp'})"
    denied.add(newest / COMPLETE)
    monkeypatch.setattr(Path, "is_file", is_file)
    skipped: list[tuple[Path, str]] = []
    assert [step for step, _ in complete_checkpoints(root, skipped)] == [2]
    assert skipped == [(newest, f"COMPLETE cannot be read: Permission denied: {newest / COMPLETE}")]
    denied.remove(newest / COMPLETE)
    capsys.readouterr()
    resumed = train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=root, return_state=True))
    assert f"checkpoint {newest} is not usable (cannot be read (Permission denied" in capsys.readouterr().out
    assert resumed.resumed_from == 2 and resumed.steps_done == 6


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("kind", ["a file", "a dangling link"])
def test_a_checkpoint_root_that_cannot_hold_checkpoints_is_one_line_at_start(kind: str, tmp_path: Path) -> None:
    """Before any step (it used to train, then fail its first save with FileExistsError on rank 0 only)."""
    root, failure = tmp_path / "ckpt", tmp_path / "failure"
    if kind == "a file":
        root.write_text("not a directory")
        expected = f"checkpoint directory {root} is a file, not a directory"
    else:
        root.symlink_to(tmp_path / "gone")
        expected = f"checkpoint directory {root} is a symbolic link to a path that does not exist"
    spec = tiny_spec(job={"checkpoint_interval_steps": 2, "max_steps": 4})
    code = main(["--hyperparameters", str(_hyperparameters(tmp_path, spec)), "--checkpoint-dir", str(root),
                 "--failure-file", str(failure)])
    assert code == 2
    assert failure.read_text() == (
        f"btk: error: {expected}; fix it or point the job at another checkpoint directory\n")


@pytest.mark.usefixtures("one_rank")
def test_a_checkpoint_that_cannot_be_pruned_stays_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from btk_trainer import checkpoint

    remove = checkpoint._remove

    def refused(path: Path) -> None:
        if path.name == step_dir_name(2):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path / COMPLETE))
        remove(path)

    monkeypatch.setattr(checkpoint, "_remove", refused)
    spec = tiny_spec(job={"checkpoint_interval_steps": 2, "keep_last_checkpoints": 1})
    root = tmp_path / "ckpt"
    result = train(RunConfig(spec=spec, max_steps=7, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(6)))
    assert result.saved_step == 6
    assert [step for step, _ in complete_checkpoints(root)] == [2, 6]  # step 4 pruned, step 2 refused
    out = capsys.readouterr().out
    assert f"btk: warning: checkpoint {root / step_dir_name(2)} not pruned (Permission denied: " in out


@pytest.mark.usefixtures("one_rank")
def test_a_verified_checkpoint_that_cannot_be_loaded_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    root = tmp_path / "ckpt"
    train(RunConfig(spec=spec, max_steps=3, device="cpu", checkpoint_dir=root, on_step_end=sigterm_after(2)))
    load = torch.load

    def unreadable(f: Any, *args: Any, **kwargs: Any) -> Any:
        if str(f).endswith("rng_rank00000.pt"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(f))
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", unreadable)
    path = root / step_dir_name(2)
    with pytest.raises(BtkError) as raised:
        train(RunConfig(spec=spec, max_steps=3, device="cpu", checkpoint_dir=root))
    assert str(raised.value) == (
        f"checkpoint {path} verified but could not be loaded (Input/output error: {path / 'rng_rank00000.pt'} "
        "(rank 0)); fix access to it, or move it away to resume from the one before"
    )


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["data", "rng"])
def test_a_full_disk_on_one_of_two_ranks_is_every_ranks_one_line(phase: str, tmp_path: Path) -> None:
    """Two gloo ranks, the disk full on rank 1 only: both end with the same line (no rank left waiting in a
    collective the other never joins), and step 2 stays complete."""
    completed = subprocess.run([sys.executable, str(FAULT_WORKER), phase, str(tmp_path)], capture_output=True,
                               text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    outcomes = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)]
    root = tmp_path / "ckpt"
    cause = "No space left on device" if phase == "data" else "RuntimeError"
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0].startswith(f"checkpoint step 4 could not be written under {root} ({cause}")
    assert "(rank 1)" in outcomes[0] and "the last complete one, step_00000002, is kept" in outcomes[0]
    assert [step for step, _ in complete_checkpoints(root)] == [2]
    assert not (root / ".step_00000004.tmp").exists()


@pytest.mark.usefixtures("one_rank")
def test_a_background_save_holds_the_state_staged_and_hashes_off_the_training_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop gets control back while the files are still being written; the weights may change as soon as
    the staging is complete (the next optimizer step waits for it) and the checkpoint still holds the staged
    ones; every file is hashed by the checkpointer's background thread, none by the training thread."""
    import threading
    from contextlib import contextmanager

    from btk_trainer import checkpoint
    from torch.distributed.checkpoint import filesystem

    dist.init_process_group("gloo")
    create_stream = filesystem.FileSystem.create_stream
    written = threading.Event()

    @contextmanager
    def slow(self: Any, path: Any, mode: str) -> Any:
        with create_stream(self, path, mode) as stream:
            if "w" in mode:
                written.wait(timeout=30)  # writes wait until the test has changed the weights
            yield stream

    monkeypatch.setattr(filesystem.FileSystem, "create_stream", slow)
    hashed_on: list[str] = []
    sha256 = checkpoint._sha256

    def recording(path: Path) -> str:
        hashed_on.append(threading.current_thread().name)
        return sha256(path)

    monkeypatch.setattr(checkpoint, "_sha256", recording)
    checkpointer = _checkpointer(tmp_path)
    model = checkpointer.model
    assert isinstance(model, torch.nn.Linear)
    staged = {name: value.detach().clone() for name, value in model.state_dict().items()}
    checkpointer.state.step = 3
    checkpointer.save(blocking=False)
    checkpointer.wait_for_staging()
    with torch.no_grad():
        model.weight.add_(1.0)  # the next optimizer step
    assert not (tmp_path / step_dir_name(3)).exists()  # still being written
    written.set()
    checkpointer.close()
    assert hashed_on and all(name.startswith("btk-checkpoint") for name in hashed_on)
    assert verify_checkpoint(tmp_path / step_dir_name(3)) is None
    fresh = _checkpointer(tmp_path)
    assert fresh.resume() == tmp_path / step_dir_name(3)
    assert _equal(fresh.model.state_dict(), staged)


@pytest.mark.usefixtures("one_rank")
def test_a_stop_finishes_the_save_in_flight_and_skips_a_save_that_cannot_meet_the_deadline(tmp_path: Path) -> None:
    """The save in flight (step 3) completes and stays the one to resume from; a new save (step 5) whose measured
    duration is longer than what the deadline leaves is not started, on every rank, and the reason says which
    figures decided."""
    import time

    dist.init_process_group("gloo")
    checkpointer = _checkpointer(tmp_path)
    checkpointer.state.step = 3
    checkpointer.save(blocking=False)
    checkpointer.state.step = 5
    skipped = checkpointer.save_for_stop(time.time())  # the deadline is now: no save fits
    assert skipped is not None and skipped.startswith("checkpoint step 5 not written: the latest save took")
    assert "(step 3)" in skipped and "deadline leaves 0.0 s (rank 0)" in skipped
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [3] and checkpointer.last_saved == 3
    assert not list(tmp_path.glob(".step_00000005*"))  # not even started
    checkpointer.close()


@pytest.mark.usefixtures("one_rank")
def test_a_stop_saves_when_the_deadline_leaves_time_or_nothing_was_measured(tmp_path: Path) -> None:
    import time

    dist.init_process_group("gloo")
    checkpointer = _checkpointer(tmp_path)
    checkpointer.state.step = 2
    assert checkpointer.save_for_stop(time.time() - 60) is None  # the run's first save: nothing measured, tried
    assert checkpointer.save_seconds is not None and checkpointer.measured_step == 2
    checkpointer.state.step = 3
    checkpointer.save(blocking=False)
    checkpointer.state.step = 4
    assert checkpointer.save_for_stop(time.time() + 3600) is None
    assert checkpointer.save_for_stop(None) is None  # nothing bounds it (already saved: written again is harmless)
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [3, 4] and checkpointer.last_saved == 4
    checkpointer.close()


#: What torch.distributed.checkpoint's files hold beside a tensor's bytes (its own header), at most.
FRAMING_BYTES_PER_TENSOR = 2048


@pytest.mark.usefixtures("one_rank")
def test_a_checkpoint_is_the_twelve_bytes_a_parameter_the_plans_stop_save_counts(tmp_path: Path) -> None:
    """fp32 weights and AdamW's two moments, as torch.distributed.checkpoint writes them: the plan's stop save
    (btk.planner.stop_save) within DCP's own framing."""
    from btk.planner.stop_save import CHECKPOINT_BYTES_PER_PARAMETER, StopSave

    spec = tiny_spec()
    train(RunConfig(spec=spec, max_steps=4, device="cpu", checkpoint_dir=tmp_path))
    written = sum(path.stat().st_size for path in (tmp_path / "step_00000003").glob("*.distcp"))
    counted = spec.architecture.parameter_count * CHECKPOINT_BYTES_PER_PARAMETER
    tensors = 4 * len(list(Decoder(spec.architecture).parameters()))  # weights, two moments, AdamW's step
    assert counted <= written <= counted + tensors * FRAMING_BYTES_PER_TENSOR  # the framing: < 0.01 % at 1B
    assert StopSave(spec.architecture.parameter_count, 1).gib_per_node * 1024**3 == counted
