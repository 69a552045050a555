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
VENV="$REPO/.venv-train"
PYTHON="${PYTHON:-python3}"

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

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup-train-bench-pyenv: creating virtualenv at $VENV"
    "$PYTHON" -m venv "$VENV"
fi

# Skip pip entirely when the pinned versions are already present.
if "$VENV/bin/python" - "$JAX_VERSION" "$NUMPY_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want_jax, want_np, want_torch = sys.argv[1:4]
ok = (version("jax") == want_jax and version("jaxlib") == want_jax
      and version("numpy") == want_np
      and version("torch").split("+")[0] == want_torch)
sys.exit(0 if ok else 1)
PY
then
    echo "setup-train-bench-pyenv: jax==${JAX_VERSION} numpy==${NUMPY_VERSION} torch==${TORCH_VERSION} already installed"
    exit 0
fi

echo "setup-train-bench-pyenv: installing ${REQUIREMENTS[*]} into $VENV"
echo "setup-train-bench-pyenv: note: torch from PyPI pulls its nvidia-* CUDA dependencies;"
echo "setup-train-bench-pyenv:       this downloads a few GB (~5.5 GB installed) and can take a while"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
echo "setup-train-bench-pyenv: done"
