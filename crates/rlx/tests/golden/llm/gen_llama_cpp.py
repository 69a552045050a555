#!/usr/bin/env python3
"""llama.cpp reference outputs for RLX's LLM parity tests.

Loads one GGUF model with llama.cpp (through llama-cpp-python, CPU only, flash
attention off) and writes a JSON file with:

* the tokenizer's output for a list of tricky strings (with and without
  special-token parsing),
* whether llama.cpp adds BOS by default for this model, and the BOS/EOS ids,
* greedy continuations (32 tokens) of a few prompts, evaluated token by token,
  with the top-1/top-2 logit margin at each step,
* teacher-forced next-token predictions (argmax, margin, top-5) over a fixed
  English paragraph, evaluated in one batch (``forced``) and one token at a
  time (``forced_stepwise``, llama.cpp's decoding path).

Usage (from the repository root; see scripts/regen-llm-goldens.sh):

    .venv-llm/bin/python crates/rlx/tests/golden/llm/gen_llama_cpp.py \\
        --model /path/to/model.gguf --name smollm2 \\
        --out crates/rlx/tests/golden/llm/smollm2.json

Output format (one JSON object)::

    {"generator": "gen_llama_cpp.py", "name": ..., "model": <file name>,
     "sha256": ..., "llama_cpp_python": <version>, "config": {...},
     "system_info": <llama.cpp build/CPU features>,
     "bos": <bool: llama.cpp prepends BOS by default>, "bos_id": ..., "eos_id": ...,
     "eog_ids": [<every token llama.cpp treats as end-of-generation>],
     "tokenizer": [{"text", "ids_special", "ids_plain"}, ...],
     "greedy": [{"prompt", "prompt_ids", "generated_ids", "margins",
                 "runner_up_ids", "text"}, ...],
     "forced": {"text", "ids", "top1", "margins", "top5_ids", "top5_logits",
                "top1_matches_next"},
     "forced_stepwise": {same keys as "forced"}}

Notes:

* ``ids_special`` is ``tokenize(text, add_bos=False, special=True)``,
  ``ids_plain`` the same with ``special=False`` (special-token strings in the
  text are then tokenized as ordinary text).
* Prompts are tokenized with llama.cpp's default BOS behaviour
  (``tokenize(prompt, add_bos=True, special=True)``; llama.cpp only prepends BOS
  when the model's ``tokenizer.ggml.add_bos_token`` says so).
* Greedy decoding: the prompt is evaluated in one batch, then each generated
  token is fed back one at a time. Ties resolve to the lowest id (numpy argmax).
  Generation stops early only when the token equals ``eos_id`` (other
  end-of-generation tokens, e.g. Gemma's ``<end_of_turn>``, do not stop it).
* ``margins`` are top-1 logit minus top-2 logit (float32 logits widened to
  float64). A tiny margin means a small numerical difference can flip the
  argmax; parity tests should treat those steps leniently.
* ``forced.top1[i]`` is the argmax of the logits at position ``i``, i.e. the
  prediction for token ``i + 1``; the last entry predicts past the text.
  ``top1_matches_next`` is informational (fraction of positions where
  ``top1[i] == ids[i + 1]``).
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys

import numpy as np
import llama_cpp

N_CTX = 1024
N_THREADS = 2
N_BATCH = 512
N_GEN = 32

TOKENIZER_TEXTS = [
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple   spaces    between  words",
    "    four leading spaces",
    " ",
    "   ",
    "tab\tseparated\t\tvalues\t",
    "\t\tindented with tabs",
    "\n",
    "\n\n",
    "line one\n\nline two\n",
    "a\n\n\n\nb",
    "windows\r\nline endings\r\n",
    "\r\n\r\n",
    "café naïve résumé",
    "Straße groß ẞ",
    "日本語の文章",
    "中文，标点符号。",
    "Привет, мир",
    "emoji 😀 and 👍🏽",
    "family 👨‍👩‍👧‍👦 zwj",
    "🏳️‍🌈",
    "flags 🇫🇷🇯🇵🇺🇸",
    "1234567 3.14159",
    "0.000001 and 1e-10 and 42,000,000",
    "def f(x):\n    if x > 0:\n        return x\n\treturn -x\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "I'm don't WE'LL they've She'S can't",
    "https://example.com/path?q=1&r=2#frag",
    "<|im_start|>user\nhi<|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<|endoftext|>",
    "<bos>x<eos>",
    "<s>x</s>",
    "\u00a0",
    "a\u00a0b",
    "",
]

PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
]
CHAT_USER_MESSAGE = "What is 2+2?"
CHATML_FALLBACK = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
GEMMA_CHAT = "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"

FORCED_TEXT = (
    "A river begins as a thin thread of water high in the hills, where rain and melting snow "
    "gather in small hollows and spill over the rocks. As it runs downhill, it is joined by "
    "brooks and streams from either side, and it grows wider and slower. In its upper course the "
    "water is cold and clear, and it cuts a narrow valley through the stone, carrying pebbles and "
    "sand along its bed. Further down, the land becomes flatter, and the river begins to wander "
    "in long, lazy loops across the plain. Farmers have always been drawn to these lowlands, for "
    "the floods that come each spring leave behind a layer of rich mud in which wheat and barley "
    "grow well. Towns were built at the places where the river could be crossed, first by a ford, "
    "later by a ferry, and at last by a bridge of timber or stone. Boats carried grain, wool and "
    "timber to the sea, and the river became a road as well as a source of food and water. Near "
    "its mouth the current slows almost to a standstill, and the river drops the last of its silt "
    "to form a broad delta, where reeds grow thickly and birds nest by the thousand. There the "
    "fresh water mingles with the salt of the sea, and the long journey that began as a trickle "
    "in the hills comes quietly to an end. Yet the story never truly stops, for the sun lifts "
    "the water back into the sky as vapour, the wind carries the clouds inland, and the rain "
    "falls once more upon the hills."
)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def top2(logits):
    """(argmax id, margin top1 - top2, runner-up id); ties -> lowest id first."""
    order = np.argsort(-logits, kind="stable")[:2]
    a, b = int(order[0]), int(order[1])
    assert a == int(np.argmax(logits))
    return a, float(logits[a]) - float(logits[b]), b


def last_logits(llm):
    row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
    assert np.all(np.isfinite(row))
    return row


def detok(llm, ids):
    return llm.detokenize(ids, special=True).decode("utf-8", errors="replace")


def render_chat_template(llm):
    """The SmolLM2-style chat prompt rendered with the model's own template, if any."""
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        return None, None
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None, "jinja2 unavailable"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(template).render(
        messages=[{"role": "user", "content": CHAT_USER_MESSAGE}],
        add_generation_prompt=True,
        bos_token=detok(llm, [llm.token_bos()]),
        eos_token=detok(llm, [llm.token_eos()]),
    )
    return text, "tokenizer.chat_template (jinja2)"


def greedy(llm, prompt, eos_id):
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(prompt_ids)
    gen, margins, runners = [], [], []
    for _ in range(N_GEN):
        tok, margin, runner = top2(last_logits(llm))
        gen.append(tok)
        margins.append(margin)
        runners.append(runner)
        if tok == eos_id:
            break
        llm.eval([tok])
    return {
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "generated_ids": gen,
        "margins": margins,
        "runner_up_ids": runners,
        "text": detok(llm, gen),
    }


def forced(llm, stepwise=False):
    ids = llm.tokenize(FORCED_TEXT.encode("utf-8"), add_bos=True, special=True)
    assert len(ids) + 1 <= N_BATCH, len(ids)
    llm.reset()
    if stepwise:
        for t in ids:
            llm.eval([t])
    else:
        llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
    assert np.all(np.isfinite(logits))
    top1, margins, top5_ids, top5_logits = [], [], [], []
    for row in logits:
        order = np.argsort(-row, kind="stable")[:5]
        top1.append(int(order[0]))
        margins.append(float(row[order[0]]) - float(row[order[1]]))
        top5_ids.append([int(i) for i in order])
        top5_logits.append([float(row[i]) for i in order])
    matches = sum(int(top1[i] == ids[i + 1]) for i in range(len(ids) - 1))
    return {
        "text": FORCED_TEXT,
        "ids": ids,
        "top1": top1,
        "margins": margins,
        "top5_ids": top5_ids,
        "top5_logits": top5_logits,
        "top1_matches_next": matches / (len(ids) - 1),
    }


def dump(obj):
    """JSON with one top-level key (and one list element) per line, arrays inline."""
    def enc(v):
        return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

    lines = ["{"]
    keys = list(obj)
    for k_i, k in enumerate(keys):
        v = obj[k]
        tail = "," if k_i + 1 < len(keys) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f"{enc(k)}: [")
            for i, item in enumerate(v):
                lines.append("  " + enc(item) + ("," if i + 1 < len(v) else ""))
            lines.append("]" + tail)
        elif isinstance(v, dict) and k in ("forced", "forced_stepwise"):
            lines.append(f"{enc(k)}: {{")
            sub = list(v)
            for s_i, s in enumerate(sub):
                lines.append(f"  {enc(s)}: {enc(v[s])}" + ("," if s_i + 1 < len(sub) else ""))
            lines.append("}" + tail)
        else:
            lines.append(f"{enc(k)}: {enc(v)}{tail}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="path of the GGUF file")
    ap.add_argument("--name", required=True, help="short model name (smollm2, gemma3, ...)")
    ap.add_argument("--out", required=True, help="output JSON path")
    args = ap.parse_args()

    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        n_batch=N_BATCH,
        logits_all=True,
        flash_attn=False,
        seed=0,
        verbose=False,
    )
    assert llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED

    bos_id, eos_id = llm.token_bos(), llm.token_eos()
    with_default = llm.tokenize(b"x")
    without = llm.tokenize(b"x", add_bos=False)
    if with_default == without:
        adds_bos = False
    else:
        assert with_default == [bos_id] + without, (with_default, without)
        adds_bos = True
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog_ids = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]

    tokenizer = [{
        "text": t,
        "ids_special": llm.tokenize(t.encode("utf-8"), add_bos=False, special=True),
        "ids_plain": llm.tokenize(t.encode("utf-8"), add_bos=False, special=False),
    } for t in TOKENIZER_TEXTS]

    prompts = list(PLAIN_PROMPTS)
    chat_source = None
    if args.name.startswith("gemma"):
        prompts.append(GEMMA_CHAT)
        chat_source = "hand-written Gemma turn format (no template in the GGUF)"
    else:
        chat, chat_source = render_chat_template(llm)
        if chat is None:
            chat, chat_source = CHATML_FALLBACK, "hand-written ChatML"
        elif chat != CHATML_FALLBACK:
            print(f"note: rendered chat template differs from the ChatML fallback: {chat!r}",
                  file=sys.stderr)
        prompts.append(chat)
    greedy_cases = [greedy(llm, p, eos_id) for p in prompts]

    out = {
        "generator": "gen_llama_cpp.py",
        "name": args.name,
        "model": os.path.basename(args.model),
        "sha256": sha256_of(args.model),
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "config": {"n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": N_BATCH,
                   "flash_attn": False, "logits_all": True, "n_gen": N_GEN,
                   "chat_prompt_source": chat_source},
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "n_vocab": llm.n_vocab(),
        "bos": adds_bos,
        "bos_id": bos_id,
        "eos_id": eos_id,
        "eog_ids": eog_ids,
        "tokenizer": tokenizer,
        "greedy": greedy_cases,
        "forced": forced(llm),
        "forced_stepwise": forced(llm, stepwise=True),
    }
    text = dump(out)
    json.loads(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}: bos={adds_bos} ({len(out['forced']['ids'])} forced tokens)")
    for g in greedy_cases:
        print(f"  {g['prompt']!r} -> {g['text']!r} (min margin {min(g['margins']):.4f})")


if __name__ == "__main__":
    main()
