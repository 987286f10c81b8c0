#!/usr/bin/env bash
# One-shot GPU benchmark for the lent 1x H200 machine (torch 2.11 cu130, Python 3.12, no network).
#
#   run(command="bash containers/bench/run_h200.sh", carry=[".whl"], timeout_s=480)
#
# Prepare once on the dev machine: containers/bench/fetch_wheels.sh (pydantic + torchao -> .whl/).
# Measures the profiles of BENCH_PROFILES (space-separated names from profiles/; default
# "llama3.2-3b llama3.2-1b", the shipped example's), in order: bf16 and fp8_tensorwise with the
# planner's knobs for a 1-GPU ml.p5en.48xlarge (H200), then planner's choice vs legacy
# baseline; the planner's prediction sits beside each. `--profile NAME` arguments replace
# BENCH_PROFILES. Writes $OUT/results.json, $OUT/performance.md, $OUT/bench.log,
# $OUT/env.txt. Finishes in < 6 minutes: cases that would start after BUDGET seconds are
# skipped (and say so), and a hard timeout stops the rest.
# Extra arguments go to the benchmark (e.g. `--tiny --device cpu --warmup 1 --steps 2` on CPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/out/bench}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${BUDGET:-250}"
HARD_LIMIT="${HARD_LIMIT:-320}"
WHEELS="${WHEELS:-.whl}"  # py3.12 wheels from fetch_wheels.sh; none: use what is installed
SITE="${SITE:-/tmp/btk-site}"
read -r -a profiles <<<"${BENCH_PROFILES:-llama3.2-3b llama3.2-1b}"
profile_args=()
case " $* " in
  *" --profile "* | *" --profile="*) ;;  # the arguments name the profiles
  *) for name in "${profiles[@]}"; do profile_args+=(--profile "$name"); done ;;
esac

if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  # torchao 0.17 pairs with the machine's torch 2.11; fall back to whatever torchao $WHEELS holds.
  torchao=$(ls "$WHEELS"/torch211/torchao-*.whl 2>/dev/null | head -n1)
  [ -n "$torchao" ] || torchao=$(ls "$WHEELS"/torchao-*.whl 2>/dev/null | sort -V | head -n1)
  mapfile -t others < <(ls "$WHEELS"/*.whl | grep -v '/torchao-')
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    ${torchao:+"$torchao"} "${others[@]}" || echo "wheel install failed; continuing with what is there"
  export PYTHONPATH="$SITE:$ROOT/containers:$ROOT"
else
  export PYTHONPATH="$ROOT/containers:$ROOT"
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-16}"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  "$PY" - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "torchao", "pydantic", "numpy"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:  # noqa: BLE001
        print(name, "missing:", error)
PY
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout --signal=TERM "$HARD_LIMIT" "$PY" -m btk_trainer.bench \
  "${profile_args[@]}" \
  --instance ml.p5en.48xlarge --gpus 1 \
  --precision bf16 --precision fp8_tensorwise --compare \
  --warmup 3 --steps 6 --budget-seconds "$BUDGET" \
  --json "$OUT/results.json" --markdown "$OUT/performance.md" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^btk_metric'
status=${PIPESTATUS[0]}
echo "bench exit status: $status"
[ -f "$OUT/performance.md" ] && cat "$OUT/performance.md"
exit "$status"
