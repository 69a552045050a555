#!/usr/bin/env bash
# Set up the Python environment used to (re)generate golden test values.
#
# Creates a virtualenv at <repo>/.venv (if missing) and installs pinned
# versions of numpy, jax[cpu], scipy and ai-edge-litert (TFLite's interpreter) into
# it. Safe to run repeatedly: the venv is reused and pip is skipped when the pinned
# versions are already installed.
#
# Usage: scripts/setup-pyenv.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"
VENV="$REPO/.venv"

# Pinned versions. Bump these deliberately and regenerate the goldens
# (scripts/regen-goldens.sh) when you do.
NUMPY_VERSION="2.4.6"
JAX_VERSION="0.10.2"
ML_DTYPES_VERSION="0.6.0"   # bfloat16 support; a jax dependency
SCIPY_VERSION="1.17.1"      # scipy.sparse checks the sparse goldens; a jax dependency
LITERT_VERSION="2.3.0"      # TFLite's interpreter: the int8 integer ops' goldens in gen_ops.py
FLATBUFFERS_VERSION="25.12.19"  # packs the .tflite models; an ai-edge-litert dependency
REQUIREMENTS=(
    "numpy==${NUMPY_VERSION}"
    "jax[cpu]==${JAX_VERSION}"
    "jaxlib==${JAX_VERSION}"
    "ml_dtypes==${ML_DTYPES_VERSION}"
    "scipy==${SCIPY_VERSION}"
    "ai-edge-litert==${LITERT_VERSION}"
    "flatbuffers==${FLATBUFFERS_VERSION}"
)

ensure_venv setup-pyenv "$VENV" "${REQUIREMENTS[@]}"
