"""The digits models' outside reference: scikit-learn's data and ONNX Runtime's int8 path.

Run with the environment of scripts/setup-edge-pyenv.sh (.venv-edge).

  digits.py data OUT
      Write scikit-learn's `digits` split (train_test_split, a quarter held out, stratified,
      random_state=0; pixels / 16) as the RLXDIGIT file rlx::models::digits reads.

  digits.py ort MODEL WEIGHTS DATA OUT [--bench]
      MODEL is mlp or cnn; WEIGHTS a JSON file RLX wrote: the trained float params
      ({"params": {name: {"dims", "values"}}}) and RLX's quantization of the model
      ({"rlx_qdq": {"activations": [[scale, zero_point], ...], "weights": {name: [scales]}}},
      activations in the order x, then each layer's output). Builds the same model in ONNX and
      writes to OUT (JSON):
        float_accuracy   ONNX Runtime, float model, held-out split
        ort_int8_accuracy ONNX Runtime's own static int8 quantization (QDQ, per-channel
                         symmetric weights, MinMax over the first 256 training images)
        rlx_qdq_int8     ONNX Runtime running RLX's quantization (the same scales and zero
                         points as QuantizeLinear / DequantizeLinear pairs): its int8 logits for
                         the held-out split, for an exact comparison
      With --bench, also times ONNX Runtime's int8 model (7 timings of 2000 / batch runs each) at
      batch 1 and 64, with 1 and 2 threads, and writes `bench` (seconds per batch).
"""

import json
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def split():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.uint8)
    return train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)


def write_data(out):
    xtr, xte, ytr, yte = split()
    with open(out, "wb") as f:
        f.write(b"RLXDIGIT" + struct.pack("<II", len(ytr), len(yte)))
        for x, y in ((xtr, ytr), (xte, yte)):
            f.write(np.ascontiguousarray(x, "<f4").tobytes())
            f.write(y.tobytes())


def read_data(path):
    b = Path(path).read_bytes()
    ntr, nte = struct.unpack("<II", b[8:16])
    at = 16
    out = []
    for n in (ntr, nte):
        x = np.frombuffer(b, "<f4", n * 64, at).reshape(n, 64)
        at += n * 256
        y = np.frombuffer(b, np.uint8, n, at).astype(np.int64)
        at += n
        out += [x, y]
    return out


def build(model, params, qdq=None):
    """The model as ONNX. With `qdq` (RLX's scales), every tap gets a QuantizeLinear /
    DequantizeLinear pair and the weights are int8 initializers behind a DequantizeLinear, and
    the output is the int8 logits."""
    nodes, inits = [], []
    acts = iter(qdq["activations"]) if qdq else None

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def tap(t):
        if qdq is None:
            return t
        s, z = next(acts)
        init(t + "_s", np.float32(s))
        init(t + "_z", np.int8(z))
        nodes.append(helper.make_node("QuantizeLinear", [t, t + "_s", t + "_z"], [t + "_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [t + "_q", t + "_s", t + "_z"], [t + "_dq"]))
        return t + "_dq"

    def weight(name, axis):
        w = np.asarray(params[name]["values"], np.float32).reshape(params[name]["dims"])
        if qdq is None:
            return init(name, w)
        s = np.asarray(qdq["weights"][name], np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / s.reshape(shape)), -127, 127).astype(np.int8)
        init(name + "_q", q)
        init(name + "_s", s)
        init(name + "_z", np.zeros(len(s), np.int8))
        nodes.append(helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"],
                                      axis=axis))
        return name + "_dq"

    def bias(name, flat=True):
        b = np.asarray(params[name]["values"], np.float32)
        return init(name, b.reshape(-1) if flat else b.reshape(params[name]["dims"]))

    h = tap("x")
    if model == "mlp":
        for i in (1, 2, 3):
            w = weight(f"w{i}", 1)
            nodes.append(helper.make_node("MatMul", [h, w], [f"m{i}"]))
            nodes.append(helper.make_node("Add", [f"m{i}", bias(f"b{i}")], [f"a{i}"]))
            out = f"a{i}"
            if i < 3:
                nodes.append(helper.make_node("Relu", [out], [f"h{i}"]))
                out = f"h{i}"
            h = tap(out)
    else:
        init("shape4", np.asarray([-1, 1, 8, 8], np.int64))
        nodes.append(helper.make_node("Reshape", [h, "shape4"], ["x4"]))
        h = "x4"
        for i, cb in ((1, "cb1"), (2, "cb2")):
            w = weight(f"c{i}", 0)
            nodes.append(helper.make_node("Conv", [h, w, bias(cb)], [f"conv{i}"], pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"r{i}"]))
            r = tap(f"r{i}")
            nodes.append(helper.make_node("MaxPool", [r], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            h = f"p{i}"
        init("shape2", np.asarray([-1, 128], np.int64))
        nodes.append(helper.make_node("Reshape", [h, "shape2"], ["flat"]))
        w = weight("w3", 1)
        nodes.append(helper.make_node("MatMul", ["flat", w], ["m3"]))
        nodes.append(helper.make_node("Add", ["m3", bias("b3")], ["a3"]))
        h = tap("a3")
    if qdq is None:
        output, otype = h, TensorProto.FLOAT
    else:
        output, otype = h.replace("_dq", "_q"), TensorProto.INT8
        nodes = [n for n in nodes if h not in n.output]
    graph = helper.make_graph(nodes, model, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info(output, otype, ["n", 10])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


class Reader(CalibrationDataReader):
    def __init__(self, x):
        self.rows = iter([{"x": x[i:i + 1]} for i in range(len(x))])

    def get_next(self):
        return next(self.rows, None)


def exact_int8_kernels():
    """Whether ONNX Runtime's fused int8 kernels sum exactly here. On x86 they multiply with
    VNNI where the CPU has it; without it (AVX2's vpmaddubsw) the sum of each pair of u8 x s8
    products saturates at int16, so the int8 logits are off by many steps."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def session(model_bytes, threads=1, fused=True):
    """An ONNX Runtime session; `fused=False` keeps the graph as written (QDQ pairs computed in
    f32: quantize, dequantize, float products) instead of fusing it into int8 kernels."""
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if fused
                                  else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return ort.InferenceSession(model_bytes, o, providers=["CPUExecutionProvider"])


def accuracy(sess, x, y):
    out = sess.run(None, {"x": x})[0]
    return float((out.argmax(1) == y).mean())


def run_ort(model, weights, data, out, bench):
    w = json.loads(Path(weights).read_text())
    xtr, ytr, xte, yte = read_data(data)
    fm = build(model, w["params"])
    res = {"float_accuracy": accuracy(session(fm.SerializeToString()), xte, yte)}
    with tempfile.TemporaryDirectory() as d:
        fp, qp = Path(d) / "float.onnx", Path(d) / "int8.onnx"
        onnx.save(fm, fp)
        quantize_static(str(fp), str(qp), Reader(xtr[:256]), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        int8 = qp.read_bytes()
    res["ort_int8_accuracy"] = accuracy(session(int8), xte, yte)
    if "rlx_qdq" in w:
        qm = build(model, w["params"], w["rlx_qdq"])
        fused = exact_int8_kernels()
        res["rlx_qdq_fused"] = fused
        res["rlx_qdq_int8"] = session(qm.SerializeToString(), fused=fused).run(None, {"x": xte})[0].reshape(-1).tolist()
    if bench:
        res["bench"] = {}
        for threads in (1, 2):
            s = session(int8, threads)
            for batch in (1, 64):
                xb = np.ascontiguousarray(xte[:batch])
                reps = max(20, 2000 // batch)
                s.run(None, {"x": xb})
                times = []
                for _ in range(7):
                    t = time.perf_counter()
                    for _ in range(reps):
                        s.run(None, {"x": xb})
                    times.append((time.perf_counter() - t) / reps)
                res["bench"][f"b{batch}_t{threads}"] = sorted(times)
    Path(out).write_text(json.dumps(res))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "data":
        write_data(sys.argv[2])
    elif len(sys.argv) >= 6 and sys.argv[1] == "ort":
        run_ort(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], "--bench" in sys.argv[6:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
