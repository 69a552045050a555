#!/usr/bin/env python3
"""Extra llama.cpp tokenizer references for ``rlx_gguf::Tokenizer``.

Writes ``tokenizer_extra.json`` next to this file: for each target model, a list
of strings and the ids llama.cpp's ``llama_tokenize`` gives them, through
llama-cpp-python with ``vocab_only=True``. ``tests/tokenizer.rs`` compares
``Tokenizer::encode`` with every entry (the 40 strings of
``crates/rlx/tests/golden/llm/*.json`` are checked there too).

The strings are hand-picked stress cases (contractions, whitespace runs, every
Unicode whitespace, combining marks, numbers of several kinds, code points new
in Unicode 15.1 and 16, scripts without spaces, special tokens next to each
other and cut in half, byte-fallback characters) followed by seeded random
strings: COMBOS strings from a small alphabet that mixes ASCII, non-ASCII
letters/numbers/marks/spaces, "▁" and both models' special tokens, and
UNICODE strings of random code points (no surrogates).

Regenerate with (from the repository root):

    scripts/setup-llm-pyenv.sh
    .venv-llm/bin/python crates/rlx-gguf/tests/golden/gen_tokenizer.py \\
        [SMOLLM2_GGUF [GEMMA3_GGUF]]

Model paths come from the arguments, else $RLX_SMOLLM2_GGUF / $RLX_GEMMA3_GGUF,
else the defaults below. The output is deterministic (fixed seed and order).

File format::

    {"generator": "gen_tokenizer.py", "llama_cpp_python": <version>,
     "models": {"smollm2": {"model": <file name>, "sha256": ...,
                            "cases": [{"text", "ids_special", "ids_plain"}, ...]},
                "gemma3": {...}}}

``ids_special`` is ``tokenize(text, add_bos=False, special=True)``,
``ids_plain`` the same with ``special=False``.
"""

import hashlib
import importlib.metadata
import json
import os
import random
import sys

import llama_cpp

SEED = 20240917
COMBOS = 110
UNICODE = 50

# The rlx model cache (`rlx fetch smollm2` / `rlx fetch gemma3` fill it).
CACHE = os.environ.get("RLX_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rlx")
MODELS = [
    ("smollm2", "RLX_SMOLLM2_GGUF", os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")),
    ("gemma3", "RLX_GEMMA3_GGUF", os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")),
]

STRESS = [
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'LL",
    "x'sy it''s l'll re've '",
    " '",
    "a'",
    "   \n   \n\n  x",
    " \t \n",
    "\u3000x\u3000 y\u2003z\u2009w",
    "a\u2028b\u2029c\u0085d\u000be\u000cf",
    "\u1680\u205f\u202f\u00a0\u00a0",
    "e\u0301e\u0301 caf\u00e9 cafe\u0301",
    "\u0915\u094d\u0937\u093f \u0e01\u0e34\u0e19",
    "\u216b \u00bd \u00b2 \u0663\u0664\u0665 \u2460\u2461",
    "\U0002ebf0\U0002ebf1 \U000105c0 \u1c89",
    "\ufeffBOM \u200b\u200c\u200d",
    "\x00\x01\x02\x7f\x1b[0m",
    "tab\t\t\tx\t",
    "\r\r\n\n\r",
    "<|im_start|><|im_start|>",
    "<|im_end|>x<|im_start|>",
    "<<|im_start|>>",
    "<|im_start",
    "im_start|>",
    "<start_of_turn><start_of_turn>",
    "<end_of_turn>\n<start_of_turn>model\n",
    "<unused0><unused1>x",
    "<pad><mask>[multimodal]",
    "<|endoftext|><|endoftext|>",
    "<reponame>x<file_sep>y<repo_name>",
    "</s></s><s>",
    "<0x41>",
    "\u2581\u2581x\u2581",
    "  \n\n\n\n\n  ",
    "\n" * 40,
    " " * 40,
    "\t" * 20,
    "a" * 300,
    "1" * 50,
    "1,234,567.89e-10",
    "0x1F 0b1010 1_000",
    "\u2115\U0001d538\U0001d544\U0001d53c",
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff54\uff45\uff58\uff54",
    "\U0001f1fa\U0001f1f3\U0001f469\U0001f3fe\u200d\U0001f680",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u05d5\u05e2\u05d5\u05d3",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0661\u0662\u0663",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "\u65e5\u672c\u8a9e\u3068English\u306emix123",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n",
    "<div class=\"x\">&nbsp;</div>",
    "SELECT * FROM t WHERE a >= 10;",
    "$$\\frac{a}{b}$$",
    "C:\\Users\\x\\file.txt",
    "~!@#$%^&*()_+`-=[]{}|;:,./<>?",
]

ALPHABET = list("abcXYZ019 '\t\n\r.,!?-_<>|/") + [
    "\u00e9", "\u00df", "\u65e5", "\u672c", "\U0001f600", "\u0301", "\u00a0", "\u2003",
    "\u0416", "\u0663", "\u00bd", "\u2581", "<|im_start|>", "<|im_end|>",
    "<start_of_turn>", "<end_of_turn>", "\n\n", "  ", "'s", "'ll",
]


def strings():
    rng = random.Random(SEED)
    out = list(STRESS)
    for _ in range(COMBOS):
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30))))
    for _ in range(UNICODE):
        s = []
        for _ in range(rng.randint(1, 12)):
            while True:
                cp = rng.choice([
                    rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                    rng.randint(0x3000, 0xFFFF), rng.randint(0x10000, 0x2FFFF),
                ])
                if not 0xD800 <= cp <= 0xDFFF:
                    break
            s.append(chr(cp))
        out.append("".join(s))
    return out


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    out = {
        "generator": "gen_tokenizer.py",
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "models": {},
    }
    texts = strings()
    for i, (name, env, default) in enumerate(MODELS):
        path = sys.argv[1 + i] if len(sys.argv) > 1 + i else os.environ.get(env, default)
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for t in texts:
            b = t.encode("utf-8")
            cases.append({
                "text": t,
                "ids_special": llm.tokenize(b, add_bos=False, special=True),
                "ids_plain": llm.tokenize(b, add_bos=False, special=False),
            })
        out["models"][name] = {"model": os.path.basename(path), "sha256": sha256_of(path), "cases": cases}
    dest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_extra.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {dest}: {len(texts)} strings per model")


if __name__ == "__main__":
    main()
