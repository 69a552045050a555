#!/usr/bin/env bash
# Regenerate all golden reference files (crates/rlx/tests/golden/ops.json, jax_parity.json,
# precision.json, complex.json and the downstream crates' linalg.json, sparse.json and splat.json).
#
# Sets up the pinned Python environment (scripts/setup-pyenv.sh) and runs the
# generators with it. The output is deterministic: running this twice with the
# same pinned versions produces byte-identical files.
#
# Usage: scripts/regen-goldens.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"

"$SCRIPT_DIR/setup-pyenv.sh"

cd "$REPO"
.venv/bin/python crates/rlx/tests/golden/gen_ops.py
.venv/bin/python crates/rlx/tests/golden/gen_jax_parity.py
.venv/bin/python crates/rlx/tests/golden/gen_precision.py
.venv/bin/python crates/rlx/tests/golden/gen_complex.py
.venv/bin/python crates/rlx-linalg/tests/golden/gen_linalg.py
.venv/bin/python crates/rlx-sparse/tests/golden/gen_sparse.py
.venv/bin/python crates/rlx-splat/tests/golden/gen_splat.py
