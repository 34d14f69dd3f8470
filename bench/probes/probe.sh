#!/usr/bin/env bash
# Instructions per id of decode(<list of ids>, 1) under callgrind:
#   bench/probes/probe.sh PYTHON PYTHONPATH NC [MODE]
# (PYTHONPATH: a directory holding the vtc package to measure, "" for the installed one)
set -euo pipefail
PY=$1; PP=$2; NC=$3; MODE=${4:-int}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
ids=512; [ "$NC" = 10000 ] && ids=480
for calls in 0 1000; do
  PYTHONPATH=$PP NC=$NC CALLS=$calls MODE=$MODE valgrind --tool=callgrind \
    --callgrind-out-file="$out/cg.$calls" "$PY" "$here/decode_calls.py" 2>/dev/null
  ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/cg.$calls")  # (Ir: the first event)
  eval "ir_$calls=$ir"
done
rm -rf "$out"
echo "NC=$NC $MODE: $(( (ir_1000 - ir_0) / (1000 * ids) )) instructions per id"
