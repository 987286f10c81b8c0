"""A disk cache of pipeline definitions: a synth whose inputs did not change skips the SageMaker SDK.

Importing the SageMaker SDK takes about two seconds, most of a whole-app synth beyond what any
CDK app costs; building a definition once it is imported takes hundredths. A definition is a
pure function of its :class:`~training_constructs.pipeline_definition.PipelineSpec` (tokens
are already placeholders there), of the code that builds it and of the SDK, so it is stored
under a key that covers all three:

* the spec, as canonical JSON (every field, pydantic models by their JSON dump, types named);
* the installed versions of the SDK's distributions, boto3 and botocore, and Python's version;
* the source of every module that shapes a definition: ``btk/`` (catalog, hyperparameters,
  naming, metrics) and the builder's own modules in ``training_constructs/``.

Any change to one of them is a new key, built by the SDK again.

A run of the CDK app is recorded too (:func:`record_run`): which definitions it looked up, under
a key of its own (:func:`run_key`: the code fingerprint, the app's context and the bytes of the
user's ``environments.py`` and ``profiles/``). When a run of the same key finds every one of them
stored (:func:`run_stored`), ``app.py`` starts no definition worker: importing the SDK in it would
be three CPU-seconds of work nothing reads. A run whose inputs the key misses looks up other
definitions and builds those in its own process: slower by the SDK's import, never different.

The cache is used only when
``BTK_DEFINITION_CACHE`` names a directory (``app.py``'s ``main`` sets it to
``~/.cache/btk/pipeline-definitions``, or under ``XDG_CACHE_HOME``, unless it is set;
``off`` disables it). A file that cannot be read or written is rebuilt, never an error, and
the directory keeps the :data:`KEEP` definitions most recently built or read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel

#: Environment variable naming the cache directory ("off" or unset: no cache).
CACHE_ENV = "BTK_DEFINITION_CACHE"
#: Distributions whose code builds the definition.
SDK_DISTRIBUTIONS = ("sagemaker", "sagemaker-core", "sagemaker-train", "sagemaker-mlops", "boto3", "botocore")
#: Definitions kept in the directory (the most recently built or read, by modification time), and runs in its
#: :data:`RUNS` folder.
KEEP = 64
#: The cache's folder of recorded app runs (:func:`record_run`).
RUNS = "runs"
_KEY = re.compile(r"[0-9a-f]{64}")
_looked_up: list[str] = []
"""The keys :func:`cached_definition` looked up in this process, in order (what :func:`record_run` records)."""

_ROOT = Path(__file__).resolve().parent.parent
#: Source that shapes a definition besides the spec's values.
_SOURCES = (_ROOT / "btk", _ROOT / "training_constructs" / "pipeline_definition.py",
            _ROOT / "training_constructs" / "locations.py", Path(__file__).resolve())


def default_directory(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/btk/pipeline-definitions``, else ``~/.cache/btk/pipeline-definitions``."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "btk" / "pipeline-definitions"


def cache_directory() -> Path | None:
    """The directory :data:`CACHE_ENV` names, or None when the cache is off."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return None if value in ("", "off") else Path(value)


def _canonical(value: Any) -> Any:
    """A JSON-able form of ``value`` that tells apart every value that can change a definition."""
    if isinstance(value, BaseModel):
        return {"__type__": type(value).__qualname__, **value.model_dump(mode="json")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: _canonical(getattr(value, field.name)) for field in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, **fields}
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_canonical(item) for item in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot key a pipeline definition on a {type(value).__name__}")


def _source_files(sources: Iterable[Path] = _SOURCES) -> Iterator[Path]:
    """Each of ``sources`` that is a file, and the ``*.py`` under each folder (the folder itself when it cannot be
    listed: reading it then fails, and :func:`_digest_files` keys that)."""
    for source in sources:
        try:
            yield from sorted(source.rglob("*.py")) if source.is_dir() else [source]
        except OSError:
            yield source


def _digest_files(digest: Any, sources: Iterable[Path]) -> None:
    """Add each file of :func:`_source_files` to ``digest``: its name (relative to the project where it is inside)
    and its bytes, or a marker where it cannot be read (absent: the app reports it; the key only has to differ)."""
    for path in _source_files(sources):
        try:
            content = path.read_bytes()
        except OSError:
            content = b"\0unreadable"
        name = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path
        digest.update(str(name).encode() + b"\0" + content + b"\0")


@cache
def code_fingerprint() -> str:
    """Digest of the builder's source, the SDK's and boto's versions and Python's version (once per process)."""
    digest = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    for name in SDK_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{name}=={version}\n".encode())
    _digest_files(digest, _SOURCES)
    return digest.hexdigest()


def cache_key(spec: Any) -> str:
    """The key of ``spec``'s definition: its canonical JSON and :func:`code_fingerprint`."""
    text = json.dumps(_canonical(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{code_fingerprint()}\n{text}".encode()).hexdigest()


def cached_definition(spec: Any, build: Callable[[Any], str]) -> str:
    """``build(spec)``, or the definition a previous build of an equal key stored."""
    directory = cache_directory()
    if directory is None:
        return build(spec)
    key = cache_key(spec)
    _looked_up.append(key)
    path = directory / f"{key}.json"
    try:
        stored = path.read_text(encoding="utf-8")
        json.loads(stored)  # a truncated or foreign file is rebuilt
    except (OSError, ValueError):
        pass
    else:
        _touch(path)
        return stored
    definition = build(spec)
    _store(directory, path, definition)
    return definition


def run_key(context: Mapping[str, Any], inputs: Iterable[Path]) -> str:
    """The key of one run of the CDK app: :func:`code_fingerprint`, the app's ``context`` (the CLI's ``-c`` values
    and cdk.json's) and the bytes of ``inputs`` (files, or folders: their ``*.py``), each named."""
    digest = hashlib.sha256(f"{code_fingerprint()}\n{json.dumps(context, sort_keys=True, default=str)}\n".encode())
    _digest_files(digest, inputs)
    return digest.hexdigest()


def run_stored(run: str) -> bool:
    """Whether a run of key ``run`` was recorded and every definition it looked up is still stored (then the app
    needs no SDK). False when the cache is off or the record cannot be read."""
    directory = cache_directory()
    if directory is None:
        return False
    try:
        keys = json.loads((directory / RUNS / f"{run}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(keys, list) and all(isinstance(key, str) and _KEY.fullmatch(key) for key in keys)
            and all((directory / f"{key}.json").is_file() for key in keys))


def record_run(run: str) -> None:
    """Record the definitions looked up since the last record as those of run ``run`` (nothing when the cache is
    off)."""
    directory = cache_directory()
    if directory is not None:
        _store(directory / RUNS, directory / RUNS / f"{run}.json", json.dumps(_looked_up))
    _looked_up.clear()


def _touch(path: Path) -> None:
    """Mark a stored definition as just used: pruning keeps the most recently used, not the most recently built."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _store(directory: Path, path: Path, text: str) -> None:
    """Write atomically (another synth may read it at the same time), then keep the newest :data:`KEEP`.

    Any failure (a read-only or full disk) leaves the cache as it was: no half-written file.
    """
    temporary: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, suffix=".tmp", delete=False) as handle:
            temporary = Path(handle.name)
            handle.write(text)
        os.replace(temporary, path)
        temporary = None
        stored = sorted(directory.glob("*.json"), key=lambda entry: entry.stat().st_mtime, reverse=True)
        for stale in stored[KEEP:]:
            stale.unlink(missing_ok=True)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
