"""Load generator for scripts/bench-serve.sh: `concurrency` closed-loop clients stream
completions from an OpenAI-compatible server and the script prints one JSON line: aggregate
generated tokens per second, time to first token and inter-token latency (p50 / p99).

Usage: bench_serve.py BASE_URL CONCURRENCY REQUESTS MAX_TOKENS
"""
import json
import statistics
import sys
import threading
import time

import openai

base, conc, total, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=900)
PREFIX = ("You are reading a report on the history of printing. Movable type was developed in "
          "China around 1040 by Bi Sheng, using ceramic characters, and later in Korea with metal "
          "type. In Europe, Johannes Gutenberg combined movable metal type, oil-based inks and a "
          "wooden screw press around 1440, which made books far cheaper and spread literacy, "
          "science and new ideas across the continent within a few decades. ")
TOPICS = ["the economy", "religion", "science", "politics", "art", "languages", "education", "maps"]

lock = threading.Lock()
ttft, itl, tokens = [], [], [0]
next_req = [0]


def worker():
    while True:
        with lock:
            i = next_req[0]
            if i >= total:
                return
            next_req[0] += 1
        prompt = f"{PREFIX}Question {i}: describe the effect of printing on {TOPICS[i % len(TOPICS)]}. Answer:"
        t0 = time.perf_counter()
        last, n, mine = None, 0, []
        stream = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        first = None
        for ch in stream:
            if not ch.choices or not ch.choices[0].text:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - t0
            else:
                mine.append(now - last)
            last = now
            n += 1
        with lock:
            if first is not None:
                ttft.append(first)
            itl.extend(mine)
            tokens[0] += n


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


start = time.perf_counter()
threads = [threading.Thread(target=worker) for _ in range(conc)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - start
print(json.dumps({
    "concurrency": conc, "requests": total, "tokens": tokens[0], "wall_s": wall,
    "tok_s": tokens[0] / wall,
    "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
    "itl_p50": pct(itl, 0.5), "itl_p99": pct(itl, 0.99),
    "itl_mean": statistics.fmean(itl) if itl else float("nan"),
}))
