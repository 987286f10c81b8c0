#!/usr/bin/env bash
# make gpu-bench: the GPU benchmark in one command on a bare machine with an NVIDIA GPU, Python 3 and a package
# index (docs/performance.md, "GPU benchmark").
#
#   1. Checks that the index holds every pin of the training image's lock (containers/requirements.lock) and of
#      torchtitan's (containers/bench/torchtitan.lock) for this machine's platform, reading metadata only; a
#      missing pin is one line naming it, and nothing is installed.
#   2. Builds two environments from those locks with uv (--require-hashes): the trainer's in .venv-gpu-bench,
#      exactly the image's packages; torchtitan's published wheel in .venv-gpu-bench-titan, on the image's
#      torch stack (torch, torchao, triton, the CUDA wheels).
#   3. Exports the variables every training job runs with (python -m btk.training_environment: the allocator's
#      expandable segments, NCCL's record-stream setting), so peak memory compares with the planner's.
#   4. Pre-checks every GPU-only code path the cases take, in seconds (python -m btk_trainer.gpu_precheck).
#   5. Runs the cases (python -m btk_trainer.bench: the planner's knobs per precision, the planner's choice and
#      the legacy baseline, each beside the planner's prediction) within BUDGET seconds, then the same cases with
#      torchtitan (python -m btk_trainer.titan_baseline) until the budget ends.
# Records in OUT (default out/gpu-bench): results.json and performance.md (the trainer's and torchtitan's
# figures, the ratio), precheck.json, bench.log, env.txt.
#
# Without a GPU it runs every step up to the first CUDA call (the same environments: torch's CUDA build imports
# without a GPU), says so, and exits 1; with --until-cuda it exits 0 there (CI's readiness check).
#
# Settings (environment): BENCH_PROFILES (default "llama3.2-3b", or the smallest profile of profiles/ without
# it), BENCH_CASES (default "--precision bf16 --precision fp8_tensorwise --compare"; torchtitan runs the bf16 and
# fp8_rowwise ones), BUDGET (seconds for the cases, default 600), OUT, PYTHON (default: the first Python 3.12 of
# python3.12, pyenv's versions and python3: the locks are the image's, for 3.12), GPU_BENCH_INDEX (default
# https://pypi.org/simple), GPU_BENCH_VENV, GPU_BENCH_TITAN_VENV, GPU_BENCH_LOCK, GPU_BENCH_TITAN_LOCK. Other
# arguments go to btk_trainer.bench.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT="$PWD"
OUT="${OUT:-$ROOT/out/gpu-bench}"
INDEX="${GPU_BENCH_INDEX:-https://pypi.org/simple}"
VENV="${GPU_BENCH_VENV:-$ROOT/.venv-gpu-bench}"
TITAN_VENV="${GPU_BENCH_TITAN_VENV:-$ROOT/.venv-gpu-bench-titan}"
LOCK="${GPU_BENCH_LOCK:-$ROOT/containers/requirements.lock}"
TITAN_LOCK="${GPU_BENCH_TITAN_LOCK:-$ROOT/containers/bench/torchtitan.lock}"
BUDGET="${BUDGET:-600}"
UV_VERSION=0.13.9  # the Makefile's
read -r -a cases <<<"${BENCH_CASES:---precision bf16 --precision fp8_tensorwise --compare}"
until_cuda=0
bench_args=()
for argument in "$@"; do
  if [ "$argument" = "--until-cuda" ]; then until_cuda=1; else bench_args+=("$argument"); fi
done

say() { echo "btk-gpu-bench: $*"; }
fail() { echo "btk-gpu-bench: $1" >&2; exit "${2:-1}"; }

mkdir -p "$OUT" || fail "cannot create $OUT" 2
LOCK_PYTHON=3.12  # the image's (containers/Dockerfile), which the locks are compiled for
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 python3; do
    if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null; then
      PYTHON=$candidate; break
    fi
  done
fi
python_version=$("${PYTHON:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
[ "$python_version" = "$LOCK_PYTHON" ] \
  || fail "the locks are for Python $LOCK_PYTHON (the image's); ${PYTHON:-python3} is ${python_version:-not a Python}: set PYTHON" 2
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
case "$(uname -m)" in
  x86_64) platform=x86_64-manylinux_2_28 ;;
  aarch64) platform=aarch64-manylinux_2_28 ;;
  *) fail "no locked wheels for $(uname -m): the image is built for x86_64 and aarch64" 2 ;;
esac

new_venv() {  # a virtualenv with uv
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv "$1" || fail "cannot create a virtualenv at $1" 2
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" \
    || fail "cannot install uv==$UV_VERSION into $1 from the package index" 3
}

check_on_index() {  # every pin of lock $2 on the index for the image's Python and this platform (metadata only)
  local log
  log="$OUT/index-$(basename "$2").log"
  if ! "$1/bin/uv" pip install --dry-run --no-deps --index-url "$INDEX" --python-platform "$platform" \
      --python-version 3.12 --target "$OUT/.dry-run" -r "$2" >"$log" 2>&1; then
    local pin
    pin=$(grep -m1 -oE "no version of [^ ]+" "$log" | sed 's/^no version of //')
    [ -n "$pin" ] && fail "the index ($INDEX) lacks $pin, a pin of ${2#"$ROOT"/}" 3
    fail "cannot read ${2#"$ROOT"/}'s pins on $INDEX: $(grep -m1 -E "error:" "$log" | sed 's/^error: //')" 3
  fi
}

sync_env() {  # environment $1, exactly lock $2
  "$1/bin/uv" pip sync --quiet --python "$1/bin/python" --require-hashes --index-url "$INDEX" "$2" \
    >"$OUT/sync-$(basename "$1").log" 2>&1 \
    || fail "installing ${2#"$ROOT"/} into $1 failed: $(tail -n1 "$OUT/sync-$(basename "$1").log")" 3
}

started=$(date +%s)
new_venv "$VENV"
new_venv "$TITAN_VENV"
check_on_index "$VENV" "$LOCK"
check_on_index "$VENV" "$TITAN_LOCK"
say "every pin of ${LOCK#"$ROOT"/} and ${TITAN_LOCK#"$ROOT"/} is on $INDEX for $platform"
sync_env "$VENV" "$LOCK"
sync_env "$TITAN_VENV" "$TITAN_LOCK"
say "environments built from the locks in $(($(date +%s) - started)) s (Python $python_version)"

export PYTHONPATH="$ROOT/containers:$ROOT" PYTHONUNBUFFERED=1
eval "$("$VENV/bin/python" -m btk.training_environment)" || fail "cannot read the training jobs' environment" 2
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  "$VENV/bin/uv" pip freeze --python "$VENV/bin/python"
  env | grep -E '^(NCCL_|TORCH_NCCL_|PYTORCH_CUDA_ALLOC_CONF)' | sort
} >"$OUT/env.txt" 2>&1

read -r -a precisions <<<"$(printf '%s\n' "${cases[@]}" | awk 'previous == "--precision" { printf "--precision %s ", $0 } { previous = $0 }')"
precheck=(--json "$OUT/precheck.json")
[ "$gpu" = 0 ] && precheck+=(--until-cuda)
"$VENV/bin/python" -m btk_trainer.gpu_precheck "${precisions[@]}" "${precheck[@]}" \
  || fail "a GPU-only path failed its pre-check (above): no case was run" 1

# Default: Llama 3.2 3B where profiles/ has it (torchtitan has its flavor), else the smallest profile there.
default_profile=$("$VENV/bin/python" -c '
from btk import catalog
profiles = catalog.all_profiles()
smallest = min(profiles.values(), key=lambda profile: profile.architecture.parameter_count)
print("llama3.2-3b" if "llama3.2-3b" in profiles else smallest.name)') || fail "cannot read profiles/" 2
read -r -a profiles <<<"${BENCH_PROFILES:-$default_profile}"
profile_args=()
for name in "${profiles[@]}"; do profile_args+=(--profile "$name"); done
bench=("$VENV/bin/python" -m btk_trainer.bench "${profile_args[@]}" --instance ml.p5en.48xlarge --gpus 1
       "${cases[@]}" --json "$OUT/results.json" --markdown "$OUT/performance.md")
titan=("$VENV/bin/python" -m btk_trainer.titan_baseline --results "$OUT/results.json"
       --markdown "$OUT/performance.md" --python "$TITAN_VENV/bin/python" --workdir "$OUT/torchtitan")
if [ "$gpu" = 0 ]; then
  "${bench[@]}" --plan-only "${bench_args[@]}" >"$OUT/bench.log" 2>&1 || { cat "$OUT/bench.log"; fail "the benchmark's plan failed" 1; }
  grep '^btk-bench:' "$OUT/bench.log"
  "${titan[@]}" --until-cuda || fail "torchtitan cannot build the cases" 1
  say "no GPU here: every step ran up to the first CUDA call; nothing was measured"
  [ "$until_cuda" = 1 ] && exit 0
  exit 1
fi

cases_started=$(date +%s)
"${bench[@]}" --warmup 3 --steps 6 --phase-runs 1 --started-at "$cases_started" --budget-seconds "$((BUDGET * 3 / 5))" \
  "${bench_args[@]}" 2>&1 | tee "$OUT/bench.log" | grep -v '^btk_metric'
status=${PIPESTATUS[0]}
"${titan[@]}" --deadline "$((cases_started + BUDGET))"
titan_status=$?
say "cases took $(($(date +%s) - cases_started)) s of a $BUDGET s budget; records in $OUT"
[ -f "$OUT/performance.md" ] && cat "$OUT/performance.md"
[ "$status" = 0 ] && exit "$titan_status"
exit "$status"
