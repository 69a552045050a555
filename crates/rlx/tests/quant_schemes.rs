//! The non-GGUF quantization schemes of `DequantMatMul` (Int8Block, Int8BlockAsym, Int4Block,
//! Fp8E4m3, Fp8E5m2) run through their decomposition into plain ops; results equal a direct
//! dequantize-then-multiply reference written here.

use rlx::prelude::*;
use rlx::quant::QuantScheme;

fn fp8_value(b: u8, e5m2: bool) -> f32 {
    let (mbits, bias) = if e5m2 { (2, 15) } else { (3, 7) };
    let ebits = 7 - mbits;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> mbits) & ((1 << ebits) - 1)) as i32;
    let m = (b & ((1 << mbits) - 1)) as f32 / (1 << mbits) as f32;
    if e == 0 {
        sign * m * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + m) * 2f32.powi(e - bias)
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    scheme: QuantScheme,
    wq: (&[u8], DType, Vec<usize>),
    scale: &[f32],
    zp: &[f32],
    groups: Vec<usize>,
    w_ref: &[f32],
    k: usize,
    n: usize,
) {
    let m = 3;
    let mut g = Graph::new("q");
    let x = g.input("x", Shape::new(&[m, k], DType::F32));
    let q = g.param("q", Shape::new(&wq.2, wq.1));
    let s = g.param("s", Shape::new(&groups, DType::F32));
    let z = g.param("z", Shape::new(&groups, DType::F32));
    let y = g.op(Op::DequantMatMul { scheme }, &[x, q, s, z]);
    g.set_outputs(vec![y]);
    let mut c = Session::new(Device::Cpu).compile(g);
    c.set_param_typed("q", wq.0, wq.1);
    c.set_param("s", scale);
    c.set_param("z", zp);
    let xs: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
        .collect();
    let out = c.run(&[("x", &xs)]).remove(0);
    for r in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|i| xs[r * k + i] * w_ref[j * k + i]).sum();
            let got = out[r * n + j];
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{scheme:?} [{r},{j}]: {got} vs {want}"
            );
        }
    }
}

#[test]
fn int8_int4_and_fp8_schemes_match_a_direct_reference() {
    let (n, k, bs) = (4, 8, 4);
    let groups = vec![n, k / bs];
    let scale: Vec<f32> = (0..n * k / bs).map(|i| 0.1 + i as f32 * 0.05).collect();
    let zp: Vec<f32> = (0..n * k / bs).map(|i| (i % 3) as f32).collect();
    let q8: Vec<i8> = (0..n * k)
        .map(|i| (i as i32 * 37 % 255 - 127) as i8)
        .collect();
    let q8b: Vec<u8> = q8.iter().map(|&v| v as u8).collect();
    for asym in [false, true] {
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let gi = (i / k) * (k / bs) + (i % k) / bs;
                (q8[i] as f32 - if asym { zp[gi] } else { 0.0 }) * scale[gi]
            })
            .collect();
        let scheme = if asym {
            QuantScheme::Int8BlockAsym { block_size: bs }
        } else {
            QuantScheme::Int8Block { block_size: bs }
        };
        run(
            scheme,
            (&q8b, DType::I8, vec![n, k]),
            &scale,
            &zp,
            groups.clone(),
            &w,
            k,
            n,
        );
    }
    let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 29 % 256) as u8).collect();
    let w4: Vec<f32> = (0..n * k)
        .map(|i| {
            let byte = packed[i / 2];
            let q = if i % 2 == 0 { byte & 15 } else { byte >> 4 } as f32;
            let gi = (i / k) * (k / bs) + (i % k) / bs;
            (q - zp[gi]) * scale[gi]
        })
        .collect();
    run(
        QuantScheme::Int4Block { block_size: bs },
        (&packed, DType::U8, vec![n, k / 2]),
        &scale,
        &zp,
        groups,
        &w4,
        k,
        n,
    );
    // FP8: finite bytes only (no NaN / inf encodings), one scale per tensor.
    let bytes: Vec<u8> = (0..n * k)
        .map(|i| (i * 13 % 120) as u8 | if i % 2 == 1 { 0x80 } else { 0 })
        .collect();
    for e5m2 in [false, true] {
        let w: Vec<f32> = bytes.iter().map(|&b| fp8_value(b, e5m2) * 0.5).collect();
        let scheme = if e5m2 {
            QuantScheme::Fp8E5m2
        } else {
            QuantScheme::Fp8E4m3
        };
        run(
            scheme,
            (&bytes, DType::U8, vec![n, k]),
            &[0.5],
            &[0.0],
            vec![1],
            &w,
            k,
            n,
        );
    }
}
