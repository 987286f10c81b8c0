"""Time the training thread spends agreeing on a stop, per optimizer step, at 2, 4 and 8 gloo ranks.

Run: ``.venv/bin/python benchmarks/stop_agreement.py [--ranks 2 4 8] [--steps 20] [--micro-batches 16]``.

Each rank runs the trainer's stop protocol around a stand-in micro-batch on one gloo process
group, the way ``btk_trainer.train`` does: ``--work-ms`` of sleep by default (on a GPU the
training thread mostly waits while the device computes, and sleeping ranks do not compete for
this machine's cores), or of matrix products with ``--busy``:

* ``blocking``: a blocking MAX all-reduce before every micro-batch after the first and one
  after the step (what the trainer did before :meth:`StopAgreement.poll`);
* ``poll``: :meth:`StopAgreement.poll` before those micro-batches (post this one, read the
  previous) and one blocking :meth:`StopAgreement.agree` after the step.

It prints, per rank count and mode, the median over ranks of the seconds per step spent inside
the agreement calls. On a 2-core machine 8 ranks share 2 cores, so absolute times include
scheduling; the comparison between the modes on the same machine is the figure to read.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))

from btk_trainer.stopping import StopAgreement, StopFlag


def _work(milliseconds: float, busy: bool) -> None:
    if not busy:
        time.sleep(milliseconds / 1000)
        return
    a = torch.ones(64, 64)
    end = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < end:
        a = (a @ a).clamp_(max=1.0)


def _rank(rank: int, world: int, port: int, mode: str, steps: int, micro_batches: int, work_ms: float,
          busy: bool, results: dict[tuple[str, int, int], float]) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    agreement = StopAgreement(torch.device("cpu"))
    flag = StopFlag()
    in_agreement = 0.0
    for _ in range(steps):
        for micro in range(micro_batches):
            if micro:
                started = time.perf_counter()
                if mode == "blocking":
                    agreement.agree(flag)
                else:
                    agreement.poll(flag)
                in_agreement += time.perf_counter() - started
            _work(work_ms, busy)
        started = time.perf_counter()
        agreement.agree(flag)
        in_agreement += time.perf_counter() - started
    agreement.close()
    results[(mode, world, rank)] = in_agreement / steps
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--busy", action="store_true", help="compute instead of sleeping (ranks share the cores)")
    args = parser.parse_args()
    manager = mp.Manager()
    results = manager.dict()
    print(f"{args.steps} steps x {args.micro_batches} micro-batches of {args.work_ms:.0f} ms "
          f"{'computing' if args.busy else 'sleeping'}, "
          f"{os.cpu_count()} CPUs: ms per step the training thread spends agreeing (median over ranks)")
    print(f"{'ranks':>5}  {'blocking':>9}  {'poll':>9}")
    for world in args.ranks:
        row = []
        for mode in ("blocking", "poll"):
            mp.start_processes(_rank, args=(world, _free_port(), mode, args.steps, args.micro_batches, args.work_ms,
                                            args.busy, results), nprocs=world, start_method="spawn")
            row.append(statistics.median(results[(mode, world, rank)] for rank in range(world)) * 1000)
        print(f"{world:>5}  {row[0]:>9.2f}  {row[1]:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
