#!/usr/bin/env bash
# Reproduces the training-step table of docs/benchmarks.md: RLX against JAX jit and PyTorch
# eager on the same MLP and character GPT, alternating blocks in one run. Needs the train-bench
# venv (scripts/setup-train-bench-pyenv.sh; several GB because of torch's dependencies), or pass
# --train-python PATH. Extra arguments go to rlx-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p rlx-bench
# One thread: every framework pinned to the same core.
taskset -c 0 target/release/rlx-bench train --threads 1 "$@"
taskset -c 0,1 target/release/rlx-bench train --threads 2 "$@"
