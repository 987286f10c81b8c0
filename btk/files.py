"""Writing a file whole: a reader, a concurrent writer or a kill never sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename, from a temporary file of its own in the same folder (two
    processes writing the same path each rename a whole file), readable by all as the files beside it are.

    Raises:
        OSError: the folder or the file cannot be written (the caller says so in its own words).
    """
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        os.fchmod(handle, 0o644)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
