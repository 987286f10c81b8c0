#!/usr/bin/env bash
# Runs `make test`'s stages one after another, every one of them even after a failure, and
# prints which passed, failed or were skipped (a stage is skipped when one it needs failed).
# Exit status: 0 when every stage passed, 1 otherwise.
#
#   scripts/test_stages.sh MAKE STAGE[:NEEDED[,NEEDED...]] ...
set -uo pipefail
make_cmd="$1"
shift
declare -A outcome=()
order=()
summary=()
failed=0
for spec in "$@"; do
  stage="${spec%%:*}"
  needs=""
  [[ "$spec" == *:* ]] && needs="${spec#*:}"
  order+=("$stage")
  blocked=""
  for need in ${needs//,/ }; do
    if [[ "${outcome[$need]:-}" != passed ]]; then
      blocked="$need"
      break
    fi
  done
  if [[ -n "$blocked" ]]; then
    outcome[$stage]=skipped
    summary+=("$(printf '  %-8s %-11s (%s did not pass)' skipped "$stage" "$blocked")")
    continue
  fi
  echo "==> make $stage"
  started=$SECONDS
  if $make_cmd --no-print-directory "$stage"; then
    outcome[$stage]=passed
  else
    outcome[$stage]=failed
    failed=1
  fi
  summary+=("$(printf '  %-8s %-11s %4d s' "${outcome[$stage]}" "$stage" $((SECONDS - started)))")
done
echo
echo "make test: ${#order[@]} stages"
printf '%s\n' "${summary[@]}"
if ((failed)); then
  echo "make test: FAILED"
else
  echo "make test: all stages passed"
fi
exit "$failed"
