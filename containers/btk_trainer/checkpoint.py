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
(while they are still in the page cache; for a background save in the background, see
:meth:`Checkpointer.save`); the ranks exchange those entries, then global
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

File system faults end in one line, never a traceback on some ranks and a hang on the others:
every step of a save that touches the disk is followed by an exchange of what each rank found
(:func:`_agree`), so a full disk, a refused permission or a checkpoint root that is a file on
any rank makes every rank raise the same :class:`~btk.errors.BtkError` (the trainer puts it in
the failure file). The failed save's temp directory is removed; the last complete checkpoint
is untouched and nothing half-written is ever marked ``COMPLETE``. On start, a checkpoint whose
marker or files cannot be read (permissions, ``COMPLETE`` that is a directory) is skipped for
the next older one like a damaged one; a root that is a file or cannot be listed is one line.
A checkpoint that cannot be pruned stays, with a warning line.

:class:`Checkpointer` is what the training loop talks to: it decides when to save
(:meth:`Checkpointer.should_save`) and carries the trainer's own state
(:class:`TrainerState`: the step and the data position) beside model and optimizer.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from btk.errors import BtkError

COMPLETE = "COMPLETE"
MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_CHUNK = 1 << 22
_GIB = 1024**3
#: What file IO raises: OSError, and torch.save's/torch.load's RuntimeError for a write or read the
#: C++ stream could not finish (``PytorchStreamWriter failed writing file``), a truncated pickle.
_IO_ERRORS = (OSError, RuntimeError, EOFError, pickle.UnpicklingError)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: Path, skipped: list[tuple[Path, str]] | None = None) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first.

    A step directory whose marker cannot be read (permissions) or is not a file is not complete;
    ``skipped`` receives it and why. Listing ``root`` itself may raise OSError.
    """
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if not match:
            continue
        marker = child / COMPLETE
        try:
            if marker.is_file():
                found.append((int(match.group(1)), child))
            elif marker.exists() and skipped is not None:
                skipped.append((child, f"{COMPLETE} is not a file"))
        except OSError as error:
            if skipped is not None:
                skipped.append((child, f"{COMPLETE} cannot be read: {_cause(error)}"))
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
        BtkError: ``root`` is a file, a dangling link or cannot be listed on some rank; or some
            rank has checkpoints but no step is complete on all of them, or none of the common
            ones verifies (resuming from nothing would silently restart training and overwrite
            them).
    """
    skipped: list[tuple[Path, str]] = []
    mine: list[int] | str
    try:
        mine = _root_problem(root) or [step for step, _ in complete_checkpoints(root, skipped)]
    except OSError as error:
        mine = f"checkpoint directory {root} cannot be listed ({_cause(error)})"
    views: list[list[int] | str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    problem = next((view for view in views if isinstance(view, str)), None)
    if problem is not None:
        raise BtkError(f"{problem}; fix it or point the job at another checkpoint directory")
    if dist.get_rank() == 0:
        for path, why in skipped:
            print(f"btk: checkpoint {path} is not usable ({why}); skipped", flush=True)
    steps = [set(view) if isinstance(view, list) else set() for view in views]
    common = set.intersection(*steps)
    rejected: list[str] = []
    for step in sorted(common, reverse=True):
        path = root / step_dir_name(step)
        first = _agree(verify_checkpoint(path, part=part, parts=parts))
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


def _root_problem(root: Path) -> str | None:
    """Why ``root`` cannot hold checkpoints at all (a file, a dangling link); None when it can (or is absent)."""
    if root.is_symlink() and not root.exists():
        return f"checkpoint directory {root} is a symbolic link to a path that does not exist"
    if root.exists() and not root.is_dir():
        return f"checkpoint directory {root} is a file, not a directory"
    return None


def _cause(error: BaseException) -> str:
    """What stopped a file operation, in a few words: ``No space left on device: /path (rank 1)``."""
    if isinstance(error, CheckpointException) and error.failures:
        rank, (inner, _) = min(error.failures.items())
        return f"{_cause(inner)} (rank {rank})"
    if isinstance(error, OSError):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _attempt(action: Callable[[], object]) -> str | None:
    """Run a file operation of this rank: None when it worked, else what stopped it (naming the rank)."""
    try:
        action()
    except _IO_ERRORS as error:
        return f"{_cause(error)} (rank {dist.get_rank()})"
    return None


def _agree(finding: str | None, group: Any = None) -> str | None:
    """The first (lowest-rank) finding of all ranks, the same on every rank; collective over ``group`` (all ranks;
    default: the default group), also a barrier."""
    findings: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(findings, finding, group=group)
    return next((found for found in findings if found), None)


def _temporary(root: Path, step: int) -> Path:
    return root / f".{step_dir_name(step)}.tmp"


def _not_written(root: Path, step: int, cause: str, *, local_rank: int, group: Any = None) -> BtkError:
    """The one line of a save that failed on some rank, the same on every rank; collective over ``group``.

    Its temp directory is removed first (one rank per node). The free space and the last complete
    checkpoint are the lowest rank's reading, shared: each rank reading its own would name different
    figures whenever anything writes to the file system between the readings.
    """
    if local_rank == 0:
        shutil.rmtree(_temporary(root, step), ignore_errors=True)
    try:
        kept = latest_checkpoint(root)
        free = shutil.disk_usage(root if root.is_dir() else root.parent).free / _GIB
        space = f"; {free:.1f} GiB free there"
    except OSError:
        kept, space = None, ""
    last = f"the last complete one, {kept[1].name}, is kept" if kept else "no earlier checkpoint is complete"
    line = (f"checkpoint step {step} could not be written under {root} ({cause}{space}); {last}: free space or "
            "restore write access there (job.keep_last_checkpoints sets how many are kept), then restart the job")
    return BtkError(_agree(line, group) or line)


def _check(root: Path, step: int, finding: str | None, *, local_rank: int, group: Any = None) -> None:
    """Agree on this save step's findings (over ``group``); any rank's is every rank's :class:`BtkError`."""
    agreed = _agree(finding, group)
    if agreed is not None:
        raise _not_written(root, step, agreed, local_rank=local_rank, group=group)


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
    (in name order) only, so ``parts`` ranks sharing a file system split the reading. A file that
    cannot be read (permissions) is a finding like a damaged one.
    """
    try:
        return _verify(path, part=part, parts=parts)
    except OSError as error:
        return f"cannot be read ({_cause(error)})"
    except (KeyError, TypeError, AttributeError, ValueError):
        return f"{MANIFEST} malformed"


def _verify(path: Path, *, part: int, parts: int) -> str | None:
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
    """Write checkpoint ``step`` atomically; collective over all ranks.

    Raises:
        BtkError: on every rank when any rank could not write its part (see the module docstring).
    """
    temporary = _start(root, step, local_rank)
    try:
        dcp_save(_state(model, optimizer, trainer_state), checkpoint_id=str(temporary))
    except CheckpointException as error:  # DCP raises it on every rank when any rank failed
        raise _not_written(root, step, _cause(error), local_rank=local_rank) from None
    return _complete(root, step, local_rank=local_rank, keep=keep)


class PendingSave:
    """A checkpoint being staged and written in the background (:meth:`Checkpointer.save`).

    ``staged``: done once the state is copied to host memory (None: nothing left to wait for);
    ``finished``: done once the checkpoint is complete (manifest, marker, rename), or failed.
    """

    def __init__(self, step: int, staged: Future[None] | None, finished: Future[Path]) -> None:
        self.step, self.staged, self.finished = step, staged, finished


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any]) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "trainer": json.dumps(trainer_state)}


def _start(root: Path, step: int, local_rank: int) -> Path:
    """Create the temp directory of checkpoint ``step`` and write this rank's RNG file into it; collective."""
    rank = dist.get_rank()
    temporary = _temporary(root, step)

    def fresh() -> None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)

    _check(root, step, _attempt(fresh) if rank == 0 else None, local_rank=local_rank)
    node_local = local_rank == 0 and rank != 0  # node-local directories (on a shared FS it exists already)
    finding = _attempt(lambda: temporary.mkdir(parents=True, exist_ok=True)) if node_local else None
    _check(root, step, finding, local_rank=local_rank)
    finding = _attempt(lambda: torch.save(_rng_state(), temporary / _rng_file_name(rank)))
    _check(root, step, finding, local_rank=local_rank)
    return temporary


def _complete(root: Path, step: int, *, local_rank: int, keep: int, group: Any = None) -> Path:
    """After every rank's DCP files landed: manifest, marker, rename, prune (see the module docstring); collective
    over ``group`` (all ranks; the background writer's own group for a background save)."""
    rank = dist.get_rank()
    final = root / step_dir_name(step)
    temporary = _temporary(root, step)
    described: dict[str, dict[str, Any]] | str
    try:
        described = describe_files(_own_files(temporary, rank))
    except OSError as error:
        described = f"{_cause(error)} (rank {rank})"
    entries: list[dict[str, dict[str, Any]] | str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, described, group=group)  # also the barrier
    _check(root, step, next((entry for entry in entries if isinstance(entry, str)), None), local_rank=local_rank,
           group=group)
    files = {name: entry for part in entries if isinstance(part, dict) for name, entry in part.items()}
    manifest = json.dumps({"step": step, "files": files}, indent=1, sort_keys=True) + "\n"

    def finish() -> str | None:
        finding = _attempt(lambda: _finalize(temporary, final, step, manifest))
        if finding is None:
            _prune(root, keep)
        return finding

    _check(root, step, finish() if rank == 0 else None, local_rank=local_rank, group=group)
    node_local = local_rank == 0 and rank != 0 and temporary.is_dir()  # this node's own directory is still there
    _check(root, step, finish() if node_local else None, local_rank=local_rank, group=group)
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
    """Delete a checkpoint marker first: a kill midway leaves an incomplete directory, never a marked half.

    A marker that is a directory (never written by us, but restored or made by hand) goes the same way.
    """
    marker = checkpoint / COMPLETE
    if marker.is_dir() and not marker.is_symlink():
        shutil.rmtree(marker)
    else:
        marker.unlink(missing_ok=True)
    shutil.rmtree(checkpoint, ignore_errors=True)


def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` complete checkpoints and stray temp directories.

    Never fails a save: a checkpoint that cannot be removed stays, with a warning line.
    """
    try:
        old = complete_checkpoints(root)[:-keep]
        strays = [child for child in root.iterdir() if child.name.startswith(".step_") and child.name.endswith(".tmp")]
    except OSError as error:
        print(f"btk: warning: old checkpoints under {root} not pruned ({_cause(error)})", flush=True)
        return
    for _, path in old:
        try:
            _remove(path)
        except OSError as error:
            print(f"btk: warning: checkpoint {path} not pruned ({_cause(error)}); it stays", flush=True)
    for child in strays:
        shutil.rmtree(child, ignore_errors=True)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG from ``path``; returns the trainer state; collective.

    Raises:
        BtkError: on every rank when any rank could not read its part (the checkpoint verified, so
            this is the file system: permissions, a disk error).
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "trainer": ""}
    try:
        dcp_load(state, checkpoint_id=str(path))
    except CheckpointException as error:  # raised on every rank when any rank failed
        raise _not_loaded(path, _cause(error)) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / _rng_file_name(dist.get_rank())

    def restore_rng() -> None:
        if rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))

    failed = _agree(_attempt(restore_rng))
    if failed is not None:
        raise _not_loaded(path, failed)
    trainer: dict[str, Any] = json.loads(state["trainer"])
    return trainer


def _not_loaded(path: Path, cause: str) -> BtkError:
    return BtkError(
        f"checkpoint {path} verified but could not be loaded ({cause}); fix access to it, or move it away "
        "to resume from the one before"
    )


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
        self._finisher: ThreadPoolExecutor | None = None  # completes background saves (hash, manifest, rename)
        self._pending: PendingSave | None = None
        # The latest full save's duration (seconds) and its step: a blocking save's wall time, or a background
        # save's from its start to its completion (an upper bound: it shared the machine with training).
        self.save_seconds: float | None = None
        self.measured_step: int | None = None

    def should_save(self, step: int, *, stop_requested: bool) -> bool:
        """Every ``interval`` steps and when a stop is requested; never twice for one step.

        The last step is not saved for being last: a finished run's result is the exported model.
        """
        if self.root is None or step == self.last_saved:
            return False
        return stop_requested or step % self.interval == 0

    def save(self, *, blocking: bool = True) -> None:
        """Checkpoint the current :attr:`state`; collective over all ranks.

        ``blocking=False`` (and ``asynchronous``), as torchtitan's ``async_mode="async_with_pinned_mem"``:
        the loop pays for the temp directory and the RNG files only. DCP's ``async_save`` copies
        the state to host memory (pinned on CUDA) in a staging thread while the next steps run
        (:meth:`wait_for_staging` holds the next optimizer step until the copy is done), then writes
        the files in its writer thread; this checkpointer's own background thread then hashes this
        rank's files and completes the checkpoint (manifest, marker, rename, pruning) with the
        other ranks over the background writes' process group. :meth:`wait` (the next save, the end
        of the run) only collects the outcome. ``blocking`` (stops: SIGTERM, the capacity deadline)
        waits for any background save, then writes this one before returning.
        """
        if self.root is None:
            raise RuntimeError("no checkpoint directory to save into")
        self.wait()
        step, trainer_state = self.state.step, self.state.state_dict()
        started = time.perf_counter()
        if blocking or not self.asynchronous:
            save(self.root, step, self.model, self.optimizer, trainer_state,
                 local_rank=self.local_rank, keep=self.keep)
            self.last_saved = step
            self._measured(step, started)
            return
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

        if self._group is None:
            # Background writes run their collectives on a group of their own (gloo: DCP's async save needs
            # a CPU backend), so they never interleave with the training loop's on the default group.
            self._group = dist.new_group(backend="gloo")
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="btk-checkpoint")
        temporary = _start(self.root, step, self.local_rank)
        if torch.cuda.is_available():
            # The staging stream copies without waiting for the training stream: the step's update must be done.
            torch.cuda.current_stream().synchronize()
        response = async_save(_state(self.model, self.optimizer, trainer_state), checkpoint_id=str(temporary),
                              process_group=self._group, async_stager=self._staging())
        staged, written = ((response.staging_completion, response.upload_completion)
                           if isinstance(response, AsyncSaveResponse) else (None, response))
        assert self._finisher is not None
        self._pending = PendingSave(step, staged, self._finisher.submit(self._finish, self.root, step, written,
                                                                        started))
        self.last_saved = step  # should_save: never twice for one step; the write completes in the background

    def _measured(self, step: int, started: float) -> None:
        self.save_seconds, self.measured_step = time.perf_counter() - started, step

    def _finish(self, root: Path, step: int, written: Future[Any], started: float) -> Path:
        """The background thread's part of a save: wait for DCP's files, then hash and complete; collective over
        the background group, so every rank raises the same :class:`BtkError` (collected by :meth:`wait`)."""
        try:
            written.result()
        except CheckpointException as error:  # raised on every rank when any rank's background write failed
            raise _not_written(root, step, _cause(error), local_rank=self.local_rank, group=self._group) from None
        completed = _complete(root, step, local_rank=self.local_rank, keep=self.keep, group=self._group)
        self._measured(step, started)  # read by the training thread only after wait() collected this future
        return completed

    def save_for_stop(self, deadline: float | None) -> str | None:
        """The save of a stop (SIGTERM, the capacity deadline), unless it cannot finish by ``deadline``; collective.

        A background save in flight is finished first, not abandoned: its files are already
        being written, and it is what the run resumes from when this one is skipped. Then this
        step is written, blocking, unless the latest measured save took longer than what is
        left before ``deadline`` (epoch seconds, :meth:`btk_trainer.stopping.StopFlag.save_deadline`)
        on any rank: a save the kill cuts short costs the time and the upload bandwidth the last
        complete checkpoint's copy to S3 still needs, and saves nothing. Without a measurement
        (the run's first save) it is written. Every rank takes the same decision.

        Returns:
            None when the checkpoint was written, else the one line saying why it was not.
        """
        self.wait()
        step = self.state.step
        left = None if deadline is None else deadline - time.time()
        finding = None
        if left is not None and self.save_seconds is not None and self.save_seconds > left:
            finding = (f"the latest save took {self.save_seconds:.1f} s (step {self.measured_step}) and the stop "
                       f"deadline leaves {max(left, 0.0):.1f} s (rank {dist.get_rank()})")
        agreed = _agree(finding)
        if agreed is not None:
            return f"checkpoint step {step} not written: {agreed}"
        self.save(blocking=True)
        return None

    def _staging(self) -> Any:
        """One stager for the run: its host buffers (pinned on CUDA) are reused by every save, copies run in a
        staging thread (on CUDA on a stream of their own, non-blocking), as torchtitan's pinned-memory async mode."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None:
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda))
        return self._stager

    def wait_for_staging(self) -> None:
        """Return once a background save's copy of the state is complete: before anything changes the state
        (the optimizer step)."""
        pending = self._pending
        if pending is not None and pending.staged is not None:
            pending.staged.result()
            pending.staged = None

    def wait(self) -> None:
        """Finish a background save: its outcome, raised here when it failed on any rank; collective."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finished.result()

    def close(self) -> None:
        """Finish any background save and release the staging buffers and threads; collective."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._finisher is not None:
            self._finisher.shutdown()
            self._finisher = None

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
