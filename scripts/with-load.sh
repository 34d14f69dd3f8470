#!/usr/bin/env bash
# Run a command while competing processes keep every core busy (issue 14).
#
#   scripts/with-load.sh COMMAND [ARGS...]
#
# Starts one busy loop per core (LOAD_PROCS overrides the count), runs the
# command, stops the loops and exits with the command's status. Tests that
# wait for a fixed time instead of a condition fail under it; `make
# test-loaded` runs the whole suite this way.
set -euo pipefail

if [ $# -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
n=${LOAD_PROCS:-$(nproc)}
pids=()
stop_load() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait "${pids[@]}" 2>/dev/null || true
}
trap stop_load EXIT
for _ in $(seq "$n"); do
    ( while :; do :; done ) &
    pids+=("$!")
done
echo "with-load: $n busy loops (pids ${pids[*]}) while running: $*" >&2
set +e
"$@"
rc=$?
set -e
exit "$rc"
