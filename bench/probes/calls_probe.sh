#!/usr/bin/env bash
# Instructions per call of a probe script's loop under callgrind, the loop's own cost
# taken out:
#   bench/probes/calls_probe.sh PYTHON PYTHONPATH SCRIPT MODE [MODE...]
# SCRIPT runs its loop CALLS times in MODE, and the bare loop in MODE=none; each MODE
# is counted at 20,000 and 60,000 calls, and the difference of the differences with
# none's divided by 40,000. numpy's BLAS threads and the str hash seed are pinned:
# without that the totals vary by millions of instructions from run to run.
# (PYTHONPATH: a directory holding the vtc package to measure, "" for the installed one)
set -euo pipefail
PY=$1; PP=$2; SCRIPT=$3; shift 3
out=$(mktemp -d)
for mode in none "$@"; do
  for calls in 20000 60000; do
    OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONPATH=$PP CALLS=$calls MODE=$mode \
      valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$PY" "$SCRIPT" 2>/dev/null
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/cg")
    eval "ir_${mode}_$calls=$ir"
  done
done
rm -rf "$out"
for mode in "$@"; do
  a=ir_${mode}_60000; b=ir_${mode}_20000
  echo "$mode: $(( ((${!a} - ${!b}) - (ir_none_60000 - ir_none_20000)) / 40000 )) instructions per call"
done
