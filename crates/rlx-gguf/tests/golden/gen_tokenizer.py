#!/usr/bin/env python3
"""Extra llama.cpp tokenizer references for ``rlx_gguf::Tokenizer``.

Writes ``tokenizer_extra.json`` next to this file: for each target model, a list
of strings and the ids llama.cpp's ``llama_tokenize`` gives them, through
llama-cpp-python with ``vocab_only=True``. ``crates/rlx/tests/gguf_tokenizer.rs`` compares
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

Pre-tokenizer variants: for each name in PRE_VARIANTS, a vocabulary-only copy
of SmolLM2's file (every metadata key, ``tokenizer.ggml.pre`` replaced by the
name, no tensors; written with ``gguf.GGUFWriter`` into a temporary directory)
is loaded by llama.cpp, which then tokenizes PRE_STRESS (strings that tell the
pre-tokenizers apart: contractions in any case, digit runs, punctuation before
newlines, whitespace runs, ...) followed by the strings above. SmolLM2's own
vocabulary hides some word boundaries (it has no multi-digit tokens, for
one), so the copies append tokens: every 2- and 3-digit string, with merges
that build them, and EXTRA_WORDS as whole tokens without merges (found only
by llama.cpp's ``ignore_merges``, i.e. only when the splitter cut exactly that
word; some are decoys that a correct splitter never cuts). A second copy
without ``tokenizer.ggml.add_bos_token`` and ``tokenizer.ggml.bos_token_id``
gives the defaults llama.cpp ties to the name.
``crates/rlx/tests/gguf_tokenizer.rs`` builds the same copies from the model file and the
appended tokens and merges recorded here, and compares.

File format::

    {"generator": "gen_tokenizer.py", "llama_cpp_python": <version>,
     "models": {"smollm2": {"model": <file name>, "sha256": ...,
                            "cases": [{"text", "ids_special", "ids_plain"}, ...]},
                "gemma3": {...}},
     "pre_tokenizers": {"base": "smollm2",
                        "extra_tokens": [<token text, GPT-2 byte alphabet>, ...],
                        "extra_merges": ["<first> <second>", ...],
                        "variants": {"llama-bpe": {"add_bos_default": <bool>,
                                                   "bos_default": <id or null>,
                                                   "cases": [...]},
                                     "qwen2": {...}, ...}}}

``ids_special`` is ``tokenize(text, add_bos=False, special=True)``,
``ids_plain`` the same with ``special=False``. The appended tokens get ids
from the base vocabulary's size on, token type 1 (normal); the appended
merges rank after the base ones, in order. ``add_bos_default`` and
``bos_default`` are llama.cpp's ``llama_vocab_get_add_bos`` / ``llama_vocab_bos``
for the copy without the two BOS keys (null: no BOS token).
"""

import hashlib
import importlib.metadata
import json
import os
import random
import sys
import tempfile

import gguf
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

# `tokenizer.ggml.pre` values checked on SmolLM2's vocabulary: Llama 3's rules
# with ignore_merges and BOS by default (llama-bpe), without them (dbrx), with
# ignore_merges and no default BOS token (glm4), and Qwen2's rules (qwen2).
PRE_VARIANTS = ["llama-bpe", "dbrx", "glm4", "qwen2"]
PRE_BASE = "smollm2"

PRE_STRESS = [
    "DON'T I'M we'Ve THEY'RE she'S it'LL you'D I'm we're",
    "'S 'T 'RE 'VE 'M 'LL 'D 'Re 'vE 'lL 'Dd",
    "'S'T'RE'VE'M'LL'D'Re'vE'lL'Dd",
    "x'Sy it'Ll WE'VEN I'Mx YOU'Dd 'Sup 'TWAS",
    "'hello 'store 'x' ''s '",
    "rock'n'roll o'clock ma'am y'all",
    "1234567",
    "3.14159",
    "\u0661\u0662\u0663\u0664",
    "\u06f1\u06f2\u06f3\u06f4\u06f5 \u0967\u0968\u0969\u096a\u096b\u096c\u096d",
    "abc123def",
    "x1y22z333w4444v55555",
    "12 345 6789 0.5 1e10 1,000,000",
    "Call 555-123-4567 now!",
    "\u00b2\u00b3\u00b9 \u00bd\u00be \u2167\u2168 \u2460\u2461\u2462\u2463",
    "Hello!!!\n\nWorld...\r\n",
    "?!\n\n\nx",
    "end.\r\n\r\nstart",
    "a\r\nb\rc\n",
    "\r\n",
    "\r\n\r\n   \r\n",
    "word   word    ",
    "  leading spaces",
    "trailing spaces   ",
    "   ",
    "tab\tseparated\t\tvalues\t",
    "\t\tindented\n\t\t\tmore",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u53e5\u8aad\u70b9\u3002\u4e2d\u6587\uff1a\u4f60\u597d\uff01",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
    "emoji \U0001f600\U0001f603 \U0001f44d\U0001f3fd family \U0001f468\u200d\U0001f469\u200d\U0001f467 flags \U0001f1eb\U0001f1f7",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m fa\u00e7ade",
    "e\u0301 a\u0308 n\u0303",
    "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0939\u093f\u0928\u094d\u0926\u0940",
    "(hello) [world] {foo}",
    "$100 \u20ac20 \u00a35 \u00a51000",
    "--flag -x --long-option=value",
    "foo_bar baz__qux _private __dunder__",
    "path/to/file.txt C:\\dir\\x",
    "https://example.com/a?b=1&c=2#frag",
    "user@example.com #hashtag @mention",
    "<html><body>text</body></html>",
    "print(\"Hello, World!\")\n",
    "def f(x):\n    return x**2  # square\n",
    "if (a && b) || !c { x += 1; }",
    "'quoted' \"double\" `back`",
    "\u00a0nbsp\u00a0\u00a0x",
    "\u3000\u5168\u89d2\u3000\u30b9\u30da\u30fc\u30b9",
    "a\u2028b\u2029c \u0085next",
    "\u00c0\u00c9\u00ce\u00d5\u00dc \u00c6\u00d8\u00c5 \u00df \u1e9e",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439",
    "mixed123\u4e2d\u6587456english",
    "ALLCAPS lowercase CamelCase snake_case kebab-case",
    "!!!???...,,,;;;",
    " !\n",
    " ' ",
    "x\n\n\n",
    "  \n",
    "\n \n",
    " 1 22 333 4444",
    "\u00a0123 \u3000456",
]

# Appended to the copies as tokens without merges: words under Llama 3's rules,
# and a few decoys a wrong splitter would make words ("\rc", "123def", " 1", ...).
EXTRA_WORDS = [
    "\rc", "\nb", "123def", "3def", "1y", "4v", " 1", " 22", "\u0085next",
    "'T", "'M", "'Ve", "'RE", "'S", "'LL", "'D", "'Re", "'vE", "'lL", "'Dd", "'Sup", "'hello",
    "(hello", "_bar", "__qux", "\u0661\u0662\u0663", "\u06f1\u06f2\u06f3",
    "!!!\n\n", "...\r\n", ".\r\n\r\n", "?!\n\n\n", "\r\n\r\n   \r\n", " !\n",
    "\tseparated", "\tvalues", "\u3000\u5168\u89d2", " \U0001f600\U0001f603",
    "  \n", "\u00a0nbsp", " '", "\n\n\n",
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


def gpt2_byte_alphabet():
    """GPT-2's byte -> character map (printable bytes stand for themselves)."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    others = [b for b in range(256) if b not in keep]
    out = {b: chr(b) for b in keep}
    out.update({b: chr(256 + i) for i, b in enumerate(others)})
    return out


def vocab_additions(reader):
    """The tokens and merges appended to the copies (those the base lacks)."""
    tokens = set(reader.fields["tokenizer.ggml.tokens"].contents())
    merges = set(reader.fields["tokenizer.ggml.merges"].contents())
    alphabet = gpt2_byte_alphabet()
    extra_tokens, extra_merges = [], []

    def add_token(t):
        if t not in tokens:
            tokens.add(t)
            extra_tokens.append(t)

    def add_merge(m):
        if m not in merges:
            merges.add(m)
            extra_merges.append(m)

    for n in range(100):
        d = f"{n:02d}"
        add_token(d)
        add_merge(f"{d[0]} {d[1]}")
    for n in range(1000):
        d = f"{n:03d}"
        add_token(d)
        add_merge(f"{d[:2]} {d[2]}")
        add_merge(f"{d[0]} {d[1:]}")
    for w in EXTRA_WORDS:
        add_token("".join(alphabet[b] for b in w.encode("utf-8")))
    return extra_tokens, extra_merges


def write_vocab_copy(reader, dest, pre, extra_tokens, extra_merges, drop=()):
    """Every metadata key of `reader` except `drop`, with tokenizer.ggml.pre = `pre` and the
    extra tokens and merges appended; no tensors."""
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dest, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.pre":
            value = pre
        elif key == "tokenizer.ggml.tokens":
            value = value + extra_tokens
        elif key == "tokenizer.ggml.token_type":
            value = value + [1] * len(extra_tokens)
        elif key == "tokenizer.ggml.merges":
            value = value + extra_merges
        elif key.startswith("tokenizer.ggml.") and vtype == gguf.GGUFValueType.ARRAY:
            raise SystemExit(f"{key}: a per-token array this script does not extend")
        w.add_key_value(key, value, vtype, sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def tokenize_all(llm, texts):
    cases = []
    for t in texts:
        b = t.encode("utf-8")
        cases.append({
            "text": t,
            "ids_special": llm.tokenize(b, add_bos=False, special=True),
            "ids_plain": llm.tokenize(b, add_bos=False, special=False),
        })
    return cases


def pre_tokenizers(base_path, texts):
    reader = gguf.GGUFReader(base_path)
    extra_tokens, extra_merges = vocab_additions(reader)
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, f"vocab-{pre}.gguf")
            write_vocab_copy(reader, path, pre, extra_tokens, extra_merges)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            cases = tokenize_all(llm, texts)
            del llm
            path = os.path.join(tmp, f"vocab-{pre}-nobos.gguf")
            write_vocab_copy(reader, path, pre, extra_tokens, extra_merges,
                             drop=("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"))
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            vocab = llama_cpp.llama_model_get_vocab(llm.model)
            bos = llama_cpp.llama_vocab_bos(vocab)
            variants[pre] = {
                "add_bos_default": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
                "bos_default": bos if bos >= 0 else None,
                "cases": cases,
            }
            del llm
    return {"base": PRE_BASE, "extra_tokens": extra_tokens, "extra_merges": extra_merges,
            "variants": variants}


def main():
    out = {
        "generator": "gen_tokenizer.py",
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "models": {},
    }
    texts = strings()
    paths = {}
    for i, (name, env, default) in enumerate(MODELS):
        path = sys.argv[1 + i] if len(sys.argv) > 1 + i else os.environ.get(env, default)
        paths[name] = path
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        cases = tokenize_all(llm, texts)
        out["models"][name] = {"model": os.path.basename(path), "sha256": sha256_of(path), "cases": cases}
    out["pre_tokenizers"] = pre_tokenizers(paths[PRE_BASE], PRE_STRESS + texts)
    dest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_extra.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {dest}: {len(texts)} strings per model, "
          f"{len(PRE_STRESS) + len(texts)} per pre-tokenizer variant ({', '.join(PRE_VARIANTS)})")


if __name__ == "__main__":
    main()
