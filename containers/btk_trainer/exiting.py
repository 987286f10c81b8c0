"""How the trainer's processes leave: with their status, without interpreter teardown."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_without_finalizing(code: int) -> NoReturn:
    """Leave the process with ``code`` once stdout and stderr are flushed, skipping interpreter teardown.

    A gloo worker thread can still be destroying a finished collective's work object (which
    holds tensors) when the main thread returns; if the interpreter is finalizing by then, the
    thread's GIL request ends in ``std::terminate`` and the rank aborts with SIGABRT after a
    completed run — torchrun then reports the job failed. Everything a run writes (checkpoints,
    the exported model, the failure file, a benchmark's results) is on disk before the entry
    point's ``main`` returns, so nothing of the teardown is needed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
