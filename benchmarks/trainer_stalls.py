"""What the training thread waits for besides training, before and after the trainer's background work, on CPU.

Run: ``.venv/bin/python benchmarks/trainer_stalls.py [--before REV] [--only checkpoint restart agreement]``.

"before" is the trainer of git revision ``--before`` (default: the last one that hashed every file on the
training thread, staged checkpoints synchronously and verified the whole dataset at every start),
extracted from git into a temporary directory; "after" is this working tree's. Each measurement runs
the trainer's own ``train()`` in a fresh process (one gloo rank on the CPU), so both sides pay for the
same things:

* ``checkpoint``: the loop's stall per checkpoint save, i.e. the seconds ``Trainer.save`` and the
  wait before the next optimizer step took (the ``checkpoint`` phase of ``RunConfig.time_phases``),
  divided by the saves; a Llama-shaped model of about 130M parameters (1.6 GB of weights and
  AdamW moments, saved every ``--interval`` steps), each step followed by ``--gpu-seconds`` of
  sleep standing in for a GPU step, during which the host is idle. The interval must leave the
  background time to finish a save (here about 5 s for 1.6 GB: write and hash) as a real job's
  does (hundreds of steps); a shorter one measures the wait for the previous save instead;
* ``restart``: seconds from ``train()`` to the end of the first step of a restart (a checkpoint and,
  after, its dataset record exist) on a synthetic dataset of ``--dataset-gib`` GiB of uint16 tokens
  (written once to ``--workdir``, removed at the end; its files stay in the page cache, the best
  case for reading them again), and of its first start;
* ``agreement``: the host-collective time per optimizer step at 2, 4 and 8 gloo ranks
  (``benchmarks/stop_agreement.py``: a blocking all-reduce before every micro-batch, before, and
  the posted one, after).

On a 2-core machine shared with other work, absolute times carry noise; the before/after pairs ran
back to back on the same machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The trainer before its background checkpoint completion, dataset record and prefetching loader.
BEFORE = "86369c3"
GIB = 1024**3
SHARD_BYTES = 256 * 1024**2
CHECKPOINT_ARCH = {"num_layers": 6, "hidden_size": 1024, "num_attention_heads": 16, "num_kv_heads": 4,
                   "ffn_hidden_size": 2816, "vocab_size": 32000}
RESTART_ARCH = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
                "ffn_hidden_size": 96, "vocab_size": 128}


# --- the measured runs (in a child process, the trainer on sys.path as given) ---------------------------------


def _spec(arch: dict[str, Any], *, interval: int, seq_len: int) -> Any:
    from btk.hyperparameters import JobHyperparameters, JobSettings
    from btk.knobs import TrainingKnobs
    from btk.profile import ModelArchitecture, TrainingIntent

    architecture = ModelArchitecture(**arch, tied_embeddings=False, max_context=max(256, seq_len),
                                     attention_bias=False, rope_theta=500000.0)
    knobs = TrainingKnobs(micro_batch_size=1, seq_len=seq_len, compile=False, fused_loss=False)
    intent = TrainingIntent(seq_len=seq_len, global_batch_tokens=seq_len, learning_rate=1e-4, warmup_steps=1,
                            weight_decay=0.0, max_grad_norm=1.0)
    settings = JobSettings(profile="bench", seed=1, checkpoint_interval_steps=interval, keep_last_checkpoints=2,
                           log_interval_steps=1000)
    return JobHyperparameters(knobs=knobs, architecture=architecture, training=intent, job=settings)


def _one_rank() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def measure_checkpoint(workdir: Path, steps: int, interval: int, gpu_seconds: float) -> dict[str, float]:
    from btk_trainer.train import RunConfig, train

    _one_rank()
    spec = _spec(CHECKPOINT_ARCH, interval=interval, seq_len=16)
    result = train(RunConfig(spec=spec, max_steps=steps, device="cpu", checkpoint_dir=workdir / "ckpt",
                             time_phases=True, on_step_end=lambda step: time.sleep(gpu_seconds)))
    saves = len([step for step in range(1, steps + 1) if step % interval == 0])
    return {"stall_per_save": result.phase_seconds["checkpoint"] / saves, "saves": saves}


def measure_restart(dataset: Path, workdir: Path) -> dict[str, float]:
    """Seconds to the first step of a first start and of a restart, and of those in opening the dataset."""
    from btk_trainer import data
    from btk_trainer.train import RunConfig, train

    spec = _spec(RESTART_ARCH, interval=1, seq_len=8192)  # the planned sequence: 330k windows in 5 GiB
    seconds: dict[str, float] = {}
    opening = data.TokenShards.__init__

    def timed_opening(self: Any, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        opening(self, *args, **kwargs)
        seconds[f"{run} dataset"] = time.perf_counter() - started

    data.TokenShards.__init__ = timed_opening  # the trainer's own class, timed
    for run, steps in (("first start", 1), ("restart", 2)):
        _one_rank()
        started = time.perf_counter()

        def first_step(step: int, run: str = run, started: float = started) -> None:
            seconds.setdefault(run, time.perf_counter() - started)

        train(RunConfig(spec=spec, data_dir=dataset, max_steps=steps, device="cpu",
                        checkpoint_dir=workdir / "ckpt", on_step_end=first_step))
    return seconds


def child(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(args.trainer), str(REPO)]
    workdir = Path(args.workdir)
    if args.child == "checkpoint":
        figures = measure_checkpoint(workdir, args.steps, args.interval, args.gpu_seconds)
    else:
        figures = measure_restart(Path(args.dataset), workdir)
    print("RESULT " + json.dumps(figures), flush=True)


# --- the driver ----------------------------------------------------------------------------------------------


def trainer_at(revision: str, into: Path) -> Path:
    """``containers/`` of ``revision`` extracted under ``into``; the directory to put on sys.path."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "containers/btk_trainer"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "containers"


def run_child(kind: str, trainer: Path, workdir: Path, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", kind, "--trainer", str(trainer), "--workdir", str(workdir),
               "--steps", str(args.steps), "--interval", str(args.interval), "--gpu-seconds", str(args.gpu_seconds),
               "--dataset", str(args.dataset)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode != 0 or not lines:
        raise SystemExit(f"{kind} run failed:\n{completed.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(lines[-1].removeprefix("RESULT "))
    return figures


def write_dataset(directory: Path, gib: float) -> None:
    """Random uint16 tokens below the toy vocabulary, in shards of 256 MiB, with a checksummed manifest."""
    import numpy as np

    from btk.shards import ShardEntry, ShardManifest, shard_file_name, write_manifest

    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    shards: list[ShardEntry] = []
    remaining = int(gib * GIB)
    while remaining > 0:
        size = min(SHARD_BYTES, remaining)
        name = shard_file_name(len(shards))
        data = rng.integers(0, RESTART_ARCH["vocab_size"], size // 2, dtype=np.uint16).tobytes()
        (directory / name).write_bytes(data)
        shards.append(ShardEntry(file=name, num_tokens=size // 2, sha256=hashlib.sha256(data).hexdigest()))
        remaining -= size
    write_manifest(directory, ShardManifest(dtype="uint16", vocab_size=RESTART_ARCH["vocab_size"], eos_token_id=0,
                                            shards=tuple(shards)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"git revision of the 'before' trainer (default {BEFORE})")
    parser.add_argument("--only", nargs="+", default=["checkpoint", "restart", "agreement"],
                        choices=["checkpoint", "restart", "agreement"])
    parser.add_argument("--steps", type=int, default=12, help="checkpoint: steps per run")
    parser.add_argument("--interval", type=int, default=3, help="checkpoint: steps between saves")
    parser.add_argument("--gpu-seconds", type=float, default=3.0, help="checkpoint: idle host seconds per step")
    parser.add_argument("--dataset-gib", type=float, default=5.0)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--child", choices=["checkpoint", "restart"], help=argparse.SUPPRESS)
    parser.add_argument("--trainer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, default=Path(), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="btk-stalls-", dir=args.workdir) as scratch:
        root = Path(scratch)
        (root / "before").mkdir()
        trainers = {"before": trainer_at(args.before, root / "before"), "after": REPO / "containers"}
        print(f"before: trainer at {args.before}; after: this working tree; {os.cpu_count()} CPUs", flush=True)
        if "checkpoint" in args.only:
            print(f"\nloop stall per checkpoint save ({args.steps} steps of ~{args.gpu_seconds:.0f} s idle host, a "
                  f"save every {args.interval} steps, 130M-parameter model, 1.6 GB of state):", flush=True)
            for side, trainer in trainers.items():
                figures = run_child("checkpoint", trainer, root / f"ckpt-{side}", args)
                print(f"  {side:<7} {figures['stall_per_save']:7.3f} s per save ({figures['saves']:.0f} saves)",
                      flush=True)
        if "restart" in args.only:
            args.dataset = root / "dataset"
            started = time.perf_counter()
            write_dataset(args.dataset, args.dataset_gib)
            size = sum(path.stat().st_size for path in args.dataset.iterdir()) / GIB
            print(f"\ntime to the first step ({size:.2f} GiB synthetic dataset, written in "
                  f"{time.perf_counter() - started:.0f} s; page cache warm):", flush=True)
            for side, trainer in trainers.items():
                figures = run_child("restart", trainer, root / f"restart-{side}", args)
                print(f"  {side:<7} first start {figures['first start']:6.2f} s (dataset "
                      f"{figures['first start dataset']:5.2f} s)   restart {figures['restart']:6.2f} s (dataset "
                      f"{figures['restart dataset']:5.2f} s)", flush=True)
            shutil.rmtree(args.dataset)
        if "agreement" in args.only:
            print("\nhost-collective time per optimizer step (benchmarks/stop_agreement.py; before = blocking, "
                  "after = posted):", flush=True)
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "stop_agreement.py"), "--steps", "10"],
                           check=True)


if __name__ == "__main__":
    main()
