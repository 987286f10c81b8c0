#!/usr/bin/env python3
"""Whole-process ``cdk synth`` time per environment (median of N runs).

Measures what a user waits for: the CDK CLI (Node.js), the Python app, jsii, cdk-nag and
the asset staging, from process start to exit, offline and without AWS credentials.

    .venv/bin/python benchmarks/synth_time.py --runs 3 [--env dev --env prod]
"""

from __future__ import annotations

import argparse
import os
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


def synth_seconds(env_name: str, outdir: Path) -> float:
    """Wall-clock seconds of one ``cdk synth`` of ``env_name``; raises if it fails."""
    command = [str(CDK), "synth", "TrainingStack", "-c", f"env={env_name}", "--no-notices",
               "--no-version-reporting", "--quiet", "-o", str(outdir)]
    env = offline_environment()
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"cdk synth -c env={env_name} failed: {result.stderr.strip()[-500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="synths per environment (default 5)")
    parser.add_argument("--env", action="append", dest="envs", help="environment (repeatable; default all)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sys.path.insert(0, str(REPO))
    import environments

    names = args.envs or [env.name for env in environments.ENVIRONMENTS]
    print(f"cdk synth TrainingStack, whole process, {args.runs} run(s) per environment, {os.cpu_count()} CPUs")
    print(f"{'env':<10} {'median s':>9} {'min s':>7} {'max s':>7}")
    with tempfile.TemporaryDirectory(prefix="btk-synth-") as tmp:
        for name in names:
            times = [synth_seconds(name, Path(tmp) / f"{name}-{run}") for run in range(args.runs)]
            print(f"{name:<10} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
