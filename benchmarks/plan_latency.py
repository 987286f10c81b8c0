"""Whole-process latency of `btk plan` (what a user waits for), median of N runs.

Run: ``.venv/bin/python benchmarks/plan_latency.py [N]``. Prints one line per profile and
the import-only floor (``btk --help``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

BTK = str(Path(sys.executable).with_name("btk"))


def median_seconds(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print(f"btk --help: {median_seconds([BTK, '--help'], runs):.3f} s (median of {runs})")
    for profile in ("llama3.2-1b", "llama3.1-8b", "qwen2.5-32b", "llama-65b"):
        seconds = median_seconds([BTK, "plan", profile], runs)
        print(f"btk plan {profile}: {seconds:.3f} s (median of {runs})")


if __name__ == "__main__":
    main()
