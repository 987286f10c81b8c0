#!/usr/bin/env bash
# Download the wheels an H200 machine without a package index lacks into <repo>/.whl (git-ignored),
# which goes to that machine with the repository. Run it where PyPI is reachable:
#
#   containers/bench/fetch_wheels.sh
#
# The pins and the reason for each: containers/bench/wheels.txt. They are fetched for that
# machine (CPython 3.12, manylinux x86_64), without dependencies (wheels.txt names each one),
# and any other version of a pinned package in .whl/ is removed first: pip refuses to install
# two versions of one package, and run_h200.sh installs every wheel in .whl/.
# PYTHON: the interpreter whose pip downloads (default <repo>/.venv/bin/python); WHEELS: where to.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DEST="${WHEELS:-$ROOT/.whl}"
PINS="$ROOT/containers/bench/wheels.txt"
mkdir -p "$DEST"
while read -r pin _; do
  case "$pin" in '' | '#'*) continue ;; esac
  name="${pin%%==*}"
  rm -f "$DEST/${name//-/_}"-*.whl  # wheel file names spell - as _
done <"$PINS"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" -r "$PINS"
duplicates=$(find "$DEST" -maxdepth 1 -name '*.whl' -printf '%f\n' | cut -d- -f1 | tr '[:upper:]' '[:lower:]' | sort | uniq -d)
if [ -n "$duplicates" ]; then
  echo "fetch_wheels: more than one wheel of: $duplicates in $DEST (pip would refuse them); remove the extra ones" >&2
  exit 1
fi
ls -l "$DEST"/*.whl
du -sh "$DEST"
