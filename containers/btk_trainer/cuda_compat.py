"""CUDA forward compatibility: use the image's newer user-mode driver when the host's is older.

The image's torch wheels are built for CUDA 13, which needs an R580 (or newer) kernel driver. A
host whose driver is older can still run them on a datacenter GPU through NVIDIA's forward-
compatibility package (``cuda-compat-13-0``, which the ``nvidia/cuda:*-base`` images install
under ``/usr/local/cuda/compat``): its ``libcuda.so`` must be found before the host's. Put
there when the host's driver is *newer*, it would shadow a better driver, so it is used exactly
when the host's driver version is below the compat library's (the rule of AWS's Deep Learning
Containers, whose SageMaker images run ``start_cuda_compat.sh`` at start-up:
https://github.com/aws/deep-learning-containers, and of NVIDIA's guide,
https://docs.nvidia.com/deploy/cuda-compatibility/).

The entrypoint decides once per node, before torchrun starts, and puts the directory at the
front of the training processes' ``LD_LIBRARY_PATH`` (the entrypoint itself never loads CUDA).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

COMPAT_DIR = Path("/usr/local/cuda/compat")
PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
_DRIVER_VERSION = re.compile(r"Kernel Module\s+(?P<version>[0-9]+(?:\.[0-9]+)*)")
_LIBCUDA_VERSION = re.compile(r"^libcuda\.so\.(?P<version>[0-9]+(?:\.[0-9]+)+)$")


def parse_driver_version(proc_driver_version: str) -> str:
    """The kernel driver's version from ``/proc/driver/nvidia/version``; "unknown" if absent."""
    match = _DRIVER_VERSION.search(proc_driver_version)
    return match["version"] if match else "unknown"


def host_driver_version(proc: Path = PROC_DRIVER_VERSION) -> str:
    try:
        return parse_driver_version(proc.read_text())
    except OSError:
        return "unknown"


def compat_driver_version(compat_dir: Path = COMPAT_DIR) -> str | None:
    """The compat package's driver version (``libcuda.so.1 -> libcuda.so.580.95.05``); None without one."""
    library = compat_dir / "libcuda.so.1"
    try:
        target = os.readlink(library) if library.is_symlink() else None
    except OSError:
        return None
    if target is None:
        return None
    match = _LIBCUDA_VERSION.match(Path(target).name)
    return match["version"] if match else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class CompatDecision:
    """Whether the training processes load the compat ``libcuda``, and why (one log line)."""

    use: bool
    reason: str
    library_dir: Path | None = None

    def line(self) -> str:
        return f"btk: cuda compat {'on' if self.use else 'off'}: {self.reason}"


def decide(driver: str, compat: str | None, compat_dir: Path = COMPAT_DIR) -> CompatDecision:
    """On exactly when the host's driver is known, the compat library is present, and the driver is older."""
    if compat is None:
        return CompatDecision(False, f"no forward-compatibility libcuda in {compat_dir} (host driver {driver})")
    if driver == "unknown":
        return CompatDecision(False, f"no NVIDIA kernel driver found (compat libcuda {compat} left unused)")
    if _version_key(driver) < _version_key(compat):
        return CompatDecision(True, f"host driver {driver} is older than the image's CUDA compat libcuda {compat}: "
                                    f"{compat_dir} goes first on LD_LIBRARY_PATH", compat_dir)
    return CompatDecision(False, f"host driver {driver} is not older than the compat libcuda {compat}")


def node_decision(compat_dir: Path = COMPAT_DIR, proc: Path = PROC_DRIVER_VERSION) -> CompatDecision:
    return decide(host_driver_version(proc), compat_driver_version(compat_dir), compat_dir)


def compat_environment(decision: CompatDecision, env: Mapping[str, str]) -> dict[str, str]:
    """The ``LD_LIBRARY_PATH`` of the training processes: the compat directory first when it is on."""
    if not decision.use or decision.library_dir is None:
        return {}
    rest = [part for part in env.get("LD_LIBRARY_PATH", "").split(":") if part and part != str(decision.library_dir)]
    return {"LD_LIBRARY_PATH": ":".join([str(decision.library_dir), *rest])}
