#!/usr/bin/env bash
# The whole GPU check of the CUDA backend, prepared here (no GPU needed) and run on a GPU
# machine as one command.
#
# Here: build the test binaries that hold the CUDA tests, a release `rlx` and `rlx-bench`,
# strip them and bundle them, xz-compressed, with a runner into <repo>/.gpu-check/ (git-ignored;
# its size is printed at the end); with `--model`, also split SmolLM2's GGUF into two halves,
# .gpu-model-1/ and .gpu-model-2/, for copying to a GPU machine without network access in
# smaller pieces.
#
# There (from a copy of the repository, the folders beside it): the halves are joined into
# /tmp/rlx-cache, then `bash .gpu-check/run.sh` runs every test that needs a CUDA device
# (they are `#[ignore]`d, so it runs them with `--ignored`; a missing device fails them), the
# kernel compile check against the
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
cargo test -p rlx --no-run --message-format=json --test ops_golden --test cuda_backend --test gpu_llm --test complex --test registered_op --test serve_engine 2>/dev/null |
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
cargo build --release -p rlx-cli -p rlx-bench >&2
for b in rlx rlx-bench; do
    cp "target/release/$b" "$OUT/bin/$b"
    strip "$OUT/bin/$b"
done
# Compressed, so the bundle is small to copy to the GPU machine.
tar -C "$OUT" -cJf "$OUT/bin.tar.xz" bin
rm -rf "$OUT/bin"
# The CUBINs compiled here (by the tests, with RLX_NVRTC).
cache="${RLX_CACHE_DIR:-$HOME/.cache/rlx}"
[[ -d "$cache/cuda" ]] && tar -C "$cache" -cJf "$OUT/cubins.tar.xz" cuda
if [[ "${1:-}" == "--model" ]]; then
    model=$(cargo run --release -q -p rlx-cli -- fetch smollm2 2>/dev/null | tail -1 || true)
    [[ -f "$model" ]] || model="${RLX_CACHE_DIR:-$HOME/.cache/rlx}/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p .gpu-model-1 .gpu-model-2
    split -n 2 -d "$model" /tmp/gpu-model-part-
    mv /tmp/gpu-model-part-00 .gpu-model-1/part-00
    mv /tmp/gpu-model-part-01 .gpu-model-2/part-01
fi
# The commit the bundle is built from, for the record of GPU runs (docs/gpu-runs.md).
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- crates scripts || commit="$commit+changes"
echo "$commit" >"$OUT/COMMIT"
cat >"$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run on a GPU machine from the repository root: every CUDA test, the benchmarks, one table
# at the end (the whole log in $OUT when that is set, else /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
[[ -d .gpu-check/bin ]] || tar -C .gpu-check -xJf .gpu-check/bin.tar.xz
export RLX_REQUIRE_NVRTC=1 RLX_CACHE_DIR="${RLX_CACHE_DIR:-/tmp/rlx-cache}"
mkdir -p "$RLX_CACHE_DIR"
# Kernels compiled here before (CUBINs keyed by source, architecture and NVRTC version): a
# machine whose NVRTC has the same version skips compiling them again.
[[ -f .gpu-check/cubins.tar.xz ]] && tar -C "$RLX_CACHE_DIR" -xJf .gpu-check/cubins.tar.xz
model="$RLX_CACHE_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$model" && -f "$RLX_CACHE_DIR/part-00" && -f "$RLX_CACHE_DIR/part-01" ]]; then
    cat "$RLX_CACHE_DIR/part-00" "$RLX_CACHE_DIR/part-01" >"$model"
fi
# cuBLAS for the products: the system's, else the one in PyTorch's environment (the CUDA 13
# wheels put it in site-packages/nvidia/cu13/lib).
if [[ -z "${RLX_CUBLAS:-}" ]] && ! ldconfig -p | grep -q libcublas.so; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        for f in "$d"/nvidia/cu13/lib/libcublas.so.13 "$d"/nvidia/cublas/lib/libcublas.so.12; do
            [[ -f "$f" && -z "${RLX_CUBLAS:-}" ]] && export RLX_CUBLAS="$f"
        done
    done
fi
echo "cuBLAS: ${RLX_CUBLAS:-by name, through the system loader}"
# wgpu needs a Vulkan loader and glvnd (NVIDIA's Vulkan driver links to it): on a machine
# without them and without network access, Debian's libvulkan1, libglvnd0, ... downloaded
# elsewhere into .gl/ are unpacked; and NVIDIA's ICD file.
if ! ldconfig -p | grep -q libvulkan.so.1 && compgen -G ".gl/*.deb" >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[[ -f $icd && -z "${VK_DRIVER_FILES:-}" ]] && export VK_DRIVER_FILES=$icd
LOG="${OUT:-/tmp}/gpu-check.log"
# The run's results for the record of GPU runs: one line of JSON a check.
RECORD="${OUT:-/tmp}/gpu-run.checks"
: >"$RECORD"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a $LOG
declare -a rows
# run LABEL SECONDS CMD...: the command under a time limit, its key lines shown, a table row.
run() {
    local label="$1" limit="$2"
    shift 2
    local start status part
    start=$(date +%s.%N)
    part=$(mktemp)
    echo "== $label" | tee -a $LOG
    timeout "$limit" "$@" 2>&1 | tee -a $LOG | tee "$part" |
        grep -E "^test |CUDA|cuda|cuBLAS|random|agree|SmolLM2|Gemma|kernels|panicked|error|tok/s|pp[0-9]|tg[0-9]|NOT run|^load|^\\| "
    status=${PIPESTATUS[0]}
    python3 - "$label" "$status" "$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")" "$part" >>"$RECORD" <<'PY'
import json, re, sys
label, status, secs, part = sys.argv[1:]
tests = [{"name": m.group(1), "result": m.group(2)}
         for m in re.finditer(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", open(part, errors="replace").read(), re.M)]
print(json.dumps({"label": label, "status": "pass" if status == "0" else f"FAIL rc={status}",
                  "seconds": float(secs), "tests": tests}))
PY
    rm -f "$part"
    rows+=("$(printf '%-62s %s (%s s)' "$label" "$([ "$status" = 0 ] && echo pass || echo "FAIL rc=$status")" "$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")")")
}
B=.gpu-check/bin
run "cuda_backend: needs_cuda_device (training, precision)" 120 $B/cuda_backend --ignored --test-threads=1 needs_cuda_device
run "ops_golden: needs_cuda_device (op table)" 240 $B/ops_golden --ignored --test-threads=1 needs_cuda_device
run "gpu_llm: random SmolLM2/Gemma 3 shapes vs the CPU" 240 $B/gpu_llm --ignored --test-threads=1 needs_cuda_device_random
run "complex: JAX cases and a 4096-point FFT on CUDA" 120 $B/complex --ignored --test-threads=1 needs_cuda_device
run "registered_op: a crate's CUDA kernel on the device" 60 $B/registered_op --ignored --test-threads=1 needs_cuda_device
if [[ -f "$model" ]]; then
    run "gpu_llm: SmolLM2 vs the CPU" 240 $B/gpu_llm --ignored --test-threads=1 needs_cuda_device_smollm2
    run "serve_engine: 32 requests on CUDA, each as alone and after preemption" 300 $B/serve_engine --ignored --test-threads=1 needs_cuda_device_smollm2
fi
run "every CUDA kernel compiles with this machine's NVRTC" 120 sh -c "$B/cuda_backend every_cuda_kernel && $B/ops_golden every_cuda_kernel"
for m in smollm2 gemma3; do
    for d in cuda cpu; do
        run "rlx bench random:$m --device $d -p 512 -n 128 -r 3" 120 $B/rlx bench --model random:$m --device $d -p 512 -n 128 -r 3
    done
done
# Products against PyTorch's (cuBLAS) on the same GPU.
run "rlx-bench cuda-gemm (f32, bf16 at 4096, 8192) against torch.matmul" 180 $B/rlx-bench cuda-gemm --rounds 3 --reps 10
# Where a decode step's time goes: every launch timed with CUDA events (RLX_PROFILE).
export RLX_PROFILE=1 RLX_PROFILE_TOP=25
run "rlx bench random:smollm2 --device cuda, profiled" 120 $B/rlx bench --model random:smollm2 --device cuda -p 512 -n 32 -r 1
unset RLX_PROFILE RLX_PROFILE_TOP
echo "== CUDA profiles"
awk '/^rlx-cuda profile/{p=1} p&&!/^(rlx-cuda profile|  )/{p=0} p' $LOG
if [[ -f "$model" ]]; then
    run "rlx bench SmolLM2 --device cuda" 120 $B/rlx bench --model "$model" --device cuda -p 512 -n 128 -r 3
fi
if ldconfig -p | grep -q libvulkan.so.1; then
    # wgpu through the machine's Vulkan driver: the op table (c64 included), the quantized
    # products (subgroup sums where the driver has subgroups) and the workgroup-per-row
    # reductions, softmax and cumsum, the complex JAX cases and transforms, a crate's WGSL
    # kernel; then the benchmark with its profile.
    run "ops_golden: the op table on wgpu" 240 $B/ops_golden --test-threads=1 the_gpu_backend_matches
    run "ops_golden: quantized products, norm_matmul regions and long rows on wgpu" 240 $B/ops_golden --test-threads=1 quantized_products long_ rms_norms_taken_into_gpu
    run "complex: JAX cases and transforms on wgpu (and CUDA emulation)" 240 $B/complex --test-threads=1 on_the_gpus
    run "registered_op: a crate's WGSL kernel on wgpu" 60 $B/registered_op --test-threads=1 wgsl
    export RLX_PROFILE=1 RLX_PROFILE_TOP=12
    run "rlx bench random:smollm2 --device gpu (wgpu) -p 512 -n 16 -r 1, profiled" 120 $B/rlx bench --model random:smollm2 --device gpu -p 512 -n 16 -r 1
    unset RLX_PROFILE RLX_PROFILE_TOP
    run "rlx bench random:smollm2 --device gpu (wgpu) -p 512 -n 128 -r 1" 120 $B/rlx bench --model random:smollm2 --device gpu -p 512 -n 128 -r 1
    echo "== wgpu profiles"
    awk '/^rlx-wgpu profile/{p=1} p&&!/^(rlx-wgpu profile|  )/{p=0} p' $LOG
fi
echo "== RLX CUDA GPU check =="
printf '%s\n' "${rows[@]}" | tee -a $LOG
# The run for docs/gpu-runs.md: `scripts/gpu-record.py add gpu-run.json` where the repository is.
python3 - "$RECORD" "${OUT:-/tmp}/gpu-run.json" <<'PY'
import datetime, json, subprocess, sys
checks = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
except OSError:
    smi = []
name, driver = (smi[0].split(", ") + ["?"])[:2] if smi else ("no GPU found", "?")
run = {"commit": open(".gpu-check/COMMIT").read().strip(),
       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       "device": name, "driver": driver, "checks": checks}
json.dump(run, open(sys.argv[2], "w"), indent=1)
print(f"record: {sys.argv[2]} ({len(checks)} checks)")
PY
echo "log: $LOG"
RUN
chmod +x "$OUT/run.sh"
du -sh "$OUT" .gpu-model-* 2>/dev/null >&2 || true
echo "On the GPU machine, from the repository root, one call each, back to back (the machine keeps files only while warm):"
if [[ -d .gpu-model-1 ]]; then
    echo "  carry .gpu-model-1: mkdir -p /tmp/rlx-cache && cp .gpu-model-1/part-00 /tmp/rlx-cache/"
    echo "  carry .gpu-model-2: cp .gpu-model-2/part-01 /tmp/rlx-cache/"
fi
echo "  carry .gpu-check (and .gl for wgpu, see the device notes): bash .gpu-check/run.sh"
