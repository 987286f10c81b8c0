"""Network pre-flight: prove a multi-node job talks over EFA before any training starts.

The most common multi-node failure is silent: NCCL cannot load the aws-ofi-nccl plugin (or
libfabric finds no EFA device) and falls back to TCP sockets, so the job runs ten times
slower or hangs. The entrypoint therefore runs, on every node of a multi-node job, before
the trainer's torchrun:

1. **node checks** (no torch): the EFA devices this container sees (devices whose kernel
   driver is ``efa``; p6-b200's NVLink controllers are InfiniBand devices too, and must not
   count), and the versions of the driver, libfabric and aws-ofi-nccl;
2. **a short all-reduce on every GPU of every node** (``torchrun ... -m btk_trainer.preflight
   --worker``) with NCCL's INIT/NET log captured, which tells which network NCCL selected,
   and a timed all-reduce (1 GiB by default, ``BTK_PREFLIGHT_ALLREDUCE_BYTES`` to change it)
   whose bus bandwidth is printed as the ``allreduce_busbw_gbps`` metric line;
3. :func:`evaluate` decides. A broken network fails the job with one line saying which check
   failed and what to do: on an instance type that has EFA (``btk.hardware``), no EFA device,
   or NCCL on TCP sockets or on a libfabric provider other than EFA. A slow network does not:
   a bus bandwidth below what the catalog expects of the instance type is a warning with the
   figure, because a short all-reduce right after start-up measures below a tuned nccl-tests
   run, and refusing a healthy cluster costs more than a slower first hour.

``python -m btk_trainer.preflight`` runs steps 1-3 on its own (the same config files as the
entrypoint). All the decisions are plain functions of what the probes return, tested on CPU
with fakes (``tests/trainer/test_preflight.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from btk.errors import BtkError
from btk.hardware import InstanceType
from btk_trainer.cuda_compat import host_driver_version
from btk_trainer.launch import (
    DEFAULT_CONFIG_DIR,
    DEFAULT_FAILURE_FILE,
    DEFAULT_MASTER_PORT,
    ClusterConfig,
    gpus_per_node,
    job_instance,
    process_environment,
    read_cluster,
    report_failure,
    torchrun_node_args,
)

#: The whole pre-flight (rendezvous, NCCL start-up, all-reduce) must finish in this time: a
#: hung inter-node collective fails the job within minutes instead of holding the instances.
PREFLIGHT_TIMEOUT_S = 300
#: All-reduce buffer (bytes): large enough to reach the inter-node bus bandwidth. In nccl-tests'
#: all_reduce_perf on p5.48xlarge (3,200 Gbit/s EFA; crazyguitar/aws-gpu-communication-benchmark,
#: data/nccl_all_reduce.csv) 256 MiB reaches 364 GB/s on 2 nodes but only 148 on 16 and 138 on
#: 32, while 1 GiB reaches 435, 269 and 220 GB/s: below 1 GiB the figure says more about the
#: message size than about the network. ``BTK_PREFLIGHT_ALLREDUCE_BYTES`` overrides it.
ALLREDUCE_BYTES = 1024**3
ALLREDUCE_BYTES_ENV = "BTK_PREFLIGHT_ALLREDUCE_BYTES"
MIN_ALLREDUCE_BYTES = 64 * 1024**2
MAX_ALLREDUCE_BYTES = 16 * 1024**3
#: nccl-tests' defaults (-w 5 -n 20): a few seconds on EFA at 1 GiB.
WARMUP_ITERATIONS = 5
TIMED_ITERATIONS = 20
DEFAULT_PREFLIGHT_DIR = Path("/tmp/btk-preflight")
SYS_INFINIBAND = Path("/sys/class/infiniband")
LIBFABRIC_INFO = "/opt/amazon/efa/bin/fi_info"
OFI_PLUGIN_DIR = Path("/opt/amazon/ofi-nccl")
RESULT_PREFIX = "preflight_result."

# NCCL's INIT/NET log lines, as NCCL and aws-ofi-nccl print them.
_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[A-Za-z0-9_;+-]+)")
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl (?P<version>\S+)")
_LIBFABRIC_VERSION = re.compile(r"^libfabric: (?P<version>\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Versions:
    """What one node runs; printed as one line so a failed job's log says what it ran with."""

    driver: str = "unknown"
    cuda: str = "unknown"
    torch: str = "unknown"
    nccl: str = "unknown"
    libfabric: str = "unknown"
    aws_ofi_nccl: str = "unknown"

    def line(self) -> str:
        return "btk: preflight versions " + " ".join(f"{key}={value}" for key, value in asdict(self).items())


@dataclass(frozen=True)
class Transport:
    """The network NCCL selected, from its INIT/NET log."""

    network: str | None = None
    provider: str | None = None
    plugin_version: str | None = None

    @property
    def is_socket(self) -> bool:
        return self.network is not None and "socket" in self.network.lower()

    @property
    def is_ofi(self) -> bool:
        return self.network is not None and ("libfabric" in self.network.lower() or "ofi" in self.network.lower())


@dataclass(frozen=True)
class WorkerResult:
    """One rank's measurement, written as JSON for the node's entrypoint to judge."""

    rank: int
    transport: Transport
    busbw_gbps: float
    versions: Versions = field(default_factory=Versions)


class PreflightError(BtkError):
    """A pre-flight check failed: one line naming the check and what to do."""


# ---------------------------------------------------------------------------- parsing probes


def parse_nccl_log(lines: Iterable[str]) -> Transport:
    """The transport NCCL selected; the last ``Using network`` line wins (one per communicator)."""
    network = provider = version = None
    for line in lines:
        if match := _USING_NETWORK.search(line):
            network = match["name"]
        elif match := _OFI_PROVIDER.search(line):
            provider = match["provider"].split(";")[0]
        elif match := _OFI_VERSION.search(line):
            version = match["version"]
    return Transport(network=network, provider=provider, plugin_version=version)


def parse_libfabric_version(fi_info_output: str) -> str:
    match = _LIBFABRIC_VERSION.search(fi_info_output)
    return match["version"] if match else "unknown"


def efa_devices(sys_infiniband: Path = SYS_INFINIBAND) -> list[str]:
    """InfiniBand devices whose kernel driver is ``efa`` (not NVLink or other RDMA controllers)."""
    if not sys_infiniband.is_dir():
        return []
    found = []
    for device in sorted(sys_infiniband.iterdir()):
        driver = device / "device" / "driver"
        if driver.exists() and driver.resolve().name == "efa":
            found.append(device.name)
    return found


def busbw_gbps(nbytes: int, seconds_per_iteration: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n, in GB/s (1e9 bytes)."""
    if seconds_per_iteration <= 0 or world_size < 2:
        return 0.0
    return nbytes / seconds_per_iteration * 2 * (world_size - 1) / world_size / 1e9


# ---------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Verdict:
    """A pre-flight that passed: the slowest rank's bus bandwidth, and a warning when it is below expectation."""

    busbw_gbps: float
    warning: str | None = None


def evaluate(instance: InstanceType | None, nnodes: int, devices: Sequence[str],
             results: Sequence[WorkerResult]) -> Verdict:
    """Judge a multi-node pre-flight: raise PreflightError on a broken network, warn on a slow one."""
    if not results:
        raise PreflightError("network pre-flight: no rank reported a result; see the log above for the "
                             "torchrun error (rendezvous with the master host failed?)")
    busbw = min(result.busbw_gbps for result in results)
    if instance is None or not instance.has_efa:
        return Verdict(busbw)
    if not devices:
        raise PreflightError(
            f"network pre-flight: no EFA device in the container on {instance.name}, which has EFA: run the "
            "job in a VPC subnet with a security group that allows all traffic to and from itself "
            "(SageMaker attaches EFA then), and do not override the container's device access")
    for result in results:
        transport = result.transport
        if transport.network is None:
            raise PreflightError(
                f"network pre-flight: rank {result.rank} logged no 'Using network' line, so the transport NCCL "
                "chose is unknown: check that NCCL_DEBUG is not forced to a level below INFO for the pre-flight")
        if not transport.is_ofi:
            raise PreflightError(
                f"network pre-flight: NCCL on rank {result.rank} fell back to '{transport.network}' instead of "
                f"EFA on {instance.name}: the aws-ofi-nccl plugin did not load; check that "
                f"{OFI_PLUGIN_DIR}/lib is on LD_LIBRARY_PATH and NCCL_NET_PLUGIN=ofi (the image sets both), and "
                "that no NCCL_NET or NCCL_IB_DISABLE setting of the job overrides them")
        if transport.provider is not None and transport.provider != "efa":
            raise PreflightError(
                f"network pre-flight: libfabric on rank {result.rank} selected provider '{transport.provider}' "
                f"instead of efa on {instance.name}: set FI_PROVIDER=efa (the catalog does) and check the EFA "
                "devices the container sees")
    expected = instance.expected_allreduce_busbw_gbps
    if busbw >= expected:
        return Verdict(busbw)
    slowest = min(results, key=lambda result: result.busbw_gbps)
    return Verdict(busbw, warning=(
        f"network pre-flight: all-reduce bus bandwidth {busbw:.1f} GB/s (rank {slowest.rank}) across {nnodes} "
        f"nodes is below the {expected:.0f} GB/s expected of {instance.name} on EFA "
        f"({len(devices)} EFA devices on this node); training continues: if its step time is also slow, stop "
        "the job and start it again on other instances, and report the instance IDs to AWS support if it repeats"))


def allreduce_bytes(env: Mapping[str, str]) -> int:
    """The pre-flight's all-reduce size: ``BTK_PREFLIGHT_ALLREDUCE_BYTES`` or 1 GiB; one-line error if invalid."""
    raw = env.get(ALLREDUCE_BYTES_ENV, "").strip()
    if not raw:
        return ALLREDUCE_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise PreflightError(f"{ALLREDUCE_BYTES_ENV}={raw!r} is not a whole number of bytes") from None
    if not MIN_ALLREDUCE_BYTES <= value <= MAX_ALLREDUCE_BYTES or value % 4:
        raise PreflightError(f"{ALLREDUCE_BYTES_ENV}={value} must be a multiple of 4 from {MIN_ALLREDUCE_BYTES} "
                             f"(64 MiB) to {MAX_ALLREDUCE_BYTES} (16 GiB)")
    return value


# ---------------------------------------------------------------------------- node probes


def _run(command: Sequence[str]) -> str:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _ofi_plugin_version(plugin_dir: Path = OFI_PLUGIN_DIR) -> str:
    """aws-ofi-nccl's version string, read from the plugin library (``strings`` without binutils)."""
    for library in sorted(plugin_dir.glob("lib*/libnccl-net*.so*")):
        try:
            data = library.read_bytes()
        except OSError:
            continue
        match = re.search(rb"aws-ofi-nccl[ -]v?([0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9.-]*)", data)
        if match:
            return match.group(1).decode()
    return "unknown"


def node_versions() -> Versions:
    """Driver, libfabric and aws-ofi-nccl of this node (torch's are added by the workers)."""
    return Versions(driver=host_driver_version(), libfabric=parse_libfabric_version(_run([LIBFABRIC_INFO,
                    "--version"])), aws_ofi_nccl=_ofi_plugin_version())


# ---------------------------------------------------------------------------- the worker (torchrun)


def _torch_versions(base: Versions) -> Versions:
    import torch

    nccl = (".".join(str(part) for part in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            if torch.cuda.is_available() else "unknown")
    return Versions(driver=base.driver, cuda=str(torch.version.cuda), torch=torch.__version__, nccl=nccl,
                    libfabric=base.libfabric, aws_ofi_nccl=base.aws_ofi_nccl)


def worker(result_dir: Path, nbytes: int = ALLREDUCE_BYTES) -> int:
    """One rank: NCCL with its INIT/NET log to a file, a timed all-reduce of ``nbytes``, the result as JSON."""
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    log = result_dir / f"nccl.{rank}.log"
    os.environ.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(log)})
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=PREFLIGHT_TIMEOUT_S))
    try:
        buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        for _ in range(WARMUP_ITERATIONS):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(TIMED_ITERATIONS):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / TIMED_ITERATIONS
    finally:
        dist.destroy_process_group()
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    result = WorkerResult(rank=rank, transport=parse_nccl_log(lines), busbw_gbps=busbw_gbps(buffer.numel() * 4,
                          elapsed, world), versions=_torch_versions(node_versions()))
    (result_dir / f"{RESULT_PREFIX}{rank}.json").write_text(json.dumps(asdict(result)))
    return 0


def read_results(result_dir: Path) -> list[WorkerResult]:
    results = []
    for path in sorted(result_dir.glob(f"{RESULT_PREFIX}*.json")):
        data = json.loads(path.read_text())
        results.append(WorkerResult(rank=data["rank"], transport=Transport(**data["transport"]),
                                    busbw_gbps=float(data["busbw_gbps"]), versions=Versions(**data["versions"])))
    return results


# ---------------------------------------------------------------------------- the node's pre-flight


Runner = Callable[[Sequence[str], Mapping[str, str], float], int]


def run_with_timeout(command: Sequence[str], env: Mapping[str, str], timeout_s: float) -> int:
    """Run ``command`` in its own process group; kill the group after ``timeout_s`` (returns 124)."""
    process = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 124


@dataclass(frozen=True)
class PreflightPlan:
    """What the node's pre-flight runs: torchrun with one worker per GPU, and where results go."""

    command: list[str]
    env: dict[str, str]
    result_dir: Path
    instance: InstanceType | None
    nnodes: int


def preflight_plan(torchrun_args: Sequence[str], env: Mapping[str, str], result_dir: Path,
                   instance: InstanceType | None, nnodes: int) -> PreflightPlan:
    """torchrun (``torchrun_args``: nnodes, node_rank, nproc, master) running the worker."""
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, "-m", "btk_trainer.preflight",
               "--worker", f"--result-dir={result_dir}", f"--bytes={allreduce_bytes(env)}"]
    return PreflightPlan(command=command, env=dict(env), result_dir=result_dir, instance=instance, nnodes=nnodes)


def node_preflight_plan(cluster: ClusterConfig, nproc: int, instance: InstanceType | None, env: Mapping[str, str],
                        master_port: int = DEFAULT_MASTER_PORT) -> PreflightPlan | None:
    """This node's pre-flight for a multi-node job (None for one node), one port above the trainer's rendezvous."""
    if cluster.nnodes < 2:
        return None
    return preflight_plan(torchrun_node_args(cluster, nproc, master_port + 1), env, DEFAULT_PREFLIGHT_DIR,
                          instance, cluster.nnodes)


def run_preflight(plan: PreflightPlan, *, runner: Runner = run_with_timeout,
                  devices: Callable[[], list[str]] = efa_devices, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> Verdict:
    """Run the workers and judge them; prints the versions, any warning and the metric line; raises PreflightError."""
    from btk.metrics import format_preflight_line

    found = devices()
    if plan.instance is not None and plan.instance.has_efa and not found:  # fail before starting NCCL at all
        evaluate(plan.instance, plan.nnodes, found, [WorkerResult(rank=-1, transport=Transport(), busbw_gbps=0.0)])
    plan.result_dir.mkdir(parents=True, exist_ok=True)
    for stale in plan.result_dir.glob(f"{RESULT_PREFIX}*.json"):
        stale.unlink()
    status = runner(plan.command, plan.env, timeout_s)
    if status == 124:
        raise PreflightError(
            f"network pre-flight: the all-reduce across {plan.nnodes} nodes did not finish in {timeout_s:.0f} s "
            "(an NCCL hang: typically an aws-ofi-nccl plugin too old for the instance type, or a security group "
            "that blocks traffic between the job's instances); check the image's EFA installer version "
            "(docs/trainer.md) and the job's security group")
    results = read_results(plan.result_dir)
    if status != 0 and not results:
        raise PreflightError(f"network pre-flight: torchrun exited {status} before any rank measured; see the "
                             "log above (a host that could not reach the master, or a GPU that failed)")
    if results:
        print(results[0].versions.line() + f" efa_devices={len(found)}", flush=True)
    verdict = evaluate(plan.instance, plan.nnodes, found, results)
    if verdict.warning is not None:
        print(f"btk: warning: {verdict.warning}", flush=True)
    print(format_preflight_line(allreduce_busbw_gbps=verdict.busbw_gbps), flush=True)
    return verdict


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``python -m btk_trainer.preflight``: the node's pre-flight from the job's config files."""
    from btk_trainer.cuda_compat import node_decision

    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="btk-preflight", description="EFA/NCCL network pre-flight of a job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", type=Path, default=DEFAULT_PREFLIGHT_DIR)
    parser.add_argument("--bytes", type=int, default=ALLREDUCE_BYTES, help=argparse.SUPPRESS)
    parser.add_argument("--config-dir", type=Path, default=Path(env.get("BTK_CONFIG_DIR", str(DEFAULT_CONFIG_DIR))))
    parser.add_argument("--failure-file", type=Path,
                        default=Path(env.get("BTK_FAILURE_FILE", str(DEFAULT_FAILURE_FILE))))
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.result_dir, args.bytes)
    try:
        cluster = read_cluster(args.config_dir)
        instance = job_instance(cluster, env)
        node_env = {**os.environ, **env}
        plan = node_preflight_plan(cluster, gpus_per_node(env), instance,
                                   {**node_env, **process_environment(cluster, instance, node_env, node_decision())})
        if plan is None:
            print("btk: preflight skipped: a single-node job has no inter-node network to check", flush=True)
            return 0
        run_preflight(plan)
    except BtkError as error:
        return report_failure(str(error), args.failure_file)
    return 0


if __name__ == "__main__":
    from btk_trainer.exiting import exit_without_finalizing

    exit_without_finalizing(main())
