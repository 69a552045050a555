# Shared by the setup-*-pyenv.sh scripts: create a virtualenv if missing and install pinned
# requirements, skipping pip when every pin is already satisfied.
#
# ensure_venv TAG VENV_DIR REQUIREMENT...   (requirements as "name==version" or "name[extra]==version")
ensure_venv() {
    local tag="$1" venv="$2"
    shift 2
    local python="${PYTHON:-python3}"
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "$tag: creating virtualenv at $venv"
        "$python" -m venv "$venv"
    fi
    # Local version suffixes (torch's "+cu132") do not count against a pin.
    if "$venv/bin/python" - "$@" <<'PY' 2>/dev/null
import re, sys
from importlib.metadata import version
for req in sys.argv[1:]:
    name, want = req.split("==")
    if version(re.sub(r"\[.*\]", "", name)).split("+")[0] != want:
        sys.exit(1)
PY
    then
        echo "$tag: $* already installed"
        return 0
    fi
    echo "$tag: installing $* into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    echo "$tag: done"
}
