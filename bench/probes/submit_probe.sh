#!/usr/bin/env bash
# Instructions per call of Requests.submit under callgrind, the loop's own cost taken out:
#   bench/probes/submit_probe.sh PYTHON PYTHONPATH
# (PYTHONPATH: a directory holding the vtc package to measure, "" for the installed one)
set -euo pipefail
PY=$1; PP=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
for mode in submit none; do
  for calls in 2000 6000; do
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PP CALLS=$calls MODE=$mode valgrind --tool=callgrind \
      --callgrind-out-file="$out/cg" "$PY" "$here/submit_calls.py" 2>/dev/null
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/cg")
    eval "ir_${mode}_$calls=$ir"
  done
done
rm -rf "$out"
echo "$(( ((ir_submit_6000 - ir_submit_2000) - (ir_none_6000 - ir_none_2000)) / 4000 )) instructions per submit"
