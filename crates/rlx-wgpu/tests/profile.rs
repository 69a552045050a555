//! `RLX_PROFILE` on the GPU: every dispatch of a program is listed with its op, node and
//! workgroups and the runs it took part in, timed by timestamp queries where the adapter has
//! them. One test in its own binary: the variable must be set before the device is opened.

use rlx_driver::{Backend, CompileOptions, Device};
use rlx_ir::{Activation, DType, Graph, Shape};
use rlx_wgpu::{GpuProgram, WgpuBackend};

#[test]
fn gpu_profile_lists_every_dispatch_with_its_runs() {
    std::env::set_var(rlx_ir::env::PROFILE.name, "1");
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let mut g = Graph::new("profiled");
    let x = g.input("x", Shape::new(&[64, 64], DType::F32));
    let w = g.param("w", Shape::new(&[64, 64], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[64, 64], DType::F32));
    let t = g.activation(Activation::Tanh, y);
    let s = g.reduce(rlx_ir::ReduceKind::Sum, t, &[1], false);
    g.set_outputs(vec![s]);
    let mut exe = WgpuBackend {
        device: Device::Gpu,
    }
    .compile(&g, &CompileOptions::default())
    .unwrap();
    let ones: Vec<u8> = (0..64 * 64).flat_map(|_| 0.01f32.to_le_bytes()).collect();
    exe.write_param(0, &ones).unwrap();
    for _ in 0..3 {
        exe.write_input(0, &ones).unwrap();
        exe.execute().unwrap();
        let mut out = vec![0u8; 64 * 4];
        exe.read_output(0, &mut out).unwrap();
    }
    let program = exe
        .as_any()
        .and_then(|a| a.downcast_ref::<GpuProgram>())
        .unwrap();
    let profile = program.profile();
    assert_eq!(profile.len(), program.steps(), "one entry per dispatch");
    assert!(profile.iter().all(|s| s.runs == 3), "{profile:?}");
    let ops: Vec<&str> = profile.iter().map(|s| s.op).collect();
    assert!(ops.contains(&"matmul"), "{ops:?}");
    assert!(profile
        .iter()
        .all(|s| s.groups.0 * s.groups.1 * s.groups.2 > 0));
    let timed = program.gpu().timestamps;
    println!(
        "adapter {}: timestamp queries {}, subgroups {}",
        program.gpu().info.name,
        if timed { "yes" } else { "no" },
        if program.gpu().subgroups { "yes" } else { "no" }
    );
    if timed {
        let total: u64 = profile.iter().map(|s| s.ns.expect("timed")).sum();
        assert!(total > 0, "{profile:?}");
    } else {
        assert!(profile.iter().all(|s| s.ns.is_none()));
    }
}
