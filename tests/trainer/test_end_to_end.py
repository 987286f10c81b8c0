"""The real launch path on CPU: entrypoint -> torchrun (2 processes, gloo) -> trainer.

A SIGTERM sent to the entrypoint (as SageMaker's stop or a spot reclaim does) reaches the
training processes, which write a checkpoint and exit 0; the next launch resumes from it and
exports the Hugging Face model. An out-of-memory on one rank before the first checkpoint (injected
by ``out_of_memory_hook/sitecustomize.py``) makes torchrun restart the node on the knob ladder's
next rung.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from btk_trainer.checkpoint import complete_checkpoints
from btk_trainer.tokenize import tokenize_to_shards
from test_data import WORDS, make_tokenizer, write_jsonl
from trainer_fixtures import tiny_llama

from btk.hyperparameters import JobHyperparameters, JobSettings, KnobLadder, to_hyperparameters
from btk.knobs import TrainingKnobs
from btk.profile import TrainingIntent

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _config(directory: Path, max_steps: int, ladder: KnobLadder | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = JobHyperparameters(
        knobs=TrainingKnobs(micro_batch_size=2, seq_len=32, compile=False, fused_loss=False),
        architecture=tiny_llama(),
        training=TrainingIntent(seq_len=32, global_batch_tokens=128, warmup_steps=2),
        job=JobSettings(profile="tiny", max_steps=max_steps, checkpoint_interval_steps=1000, log_interval_steps=1,
                        knob_ladder=ladder),
    )
    (directory / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(spec)))
    (directory / "resourceconfig.json").write_text(
        json.dumps({"current_host": "127.0.0.1", "hosts": ["127.0.0.1"], "network_interface_name": "lo"})
    )
    return directory


def _launch(tmp_path: Path, config: Path, data: Path, **extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        **extra,
        "PYTHONPATH": f"{extra.get('PYTHONPATH', '')}:{ROOT / 'containers'}:{ROOT}",
        "BTK_NUM_GPUS": "2",
        "SM_MODEL_DIR": str(tmp_path / "model"),
        "BTK_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "btk_trainer.entrypoint", "train", "--config-dir", str(config), "--data-dir", str(data),
         "--master-port", "29731", "--failure-file", str(tmp_path / "failure")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_sigterm_checkpoints_then_resume_exports(tmp_path: Path) -> None:
    docs = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 10
    data = tmp_path / "ds"
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", docs)], make_tokenizer(tmp_path / "tok.json"), data)

    first = _launch(tmp_path, _config(tmp_path / "config1", max_steps=100_000), data)
    assert first.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 180
    for line in first.stdout:
        lines.append(line)
        if line.startswith("btk_metric step=3 "):
            first.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(lines[-20:])
    rest, _ = first.communicate(timeout=180)
    output = "".join(lines) + rest
    assert first.returncode == 0, output[-3000:]
    assert "btk: SIGTERM: checkpoint at step" in output
    saved = complete_checkpoints(tmp_path / "checkpoints")
    assert len(saved) == 1 and saved[0][0] >= 3
    stopped_at = saved[0][0]
    assert not (tmp_path / "model").exists()

    second = _launch(tmp_path, _config(tmp_path / "config2", max_steps=stopped_at + 2), data)
    output2, _ = second.communicate(timeout=240)
    assert second.returncode == 0, output2[-3000:]
    assert f"resumed from {saved[0][1]} (step {stopped_at})" in output2
    steps = [line.split()[1] for line in output2.splitlines() if line.startswith("btk_metric step=")]
    assert steps == [f"step={stopped_at + 1}", f"step={stopped_at + 2}"]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    assert (tmp_path / "model" / "model.safetensors").stat().st_size > 0


def test_an_out_of_memory_on_one_rank_restarts_the_node_on_the_next_rung(tmp_path: Path) -> None:
    """Rank 1 runs out of memory in its first step on the plan's micro-batch of 2 while rank 0 waits for it in a
    collective: torchrun stops both and starts them again, both train on the ladder's rung (micro-batch 1, twice the
    accumulation), and the job exits 0 with the model exported."""
    docs = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 10
    data = tmp_path / "ds"
    tokenize_to_shards([write_jsonl(tmp_path / "a.jsonl", docs)], make_tokenizer(tmp_path / "tok.json"), data)
    rung = TrainingKnobs(micro_batch_size=1, gradient_accumulation_steps=2, seq_len=32, compile=False,
                         fused_loss=False)
    job = _launch(tmp_path, _config(tmp_path / "config", max_steps=3, ladder=KnobLadder(rungs=(rung,))), data,
                  PYTHONPATH=str(Path(__file__).with_name("out_of_memory_hook")), BTK_TEST_OUT_OF_MEMORY_RANK="1",
                  BTK_TEST_OUT_OF_MEMORY_ABOVE="1", BTK_LADDER_STATE=str(tmp_path / "ladder.json"))
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 0, output[-3000:]
    assert ("btk: out of memory before the first checkpoint on knob rung 0 of 1 (CUDA out of memory); restarting on "
            "rung 1: micro_batch_size=1 gradient_accumulation_steps=2") in output
    assert "btk: knob ladder rung 1 of 1 (the previous attempt: out of memory" in output
    assert "btk_metric knob_rung=1" in output.splitlines()  # the job's metrics say which knobs it trained
    steps = [line.split()[1] for line in output.splitlines() if line.startswith("btk_metric step=")]
    assert steps == ["step=1", "step=2", "step=3"]
    assert (tmp_path / "model" / "model.safetensors").stat().st_size > 0
