"""The image's SageMaker entrypoint: read the job's config, validate it, launch torchrun.

SageMaker starts the container as ``<entrypoint> train`` on every node. This module:

1. reads ``resourceconfig.json`` (``current_host``, ``hosts``, ``network_interface_name``) and
   ``hyperparameters.json`` from the config directory (``/opt/ml/input/config``; override with
   ``--config-dir`` or ``BTK_CONFIG_DIR``), and the ``SM_*`` environment where present;
2. parses the hyperparameters with :func:`btk.hyperparameters.from_hyperparameters` and checks
   the parallel layout, so a malformed job fails with one line (stderr and
   ``/opt/ml/output/failure``) and exit code 2 *before any GPU work*;
3. decides whether the training processes need CUDA's forward-compatibility driver library
   (:mod:`btk_trainer.cuda_compat`: exactly when the host's driver is older than the image's
   CUDA needs) and prints the decision;
4. on a multi-node job, runs the network pre-flight (:mod:`btk_trainer.preflight`): EFA devices
   present and NCCL on EFA rather than TCP sockets, else one line and exit 2 within minutes; an
   all-reduce bandwidth below what the catalog expects of the instance type is a warning;
5. runs ``torchrun`` with ``nnodes`` = hosts, ``node_rank`` = this host's index in the sorted
   hosts, master = the first sorted host, one process per GPU, and forwards SIGTERM straight to
   the training processes so they can checkpoint (see :mod:`btk_trainer.train`), and exits
   with torchrun's status (0 only when every training process exited 0).

The training processes get the instance type's NCCL/EFA settings from the hardware catalog
(``btk.hardware``, ``network_environment``), not from the image. ``--dry-run`` prints the
commands and environment as JSON instead of running them; ``--skip-preflight`` skips step 4.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from btk.errors import BtkError
from btk.hyperparameters import JobHyperparameters
from btk_trainer.cuda_compat import CompatDecision, node_decision
from btk_trainer.ladder import DEFAULT_LADDER_STATE, LADDER_STATE_ENV
from btk_trainer.launch import (
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_CONFIG_DIR,
    DEFAULT_DATA_ROOT,
    DEFAULT_FAILURE_FILE,
    DEFAULT_MASTER_PORT,
    DEFAULT_MODEL_DIR,
    TRAIN_CHANNEL,
    gpus_per_node,
    job_instance,
    load_hyperparameters,
    process_environment,
    read_cluster,
    report_failure,
    torchrun_node_args,
)
from btk_trainer.layout import mesh_shape
from btk_trainer.preflight import PreflightError, PreflightPlan, node_preflight_plan, run_preflight


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: the torchrun command line and the extra environment."""

    command: list[str]
    env: dict[str, str]
    spec: JobHyperparameters
    preflight: PreflightPlan | None = None
    compat: CompatDecision | None = None


def build_launch(
    config_dir: Path,
    env: Mapping[str, str],
    *,
    data_dir: Path | None = None,
    synthetic_data: bool = False,
    master_port: int = DEFAULT_MASTER_PORT,
    failure_file: Path = DEFAULT_FAILURE_FILE,
    compat: CompatDecision | None = None,
) -> LaunchPlan:
    """Validate the job and build the torchrun command; raises BtkError with one line.

    ``compat`` (default: decided from this node's driver and the image's compat library) says
    whether the training processes load CUDA's forward-compatibility driver library.
    """
    cluster = read_cluster(config_dir)
    hyperparameters_file = config_dir / "hyperparameters.json"
    spec = load_hyperparameters(hyperparameters_file)
    nproc = gpus_per_node(env)
    mesh_shape(cluster.nnodes * nproc, cluster.nnodes, spec.knobs)  # layout errors now, not on the GPUs

    if synthetic_data:
        data: Path | None = None
    else:
        data = data_dir or Path(env.get("SM_CHANNEL_TRAIN", str(DEFAULT_DATA_ROOT / TRAIN_CHANNEL)))
        if not data.is_dir():
            raise BtkError(f"training data channel {data} does not exist; add a '{TRAIN_CHANNEL}' channel "
                           "(FSx or S3) to the job, or pass --synthetic-data for a benchmark")
    model_dir = Path(env.get("SM_MODEL_DIR", str(DEFAULT_MODEL_DIR)))
    checkpoint_dir = Path(env.get("BTK_CHECKPOINT_DIR", str(DEFAULT_CHECKPOINT_DIR)))

    # One restart per rung of the knob ladder below the one the job starts on (job.start_rung), on one node
    # (btk_trainer.ladder): torchrun restarts the node's processes on the next rung after one runs out of memory
    # before the first checkpoint.
    ladder = spec.job.knob_ladder
    restarts = len(ladder.rungs) - spec.job.start_rung if ladder is not None and cluster.nnodes == 1 else 0
    command = [
        sys.executable, "-m", "torch.distributed.run",
        *torchrun_node_args(cluster, nproc, master_port),
        *([f"--max-restarts={restarts}"] if restarts else []),
        "-m", "btk_trainer.train",
        f"--hyperparameters={hyperparameters_file}",
        f"--checkpoint-dir={checkpoint_dir}",
        f"--model-dir={model_dir}",
        f"--nnodes={cluster.nnodes}",
        f"--failure-file={failure_file}",
        f"--ladder-state={env.get(LADDER_STATE_ENV, str(DEFAULT_LADDER_STATE))}",
    ]
    if data is not None:
        command.append(f"--data-dir={data}")
    instance = job_instance(cluster, env)
    compat = node_decision() if compat is None else compat
    extra_env = process_environment(cluster, instance, {**os.environ, **env}, compat)
    preflight = node_preflight_plan(cluster, nproc, instance, {**os.environ, **env, **extra_env}, master_port)
    return LaunchPlan(command=command, env=extra_env, spec=spec, preflight=preflight, compat=compat)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` from /proc (stdlib only)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def run(plan: LaunchPlan) -> int:
    """Run torchrun and return its exit status: 0 when every training process exited 0.

    SIGTERM goes to the training processes (they checkpoint), not to torchrun, whose own
    SIGTERM path would kill them after a fixed 30 s grace. torchrun killed by a signal
    returns 128 + the signal number, as a shell reports it, not Popen's negative number.
    """
    env = {**os.environ, **plan.env}
    pending: list[int] = []
    launcher: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        if launcher is None:  # before torchrun started: pass it on once it has
            pending.append(signum)
            return
        workers = _children(launcher.pid)
        for pid in workers or [launcher.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = signal.signal(signal.SIGTERM, forward)  # before Popen: an early stop must not kill this process
    try:
        launcher = subprocess.Popen(plan.command, env=env)
        if pending:
            forward(pending[0], None)
        status = launcher.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - status if status < 0 else status


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="btk-train", description="SageMaker entrypoint of the btk training image")
    parser.add_argument("mode", nargs="?", default="train", choices=["train"], help="SageMaker passes 'train'")
    parser.add_argument("--config-dir", type=Path, default=Path(env.get("BTK_CONFIG_DIR", str(DEFAULT_CONFIG_DIR))))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--synthetic-data", action="store_true", help="train on random tokens (benchmarks)")
    parser.add_argument("--master-port", type=int, default=int(env.get("BTK_MASTER_PORT", DEFAULT_MASTER_PORT)))
    parser.add_argument("--failure-file", type=Path,
                        default=Path(env.get("BTK_FAILURE_FILE", str(DEFAULT_FAILURE_FILE))))
    parser.add_argument("--dry-run", action="store_true", help="print the launch as JSON and exit")
    parser.add_argument("--skip-preflight", action="store_true",
                        help="do not run the network pre-flight of a multi-node job (debugging only)")
    args = parser.parse_args(argv)
    try:
        plan = build_launch(args.config_dir, env, data_dir=args.data_dir, synthetic_data=args.synthetic_data,
                            master_port=args.master_port, failure_file=args.failure_file)
    except BtkError as error:
        return report_failure(str(error), args.failure_file)
    if args.dry_run:
        preflight = plan.preflight.command if plan.preflight is not None else None
        compat = plan.compat.line() if plan.compat is not None else None
        print(json.dumps({"command": plan.command, "env": plan.env, "preflight": preflight, "cuda_compat": compat},
                         indent=2))
        return 0
    if plan.compat is not None:
        print(plan.compat.line(), flush=True)
    if plan.preflight is not None and not args.skip_preflight:
        try:
            run_preflight(plan.preflight)
        except PreflightError as error:
            return report_failure(str(error), args.failure_file)
    return run(plan)


if __name__ == "__main__":
    raise SystemExit(main())
