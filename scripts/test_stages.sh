#!/usr/bin/env bash
# Runs `make test`'s stages, every one of them even after a failure, and prints which passed, failed or
# were skipped (a stage is skipped when one it needs failed).
# Exit status: 0 when every stage passed, 1 otherwise.
#
#   scripts/test_stages.sh MAKE STAGE[:NEEDED[,NEEDED...]][&] ...
#
# A stage whose spec ends in `&` runs in the background beside the stages after it (a single-threaded
# check beside the parallel test run fills the cores the tests leave idle); its output is printed whole
# when it ends, and a stage that needs it waits for it. Every stage's time is its own, start to end.
set -uo pipefail
make_cmd="$1"
shift
declare -A outcome=() seconds=() pid_of=() log_of=() started=()
order=()
failed=0
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT

record() {  # record STAGE EXIT_STATUS SECONDS
  if [[ "$2" == 0 ]]; then outcome[$1]=passed; else outcome[$1]=failed; failed=1; fi
  seconds[$1]=$3
}

finish() {  # finish STAGE: wait for a background stage, print its output, record its outcome
  local stage="$1" status
  wait "${pid_of[$stage]}"
  status=$?
  echo "==> make $stage (ran in the background)"
  cat "${log_of[$stage]}"
  record "$stage" "$status" "$(($(cat "${log_of[$stage]}.end") - started[$stage]))"
  unset "pid_of[$stage]"
}

for spec in "$@"; do
  background=0
  if [[ "$spec" == *'&' ]]; then
    background=1
    spec="${spec%&}"
  fi
  stage="${spec%%:*}"
  needs=""
  [[ "$spec" == *:* ]] && needs="${spec#*:}"
  order+=("$stage")
  blocked=""
  for need in ${needs//,/ }; do
    [[ -n "${pid_of[$need]:-}" ]] && finish "$need"
    if [[ "${outcome[$need]:-}" != passed ]]; then
      blocked="$need"
      break
    fi
  done
  if [[ -n "$blocked" ]]; then
    outcome[$stage]=skipped
    seconds[$stage]="$blocked"
    continue
  fi
  started[$stage]=$(date +%s)
  if ((background)); then
    echo "==> make $stage (in the background; its output follows when it ends)"
    log_of[$stage]="$workdir/$stage.log"
    ($make_cmd --no-print-directory "$stage" >"${log_of[$stage]}" 2>&1; status=$?; date +%s >"${log_of[$stage]}.end"
     exit "$status") &
    pid_of[$stage]=$!
    continue
  fi
  echo "==> make $stage"
  $make_cmd --no-print-directory "$stage"
  record "$stage" $? "$(($(date +%s) - started[$stage]))"
done
for stage in "${order[@]}"; do
  [[ -n "${pid_of[$stage]:-}" ]] && finish "$stage"
done

echo
echo "make test: ${#order[@]} stages"
width=11  # the stage column: as wide as the longest name
for stage in "${order[@]}"; do
  ((${#stage} > width)) && width=${#stage}
done
for stage in "${order[@]}"; do
  if [[ "${outcome[$stage]}" == skipped ]]; then
    printf '  %-8s %-*s (%s did not pass)\n' skipped "$width" "$stage" "${seconds[$stage]}"
  else
    printf '  %-8s %-*s %4d s\n' "${outcome[$stage]}" "$width" "$stage" "${seconds[$stage]}"
  fi
done
if ((failed)); then
  echo "make test: FAILED"
else
  echo "make test: all stages passed"
fi
exit "$failed"
