#!/usr/bin/env python3
"""RLX against llama.cpp on the same GGUF models, interleaved in one run.

For every round, model and thread count it runs, one after the other: ``rlx bench --json``,
then llama.cpp (``llama_cpp_bench.py``) with flash attention off and on. One-thread runs are
pinned to core 0 (``taskset``). Every process measures load time, time to first token (32-token
prompt), pp (prompt processing, one batch) and tg (tokens generated one at a time) and reports
its peak RSS. The summary takes the median over all samples of all rounds and the min..max
spread, and prints RLX / llama.cpp ratios (> 1 means RLX is faster; < 1 for memory and times
means RLX uses less).

Usage: llm_compare.py --rlx target/release/rlx --model NAME=PATH [--model ...]
                      [--threads 1 2] [--rounds 3] [--repeats 3] [-p 512] [-n 128]
                      [--jsonl out.jsonl]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, threads):
    if threads == 1:
        cmd = ["taskset", "-c", "0"] + cmd
    env = dict(os.environ, RLX_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--jsonl")
    a = ap.parse_args()
    models = [m.split("=", 1) for m in a.model]
    rows = []
    for rnd in range(a.rounds):
        for name, path in models:
            for t in a.threads:
                common = ["-p", str(a.p), "-n", str(a.n)]
                jobs = [
                    ("rlx", [a.rlx, "bench", "--model", path, "-t", str(t), "-r", str(a.repeats), "--json"] + common),
                    ("llama.cpp", [sys.executable, os.path.join(HERE, "llama_cpp_bench.py"), "--model", path,
                                   "--threads", str(t), "--flash-attn", "0", "--repeats", str(a.repeats), "--json"] + common),
                    ("llama.cpp FA", [sys.executable, os.path.join(HERE, "llama_cpp_bench.py"), "--model", path,
                                      "--threads", str(t), "--flash-attn", "1", "--repeats", str(a.repeats), "--json"] + common),
                ]
                for tool, cmd in jobs:
                    r = run(cmd, t)
                    rows.append({"round": rnd, "model": name, "threads": t, "tool": tool, "result": r})
                    print(f"round {rnd} {name} t={t} {tool}: pp {r['pp_tok_s']['median']:.1f} tg {r['tg_tok_s']['median']:.1f} tok/s",
                          file=sys.stderr)
    if a.jsonl:
        with open(a.jsonl, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    def pool(name, t, tool, key):
        vals = []
        for r in rows:
            if (r["model"], r["threads"], r["tool"]) == (name, t, tool):
                v = r["result"][key]
                vals.extend(v["samples"] if isinstance(v, dict) else [v])
        return vals

    def fmt(v):
        return f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"

    print("| model | threads | metric | RLX | llama.cpp | llama.cpp FA | RLX / llama.cpp | RLX / FA |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, _ in models:
        for t in a.threads:
            for key, label in [("pp_tok_s", f"pp{a.p} tok/s"), ("tg_tok_s", f"tg{a.n} tok/s"), ("ttft_ms", "TTFT ms"),
                               ("load_s", "load s"), ("peak_rss_kib", "peak RSS MiB")]:
                v = {tool: pool(name, t, tool, key) for tool in ("rlx", "llama.cpp", "llama.cpp FA")}
                if key == "peak_rss_kib":
                    v = {k: [x / 1024 for x in xs] for k, xs in v.items()}
                m = {k: statistics.median(xs) for k, xs in v.items()}
                print(f"| {name} | {t} | {label} | {fmt(v['rlx'])} | {fmt(v['llama.cpp'])} | {fmt(v['llama.cpp FA'])} "
                      f"| {m['rlx'] / m['llama.cpp']:.2f}× | {m['rlx'] / m['llama.cpp FA']:.2f}× |")


if __name__ == "__main__":
    main()
