#!/usr/bin/env bash
# Fuzz the core's operation sequences with libFuzzer for a fixed budget.
#
#   scripts/fuzz.sh [SECONDS]      (default 300)
#
# Needs a nightly toolchain (rustup toolchain install nightly) and cargo-fuzz
# (installed here if missing). Findings land in fuzz/artifacts/ops/; the
# corpus in fuzz/corpus/ops/ is kept between runs (neither is committed).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-300}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
cargo +nightly fuzz run ops -- -max_total_time="$secs" -print_final_stats=1 2>&1 | tail -25
