"""The stop path on CPU, scaled: SIGTERM with a background save in flight, to the trainer's exit.

Run: ``.venv/bin/python benchmarks/stop_save.py [--interval 4] [--gpu-seconds 3] [--workdir DIR]``.

The trainer's own ``train()`` (one gloo rank on the CPU) trains the Llama-shaped model of
``benchmarks/trainer_stalls.py`` (about 130M parameters: 1.6 GB of fp32 weights and AdamW moments),
checkpointing in the background every ``--interval`` steps, each step followed by ``--gpu-seconds`` of sleep
standing in for a GPU step. One step after a background save starts, the process gets a real SIGTERM, as
SageMaker's StopTrainingJob sends it; the trainer finishes the save in flight, then writes the stop's step
if its latest measured save says that fits the deadline (``Checkpointer.save_for_stop``). Printed: the
seconds from SIGTERM to ``train()``'s return, the state written, the step a restart resumes from, and,
scaled, the rate that path achieved (state over seconds: a lower bound of the disk's, since it includes the
save in flight) and the largest model whose stop save would fit SageMaker's 110 s on one node of this disk
(``btk.planner.stop_save``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from trainer_stalls import CHECKPOINT_ARCH, _one_rank, _spec

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "containers"), str(REPO)]

GIB = 1024**3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=int, default=4, help="steps between background saves")
    parser.add_argument("--gpu-seconds", type=float, default=3.0, help="sleep after each step (a GPU step)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from btk_trainer.train import RunConfig, train

    from btk.planner.stop_save import StopSave

    _one_rank()
    spec = _spec(CHECKPOINT_ARCH, interval=args.interval, seq_len=16)
    parameters = spec.architecture.parameter_count
    sent: dict[str, float] = {}

    def step_end(step: int) -> None:
        time.sleep(args.gpu_seconds)
        if step == args.interval + 1:  # the background save of step `interval` is being written
            sent["at"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGTERM)

    with tempfile.TemporaryDirectory(dir=args.workdir) as directory:
        result = train(RunConfig(spec=spec, max_steps=4 * args.interval, device="cpu",
                                 checkpoint_dir=Path(directory) / "ckpt", on_step_end=step_end))
    seconds = time.perf_counter() - sent["at"]
    save = StopSave(parameters, 1)
    rate = save.gib_per_node / seconds
    print(f"model: {parameters / 1e6:.0f}M parameters, {save.gib_per_node:.2f} GiB of fp32 weights and AdamW moments")
    print(f"SIGTERM after step {args.interval + 1} (the background save of step {args.interval} in flight) to "
          f"train()'s return: {seconds:.1f} s; steps done {result.steps_done}, a restart resumes from step "
          f"{result.saved_step}")
    print(f"scaled: {rate:.2f} GiB/s through the whole stop path; the largest model whose stop save fits "
          f"SageMaker's {save.seconds:.0f} s on one node at that rate: {save.largest_parameters(rate) / 1e9:.1f}B "
          f"parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
