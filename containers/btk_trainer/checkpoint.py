"""Atomic, resumable checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under the checkpoint directory (``/opt/ml/checkpoints`` on SageMaker, which it syncs
to S3 and restores on restart)::

    step_00000120/            a complete checkpoint
        .metadata, __0_0.distcp, ...   DCP files: model, optimizer, trainer state
        rng_rank00000.pt               each rank's RNG states
        COMPLETE                       written last, before the rename
    .step_00000130.tmp/       being written (or left by a crash): ignored, cleaned up

Protocol: every rank writes into the hidden temp directory; after a barrier each node's
local rank 0 writes ``COMPLETE`` and renames the directory to ``step_XXXXXXXX`` (a rename
is atomic on one file system; on a shared one the first node wins). Only directories with
``COMPLETE`` count, so a checkpoint cut short by a kill is never resumed from. The last
``keep`` complete checkpoints are kept.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

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
    if local_rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "trainer": json.dumps(trainer_state)}
    dcp.save(state, checkpoint_id=str(temporary))  # type: ignore[attr-defined]
    torch.save(_rng_state(), temporary / f"rng_rank{rank:05d}.pt")
    dist.barrier()
    if local_rank == 0:
        (temporary / COMPLETE).write_text(json.dumps({"step": step}) + "\n")
        try:
            if final.exists():  # a re-save of the same step (or another node on a shared FS won)
                shutil.rmtree(final) if not (final / COMPLETE).is_file() else shutil.rmtree(temporary)
            if temporary.exists():
                temporary.rename(final)
        except FileNotFoundError:
            pass
        _prune(root, keep)
    dist.barrier()
    return final


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
    dcp.load(state, checkpoint_id=str(path))  # type: ignore[attr-defined]
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng_file = path / f"rng_rank{dist.get_rank():05d}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    trainer: dict[str, Any] = json.loads(state["trainer"])
    return trainer
