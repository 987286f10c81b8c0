"""Tokenize -> shards -> loader round trip; checksums; the resumable sampler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from btk_trainer.data import ResumableSampler, TokenShards, next_batch
from btk_trainer.tokenize import main as tokenize_main
from btk_trainer.tokenize import tokenize_to_shards

from btk.errors import BtkError
from btk.shards import VERIFIED_RECORD_NAME, dtype_for_vocab, read_manifest, verify_dataset

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away", "into", "woods"]


def make_tokenizer(path: Path) -> Path:
    """A tiny word-level tokenizer trained in-process (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"])
    tokenizer.train_from_iterator([" ".join(WORDS)], trainer=trainer)
    tokenizer.save(str(path))
    return path


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return path


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


def test_round_trip_tokens_and_eos(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    docs = _docs(40)
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", docs)], tok_path, tmp_path / "ds",
                                  eos_token="</s>", shard_tokens=50)
    tokenizer = Tokenizer.from_file(str(tok_path))
    eos = tokenizer.token_to_id("</s>")
    expected = np.concatenate([[*tokenizer.encode(d, add_special_tokens=False).ids, eos] for d in docs])
    assert manifest.dtype == "uint16" and manifest.eos_token_id == eos
    assert len(manifest.shards) == -(-expected.size // 50) and manifest.total_tokens == expected.size
    stored = np.concatenate([np.fromfile(tmp_path / "ds" / s.file, dtype="<u2") for s in manifest.shards])
    np.testing.assert_array_equal(stored, expected)
    assert read_manifest(tmp_path / "ds") == manifest
    # The loader's windows are slices of the same stream, never crossing a shard.
    shards = TokenShards(tmp_path / "ds", seq_len=7)
    assert len(shards) == sum((s.num_tokens - 1) // 7 for s in manifest.shards)
    first = np.fromfile(tmp_path / "ds" / manifest.shards[0].file, dtype="<u2")
    np.testing.assert_array_equal(shards.window(1), first[7:15])
    decoded = tokenizer.decode(shards.window(0).tolist())
    assert decoded.split()[:3] == docs[0].split()[:3]


def test_corrupted_shard_is_detected_not_trained_on(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(30))], tok_path, tmp_path / "ds", shard_tokens=40)
    verify_dataset(tmp_path / "ds")
    target = tmp_path / "ds" / "shard_00001.bin"
    data = bytearray(target.read_bytes())
    data[3] ^= 0x01  # one flipped bit, same size
    target.write_bytes(bytes(data))
    with pytest.raises(BtkError, match=r"shard_00001.bin fails its sha256"):
        TokenShards(tmp_path / "ds", seq_len=8)
    # Split hashing: the part that owns shard 1 finds it; the other checks only sizes.
    verify_dataset(tmp_path / "ds", part=0, parts=2)
    with pytest.raises(BtkError, match=r"shard_00001.bin fails its sha256"):
        verify_dataset(tmp_path / "ds", part=1, parts=2)
    with pytest.raises(ValueError, match=r"part 2 outside 0..1"):
        verify_dataset(tmp_path / "ds", part=2, parts=2)
    target.write_bytes(bytes(data[:-2]))  # truncated
    with pytest.raises(BtkError, match=r"shard_00001.bin has .* bytes"):
        verify_dataset(tmp_path / "ds")
    target.unlink()
    with pytest.raises(BtkError, match=r"shard_00001.bin is missing"):
        verify_dataset(tmp_path / "ds")


def test_bad_inputs(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fox"}\n{"body": "x"}\n')
    with pytest.raises(BtkError, match=r"bad.jsonl:2: expected an object"):
        tokenize_to_shards([bad], tok_path, tmp_path / "ds")
    bad.write_text("not json\n")
    assert tokenize_main(["--input", str(bad), "--tokenizer", str(tok_path), "--output", str(tmp_path / "o")]) == 2
    with pytest.raises(BtkError, match=r"no manifest.json"):
        verify_dataset(tmp_path / "empty")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(
        {"version": 1, "dtype": "uint16", "vocab_size": 70000, "eos_token_id": 1,
         "shards": [{"file": "a.bin", "num_tokens": 4, "sha256": "0" * 64}]}))
    with pytest.raises(BtkError, match=r"uint16 cannot hold vocab_size 70000"):
        read_manifest(tmp_path / "m")
    assert dtype_for_vocab(65536) == "uint16" and dtype_for_vocab(65537) == "uint32"


def test_tokenize_cli_and_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["</s>"] = 70000
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "big.json"))
    write_jsonl(tmp_path / "in.jsonl", ["w1 w69999 w5", "w7"])
    code = tokenize_main(["--input", str(tmp_path), "--tokenizer", str(tmp_path / "big.json"),
                          "--output", str(tmp_path / "ds")])
    assert code == 0
    manifest = read_manifest(tmp_path / "ds")
    assert manifest.dtype == "uint32"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "ds" / "shard_00000.bin", dtype="<u4"),
                                  [1, 69999, 5, 70000, 7, 70000])


def test_sampler_splits_ranks_and_resumes() -> None:
    def run(rank: int, steps: int, sampler: ResumableSampler | None = None) -> tuple[list[list[int]], ResumableSampler]:
        sampler = sampler or ResumableSampler(23, micro_batch_size=2, dp_rank=rank, dp_size=3, seed=5)
        return [sampler.next_indices() for _ in range(steps)], sampler

    batches = [run(rank, 12)[0] for rank in range(3)]
    for step in range(3):  # one epoch holds 3 global batches of 6 (23 // 6); ranks are disjoint
        seen = [i for rank in range(3) for i in batches[rank][step]]
        assert len(set(seen)) == 6
    epoch0 = {i for step in range(3) for rank in range(3) for i in batches[rank][step]}
    assert len(epoch0) == 18
    assert batches[0][3] != batches[0][0]  # a new epoch reshuffles
    head, sampler = run(1, 5)
    state = sampler.state_dict()
    resumed = ResumableSampler(23, micro_batch_size=2, dp_rank=1, dp_size=3, seed=5)
    resumed.load_state_dict(state)
    assert head + run(1, 7, resumed)[0] == batches[1]
    other = ResumableSampler(23, micro_batch_size=2, dp_rank=1, dp_size=2, seed=5)
    with pytest.raises(BtkError, match=r"global_batch"):
        other.load_state_dict(state)
    with pytest.raises(BtkError, match=r"fewer than one global micro-batch"):
        ResumableSampler(5, micro_batch_size=2, dp_rank=0, dp_size=3, seed=5)


def test_next_batch_shapes(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(60))], tok_path, tmp_path / "ds", shard_tokens=100)
    shards = TokenShards(tmp_path / "ds", seq_len=9)
    sampler = ResumableSampler(len(shards), micro_batch_size=3, dp_rank=0, dp_size=1, seed=0)
    inputs, targets, documents = next_batch(shards, sampler, torch.device("cpu"))
    assert inputs.shape == targets.shape == documents.shape == (3, 9) and inputs.dtype == torch.int64
    assert documents.dtype == torch.int32
    torch.testing.assert_close(inputs[:, 1:], targets[:, :-1])


def _documents_by_hand(window: list[int], eos: int) -> list[int]:
    """Each position's document, found by walking the window: a new document starts after every end token."""
    found, current = [], 0
    for token in window:
        found.append(current)
        if token == eos:
            current += 1
    return found


def test_every_batch_carries_each_tokens_document_from_the_datasets_end_of_document_token(tmp_path: Path) -> None:
    """Read from real shards: positions split at the manifest's eos_token_id (the end token is its document's last),
    every window's documents counted from 0, and the windows together hold documents of the lengths the jsonl had."""
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    docs = _docs(40)
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", docs)], tok_path, tmp_path / "ds",
                                  shard_tokens=400)
    shards = TokenShards(tmp_path / "ds", seq_len=31)
    assert shards.eos_token_id == manifest.eos_token_id
    sampler = ResumableSampler(len(shards), micro_batch_size=4, dp_rank=0, dp_size=1, seed=3)
    mixed = 0
    for _ in range(3):
        inputs, _, documents = next_batch(shards, sampler, torch.device("cpu"))
        for window, found in zip(inputs.tolist(), documents.tolist(), strict=True):
            assert found == _documents_by_hand(window, manifest.eos_token_id)
            mixed += found[-1] > 0
    assert mixed > 0  # short documents: windows mix them, which is what the boundaries are for


def test_windows_without_documents_are_one_document_each() -> None:
    from btk_trainer.data import document_ids

    tokens = torch.tensor([[5, 2, 2, 7], [1, 1, 1, 1]])
    assert document_ids(tokens, None).tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert document_ids(tokens, 2).tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]  # an empty document between two ends


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An id past the vocabulary under a matching checksum: found while hashing, never an IndexError in training."""
    import sys

    from btk.shards import ShardEntry, scan_shard, sha256_file, write_manifest

    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(30))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    target = tmp_path / "ds" / "shard_00001.bin"
    tokens = np.fromfile(target, dtype="<u2")
    tokens[5] = manifest.vocab_size + 3
    tokens.tofile(target)
    shards = list(manifest.shards)
    shards[1] = ShardEntry(file=target.name, num_tokens=shards[1].num_tokens, sha256=sha256_file(target))
    write_manifest(tmp_path / "ds", manifest.model_copy(update={"shards": tuple(shards)}))
    message = rf"shard_00001.bin holds token id {manifest.vocab_size + 3}, outside the vocabulary of"
    with pytest.raises(BtkError, match=message):
        TokenShards(tmp_path / "ds", seq_len=8)
    verify_dataset(tmp_path / "ds", part=0, parts=2)  # the other part's shards are fine
    with pytest.raises(BtkError, match=message):
        verify_dataset(tmp_path / "ds", part=1, parts=2)
    monkeypatch.setitem(sys.modules, "numpy", None)  # the core without numpy finds it too
    assert scan_shard(target, "uint16")[1] == manifest.vocab_size + 3


def test_the_manifest_is_checksummed(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(10))], tok_path, tmp_path / "ds", shard_tokens=40)
    path, sidecar = tmp_path / "ds" / "manifest.json", tmp_path / "ds" / "manifest.json.sha256"
    assert sidecar.read_text().endswith("  manifest.json\n")
    path.write_text(path.read_text().replace('"eos_token_id": 1', '"eos_token_id": 0'))
    with pytest.raises(BtkError, match=r"manifest.json does not match manifest.json.sha256"):
        read_manifest(tmp_path / "ds")
    sidecar.unlink()  # the edit does not get through by deleting the checksum: the manifest says it has one
    with pytest.raises(BtkError, match=r"manifest.json.sha256 is missing, and manifest.json was written with it"):
        read_manifest(tmp_path / "ds")


def test_a_manifest_written_before_the_sidecar_existed_is_still_read(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(10))], tok_path, tmp_path / "ds", shard_tokens=40)
    path = tmp_path / "ds" / "manifest.json"
    legacy = {key: value for key, value in json.loads(path.read_text()).items() if key != "checksum_file"}
    path.write_text(json.dumps(legacy))
    (tmp_path / "ds" / "manifest.json.sha256").unlink()
    assert read_manifest(tmp_path / "ds").checksum_file == ""
    verify_dataset(tmp_path / "ds")


SIDECARS: dict[str, bytes | None] = {
    "not UTF-8": b"\xff\xfe" * 40 + b"  manifest.json\n",
    "empty": b"",
    "a short digest": b"abc  manifest.json\n",
    "NUL bytes": b"\x00" * 64,
    "larger than a checksum line": b"a" * 10_000,
    "a directory": None,
}


@pytest.mark.parametrize("content", SIDECARS.values(), ids=SIDECARS.keys())
def test_a_sidecar_that_is_not_a_checksum_line_is_one_line(tmp_path: Path, content: bytes | None) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(10))], tok_path, tmp_path / "ds", shard_tokens=40)
    sidecar = tmp_path / "ds" / "manifest.json.sha256"
    sidecar.unlink()
    if content is None:
        sidecar.mkdir()
    else:
        sidecar.write_bytes(content)
    with pytest.raises(BtkError, match=r"^dataset .*: manifest\.json\.sha256: [^\n]+$"):
        read_manifest(tmp_path / "ds")


def test_unreadable_dataset_files_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read permission refused by injection (the tests may run as root): manifest, sidecar, a shard."""
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(10))], tok_path, tmp_path / "ds", shard_tokens=40)
    real_read_bytes, real_open = Path.read_bytes, Path.open
    denied: set[str] = set()

    def read_bytes(self: Path) -> bytes:
        if self.name in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_bytes(self)

    def open_(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name in denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "open", open_)
    for name in ("manifest.json", "manifest.json.sha256", "shard_00000.bin"):
        denied.clear()
        denied.add(name)
        with pytest.raises(BtkError, match=rf"^dataset .*{name}: cannot be read \(Permission denied\)$|"
                                           rf"^dataset .*shard {name} cannot be read \(Permission denied\)$"):
            verify_dataset(tmp_path / "ds")


def test_a_shard_shorter_than_its_manifest_is_one_line_when_read(tmp_path: Path) -> None:
    """Without verification (``verify="none"``) an emptied shard reaches the reads: one line, not garbage tokens."""
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(10))], tok_path, tmp_path / "ds", shard_tokens=40)
    (tmp_path / "ds" / "shard_00000.bin").write_bytes(b"")
    shards = TokenShards(tmp_path / "ds", seq_len=8, verify="none")
    with pytest.raises(BtkError, match=r"^dataset .*: shard shard_00000.bin is shorter than its manifest says"):
        shards.window(0)


def test_tokenize_refuses_a_tokenizer_larger_than_the_model(tmp_path: Path) -> None:
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    docs = write_jsonl(tmp_path / "a.jsonl", _docs(5))
    with pytest.raises(BtkError, match=r"has \d+ ids, the model's vocabulary \(--vocab-size\) only 4"):
        tokenize_to_shards([docs], tok_path, tmp_path / "ds", model_vocab_size=4)
    assert tokenize_main(["--input", str(docs), "--tokenizer", str(tok_path), "--output", str(tmp_path / "o"),
                          "--vocab-size", "4"]) == 2
    tokenize_to_shards([docs], tok_path, tmp_path / "ok", model_vocab_size=128)


def _hashed_shards(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the shards read for their checksum from now on."""
    import btk.shards

    hashed: list[str] = []
    scan = btk.shards.scan_shard

    def counting(path: Path, dtype: Any) -> tuple[str, int]:
        hashed.append(path.name)
        return scan(path, dtype)

    monkeypatch.setattr(btk.shards, "scan_shard", counting)
    return hashed


@pytest.mark.usefixtures("one_rank")
def test_a_restart_reads_no_unchanged_shard_and_hashes_a_changed_one_before_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start hashes every shard and records them; a restart hashes none; a shard rewritten since (same
    size, its modification time even set back) is hashed again and refused; a restaged good copy is accepted."""

    import torch.distributed as dist

    dist.init_process_group("gloo")
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(60))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    record = tmp_path / "ckpt" / "dataset_verified.json"
    hashed = _hashed_shards(monkeypatch)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert sorted(hashed) == sorted(shard.file for shard in manifest.shards) and record.is_file()
    hashed.clear()
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert hashed == []

    target = tmp_path / "ds" / "shard_00002.bin"
    good = target.read_bytes()
    _flip_a_bit_keeping_size_and_mtime(target)  # modification time set back: the change time still moves
    with pytest.raises(BtkError, match=r"shard_00002.bin fails its sha256"):
        TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert hashed == ["shard_00002.bin"]
    hashed.clear()
    with pytest.raises(BtkError, match=r"shard_00002.bin fails its sha256"):  # refused until it is fixed
        TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    target.write_bytes(good)
    hashed.clear()
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert hashed == ["shard_00002.bin"]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("record_text", ["", "not json", '{"version": 1}', "\x00\xff", "[]"])
def test_a_record_that_cannot_be_trusted_means_everything_is_hashed(
    record_text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(30))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    record = tmp_path / "dataset_verified.json"
    record.write_text(record_text)
    hashed = _hashed_shards(monkeypatch)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert len(hashed) == len(manifest.shards)


@pytest.mark.usefixtures("one_rank")
def test_a_new_dataset_version_is_hashed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-tokenized data (another manifest) in the same place: the record of the old version vouches for nothing."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(30))], tok_path, tmp_path / "ds", shard_tokens=40)
    record = tmp_path / "dataset_verified.json"
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "b.jsonl", _docs(30, seed=1))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    hashed = _hashed_shards(monkeypatch)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert len(hashed) == len(manifest.shards)


def _flip_a_bit_keeping_size_and_mtime(target: Path) -> None:
    import os

    good = target.read_bytes()
    before = target.stat()
    target.write_bytes(bytes([good[0] ^ 0x01]) + good[1:])
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # only the change time moves


@pytest.mark.usefixtures("one_rank")
def test_a_new_execution_on_an_unchanged_dataset_hashes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The record lives beside the shards, keyed by the dataset version: a job with another checkpoint directory
    (a new pipeline execution), or none, finds it; a shard changed since is still hashed and refused before it is
    read."""
    import torch.distributed as dist

    from btk.shards import DATASET_RECORDS_DIR, dataset_record_path

    dist.init_process_group("gloo")
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(60))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    hashed = _hashed_shards(monkeypatch)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=tmp_path / "execution-1" / VERIFIED_RECORD_NAME)
    assert len(hashed) == len(manifest.shards)
    beside = dataset_record_path(tmp_path / "ds", manifest)
    assert [path.name for path in (tmp_path / "ds" / DATASET_RECORDS_DIR).iterdir()] == [beside.name]  # no temp left
    hashed.clear()
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=tmp_path / "execution-2" / VERIFIED_RECORD_NAME)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=None)
    assert hashed == []
    assert f"0 of {len(manifest.shards)} shards verified" in capsys.readouterr().out

    _flip_a_bit_keeping_size_and_mtime(tmp_path / "ds" / "shard_00001.bin")
    with pytest.raises(BtkError, match=r"shard_00001.bin fails its sha256"):
        TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=tmp_path / "execution-3" / VERIFIED_RECORD_NAME)
    assert hashed == ["shard_00001.bin"]


@pytest.mark.usefixtures("one_rank")
def test_a_read_only_dataset_directory_leaves_the_record_to_the_checkpoint_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An S3 channel cannot be written: one warning line says so and what it costs; a restart (same checkpoint
    directory) still hashes nothing, a new execution hashes everything again, and the job runs either way."""
    import errno

    import btk_trainer.data
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tok_path = make_tokenizer(tmp_path / "tokenizer.json")
    manifest = tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", _docs(30))], tok_path, tmp_path / "ds",
                                  shard_tokens=40)
    write = btk_trainer.data.write_verification_record

    def read_only_dataset(path: Path, directory: Path, manifest: Any) -> None:
        if path.is_relative_to(tmp_path / "ds"):
            raise OSError(errno.EROFS, "Read-only file system")
        write(path, directory, manifest)

    monkeypatch.setattr(btk_trainer.data, "write_verification_record", read_only_dataset)
    record = tmp_path / "ckpt" / VERIFIED_RECORD_NAME
    hashed = _hashed_shards(monkeypatch)
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "Read-only file system" in warnings[0]
    assert warnings[0].endswith("a new execution hashes the shards again") and record.is_file()
    hashed.clear()
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=record)
    assert hashed == []
    TokenShards(tmp_path / "ds", seq_len=8, verify="ranks", record=tmp_path / "other" / VERIFIED_RECORD_NAME)
    assert len(hashed) == len(manifest.shards)


class _RecordingWindows:
    """Synthetic windows that remember which thread read each."""

    eos_token_id = 12  # windows are arange(index, index + 9): window i ends a document where 12 falls

    def __init__(self, count: int) -> None:
        self.count, self.readers = count, []  # type: list[str]

    def __len__(self) -> int:
        return self.count

    def window(self, index: int) -> np.ndarray[Any, Any]:
        import threading

        self.readers.append(threading.current_thread().name)
        return np.arange(index, index + 9, dtype=np.int64)


def test_the_loader_reads_ahead_in_the_background_and_gives_the_samplers_batches() -> None:
    """Across epochs, a rewound step (a stop) and a restored state (a resume), the loader gives exactly what reading
    each batch when needed gives; after the first, every batch was read by the loader's thread."""
    from btk_trainer.data import BatchLoader

    def sampler() -> ResumableSampler:
        return ResumableSampler(40, micro_batch_size=3, dp_rank=1, dp_size=2, seed=5)

    windows, plain_windows = _RecordingWindows(40), _RecordingWindows(40)
    loaded, plain = sampler(), sampler()
    loader = BatchLoader(windows, loaded, torch.device("cpu"), ahead=2)
    try:
        for step in range(14):  # 6 micro-batches per epoch: crosses two epoch boundaries
            if step == 9:
                rewind = loaded.state_dict()
            if step == 11:  # a dropped step: the sampler goes back, the batches read ahead are not used
                loaded.load_state_dict(rewind)
                plain.load_state_dict(rewind)
            got = loader.next()
            expected = next_batch(plain_windows, plain, torch.device("cpu"))
            for mine, reference in zip(got, expected, strict=True):
                assert torch.equal(mine, reference), step
    finally:
        loader.close()
    first_read = windows.readers[:3]
    assert first_read == ["MainThread"] * 3
    background = [name for name in windows.readers[3:] if name != "MainThread"]
    assert background and all(name.startswith("btk-data") for name in background)
    # Only the first batch and the first after the rewind were read on the training thread.
    assert windows.readers.count("MainThread") == 6
