"""2-process gloo runs of a tiny profile (CPU): the trainer's distributed behaviour.

Each scenario runs in one spawned process group (tests/trainer/dist_worker.py) and is
checked here. Tolerances: fp32 gradients within 1e-6 absolute (activation checkpointing
recomputes the same ops; accumulation and TP only reorder sums).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from btk_trainer.tokenize import tokenize_to_shards
from test_data import WORDS, make_tokenizer, write_jsonl

WORKER = Path(__file__).with_name("dist_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    docs = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 40  # learnable rotations
    tokenize_to_shards([write_jsonl(root / "a.jsonl", docs)], make_tokenizer(root / "tok.json"), root / "ds",
                       shard_tokens=4000)
    return root / "ds"


def run_scenario(name: str, workdir: Path, dataset: Path, seed: int = 0) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, str(WORKER), name, str(workdir), str(dataset), "2", str(seed)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    result["stdout"] = completed.stdout
    return result


@pytest.fixture(scope="module")
def core(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_scenario("core", tmp_path_factory.mktemp("core"), dataset)


def test_loss_falls(core: dict[str, Any]) -> None:
    losses = core["losses"]
    assert len(losses) == 25
    assert losses[0] > 4.0  # about ln(vocab) at initialisation
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


def test_metric_lines_parse(core: dict[str, Any]) -> None:
    from btk.metrics import parse_metric_line

    parsed = [parse_metric_line(line) for line in core["stdout"].splitlines() if line.startswith("btk_metric")]
    assert [p["step"] for p in parsed if p] == list(range(1, 26))
    assert all(p and p["tokens_per_second_per_gpu"] > 0 and p["mfu"] == 0.0 for p in parsed)


def test_parameters_are_sharded(core: dict[str, Any]) -> None:
    assert core["sharded"] is True


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_keeps_gradients(core: dict[str, Any], mode: str) -> None:
    assert core["ac"][mode]["max_abs_diff"] <= 1e-6
    assert core["ac"][mode]["loss_diff"] <= 1e-6


def test_gradient_accumulation_matches_one_big_batch(core: dict[str, Any]) -> None:
    accumulation = core["accumulation"]
    assert accumulation["max_abs_grad"] > 1e-3  # gradients are not trivially zero
    assert accumulation["max_abs_diff"] <= 1e-6
    assert accumulation["loss_diff"] <= 1e-6


def test_tensor_parallel_matches_data_parallel(core: dict[str, Any]) -> None:
    assert core["tensor_parallel"]["max_abs_diff"] <= 1e-6
    assert core["tensor_parallel"]["loss_diff"] <= 1e-6


@pytest.mark.parametrize("seed", [1])
def test_sigterm_and_resume_is_bit_identical(dataset: Path, tmp_path: Path, seed: int) -> None:
    result = run_scenario("resume", tmp_path, dataset, seed)
    assert len(result["runs"]) == 3
    for run in result["runs"]:
        assert run["interrupted"] and run["first_steps"] == run["stop"]
        assert run["resumed_from"] == run["stop"] and run["steps"] == 8
        assert run["bit_identical"], run
        assert run["exported"] == ["config.json", "model.safetensors"]
        # Saved every 3 steps and at the SIGTERM; only the newest two are kept.
        assert run["kept"] == sorted({3, 6, run["stop"]})[-2:]
        for step, loss in run["losses_after"].items():
            assert loss == result["straight_losses"][step]


def test_init_from_hugging_face_loads_into_sharded_model(core: dict[str, Any]) -> None:
    """A tied Qwen2-style safetensors checkpoint: rank 0 reads it, every shard gets its part."""
    assert core["init_from"] == {"tied": True, "keys_match": True, "equal": True}
