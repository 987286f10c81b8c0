"""Two gloo ranks train with the disk full on rank 1 only while step 4 is saved; run as a script.

    python tests/trainer/checkpoint_fault_worker.py PHASE WORKDIR

PHASE is one of :data:`checkpoint_faults.PHASES`. Each rank writes what ended its run (the error's
one line, or ``finished``) to ``WORKDIR/rank<r>.txt``; the checkpoints are under ``WORKDIR/ckpt``.
Rank 1 also reads 3 GiB less free space than rank 0, as when something writes to the file system
between the two ranks' readings.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, outside pytest: its pythonpath setting does not reach this process.
sys.path[:0] = [str(HERE.parents[1] / "containers"), str(HERE.parents[1]), str(HERE)]

import pytest  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from checkpoint_faults import fill_disk  # noqa: E402
from dist_worker import free_port  # noqa: E402
from trainer_fixtures import RANK_START_METHOD, tiny_spec  # noqa: E402

from btk.errors import BtkError  # noqa: E402


def _rank(rank: int, port: int, phase: str, workdir: str) -> None:
    from btk_trainer.train import RunConfig, train

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    # A rank left waiting in a collective gives up after a minute instead of hanging the test.
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    spec = tiny_spec(job={"checkpoint_interval_steps": 2})
    with pytest.MonkeyPatch.context() as monkeypatch:
        if rank == 1:
            fill_disk(monkeypatch, phase, ".step_00000004.tmp")
            usage = shutil.disk_usage

            def less_free(path: str) -> tuple[int, int, int]:
                found = usage(path)
                return found._replace(free=found.free - (3 << 30))

            monkeypatch.setattr(shutil, "disk_usage", less_free)
        try:
            train(RunConfig(spec=spec, max_steps=6, device="cpu", checkpoint_dir=Path(workdir) / "ckpt"))
            outcome = "finished"
        except BtkError as error:
            outcome = str(error)
        finally:
            dist.destroy_process_group()
    (Path(workdir) / f"rank{rank}.txt").write_text(outcome)


if __name__ == "__main__":
    phase_name, work = sys.argv[1], sys.argv[2]
    mp.start_processes(_rank, args=(free_port(), phase_name, work), nprocs=2, start_method=RANK_START_METHOD)
