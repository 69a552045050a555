#!/usr/bin/env bash
# Set up the Python environment for the training-step reference benchmark
# (crates/rlx-bench/python/train_ref.py: JAX and PyTorch).
#
# Creates a virtualenv at <repo>/.venv-train (if missing) and installs pinned
# jax[cpu], numpy and torch into it. It is separate from <repo>/.venv (the
# golden-value env of scripts/setup-pyenv.sh) because torch is large.
#
# torch is installed from PyPI, whose Linux x86_64 wheel depends on the CUDA
# runtime packages (nvidia-*): expect a download of a few GB and about 5.5 GB
# on disk, even though the benchmark only uses the CPU.
#
# Safe to run repeatedly: the venv is reused and pip is skipped when the
# pinned versions are already installed.
#
# Usage: scripts/setup-train-bench-pyenv.sh
#        PYTHON=python3.12 scripts/setup-train-bench-pyenv.sh   # other base python
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"
VENV="$REPO/.venv-train"

# Pinned versions. Bump deliberately: the reference timings move with them.
JAX_VERSION="0.10.2"
NUMPY_VERSION="2.4.6"
TORCH_VERSION="2.15.0"
REQUIREMENTS=(
    "jax[cpu]==${JAX_VERSION}"
    "jaxlib==${JAX_VERSION}"
    "numpy==${NUMPY_VERSION}"
    "torch==${TORCH_VERSION}"
)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "$0: note: torch from PyPI pulls its nvidia-* CUDA dependencies;"
    echo "$0:       this downloads a few GB (~5.5 GB installed) and can take a while"
fi
ensure_venv setup-train-bench-pyenv "$VENV" "${REQUIREMENTS[@]}"
