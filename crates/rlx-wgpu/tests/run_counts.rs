//! A run of a compiled graph costs the device one submission and no buffer or bind group; each
//! output read is one wait and no submission (the run already copied it to its staging buffer).
//! One test in its own binary: the counts are the device's, shared by a process's programs.

use rlx_driver::{Backend, CompileOptions, Device};
use rlx_ir::{Activation, DType, Graph, Shape};
use rlx_wgpu::{Counts, GpuProgram, WgpuBackend};

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn gpu_a_run_is_one_submission_and_allocates_nothing() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let mut g = Graph::new("two_outputs");
    let x = g.input("x", Shape::new(&[2, 3], DType::F32));
    let w = g.param("w", Shape::new(&[3, 4], DType::F32));
    let y = g.matmul(x, w, Shape::new(&[2, 4], DType::F32));
    let r = g.activation(Activation::Relu, y);
    let s = g.reduce(rlx_ir::ReduceKind::Sum, r, &[1], false);
    g.set_outputs(vec![r, s]);
    let backend = WgpuBackend {
        device: Device::Gpu,
    };
    let mut exe = backend.compile(&g, &CompileOptions::default()).unwrap();
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    exe.write_param(0, &bytes(&w)).unwrap();
    let gpu = exe
        .as_any()
        .and_then(|a| a.downcast_ref::<GpuProgram>())
        .unwrap()
        .gpu()
        .clone();
    let mut run = |x: &[f32]| {
        exe.write_input(0, &bytes(x)).unwrap();
        exe.execute().unwrap();
        let (mut a, mut b) = (vec![0u8; 32], vec![0u8; 8]);
        exe.read_output(0, &mut a).unwrap();
        exe.read_output(1, &mut b).unwrap();
        (floats(&a), floats(&b))
    };
    run(&[1.0; 6]);
    for step in 0..3 {
        let x: Vec<f32> = (0..6).map(|i| (i + step) as f32 - 2.0).collect();
        let before = gpu.counts();
        let (relu, sums) = run(&x);
        let cost = gpu.counts() - before;
        assert_eq!(
            cost,
            Counts {
                submissions: 1,
                buffers: 0,
                bind_groups: 0,
                waits: 2,
            },
            "run {step}"
        );
        // The values each run reads are its own.
        for i in 0..2 {
            let mut want_sum = 0.0;
            for j in 0..4 {
                let v: f32 = (0..3).map(|k| x[i * 3 + k] * w[k * 4 + j]).sum();
                assert_eq!(relu[i * 4 + j], v.max(0.0), "run {step} [{i}, {j}]");
                want_sum += v.max(0.0);
            }
            assert!((sums[i] - want_sum).abs() < 1e-5, "run {step} sum {i}");
        }
    }
}
