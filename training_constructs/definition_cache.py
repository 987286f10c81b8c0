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

Any change to one of them is a new key, built by the SDK again. The cache is used only when
``BTK_DEFINITION_CACHE`` names a directory (``app.py``'s ``main`` sets it to
``~/.cache/btk/pipeline-definitions``, or under ``XDG_CACHE_HOME``, unless it is set;
``off`` disables it). A file that cannot be read or written is rebuilt, never an error, and
the directory keeps the newest :data:`KEEP` definitions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel

#: Environment variable naming the cache directory ("off" or unset: no cache).
CACHE_ENV = "BTK_DEFINITION_CACHE"
#: Distributions whose code builds the definition.
SDK_DISTRIBUTIONS = ("sagemaker", "sagemaker-core", "sagemaker-train", "sagemaker-mlops", "boto3", "botocore")
#: Definitions kept in the directory (the newest by modification time).
KEEP = 64

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


def _source_files() -> Iterator[Path]:
    for source in _SOURCES:
        yield from sorted(source.rglob("*.py")) if source.is_dir() else [source]


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
    for path in _source_files():
        digest.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
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
    path = directory / f"{cache_key(spec)}.json"
    try:
        stored = path.read_text(encoding="utf-8")
        json.loads(stored)  # a truncated or foreign file is rebuilt
        return stored
    except (OSError, ValueError):
        pass
    definition = build(spec)
    _store(directory, path, definition)
    return definition


def _store(directory: Path, path: Path, definition: str) -> None:
    """Write atomically (another synth may read it at the same time), then keep the newest :data:`KEEP`.

    Any failure (a read-only or full disk) leaves the cache as it was: no half-written file.
    """
    temporary: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, suffix=".tmp", delete=False) as handle:
            temporary = Path(handle.name)
            handle.write(definition)
        os.replace(temporary, path)
        temporary = None
        stored = sorted(directory.glob("*.json"), key=lambda entry: entry.stat().st_mtime, reverse=True)
        for stale in stored[KEEP:]:
            stale.unlink(missing_ok=True)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
