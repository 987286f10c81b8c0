"""The pre-tokenized shard format: one contract for the tokenize tool and the trainer.

A dataset is a directory holding ``manifest.json`` and flat token files::

    manifest.json
    manifest.json.sha256   "<sha256 of manifest.json>  manifest.json" (``sha256sum -c`` format)
    shard_00000.bin     little-endian uint16 or uint32 token ids, no header
    shard_00001.bin
    ...

``manifest.json``::

    {"version": 1, "dtype": "uint16", "vocab_size": 32000, "eos_token_id": 2,
     "tokenizer": "tokenizer.json", "checksum_file": "manifest.json.sha256",
     "shards": [{"file": "shard_00000.bin", "num_tokens": 1048576, "sha256": "..."}]}

The token dtype is the narrowest that holds every id (:func:`dtype_for_vocab`). Documents
are concatenated with ``eos_token_id`` after each one. Every id is below ``vocab_size``
(checked when the shards are written and again, per shard, while verifying). The trainer
memory-maps the files (``numpy.memmap``) and verifies every checksum before it trains
(:func:`verify_dataset`, its ranks splitting the hashing), so a corrupted or truncated
shard, or an id the model's embedding has no row for, is an error, never training data.

A dataset is hashed once per version where it lives, not once per job: after every shard
verified, the trainer records the dataset version (the manifest's digest) and each shard's size,
modification and change time (:class:`VerificationRecord`) in the dataset directory itself,
``.btk-verified/<manifest sha256>.json`` (:func:`dataset_record_path`), so every later job on
that file system, whichever pipeline execution it belongs to, finds it; and in the checkpoint
directory (``dataset_verified.json``), which covers restarts where the dataset directory cannot be
written (an S3 channel). A start hashes only the shards whose metadata changed since a record of
this version vouched for them (:func:`shards_to_verify`), so an unchanged dataset starts without
reading it, and a restaged or rewritten shard is hashed before it is read.

The manifest is checksummed by its sidecar ``manifest.json.sha256``, written with it
(:func:`write_manifest`) and checked by :func:`read_manifest`. A manifest written with a sidecar
says so (``"checksum_file"``), so a dataset whose sidecar went missing is refused rather than
read unchecked (deleting the sidecar no longer lets an edited manifest through); only a
manifest that names no checksum file (written before the sidecar existed) is read without one.
A sidecar that is not a checksum line (not ASCII text, no 64-hex-digit digest), unreadable or
not a file is refused in one line too.

Pure standard library (plus pydantic, as the rest of the core); numpy, when installed (the
trainer), only speeds up the largest-token-id scan.
"""

from __future__ import annotations

import array
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from btk.errors import BtkError, one_line
from btk.files import write_atomically
from btk.jsonfile import MAX_JSON_BYTES, parse_json

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
MANIFEST_CHECKSUM_NAME = MANIFEST_NAME + ".sha256"
TokenDtype = Literal["uint16", "uint32"]
BYTES_PER_TOKEN: dict[str, int] = {"uint16": 2, "uint32": 4}
_CHUNK = 1 << 20
MAX_CHECKSUM_BYTES = 4096  # one line: 64 hex digits, two spaces and a file name


def dtype_for_vocab(vocab_size: int) -> TokenDtype:
    """The narrowest token dtype that holds ids ``0 .. vocab_size - 1``."""
    if vocab_size < 1:
        raise BtkError(f"vocab_size must be >= 1, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise BtkError(f"vocab_size {vocab_size} does not fit uint32 token ids")


def shard_file_name(index: int) -> str:
    """File name of the ``index``-th shard."""
    return f"shard_{index:05d}.bin"


class ShardEntry(BaseModel):
    """One token file of a dataset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = Field(min_length=1)
    num_tokens: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _plain_name(self) -> ShardEntry:
        if "/" in self.file or "\\" in self.file or self.file in {".", ".."}:
            raise ValueError(f"file {self.file!r} must be a plain file name inside the dataset directory")
        return self


class ShardManifest(BaseModel):
    """``manifest.json`` of a dataset directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = FORMAT_VERSION
    dtype: TokenDtype
    vocab_size: int = Field(ge=1, le=1 << 32, description="token ids are 0 .. vocab_size - 1, at most uint32")
    eos_token_id: int = Field(ge=0)
    tokenizer: str = ""
    checksum_file: Literal["", "manifest.json.sha256"] = Field(
        default="", description="the sidecar vouching for this file; empty only for manifests written before it"
    )
    shards: tuple[ShardEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> ShardManifest:
        if self.version != FORMAT_VERSION:
            raise ValueError(f"version {self.version} is not supported (expected {FORMAT_VERSION})")
        if dtype_for_vocab(self.vocab_size) != self.dtype and self.dtype == "uint16":
            raise ValueError(f"dtype uint16 cannot hold vocab_size {self.vocab_size}; use uint32")
        if self.eos_token_id >= self.vocab_size:
            raise ValueError(f"eos_token_id {self.eos_token_id} must be < vocab_size {self.vocab_size}")
        names = [shard.file for shard in self.shards]
        if len(set(names)) != len(names):
            raise ValueError("shard file names must be unique")
        return self

    @property
    def total_tokens(self) -> int:
        return sum(shard.num_tokens for shard in self.shards)

    @property
    def bytes_per_token(self) -> int:
        return BYTES_PER_TOKEN[self.dtype]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    return scan_shard(path, None)[0]


def _max_token(chunk: bytes, dtype: TokenDtype) -> int:
    """The largest little-endian token id in ``chunk`` (numpy when installed: 15x faster than the loop)."""
    if not chunk:
        return -1
    try:
        import numpy as np
    except ImportError:
        values = array.array("H" if dtype == "uint16" else "I", chunk)  # "I" is 4 bytes on every platform we run
        if sys.byteorder != "little":
            values.byteswap()
        return max(values)
    return int(np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<")).max())


def scan_shard(path: Path, dtype: TokenDtype | None) -> tuple[str, int]:
    """(hex SHA-256, largest token id) of a token file in one read; the id is -1 when ``dtype`` is None."""
    digest = hashlib.sha256()
    largest = -1
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):  # _CHUNK is a multiple of 4: no token straddles two chunks
            digest.update(chunk)
            if dtype is not None:
                largest = max(largest, _max_token(chunk, dtype))
    return digest.hexdigest(), largest


def write_manifest(directory: Path, manifest: ShardManifest) -> ShardManifest:
    """Write ``manifest.json`` and its checksum sidecar atomically (temp files then renames); the manifest written.

    The sidecar is renamed into place first: a manifest is never newer than the checksum that
    vouches for it, and a kill between the two renames leaves a mismatch, not silent garbage.
    The manifest written names its sidecar (``checksum_file``), so losing the sidecar is noticed.
    """
    recorded = manifest.model_copy(update={"checksum_file": MANIFEST_CHECKSUM_NAME})
    text = json.dumps(recorded.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    for name, content in ((MANIFEST_CHECKSUM_NAME, f"{hashlib.sha256(text.encode()).hexdigest()}  {MANIFEST_NAME}\n"),
                          (MANIFEST_NAME, text)):
        temporary = directory / (name + ".tmp")
        temporary.write_text(content)
        temporary.replace(directory / name)
    return recorded


def _read_bytes(path: Path, what: str, limit: int) -> bytes:
    """The bytes of ``path`` (at most ``limit``); one line for a directory, an unreadable or a larger file."""
    try:
        if path.stat().st_size > limit:
            raise BtkError(f"{what}: larger than the {limit} bytes it may have")
        return path.read_bytes()
    except IsADirectoryError:
        raise BtkError(f"{what}: is a directory, not a file") from None
    except OSError as error:
        raise BtkError(f"{what}: cannot be read ({error.strerror or error})") from None


def _sidecar_digest(directory: Path) -> str | None:
    """The SHA-256 the sidecar states; None when there is no sidecar at all."""
    sidecar = directory / MANIFEST_CHECKSUM_NAME
    if not sidecar.exists() and not sidecar.is_symlink():
        return None
    what = f"dataset {directory}: {MANIFEST_CHECKSUM_NAME}"
    content = _read_bytes(sidecar, what, MAX_CHECKSUM_BYTES)
    words = content.split()
    digest = words[0] if words else b""
    if len(digest) != 64 or any(byte not in b"0123456789abcdefABCDEF" for byte in digest):
        raise BtkError(f"{what}: not a checksum line (\"<sha256>  {MANIFEST_NAME}\"); re-run the tokenize tool")
    return digest.decode("ascii").lower()


def read_manifest(directory: Path) -> ShardManifest:
    """Read and validate ``manifest.json`` against its checksum; one-line error naming the problem."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise BtkError(f"dataset {directory}: no {MANIFEST_NAME}; run the tokenize tool (btk-tokenize) first")
    expected = _sidecar_digest(directory)
    text = _read_bytes(path, f"dataset {directory}: {MANIFEST_NAME}", MAX_JSON_BYTES)
    if expected is not None and hashlib.sha256(text).hexdigest() != expected:
        raise BtkError(
            f"dataset {directory}: {MANIFEST_NAME} does not match {MANIFEST_CHECKSUM_NAME} (corrupted or edited); "
            "re-run the tokenize tool or restage the data"
        )
    data = parse_json(text, f"dataset {directory}: {MANIFEST_NAME}")
    try:
        manifest = ShardManifest.model_validate(data)
    except ValidationError as error:
        raise BtkError(one_line(error, f"dataset {directory}: invalid {MANIFEST_NAME}: ")) from None
    if expected is None and manifest.checksum_file:
        raise BtkError(
            f"dataset {directory}: {MANIFEST_CHECKSUM_NAME} is missing, and {MANIFEST_NAME} was written with it "
            "(its checksum_file says so); restore it with the dataset or re-run the tokenize tool"
        )
    return manifest


def verify_dataset(
    directory: Path, manifest: ShardManifest | None = None, *, part: int = 0, parts: int = 1,
    only: Sequence[int] | None = None,
) -> ShardManifest:
    """Check every shard's size, and the SHA-256 and token ids of this part's shards, against the manifest.

    Hashing reads the whole dataset, so a job splits it: ``parts`` workers (the training
    ranks) each hash every ``parts``-th of the shards to hash, starting at the ``part``-th, and
    agree on the result; every worker checks every shard's presence and size (cheap). The largest token id
    is found in the same read and must be below ``vocab_size`` (a larger one passes any
    checksum computed over it, then indexes past the embedding). ``only``: the indices of the
    shards to hash (:func:`shards_to_verify`); the default hashes everything.

    Raises:
        BtkError: naming the first shard that is missing, has the wrong size or checksum, or
            an id outside the vocabulary.
    """
    if not 0 <= part < parts:
        raise ValueError(f"part {part} outside 0..{parts - 1}")
    manifest = manifest or read_manifest(directory)
    to_hash = range(len(manifest.shards)) if only is None else sorted(set(only))
    mine = {index for position, index in enumerate(to_hash) if position % parts == part}
    for index, shard in enumerate(manifest.shards):
        path = directory / shard.file
        if not path.is_file():
            raise BtkError(f"dataset {directory}: shard {shard.file} is missing")
        expected_bytes = shard.num_tokens * manifest.bytes_per_token
        actual_bytes = path.stat().st_size
        if actual_bytes != expected_bytes:
            raise BtkError(
                f"dataset {directory}: shard {shard.file} has {actual_bytes} bytes, manifest says "
                f"{expected_bytes}; re-run the tokenize tool or restage the data"
            )
        if index not in mine:
            continue
        try:
            digest, largest = scan_shard(path, manifest.dtype)
        except OSError as error:
            reason = error.strerror or error
            raise BtkError(f"dataset {directory}: shard {shard.file} cannot be read ({reason})") from None
        if digest != shard.sha256:
            raise BtkError(
                f"dataset {directory}: shard {shard.file} fails its sha256 checksum (corrupted); "
                "re-run the tokenize tool or restage the data"
            )
        check_token_ids(largest, manifest.vocab_size, f"dataset {directory}: shard {shard.file}")
    return manifest


def check_token_ids(largest: int, vocab_size: int, where: str) -> None:
    """Refuse a token id the vocabulary (the embedding's rows) does not have."""
    if largest >= vocab_size:
        raise BtkError(
            f"{where} holds token id {largest}, outside the vocabulary of {vocab_size}; tokenize with the "
            "profile's tokenizer (or a profile whose vocab_size covers it)"
        )


VERIFIED_RECORD_VERSION = 1
VERIFIED_RECORD_NAME = "dataset_verified.json"
#: The records kept beside the shards, one per dataset version (manifest digest).
DATASET_RECORDS_DIR = ".btk-verified"


class ShardStat(BaseModel):
    """A shard file as the file system describes it: what changes when the file is replaced or written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes: int
    mtime_ns: int
    ctime_ns: int


class VerificationRecord(BaseModel):
    """What a verification vouched for: the dataset version (the manifest's digest) and each shard as it was then.

    Written by the trainer after every shard of the dataset verified: beside the shards
    (:func:`dataset_record_path`, found by every later job on the same file system) and in the
    checkpoint directory (``dataset_verified.json``, which SageMaker restores on a restart or a
    step retry, where the dataset directory is read-only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = VERIFIED_RECORD_VERSION
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shards: dict[str, ShardStat]


def manifest_digest(manifest: ShardManifest) -> str:
    """SHA-256 of the manifest's content: the dataset's version (every shard's own SHA-256 is in it)."""
    return hashlib.sha256(manifest.model_dump_json().encode()).hexdigest()


def dataset_record_path(directory: Path, manifest: ShardManifest) -> Path:
    """Where the record of this dataset version lives beside its shards: keyed by the manifest's digest, so a
    re-tokenized dataset in the same directory is a new version with no record, and two versions never share one."""
    return directory / DATASET_RECORDS_DIR / f"{manifest_digest(manifest)}.json"


def shard_stat(path: Path) -> ShardStat:
    status = path.stat()
    return ShardStat(bytes=status.st_size, mtime_ns=status.st_mtime_ns, ctime_ns=status.st_ctime_ns)


def read_verification_record(path: Path) -> VerificationRecord | None:
    """The record at ``path``; None when there is none or it cannot be read or trusted (then everything is verified)."""
    try:
        return VerificationRecord.model_validate_json(_read_bytes(path, str(path), MAX_JSON_BYTES))
    except (BtkError, ValidationError, OSError):
        return None


def shards_to_verify(directory: Path, manifest: ShardManifest, record: VerificationRecord | None) -> list[int]:
    """Indices of the shards the record does not vouch for: every shard without a record of this dataset version,
    else those whose size, modification or change time differs from when they were verified (a shard rewritten,
    restaged or copied anew). Reads no shard, only the file system's metadata."""
    if record is None or record.version != VERIFIED_RECORD_VERSION or record.manifest_sha256 != manifest_digest(
            manifest):
        return list(range(len(manifest.shards)))
    changed = []
    for index, shard in enumerate(manifest.shards):
        try:
            unchanged = record.shards.get(shard.file) == shard_stat(directory / shard.file)
        except OSError:  # missing or unreadable: verify_dataset says which
            unchanged = False
        if not unchanged:
            changed.append(index)
    return changed


def write_verification_record(path: Path, directory: Path, manifest: ShardManifest) -> None:
    """Record that every shard of ``directory`` verified as it is now (temp file, then a rename)."""
    record = VerificationRecord(manifest_sha256=manifest_digest(manifest),
                                shards={shard.file: shard_stat(directory / shard.file) for shard in manifest.shards})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, record.model_dump_json(indent=1) + "\n")
