//! The GPU backend seen from outside: adapter choice by name, and the dispatch report of a
//! graph compiled for it (regions generated as shaders, decompositions, native kernels).

mod common;

use rlx::driver::Backend;
use rlx::opt::Dispatch;
use rlx::prelude::*;

#[test]
fn rlx_wgpu_adapter_picks_by_name_and_names_what_exists() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let name = rlx::driver::gpu::adapter(Device::Vulkan)
        .expect("an adapter")
        .get_info()
        .name;
    // The one test of this binary sets the variable: nothing else reads it meanwhile.
    std::env::set_var(rlx::ir::env::WGPU_ADAPTER.name, &name[..name.len().min(4)]);
    let picked = rlx::driver::gpu::adapter(Device::Vulkan).expect("picked by part of its name");
    assert_eq!(picked.get_info().name, name);
    std::env::set_var(rlx::ir::env::WGPU_ADAPTER.name, "no-such-adapter-anywhere");
    let err = rlx::driver::gpu::adapter(Device::Vulkan).expect_err("no such adapter");
    assert!(
        err.contains("no-such-adapter-anywhere") && err.contains(&name),
        "{err}"
    );
    std::env::remove_var(rlx::ir::env::WGPU_ADAPTER.name);

    // What runs where on the GPU: a dot_general decomposed, an elementwise region, a softmax and
    // an RMS norm on kernels of their own.
    let g = Graph::parse(
        r#"graph "gpu_dispatch" {
  %x = input {name = "x"} : f32[4, 8]
  %w = param {name = "w"} : f32[8, 8]
  %d = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0], lhs_batch = [], rhs_batch = []} : f32[4, 8]
  %a = silu %d : f32[4, 8]
  %m = mul %a, %x : f32[4, 8]
  %s = softmax %m {axis = 1} : f32[4, 8]
  %gw = param {name = "gw"} : f32[8]
  %n = rms_norm %s, %gw {eps = 1e-5} : f32[4, 8]
  return %n
}"#,
    )
    .expect("parses");
    let c = Session::new(Device::Gpu)
        .try_compile(g)
        .expect("compiles for the GPU");
    let d = c.dispatch_report();
    assert_eq!(d.backend, "wgpu");
    assert!(d.decomposed.contains_key("decompose:dot_general"), "{d}");
    assert!(d.nodes.iter().any(|n| matches!(&n.dispatch, Dispatch::Fused { ops, .. } if ops.contains(&"silu".to_string()))), "{d}");
    assert!(
        d.nodes
            .iter()
            .any(|n| n.op == "softmax" && n.dispatch == Dispatch::Native),
        "{d}"
    );
    assert!(
        d.nodes
            .iter()
            .any(|n| n.op == "rms_norm" && n.dispatch == Dispatch::Native),
        "{d}"
    );
    assert_eq!(d.counts().4, 0, "nothing unsupported: {d}");
}

/// Elementwise regions with several results and multiply-reduce regions run as generated
/// shaders on the GPU and give the CPU's values.
#[test]
fn fused_regions_on_the_gpu_give_the_cpus_values() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let text = r#"graph "regions" {
  %x = input {name = "x"} : f32[8, 16]
  %u = input {name = "u"} : f32[8, 16]
  %a = silu %x : f32[8, 16]
  %m = mul %a, %u : f32[8, 16]
  %e = exp %m : f32[8, 16]
  %t = tanh %e : f32[8, 16]
  %p = mul %t, %u : f32[8, 16]
  %r = reduce %p {kind = sum, axes = [1], keepdims = true} : f32[8, 1]
  %s = sub %e, %r : f32[8, 16]
  return %m, %s, %r
}"#;
    let x: Vec<f32> = (0..128).map(|i| (i % 13) as f32 / 6.5 - 1.0).collect();
    let u: Vec<f32> = (0..128).map(|i| (i % 7) as f32 / 3.5 - 1.0).collect();
    let run = |device: Device| {
        let mut c = Session::new(device)
            .try_compile(Graph::parse(text).unwrap())
            .unwrap();
        let kinds: Vec<FusionKind> = c.fusion_report().regions.iter().map(|r| r.kind).collect();
        (c.run(&[("x", &x), ("u", &u)]), kinds)
    };
    let (cpu, _) = run(Device::Cpu);
    let (gpu, kinds) = run(Device::Gpu);
    assert!(
        kinds.contains(&FusionKind::MultiplyReduce) && kinds.contains(&FusionKind::Elementwise),
        "{kinds:?}"
    );
    for (o, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
        for (i, (p, q)) in a.iter().zip(b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-5 * (1.0 + p.abs()),
                "output {o}[{i}]: CPU {p}, GPU {q}"
            );
        }
    }
}

/// A narrow whose result is a contiguous range of its operand (every axis before the narrowed
/// one of length 1: a decode step's split of a stacked product) is a view on both GPU backends:
/// no dispatch or launch of its own, its readers (and the caller, for an output) offset into the
/// operand's storage, also through a reshape of a view. Narrows that are not contiguous (a
/// leading axis of 2) or start off a 16-byte boundary still copy. Bytes against the reference
/// evaluator on wgpu and in CUDA's host emulation.
#[test]
fn contiguous_narrows_are_views_on_the_gpu_backends() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let text = r#"graph "views" {
  %x = input {name = "x"} : f32[1, 40]
  %w = input {name = "w"} : f32[2, 8]
  %y = mul %x, %x : f32[1, 40]
  %a = narrow %y {axis = 1, start = 0, len = 12} : f32[1, 12]
  %b = narrow %y {axis = 1, start = 12, len = 20} : f32[1, 20]
  %c = narrow %y {axis = 1, start = 32, len = 8} : f32[1, 8]
  %f = narrow %y {axis = 1, start = 4, len = 8} : f32[1, 8]
  %d = reshape %b {shape = [1, 4, 5]} : f32[1, 4, 5]
  %e = narrow %d {axis = 1, start = 2, len = 2} : f32[1, 2, 5]
  %v = narrow %d {axis = 1, start = 0, len = 2} : f32[1, 2, 5]
  %g = narrow %w {axis = 1, start = 4, len = 4} : f32[2, 4]
  %s = neg %a : f32[1, 12]
  %t = neg %v : f32[1, 2, 5]
  return %s, %c, %f, %e, %t, %g
}"#;
    let g = Graph::parse(text).unwrap();
    let x: Vec<f32> = (0..40).map(|i| (i % 11) as f32 / 5.5 - 1.0).collect();
    let w: Vec<f32> = (0..16).map(|i| i as f32 * 0.25).collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let feeds = [("x", bytes(&x)), ("w", bytes(&w))];
    let leaves = feeds
        .iter()
        .map(|(n, b)| {
            let shape = g.shape(g.find_leaf(n).unwrap());
            (
                n.to_string(),
                rlx::ir::eval::Tensor::from_bytes(shape, b).unwrap(),
            )
        })
        .collect();
    // Products, negations and copies: every backend's bytes are the reference evaluator's.
    let want: Vec<Vec<u8>> = rlx::ir::eval::evaluate(&g, &leaves)
        .unwrap()
        .iter()
        .map(|t| t.to_bytes())
        .collect();
    let lowered = |device: Device| Session::new(device).try_lower(g.clone()).unwrap().graph;
    // Views: %a, %b (48 bytes in), %c, %f, and %v through the reshape of %b. Copies: %e (22
    // elements in: 88 bytes, off the 16-byte boundary) and %g (a leading axis of 2).
    let expected_copies = 2;
    // wgpu.
    let mut exe = rlx_wgpu::WgpuBackend {
        device: Device::Gpu,
    }
    .compile(
        &lowered(Device::Gpu),
        &rlx::driver::CompileOptions::default(),
    )
    .unwrap();
    for (k, (_, b)) in feeds.iter().enumerate() {
        exe.write_input(k, b).unwrap();
    }
    exe.execute().unwrap();
    let program = exe
        .as_any()
        .and_then(|a| a.downcast_ref::<rlx_wgpu::GpuProgram>())
        .unwrap();
    let ops = program.step_ops();
    assert_eq!(
        ops.iter().filter(|o| **o == "narrow").count(),
        expected_copies,
        "{ops:?}"
    );
    for (o, want) in want.iter().enumerate() {
        let mut got = vec![0u8; want.len()];
        exe.read_output(o, &mut got).unwrap();
        assert_eq!(&got, want, "wgpu output {o}");
    }
    // CUDA, lowered here and run in host emulation.
    let p = rlx_cuda::lower(&lowered(Device::Cuda), &[]).unwrap();
    let copies = p.launches.iter().filter(|l| l.op == "narrow").count();
    assert_eq!(copies, expected_copies, "CUDA launches");
    let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("the kernels compile");
    let inputs: Vec<Vec<u8>> = feeds.iter().map(|(_, b)| b.clone()).collect();
    let got = emu.run(&p, &inputs, &[]).unwrap();
    for (o, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "CUDA output {o}");
    }
}

/// Narrow integers on the GPU (one word per element): i8 / u8 arithmetic wraps before the next
/// op reads it, float-to-int casts saturate, and an int8 quantize / dequantize round trip with
/// u8 zero points given as a param (not packed GGUF rows) gives the CPU's values.
#[test]
fn narrow_integers_on_the_gpu_wrap_and_saturate_as_on_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let text = r#"graph "narrow_ints" {
  %a = input {name = "a"} : i8[6]
  %b = input {name = "b"} : i8[6]
  %x = input {name = "x"} : f32[2, 6]
  %s = param {name = "s"} : f32[6]
  %z = param {name = "z"} : u8[6]
  %sum = add %a, %b : i8[6]
  %half = div %sum, %b : i8[6]
  %wide = cast %half {to = f32} : f32[6]
  %big = mul %x, %x : f32[2, 6]
  %q = quantize %x, %s, %z {axis = 1} : u8[2, 6]
  %d = dequantize %q, %s, %z {axis = 1} : f32[2, 6]
  %sat = cast %big {to = i8} : i8[2, 6]
  %back = cast %sat {to = f32} : f32[2, 6]
  return %wide, %d, %back
}"#;
    let a: Vec<u8> = [100i8, -100, 127, -128, 7, 90]
        .iter()
        .map(|&v| v as u8)
        .collect();
    let b: Vec<u8> = [100i8, -100, 1, -1, 3, 60]
        .iter()
        .map(|&v| v as u8)
        .collect();
    let x: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 3.7).collect();
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let s: Vec<f32> = vec![0.5, 0.25, 1.0, 0.125, 2.0, 0.75];
    let z: Vec<u8> = vec![128, 0, 10, 255, 127, 3];
    let run = |device: Device| {
        let mut c = Session::new(device)
            .try_compile(Graph::parse(text).unwrap())
            .unwrap();
        c.set_param("s", &s);
        c.set_param_typed("z", &z, DType::U8);
        c.run_typed(&[
            ("a", &a, DType::I8),
            ("b", &b, DType::I8),
            ("x", &xb, DType::F32),
        ])
    };
    let (cpu, gpu) = (run(Device::Cpu), run(Device::Gpu));
    // The wrapped sums are -56, 56, -128, 127, 10, -106: dividing them shows the wrap.
    let wide: Vec<f32> = cpu[0]
        .0
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(wide, [0.0, 0.0, -128.0, -127.0, 3.0, -1.0], "CPU reference");
    assert_eq!(cpu, gpu, "CPU and GPU results");
}

/// A graph whose arena is larger than one storage binding may be (128 MiB on lavapipe) runs:
/// the arena is split into buffers and values (f32 words, f16 halves) span them.
#[test]
fn an_arena_above_the_binding_limit_is_split_across_buffers() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let limits = rlx::driver::gpu::adapter(Device::Gpu)
        .expect("an adapter")
        .limits();
    let limit = limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size);
    if limit > 1 << 29 {
        eprintln!("this adapter binds {limit} bytes at once: the split is not exercised here");
        return;
    }
    // Two live values of 0.6 of the limit each (the input and the product).
    let cols = 4096;
    let rows = (limit as usize / 4 * 6 / 10).div_ceil(cols);
    let mut g = Graph::new("big_arena");
    let x = g
        .try_input("x", Shape::new(&[rows, cols], DType::F32))
        .unwrap();
    let (three, one) = (
        g.try_scalar(3.0, DType::F32).unwrap(),
        g.try_scalar(1.0, DType::F32).unwrap(),
    );
    let m = g.try_mul(x, three).unwrap();
    let y = g.try_sub(m, one).unwrap();
    let r = g.try_sum(y, &[1], false).unwrap();
    // An f16 value as well: with f16 storage its halves span arena buffers too.
    let h = g.try_cast(y, DType::F16).unwrap();
    g.set_outputs(vec![y, r, h]);
    let x: Vec<f32> = (0..rows * cols).map(|i| (i % 1000) as f32).collect();
    let mut c = Session::new(Device::Gpu)
        .try_compile(g)
        .expect("compiles with the arena split");
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let typed = c.run_typed(&[("x", &xb, DType::F32)]);
    let out = c.run(&[("x", &x)]);
    for (i, (&y, &v)) in out[0].iter().zip(&x).enumerate() {
        assert_eq!(y, v * 3.0 - 1.0, "y[{i}]");
    }
    for (i, (h, &v)) in typed[2].0.chunks_exact(2).zip(&x).enumerate() {
        let want = half::f16::from_f32(v * 3.0 - 1.0);
        assert_eq!(half::f16::from_le_bytes([h[0], h[1]]), want, "h[{i}]");
    }
    for (r, &s) in out[1].iter().enumerate() {
        let want: f32 = x[r * cols..(r + 1) * cols]
            .iter()
            .map(|v| v * 3.0 - 1.0)
            .sum();
        assert_eq!(s, want, "row sum {r}");
    }
}

/// How an f32 -> f16 conversion rounds. Vulkan leaves the rounding mode of `packHalf2x16` (what
/// the WGSL kernels round with) to the implementation ("correctly rounded with implementation
/// defined rounding mode"): to nearest even (the CPU, lavapipe) or toward zero.
#[derive(Clone, Copy, Debug, PartialEq)]
enum F16Rounding {
    NearestEven,
    TowardZero,
}

/// `x` rounded to f16 in `mode`, as f64.
fn to_f16(x: f64, mode: F16Rounding) -> f64 {
    let h = half::f16::from_f64(x);
    match mode {
        // One step toward zero when rounding to nearest went away from it (|h| > |x| >= 0, so
        // h's magnitude bits are not 0 and the step keeps its sign).
        F16Rounding::TowardZero if h.to_f64().abs() > x.abs() => {
            half::f16::from_bits(h.to_bits() - 1).to_f64()
        }
        _ => h.to_f64(),
    }
}

/// How far, in f32, a sum of terms lands from its exact value: each addition rounds by at most
/// u = 2^-24 of the partial sum it makes, independently, so the errors add up like a random walk
/// (standard deviation u·√(Σ S_k² / 3) over the partial sums S_k); this is 3·u·√(Σ S_k²),
/// over five of those deviations, for the terms summed in the given order (a loop, as the GPU
/// kernels sum; the CPU's blocked sums have smaller partial sums).
fn f32_sum_error(terms: impl Iterator<Item = f64>) -> f64 {
    let mut partial = 0f64;
    let squares: f64 = terms
        .map(|t| {
            partial += t;
            partial * partial
        })
        .sum();
    3.0 * f64::powi(2.0, -24) * squares.sqrt()
}

/// Cached attention as an f16 cache defines it (llama.cpp's default path, which the CPU and the
/// GPU kernels follow): queries rounded to f16, scores, softmax weights rounded to f16, their
/// products with the values summed; every step but the two roundings exact (f64). Returns, per
/// result element `[S, Hq, D]`, that value and how far an f32 implementation may honestly be
/// from it:
///
/// - A weight is rounded to f16 from an f32 value that carries f32 rounding error. Where the
///   exact weight lies within that error of an f16 rounding boundary, the f32 computation may
///   land on either side, and the result move by the gap between the two f16 candidates times
///   the value the weight multiplies. Elsewhere the rounded weight, and its product with the
///   value (f16 × f16, exact in f32), are the model's bit for bit. The relative f32 error of a
///   weight `w_j = e^(x_j) / Σ e^(x_k)`, `x_j = s_j - max`, u = 2^-24:
///   - the score `s_j = scale * q·k_j`: 64 exact products (f16 × f16) summed
///     ([`f32_sum_error`]), scaled (u·|s_j|); then `- max` (u·|x_j|; an error of the max
///     scales every exponential alike and cancels in the weights);
///   - `e^x`: Vulkan allows 3 + 2|x| ulp (2u each); the CPU's exponential is better;
///   - the sum of the exponentials ([`f32_sum_error`], plus its terms' errors) and the
///     division (Vulkan: 2.5 ulp).
/// - The weighted values are summed in f32 ([`f32_sum_error`]), and the result rounded to f32.
///
/// An f32 implementation that rounds queries and weights in `mode` is within this of the model;
/// one that does not round (whose error is that of f16 storage of all ~380 weights, not of the
/// few that lie near a boundary), or that scales wrongly, is not.
fn f16_cache_attention(
    q: &[f32],
    k: &[f64],
    v: &[f64],
    (s, hq, hkv, d, t): (usize, usize, usize, usize, usize),
    pos: usize,
    scale: f32,
    mode: F16Rounding,
) -> (Vec<f64>, Vec<f64>) {
    let u = f64::powi(2.0, -24);
    let scale = scale as f64;
    let (mut value, mut bound) = (vec![0f64; s * hq * d], vec![0f64; s * hq * d]);
    for i in 0..s {
        let n = (pos + i).min(t - 1) + 1;
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let row = |j: usize| (j * hkv + kh) * d;
            let qr: Vec<f64> = (0..d)
                .map(|e| to_f16(q[(i * hq + h) * d + e] as f64, mode))
                .collect();
            let (mut sc, mut ds) = (vec![0f64; n], vec![0f64; n]);
            for j in 0..n {
                let products = (0..d).map(|e| qr[e] * k[row(j) + e]);
                sc[j] = scale * products.clone().sum::<f64>();
                ds[j] = scale * f32_sum_error(products) + u * sc[j].abs();
            }
            let top = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let x: Vec<f64> = sc.iter().map(|v| v - top).collect();
            let ex: Vec<f64> = x.iter().map(|x| x.exp()).collect();
            let sum: f64 = ex.iter().sum();
            // Relative error of each exponential, then of the sum.
            let de: Vec<f64> = (0..n)
                .map(|j| ds[j] + u * x[j].abs() + (3.0 + 2.0 * x[j].abs()) * 2.0 * u)
                .collect();
            let dsum = f32_sum_error(ex.iter().copied()) / sum
                + (0..n).map(|j| ex[j] * de[j]).sum::<f64>() / sum;
            let o = (i * hq + h) * d;
            let mut rounded = vec![0f64; n];
            for j in 0..n {
                let w = ex[j] / sum;
                let rho = de[j] + dsum + 5.0 * u;
                rounded[j] = to_f16(w, mode);
                // The gap between the f16 candidates within the error (0 unless a rounding
                // boundary lies there).
                let gap = to_f16(w * (1.0 + rho), mode) - to_f16(w * (1.0 - rho), mode);
                for c in 0..d {
                    value[o + c] += rounded[j] * v[row(j) + c];
                    bound[o + c] += gap * v[row(j) + c].abs();
                }
            }
            for c in 0..d {
                bound[o + c] += f32_sum_error((0..n).map(|j| rounded[j] * v[row(j) + c]))
                    + u * value[o + c].abs();
            }
        }
    }
    (value, bound)
}

/// With an f16 KV cache, the cached attention of the GPU and of the CPU (at every instruction-set
/// level) rounds queries and weights to f16: each is within what f16 storage allows of the
/// attention an f16 cache defines ([`f16_cache_attention`]: f32 rounding may flip a weight
/// lying at an f16 rounding boundary, nothing else), over hundreds of keys, while the exact
/// (f64, unrounded) attention is not. The GPU may round in either mode Vulkan allows; the CPU
/// rounds to nearest even, so where the GPU does too, GPU and CPU are within twice the bound of
/// each other. The scale (0.15) is not 1/√64, so a kernel using 1/√D instead fails. (Measured on
/// lavapipe: GPU - CPU 7.5e-6, one weight at a boundary; a kernel that leaves the weights
/// unrounded is 5.7e-5 from the CPU and outside the bound at 306 of 768 elements.)
#[test]
fn cached_attention_over_an_f16_cache_rounds_as_the_cpu_does() {
    use F16Rounding::{NearestEven, TowardZero};
    assert!(
        Device::Gpu.is_available(),
        "{}",
        Device::Gpu.availability_hint()
    );
    // 380 + 3 keys of 64: an invocation looping over keys and head dims together would pass
    // lavapipe's 65535 loop iterations (which ends it silently).
    let (s, hq, hkv, d, t) = (3, 4, 2, 64, 400);
    let (pos, scale) = (380usize, 0.15f32);
    let mut g = Graph::new("f16_cache");
    let q = g
        .try_input("q", Shape::new(&[s, hq, d], DType::F32))
        .unwrap();
    let k = g
        .try_param("k", Shape::new(&[t, hkv, d], DType::F16))
        .unwrap();
    let v = g
        .try_param("v", Shape::new(&[t, hkv, d], DType::F16))
        .unwrap();
    let pos_in = g.try_input("pos", Shape::new(&[1], DType::I32)).unwrap();
    let op = Op::CachedAttention {
        scale,
        window: None,
    };
    let y = g.try_op(op, &[q, k, v, pos_in]).unwrap();
    g.set_outputs(vec![y]);
    let wave =
        |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect() };
    let f16s = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let values = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect()
    };
    let qv = wave(s * hq * d, 0.37);
    let (kv, vv) = (
        f16s(&wave(t * hkv * d, 0.11)),
        f16s(&wave(t * hkv * d, 0.23)),
    );
    let qb: Vec<u8> = qv.iter().flat_map(|x| x.to_le_bytes()).collect();
    let pb = (pos as i32).to_le_bytes().to_vec();
    let run = |device: Device| -> Vec<f64> {
        let mut c = Session::new(device).try_compile(g.clone()).unwrap();
        c.set_param_typed("k", &kv, DType::F16);
        c.set_param_typed("v", &vv, DType::F16);
        let out = c.run_typed(&[("q", &qb, DType::F32), ("pos", &pb, DType::I32)]);
        out[0]
            .0
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    };
    let mut leaves = std::collections::BTreeMap::new();
    for (name, shape, bytes) in [
        ("q", g.shape(q), &qb),
        ("k", g.shape(k), &kv),
        ("v", g.shape(v), &vv),
        ("pos", g.shape(pos_in), &pb),
    ] {
        leaves.insert(
            name.to_string(),
            rlx::ir::eval::Tensor::from_bytes(shape, bytes).unwrap(),
        );
    }
    let exact = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
    let dims = (s, hq, hkv, d, t);
    let model = |mode| f16_cache_attention(&qv, &values(&kv), &values(&vv), dims, pos, scale, mode);
    let models = [
        (NearestEven, model(NearestEven)),
        (TowardZero, model(TowardZero)),
    ];
    // The elements farther from the model than the bound, and the largest distance / bound.
    let outside = |got: &[f64], (want, bound): &(Vec<f64>, Vec<f64>)| -> (Vec<usize>, f64) {
        let far = (0..got.len())
            .filter(|&e| (got[e] - want[e]).abs() > bound[e])
            .collect();
        let worst = (0..got.len())
            .map(|e| (got[e] - want[e]).abs() / bound[e])
            .fold(0f64, f64::max);
        (far, worst)
    };
    let dist = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f64, f64::max)
    };
    // The bound tells rounding from not rounding: the exact attention is outside it at a good
    // share of the elements (measured: 308 and 457 of 768).
    for (mode, m) in &models {
        let (far, _) = outside(&exact, m);
        assert!(
            far.len() >= exact.len() / 4,
            "the exact attention is outside the {mode:?} bound at only {} of {} elements: the \
             bound hardly tells f16 rounding from none",
            far.len(),
            exact.len()
        );
    }
    // The CPU at every instruction-set level (other sum orders, another exponential on the
    // portable level) rounds to nearest even.
    let cpu = run(Device::Cpu);
    rlx_cpu::isa::for_each_level(|level| {
        let got = run(Device::Cpu);
        let (far, worst) = outside(&got, &models[0].1);
        assert!(
            far.is_empty(),
            "CPU at {level}: {} elements outside the bound of f16 storage (worst {worst:.2} of \
             the bound), first {:?}",
            far.len(),
            far.first()
                .map(|&e| (e, got[e], models[0].1 .0[e], models[0].1 .1[e]))
        );
    });
    let gpu = run(Device::Gpu);
    let fits: Vec<(F16Rounding, f64)> = models
        .iter()
        .filter_map(|(mode, m)| {
            let (far, worst) = outside(&gpu, m);
            far.is_empty().then_some((*mode, worst))
        })
        .collect();
    eprintln!(
        "GPU - CPU {:.2e}, CPU - exact {:.2e}; GPU within the f16 bound of {fits:?} (worst / bound)",
        dist(&gpu, &cpu),
        dist(&cpu, &exact)
    );
    assert!(!fits.is_empty(), "{}", {
        let mut why = format!(
            "the GPU's attention is not f16 attention in either rounding mode (GPU - CPU {:.2e}, \
             GPU - exact {:.2e}):",
            dist(&gpu, &cpu),
            dist(&gpu, &exact)
        );
        for (mode, m) in &models {
            let (far, worst) = outside(&gpu, m);
            why += &format!(
                "\n  {mode:?}: {} of {} elements outside the bound (worst {worst:.2} of it)",
                far.len(),
                gpu.len()
            );
        }
        why
    });
}

/// On an adapter that ends an invocation's loops after 65535 iterations (lavapipe, a CPU-type
/// adapter), a kernel that would loop longer is a compile error naming the op and node, not a
/// silently wrong result (top-k takes a pass over its row for each result: the top 3 of 70,000
/// run, the top 4000 do not; a cumsum's workgroup scans its row chunk by chunk: 700,000 is too
/// long);
/// a softmax over 70,000 elements runs, its workgroup splitting the row.
#[test]
fn loops_past_the_adapters_limit_are_a_compile_error() {
    assert!(
        Device::Gpu.is_available(),
        "{}",
        Device::Gpu.availability_hint()
    );
    let info = rlx::driver::gpu::adapter(Device::Gpu)
        .expect("an adapter")
        .get_info();
    // 0: softmax, 1: top-k (of `k`), 2: cumsum.
    let row = |n: usize, op: u8, k: usize| {
        let mut g = Graph::new("long_row");
        let x = g.try_input("x", Shape::new(&[1, n], DType::F32)).unwrap();
        let y = match op {
            0 => g.try_softmax(x, 1).unwrap(),
            1 => g.try_topk(x, k).unwrap().0,
            _ => g.try_cumsum(x, 1).unwrap(),
        };
        g.set_outputs(vec![y]);
        Session::new(Device::Gpu).try_compile(g)
    };
    for n in [1000, 70_000] {
        let mut c = row(n, 0, 0).expect("a softmax compiles");
        let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let y = c.run(&[("x", &x)]);
        assert!(
            (y[0].iter().sum::<f32>() - 1.0).abs() < 1e-4,
            "softmax of {n}"
        );
    }
    // Top-k takes k passes over a 64th of the row: the top 3 of 70,000 runs (the largest three,
    // the first of equals first).
    let mut c = row(70_000, 1, 3).expect("a top-3 of 70,000 compiles");
    let x: Vec<f32> = (0..70_000).map(|i| ((i * 7919) % 65_521) as f32).collect();
    let y = c.run(&[("x", &x)]);
    let mut want = x.clone();
    want.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(y[0], want[..3].to_vec(), "top-3 of 70,000");
    // The same on CUDA (a block a row), in host emulation.
    let mut g = Graph::new("long_topk");
    let xi = g
        .try_input("x", Shape::new(&[1, 70_000], DType::F32))
        .unwrap();
    let (vals, idx) = g.try_topk(xi, 3).unwrap();
    g.set_outputs(vec![vals, idx]);
    let lowered = Session::new(Device::Cuda).try_lower(g).unwrap().graph;
    let p = rlx_cuda::lower(&lowered, &[]).unwrap();
    let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("the kernels compile");
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let outs = emu.run(&p, &[xb], &[]).unwrap();
    assert_eq!(
        common::decode(&outs[0], DType::F32),
        want[..3].iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    let first = |v: f32| x.iter().position(|&e| e == v).unwrap() as f64;
    assert_eq!(
        common::decode(&outs[1], DType::I32)[0],
        first(want[0]),
        "CUDA top-3 indices"
    );
    // A top-4000 of 70,000 (4000 passes of 1,102 steps), and a cumsum of 700,000 (each
    // invocation scans 10,938 chunks of its row in 7 steps each: 76,566 iterations).
    for (n, op, k, name) in [(70_000, 1, 4000, "topk"), (700_000, 2, 0, "cumsum")] {
        let long = row(n, op, k);
        if format!("{:?}", info.device_type) == "Cpu" {
            let err = long
                .err()
                .unwrap_or_else(|| panic!("{n}-long {name} refused on a loop-limited adapter"));
            assert_mentions(&err.to_string(), &[name, "%1", "65535"]);
        } else {
            long.expect("a real GPU has no such limit");
        }
    }
}

fn assert_mentions(text: &str, words: &[&str]) {
    for w in words {
        assert!(text.contains(w), "{w:?} missing from: {text}");
    }
}

/// Under `AutoMixedBf16` an encoder's masked attention runs in bf16 (products in bf16, softmax
/// in f32) on both backends; the GPU's values are the CPU's within bf16 rounding.
#[test]
fn bf16_attention_under_auto_mixed_gives_the_cpus_values_on_the_gpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let text = r#"graph "attention" {
  %q = input {name = "q"} : f32[2, 3, 10, 8]
  %k = input {name = "k"} : f32[2, 3, 10, 8]
  %v = input {name = "v"} : f32[2, 3, 10, 8]
  %m = input {name = "m"} : f32[2, 1, 1, 10]
  %a = attention %q, %k, %v, %m {mask = custom, scale = 0.35} : f32[2, 3, 10, 8]
  return %a
}"#;
    let vals = |n: usize, s: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * (29 + 4 * s) + 11 * s) % 89) as f32 - 44.0) / 25.0)
            .collect()
    };
    let (q, k, v) = (vals(480, 1), vals(480, 2), vals(480, 3));
    // Key padding: the last three keys of the second example masked out.
    let m: Vec<f32> = (0..20)
        .map(|i| if i >= 17 { f32::MIN } else { 0.0 })
        .collect();
    let run = |device: Device, policy: PrecisionPolicy| {
        let mut c = Session::new(device)
            .with_precision(policy)
            .try_compile(Graph::parse(text).unwrap())
            .unwrap();
        c.run(&[("q", &q), ("k", &k), ("v", &v), ("m", &m)])
            .remove(0)
    };
    let exact = run(Device::Cpu, PrecisionPolicy::AlwaysF32);
    let cpu = run(Device::Cpu, PrecisionPolicy::AutoMixedBf16);
    let gpu = run(Device::Gpu, PrecisionPolicy::AutoMixedBf16);
    for (i, ((e, c), g)) in exact.iter().zip(&cpu).zip(&gpu).enumerate() {
        assert!(
            (c - e).abs() <= 3e-2 * (1.0 + e.abs()),
            "[{i}]: CPU bf16 {c}, f32 {e}"
        );
        assert!(
            (g - c).abs() <= 3e-2 * (1.0 + c.abs()),
            "[{i}]: GPU {g}, CPU {c}"
        );
    }
    assert!(cpu != exact, "the policy moved attention to bf16");
}

/// f16 rounding on the GPU is round-to-nearest-even done with integer arithmetic, which a
/// driver cannot fold away (an f32 → f16 → f32 round trip through `pack2x16float` may be), bit
/// for bit `half`'s conversion: ties, the largest values, overflow to infinity, subnormals,
/// signed zeros and NaN.
#[test]
fn gpu_f16_rounding_is_nearest_even_bit_for_bit() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.1,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        2049.0,
        2051.0,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        70000.0,
        1e-8,
        2.9802322e-8,
        5.9604645e-8,
        8.940697e-8,
        6.1035156e-5,
        6.097555e-5,
        -3.0e-7,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        1e-40,
    ];
    // A spread of magnitudes, a few ulps either side of f16 ties.
    for e in -26..17 {
        for m in [1.0f32, 1.25, 1.5009766, 1.7, 1.9990234] {
            let v = m * 2f32.powi(e);
            xs.push(v);
            xs.push(-f32::from_bits(v.to_bits() + 1));
        }
    }
    let n = xs.len();
    let mut g = Graph::new("round_f16");
    let x = g.input("x", Shape::new(&[n], DType::F32));
    let h = g.cast(x, DType::F16);
    g.set_outputs(vec![h]);
    let mut c = Session::new(Device::Gpu).compile(g);
    let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = c.run_typed(&[("x", &bytes, DType::F32)]);
    for (i, (&v, b)) in xs.iter().zip(out[0].0.chunks_exact(2)).enumerate() {
        let got = u16::from_le_bytes([b[0], b[1]]);
        let want = half::f16::from_f32(v).to_bits();
        assert_eq!(
            got, want,
            "element {i}: {v:e} rounds to {want:#06x}, the GPU gave {got:#06x}"
        );
    }
    let mut nan = Graph::new("nan_f16");
    let x = nan.input("x", Shape::new(&[1], DType::F32));
    let h = nan.cast(x, DType::F16);
    nan.set_outputs(vec![h]);
    let mut c = Session::new(Device::Gpu).compile(nan);
    let out = c.run_typed(&[("x", &f32::NAN.to_le_bytes(), DType::F32)]);
    let got = half::f16::from_le_bytes([out[0].0[0], out[0].0[1]]);
    assert!(got.is_nan(), "NaN stays NaN, got {got}");
}

/// Cached attention of a few query rows (decode) is one step on both GPU backends where the
/// cache's scores fit in on-chip memory (wgpu: T ≤ 3072, CUDA: T ≤ 8192), reading only the
/// keys each row sees; prompts and longer caches take three steps. Both forms against the CPU
/// on wgpu and in CUDA's host emulation: f32 and f16 caches, grouped heads, value rows of
/// another width than the keys', windows, rows past the cache's end, a negative position.
#[test]
fn cached_attention_in_one_step_and_in_three_agrees_with_the_cpu() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let (hq, hkv, d, dv) = (4, 2, 64, 48);
    // (query rows, cache rows, position, window)
    let cases = [
        (1, 40, 17i32, None),
        (3, 40, 36, Some(5)),
        (2, 40, -2, None),
        (1, 4000, 3500, None),
        (1, 9000, 8999, Some(700)),
        (16, 40, 10, None),
    ];
    for cache in [DType::F32, DType::F16] {
        for (s, t, pos, window) in cases {
            let name = format!("{s} rows over {t} {cache} cache rows at {pos}, window {window:?}");
            let mut g = Graph::new("cached_attention");
            let q = g.input("q", Shape::new(&[s, hq, d], DType::F32));
            let k = g.param("k", Shape::new(&[t, hkv, d], cache));
            let v = g.param("v", Shape::new(&[t, hkv, dv], cache));
            let p = g.input("pos", Shape::new(&[1], DType::I32));
            let op = Op::CachedAttention {
                scale: 0.15,
                window,
            };
            let y = g.op(op, &[q, k, v, p]);
            g.set_outputs(vec![y]);
            let wave = |n: usize, f: f64| -> Vec<f64> {
                (0..n).map(|i| (i as f64 * f).sin() * 2.0).collect()
            };
            let enc = |v: &[f64], dt: DType| common::encode(v, dt);
            let feeds = [
                ("q", enc(&wave(s * hq * d, 0.37), DType::F32), DType::F32),
                ("pos", pos.to_le_bytes().to_vec(), DType::I32),
            ];
            let params = [
                ("k", enc(&wave(t * hkv * d, 0.11), cache), cache),
                ("v", enc(&wave(t * hkv * dv, 0.23), cache), cache),
            ];
            let run = |device: Device| -> Vec<f64> {
                let mut c = Session::new(device).try_compile(g.clone()).unwrap();
                for (n, b, dt) in &params {
                    c.set_param_typed(n, b, *dt);
                }
                let f: Vec<(&str, &[u8], DType)> = feeds
                    .iter()
                    .map(|(n, b, dt)| (*n, b.as_slice(), *dt))
                    .collect();
                let out = c.run_typed(&f);
                common::decode(&out[0].0, out[0].1)
            };
            let cpu = run(Device::Cpu);
            let scale = cpu.iter().fold(0f64, |m, x| m.max(x.abs()));
            // f16 caches: a weight on an f16 rounding boundary may round the other way after
            // another summation order, moving a result by a weight's ulp times a value.
            let tol = if cache == DType::F32 { 1e-5 } else { 2e-3 } * scale.max(1.0);
            let near = |what: &str, got: &[f64]| {
                let off = got
                    .iter()
                    .zip(&cpu)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f64, f64::max);
                assert!(
                    off <= tol,
                    "{name} on {what}: {off:e} from the CPU (scale {scale})"
                );
            };
            let one = |most: usize| s < 16 && t <= most;
            // wgpu.
            near("wgpu", &run(Device::Gpu));
            let lowered = |device: Device| Session::new(device).try_lower(g.clone()).unwrap().graph;
            let mut exe = rlx_wgpu::WgpuBackend {
                device: Device::Gpu,
            }
            .compile(
                &lowered(Device::Gpu),
                &rlx::driver::CompileOptions::default(),
            )
            .unwrap();
            exe.execute().unwrap();
            let ops = exe
                .as_any()
                .and_then(|a| a.downcast_ref::<rlx_wgpu::GpuProgram>())
                .unwrap()
                .step_ops();
            let steps = ops.iter().filter(|o| **o == "cached_attention").count();
            let want = if one(rlx_wgpu::shaders::ATTENTION_STAGE) {
                1
            } else {
                3
            };
            assert_eq!(steps, want, "{name}: wgpu steps {ops:?}");
            // CUDA in host emulation.
            let prog = rlx_cuda::lower(&lowered(Device::Cuda), &[]).unwrap();
            let launches = prog
                .launches
                .iter()
                .filter(|l| l.op == "cached_attention")
                .count();
            let want = if one(rlx_cuda::source::ATTENTION_STAGE) {
                1
            } else {
                3
            };
            assert_eq!(launches, want, "{name}: CUDA launches");
            let emu = rlx_cuda::emulate::Emulator::build(&prog.kernels).expect("compiles");
            let by_name = |slots: &[rlx::driver::IoSlot], from: &[(&str, Vec<u8>, DType)]| {
                slots
                    .iter()
                    .map(|sl| from.iter().find(|f| f.0 == sl.name).unwrap().1.clone())
                    .collect::<Vec<_>>()
            };
            let outs = emu
                .run(
                    &prog,
                    &by_name(&prog.inputs, &feeds),
                    &by_name(&prog.params, &params),
                )
                .unwrap();
            near("CUDA (emulated)", &common::decode(&outs[0], DType::F32));
        }
    }
}

/// `Op::Attention` (f32) is one launch on CUDA, a block per batch, head and 8 query rows
/// staging 16 keys at a time: in host emulation against the reference evaluator over rows and
/// keys that span several blocks and tiles, grouped heads, value rows of another width, queries
/// at the last positions of longer keys, and every mask kind (a custom mask broadcast over the
/// heads). The same graphs on wgpu too.
#[test]
fn attention_spanning_blocks_and_key_tiles_matches_the_reference_evaluator() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let (b, hq, hkv, sq, sk, d, dv) = (2, 4, 2, 20, 45, 40, 24);
    let masks = [
        rlx::ir::MaskKind::None,
        rlx::ir::MaskKind::Causal,
        rlx::ir::MaskKind::SlidingWindow(7),
        rlx::ir::MaskKind::Custom,
    ];
    for mask in masks {
        let mut g = Graph::new("attention");
        let q = g.input("q", Shape::new(&[b, hq, sq, d], DType::F32));
        let k = g.input("k", Shape::new(&[b, hkv, sk, d], DType::F32));
        let v = g.input("v", Shape::new(&[b, hkv, sk, dv], DType::F32));
        let mut ins = vec![q, k, v];
        if mask == rlx::ir::MaskKind::Custom {
            ins.push(g.input("m", Shape::new(&[b, 1, sq, sk], DType::F32)));
        }
        let y = g.op(Op::Attention { mask, scale: 0.2 }, &ins);
        g.set_outputs(vec![y]);
        let feeds: Vec<(String, Vec<u8>)> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(s, (name, id))| {
                let n = g.shape(*id).numel().unwrap();
                let vals: Vec<f64> = (0..n)
                    .map(|i| match *name {
                        // A mask of zeros and large negatives (some keys hidden).
                        "m" => -50.0 * ((i * 7 % 5 == 0) as u8 as f64),
                        _ => ((i * (13 + s) % 31) as f64 - 15.0) / 9.0,
                    })
                    .collect();
                (name.to_string(), common::encode(&vals, DType::F32))
            })
            .collect();
        let leaves = feeds
            .iter()
            .map(|(n, bytes)| {
                let shape = g.shape(g.find_leaf(n).unwrap());
                (
                    n.clone(),
                    rlx::ir::eval::Tensor::from_bytes(shape, bytes).unwrap(),
                )
            })
            .collect();
        let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
        let scale = want.iter().fold(1f64, |m, x| m.max(x.abs()));
        let near = |what: &str, got: &[f64]| {
            let off = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f64, f64::max);
            assert!(
                off <= 1e-5 * scale,
                "{mask:?} on {what}: {off:e} from the reference"
            );
        };
        let lowered = Session::new(Device::Cuda)
            .try_lower(g.clone())
            .unwrap()
            .graph;
        let p = rlx_cuda::lower(&lowered, &[]).unwrap();
        let ops: Vec<&str> = p.launches.iter().map(|l| l.op).collect();
        assert_eq!(ops, ["attention"], "{mask:?}: CUDA launches");
        let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("the kernels compile");
        let inputs: Vec<Vec<u8>> = p
            .inputs
            .iter()
            .map(|s| feeds.iter().find(|f| f.0 == s.name).unwrap().1.clone())
            .collect();
        let outs = emu.run(&p, &inputs, &[]).unwrap();
        near("CUDA (emulated)", &common::decode(&outs[0], DType::F32));
        let mut c = Session::new(Device::Gpu).try_compile(g.clone()).unwrap();
        let f: Vec<(&str, &[u8], DType)> = feeds
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice(), DType::F32))
            .collect();
        let out = c.run_typed(&f);
        near("wgpu", &common::decode(&out[0].0, out[0].1));
    }
}
