#!/usr/bin/env python3
"""RLX against llama.cpp's own C++ `llama-bench` on the same GGUF models, interleaved in one run.

For every round, model and thread count it runs three processes back to back: ``rlx bench
--json`` and ``llama-bench -o json`` with flash attention off and on; the order alternates from
one round to the next. One-thread runs are pinned to core 0 (``taskset``). Both tools measure
pp (a prompt of P random tokens in one batch from an empty cache), tg (N tokens decoded one at a
time, each a full forward pass producing logits, no sampling on either side) and a 32-token
prompt (time to first token; RLX's figure also includes choosing the greedy token, a few
microseconds). Peak RSS is each process's own ``ru_maxrss`` from ``wait4`` (no interpreter
counted on either side). The summary takes the median over all samples of all rounds with the
min..max spread, and RLX / llama.cpp ratios (> 1 means RLX is faster; < 1 for milliseconds and
memory means RLX needs less).

Usage: llm_compare.py --rlx target/release/rlx --llama-bench PATH --model NAME=PATH [--model ...]
                      [--threads 1 2] [--rounds 3] [--repeats 3] [-p 512] [-n 128]
                      [--jsonl out.jsonl]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

TOOLS = ("rlx", "llama.cpp", "llama.cpp FA")


def run(cmd, threads):
    """Run `cmd`; returns (stdout, peak RSS in KiB of that process alone)."""
    if threads == 1:
        cmd = ["taskset", "-c", "0"] + cmd  # taskset execs the command: same process
    env = dict(os.environ, RLX_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    p = RusagePopen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return out, p.peak_rss_kib


class RusagePopen(subprocess.Popen):
    """A Popen whose wait records the child's own peak RSS (ru_maxrss, KiB) from wait4."""

    peak_rss_kib = None

    def _try_wait(self, wait_flags):
        try:
            pid, sts, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return (self.pid, 0)
        if pid == self.pid:
            self.peak_rss_kib = usage.ru_maxrss
        return (pid, sts)



def rlx_sample(out):
    r = json.loads(out.strip().splitlines()[-1])
    return {"pp": r["pp_tok_s"]["samples"], "tg": r["tg_tok_s"]["samples"], "ttft": r["ttft_ms"]["samples"],
            "load_s": [r["load_s"]]}


def llama_sample(out, p, n):
    rows = json.loads(out)
    got = {"pp": [], "tg": [], "ttft": []}
    for r in rows:
        if r["n_gen"] == 0 and r["n_prompt"] == p:
            got["pp"] += r["samples_ts"]
        elif r["n_gen"] == 0 and r["n_prompt"] == 32:
            got["ttft"] += [ns / 1e6 for ns in r["samples_ns"]]
        elif r["n_prompt"] == 0 and r["n_gen"] == n:
            got["tg"] += r["samples_ts"]
    info = {k: rows[0].get(k) for k in ("build_commit", "cpu_info", "n_batch", "n_ubatch", "type_k")}
    return got, info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--jsonl")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"load average before the run: {load:.2f}" + ("  (the machine is busy: figures will be noisy)" if load > 0.5 else ""),
          file=sys.stderr)
    models = [m.split("=", 1) for m in a.model]
    rows, info = [], None
    for rnd in range(a.rounds):
        for name, path in models:
            for t in a.threads:
                common = ["-p", str(a.p), "-n", str(a.n)]
                lb = [a.llama_bench, "-m", path, "-p", f"{a.p},32", "-n", str(a.n), "-t", str(t), "-r", str(a.repeats),
                      "-o", "json"]
                jobs = [
                    ("rlx", [a.rlx, "bench", "--model", path, "-t", str(t), "-r", str(a.repeats), "--json"] + common),
                    ("llama.cpp", lb + ["-fa", "off"]),
                    ("llama.cpp FA", lb + ["-fa", "on"]),
                ]
                if rnd % 2 == 1:
                    jobs.reverse()
                for tool, cmd in jobs:
                    out, rss = run(cmd, t)
                    if tool == "rlx":
                        r = rlx_sample(out)
                    else:
                        r, info = llama_sample(out, a.p, a.n)
                    r["rss_mib"] = [rss / 1024]
                    rows.append({"round": rnd, "model": name, "threads": t, "tool": tool, "result": r})
                    print(f"round {rnd} {name} t={t} {tool}: pp {statistics.median(r['pp']):.1f} "
                          f"tg {statistics.median(r['tg']):.1f} tok/s, peak RSS {rss / 1024:.1f} MiB", file=sys.stderr)
    if a.jsonl:
        with open(a.jsonl, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    def pool(name, t, tool, key):
        return [v for r in rows if (r["model"], r["threads"], r["tool"]) == (name, t, tool) for v in r["result"][key]]

    def fmt(v):
        return f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"

    print(f"llama-bench build {info['build_commit']}, n_batch {info['n_batch']}, n_ubatch {info['n_ubatch']}, "
          f"KV cache {info['type_k']}; load average before the run {load:.2f}\n")
    print("| model | threads | metric | RLX | llama.cpp | llama.cpp FA | RLX / llama.cpp | RLX / FA |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, _ in models:
        for t in a.threads:
            for key, label in [("pp", f"pp{a.p} tok/s"), ("tg", f"tg{a.n} tok/s"), ("ttft", "TTFT ms (32-token prompt)"),
                               ("rss_mib", "peak RSS MiB")]:
                v = {tool: pool(name, t, tool, key) for tool in TOOLS}
                m = {k: statistics.median(xs) for k, xs in v.items()}
                print(f"| {name} | {t} | {label} | {fmt(v['rlx'])} | {fmt(v['llama.cpp'])} | {fmt(v['llama.cpp FA'])} "
                      f"| {m['rlx'] / m['llama.cpp']:.2f}× | {m['rlx'] / m['llama.cpp FA']:.2f}× |")
    print()
    for name, _ in models:
        print(f"RLX load time, {name}: {fmt(pool(name, a.threads[0], 'rlx', 'load_s'))} s "
              "(llama-bench does not report its own)")


if __name__ == "__main__":
    main()
