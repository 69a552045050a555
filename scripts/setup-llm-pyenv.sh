#!/usr/bin/env bash
# Set up the Python environment holding the LLM references: llama.cpp (through
# llama-cpp-python, built from source by pip) and the `gguf` package whose
# `dequantize` is the reference for RLX's GGUF dequantization.
#
# Creates <repo>/.venv-llm (if missing). Building llama.cpp takes several
# minutes on two cores the first time; later runs reuse the venv.
#
# Usage: scripts/setup-llm-pyenv.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"
VENV="$REPO/.venv-llm"

# A native CPU build, so the speed comparison is against llama.cpp at its best on this machine.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_OPENMP=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

REQUIREMENTS=(
    "numpy==2.4.6"
    "gguf==0.19.0"
    "llama-cpp-python==0.3.36"
)

ensure_venv setup-llm-pyenv "$VENV" "${REQUIREMENTS[@]}"
