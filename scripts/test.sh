#!/usr/bin/env bash
# The whole test suite, as CI runs it. Installs what the tests need that cargo cannot:
# Mesa's software Vulkan (lavapipe), so the GPU backend's tests run on a machine without a GPU,
# Python's venv module, in which the server tests install the `openai` client
# (scripts/setup-serve-pyenv.sh), and NVRTC from PyPI (.venv-cuda), with which the tests
# compile every CUDA kernel, and the edge targets' tools: the Arm cross compiler with newlib and
# QEMU (the Cortex-M C runs under emulation), Verilator and Yosys (the FPGA datapath is
# simulated and synthesized). It checks the code's formatting (`cargo fmt --check`) and runs
# clippy with warnings denied first.
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    echo "installing mesa-vulkan-drivers (software Vulkan for the GPU tests)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y -q mesa-vulkan-drivers >/dev/null 2>&1 || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q mesa-vulkan-drivers >/dev/null; }
fi
if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    echo "installing python3-venv (the server tests drive rlx serve with the openai client)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y -q python3-venv >/dev/null 2>&1 || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q python3-venv >/dev/null; }
fi
missing=()
command -v arm-none-eabi-gcc >/dev/null 2>&1 || missing+=(gcc-arm-none-eabi)
[ -e /usr/lib/arm-none-eabi/newlib/libc_nano.a ] || missing+=(libnewlib-arm-none-eabi)
command -v qemu-system-arm >/dev/null 2>&1 || missing+=(qemu-system-arm)
command -v verilator >/dev/null 2>&1 || missing+=(verilator)
command -v yosys >/dev/null 2>&1 || missing+=(yosys)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (the Cortex-M tests build C for Arm and run it under QEMU; the FPGA tests simulate with Verilator and synthesize with Yosys)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
# NVRTC from PyPI (no GPU needed): the CUDA backend's kernels are compiled for sm_80 and sm_90
# by the tests, so no kernel reaches a user uncompiled.
# shellcheck source=lib/venv.sh
source scripts/lib/venv.sh
ensure_venv test.sh .venv-cuda "nvidia-cuda-nvrtc==13.0.88" >&2
export RLX_NVRTC="${RLX_NVRTC:-$(ls "$PWD"/.venv-cuda/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 | head -1)}"
export RLX_REQUIRE_NVRTC=1
# Vulkan through wgpu; lavapipe's window-system layer wants a runtime directory.
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
# The code's form is rustfmt's (seconds; nothing is built), and clippy finds nothing (a check
# build, a few minutes; the lints allowed are listed in the workspace Cargo.toml).
cargo fmt --all --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo test --workspace "$@"
