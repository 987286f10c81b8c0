#!/usr/bin/env bash
# The GPU benchmark in one call on a machine with one H200 (Python 3.12 and its own torch; no
# network needed), run from the repository root with the wheels in .whl/ beside it:
#
#   bash containers/bench/run_h200.sh
#
# Prepare once where PyPI is reachable: containers/bench/fetch_wheels.sh (the wheels that
# machine lacks -> .whl/, about 6 MB). This script installs them with
# `pip install --no-index --no-deps --target`, then runs python -m btk_trainer.bench on the
# profiles of BENCH_PROFILES (space-separated names from profiles/; default "llama3.2-3b")
# with the cases of BENCH_CASES (default: the planner's knobs in bf16 and fp8_tensorwise, the
# planner's choice and the legacy baseline), planned for a 1-GPU ml.p5en.48xlarge (H200), then
# a phase-timed and a profiled run of the first case (`--phase-runs N` for more). That default
# is expected to take about 8 minutes (the estimate the benchmark prints first). `--profile NAME` arguments replace BENCH_PROFILES;
# other arguments go to the benchmark: `--no-phases`, `--plan-only` (the expected minutes,
# nothing trained), `--device cpu --tiny --warmup 1 --steps 2` (a CPU dry run).
#
# Time: BUDGET seconds (default 540: 9 min) from this script's start. The benchmark prints
# each case's expected minutes and the total before it starts, and skips a run whose estimate
# would end past the budget; HARD_LIMIT (default 570 s) kills it whatever the estimates said,
# 30 s inside run's 600-s timeout. Files in $OUT (default <repo>/out/bench): results.json and
# performance.md, rewritten after every run (a kill keeps what was measured before it),
# bench.log (everything printed) and env.txt (nvidia-smi, package versions).
set -uo pipefail
START=$(date +%s)
cd "$(dirname "$0")/../.." || exit 2
ROOT="$PWD"
OUT="${OUT:-$ROOT/out/bench}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${BUDGET:-540}"
HARD_LIMIT="${HARD_LIMIT:-570}"
WHEELS="${WHEELS:-$ROOT/.whl}"  # from fetch_wheels.sh
SITE="${SITE:-/tmp/btk-site}"
read -r -a profiles <<<"${BENCH_PROFILES:-llama3.2-3b}"
read -r -a cases <<<"${BENCH_CASES:---precision bf16 --precision fp8_tensorwise --compare}"
profile_args=()
case " $* " in
  *" --profile "* | *" --profile="*) ;;  # the arguments name the profiles
  *) for name in "${profiles[@]}"; do profile_args+=(--profile "$name"); done ;;
esac

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  # The wheels go first on the path: they replace the machine's own copies (typing-extensions).
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl || { echo "btk-bench: installing the wheels of $WHEELS failed"; exit 3; }
  export PYTHONPATH="$SITE:$ROOT/containers:$ROOT"
else
  # Without them the machine's own packages stand in, and say so; where they lack one the benchmark imports,
  # it stops here naming it (on a machine with a package index, make gpu-bench builds the whole environment).
  missing=$("$PY" -c '
import importlib.util
print(" ".join(name for name in ("torch", "torchao", "pydantic", "numpy") if importlib.util.find_spec(name) is None))')
  if [ -n "$missing" ]; then
    echo "btk-bench: no wheels in $WHEELS and $PY lacks: $missing (run containers/bench/fetch_wheels.sh and copy .whl beside the repository)"
    exit 3
  fi
  echo "btk-bench: no wheels in $WHEELS: using $PY's own packages (their versions: $OUT/env.txt)"
  export PYTHONPATH="$ROOT/containers:$ROOT"
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-16}"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  "$PY" - <<'PY'
import sys
from importlib import metadata
print("python", sys.version.split()[0])
for name in ("torch", "torchao", "pydantic", "pydantic-core", "typing-extensions", "numpy", "triton"):
    try:
        found = metadata.distribution(name)
        print(name, found.version, found.locate_file(""))
    except metadata.PackageNotFoundError:
        print(name, "not installed")
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

left=$((HARD_LIMIT - ($(date +%s) - START)))
timeout --kill-after=10 --signal=TERM "$left" "$PY" -m btk_trainer.bench \
  "${profile_args[@]}" \
  --instance ml.p5en.48xlarge --gpus 1 \
  "${cases[@]}" \
  --warmup 3 --steps 6 --phase-runs 1 --started-at "$START" --budget-seconds "$BUDGET" \
  --json "$OUT/results.json" --markdown "$OUT/performance.md" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^btk_metric'
status=${PIPESTATUS[0]}
echo "bench exit status: $status"
[ -f "$OUT/performance.md" ] && cat "$OUT/performance.md"
exit "$status"
