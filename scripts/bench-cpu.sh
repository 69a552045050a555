#!/usr/bin/env bash
# Reproduces the CPU kernel tables of docs/benchmarks.md: RLX against numpy (OpenBLAS) in the
# same run, alternating blocks of repetitions. Extra arguments go to rlx-bench (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-pyenv.sh >/dev/null
cargo build --release -q -p rlx-bench
# One thread: both sides pinned to the same core, so they run on the same hardware thread.
taskset -c 0 target/release/rlx-bench all --threads 1 "$@"
target/release/rlx-bench all --threads 2 "$@"
