"""Drive `rlx serve` with the real `openai` client (run by tests/serve.rs).

Usage: serve_openai.py BASE_URL [--full] [--embeddings GOLDEN_JSON]

Prints one JSON object: the greedy texts of a fixed set of requests (run one by one, then 32
at once), so the caller can compare servers started with different --parallel. With --full it
also checks streaming against non-streaming, stop strings, max_tokens and finish_reason,
logprobs, the 400 for n > 1, and prefix-cache hits in /metrics. With --embeddings (a server
started with --embedding-model) it checks /v1/embeddings against sentence-transformers' vectors
in GOLDEN_JSON (crates/rlx/tests/golden/embed/embeddings.json), in base64 (the client's
default) and float encodings.
"""
import concurrent.futures as cf
import json
import sys
import urllib.request

import openai

base = sys.argv[1]
full = "--full" in sys.argv
golden = sys.argv[sys.argv.index("--embeddings") + 1] if "--embeddings" in sys.argv else None
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "Who wrote Hamlet?", "What do bees make?", "Which planet is red?",
             "What is ice made of?", "How many legs has a spider?"]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The sun rises in the"]


def chat(q, stream=False, **kw):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
    args = dict(model="rlx", messages=msgs, temperature=0, max_tokens=24, **kw)
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for ch in client.chat.completions.create(stream=True, **args):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


def complete(p, stream=False, **kw):
    args = dict(model="rlx", prompt=p, temperature=0, max_tokens=kw.pop("max_tokens", 24), **kw)
    if not stream:
        r = client.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r
    text, finish, usage = "", None, None
    for ch in client.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if ch.choices:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    return text, finish, usage


def metric(name):
    body = urllib.request.urlopen(base + "/metrics").read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


out = {"one_by_one": {}, "together": {}}
for q in QUESTIONS:
    out["one_by_one"][q] = chat(q)[0]
for p in PROMPTS:
    out["one_by_one"][p] = complete(p)[0]
# 32 streaming requests at once (each question four times), all complete.
with cf.ThreadPoolExecutor(32) as ex:
    futs = {ex.submit(chat, QUESTIONS[i % len(QUESTIONS)], True): i for i in range(32)}
    for f in cf.as_completed(futs):
        text, finish = f.result()
        q = QUESTIONS[futs[f] % len(QUESTIONS)]
        assert finish in ("stop", "length"), finish
        prev = out["together"].setdefault(q, text)
        assert prev == text, f"the same request gave two texts at once: {prev!r} vs {text!r}"

if full:
    for q in QUESTIONS[:2]:
        a, fa = chat(q)
        b, fb = chat(q, stream=True)
        assert (a, fa) == (b, fb), f"streamed {b!r}/{fb} vs {a!r}/{fa}"
    for p in PROMPTS[:2]:
        a, fa, _ = complete(p)
        b, fb, usage = complete(p, stream=True)
        assert (a, fa) == (b, fb), f"streamed {b!r}/{fb} vs {a!r}/{fa}"
        assert usage is not None and usage.completion_tokens > 0
        # A stop string from the middle of the greedy text cuts it there, streamed or not.
        stop = a[len(a) // 2:len(a) // 2 + 3]
        assert len(stop) == 3, a
        want = a[:a.index(stop)]
        for stream in (False, True):
            t, f, _ = complete(p, stream=stream, stop=[stop, "zzzz"])
            assert (t, f) == (want, "stop"), f"stop {stop!r}, stream={stream}: {t!r}/{f} vs {want!r}"
    # max_tokens and finish_reason "length", usage counts.
    t, f, r = complete("Count: one, two, three,", max_tokens=5)
    assert f == "length" and r.usage.completion_tokens == 5, (f, r.usage)
    # Log-probabilities: the tokens join to the text; greedy picks the most likely.
    r = client.chat.completions.create(model="rlx", temperature=0, max_tokens=12, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": QUESTIONS[0]}])
    lp = r.choices[0].logprobs.content
    assert "".join(x.token for x in lp) == r.choices[0].message.content, lp
    for x in lp:
        assert len(x.top_logprobs) == 3 and x.logprob <= 0
        assert abs(x.top_logprobs[0].logprob - x.logprob) < 1e-6, x
    r = client.completions.create(model="rlx", prompt=PROMPTS[0], temperature=0, max_tokens=8, logprobs=2)
    assert "".join(r.choices[0].logprobs.tokens) == r.choices[0].text, r.choices[0].logprobs
    # n > 1 is refused with a 400.
    try:
        client.completions.create(model="rlx", prompt="x", n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    # The shared system prompt was found in the prefix cache.
    assert metric("rlx_prefix_cache_hit_tokens_total") > 0
    # Prompt pieces are counted; a step computing prompts holds one or more of them.
    assert metric("rlx_prompt_pieces_total") >= metric("rlx_prefill_steps_total") > 0
    # Step graphs: the load's, then one per new step shape, with the time they took.
    assert metric("rlx_step_graphs_compiled_total") >= 2
    assert metric("rlx_step_graph_compile_seconds_total") > 0
    # Models list.
    assert [m.id for m in client.models.list().data]

if golden:
    import math

    g = json.load(open(golden))

    def cosine(a, b):
        dot = sum(x * y for x, y in zip(a, b))
        return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    import base64
    import struct

    # The client's default (it asks for base64 and decodes it), floats, and base64 asked for
    # explicitly (which the client hands back undecoded).
    for fmt in (None, "float", "base64"):
        kw = {"encoding_format": fmt} if fmt else {}
        r = client.embeddings.create(model=g["model"], input=g["sentences"], **kw)
        assert [d.index for d in r.data] == list(range(len(g["sentences"]))), r.data
        assert r.usage.prompt_tokens == sum(g["num_tokens"]), (r.usage, g["num_tokens"])
        for d, want in zip(r.data, g["embeddings"]):
            v = d.embedding
            if fmt == "base64":
                raw = base64.b64decode(v)
                v = list(struct.unpack(f"<{len(raw) // 4}f", raw))
            assert len(v) == g["dim"], (fmt, len(v))
            c = cosine(v, want)
            assert c >= 0.9999, (fmt, d.index, c)
    one = client.embeddings.create(model=g["model"], input=g["sentences"][0]).data
    assert len(one) == 1 and cosine(one[0].embedding, g["embeddings"][0]) >= 0.9999
    try:
        client.embeddings.create(model=g["model"], input=g["sentences"][0], dimensions=7)
        raise AssertionError("dimensions=7 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    out["embeddings_checked"] = len(g["sentences"])

print(json.dumps(out))
