#!/usr/bin/env python3
"""Synth-time cost of the SageMaker SDK: whole-app synth with N = 1, 3, 6 profiles.

Each measurement is a fresh Python process (imports included) that builds TrainingStack for
``dev`` with its profiles replaced by the first N of :data:`PROFILES`, runs cdk-nag and
synthesizes, offline. The process reports where its time went: imports (aws-cdk-lib and
the SageMaker SDK), the pipeline definitions (planner + SDK), and the rest of the synth.
Then ``btk plan --env dev`` is timed and checked not to import the SDK at all.

    .venv/bin/python benchmarks/synth_scaling.py [--counts 1 3 6] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_env import OFFLINE_ENV, offline_environment

REPO = Path(__file__).resolve().parent.parent
PROFILES = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b")

#: Runs inside the child process; prints one JSON line of timings.
_CHILD = r"""
import json, sys, tempfile, time
start = time.perf_counter()
import aws_cdk
from aws_cdk import App
t_cdk = time.perf_counter()
import sagemaker.mlops.workflow, sagemaker.train  # what pipeline_definition imports lazily
t_sdk = time.perf_counter()
import environments
from stacks.training_stack import TrainingStack
from training_constructs.nag import apply_nag
from training_constructs import pipeline_definition
profiles = tuple(sys.argv[1].split(","))
env = environments.DEV.model_copy(update={"profiles": profiles})
spent = [0.0]
original = pipeline_definition.build_pipeline_definition
def timed(spec):
    began = time.perf_counter()
    try:
        return original(spec)
    finally:
        spent[0] += time.perf_counter() - began
import training_constructs.pipeline as pipeline_module
pipeline_module.build_pipeline_definition = timed
t_imports = time.perf_counter()
with tempfile.TemporaryDirectory() as outdir:
    app = App(outdir=outdir)
    apply_nag(app)
    stack = TrainingStack(app, "TrainingStack", env_config=env)
    t_build = time.perf_counter()
    app.synth()
t_end = time.perf_counter()
pipelines = len(stack.pipelines.pipelines)
print(json.dumps({
    "profiles": len(profiles), "pipelines": pipelines,
    "import_cdk_s": t_cdk - start, "import_sdk_s": t_sdk - t_cdk,
    "definitions_s": spent[0], "build_s": t_build - t_imports, "synth_s": t_end - t_build,
    "total_s": t_end - start,
}))
"""


def measure(count: int) -> dict[str, float]:
    env = offline_environment()
    env["PYTHONPATH"] = str(REPO)
    process = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(PROFILES[:count])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    if process.returncode != 0:
        raise SystemExit(f"synth with {count} profiles failed:\n{process.stderr[-3000:]}")
    last = [line for line in process.stdout.splitlines() if line.startswith("{")][-1]
    figures: dict[str, float] = json.loads(last)
    return figures


def plan_timing() -> tuple[float, bool]:
    """Seconds of ``btk plan --env dev --format json`` in a fresh process, and whether it imported the SDK."""
    code = (
        "import sys, io, contextlib, time\n"
        "t = time.perf_counter()\n"
        "from btk.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['plan', '--env', 'dev', '--format', 'json'])\n"
        "print(rc, time.perf_counter() - t, any(m == 'sagemaker' or m.startswith('sagemaker.') for m in sys.modules),"
        " 'aws_cdk' in sys.modules)\n"
    )
    env = os.environ | OFFLINE_ENV | {"PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    rc, seconds, sdk, cdk = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"btk plan failed: {out.stderr[-2000:]}")
    return float(seconds), sdk == "True" or cdk == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3, 6])
    parser.add_argument("--runs", type=int, default=1, help="runs per count (median reported)")
    args = parser.parse_args()
    print(f"{'profiles':>8} {'total s':>8} {'cdk imp':>8} {'sdk imp':>8} {'build s':>8} {'defs s':>8} "
          f"{'s/def':>6} {'synth s':>8}")
    for count in args.counts:
        runs = [measure(count) for _ in range(args.runs)]
        row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        assert row["pipelines"] == count, row
        print(
            f"{count:>8} {row['total_s']:>8.1f} {row['import_cdk_s']:>8.1f} {row['import_sdk_s']:>8.1f} "
            f"{row['build_s']:>8.1f} "
            f"{row['definitions_s']:>8.1f} {row['definitions_s'] / count:>6.2f} {row['synth_s']:>8.1f}"
        )
    seconds, imported = plan_timing()
    print(f"btk plan --env dev --format json: {seconds:.2f} s in-process; imports sagemaker or aws_cdk: {imported}")
    return 1 if imported else 0


if __name__ == "__main__":
    raise SystemExit(main())
