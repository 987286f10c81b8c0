"""Tokenize JSONL text into the shard format of :mod:`btk.shards`.

    python -m btk_trainer.tokenize --input data/*.jsonl --tokenizer tokenizer.json \\
        --output /opt/ml/processing/output --eos-token "</s>"

Each input line is a JSON object with a ``"text"`` string; lines without one are an error
naming the file and line. Documents are encoded with a Hugging Face ``tokenizers``
``tokenizer.json`` (staged with the data; nothing is downloaded), each followed by the
EOS id, and written as flat little-endian token files of at most ``--shard-tokens`` tokens
plus a ``manifest.json`` with sizes and SHA-256 checksums. The tokenizer file is copied next
to the shards so the dataset is self-describing. Every id must be below the tokenizer's
vocabulary and, with ``--vocab-size`` (the profile's ``arch.vocab_size``), below the model's:
an id past the embedding is refused here, not found as an IndexError in training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from btk.errors import BtkError
from btk.shards import (
    ShardEntry,
    ShardManifest,
    check_token_ids,
    dtype_for_vocab,
    sha256_file,
    shard_file_name,
    write_manifest,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEFAULT_SHARD_TOKENS = 1 << 26  # 64 Mi tokens: 128 MiB as uint16


def iter_texts(paths: Iterable[Path]) -> Iterator[str]:
    """Yield the ``text`` of every JSONL line; blank lines are skipped."""
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise BtkError(f"{path}:{number}: not valid JSON") from None
                text = record.get("text") if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise BtkError(f'{path}:{number}: expected an object with a "text" string')
                yield text


def _resolve_eos(tokenizer: Tokenizer, eos_token: str | None) -> int:
    candidates = [eos_token] if eos_token else ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"]
    for candidate in candidates:
        token_id = tokenizer.token_to_id(candidate)
        if token_id is not None:
            return int(token_id)
    raise BtkError(f"tokenizer has none of the EOS tokens {candidates}; pass --eos-token")


def tokenize_to_shards(
    inputs: Sequence[Path],
    tokenizer_path: Path,
    output: Path,
    *,
    eos_token: str | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    batch_size: int = 1024,
    model_vocab_size: int | None = None,
) -> ShardManifest:
    """Encode every document of ``inputs`` into shards under ``output``; returns the manifest.

    ``model_vocab_size``: the profile's vocabulary; a tokenizer with more ids than it is refused.
    """
    from tokenizers import Tokenizer

    if shard_tokens < 2:
        raise BtkError(f"shard_tokens must be >= 2, got {shard_tokens}")
    if not tokenizer_path.is_file():
        raise BtkError(f"tokenizer file {tokenizer_path} does not exist")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if model_vocab_size is not None and vocab_size > model_vocab_size:
        raise BtkError(
            f"tokenizer {tokenizer_path} has {vocab_size} ids, the model's vocabulary (--vocab-size) only "
            f"{model_vocab_size}; use the profile's tokenizer"
        )
    eos_id = _resolve_eos(tokenizer, eos_token)
    dtype = dtype_for_vocab(vocab_size)
    np_dtype = np.dtype(dtype).newbyteorder("<")
    output.mkdir(parents=True, exist_ok=True)

    entries: list[ShardEntry] = []
    buffer: list[np.ndarray] = []
    buffered = 0

    def flush(tokens: np.ndarray) -> None:
        path = output / shard_file_name(len(entries))
        check_token_ids(int(tokens.max()), vocab_size, f"tokenizer {tokenizer_path} output for {path.name}")
        tokens.astype(np_dtype).tofile(path)
        entries.append(ShardEntry(file=path.name, num_tokens=int(tokens.size), sha256=sha256_file(path)))

    def encode(batch: list[str]) -> None:
        nonlocal buffered
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray([*encoding.ids, eos_id], dtype=np.int64)
            buffer.append(ids)
            buffered += ids.size
        while buffered >= shard_tokens:
            joined = np.concatenate(buffer)
            flush(joined[:shard_tokens])
            rest = joined[shard_tokens:]
            buffer[:] = [rest] if rest.size else []
            buffered = int(rest.size)

    batch: list[str] = []
    for text in iter_texts(inputs):
        batch.append(text)
        if len(batch) >= batch_size:
            encode(batch)
            batch = []
    if batch:
        encode(batch)
    if buffered:
        flush(np.concatenate(buffer))
    if not entries:
        raise BtkError(f"no documents found in {', '.join(map(str, inputs))}")

    shutil.copyfile(tokenizer_path, output / "tokenizer.json")
    manifest = ShardManifest(
        dtype=dtype, vocab_size=vocab_size, eos_token_id=eos_id, tokenizer="tokenizer.json", shards=tuple(entries)
    )
    return write_manifest(output, manifest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="btk-tokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", type=Path, required=True, help="JSONL files, or directories of them")
    parser.add_argument("--tokenizer", type=Path, required=True, help="Hugging Face tokenizer.json")
    parser.add_argument("--output", type=Path, required=True, help="dataset directory to write")
    parser.add_argument("--eos-token", default=None, help="EOS token string (default: common names)")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS)
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="the profile's arch.vocab_size: refuse a tokenizer with more ids than the model has")
    args = parser.parse_args(argv)
    files: list[Path] = []
    for item in args.input:
        files.extend(sorted(item.glob("*.jsonl")) if item.is_dir() else [item])
    try:
        manifest = tokenize_to_shards(
            files, args.tokenizer, args.output, eos_token=args.eos_token, shard_tokens=args.shard_tokens,
            model_vocab_size=args.vocab_size,
        )
    except (BtkError, OSError) as error:
        print(f"btk-tokenize: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(manifest.shards)} shards, {manifest.total_tokens} tokens ({manifest.dtype}) to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
