"""The image's SageMaker entrypoint: read the job's config, validate it, launch torchrun.

SageMaker starts the container as ``<entrypoint> train`` on every node. This module:

1. reads ``resourceconfig.json`` (``current_host``, ``hosts``, ``network_interface_name``) and
   ``hyperparameters.json`` from the config directory (``/opt/ml/input/config``; override with
   ``--config-dir`` or ``BTK_CONFIG_DIR``), and the ``SM_*`` environment where present;
2. parses the hyperparameters with :func:`btk.hyperparameters.from_hyperparameters` and checks
   the parallel layout, so a malformed job fails with one line (stderr and
   ``/opt/ml/output/failure``) and exit code 2 *before any GPU work*;
3. on a multi-node job, runs the network pre-flight (:mod:`btk_trainer.preflight`): EFA devices
   present, NCCL on EFA rather than TCP sockets, all-reduce bandwidth above the catalog's
   threshold for the instance type, else one line and exit 2 within minutes;
4. runs ``torchrun`` with ``nnodes`` = hosts, ``node_rank`` = this host's index in the sorted
   hosts, master = the first sorted host, one process per GPU, and forwards SIGTERM straight to
   the training processes so they can checkpoint (see :mod:`btk_trainer.train`), and exits
   with torchrun's status (0 only when every training process exited 0).

The training processes get the instance type's NCCL/EFA settings from the hardware catalog
(``btk.hardware``, ``network_environment``), not from the image. ``--dry-run`` prints the
commands and environment as JSON instead of running them; ``--skip-preflight`` skips step 3.
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
from typing import Any

from btk.errors import BtkError, UnknownNameError
from btk.hardware import InstanceType, get_instance_type
from btk.hyperparameters import JobHyperparameters, from_hyperparameters
from btk.jsonfile import read_json_file
from btk_trainer.layout import mesh_shape
from btk_trainer.preflight import PreflightError, PreflightPlan, preflight_plan, run_preflight

DEFAULT_CONFIG_DIR = Path("/opt/ml/input/config")
DEFAULT_DATA_ROOT = Path("/opt/ml/input/data")
DEFAULT_MODEL_DIR = Path("/opt/ml/model")
DEFAULT_CHECKPOINT_DIR = Path("/opt/ml/checkpoints")
DEFAULT_FAILURE_FILE = Path("/opt/ml/output/failure")
DEFAULT_MASTER_PORT = 29500
DEFAULT_PREFLIGHT_DIR = Path("/tmp/btk-preflight")
TRAIN_CHANNEL = "train"


@dataclass(frozen=True)
class ClusterConfig:
    """This node's view of the cluster, from ``resourceconfig.json``."""

    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str
    instance_type: str | None = None

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def master_addr(self) -> str:
        return self.hosts[0]


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: the torchrun command line and the extra environment."""

    command: list[str]
    env: dict[str, str]
    spec: JobHyperparameters
    preflight: PreflightPlan | None = None


def _read_json(path: Path, what: str) -> Any:
    if not path.exists():
        raise BtkError(f"{what} {path} not found; set --config-dir or BTK_CONFIG_DIR")
    return read_json_file(path, f"{what} {path}")


def read_cluster(config_dir: Path) -> ClusterConfig:
    data = _read_json(config_dir / "resourceconfig.json", "resourceconfig.json")
    hosts = data.get("hosts") if isinstance(data, dict) else None
    current = data.get("current_host") if isinstance(data, dict) else None
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise BtkError("resourceconfig.json: hosts must be a non-empty list of host names")
    if current not in hosts:
        raise BtkError(f"resourceconfig.json: current_host {current!r} is not in hosts {hosts}")
    return ClusterConfig(
        current_host=str(current),
        hosts=tuple(sorted(hosts)),
        network_interface_name=str(data.get("network_interface_name") or "eth0"),
        instance_type=str(data["current_instance_type"]) if data.get("current_instance_type") else None,
    )


def catalog_instance(name: str | None) -> InstanceType | None:
    """The catalog's entry for the job's instance type; None (no EFA checks) if unknown or unset."""
    if not name:
        return None
    try:
        return get_instance_type(name)
    except UnknownNameError:
        return None


def _unquote(value: object) -> str:
    """SageMaker SDKs sometimes JSON-encode string values (``'"bf16"'``): accept both forms."""
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            return text
        return decoded if isinstance(decoded, str) else text
    return text


def load_hyperparameters(path: Path) -> JobHyperparameters:
    """Parse a SageMaker ``hyperparameters.json``; one-line BtkError naming the bad key."""
    data = _read_json(path, "hyperparameters.json")
    if not isinstance(data, dict):
        raise BtkError("hyperparameters.json must hold a JSON object of name -> string")
    return from_hyperparameters({str(key): _unquote(value) for key, value in data.items()})


def gpus_per_node(env: Mapping[str, str]) -> int:
    """``SM_NUM_GPUS`` / ``BTK_NUM_GPUS`` if set, else the GPUs ``nvidia-smi`` lists (no CUDA init)."""
    for key in ("BTK_NUM_GPUS", "SM_NUM_GPUS"):
        if env.get(key):
            try:
                count = int(env[key])
            except ValueError:
                raise BtkError(f"{key}={env[key]!r} is not an integer") from None
            if count < 1:
                raise BtkError(f"{key} must be >= 1, got {count}")
            return count
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        raise BtkError("no GPUs found (nvidia-smi failed); set BTK_NUM_GPUS to run without it") from None
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    if count < 1:
        raise BtkError("nvidia-smi lists no GPUs")
    return count


def build_launch(
    config_dir: Path,
    env: Mapping[str, str],
    *,
    data_dir: Path | None = None,
    synthetic_data: bool = False,
    master_port: int = DEFAULT_MASTER_PORT,
    failure_file: Path = DEFAULT_FAILURE_FILE,
) -> LaunchPlan:
    """Validate the job and build the torchrun command; raises BtkError with one line."""
    cluster = read_cluster(config_dir)
    hyperparameters_file = config_dir / "hyperparameters.json"
    spec = load_hyperparameters(hyperparameters_file)
    nproc = gpus_per_node(env)
    nnodes = len(cluster.hosts)
    mesh_shape(nnodes * nproc, nnodes, spec.knobs)  # layout errors now, not on the GPUs

    if synthetic_data:
        data: Path | None = None
    else:
        data = data_dir or Path(env.get("SM_CHANNEL_TRAIN", str(DEFAULT_DATA_ROOT / TRAIN_CHANNEL)))
        if not data.is_dir():
            raise BtkError(f"training data channel {data} does not exist; add a '{TRAIN_CHANNEL}' channel "
                           "(FSx or S3) to the job, or pass --synthetic-data for a benchmark")
    model_dir = Path(env.get("SM_MODEL_DIR", str(DEFAULT_MODEL_DIR)))
    checkpoint_dir = Path(env.get("BTK_CHECKPOINT_DIR", str(DEFAULT_CHECKPOINT_DIR)))

    def torchrun_args(port: int) -> list[str]:
        return [f"--nnodes={nnodes}", f"--node_rank={cluster.node_rank}", f"--nproc_per_node={nproc}",
                f"--master_addr={cluster.master_addr}", f"--master_port={port}"]

    command = [
        sys.executable, "-m", "torch.distributed.run",
        *torchrun_args(master_port),
        "-m", "btk_trainer.train",
        f"--hyperparameters={hyperparameters_file}",
        f"--checkpoint-dir={checkpoint_dir}",
        f"--model-dir={model_dir}",
        f"--nnodes={nnodes}",
        f"--failure-file={failure_file}",
    ]
    if data is not None:
        command.append(f"--data-dir={data}")
    instance = catalog_instance(cluster.instance_type or env.get("SM_CURRENT_INSTANCE_TYPE"))
    extra_env = {
        **(instance.network_environment if instance is not None else {}),
        "NCCL_SOCKET_IFNAME": cluster.network_interface_name,
        "GLOO_SOCKET_IFNAME": cluster.network_interface_name,
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "8"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    preflight = None
    if nnodes > 1:  # one port above the trainer's: its rendezvous follows right after
        preflight = preflight_plan(torchrun_args(master_port + 1), {**os.environ, **env, **extra_env},
                                   DEFAULT_PREFLIGHT_DIR, instance, nnodes)
    return LaunchPlan(command=command, env=extra_env, spec=spec, preflight=preflight)


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


def report_failure(message: str, failure_file: Path | None) -> int:
    """Print ``btk: error: <message>`` as one stderr line and into ``failure_file`` (SageMaker's
    failure reason) when given; returns the exit status of a user error, 2."""
    line = f"btk: error: {message}"
    print(line, file=sys.stderr, flush=True)
    if failure_file is not None:
        try:
            failure_file.parent.mkdir(parents=True, exist_ok=True)
            failure_file.write_text(line + "\n")
        except OSError:
            pass
    return 2


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
        print(json.dumps({"command": plan.command, "env": plan.env, "preflight": preflight}, indent=2))
        return 0
    if plan.preflight is not None and not args.skip_preflight:
        try:
            run_preflight(plan.preflight)
        except PreflightError as error:
            return report_failure(str(error), args.failure_file)
    return run(plan)


if __name__ == "__main__":
    raise SystemExit(main())
