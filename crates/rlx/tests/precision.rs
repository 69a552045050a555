//! Mixed precision against numpy + ml_dtypes (`golden/precision.json`, written by
//! `golden/gen_precision.py`; regenerate with `scripts/regen-goldens.sh`): casts between f32,
//! bf16 and f16 bit for bit at every instruction-set level, and an MLP compiled under each
//! `PrecisionPolicy` against the same MLP emulated with the policy's roundings.

mod common;

use common::{decode, encode};
use rlx::ir::Activation;
use rlx::prelude::*;
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/precision.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("json")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn dtype(name: &str) -> DType {
    match name {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        d => panic!("dtype {d}"),
    }
}

#[test]
fn casts_round_as_ml_dtypes_does_at_every_level() {
    let g = golden();
    rlx_cpu::isa::for_each_level(|level| {
        for c in g["casts"].as_array().unwrap() {
            let (from, to) = (
                dtype(c["from"].as_str().unwrap()),
                dtype(c["to"].as_str().unwrap()),
            );
            let input = floats(&c["input"]);
            let want = floats(&c["expected"]);
            // Dense, and transposed (a strided read) as a [2, n/2] matrix.
            for transposed in [false, true] {
                let n = input.len() / 2 * 2;
                let mut gr = Graph::new("cast");
                let x = gr.input("x", Shape::new(&[2, n / 2], from));
                let (src, want): (Vec<f64>, Vec<f64>) = if transposed {
                    let t = gr.transpose(x, &[1, 0]);
                    let y = gr.cast(t, to);
                    gr.set_outputs(vec![y]);
                    let idx: Vec<usize> = (0..n / 2)
                        .flat_map(|j| (0..2).map(move |i| i * (n / 2) + j))
                        .collect();
                    (input[..n].to_vec(), idx.iter().map(|&i| want[i]).collect())
                } else {
                    let y = gr.cast(x, to);
                    gr.set_outputs(vec![y]);
                    (input[..n].to_vec(), want[..n].to_vec())
                };
                let mut c = Session::new(Device::Cpu).compile(gr);
                let out = c.run_typed(&[("x", &encode(&src, from), from)]);
                let got = decode(&out[0].0, to);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == w.to_bits(),
                        "{from} -> {to} at {level} (transposed {transposed}), element {i}: {g:e} vs ml_dtypes {w:e}"
                    );
                }
            }
        }
    });
}

/// Named param values.
type Params = Vec<(&'static str, Vec<f32>)>;

/// The golden MLP: `softmax(gelu(x @ w1 + b1) @ w2 + b2)`, its params and its input.
fn mlp(m: &Value) -> (Graph, Params, Vec<f32>) {
    let dims = |k: &str| -> Vec<usize> {
        m[k]["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    };
    let data = |k: &str| -> Vec<f32> { floats(&m[k]["data"]).iter().map(|&v| v as f32).collect() };
    let mut g = Graph::new("mlp");
    let x = g.input("x", Shape::new(&dims("x"), DType::F32));
    let w1 = g.param("w1", Shape::new(&dims("w1"), DType::F32));
    let b1 = g.param("b1", Shape::new(&dims("b1"), DType::F32));
    let w2 = g.param("w2", Shape::new(&dims("w2"), DType::F32));
    let b2 = g.param("b2", Shape::new(&dims("b2"), DType::F32));
    let h = g.dot(x, w1);
    let h = g.add(h, b1);
    let h = g.activation(Activation::Gelu, h);
    let y = g.dot(h, w2);
    let y = g.add(y, b2);
    let y = g.softmax(y, 1);
    g.set_outputs(vec![y]);
    let params = ["w1", "b1", "w2", "b2"].map(|k| (k, data(k))).to_vec();
    (g, params, data("x"))
}

fn run(device: Device, policy: &PrecisionPolicy, m: &Value) -> Vec<f32> {
    let (g, params, x) = mlp(m);
    let mut c = Session::new(device)
        .with_precision(policy.clone())
        .try_compile(g)
        .unwrap_or_else(|e| panic!("{}: {e}", policy.name()));
    for (k, v) in &params {
        c.set_param(k, v);
    }
    c.run(&[("x", &x)]).remove(0)
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// Every policy on `device` lands on its own emulation: within a small fraction of how far the
/// policy moves the result from f32 (the test fails if the policy is not applied, or applied at
/// other points).
fn policies_match_their_emulation(device: Device) {
    let g = golden();
    let m = &g["mlp"];
    let f32_ref = floats(&m["expected"]["always_f32"]);
    for policy in [
        PrecisionPolicy::AlwaysF32,
        PrecisionPolicy::AutoMixedBf16,
        PrecisionPolicy::AutoMixed,
        PrecisionPolicy::AlwaysBf16,
        PrecisionPolicy::AlwaysF16,
    ] {
        let want = floats(&m["expected"][policy.name()]);
        let got = run(device, &policy, m);
        let off = max_diff(&got, &want);
        let moved = want
            .iter()
            .zip(&f32_ref)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "{device} {}: max |rlx - emulation| = {off:.3e}; the policy moves the result by {moved:.3e}",
            policy.name()
        );
        let tol = if policy.is_identity() {
            1e-6
        } else {
            moved / 50.0
        };
        assert!(
            off <= tol,
            "{device} {}: max difference {off:e} from the emulation (tolerance {tol:e})",
            policy.name()
        );
    }
}

#[test]
fn every_policy_matches_its_numpy_emulation_on_the_cpu() {
    rlx_cpu::isa::for_each_level(|_| policies_match_their_emulation(Device::Cpu));
}

/// The policy is IR: the GPU backend runs the same rewritten graph (bf16 / f16 values computed
/// in f32 and rounded after every op, as the CPU does).
#[test]
fn every_policy_matches_its_numpy_emulation_on_the_gpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    policies_match_their_emulation(Device::Gpu);
}

#[test]
fn auto_mixed_stores_read_only_weights_in_low_precision_and_reports_the_pass() {
    let g = golden();
    let (graph, params, x) = mlp(&g["mlp"]);
    let mut c = Session::new(Device::Cpu)
        .with_precision(PrecisionPolicy::AutoMixedBf16)
        .compile(graph);
    let dt = |c: &CompiledGraph, name: &str| {
        c.params()
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .shape
            .dtype()
    };
    assert_eq!(dt(&c, "w1"), DType::BF16);
    assert_eq!(dt(&c, "b1"), DType::F32);
    let rec = c
        .pass_records()
        .iter()
        .find(|r| r.pass == "precision")
        .expect("a precision record");
    assert!(rec.rewrites >= 2, "{rec:?}");
    // f32 bytes for a bf16-stored param are rounded to it; reading back gives the rounded values.
    let w1 = &params[0].1;
    let bytes: Vec<u8> = w1.iter().flat_map(|v| v.to_le_bytes()).collect();
    c.set_param_typed("w1", &bytes, DType::F32);
    let back = c.try_get_param("w1").unwrap();
    for (a, b) in w1.iter().zip(&back) {
        assert_eq!(half::bf16::from_f32(*a).to_f32(), *b);
    }
    for (k, v) in &params[1..] {
        c.set_param(k, v);
    }
    let out = c.run(&[("x", &x)]).remove(0);
    let want = floats(&g["mlp"]["expected"]["auto_mixed_bf16"]);
    assert!(max_diff(&out, &want) < 1e-4);
}

/// A defined op (outside the IR crate) says how the precision policies treat it.
mod defined_op_class {
    use rlx::ir::eval::Tensor;
    use rlx::ir::ops::{Cost, OpClass, OpDef};
    use rlx::ir::text::Attr;
    use rlx::opt::{AutoMixedPrecision, Pass};
    use rlx::prelude::*;

    /// `x * x`, in the class it is given.
    struct Square(OpClass);

    impl OpDef for Square {
        fn name(&self) -> &'static str {
            "square_test"
        }
        fn attrs(&self) -> Vec<(&'static str, Attr)> {
            Vec::new()
        }
        fn arity(&self) -> (usize, usize) {
            (1, 1)
        }
        fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
            Ok(ins[0].clone())
        }
        fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
            let v = ins[0].f64s().iter().map(|x| x * x).collect();
            Ok(Tensor::from_f64(ins[0].dims(), out.dtype(), v))
        }
        fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
            Cost::streaming(ins, out, 1)
        }
        fn precision_class(&self) -> OpClass {
            self.0
        }
    }

    /// The dtype the op computes in after `AutoMixedBf16`.
    fn computes_in(class: OpClass) -> DType {
        let mut g = Graph::new("sq");
        let x = g.input("x", Shape::new(&[4, 4], DType::F32));
        let y = g.define(Square(class), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let pass = AutoMixedPrecision {
            policy: PrecisionPolicy::AutoMixedBf16,
            keep_params: Vec::new(),
        };
        let (out, _) = pass.run(&g).unwrap();
        let node = out
            .nodes()
            .iter()
            .find(|n| n.op.name() == "square_test")
            .expect("the op survives");
        out.shape(node.inputs[0]).dtype()
    }

    #[test]
    fn a_defined_ops_precision_class_is_applied() {
        assert_eq!(computes_in(OpClass::Product), DType::BF16);
        assert_eq!(computes_in(OpClass::Fixed), DType::F32);
        assert_eq!(computes_in(OpClass::Sensitive), DType::F32);
    }
}
