#!/usr/bin/env bash
# Sentence-embedding benchmark: `rlx embed --bench` against sentence-transformers on PyTorch
# (CPU) and ONNX Runtime (the same model exported to ONNX here), all-MiniLM-L6-v2, same texts,
# batch size and threads, in the same run: every round runs RLX then both references for each
# setting. Texts (scripts/lib/embed_texts.py): "short" = 256 sentences of 11-15 tokens, "long"
# = 64 texts of 128 tokens. Prints a Markdown table of sentences/s (median over rounds of each
# round's median pass; min-max over rounds) and RLX's ratio to each reference, for RLX in
# f32 (the default) and in bf16 (`--precision bf16`: products and attention in bf16, weights
# stored in bf16); PyTorch also under bf16 autocast (the reference at RLX bf16's precision).
#
# Usage: scripts/bench-embed.sh
# Env: ROUNDS (2), SECONDS_PER_RUN (5), TEXTS ("short long"), BATCHES ("1 32"), THREADS_LIST ("1 2")
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-2}"
SECS="${SECONDS_PER_RUN:-5}"
TEXTS="${TEXTS:-short long}"
BATCHES="${BATCHES:-1 32}"
THREADS_LIST="${THREADS_LIST:-1 2}"

scripts/setup-embed-pyenv.sh >&2
cargo build --release -p rlx-cli >&2
RLX=target/release/rlx
PY=.venv-embed/bin/python
MODEL="$($RLX fetch minilm)"
DATA=target/embed-texts
$PY scripts/lib/embed_texts.py "$DATA" >&2
OUT="$(mktemp -d)"

for round in $(seq 1 "$ROUNDS"); do
    for t in $TEXTS; do
        for b in $BATCHES; do
            for th in $THREADS_LIST; do
                key="$t $b $th"
                echo "round $round: $key" >&2
                $RLX embed --model "$MODEL" -b "$b" -t "$th" --bench "$SECS" < "$DATA/$t.txt" \
                    | $PY -c 'import json,sys; print(json.load(sys.stdin)["median"])' >> "$OUT/rlx $key"
                $RLX embed --model "$MODEL" -b "$b" -t "$th" --bench "$SECS" --precision bf16 \
                    < "$DATA/$t.txt" \
                    | $PY -c 'import json,sys; print(json.load(sys.stdin)["median"])' >> "$OUT/bf16 $key"
                $PY scripts/lib/bench_embed.py --texts "$DATA/$t.txt" --batch "$b" --threads "$th" \
                    --seconds "$SECS" --backend all --json 2>/dev/null > "$OUT/ref"
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["torch"]["median"])' "$OUT/ref" >> "$OUT/torch $key"
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["onnx"]["median"])' "$OUT/ref" >> "$OUT/onnx $key"
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["torch_bf16"]["median"])' "$OUT/ref" >> "$OUT/torch-bf16 $key"
                $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["torch_bf16_check"]["min_cosine"])' "$OUT/ref" >> "$OUT/torch-bf16-cos"
            done
        done
    done
done

$PY - "$OUT" "$TEXTS" "$BATCHES" "$THREADS_LIST" <<'PY'
import statistics, sys
out, texts, batches, threads = sys.argv[1], *(s.split() for s in sys.argv[2:])
def vals(kind, key):
    return [float(x) for x in open(f"{out}/{kind} {key}").read().split()]
def cell(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
print("| texts | batch | threads | RLX | RLX bf16 | PyTorch | PyTorch bf16 | ONNX Runtime | RLX / PyTorch | RLX / ORT | bf16 / PyTorch | bf16 / PyTorch bf16 | bf16 / ORT |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for t in texts:
    for b in batches:
        for th in threads:
            key = f"{t} {b} {th}"
            r, h, p, pb, o = (vals(k, key) for k in ("rlx", "bf16", "torch", "torch-bf16", "onnx"))
            m = statistics.median
            print(f"| {t} | {b} | {th} | {cell(r)} | {cell(h)} | {cell(p)} | {cell(pb)} | {cell(o)} | "
                  f"{m(r)/m(p):.2f}x | {m(r)/m(o):.2f}x | {m(h)/m(p):.2f}x | {m(h)/m(pb):.2f}x | "
                  f"{m(h)/m(o):.2f}x |")
cos = [float(x) for x in open(f"{out}/torch-bf16-cos").read().split()]
print(f"\nPyTorch bf16 (autocast) against PyTorch f32: lowest cosine {min(cos):.6f}")
PY
rm -rf "$OUT"
