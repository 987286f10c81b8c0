"""Atomic, resumable checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under the checkpoint directory (``/opt/ml/checkpoints`` on SageMaker, which it syncs
to S3 and restores on restart)::

    step_00000120/            a complete checkpoint
        .metadata, __0_0.distcp, ...   DCP files: model, optimizer, trainer state
        rng_rank00000.pt               each rank's RNG states
        MANIFEST.json                  every file above: {"step", "files": {name: {"bytes", "sha256"}}}
        COMPLETE                       written last, before the rename: {"step", "manifest_sha256"}
    .step_00000130.tmp/       being written (or left by a crash): ignored, cleaned up

Protocol: every rank writes into the hidden temp directory and hashes the files it wrote
(while they are still in the page cache); the ranks exchange those entries, then global
rank 0 writes ``MANIFEST.json``, then ``COMPLETE`` (holding the manifest's own SHA-256), and
renames the directory to ``step_XXXXXXXX`` (a rename is atomic on one file system); after a
barrier the local rank 0 of every other node does the same if its temp directory still
exists, i.e. if ``/opt/ml/checkpoints`` is node-local (SageMaker's default: each node's files
go to the same S3 prefix, and every node writes the same whole-job manifest). On a shared
file system (FSx) the directory is gone by then, so no two nodes race on one rename. Only
directories with ``COMPLETE`` are candidates, so a checkpoint cut short by a kill is never
resumed from. The last ``keep`` complete checkpoints are kept; pruning deletes a
checkpoint's ``COMPLETE`` first, so a kill during pruning leaves no half-deleted checkpoint
marked complete.

SageMaker uploads ``/opt/ml/checkpoints`` to S3 in the background and restores whatever
reached S3, so a marker is not proof: on start every rank lists its complete checkpoints,
all ranks take the newest step that *every* rank sees (:func:`agreed_latest_checkpoint`:
node-local directories restored from S3 can differ when a node was cut off mid-upload), and
that checkpoint is verified against its manifest (every file present with its size; the
SHA-256s split across the ranks of a node, which share its file system). One that fails
(a truncated, emptied, missing or corrupted file, a garbled manifest, a marker alone) is
skipped with a line saying why, and the next older one is tried. A checkpoint without a
manifest is not resumed from.

:class:`Checkpointer` is what the training loop talks to: it decides when to save
(:meth:`Checkpointer.should_save`) and carries the trainer's own state
(:class:`TrainerState`: the step and the data position) beside model and optimizer.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from btk.errors import BtkError

COMPLETE = "COMPLETE"
MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_CHUNK = 1 << 22


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def agreed_latest_checkpoint(root: Path, *, part: int = 0, parts: int = 1) -> tuple[int, Path] | None:
    """The newest checkpoint complete in every rank's view of ``root`` that verifies; collective over all ranks.

    ``part``/``parts``: this rank's share of the hashing (its local rank and the ranks per
    node: they see one file system). A candidate that fails :func:`verify_checkpoint` on any
    rank is skipped for the next older one, with a line from rank 0 saying why.

    Raises:
        BtkError: some rank has checkpoints but no step is complete on all of them, or none of
            the common ones verifies (resuming from nothing would silently restart training
            and overwrite them).
    """
    mine = [step for step, _ in complete_checkpoints(root)]
    views: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    steps = [set(view or []) for view in views]
    common = set.intersection(*steps)
    rejected: list[str] = []
    for step in sorted(common, reverse=True):
        path = root / step_dir_name(step)
        finding = verify_checkpoint(path, part=part, parts=parts)
        findings: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(findings, finding)
        first = next((found for found in findings if found), None)
        if first is None:
            return step, path
        rejected.append(f"{path.name}: {first}")
        if dist.get_rank() == 0:
            print(f"btk: checkpoint {path} is not usable ({first}); trying the next older one", flush=True)
    if rejected:
        raise BtkError(
            f"no checkpoint under {root} verifies ({rejected[0]}); restore the checkpoint prefix again, "
            "or move it away to start fresh"
        )
    if any(steps):
        counts = sorted({len(view) for view in steps})
        raise BtkError(
            f"checkpoints under {root} differ across ranks (some see none of the others' steps; "
            f"per-rank counts {counts}); restore the same checkpoint prefix on every node or use a fresh one"
        )
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _own_files(directory: Path, rank: int) -> list[Path]:
    """The files this rank wrote into a checkpoint: its DCP data files, its RNG file; rank 0 also ``.metadata``."""
    files = [*sorted(directory.glob(f"__{rank}_*.distcp")), directory / _rng_file_name(rank)]
    if rank == 0:  # DCP's coordinator writes the metadata
        files.append(directory / ".metadata")
    return files


def _rng_file_name(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"


def describe_files(files: list[Path]) -> dict[str, dict[str, Any]]:
    """Manifest entries (size and SHA-256) of ``files``, by file name."""
    return {path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)} for path in files}


def verify_checkpoint(path: Path, *, part: int = 0, parts: int = 1) -> str | None:
    """What is wrong with checkpoint ``path``, or None when it matches its manifest.

    Every file's presence and size are checked; the SHA-256 of files ``part``, ``part + parts``, ...
    (in name order) only, so ``parts`` ranks sharing a file system split the reading.
    """
    try:
        marker = json.loads((path / COMPLETE).read_text())
        expected_manifest = marker["manifest_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{COMPLETE} marker unreadable or without a manifest checksum"
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return f"{MANIFEST} missing"
    if _sha256(manifest_path) != expected_manifest:
        return f"{MANIFEST} does not match the checksum in {COMPLETE}"
    try:
        files: dict[str, dict[str, Any]] = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} unreadable"
    for index, (name, entry) in enumerate(sorted(files.items())):
        file = path / name
        if not file.is_file():
            return f"{name} missing"
        size = file.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, the manifest says {entry['bytes']}"
        if index % parts == part % parts and _sha256(file) != entry["sha256"]:
            return f"{name} fails its sha256 checksum"
    return None


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    *,
    local_rank: int,
    keep: int,
) -> Path:
    """Write checkpoint ``step`` atomically; collective over all ranks."""
    temporary = _start(root, step, local_rank)
    dcp_save(_state(model, optimizer, trainer_state), checkpoint_id=str(temporary))
    return _complete(root, step, local_rank=local_rank, keep=keep)


class PendingSave:
    """A checkpoint whose DCP files are being written in the background (:meth:`Checkpointer.save`)."""

    def __init__(self, root: Path, step: int, future: Any) -> None:
        self.root, self.step, self.future = root, step, future


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any]) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "trainer": json.dumps(trainer_state)}


def _start(root: Path, step: int, local_rank: int) -> Path:
    """Create the temp directory of checkpoint ``step`` and write this rank's RNG file into it; collective."""
    rank = dist.get_rank()
    temporary = root / f".{step_dir_name(step)}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    dist.barrier()
    if local_rank == 0 and rank != 0:  # node-local directories (on a shared FS it exists already)
        temporary.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    torch.save(_rng_state(), temporary / _rng_file_name(rank))
    return temporary


def _complete(root: Path, step: int, *, local_rank: int, keep: int) -> Path:
    """After every rank's DCP files landed: manifest, marker, rename, prune (see the module docstring); collective."""
    rank = dist.get_rank()
    final = root / step_dir_name(step)
    temporary = root / f".{step_dir_name(step)}.tmp"
    entries: list[dict[str, dict[str, Any]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, describe_files(_own_files(temporary, rank)))  # also the barrier
    files = {name: entry for part in entries for name, entry in (part or {}).items()}
    manifest = json.dumps({"step": step, "files": files}, indent=1, sort_keys=True) + "\n"
    if rank == 0:
        _finalize(temporary, final, step, manifest)
        _prune(root, keep)
    dist.barrier()
    if local_rank == 0 and rank != 0 and temporary.is_dir():  # this node's own (node-local) directory
        _finalize(temporary, final, step, manifest)
        _prune(root, keep)
    dist.barrier()
    return final


def _finalize(temporary: Path, final: Path, step: int, manifest: str) -> None:
    """Write the manifest, then the marker holding its checksum, and rename ``temporary`` to ``final``.

    A re-save of the same step replaces ``final``, whose marker goes first.
    """
    (temporary / MANIFEST).write_text(manifest)
    marker = {"step": step, "manifest_sha256": hashlib.sha256(manifest.encode()).hexdigest()}
    (temporary / COMPLETE).write_text(json.dumps(marker) + "\n")
    if final.exists():
        _remove(final)
    temporary.rename(final)


def _remove(checkpoint: Path) -> None:
    """Delete a checkpoint marker first: a kill midway leaves an incomplete directory, never a marked half."""
    (checkpoint / COMPLETE).unlink(missing_ok=True)
    shutil.rmtree(checkpoint, ignore_errors=True)


def _prune(root: Path, keep: int) -> None:
    for _, path in complete_checkpoints(root)[:-keep]:
        _remove(path)
    for child in root.iterdir():
        if child.name.startswith(".step_") and child.name.endswith(".tmp"):
            shutil.rmtree(child, ignore_errors=True)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG from ``path``; returns the trainer state."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "trainer": ""}
    dcp_load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / _rng_file_name(dist.get_rank())
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    trainer: dict[str, Any] = json.loads(state["trainer"])
    return trainer


class TrainerState:
    """What a checkpoint holds besides model, optimizer and each rank's RNG: the step, the data position,
    and how many steps were skipped for a non-finite loss (so a restart does not reset that bound).

    Saved as JSON inside the checkpoint (``{"step": ..., "sampler": ..., "nonfinite_steps": ...}``).
    """

    def __init__(self, data: Stateful, step: int = 0) -> None:
        self.step = step
        self.data = data
        self.nonfinite_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.data.state_dict(), "nonfinite_steps": self.nonfinite_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))


class Checkpointer:
    """When to checkpoint, and what: model, optimizer and :class:`TrainerState` under ``root``.

    ``root=None`` (benchmarks, most tests): never saves, never resumes.
    """

    def __init__(
        self,
        root: Path | None,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: TrainerState,
        interval: int,
        keep: int,
        local_rank: int,
        local_world_size: int = 1,
        asynchronous: bool = True,
    ) -> None:
        self.root = root
        self.model, self.optimizer, self.state = model, optimizer, state
        self.interval, self.keep, self.local_rank = interval, keep, local_rank
        self.local_world_size = local_world_size  # ranks sharing this node's file system split the hashing
        self.last_saved: int | None = None  # newest step on disk: saved by this run or resumed from
        self.asynchronous = root is not None and asynchronous
        self._group: Any = None  # background writes' process group, made at the first one (see save)
        self._stager: Any = None
        self._pending: PendingSave | None = None

    def should_save(self, step: int, *, stop_requested: bool) -> bool:
        """Every ``interval`` steps and when a stop is requested; never twice for one step.

        The last step is not saved for being last: a finished run's result is the exported model.
        """
        if self.root is None or step == self.last_saved:
            return False
        return stop_requested or step % self.interval == 0

    def save(self, *, blocking: bool = True) -> None:
        """Checkpoint the current :attr:`state`; collective over all ranks.

        ``blocking=False`` (and ``asynchronous``): the state is copied to host memory (pinned on
        CUDA) and DCP writes the files in a background thread (``async_save``, torchtitan's
        ``async_mode``); the manifest, the marker and the rename follow in :meth:`wait`, called
        at the next save and at the end of the run, so a checkpoint costs the loop a copy, not a
        write. ``blocking`` (stops: SIGTERM, the capacity deadline) waits for any background
        write, then writes this one before returning.
        """
        if self.root is None:
            raise RuntimeError("no checkpoint directory to save into")
        self.wait()
        step, trainer_state = self.state.step, self.state.state_dict()
        if blocking or not self.asynchronous:
            save(self.root, step, self.model, self.optimizer, trainer_state,
                 local_rank=self.local_rank, keep=self.keep)
            self.last_saved = step
            return
        from torch.distributed.checkpoint.state_dict_saver import async_save

        if self._group is None:
            # Background writes run their collectives on a group of their own (gloo: DCP's async save needs
            # a CPU backend), so they never interleave with the training loop's on the default group.
            self._group = dist.new_group(backend="gloo")
        temporary = _start(self.root, step, self.local_rank)
        future = async_save(_state(self.model, self.optimizer, trainer_state), checkpoint_id=str(temporary),
                            process_group=self._group, async_stager=self._staging())
        self._pending = PendingSave(self.root, step, future)
        self.last_saved = step  # should_save: never twice for one step; the write completes in wait()

    def _staging(self) -> Any:
        """One stager for the run: its host buffers (pinned on CUDA) are reused by every save."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None:
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False, use_async_staging=False,
                use_non_blocking_copy=False))
        return self._stager

    def wait(self) -> None:
        """Finish a background save: wait for its files, then manifest, marker, rename and pruning; collective."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.future.result()
        _complete(pending.root, pending.step, local_rank=self.local_rank, keep=self.keep)

    def close(self) -> None:
        """Finish any background save and release the staging buffers; collective."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def resume(self) -> Path | None:
        """Load the newest checkpoint complete on every rank into model, optimizer and :attr:`state`.

        Returns its directory, or None for a fresh start. Collective over all ranks.
        """
        if self.root is None:
            return None
        latest = agreed_latest_checkpoint(self.root, part=self.local_rank % self.local_world_size,
                                          parts=self.local_world_size)
        if latest is None:
            return None
        self.state.load_state_dict(load(latest[1], self.model, self.optimizer))
        self.last_saved = self.state.step
        return latest[1]
