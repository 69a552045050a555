//! The op table's case format: map a case's op name and attributes to an [`Op`].

use rlx::prelude::*;
use serde_json::Value;

pub fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("uint") as usize)
        .collect()
}

pub fn pairs(v: &Value) -> Vec<(usize, usize)> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|p| {
            let p = usizes(p);
            (p[0], p[1])
        })
        .collect()
}

pub fn dtype(v: &Value) -> DType {
    DType::from_name(v.as_str().expect("dtype")).expect("known dtype")
}

/// A scheme by its IR name (`"GgufQ4_0"`).
pub fn scheme(v: &Value) -> rlx::ir::QuantScheme {
    serde_json::from_value(v.clone()).expect("a quantization scheme")
}

/// `log(1 + exp(x))` as a custom function of one argument of `shape` (a body graph is typed).
fn softplus(shape: Shape) -> rlx::ir::CustomFn {
    let mut body = Graph::new("softplus");
    let dt = shape.dtype();
    let x = body.input("x", shape);
    let e = body.activation(Activation::Exp, x);
    let one = body.scalar(1.0, dt);
    let s = body.add(e, one);
    let y = body.activation(Activation::Log, s);
    body.set_outputs(vec![y]);
    rlx::ir::CustomFn {
        name: "softplus".into(),
        body: Box::new(body),
        vjp: None,
        jvp: None,
    }
}

/// The op a case names.
pub fn op_of(name: &str, a: &Value) -> Op {
    let u = |k: &str| a[k].as_u64().unwrap_or_else(|| panic!("attr {k}")) as usize;
    let f = |k: &str| a[k].as_f64().unwrap_or_else(|| panic!("attr {k}")) as f32;
    let act = |x| Op::Activation(x);
    match name {
        "add" => Op::Binary(BinaryOp::Add),
        "sub" => Op::Binary(BinaryOp::Sub),
        "mul" => Op::Binary(BinaryOp::Mul),
        "div" => Op::Binary(BinaryOp::Div),
        "max" => Op::Binary(BinaryOp::Max),
        "min" => Op::Binary(BinaryOp::Min),
        "pow" => Op::Binary(BinaryOp::Pow),
        "eq" => Op::Compare(CmpOp::Eq),
        "ne" => Op::Compare(CmpOp::Ne),
        "lt" => Op::Compare(CmpOp::Lt),
        "le" => Op::Compare(CmpOp::Le),
        "gt" => Op::Compare(CmpOp::Gt),
        "ge" => Op::Compare(CmpOp::Ge),
        "where" => Op::Where,
        "gelu" => act(Activation::Gelu),
        "gelu_approx" => act(Activation::GeluApprox),
        "gelu_approx_grad" => act(Activation::GeluApproxGrad),
        "silu" => act(Activation::Silu),
        "relu" => act(Activation::Relu),
        "sigmoid" => act(Activation::Sigmoid),
        "tanh" => act(Activation::Tanh),
        "exp" => act(Activation::Exp),
        "log" => act(Activation::Log),
        "sqrt" => act(Activation::Sqrt),
        "rsqrt" => act(Activation::Rsqrt),
        "neg" => act(Activation::Neg),
        "abs" => act(Activation::Abs),
        "sin" => act(Activation::Sin),
        "cos" => act(Activation::Cos),
        "tan" => act(Activation::Tan),
        "atan" => act(Activation::Atan),
        "round" => act(Activation::Round),
        "erf" => act(Activation::Erf),
        "cast" => Op::Cast {
            to: dtype(&a["to"]),
        },
        "matmul" => Op::MatMul,
        "dot_general" => Op::DotGeneral(DotDims {
            lhs_contract: usizes(&a["lhs_contract"]),
            rhs_contract: usizes(&a["rhs_contract"]),
            lhs_batch: usizes(&a["lhs_batch"]),
            rhs_batch: usizes(&a["rhs_batch"]),
        }),
        "reduce" => Op::Reduce {
            kind: match a["kind"].as_str().expect("kind") {
                "sum" => ReduceKind::Sum,
                "mean" => ReduceKind::Mean,
                "max" => ReduceKind::Max,
                "min" => ReduceKind::Min,
                "prod" => ReduceKind::Prod,
                k => panic!("reduce kind {k}"),
            },
            axes: usizes(&a["axes"]),
            keepdims: a["keepdims"].as_bool().expect("keepdims"),
        },
        "softmax" => Op::Softmax { axis: u("axis") },
        "layer_norm" => Op::LayerNorm { eps: f("eps") },
        "rms_norm" => Op::RmsNorm { eps: f("eps") },
        "reshape" => Op::Reshape {
            shape: usizes(&a["shape"]),
        },
        "transpose" => Op::Transpose {
            perm: usizes(&a["perm"]),
        },
        "narrow" => Op::Narrow {
            axis: u("axis"),
            start: u("start"),
            len: u("len"),
        },
        "concat" => Op::Concat { axis: u("axis") },
        "expand" => Op::Expand {
            shape: usizes(&a["shape"]),
        },
        "gather" => Op::Gather { axis: u("axis") },
        "scatter_add" => Op::ScatterAdd { axis: u("axis") },
        "cumsum" => Op::Cumsum { axis: u("axis") },
        "topk_values" => Op::TopK {
            k: u("k"),
            output: TopKOutput::Values,
        },
        "topk_indices" => Op::TopK {
            k: u("k"),
            output: TopKOutput::Indices,
        },
        "attention" => Op::Attention {
            mask: match a["mask"].as_str().expect("mask") {
                "none" => MaskKind::None,
                "causal" => MaskKind::Causal,
                "sliding_window" => MaskKind::SlidingWindow(u("window")),
                "custom" => MaskKind::Custom,
                m => panic!("mask {m}"),
            },
            scale: f("scale"),
        },
        "rope" => Op::Rope {
            theta: f("theta"),
            interleaved: a["interleaved"].as_bool().expect("interleaved"),
        },
        "conv" => Op::Conv(ConvAttrs {
            stride: usizes(&a["stride"]),
            padding: pairs(&a["padding"]),
            dilation: usizes(&a["dilation"]),
            groups: u("groups"),
        }),
        "pool" => Op::Pool(PoolAttrs {
            kind: if a["kind"] == "max" {
                PoolKind::Max
            } else {
                PoolKind::Mean
            },
            kernel: usizes(&a["kernel"]),
            stride: usizes(&a["stride"]),
            padding: pairs(&a["padding"]),
        }),
        "dequantize_rows" => Op::DequantizeRows {
            scheme: scheme(&a["scheme"]),
        },
        "dequant_matmul" => Op::DequantMatMul {
            scheme: scheme(&a["scheme"]),
        },
        // `if`: its branches are graphs in the text form.
        "if" => {
            let branch = |k: &str| {
                Graph::parse(a[k].as_str().expect("branch text"))
                    .unwrap_or_else(|e| panic!("if {k} branch: {e}"))
            };
            Op::defined(rlx::ir::ops::If::new(branch("then"), branch("else")))
        }
        "quant_linear" => Op::defined(rlx::ir::ops::QuantLinear {
            scheme: scheme(&a["scheme"]),
        }),
        "while" | "scan" => {
            let body = |k: &str| {
                std::sync::Arc::new(
                    Graph::parse(a[k].as_str().expect("graph text"))
                        .unwrap_or_else(|e| panic!("{name} {k} graph: {e}")),
                )
            };
            if name == "while" {
                Op::defined(rlx::ir::ops::While {
                    cond: body("cond"),
                    body: body("body"),
                    max_iterations: a["max_iterations"].as_u64().map(|m| m as usize),
                    output: a["output"].as_u64().unwrap_or(0) as usize,
                })
            } else {
                Op::defined(rlx::ir::ops::Scan {
                    body: body("body"),
                    consts: a["consts"].as_u64().unwrap_or(0) as usize,
                })
            }
        }
        "fft" => Op::defined(rlx::ir::ops::Fft {
            kind: match a["kind"].as_str().expect("kind") {
                "fft" => rlx::ir::ops::FftKind::Fft,
                "ifft" => rlx::ir::ops::FftKind::Ifft,
                "rfft" => rlx::ir::ops::FftKind::Rfft,
                "irfft" => rlx::ir::ops::FftKind::Irfft,
                k => panic!("fft kind {k}"),
            },
            axis: u("axis"),
            n: u("n"),
        }),
        // Ops defined by an `OpDef`: the row's attributes in the text form (null is `none`).
        name if rlx::ir::ops::registration(name).is_some() => {
            let items: Vec<String> = a
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| match v {
                    Value::Null => format!("{k} = none"),
                    // A word (an enum value such as a pooling kind).
                    Value::String(w) => format!("{k} = {w}"),
                    v => format!("{k} = {v}"),
                })
                .collect();
            let text = if items.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", items.join(", "))
            };
            Op::Defined(rlx::ir::ops::DefinedOp::parse(name, &text).expect("the row's attributes"))
        }
        "cache_write" => Op::CacheWrite,
        "cached_attention" => Op::CachedAttention {
            scale: f("scale"),
            window: a["window"].as_u64().map(|w| w as usize),
        },
        "paged_attention" => Op::PagedAttention {
            scale: f("scale"),
            window: a["window"].as_u64().map(|w| w as usize),
            block: u("block"),
        },
        "custom" => {
            assert_eq!(a["fn"], "softplus", "the table's custom functions");
            Op::Custom(softplus(Shape::new(
                &usizes(&a["shape"]),
                dtype(&a["dtype"]),
            )))
        }
        "fused" => Op::Fused(FusedRegion {
            kind: FusionKind::from_name(a["kind"].as_str().expect("kind")).expect("a fusion kind"),
            body: Box::new(
                Graph::parse(a["body"].as_str().expect("body text"))
                    .unwrap_or_else(|e| panic!("fused body: {e}")),
            ),
            output: a["output"].as_u64().unwrap_or(0) as usize,
            region: None,
        }),
        other => panic!("the op table names an unknown op {other}"),
    }
}

/// Every case of `golden/ops.json`.
pub fn cases() -> Vec<Value> {
    // From the crate's folder; a test binary moved to another machine (scripts/gpu-check.sh)
    // finds the file under the repository root it runs in.
    let at = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/ops.json");
    let text = std::fs::read_to_string(at)
        .or_else(|_| std::fs::read_to_string("crates/rlx/tests/golden/ops.json"))
        .expect("golden file");
    let v: Value = serde_json::from_str(&text).expect("golden json");
    v["cases"].as_array().expect("cases").clone()
}
