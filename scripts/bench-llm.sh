#!/usr/bin/env bash
# Reproduces the LLM table of docs/benchmarks.md: `rlx bench` against llama.cpp (llama-cpp-python,
# flash attention off and on) on SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M, interleaved, at 1 and
# 2 threads. Builds the release CLI, sets up .venv-llm (scripts/setup-llm-pyenv.sh) and fetches
# the models into the cache on first use. Extra arguments go to llm_compare.py
# (e.g. --rounds 5 --repeats 3 -p 512 -n 128).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p rlx-cli
scripts/setup-llm-pyenv.sh >/dev/null
smollm2=$(target/release/rlx fetch smollm2)
gemma3=$(target/release/rlx fetch gemma3)
.venv-llm/bin/python crates/rlx-bench/python/llm_compare.py --rlx target/release/rlx \
    --model "SmolLM2-135M Q4_1=$smollm2" --model "Gemma-3-270M Q4_K_M=$gemma3" "$@"
