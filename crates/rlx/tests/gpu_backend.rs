//! The GPU backend seen from outside: adapter choice by name, and the dispatch report of a
//! graph compiled for it (regions generated as shaders, decompositions, native kernels).

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
    std::env::set_var("RLX_WGPU_ADAPTER", &name[..name.len().min(4)]);
    let picked = rlx::driver::gpu::adapter(Device::Vulkan).expect("picked by part of its name");
    assert_eq!(picked.get_info().name, name);
    std::env::set_var("RLX_WGPU_ADAPTER", "no-such-adapter-anywhere");
    let err = rlx::driver::gpu::adapter(Device::Vulkan).expect_err("no such adapter");
    assert!(
        err.contains("no-such-adapter-anywhere") && err.contains(&name),
        "{err}"
    );
    std::env::remove_var("RLX_WGPU_ADAPTER");

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

/// With an f16 KV cache, the GPU's cached attention rounds queries and weights to f16 as the
/// CPU does (llama.cpp's default path): the two agree far more closely than either agrees with
/// the exact (f64, unrounded) attention, also over hundreds of keys.
#[test]
fn cached_attention_over_an_f16_cache_rounds_as_the_cpu_does() {
    assert!(
        Device::Gpu.is_available(),
        "{}",
        Device::Gpu.availability_hint()
    );
    // 380 + 3 keys of 64: an invocation looping over keys and head dims together would pass
    // lavapipe's 65535 loop iterations (which ends it silently).
    let (s, hq, hkv, d, t) = (3, 4, 2, 64, 400);
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
    let pos = g.try_input("pos", Shape::new(&[1], DType::I32)).unwrap();
    let op = Op::CachedAttention {
        scale: 0.125,
        window: None,
    };
    let y = g.try_op(op, &[q, k, v, pos]).unwrap();
    g.set_outputs(vec![y]);
    let wave =
        |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect() };
    let f16s = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let qv = wave(s * hq * d, 0.37);
    let (kv, vv) = (
        f16s(&wave(t * hkv * d, 0.11)),
        f16s(&wave(t * hkv * d, 0.23)),
    );
    let qb: Vec<u8> = qv.iter().flat_map(|x| x.to_le_bytes()).collect();
    let pb = 380i32.to_le_bytes().to_vec();
    let run = |device: Device| -> Vec<f32> {
        let mut c = Session::new(device).try_compile(g.clone()).unwrap();
        c.set_param_typed("k", &kv, DType::F16);
        c.set_param_typed("v", &vv, DType::F16);
        let out = c.run_typed(&[("q", &qb, DType::F32), ("pos", &pb, DType::I32)]);
        out[0]
            .0
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (cpu, gpu) = (run(Device::Cpu), run(Device::Gpu));
    let mut leaves = std::collections::BTreeMap::new();
    for (name, shape, bytes) in [
        ("q", g.shape(q), &qb),
        ("k", g.shape(k), &kv),
        ("v", g.shape(v), &vv),
        ("pos", g.shape(pos), &pb),
    ] {
        leaves.insert(
            name.to_string(),
            rlx::ir::eval::Tensor::from_bytes(shape, bytes).unwrap(),
        );
    }
    let exact = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
    let dist = |a: &[f32], b: &dyn Fn(usize) -> f64| {
        a.iter()
            .enumerate()
            .map(|(i, x)| (*x as f64 - b(i)).abs())
            .fold(0f64, f64::max)
    };
    let gpu_cpu = dist(&gpu, &|i| cpu[i] as f64);
    let cpu_exact = dist(&cpu, &|i| exact[i]);
    eprintln!("GPU - CPU {gpu_cpu:.2e}, CPU - exact {cpu_exact:.2e}");
    assert!(
        gpu_cpu <= 2e-5 && gpu_cpu * 5.0 <= cpu_exact,
        "GPU - CPU {gpu_cpu}, CPU - exact {cpu_exact}"
    );
}

/// On an adapter that ends an invocation's loops after 65535 iterations (lavapipe, a CPU-type
/// adapter), a kernel that would loop longer is a compile error naming the op and node, not a
/// silently wrong result; shorter ones run.
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
    let softmax = |n: usize| {
        let mut g = Graph::new("long_softmax");
        let x = g.try_input("x", Shape::new(&[1, n], DType::F32)).unwrap();
        let y = g.try_softmax(x, 1).unwrap();
        g.set_outputs(vec![y]);
        Session::new(Device::Gpu).try_compile(g)
    };
    let mut short = softmax(1000).expect("a short softmax compiles");
    let x: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
    let y = short.run(&[("x", &x)]);
    assert!((y[0].iter().sum::<f32>() - 1.0).abs() < 1e-4);
    let long = softmax(70_000);
    if format!("{:?}", info.device_type) == "Cpu" {
        let err = long
            .err()
            .expect("70000-long softmax refused on a loop-limited adapter");
        assert_mentions(&err.to_string(), &["softmax", "%1", "65535"]);
    } else {
        long.expect("a real GPU has no such limit");
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
