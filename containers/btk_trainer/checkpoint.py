"""Atomic, resumable checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under the checkpoint directory (``/opt/ml/checkpoints`` on SageMaker, which it syncs
to S3 and restores on restart)::

    step_00000120/            a complete checkpoint
        .metadata, __0_0.distcp, ...   DCP files: model, optimizer, trainer state
        rng_rank00000.pt               each rank's RNG states
        COMPLETE                       written last, before the rename
    .step_00000130.tmp/       being written (or left by a crash): ignored, cleaned up

Protocol: every rank writes into the hidden temp directory; after a barrier global rank 0
writes ``COMPLETE`` and renames the directory to ``step_XXXXXXXX`` (a rename is atomic on one
file system); after a second barrier the local rank 0 of every other node does the same if
its temp directory still exists, i.e. if ``/opt/ml/checkpoints`` is node-local (SageMaker's
default: each node's files go to the same S3 prefix). On a shared file system (FSx) the
directory is gone by then, so no two nodes race on one rename. Only directories with
``COMPLETE`` count, so a checkpoint cut short by a kill is never resumed from. The last
``keep`` complete checkpoints are kept.

On start every rank lists its complete checkpoints and all ranks resume from the newest step
that *every* rank sees (:func:`agreed_latest_checkpoint`): node-local directories restored
from S3 can differ when a node was cut off mid-upload.

:class:`Checkpointer` is what the training loop talks to: it decides when to save
(:meth:`Checkpointer.should_save`) and carries the trainer's own state
(:class:`TrainerState`: the step and the data position) beside model and optimizer.
"""

from __future__ import annotations

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
_STEP_DIR = re.compile(r"^step_(\d{8})$")


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


def agreed_latest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """The newest checkpoint complete in every rank's view of ``root``; collective over all ranks.

    Raises:
        BtkError: some rank has checkpoints but no step is complete on all of them (resuming
            from nothing would silently restart training and overwrite them).
    """
    mine = [step for step, _ in complete_checkpoints(root)]
    views: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    steps = [set(view or []) for view in views]
    common = set.intersection(*steps)
    if common:
        step = max(common)
        return step, root / step_dir_name(step)
    if any(steps):
        counts = sorted({len(view) for view in steps})
        raise BtkError(
            f"checkpoints under {root} differ across ranks (some see none of the others' steps; "
            f"per-rank counts {counts}); restore the same checkpoint prefix on every node or use a fresh one"
        )
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
    rank = dist.get_rank()
    final = root / step_dir_name(step)
    temporary = root / f".{step_dir_name(step)}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    dist.barrier()
    if local_rank == 0 and rank != 0:  # node-local directories (on a shared FS it exists already)
        temporary.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "trainer": json.dumps(trainer_state)}
    dcp_save(state, checkpoint_id=str(temporary))
    torch.save(_rng_state(), temporary / f"rng_rank{rank:05d}.pt")
    dist.barrier()
    if rank == 0:
        _finalize(temporary, final, step)
        _prune(root, keep)
    dist.barrier()
    if local_rank == 0 and rank != 0 and temporary.is_dir():  # this node's own (node-local) directory
        _finalize(temporary, final, step)
        _prune(root, keep)
    dist.barrier()
    return final


def _finalize(temporary: Path, final: Path, step: int) -> None:
    """Mark ``temporary`` complete and rename it to ``final`` (replacing a re-save of the same step)."""
    (temporary / COMPLETE).write_text(json.dumps({"step": step}) + "\n")
    if final.exists():
        shutil.rmtree(final)
    temporary.rename(final)


def _prune(root: Path, keep: int) -> None:
    for _, path in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for child in root.iterdir():
        if child.name.startswith(".step_") and child.name.endswith(".tmp"):
            shutil.rmtree(child, ignore_errors=True)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG from ``path``; returns the trainer state."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "trainer": ""}
    dcp_load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / f"rng_rank{dist.get_rank():05d}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    trainer: dict[str, Any] = json.loads(state["trainer"])
    return trainer


class TrainerState:
    """What a checkpoint holds besides model, optimizer and each rank's RNG: the step and the data position.

    Saved as JSON inside the checkpoint (``{"step": ..., "sampler": ...}``).
    """

    def __init__(self, data: Stateful, step: int = 0) -> None:
        self.step = step
        self.data = data

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.data.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.load_state_dict(state["sampler"])
        self.step = int(state["step"])


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
    ) -> None:
        self.root = root
        self.model, self.optimizer, self.state = model, optimizer, state
        self.interval, self.keep, self.local_rank = interval, keep, local_rank
        self.last_saved: int | None = None  # newest step on disk: saved by this run or resumed from

    def should_save(self, step: int, *, stop_requested: bool) -> bool:
        """Every ``interval`` steps and when a stop is requested; never twice for one step.

        The last step is not saved for being last: a finished run's result is the exported model.
        """
        if self.root is None or step == self.last_saved:
            return False
        return stop_requested or step % self.interval == 0

    def save(self) -> None:
        """Write a checkpoint of the current :attr:`state`; collective over all ranks."""
        if self.root is None:
            raise RuntimeError("no checkpoint directory to save into")
        save(self.root, self.state.step, self.model, self.optimizer, self.state.state_dict(),
             local_rank=self.local_rank, keep=self.keep)
        self.last_saved = self.state.step

    def resume(self) -> Path | None:
        """Load the newest checkpoint complete on every rank into model, optimizer and :attr:`state`.

        Returns its directory, or None for a fresh start. Collective over all ranks.
        """
        if self.root is None:
            return None
        latest = agreed_latest_checkpoint(self.root)
        if latest is None:
            return None
        self.state.load_state_dict(load(latest[1], self.model, self.optimizer))
        self.last_saved = self.state.step
        return latest[1]
