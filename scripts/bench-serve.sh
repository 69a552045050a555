#!/usr/bin/env bash
# Serving benchmark: `rlx serve` against llama.cpp's `llama-server` (built natively from the
# llama-cpp-python sdist's sources by scripts/build-llama-cpp.sh) on the same model, threads and
# workload, in the same run, alternating servers at every concurrency level. Each level starts
# both servers with as many slots as clients (`--parallel` / `-np`) and a KV cache of 512 rows
# per slot; clients stream completions back to back (a ~110-token prompt sharing its first
# ~90 tokens, MAX_TOKENS generated with ignore_eos) through the `openai` client.
#
# Usage: scripts/bench-serve.sh [MODEL...]   (default: smollm2 gemma3)
# Env: THREADS (2), LEVELS ("1 4 16 64"), MAX_TOKENS (128), ROUNDS (1), RLX_BASE (a second rlx
# binary, say an earlier commit's, served as "rlx-base" beside the others: a same-run A/B)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
LEVELS="${LEVELS:-1 4 16 64}"
MAX_TOKENS="${MAX_TOKENS:-128}"
ROUNDS="${ROUNDS:-1}"
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(smollm2 gemma3)

scripts/setup-serve-pyenv.sh >&2
LLAMA_BIN="$(scripts/build-llama-cpp.sh | tail -1)"
cargo build --release -p rlx-cli >&2
RLX=target/release/rlx
PY=.venv-serve/bin/python
PORT=18531

wait_up() {
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "server did not come up" >&2
    return 1
}

echo "| model | clients | server | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
for m in "${MODELS[@]}"; do
    path="$($RLX fetch "$m")"
    for round in $(seq 1 "$ROUNDS"); do
        for c in $LEVELS; do
            requests=$(( c < 4 ? 4 : c * 2 ))
            [ "$c" -ge 64 ] && requests=$c
            ctx=$(( c * 512 ))
            for server in rlx ${RLX_BASE:+rlx-base} llama-server; do
                if [ "$server" != llama-server ]; then
                    bin=$RLX
                    [ "$server" = rlx-base ] && bin=$RLX_BASE
                    $bin serve --model "$path" --port $PORT --parallel "$c" --ctx-size "$ctx" \
                        --threads "$THREADS" >/dev/null 2>&1 &
                else
                    "$LLAMA_BIN/llama-server" -m "$path" --port $PORT -np "$c" -c "$ctx" \
                        -t "$THREADS" -tb "$THREADS" >/dev/null 2>&1 &
                fi
                pid=$!
                wait_up
                out=$($PY scripts/lib/bench_serve.py "http://127.0.0.1:$PORT" "$c" "$requests" "$MAX_TOKENS")
                kill "$pid"
                wait "$pid" 2>/dev/null || true
                echo "$out" | $PY -c "
import json, sys
d = json.load(sys.stdin)
ms = lambda x: f'{1000 * x:.0f} ms'
print(f\"| $m | $c | $server | {d['tok_s']:.1f} | {ms(d['ttft_p50'])} | {ms(d['ttft_p99'])} | {ms(d['itl_p50'])} | {ms(d['itl_p99'])} |\")"
            done
        done
    done
done
