#!/usr/bin/env bash
# Reproduces the LLM table of docs/benchmarks.md: `rlx bench` against llama.cpp's own C++
# `llama-bench` (flash attention off and on; built natively from the llama-cpp-python sdist by
# scripts/build-llama-cpp.sh) on SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M, interleaved, at 1
# and 2 threads. Builds the release CLI and llama.cpp and fetches the models on first use.
# Extra arguments go to llm_compare.py (e.g. --rounds 5 --repeats 3 -p 512 -n 128).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p rlx-cli
bin=$(scripts/build-llama-cpp.sh)
smollm2=$(target/release/rlx fetch smollm2)
gemma3=$(target/release/rlx fetch gemma3)
python3 crates/rlx-bench/python/llm_compare.py --rlx target/release/rlx --llama-bench "$bin/llama-bench" \
    --model "SmolLM2-135M Q4_1=$smollm2" --model "Gemma-3-270M Q4_K_M=$gemma3" "$@"
