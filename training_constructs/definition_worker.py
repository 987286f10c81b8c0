"""A child process that imports the SageMaker SDK while the CDK app is built, then builds definitions.

Importing the SDK takes about two seconds of one core; a CDK app spends its first seconds
importing aws-cdk-lib and constructing the stacks, Python and the jsii kernel (Node.js)
taking turns on one core. ``app.py``'s ``main`` starts this worker first, so the import runs
on another core meanwhile; when the pipelines are built, each spec is sent to the worker and
its definition comes back (:func:`build_with_worker`).

The worker only ever speeds a synth up: if it cannot start, dies, or its build fails, the
definition is built in the app's own process, which then raises the error a user should see.
Protocol, on the worker's stdin and a duplicate of its original stdout (its ``sys.stdout``
goes to stderr, so nothing the SDK prints can corrupt it): length-prefixed pickles, a spec in,
``("ok", definition)`` or ``("error", message)`` out; or a region name in (:func:`prepare`: set
up that region's offline SDK session now, about 0.15 s the first build would otherwise wait),
nothing out.

Imports run one way: the builder (:mod:`training_constructs.pipeline_definition`) uses this
module and hands itself to :func:`serve` in the worker process (as a :class:`Builder`); this
module imports no builder, it names the worker's entry point (:data:`ENTRY`) only as text.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

_HEADER = struct.Struct(">I")
_ROOT = Path(__file__).resolve().parent.parent
#: ``module:function`` the worker process runs: it imports the builder and calls :func:`serve` with it.
ENTRY = "training_constructs.pipeline_definition:serve_definitions"


class Builder(Protocol):
    """What :func:`serve` needs of the definition builder."""

    SDK_MODULES: Sequence[str]

    def offline_sdk_environment(self, region: str | None) -> None: ...

    def prepare_offline_session(self, region: str) -> None: ...

    def build_with_sdk(self, spec: Any) -> str: ...


def _send(stream: IO[bytes], payload: object) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the definition worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the definition worker closed its pipe mid-message")
    return pickle.loads(data)  # our own child process, over its private pipe


class DefinitionWorker:
    """The worker process, started at once; :meth:`build` returns None whenever it cannot help."""

    def __init__(self, entry: str = ENTRY) -> None:
        module, function = entry.split(":")
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(_ROOT)!r}); "
             f"from {module} import {function}; {function}()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=_ROOT,
        )

    def build(self, spec: object) -> str | None:
        """The worker's definition of ``spec``, or None (not running, died, or the build failed)."""
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            return None
        try:
            _send(process.stdin, spec)
            status, value = _receive(process.stdout)
        except (OSError, EOFError, pickle.PickleError):
            self.close()
            return None
        return value if status == "ok" and isinstance(value, str) else None

    def prepare(self, region: str) -> None:
        """Have the worker set up its offline session for ``region`` before the first spec comes."""
        process = self._process
        if process is None or process.stdin is None:
            return
        try:
            _send(process.stdin, region)
        except OSError:
            self.close()

    def close(self) -> None:
        """End the worker now: it holds nothing but imported modules (when every definition
        came from the cache, it may still be importing them)."""
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a dead worker: what was buffered cannot be flushed
                    stream.close()
        process.kill()
        process.wait()


_current: DefinitionWorker | None = None


def start() -> DefinitionWorker | None:
    """Start the worker that :func:`build_with_worker` uses (``app.py``'s ``main`` does, first);
    None when no process can be started (then every definition is built in this process)."""
    global _current
    stop()
    try:
        _current = DefinitionWorker()
    except (OSError, ValueError):  # no interpreter to start: every definition is built in this process
        _current = None
    return _current


def stop() -> None:
    """End the worker, if one runs."""
    global _current
    worker, _current = _current, None
    if worker is not None:
        worker.close()


def prepare(region: str) -> None:
    """Let the running worker, if any, set up the SDK session of ``region`` meanwhile (no reply)."""
    if _current is not None:
        _current.prepare(region)


def build_with_worker(spec: object, build: Callable[[Any], str]) -> str:
    """The running worker's definition of ``spec``; ``build(spec)`` in this process when it has none."""
    definition = _current.build(spec) if _current is not None else None
    return definition if definition is not None else build(spec)


def serve(builder: Builder) -> None:
    """The worker's loop: import the SDK, then build each spec received until stdin closes."""
    # Importing the SDK leaves about 300,000 objects for the cyclic garbage collector to track
    # (thousands of pydantic model classes among them); the collections their allocation sets
    # off, hundreds of them, take about a quarter of the import's time and find next to no garbage.
    # The worker lives for one synth: it never collects.
    gc.disable()
    if hasattr(os, "nice"):
        os.nice(10)  # the app's own process and the jsii kernel come first; this uses an idle core
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever the SDK prints goes to stderr

    # Before the imports: some SDK modules create boto3 clients at import time (no instance
    # metadata lookups, no role validation, quiet loggers), as the in-process build does.
    builder.offline_sdk_environment(None)
    for module in builder.SDK_MODULES:
        try:
            importlib.import_module(module)
        except Exception:  # the build below reports it, and the app then builds itself
            break
    requests = sys.stdin.buffer
    while True:
        try:
            spec = _receive(requests)
        except EOFError:
            replies.close()
            os._exit(0)  # nothing to tear down that anyone waits for
        if isinstance(spec, str):  # a region to prepare (see prepare): a failure shows at the build
            with contextlib.suppress(Exception):
                builder.prepare_offline_session(spec)
            continue
        try:
            reply: tuple[str, str] = ("ok", builder.build_with_sdk(spec))
        except Exception as error:  # any failure: the app builds in-process and reports it
            reply = ("error", f"{type(error).__name__}: {error}")
        _send(replies, reply)
