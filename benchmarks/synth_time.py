#!/usr/bin/env python3
"""Whole-process ``cdk synth`` time per environment (median of N runs).

Measures what a user waits for: the CDK CLI (Node.js), the Python app, jsii, cdk-nag and
the asset staging, from process start to exit, offline and without AWS credentials. In the
same run, interleaved with it, the bare app of ``bare_app.py`` (a VPC, a key and a bucket)
is synthesized the same way: each environment's time is also printed as a ratio to it, in
wall-clock seconds and in CPU seconds (user + system of the whole process tree; steadier
than wall-clock time on a busy machine).

Each environment is measured twice: as a user re-synthesizes it (``<env>``: the pipeline
definition cache of ``training_constructs.definition_cache`` holds this code's definitions,
filled by one unmeasured synth first) and as a first synth (``<env> cold``: cache off, so
the SageMaker SDK is imported and builds every definition).

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


#: Suffix of the rows measured with the definition cache off.
COLD = " cold"


def synth_command(name: str, outdir: Path) -> list[str]:
    """``cdk synth`` of environment ``name``'s TrainingStack, or of the bare app for :data:`BARE`."""
    name = name.removesuffix(COLD)
    if name == BARE:
        return [str(CDK), "synth", "--app", f"{sys.executable} {BARE_APP}", *_FLAGS, "-o", str(outdir)]
    return [str(CDK), "synth", "TrainingStack", "-c", f"env={name}", *_FLAGS, "-o", str(outdir)]


def synth_seconds(name: str, outdir: Path, cache: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one synth (see :func:`synth_command`); raises if it fails."""
    from training_constructs.definition_cache import CACHE_ENV

    env = offline_environment() | {CACHE_ENV: "off" if name.endswith(COLD) else str(cache)}
    cpu_before = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run(synth_command(name, outdir), cwd=REPO, env=env, capture_output=True, text=True,
                            check=False)
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

    envs = args.envs or [env.name for env in environments.ENVIRONMENTS]
    names = [BARE, *(name + suffix for name in envs for suffix in ("", COLD))]
    print(f"cdk synth, whole process, {args.runs} run(s) each, interleaved, {os.cpu_count()} CPUs")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="btk-synth-") as tmp:
        cache = Path(tmp) / "definitions"
        for name in envs:  # fills the definition cache; not measured
            synth_seconds(name, Path(tmp) / f"{name}-fill", cache)
        for run in range(args.runs):  # interleaved: a load change hits every row alike
            for name in names:
                seconds, cpu_seconds = synth_seconds(name, Path(tmp) / f"{name}-{run}".replace(" ", "-"), cache)
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
    bare_wall, bare_cpu = statistics.median(wall[BARE]), statistics.median(cpu[BARE])
    print(f"{'app':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'x bare':>7} {'cpu s':>7} {'cpu x bare':>10}")
    for name in names:
        median, median_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<12} {median:>9.2f} {min(wall[name]):>7.2f} {max(wall[name]):>7.2f} "
              f"{median / bare_wall:>7.2f} {median_cpu:>7.2f} {median_cpu / bare_cpu:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
