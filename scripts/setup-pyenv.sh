#!/usr/bin/env bash
# Set up the Python environment used to (re)generate golden test values.
#
# Creates a virtualenv at <repo>/.venv (if missing) and installs pinned
# versions of numpy and jax[cpu] into it. Safe to run repeatedly: the venv is
# reused and pip is skipped when the pinned versions are already installed.
#
# Usage: scripts/setup-pyenv.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
VENV="$REPO/.venv"
PYTHON="${PYTHON:-python3}"

# Pinned versions. Bump these deliberately and regenerate the goldens
# (scripts/regen-goldens.sh) when you do.
NUMPY_VERSION="2.4.6"
JAX_VERSION="0.10.2"
ML_DTYPES_VERSION="0.6.0"   # bfloat16 support; a jax dependency
REQUIREMENTS=(
    "numpy==${NUMPY_VERSION}"
    "jax[cpu]==${JAX_VERSION}"
    "jaxlib==${JAX_VERSION}"
    "ml_dtypes==${ML_DTYPES_VERSION}"
)

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup-pyenv: creating virtualenv at $VENV"
    "$PYTHON" -m venv "$VENV"
fi

# Skip pip entirely when the pinned versions are already present.
if "$VENV/bin/python" - "$NUMPY_VERSION" "$JAX_VERSION" "$ML_DTYPES_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want_np, want_jax, want_mld = sys.argv[1:4]
ok = (version("numpy") == want_np and version("jax") == want_jax
      and version("jaxlib") == want_jax and version("ml_dtypes") == want_mld)
sys.exit(0 if ok else 1)
PY
then
    echo "setup-pyenv: numpy==${NUMPY_VERSION} jax==${JAX_VERSION} ml_dtypes==${ML_DTYPES_VERSION} already installed"
    exit 0
fi

echo "setup-pyenv: installing ${REQUIREMENTS[*]}"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
echo "setup-pyenv: done"
