#!/usr/bin/env bash
# Set up the Python environment of the int8 tests and benchmarks: scikit-learn (whose wheel
# ships the `digits` data set), and ONNX with ONNX Runtime (the outside reference for int8
# accuracy and speed), pinned, in <repo>/.venv-edge. Safe to run repeatedly.
#
# Usage: scripts/setup-edge-pyenv.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"

# Tests, examples and benchmarks may run this at once: one at a time.
exec 9>"$REPO/.venv-edge.lock"
flock 9
ensure_venv setup-edge-pyenv "$REPO/.venv-edge" \
    "scikit-learn==1.8.0" "onnx==1.20.1" "onnxruntime==1.23.2" "numpy==2.3.5"
