#!/usr/bin/env python3
"""Whole-process ``cdk synth`` time per environment (median of N runs).

Measures what a user waits for: the CDK CLI (Node.js), the Python app, jsii, cdk-nag and
the asset staging, from process start to exit, offline and without AWS credentials. In the
same run, interleaved with it, the bare app of ``bare_app.py`` (a VPC, a key and a bucket)
is synthesized the same way: each environment's time is also printed as a ratio to it, in
wall-clock seconds and in CPU seconds (user + system of the whole process tree; steadier
than wall-clock time on a busy machine).

    .venv/bin/python benchmarks/synth_time.py --runs 3 [--env dev --env prod]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_env import offline_environment

REPO = Path(__file__).resolve().parent.parent
CDK = REPO / "node_modules" / ".bin" / "cdk"
BARE_APP = Path(__file__).resolve().parent / "bare_app.py"
#: The row name of the bare app.
BARE = "bare"
_FLAGS = ["--no-notices", "--no-version-reporting", "--quiet"]


def synth_command(name: str, outdir: Path) -> list[str]:
    """``cdk synth`` of environment ``name``'s TrainingStack, or of the bare app for :data:`BARE`."""
    if name == BARE:
        return [str(CDK), "synth", "--app", f"{sys.executable} {BARE_APP}", *_FLAGS, "-o", str(outdir)]
    return [str(CDK), "synth", "TrainingStack", "-c", f"env={name}", *_FLAGS, "-o", str(outdir)]


def synth_seconds(name: str, outdir: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one synth (see :func:`synth_command`); raises if it fails."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run(synth_command(name, outdir), cwd=REPO, env=offline_environment(),
                            capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"cdk synth of {name} failed: {result.stderr.strip()[-500:]}")
    return elapsed, _children_cpu() - cpu_before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="synths per environment (default 5)")
    parser.add_argument("--env", action="append", dest="envs", help="environment (repeatable; default all)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sys.path.insert(0, str(REPO))
    import environments

    names = [BARE, *(args.envs or [env.name for env in environments.ENVIRONMENTS])]
    print(f"cdk synth, whole process, {args.runs} run(s) each, interleaved, {os.cpu_count()} CPUs")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="btk-synth-") as tmp:
        for run in range(args.runs):  # interleaved: a load change hits every row alike
            for name in names:
                seconds, cpu_seconds = synth_seconds(name, Path(tmp) / f"{name}-{run}")
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
    bare_wall, bare_cpu = statistics.median(wall[BARE]), statistics.median(cpu[BARE])
    print(f"{'app':<10} {'median s':>9} {'min s':>7} {'max s':>7} {'x bare':>7} {'cpu s':>7} {'cpu x bare':>10}")
    for name in names:
        median, median_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<10} {median:>9.2f} {min(wall[name]):>7.2f} {max(wall[name]):>7.2f} "
              f"{median / bare_wall:>7.2f} {median_cpu:>7.2f} {median_cpu / bare_cpu:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
