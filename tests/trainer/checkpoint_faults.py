"""File system faults injected into a checkpoint's writes and reads, for the checkpointer's tests.

No small file system can be mounted where the tests run, so a full disk is injected where each
kind of checkpoint file is written, as the kernel reports it (``OSError`` ENOSPC, or the
``RuntimeError`` torch's C++ writer raises for a failed write) and only for paths under
``target`` (one checkpoint's temp directory): the other checkpoints write normally.

- ``data``: DCP's tensor files (``__<rank>_0.distcp``): part of the file is written, then ENOSPC;
- ``rng``: the rank's RNG file (``torch.save`` to a path);
- ``manifest``, ``marker``: ``MANIFEST.json``, ``COMPLETE``: half the text is written, then ENOSPC.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer.checkpoint import COMPLETE, MANIFEST
from torch.distributed.checkpoint import filesystem

PHASES = ("data", "rng", "manifest", "marker")
#: What torch.save's C++ stream writer raises when the disk fills (caffe2/serialize/inline_container.cc).
TORCH_WRITE_FAILED = (
    "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write failed"
)


def enospc(path: object) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


class FullStream:
    """A file being written when the disk fills: the first write lands halfway, then ENOSPC."""

    def __init__(self, stream: Any, path: object) -> None:
        self._stream, self._path = stream, path

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._stream.write(view[: len(view) // 2])
        raise enospc(self._path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def fill_disk(monkeypatch: pytest.MonkeyPatch, phase: str, target: str) -> None:
    """From now on, ``phase``'s writes to paths containing ``target`` fail as on a full disk."""
    if phase == "data":
        create_stream = filesystem.FileSystem.create_stream

        @contextmanager
        def full(self: Any, path: Any, mode: str) -> Iterator[Any]:
            with create_stream(self, path, mode) as stream:
                yield FullStream(stream, path) if target in str(path) and "w" in mode else stream

        monkeypatch.setattr(filesystem.FileSystem, "create_stream", full)
    elif phase == "rng":
        save = torch.save

        def full_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(f, str | Path) and target in str(f):
                Path(f).write_bytes(b"PK\x03\x04")  # the writer had started the zip archive
                raise RuntimeError(TORCH_WRITE_FAILED)
            save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", full_save)
    else:
        name = {"manifest": MANIFEST, "marker": COMPLETE}[phase]
        write_text = Path.write_text

        def full_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
            if self.name == name and target in str(self):
                write_text(self, data[: len(data) // 2], *args, **kwargs)
                raise enospc(self)
            return write_text(self, data, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", full_text)
