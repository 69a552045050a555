#!/usr/bin/env bash
# The whole GPU check of the CUDA backend, prepared here (no GPU needed) and run on a GPU
# machine as one command.
#
# Here: build the test binaries that hold the CUDA tests and a release `rlx`, strip them and
# bundle them, xz-compressed, with a runner into <repo>/.gpu-check/ (git-ignored, ~20 MB); with
# `--model`, also split SmolLM2's GGUF (98 MB) into two halves, .gpu-model-1/ and .gpu-model-2/,
# for machines that take at most 64 MiB at a time.
#
# There (from a copy of the repository, the folders beside it): the halves are joined into
# /tmp/rlx-cache, then `bash .gpu-check/run.sh` runs every test that needs a CUDA device
# (RLX_REQUIRE_CUDA=1: a missing device fails them), the kernel compile check against the
# machine's own NVRTC, SmolLM2 against the CPU and `rlx bench` on CUDA and on the CPU when the
# model is there, and prints one table.
#
# Usage: scripts/gpu-check.sh [--model]      (prints the commands to run on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu-check
rm -rf "$OUT" .gpu-model-1 .gpu-model-2
mkdir -p "$OUT/bin"
echo "gpu-check: building the test binaries (cargo test --no-run) and rlx (release)" >&2
cargo test -p rlx --no-run --message-format=json --test ops_golden --test cuda_backend --test gpu_llm 2>/dev/null |
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
cargo build --release -p rlx-cli >&2
cp target/release/rlx "$OUT/bin/rlx"
strip "$OUT/bin/rlx"
# Compressed: the stripped binaries take ~65 MB, a machine takes 64 MiB a call (the checkout's
# tracked files included).
tar -C "$OUT" -cJf "$OUT/bin.tar.xz" bin
rm -rf "$OUT/bin"
if [[ "${1:-}" == "--model" ]]; then
    model=$(cargo run --release -q -p rlx-cli -- fetch smollm2 2>/dev/null | tail -1 || true)
    [[ -f "$model" ]] || model="${RLX_CACHE_DIR:-$HOME/.cache/rlx}/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p .gpu-model-1 .gpu-model-2
    split -n 2 -d "$model" /tmp/gpu-model-part-
    mv /tmp/gpu-model-part-00 .gpu-model-1/part-00
    mv /tmp/gpu-model-part-01 .gpu-model-2/part-01
fi
cat >"$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run on the GPU machine from the repository root: every CUDA test, one table at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ -d .gpu-check/bin ]] || tar -C .gpu-check -xJf .gpu-check/bin.tar.xz
export RLX_REQUIRE_CUDA=1 RLX_REQUIRE_NVRTC=1 RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
mkdir -p "$RLX_CACHE_DIR"
model="$RLX_CACHE_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$model" && -f "$RLX_CACHE_DIR/part-00" && -f "$RLX_CACHE_DIR/part-01" ]]; then
    cat "$RLX_CACHE_DIR/part-00" "$RLX_CACHE_DIR/part-01" >"$model"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
declare -a rows
run() {
    local label="$1"
    shift
    local start status
    start=$(date +%s.%N)
    "$@" 2>&1 | tee -a /tmp/gpu-check.log | grep -E "^test |CUDA|SmolLM2|kernels|panicked|tok/s|pp[0-9]|tg[0-9]"
    status=${PIPESTATUS[0]}
    rows+=("$(printf '%-58s %s (%s s)' "$label" "$([ "$status" = 0 ] && echo pass || echo FAIL)" "$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")")")
}
for t in cuda_backend ops_golden; do
    run "$t: needs_cuda_device" .gpu-check/bin/$t --test-threads=1 needs_cuda_device
    run "$t: every_cuda_kernel (NVRTC here)" .gpu-check/bin/$t --test-threads=1 every_cuda_kernel
done
if [[ -f "$model" ]]; then
    run "gpu_llm: needs_cuda_device (SmolLM2)" .gpu-check/bin/gpu_llm --test-threads=1 needs_cuda_device
    run "rlx bench SmolLM2 --device cuda" .gpu-check/bin/rlx bench --model "$model" --device cuda -p 512 -n 128 -r 3
    run "rlx bench SmolLM2 --device cpu" .gpu-check/bin/rlx bench --model "$model" --device cpu -p 512 -n 128 -r 3
else
    rows+=("SmolLM2 (no model at $model): NOT run")
fi
echo "== RLX CUDA GPU check =="
printf '%s\n' "${rows[@]}"
RUN
chmod +x "$OUT/run.sh"
du -sh "$OUT" .gpu-model-* 2>/dev/null >&2 || true
echo "On the GPU machine, from the repository root, one call each, back to back (the machine keeps files only while warm):"
if [[ -d .gpu-model-1 ]]; then
    echo "  carry .gpu-model-1: mkdir -p /tmp/rlx-cache && cp .gpu-model-1/part-00 /tmp/rlx-cache/"
    echo "  carry .gpu-model-2: cp .gpu-model-2/part-01 /tmp/rlx-cache/"
fi
echo "  carry .gpu-check:   bash .gpu-check/run.sh"
