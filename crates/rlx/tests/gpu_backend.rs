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

    // What runs where on the GPU: a dot_general decomposed, an elementwise region, a softmax.
    let g = Graph::parse(
        r#"graph "gpu_dispatch" {
  %x = input {name = "x"} : f32[4, 8]
  %w = param {name = "w"} : f32[8, 8]
  %d = dot_general %x, %w {lhs_contract = [1], rhs_contract = [0], lhs_batch = [], rhs_batch = []} : f32[4, 8]
  %a = silu %d : f32[4, 8]
  %m = mul %a, %x : f32[4, 8]
  %s = softmax %m {axis = 1} : f32[4, 8]
  return %s
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
