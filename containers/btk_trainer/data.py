"""Memory-mapped token shards and a deterministic, resumable sampler.

The dataset (format in :mod:`btk.shards`) is cut into fixed windows of ``seq_len + 1``
tokens (inputs plus the next-token targets) that never cross a shard boundary. Each epoch
visits every window once in an order drawn from ``seed + epoch``. A global micro-batch is
``dp_size * micro_batch_size`` consecutive windows of that order; data-parallel rank ``r``
takes its ``r``-th slice. The sampler's whole state is ``(epoch, position)``, saved in every
checkpoint, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from btk.errors import BtkError
from btk.shards import (
    ShardManifest,
    read_manifest,
    read_verification_record,
    shards_to_verify,
    verify_dataset,
    write_verification_record,
)


def verify_across_ranks(directory: Path, record: Path | None = None) -> ShardManifest:
    """Verify the dataset once per job, not once per rank: each rank hashes its share of the shards.

    ``record`` (``dataset_verified.json`` in the checkpoint directory): the shards a previous
    verification of this dataset version vouched for, unchanged since (:func:`btk.shards.shards_to_verify`:
    size, modification and change time), are not read again; every rank's view counts, so a shard
    changed on any node's file system is hashed. After everything verified, rank 0 records the
    dataset as it is now. A restart of an unchanged dataset therefore reads no shard; its first
    start, or a changed shard, is hashed before anything is read from it.

    Every rank then raises the same one-line error (the lowest rank's finding) or none, so a
    corrupted shard stops the whole job before any training step.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    manifest: ShardManifest | None = None
    wanted: list[int] = []
    finding = _finding(directory, lambda: None)
    if finding is None:
        try:
            manifest = read_manifest(directory)
            wanted = shards_to_verify(directory, manifest, read_verification_record(record) if record else None)
        except BtkError as error:
            finding = str(error)
    views: list[tuple[str | None, list[int]] | None] = [None] * world
    dist.all_gather_object(views, (finding, wanted))
    _raise_first([view[0] if view else None for view in views])
    assert manifest is not None
    to_hash = sorted({index for view in views if view for index in view[1]})
    findings: list[str | None] = [None] * world
    dist.all_gather_object(findings, _finding(directory, lambda: verify_dataset(
        directory, manifest, part=rank, parts=world, only=to_hash)))
    _raise_first(findings)
    if rank == 0:
        _announce(directory, manifest, len(to_hash), record)
    return manifest


def _finding(directory: Path, verify: Callable[[], object]) -> str | None:
    """What ``verify`` found wrong (its one line), None when nothing."""
    try:
        verify()
    except BtkError as error:
        return str(error)
    except OSError as error:  # a fault verify_dataset has no words for: still every rank's one line, not a hang
        return f"dataset {directory}: cannot be read ({error})"
    return None


def _raise_first(findings: list[str | None]) -> None:
    first = next((found for found in findings if found), None)
    if first is not None:
        raise BtkError(first)


def _announce(directory: Path, manifest: ShardManifest, hashed: int, record: Path | None) -> None:
    """Rank 0: record the verified dataset (a failure is a warning: the next start verifies again) and say so."""
    shards = len(manifest.shards)
    if record is not None:
        try:
            write_verification_record(record, directory, manifest)
        except OSError as error:
            print(f"btk: warning: dataset verification not recorded in {record} ({error.strerror or error}); "
                  "the next start verifies every shard again", flush=True)
    if hashed < shards:
        print(f"btk: dataset {directory}: {hashed} of {shards} shards verified, the others unchanged since their "
              f"verification ({record})", flush=True)


class TokenShards:
    """Read-only view of a dataset directory as ``(seq_len + 1)``-token windows.

    ``verify``: ``"local"`` hashes every shard here, ``"ranks"`` splits the hashing across the
    process group and skips what ``record`` vouches for (:func:`verify_across_ranks`), ``"none"``
    only reads the manifest.
    """

    def __init__(self, directory: Path, seq_len: int, *, verify: Literal["local", "ranks", "none"] = "local",
                 record: Path | None = None) -> None:
        self.directory = directory
        self.manifest: ShardManifest
        if verify == "ranks":
            self.manifest = verify_across_ranks(directory, record)
        elif verify == "local":
            self.manifest = verify_dataset(directory)
        else:
            self.manifest = read_manifest(directory)
        self.seq_len = seq_len
        self._arrays = [self._map(shard.file) for shard in self.manifest.shards]
        counts = [max(0, (shard.num_tokens - 1) // seq_len) for shard in self.manifest.shards]
        self._starts: list[int] = list(np.cumsum([0, *counts]).tolist())
        if self._starts[-1] == 0:
            raise BtkError(
                f"dataset {directory}: {self.manifest.total_tokens} tokens hold no window of seq_len+1 = "
                f"{seq_len + 1} tokens; lower seq_len or add data"
            )

    def _map(self, name: str) -> np.memmap[Any, Any]:
        """Memory-map one shard; a file that cannot be opened (permissions, gone, empty) is one line."""
        try:
            return np.memmap(self.directory / name, dtype=np.dtype(self.manifest.dtype).newbyteorder("<"), mode="r")
        except (OSError, ValueError) as error:  # ValueError: numpy cannot map an empty file
            raise BtkError(f"dataset {self.directory}: shard {name} cannot be read ({error})") from None

    def __len__(self) -> int:
        return self._starts[-1]

    def window(self, index: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Tokens of window ``index`` (length ``seq_len + 1``) as int64."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        shard = bisect.bisect_right(self._starts, index) - 1
        offset = (index - self._starts[shard]) * self.seq_len
        return np.asarray(self._arrays[shard][offset : offset + self.seq_len + 1], dtype=np.int64)


@dataclass
class SamplerState:
    """Where the sampler is: the epoch and the next window position inside its order."""

    epoch: int = 0
    position: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


class ResumableSampler:
    """Deterministic window order split across data-parallel ranks.

    Each call to :meth:`next_batch` consumes one *global* micro-batch (all ranks together
    advance by ``dp_size * micro_batch_size`` windows) and returns this rank's part. An
    epoch's tail that is shorter than a global micro-batch is skipped, so every rank always
    gets a full batch.
    """

    def __init__(self, num_windows: int, *, micro_batch_size: int, dp_rank: int, dp_size: int, seed: int) -> None:
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside 0..{dp_size - 1}")
        self.global_batch = micro_batch_size * dp_size
        if num_windows < self.global_batch:
            raise BtkError(
                f"dataset has {num_windows} windows, fewer than one global micro-batch "
                f"({dp_size} ranks x micro_batch_size {micro_batch_size}); add data or shrink the batch"
            )
        self.num_windows = num_windows
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        self.state = SamplerState()
        self._order_epoch = -1
        self._order: np.ndarray[Any, np.dtype[np.int64]] = np.empty(0, dtype=np.int64)

    def _order_for(self, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        if epoch != self._order_epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> list[int]:
        """This rank's window indices for the next global micro-batch; advances the state."""
        if self.state.position + self.global_batch > self.num_windows:
            self.state = SamplerState(epoch=self.state.epoch + 1, position=0)
        order = self._order_for(self.state.epoch)
        start = self.state.position + self.dp_rank * self.micro_batch_size
        indices = order[start : start + self.micro_batch_size].tolist()
        self.state = SamplerState(epoch=self.state.epoch, position=self.state.position + self.global_batch)
        return [int(i) for i in indices]

    def state_dict(self) -> dict[str, int]:
        return {**self.state.as_dict(), "seed": self.seed, "num_windows": self.num_windows,
                "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("seed", "num_windows", "global_batch"):
            if key in state and int(state[key]) != getattr(self, key):
                raise BtkError(
                    f"checkpoint sampler {key}={state[key]} differs from this run's {getattr(self, key)}: "
                    "resume with the same data, seed and batch shape, or start a fresh checkpoint directory"
                )
        self.state = SamplerState(epoch=int(state["epoch"]), position=int(state["position"]))


class Windows(Protocol):
    """Anything that serves fixed-length token windows: shards, or synthetic tokens."""

    def __len__(self) -> int: ...
    def window(self, index: int) -> np.ndarray[Any, Any]: ...


def next_batch(
    shards: Windows, sampler: ResumableSampler, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (micro_batch_size, seq_len) for this rank."""
    windows = np.stack([shards.window(i) for i in sampler.next_indices()])
    tokens = torch.from_numpy(windows)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if device.type == "cuda":
        return inputs.pin_memory().to(device, non_blocking=True), targets.pin_memory().to(device, non_blocking=True)
    return inputs.contiguous(), targets.contiguous()
