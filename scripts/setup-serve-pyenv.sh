#!/usr/bin/env bash
# Set up the Python environment the server tests drive `rlx serve` with: the real `openai`
# client from PyPI, pinned, in <repo>/.venv-serve. Safe to run repeatedly.
#
# Usage: scripts/setup-serve-pyenv.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/.." && pwd))"
# shellcheck source=lib/venv.sh
source "$SCRIPT_DIR/lib/venv.sh"

OPENAI_VERSION="3.57.0"
ensure_venv setup-serve-pyenv "$REPO/.venv-serve" "openai==${OPENAI_VERSION}"
