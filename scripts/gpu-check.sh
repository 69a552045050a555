#!/usr/bin/env bash
# The whole GPU check of the CUDA backend as one prepared command. Here (no GPU needed): build
# the test binaries that hold the CUDA tests and the `rlx` command, strip them and bundle them
# with a runner into <repo>/.gpu-check/ (git-ignored, well under 60 MiB). On the GPU machine, in
# a copy of the repository with .gpu-check/ beside it: `bash .gpu-check/run.sh`, which runs every
# test that needs a CUDA device (RLX_REQUIRE_CUDA=1: a missing device fails them), then the
# kernel compile check against the machine's own NVRTC, and prints one table.
#
# Usage: scripts/gpu-check.sh        (prints the command to run on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu-check
rm -rf "$OUT"
mkdir -p "$OUT/bin"
echo "gpu-check: building the test binaries (cargo test --no-run)" >&2
cargo test -p rlx --no-run --message-format=json --test ops_golden --test cuda_backend 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    cp "$exe" "$OUT/bin/$name"
    strip "$OUT/bin/$name"
done
cat >"$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run on the GPU machine from the repository root: every CUDA test, one table at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export RLX_REQUIRE_CUDA=1 RLX_REQUIRE_NVRTC=1 RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
declare -a rows
for t in cuda_backend ops_golden; do
    for filter in needs_cuda_device every_cuda_kernel; do
        start=$(date +%s.%N)
        if .gpu-check/bin/$t --test-threads=1 "$filter" 2>&1 | tee -a /tmp/gpu-check.log | grep -E "^test |CUDA|kernels|panicked" ; then :; fi
        status=${PIPESTATUS[0]}
        secs=$(python3 -c "import time;print(f'{time.time()-$start:.1f}')")
        rows+=("$t $filter: $([ "$status" = 0 ] && echo pass || echo FAIL) (${secs} s)")
    done
done
echo "== RLX CUDA GPU check =="
printf '%s\n' "${rows[@]}"
RUN
chmod +x "$OUT/run.sh"
du -sh "$OUT" >&2
echo "On the GPU machine, from the repository root (carry .gpu-check): bash .gpu-check/run.sh"
