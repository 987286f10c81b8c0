#!/usr/bin/env bash
# Download the wheels the H200 benchmark machine lacks into <repo>/.whl (git-ignored), for
# `run`'s carry. That machine has torch 2.11 (cu130) on Python 3.12 but no pydantic (needed by
# the btk core) and no torchao (needed for fp8). torchao 0.17 is the release paired with
# torch 2.11; its wheel is cp310-abi3, so it installs on 3.12.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
# torchao goes to .whl/torch211/ so a plain `pip install .whl/*.whl` elsewhere never sees two
# torchao versions (another torchao may sit in .whl/ itself); run_h200.sh prefers this one.
mkdir -p "$ROOT/.whl/torch211"
download() {
  local dest="$1"; shift
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dest" "$@"
}
download "$ROOT/.whl/torch211" "torchao==0.17.0"
download "$ROOT/.whl" "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
ls -laR "$ROOT/.whl"
