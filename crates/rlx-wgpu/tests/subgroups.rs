//! The few-rows quantized product with its sums added by the workgroup tree alone
//! (`RLX_WGPU_SUBGROUPS=0`), against the reference evaluator; the other test binaries run it
//! with `subgroupAdd` where the adapter has subgroups. One test in its own binary: the variable
//! must be set before the device is opened.

use rlx_driver::{Backend, CompileOptions, Device};
use rlx_ir::eval::{evaluate, Tensor};
use rlx_ir::{DType, Graph, Op, QuantScheme, Shape};
use rlx_wgpu::{Gpu, GpuProgram, WgpuBackend};

#[test]
fn few_row_quantized_products_without_subgroups_match_the_reference_evaluator() {
    std::env::set_var(rlx_ir::env::WGPU_SUBGROUPS.name, "0");
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let (n, k) = (70, 320);
    // f16 weight rows (GGUF F16 blocks are the halves themselves).
    let w: Vec<u8> = (0..n * k)
        .flat_map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0).to_le_bytes())
        .collect();
    for rows in [1, 3, 8] {
        let x: Vec<u8> = (0..rows * k)
            .flat_map(|i| (((i * 13 % 29) as f32 - 14.0) / 8.0).to_le_bytes())
            .collect();
        let mut g = Graph::new("few_rows");
        let xi = g.input("x", Shape::new(&[rows, k], DType::F32));
        let wi = g.param("w", Shape::new(&[n, 2 * k], DType::U8));
        let y = g.op(
            Op::DequantMatMul {
                scheme: QuantScheme::GgufF16,
            },
            &[xi, wi],
        );
        g.set_outputs(vec![y]);
        let mut exe = WgpuBackend {
            device: Device::Gpu,
        }
        .compile(&g, &CompileOptions::default())
        .unwrap();
        let gpu: &Gpu = exe
            .as_any()
            .and_then(|a| a.downcast_ref::<GpuProgram>())
            .unwrap()
            .gpu();
        assert!(!gpu.subgroups, "RLX_WGPU_SUBGROUPS=0 leaves subgroups off");
        exe.write_param(0, &w).unwrap();
        exe.write_input(0, &x).unwrap();
        exe.execute().unwrap();
        let mut got = vec![0u8; rows * n * 4];
        exe.read_output(0, &mut got).unwrap();
        let leaves = [
            ("x", Tensor::from_bytes(g.shape(xi), &x).unwrap()),
            ("w", Tensor::from_bytes(g.shape(wi), &w).unwrap()),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
        let want = evaluate(&g, &leaves).unwrap()[0].f64s();
        let got: Vec<f32> = got
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*a as f64 - b).abs() <= 1e-5 * scale,
                "{rows} rows, result {i}: {a} vs {b}"
            );
        }
    }
}
