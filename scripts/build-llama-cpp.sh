#!/usr/bin/env bash
# Build llama.cpp's own C++ tools (llama-bench, llama-server, llama-cli) from the sources inside
# the llama-cpp-python sdist, natively for this CPU (GGML_NATIVE=ON, as llama.cpp recommends for
# speed), into <repo>/.llama.cpp/. The benchmarks compare RLX with these, llama.cpp at its
# strongest. About 10 minutes on two cores the first time; later runs reuse the build.
#
# Prints the directory holding the binaries. Usage: scripts/build-llama-cpp.sh
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
VERSION="0.3.36"
DIR="$REPO/.llama.cpp"
BIN="$DIR/build/bin"

if [[ -x "$BIN/llama-bench" && -x "$BIN/llama-server" && -f "$DIR/version" && "$(cat "$DIR/version")" == "$VERSION" ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$DIR"
{
    # CMake and Ninja as wheels (no system packages needed).
    python3 -m pip install --quiet --disable-pip-version-check --only-binary :all: cmake ninja scikit-build-core
    if [[ ! -d "$DIR/src" ]]; then
        echo "build-llama-cpp: fetching the llama-cpp-python $VERSION sdist"
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
            --no-binary llama-cpp-python -d "$DIR/sdist" "llama-cpp-python==$VERSION"
        mkdir -p "$DIR/src"
        tar -xzf "$DIR"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$DIR/src" --strip-components=1
    fi
    echo "build-llama-cpp: configuring (GGML_NATIVE=ON)"
    cmake -S "$DIR/src/vendor/llama.cpp" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF
    echo "build-llama-cpp: building llama-bench, llama-server, llama-cli (several minutes)"
    cmake --build "$DIR/build" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target llama-bench llama-server llama-cli
    echo "$VERSION" >"$DIR/version"
} >&2
echo "$BIN"
