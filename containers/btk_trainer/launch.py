"""What every launcher of the image reads and reports: the job's config files, and its failures.

The entrypoint (which starts the trainer) and the network pre-flight (which can also run on its
own) both need the cluster (``resourceconfig.json``), the GPUs per node, the instance type's
catalog entry, torchrun's node arguments and the training processes' environment; both end a
failed job the same way (:func:`report_failure`). They live here so that the imports run one
way: ``entrypoint → preflight → launch`` and ``entrypoint → launch``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from btk.errors import BtkError, UnknownNameError
from btk.hardware import InstanceType, get_instance_type
from btk.hyperparameters import JobHyperparameters, from_hyperparameters
from btk.jsonfile import read_json_file
from btk_trainer.cuda_compat import CompatDecision, compat_environment

DEFAULT_CONFIG_DIR = Path("/opt/ml/input/config")
DEFAULT_DATA_ROOT = Path("/opt/ml/input/data")
DEFAULT_MODEL_DIR = Path("/opt/ml/model")
DEFAULT_CHECKPOINT_DIR = Path("/opt/ml/checkpoints")
DEFAULT_FAILURE_FILE = Path("/opt/ml/output/failure")
DEFAULT_MASTER_PORT = 29500
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

    @property
    def nnodes(self) -> int:
        return len(self.hosts)


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
    repeated = sorted(host for host, count in Counter(hosts).items() if count > 1)
    if repeated:  # two nodes of one name would both take its node rank, and no node the missing one
        raise BtkError(f"resourceconfig.json: hosts names {', '.join(map(repr, repeated))} more than once: "
                       "each node must appear once")
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


def job_instance(cluster: ClusterConfig, env: Mapping[str, str]) -> InstanceType | None:
    return catalog_instance(cluster.instance_type or env.get("SM_CURRENT_INSTANCE_TYPE"))


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


def torchrun_node_args(cluster: ClusterConfig, nproc: int, port: int) -> list[str]:
    """torchrun's arguments for this node: nnodes, node rank, processes per node, master."""
    return [f"--nnodes={cluster.nnodes}", f"--node_rank={cluster.node_rank}", f"--nproc_per_node={nproc}",
            f"--master_addr={cluster.master_addr}", f"--master_port={port}"]


def process_environment(cluster: ClusterConfig, instance: InstanceType | None, env: Mapping[str, str],
                        compat: CompatDecision) -> dict[str, str]:
    """What the training (and pre-flight) processes get on top of the node's environment.

    The instance type's NCCL/EFA settings from the hardware catalog, the job's network
    interface for NCCL's and gloo's bootstrap, and the CUDA compat library path when the host
    driver is older than the image's CUDA needs.
    """
    return {
        **(instance.network_environment if instance is not None else {}),
        "NCCL_SOCKET_IFNAME": cluster.network_interface_name,
        "GLOO_SOCKET_IFNAME": cluster.network_interface_name,
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "8"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        **compat_environment(compat, env),
    }


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
