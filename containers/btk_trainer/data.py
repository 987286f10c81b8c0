"""Memory-mapped token shards and a deterministic, resumable sampler.

The dataset (format in :mod:`btk.shards`) is cut into fixed windows of ``seq_len + 1``
tokens (inputs plus the next-token targets) that never cross a shard boundary. Each epoch
visits every window once in an order drawn from ``seed + epoch``. A global micro-batch is
``dp_size * micro_batch_size`` consecutive windows of that order; data-parallel rank ``r``
takes its ``r``-th slice. The sampler's whole state is ``(epoch, position)``, saved in every
checkpoint, so a resumed run sees exactly the batches an uninterrupted one would.

Documents are packed: a window holds the end of one, whole ones, the start of another, each
ended by the dataset's ``eos_token_id``. Every micro-batch carries, beside its inputs and targets,
the document each input token belongs to inside its window (:func:`document_ids`), which is what
attention restricted to documents needs (a block mask from ``documents[q] == documents[kv]``).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch

from btk.errors import BtkError
from btk.shards import (
    ShardManifest,
    dataset_record_path,
    read_manifest,
    read_verification_record,
    shards_to_verify,
    verify_dataset,
    write_verification_record,
)


def verify_across_ranks(directory: Path, record: Path | None = None) -> ShardManifest:
    """Verify the dataset once per version, and then once per job, not once per rank: each rank hashes its share.

    A shard a record of this dataset version vouches for, unchanged since (:func:`btk.shards.shards_to_verify`:
    size, modification and change time), is not read again. Two records are consulted: the one
    beside the shards (:func:`btk.shards.dataset_record_path`, left by any earlier job on this
    file system, whichever execution it belonged to) and ``record`` (``dataset_verified.json`` in
    the checkpoint directory: a restart's, where the dataset directory is read-only). Every rank's
    view counts, so a shard changed on any node's file system is hashed. After everything
    verified, rank 0 writes both records as the dataset is now. A new execution on an unchanged
    dataset therefore reads no shard; a new dataset version, or a changed shard, is hashed before
    anything is read from it.

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
            wanted = _not_vouched_for(directory, manifest, [dataset_record_path(directory, manifest), record])
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


def _not_vouched_for(directory: Path, manifest: ShardManifest, records: list[Path | None]) -> list[int]:
    """The shards no record vouches for (a shard one record vouches for need not be hashed again)."""
    unvouched = set(range(len(manifest.shards)))
    for path in records:
        if path is not None:
            unvouched &= set(shards_to_verify(directory, manifest, read_verification_record(path)))
    return sorted(unvouched)


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
    """Rank 0: record the verified dataset beside its shards and in ``record``, and say what was hashed.

    A record that cannot be written is a warning, not a failure (the next start hashes again):
    the dataset directory is read-only on an S3 channel, for instance, and then only the
    checkpoint directory's record spares a restart the hashing.
    """
    shards = len(manifest.shards)
    beside = dataset_record_path(directory, manifest)
    for path, consequence in ((beside, "a new execution hashes the shards again"),
                              (record, "a restart hashes the shards again")):
        if path is None:
            continue
        try:
            write_verification_record(path, directory, manifest)
        except OSError as error:
            print(f"btk: warning: dataset verification not recorded in {path} ({error.strerror or error}); "
                  f"{consequence}", flush=True)
    if hashed < shards:
        print(f"btk: dataset {directory}: {hashed} of {shards} shards verified, the others unchanged since a "
              f"verification of this version ({beside.parent} or {record})", flush=True)


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
        self.eos_token_id: int | None = self.manifest.eos_token_id
        self._dtype = np.dtype(self.manifest.dtype).newbyteorder("<")
        self._files = [self._open(shard.file) for shard in self.manifest.shards]
        weakref.finalize(self, _close_all, list(self._files))
        counts = [max(0, (shard.num_tokens - 1) // seq_len) for shard in self.manifest.shards]
        self._starts: list[int] = list(np.cumsum([0, *counts]).tolist())
        if self._starts[-1] == 0:
            raise BtkError(
                f"dataset {directory}: {self.manifest.total_tokens} tokens hold no window of seq_len+1 = "
                f"{seq_len + 1} tokens; lower seq_len or add data"
            )

    def _open(self, name: str) -> int:
        """Open one shard for reading; a file that cannot be opened (permissions, gone) is one line."""
        try:
            return os.open(self.directory / name, os.O_RDONLY)
        except OSError as error:
            raise BtkError(f"dataset {self.directory}: shard {name} cannot be read ({error})") from None

    def __len__(self) -> int:
        return self._starts[-1]

    def window(self, index: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Tokens of window ``index`` (length ``seq_len + 1``) as int64.

        Read with ``pread`` (the interpreter lock is released while the file system answers, so a
        loader thread waiting on a slow read does not hold up the training thread, as a page fault
        in a memory map would); a shard shorter than its manifest says is one line.
        """
        if not 0 <= index < len(self):
            raise IndexError(index)
        shard = bisect.bisect_right(self._starts, index) - 1
        width = self._dtype.itemsize
        wanted = (self.seq_len + 1) * width
        start = (index - self._starts[shard]) * self.seq_len * width
        data = b""
        while len(data) < wanted:
            chunk = os.pread(self._files[shard], wanted - len(data), start + len(data))
            if not chunk:
                raise BtkError(f"dataset {self.directory}: shard {self.manifest.shards[shard].file} is shorter than "
                               "its manifest says; restage the data")
            data += chunk
        return np.frombuffer(data, dtype=self._dtype).astype(np.int64)


def _close_all(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            os.close(descriptor)


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
        self._orders: dict[int, np.ndarray[Any, np.dtype[np.int64]]] = {}

    def _order_for(self, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        if epoch not in self._orders:
            # Two epochs at most: the current one and the next, which a loader reading ahead reaches first.
            self._orders = {known: order for known, order in self._orders.items() if known == epoch - 1}
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
        return self._orders[epoch]

    def _draw(self, state: SamplerState) -> tuple[SamplerState, list[int], SamplerState]:
        """(the state the micro-batch is drawn at, this rank's indices, the state after it) from ``state``."""
        if state.position + self.global_batch > self.num_windows:
            state = SamplerState(epoch=state.epoch + 1, position=0)
        start = state.position + self.dp_rank * self.micro_batch_size
        indices = [int(i) for i in self._order_for(state.epoch)[start : start + self.micro_batch_size].tolist()]
        return state, indices, SamplerState(epoch=state.epoch, position=state.position + self.global_batch)

    def next_indices(self) -> list[int]:
        """This rank's window indices for the next global micro-batch; advances the state."""
        _, indices, self.state = self._draw(self.state)
        return indices

    def upcoming(self, count: int) -> list[tuple[tuple[int, int], list[int]]]:
        """The next ``count`` micro-batches as (``(epoch, position)`` before each, its indices); the state stays."""
        found, state = [], self.state
        for _ in range(count):
            _, indices, after = self._draw(state)
            found.append(((state.epoch, state.position), indices))
            state = after
        return found

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
    """Anything that serves fixed-length token windows: shards, or synthetic tokens.

    ``eos_token_id``: the token that ends each packed document; None when the tokens are not
    documents (synthetic), and then a window is one document.
    """

    eos_token_id: int | None

    def __len__(self) -> int: ...
    def window(self, index: int) -> np.ndarray[Any, Any]: ...


class Batch(NamedTuple):
    """One rank's micro-batch: ``inputs`` and ``targets`` (batch, seq) int64, ``documents`` (batch, seq) int32."""

    inputs: torch.Tensor
    targets: torch.Tensor
    documents: torch.Tensor


HostBatch = Batch  # in host memory (pinned when bound for a GPU)


def document_ids(inputs: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """The index of the document each input token belongs to within its window, (batch, seq) int32.

    A document ends with its ``eos_token_id``, which still belongs to it; the token after it starts
    the next one: the index is the number of end-of-document tokens strictly before the position.
    Without an ``eos_token_id`` every window is one document (index 0 throughout).
    """
    if eos_token_id is None:
        return torch.zeros(inputs.shape, dtype=torch.int32)
    ends = (inputs == eos_token_id).to(torch.int32)
    return torch.cumsum(ends, dim=1, dtype=torch.int32) - ends


def read_batch(shards: Windows, indices: list[int], *, pin: bool) -> HostBatch:
    """The windows ``indices`` as a :class:`Batch` in host memory, pinned when ``pin`` (a CUDA copy to come)."""
    tokens = torch.from_numpy(np.stack([shards.window(i) for i in indices]))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    batch = Batch(inputs, targets, document_ids(inputs, shards.eos_token_id))
    if pin:
        return Batch(*(tensor.pin_memory() for tensor in batch))
    return batch


def to_device(batch: HostBatch, device: torch.device) -> Batch:
    """The batch on ``device``: a copy queued on the current stream from pinned memory, on CUDA."""
    if device.type != "cuda":
        return batch
    return Batch(*(tensor.to(device, non_blocking=True) for tensor in batch))


def next_batch(shards: Windows, sampler: ResumableSampler, device: torch.device) -> Batch:
    """This rank's next micro-batch, each tensor (micro_batch_size, seq_len), read now."""
    return to_device(read_batch(shards, sampler.next_indices(), pin=device.type == "cuda"), device)


class BatchLoader:
    """This rank's micro-batches, read ``ahead`` micro-batches in advance by a background thread.

    The thread reads the windows (``pread``, which releases the interpreter lock while it waits),
    stacks them and, on CUDA, pins them, so the training thread only queues the copy to the GPU
    (torchtitan's data loader: worker-side reading, pinned memory). The sampler stays the one
    source of truth: a micro-batch read ahead is keyed by the sampler state it is drawn at and
    used only when the sampler reaches that state, so a sampler rewound (a step dropped at a
    stop) or restored (a resume) gets exactly the batches of a loader that reads nothing ahead.
    """

    def __init__(self, shards: Windows, sampler: ResumableSampler, device: torch.device, *, ahead: int = 2) -> None:
        self.shards, self.sampler, self.device, self.ahead = shards, sampler, device, ahead
        self._pin = device.type == "cuda"
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="btk-data")
        self._pending: dict[tuple[int, int], Future[HostBatch]] = {}
        self.windows_read = 0  # windows handed to the model so far, and the documents they held
        self.documents_read = 0
        self.mixed_windows = 0  # windows holding more than one document

    def next(self) -> Batch:
        """The sampler's next micro-batch on the device; advances the sampler."""
        state = self.sampler.state
        ready = self._pending.pop((state.epoch, state.position), None)
        indices = self.sampler.next_indices()
        batch = ready.result() if ready is not None else read_batch(self.shards, indices, pin=self._pin)
        self._read_ahead()
        per_window = batch.documents[:, -1] + 1  # host memory: no device sync
        self.windows_read += per_window.numel()
        self.documents_read += int(per_window.sum())
        self.mixed_windows += int((per_window > 1).sum())
        return to_device(batch, self.device)

    def documents_line(self, masked: bool) -> str | None:
        """One line on how documents share the windows read so far, and whether attention crosses them (``masked``:
        ``train.document_masking``); None before any window."""
        if not self.windows_read:
            return None
        attention = "attention stays within each document" if masked else "attention is causal over the whole window"
        return (f"btk: packed windows hold {self.documents_read / self.windows_read:.2f} documents on average, "
                f"{100 * self.mixed_windows / self.windows_read:.0f}% of them more than one "
                f"({self.windows_read} windows read; {attention})")

    def _read_ahead(self) -> None:
        upcoming = self.sampler.upcoming(self.ahead)
        wanted = {key for key, _ in upcoming}
        for stale in [key for key in self._pending if key not in wanted]:
            self._pending.pop(stale).cancel()
        for key, indices in upcoming:
            if key not in self._pending:
                self._pending[key] = self._reader.submit(read_batch, self.shards, indices, pin=self._pin)

    def close(self) -> None:
        """Drop what was read ahead and stop the thread."""
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()
        self._reader.shutdown(wait=True)
