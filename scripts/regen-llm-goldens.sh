#!/usr/bin/env bash
# Regenerate the llama.cpp reference files for RLX's LLM parity tests:
#   crates/rlx/tests/golden/llm/smollm2.json
#   crates/rlx/tests/golden/llm/gemma3.json
# the GGUF dequantization goldens (crates/rlx-gguf/tests/golden/dequant.json) and the
# tokenizer references (crates/rlx-gguf/tests/golden/tokenizer_extra.json: both models, and
# vocabulary-only copies of SmolLM2 under the Llama 3 / Qwen2 pre-tokenizer names).
#
# Sets up the pinned environment (scripts/setup-llm-pyenv.sh: llama-cpp-python,
# gguf, numpy in .venv-llm) and runs the generators with it. The outputs are
# deterministic for a given llama.cpp build and machine.
#
# Usage: scripts/regen-llm-goldens.sh [SMOLLM2_GGUF [GEMMA3_GGUF]]
# Model paths come from the arguments, else from $RLX_SMOLLM2_GGUF /
# $RLX_GEMMA3_GGUF, else from the defaults below.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"

# The cache `rlx` fetches the models into (`rlx fetch smollm2` and `rlx fetch gemma3` fill it).
CACHE="${RLX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlx}"
SMOLLM2="${1:-${RLX_SMOLLM2_GGUF:-$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf}}"
GEMMA3="${2:-${RLX_GEMMA3_GGUF:-$CACHE/gemma-3-270m-q4_k_m.gguf}}"

for f in "$SMOLLM2" "$GEMMA3"; do
    if [[ ! -f "$f" ]]; then
        echo "regen-llm-goldens: model file not found: $f" >&2
        exit 1
    fi
done

"$SCRIPT_DIR/setup-llm-pyenv.sh"

cd "$REPO"
PY=.venv-llm/bin/python
GOLDEN=crates/rlx/tests/golden/llm
$PY crates/rlx-gguf/tests/golden/gen_dequant.py
$PY "$GOLDEN/gen_llama_cpp.py" --model "$SMOLLM2" --name smollm2 --out "$GOLDEN/smollm2.json"
$PY "$GOLDEN/gen_llama_cpp.py" --model "$GEMMA3" --name gemma3 --out "$GOLDEN/gemma3.json"
$PY crates/rlx-gguf/tests/golden/gen_tokenizer.py "$SMOLLM2" "$GEMMA3"
