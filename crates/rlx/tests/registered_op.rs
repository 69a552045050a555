//! An op defined and registered outside the IR (`rlx_ir::ops::register`): `softplus` with a
//! `beta` attribute, `log(1 + exp(beta x)) / beta`, written here as a downstream crate would,
//! goes through everything a built-in op does: the text form and JSON (printed and parsed back
//! by name), shape errors, the reference evaluator, decomposition for the CPU (which has no
//! native kernel for it), reverse and forward mode against finite differences, vmap, the compile
//! cache (in memory and on disk) and the dispatch report.

mod common;

use rlx::ir::eval::Tensor;
use rlx::ir::ops::{register, Batched, DefinedOp, OpClass, OpDef, OpRegistration};
use rlx::ir::text::Attr;
use rlx::prelude::*;
use rlx::runtime::CompileCache;

/// `log(1 + exp(beta x)) / beta`, elementwise, any float dtype.
#[derive(Clone, Debug)]
struct Softplus {
    beta: f32,
}

const SOFTPLUS: OpRegistration = OpRegistration {
    name: "softplus",
    from_attrs: |a| {
        Ok(DefinedOp::new(Softplus {
            beta: a.f32("beta")?,
        }))
    },
    examples: || {
        vec![
            DefinedOp::new(Softplus { beta: 1.0 }),
            DefinedOp::new(Softplus { beta: 2.5 }),
        ]
    },
};

fn softplus_f64(beta: f64, x: f64) -> f64 {
    let bx = beta * x;
    (bx.max(0.0) + (-bx.abs()).exp().ln_1p()) / beta
}

impl Softplus {
    /// `sigmoid(beta x)`, the derivative.
    fn slope(&self, g: &mut Graph, x: NodeId) -> Result<NodeId> {
        let dt = g.shape(x).dtype();
        let b = g.try_scalar(self.beta as f64, dt)?;
        let bx = g.try_mul(x, b)?;
        g.try_activation(Activation::Sigmoid, bx)
    }
}

impl OpDef for Softplus {
    fn name(&self) -> &'static str {
        "softplus"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![("beta", Attr::Float(self.beta))]
    }

    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        if !ins[0].dtype().is_float() {
            return Err(Error::Invalid(format!(
                "softplus takes a float operand, got {}",
                ins[0]
            )));
        }
        if self.beta <= 0.0 {
            return Err(Error::Invalid(format!(
                "softplus: beta must be positive, got {}",
                self.beta
            )));
        }
        Ok(ins[0].clone())
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let v = ins[0]
            .f64s()
            .iter()
            .map(|&x| softplus_f64(self.beta as f64, x))
            .collect();
        Ok(Tensor::from_f64(ins[0].dims(), out.dtype(), v))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> rlx::ir::ops::Cost {
        rlx::ir::ops::Cost::streaming(ins, out, 6)
    }

    /// `(max(bx, 0) + log(1 + exp(-|bx|))) / beta` with `bx = beta x`: no overflow.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        let mut build = || -> Result<NodeId> {
            let x = ins[0];
            let dt = g.shape(x).dtype();
            let b = g.try_scalar(self.beta as f64, dt)?;
            let bx = g.try_mul(x, b)?;
            let pos = g.try_activation(Activation::Relu, bx)?;
            let a = g.try_activation(Activation::Abs, bx)?;
            let na = g.try_activation(Activation::Neg, a)?;
            let e = g.try_activation(Activation::Exp, na)?;
            let one = g.try_scalar(1.0, dt)?;
            let e1 = g.try_add(e, one)?;
            let l = g.try_activation(Activation::Log, e1)?;
            let s = g.try_add(pos, l)?;
            g.try_div(s, b)
        };
        Some(build())
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    fn vjp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _out: NodeId,
        ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        let s = self.slope(g, ins[0])?;
        Ok(vec![Some(g.try_mul(ct, s)?)])
    }

    fn jvp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _out: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Option<NodeId>> {
        let Some(t) = t[0] else { return Ok(None) };
        let s = self.slope(g, ins[0])?;
        Ok(Some(g.try_mul(t, s)?))
    }

    fn batchable(&self, _batched: &[bool]) -> bool {
        true
    }

    /// Elementwise: the op on the batched operand, the batch axis where it was.
    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        let y = g.try_op(Op::Defined(DefinedOp::new(self.clone())), &[b.ins[0]])?;
        Ok((y, b.bds[0]))
    }

    fn precision_class(&self) -> OpClass {
        OpClass::Sensitive
    }
}

fn registered() {
    register(SOFTPLUS).expect("softplus registers");
}

fn softplus(g: &mut Graph, x: NodeId, beta: f32) -> NodeId {
    g.try_op(Op::Defined(DefinedOp::new(Softplus { beta })), &[x])
        .unwrap()
}

/// `sum(softplus(x * w))` with `x` an input and `w` a param, both `[2, 3]`.
fn model() -> Graph {
    let mut g = Graph::new("softplus_model");
    let x = g.input("x", Shape::new(&[2, 3], DType::F32));
    let w = g.param("w", Shape::new(&[2, 3], DType::F32));
    let xw = g.mul(x, w);
    let y = softplus(&mut g, xw, 2.0);
    let s = g
        .try_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![0, 1],
                keepdims: false,
            },
            &[y],
        )
        .unwrap();
    g.set_outputs(vec![s, y]);
    g
}

const X: [f32; 6] = [-3.0, -0.5, 0.0, 0.25, 1.5, 20.0];
const W: [f32; 6] = [0.5, 1.0, -2.0, 3.0, 1.0, 1.0];

/// `model()`'s softplus values (its second output) within `tol` relative of the f64 formula.
fn assert_model_values(got: &[f32], tol: f64) {
    for (k, (got, (x, w))) in got.iter().zip(X.iter().zip(&W)).enumerate() {
        let want = softplus_f64(2.0, (*x * *w) as f64);
        assert!(
            (*got as f64 - want).abs() <= tol * want.abs().max(1.0),
            "element {k}: {got} vs {want}"
        );
    }
}

fn run(c: &mut CompiledGraph) -> Vec<Vec<f32>> {
    c.set_param("w", &W);
    c.run(&[("x", &X)])
}

#[test]
fn a_registered_op_parses_prints_evaluates_and_compiles_like_a_builtin() {
    registered();
    // Registration: idempotent; the IR's own names and malformed names are refused by name.
    registered();
    let e = register(OpRegistration {
        name: "matmul",
        ..SOFTPLUS
    })
    .unwrap_err();
    assert!(e.to_string().contains("matmul"), "{e}");
    let e = register(OpRegistration {
        name: "Soft plus",
        ..SOFTPLUS
    })
    .unwrap_err();
    assert!(e.to_string().contains("Soft plus"), "{e}");
    let other = OpRegistration {
        name: "softplus",
        from_attrs: |_| Ok(DefinedOp::new(Softplus { beta: 1.0 })),
        examples: || Vec::new(),
    };
    assert!(register(other)
        .unwrap_err()
        .to_string()
        .contains("registered already"));
    assert_eq!(
        OpKind::from_name("softplus"),
        Some(OpKind::Defined("softplus"))
    );
    assert!(OpKind::all().contains(&OpKind::Defined("softplus")));

    let g = model();
    // The text form prints it with its attribute and parses it back by name; JSON too.
    let text = g.to_text();
    assert!(text.contains("softplus"), "{text}");
    let back = Graph::parse(&text).unwrap();
    assert_eq!(back.to_text(), text);
    let json = serde_json::to_string(&g).unwrap();
    let from_json: Graph = serde_json::from_str(&json).unwrap();
    assert_eq!(from_json.to_text(), text);
    // Shape inference names the op's problem.
    let mut bad = Graph::new("bad");
    let i = bad.input("i", Shape::new(&[2], DType::I32));
    let e = bad
        .try_op(Op::Defined(DefinedOp::new(Softplus { beta: 1.0 })), &[i])
        .unwrap_err();
    assert!(e.to_string().contains("softplus"), "{e}");

    // The reference evaluator and the CPU (through the decomposition) agree with f64.
    let want: Vec<f64> = X
        .iter()
        .zip(&W)
        .map(|(x, w)| softplus_f64(2.0, (*x * *w) as f64))
        .collect();
    let mut c = Session::new(Device::Cpu).compile(g.clone());
    let outs = run(&mut c);
    for (k, (got, w)) in outs[1].iter().zip(&want).enumerate() {
        assert!(
            (*got as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
            "element {k}: {got} vs {w}"
        );
    }
    let total: f64 = want.iter().sum();
    assert!((outs[0][0] as f64 - total).abs() < 1e-5 * total);
    let leaves: std::collections::BTreeMap<String, Tensor> = [("x", X), ("w", W)]
        .iter()
        .map(|(n, v)| {
            let t = Tensor::from_f64(&[2, 3], DType::F32, v.iter().map(|&v| v as f64).collect());
            (n.to_string(), t)
        })
        .collect();
    let r = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
    for (a, b) in r[1].f64s().iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "reference {a} vs {b}"
        );
    }
    // The report names the op: decomposed here, or native where its CPU kernel is registered
    // (another test of this binary registers one).
    let report = c.dispatch_report();
    assert!(
        report.decomposed.contains_key("decompose:softplus")
            || report.nodes.iter().any(|n| n.op == "softplus"),
        "{report}"
    );
}

/// The crate that registered the op gives the CPU backend a native kernel for it
/// (`rlx_cpu::kernels::registered::register_kernel`): the CPU then runs the op itself instead of
/// its decomposition, with the same values.
#[test]
fn a_registered_op_runs_the_native_cpu_kernel_its_crate_gives() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    registered();
    rlx_cpu::kernels::registered::register_kernel(
        "softplus",
        std::sync::Arc::new(|op, ins, out, shape, _pool| {
            CALLS.fetch_add(1, Ordering::Relaxed);
            let beta = op.downcast::<Softplus>().expect("a softplus").beta as f64;
            let (x, _) = ins[0];
            match shape.dtype() {
                DType::F32 => {
                    for (o, v) in out.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                        let v = f32::from_le_bytes(v.try_into().unwrap()) as f64;
                        // This kernel refuses NaN operands: how a kernel reports what it
                        // cannot compute.
                        if v.is_nan() {
                            rlx_cpu::kernels::registered::fail("a NaN operand");
                        }
                        o.copy_from_slice(&(softplus_f64(beta, v) as f32).to_le_bytes());
                    }
                }
                DType::F64 => {
                    for (o, v) in out.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
                        let v = f64::from_le_bytes(v.try_into().unwrap());
                        o.copy_from_slice(&softplus_f64(beta, v).to_le_bytes());
                    }
                }
                dt => unreachable!("softplus's infer admits {dt} but this kernel has no form"),
            }
        }),
    );
    let mut c = Session::new(Device::Cpu).compile(model());
    let report = c.dispatch_report();
    assert!(
        !report.decomposed.contains_key("decompose:softplus")
            && report.nodes.iter().any(|n| n.op == "softplus"),
        "a native kernel, no decomposition: {report}"
    );
    let before = CALLS.load(Ordering::Relaxed);
    let outs = run(&mut c);
    // At least this run's call: the other tests of this binary run softplus on the CPU too,
    // concurrently, and from now on through this kernel.
    assert!(
        CALLS.load(Ordering::Relaxed) > before,
        "the run called the registered kernel"
    );
    for (k, (got, (x, w))) in outs[1].iter().zip(X.iter().zip(&W)).enumerate() {
        let want = softplus_f64(2.0, (*x * *w) as f64) as f32;
        assert_eq!(*got, want, "element {k}");
    }
    // A kernel that reports a failure (`registered::fail`) ends the run with an error naming
    // the op, its node and operands; the next run starts clean.
    let mut bad = X;
    bad[2] = f32::NAN;
    let e = c
        .try_run(&[("x", &bad)])
        .expect_err("the kernel refuses NaN")
        .to_string();
    assert!(
        e.starts_with("softplus (node %") && e.contains("a NaN operand") && e.contains("f32[2, 3]"),
        "{e}"
    );
    assert!(c.try_run(&[("x", &X)]).is_ok(), "the next run succeeds");
}

/// The crate that registered the op gives the wgpu backend a WGSL kernel for it
/// (`rlx_wgpu::register_kernel`): the GPU then runs it natively (lavapipe in CI) with the
/// reference's values; where the kernel declines the operands (here: rank 3), or would loop
/// longer than the adapter lets an invocation, the GPU runs the decomposition.
#[test]
fn a_registered_op_runs_the_native_wgsl_kernel_its_crate_gives() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    registered();
    rlx_wgpu::register_kernel(
        "softplus",
        std::sync::Arc::new(|op, ins, out| {
            let beta = op.downcast::<Softplus>()?.beta;
            // f32 only, rank 2 at most; a beta of 7 claims a loop too long for lavapipe.
            if out.dtype() != DType::F32 || ins[0].rank() > 2 {
                return None;
            }
            Some(rlx_wgpu::WgslKernel {
                body: "    let b = bitcast<f32>(mt[3]);\n    let bx = b * bitcast<f32>(rd(mt[2] + i));\n    wr(mt[1] + i, bitcast<u32>((max(bx, 0.0) + log(1.0 + exp(-abs(bx)))) / b));\n".into(),
                words: vec![beta.to_bits()],
                invocations: out.numel()?,
                longest_loop: if beta == 7.0 { 1 << 20 } else { 0 },
            })
        }),
    );
    let native = |g: Graph| {
        let c = Session::new(Device::Gpu).compile(g);
        let r = c.dispatch_report();
        let native = !r.decomposed.contains_key("decompose:softplus")
            && r.nodes.iter().any(|n| n.op == "softplus");
        (c, native)
    };
    let (mut c, is_native) = native(model());
    assert!(is_native, "a native WGSL kernel: {}", c.dispatch_report());
    let outs = run(&mut c);
    assert_model_values(&outs[1], 1e-6);
    // Declined operands and a loop too long for lavapipe: the decomposition, the same values.
    for (dims, beta) in [(vec![1, 2, 3], 2.0), (vec![2, 3], 7.0)] {
        let mut g = Graph::new("declined");
        let x = g.input("x", Shape::new(&dims, DType::F32));
        let y = softplus(&mut g, x, beta);
        g.set_outputs(vec![y]);
        let (mut c, is_native) = native(g);
        let lavapipe = rlx_wgpu::Gpu::get(Device::Gpu).unwrap().loop_limited();
        assert_eq!(is_native, beta == 7.0 && !lavapipe, "{dims:?}, beta {beta}");
        let got = &c.run(&[("x", &X)])[0];
        for (k, (got, x)) in got.iter().zip(&X).enumerate() {
            let want = softplus_f64(beta as f64, *x as f64);
            assert!(
                (*got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{dims:?} element {k}: {got} vs {want}"
            );
        }
    }
}

/// The same for CUDA (`rlx_cuda::register_kernel`): the program launches the crate's kernel for
/// the op, its values in host emulation are the reference's, and the kernel compiles with NVRTC
/// for the checked architectures (a failure without NVRTC where `RLX_REQUIRE_NVRTC=1`); a
/// declined operand (rank 3) lowers to the decomposition.
#[test]
fn a_registered_op_runs_the_native_cuda_kernel_its_crate_gives() {
    registered();
    register_cuda_kernel();
    let lowered = |g: Graph| {
        let l = Session::new(Device::Cuda).try_lower(g).unwrap();
        rlx_cuda::lower(&l.graph, &[]).unwrap()
    };
    let p = lowered(model());
    let native = |p: &rlx_cuda::Program| p.launches.iter().any(|l| l.op == "softplus");
    assert!(native(&p), "a launch of the registered kernel");
    let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("the kernels compile");
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let outs = emu.run(&p, &[bytes(&X)], &[bytes(&W)]).unwrap();
    for (k, (got, (x, w))) in outs[1].chunks_exact(4).zip(X.iter().zip(&W)).enumerate() {
        let got = f32::from_le_bytes(got.try_into().unwrap()) as f64;
        let want = softplus_f64(2.0, (*x * *w) as f64);
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "element {k}: {got} vs {want}"
        );
    }
    common::compile_cuda_kernels(&p.kernels, "softplus's registered kernel");
    let mut g = Graph::new("declined");
    let x = g.input("x", Shape::new(&[1, 2, 3], DType::F32));
    let y = softplus(&mut g, x, 2.0);
    g.set_outputs(vec![y]);
    assert!(!native(&lowered(g)), "rank 3 runs the decomposition");
}

/// Give the CUDA backend softplus's kernel (f32, rank 2 at most).
fn register_cuda_kernel() {
    rlx_cuda::register_kernel(
        "softplus",
        std::sync::Arc::new(|op, ins, out| {
            let beta = op.downcast::<Softplus>()?.beta;
            if out.dtype() != DType::F32 || ins[0].rank() > 2 {
                return None;
            }
            Some(rlx_cuda::CudaKernel {
                body: "        const float b = __int_as_float((int)m.w[3]);\n        const float bx = b * ((const float *)m.w[2])[i];\n        ((float *)m.w[1])[i] = (fmaxf(bx, 0.0f) + log1pf(expf(-fabsf(bx)))) / b;\n".into(),
                words: vec![beta.to_bits() as i64],
                items: out.numel()?,
            })
        }),
    );
}

/// The registered CUDA kernel on a CUDA device (`scripts/gpu-check.sh` runs it there).
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_the_registered_kernel_runs_on_the_device() {
    common::require_cuda("softplus's CUDA kernel on the device");
    registered();
    register_cuda_kernel();
    let mut c = Session::new(Device::Cuda).compile(model());
    let outs = run(&mut c);
    assert_model_values(&outs[1], 1e-6);
}

#[test]
fn a_registered_op_differentiates_and_batches() {
    registered();
    let g = model();
    let w_id = g.find_leaf("w").unwrap();
    // Reverse mode against central differences of the loss in f64.
    let gg = rlx::autodiff::grad(&g, &[w_id]).unwrap();
    let mut c = Session::new(Device::Cpu).compile(gg);
    c.set_param("w", &W);
    let grad = c.run(&[("x", &X)]).remove(0);
    let loss = |w: &[f64]| -> f64 {
        X.iter()
            .zip(w)
            .map(|(x, w)| softplus_f64(2.0, *x as f64 * w))
            .sum()
    };
    let w64: Vec<f64> = W.iter().map(|&v| v as f64).collect();
    for k in 0..6 {
        let h = 1e-5;
        let (mut a, mut b) = (w64.clone(), w64.clone());
        a[k] += h;
        b[k] -= h;
        let fd = (loss(&a) - loss(&b)) / (2.0 * h);
        assert!(
            (grad[k] as f64 - fd).abs() < 1e-3 * fd.abs().max(1.0),
            "d/dw[{k}]: {} vs {fd}",
            grad[k]
        );
    }
    // Forward mode: the tangent of the loss along a direction is the gradient's dot product.
    let jg = rlx::autodiff::jvp(&g, &["w"]).unwrap();
    let dir = [1.0f32, -1.0, 0.5, 0.0, 2.0, 1.0];
    let mut c = Session::new(Device::Cpu).compile(jg);
    c.set_param("w", &W);
    let t = rlx::autodiff::tangent_name("w");
    let outs = c.run(&[("x", &X), (t.as_str(), &dir)]);
    let dot: f32 = grad.iter().zip(&dir).map(|(a, b)| a * b).sum();
    let tangent = outs[2][0];
    assert!(
        (tangent - dot).abs() < 1e-4 * dot.abs().max(1.0),
        "jvp {tangent} vs {dot}"
    );

    // vmap over a batch of 3 inputs: each row is the op on that example.
    let mut one = Graph::new("one");
    let x = one.input("x", Shape::new(&[4], DType::F32));
    let y = softplus(&mut one, x, 0.5);
    one.set_outputs(vec![y]);
    let vg = rlx::autodiff::vmap(&one, &["x"], 3).unwrap();
    let xs: Vec<f32> = (0..12).map(|i| i as f32 - 6.0).collect();
    let mut c = Session::new(Device::Cpu).compile(vg);
    let out = c.run(&[("x", &xs)]).remove(0);
    for (k, (got, x)) in out.iter().zip(&xs).enumerate() {
        let want = softplus_f64(0.5, *x as f64);
        assert!(
            (*got as f64 - want).abs() < 1e-5 * want.max(1.0),
            "example {}: {got} vs {want}",
            k / 4
        );
    }
}

#[test]
fn a_registered_op_goes_through_the_compile_cache() {
    registered();
    let dir = std::env::temp_dir().join(format!("rlx-registered-op-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = {
        let cache = CompileCache::at(&dir);
        let mut c = Session::new(Device::Cpu)
            .with_compile_cache(cache.clone())
            .compile(model());
        assert_eq!(cache.stats().misses, 1);
        run(&mut c)
    };
    // A new cache over the same directory reads the entry from disk (the graph serialized with
    // the registered op in it, parsed back by name).
    let cache = CompileCache::at(&dir);
    let mut c = Session::new(Device::Cpu)
        .with_compile_cache(cache.clone())
        .compile(model());
    let s = cache.stats();
    assert_eq!((s.disk_hits, s.misses, s.rejected), (1, 0, 0), "{s:?}");
    assert_eq!(run(&mut c), first);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scientific crates are reachable from the prelude crate (`rlx::linalg`, `rlx::sparse`,
/// behind features of those names): a solve and a sparse product built through them run on the
/// CPU, with no `register()` call first.
#[test]
fn the_scientific_crates_are_reachable_from_the_prelude_crate() {
    let mut g = Graph::new("science");
    let a = g.input("a", Shape::new(&[2, 2], DType::F32));
    let b = g.input("b", Shape::new(&[2, 1], DType::F32));
    let x = rlx::linalg::apply(&mut g, rlx::linalg::Linalg::Solve, &[a, b]).unwrap();
    let rows = g.constant_bytes(
        Shape::new(&[2], DType::I32),
        [0i32, 1].map(i32::to_le_bytes).concat(),
    );
    let cols = g.constant_bytes(
        Shape::new(&[2], DType::I32),
        [1i32, 0].map(i32::to_le_bytes).concat(),
    );
    let values = g.constant_f32(&[2], &[2.0, 3.0]);
    let m = rlx::sparse::Coo {
        rows,
        cols,
        values,
        shape: (2, 2),
    };
    let y = m.matmul(&mut g, x).unwrap();
    g.set_outputs(vec![x, y]);
    let mut c = Session::new(Device::Cpu).compile(g);
    // a = [[2, 0], [0, 4]], b = [2, 8]: x = [1, 2]; [[0, 2], [3, 0]] x = [4, 3].
    let out = c.run(&[("a", &[2.0, 0.0, 0.0, 4.0]), ("b", &[2.0, 8.0])]);
    assert_eq!(out, vec![vec![1.0, 2.0], vec![4.0, 3.0]]);
}
