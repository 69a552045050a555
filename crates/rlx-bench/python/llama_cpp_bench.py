#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) reference timings for RLX's LLM benchmarks.

Usage:
    llama_cpp_bench.py --model PATH [--threads N] [--flash-attn {0,1}]
                       [-p 512] [-n 128] [--repeats R] [--json]

Everything is measured in this one process, for one configuration:

* load: wall time of the ``Llama(...)`` construction (mmap on, no mlock): file
  mapping, weight repacking and context/KV-cache creation. Depends on whether
  the file is already in the page cache; run twice if you need the warm number.
* ttft_cold: the first forward pass after loading (a ``--ttft-prompt``-token
  prompt, default 32, from an empty cache, up to the argmax of the last
  position's logits). Includes one-time costs (graph/buffer allocation, page
  faults on the mmapped weights).
* ttft: the same, warm, ``repeats`` times.
* pp (prompt processing): ``-p`` random token ids (seeded; normal tokens only,
  no control/unused/unknown/end-of-generation ids) evaluated from an empty
  cache in one ``llm.eval`` call (split into ``--batch``-sized decodes by
  llama-cpp-python when p > batch). Throughput p / seconds.
* tg (token generation): from an empty cache, ``-n`` tokens evaluated one at a
  time with ``llm.eval([tok])``; each next token is the argmax of the previous
  step's logits (``--tg-tokens greedy``, default; generation never stops) or a
  random id (``--tg-tokens random``). The first token is a random id.
  Throughput n / seconds.
* peak_rss_kib: ``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux) at the end;
  the mmapped weights count once their pages are touched. ``vm_hwm_kib`` is the
  kernel's VmHWM (same quantity from /proc, can be a few hundred KiB fresher).

One untimed warm-up (a short prompt and a few single-token steps) runs after
``ttft_cold`` and before the timed samples. ``llm.reset()`` precedes every
sample, so each starts from an empty cache. Every sample is reported, with the
median, min and max.

With ``--json`` exactly one JSON object is printed on stdout; otherwise a short
human-readable summary. llama.cpp's own log lines go to stderr. Errors go to
stderr with a non-zero exit (2 for bad arguments, 1 for anything else).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import llama_cpp

SEED = 0
WARMUP_PROMPT = 16
WARMUP_STEPS = 4


def positive_int(text):
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--threads", type=positive_int, default=2,
                   help="threads for single-token and batch decoding [2]")
    p.add_argument("--flash-attn", type=int, choices=[0, 1], default=0, help="flash attention [0]")
    p.add_argument("-p", "--n-prompt", type=positive_int, default=512, help="pp prompt length [512]")
    p.add_argument("-n", "--n-gen", type=positive_int, default=128, help="tg tokens [128]")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed samples per test [3]")
    p.add_argument("--batch", type=positive_int, default=512, help="n_batch = n_ubatch [512]")
    p.add_argument("--ttft-prompt", type=positive_int, default=32,
                   help="prompt length for time to first token [32]")
    p.add_argument("--tg-tokens", choices=["greedy", "random"], default="greedy",
                   help="how tg picks the next token [greedy]")
    p.add_argument("--seed", type=int, default=SEED, help=f"token-id RNG seed [{SEED}]")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def rss_kib(field="VmRSS"):
    """A /proc/self/status memory field in KiB (VmRSS: current, VmHWM: peak), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def summary(samples):
    return {
        "samples": samples,
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


def normal_token_ids(llm):
    """Ids of ordinary vocabulary tokens (no control/unknown/unused/byte/EOG ones)."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    bad = (llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN | llama_cpp.LLAMA_TOKEN_ATTR_UNUSED
           | llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_BYTE)
    ids = []
    for t in range(llm.n_vocab()):
        attr = int(llama_cpp.llama_vocab_get_attr(vocab, t))
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_NORMAL and not attr & bad \
                and not llama_cpp.llama_vocab_is_eog(vocab, t):
            ids.append(t)
    if not ids:
        raise RuntimeError("no normal tokens in the vocabulary")
    return np.array(ids, dtype=np.int64)


class Bench:
    def __init__(self, llm, n_vocab, pool, rng):
        self.llm = llm
        self.n_vocab = n_vocab
        self.pool = pool
        self.rng = rng

    def random_ids(self, n):
        return [int(t) for t in self.rng.choice(self.pool, size=n)]

    def last_argmax(self):
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def prompt(self, ids):
        """Seconds to evaluate `ids` from an empty cache and pick the next token."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        self.last_argmax()
        return time.perf_counter() - t0

    def generate(self, n, greedy):
        """Seconds to evaluate n single tokens from an empty cache."""
        self.llm.reset()
        tok = self.random_ids(1)[0]
        randoms = None if greedy else self.random_ids(n)
        t0 = time.perf_counter()
        for i in range(n):
            self.llm.eval([tok])
            if greedy:
                tok = self.last_argmax()
            elif i + 1 < n:
                tok = randoms[i + 1]
        return time.perf_counter() - t0


def run(args):
    if not os.path.isfile(args.model):
        raise FileNotFoundError(f"model not found: {args.model}")
    n_ctx = args.n_prompt + args.n_gen + 16
    n_ctx = max(256, -(-n_ctx // 256) * 256)
    n_ctx = max(n_ctx, args.ttft_prompt + 16)

    rss_before = rss_kib()
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=n_ctx,
        n_batch=args.batch,
        n_ubatch=args.batch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=bool(args.flash_attn),
        use_mmap=True,
        use_mlock=False,
        logits_all=False,
        seed=args.seed,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    rss_after_load = rss_kib()
    want_fa = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if args.flash_attn
               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    assert llm.context_params.flash_attn_type == want_fa

    rng = np.random.default_rng(args.seed)
    bench = Bench(llm, llm.n_vocab(), normal_token_ids(llm), rng)
    greedy = args.tg_tokens == "greedy"

    ttft_prompt = bench.random_ids(args.ttft_prompt)
    ttft_cold = bench.prompt(ttft_prompt)

    # Untimed warm-up of both paths.
    bench.prompt(bench.random_ids(WARMUP_PROMPT))
    bench.generate(WARMUP_STEPS, greedy)

    ttft, pp, tg = [], [], []
    for _ in range(args.repeats):
        ttft.append(bench.prompt(ttft_prompt))
    for _ in range(args.repeats):
        pp.append(bench.prompt(bench.random_ids(args.n_prompt)))
    for _ in range(args.repeats):
        tg.append(bench.generate(args.n_gen, greedy))

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "tool": "llama_cpp_bench.py",
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "model": os.path.basename(args.model),
        "model_path": os.path.abspath(args.model),
        "model_bytes": os.path.getsize(args.model),
        "n_params": int(llama_cpp.llama_model_n_params(llm.model)),
        "n_vocab": llm.n_vocab(),
        "config": {
            "threads": args.threads,
            "flash_attn": bool(args.flash_attn),
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "repeats": args.repeats,
            "n_ctx": n_ctx,
            "n_batch": args.batch,
            "n_ubatch": args.batch,
            "ttft_prompt": args.ttft_prompt,
            "tg_tokens": args.tg_tokens,
            "seed": args.seed,
            "mmap": True,
        },
        "load_s": load_s,
        "ttft_cold_ms": ttft_cold * 1e3,
        "ttft_ms": summary([s * 1e3 for s in ttft]),
        "pp_s": summary(pp),
        "pp_tok_s": summary([args.n_prompt / s for s in pp]),
        "tg_s": summary(tg),
        "tg_tok_s": summary([args.n_gen / s for s in tg]),
        "tg_ms_per_token": summary([s * 1e3 / args.n_gen for s in tg]),
        "rss_before_load_kib": rss_before,
        "rss_after_load_kib": rss_after_load,
        "rss_end_kib": rss_kib(),
        "peak_rss_kib": int(peak),
        "vm_hwm_kib": rss_kib("VmHWM"),
    }


def print_human(r):
    c = r["config"]
    print(f"{r['model']}  threads={c['threads']} flash_attn={int(c['flash_attn'])} "
          f"llama-cpp-python {r['llama_cpp_python']}")
    print(f"  load          {r['load_s'] * 1e3:9.1f} ms")
    print(f"  ttft (cold)   {r['ttft_cold_ms']:9.1f} ms   ({c['ttft_prompt']}-token prompt)")
    t = r["ttft_ms"]
    print(f"  ttft (warm)   {t['median']:9.1f} ms   [min {t['min']:.1f}, max {t['max']:.1f}]")
    for key, n, label in (("pp_tok_s", c["n_prompt"], "pp"), ("tg_tok_s", c["n_gen"], "tg")):
        s = r[key]
        print(f"  {label}{n:<12d}{s['median']:9.1f} tok/s [min {s['min']:.1f}, max {s['max']:.1f}]")
    print(f"  peak RSS      {r['peak_rss_kib'] / 1024:9.1f} MiB")


def main(argv):
    args = parse_args(argv)
    try:
        result = run(args)
    except Exception as e:  # noqa: BLE001 - report anything as one line on stderr
        print(f"llama_cpp_bench: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print_human(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
