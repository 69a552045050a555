//! Quantized products for the op-table tests: graphs of one GGUF product, and the strict
//! check that another backend's product rounds its activations as the CPU's does.

use super::*;

/// `x [rows, k] @ decode(w)^T` for `n` packed GGUF rows `w`, `x` a fixed pattern in ±0.7.
pub(crate) fn quantized_product(
    scheme: rlx::ir::QuantScheme,
    rows: usize,
    k: usize,
    n: usize,
    w: &[u8],
) -> Built {
    quantized_product_of(scheme, &[rows, k], n, w)
}

/// [`quantized_product`] of `x` of dims `xd` (`[B, 1, K]`: B one-row products, each rounding
/// its activations as a one-token step does).
pub(crate) fn quantized_product_of(
    scheme: rlx::ir::QuantScheme,
    xd: &[usize],
    n: usize,
    w: &[u8],
) -> Built {
    let k = *xd.last().expect("x has a last axis");
    let rows: usize = xd.iter().product::<usize>() / k;
    let row_bytes = scheme.row_bytes(k).expect("a GGUF scheme");
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.7)
        .collect();
    let mut g = Graph::new("quantized_product");
    let xi = g.input("x", Shape::new(xd, DType::F32));
    let wi = g.param("w", Shape::new(&[n, row_bytes], DType::U8));
    let y = g.op(Op::DequantMatMul { scheme }, &[xi, wi]);
    g.set_outputs(vec![y]);
    Built {
        g,
        feeds: vec![(
            "x".into(),
            x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F32,
        )],
        params: vec![("w".into(), w.to_vec(), DType::U8)],
    }
}

/// [`quantized_agrees`], or, where neither the CPU's product nor the other's is rounded (float
/// weights, or activations the CPU does not round at this size), both within 2e-6 of the
/// largest result of the exact product: over hundreds of terms two summation orders differ by
/// more than a few ulps.
pub(crate) fn quantized_or_near_exact(
    name: &str,
    cpu: &[f64],
    other: &[f64],
    want: &[f64],
    what: &str,
) -> Result<(), String> {
    let off = |a: &[f64]| {
        a.iter()
            .zip(want)
            .map(|(p, q)| (p - q).abs())
            .fold(0f64, f64::max)
    };
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    quantized_agrees(name, cpu, other, want, what).or_else(|e| {
        match off(cpu) <= 2e-6 * scale && off(other) <= 2e-6 * scale {
            true => Ok(()),
            false => Err(e),
        }
    })
}

/// A quantized product on another backend (`what`) against the CPU's (`cpu`) and the exact one
/// (`want`): within 2e-5 of the largest result and a hundredth of the CPU's distance from the
/// exact product, or, where the CPU is that close to it (float weights, no rounded
/// activations), a few f32 ulps of the largest result (another summation order). So the other
/// backend must round activations as the CPU does; the op table's own tolerance (against an
/// exact product with unrounded activations) could not tell.
pub(crate) fn quantized_agrees(
    name: &str,
    cpu: &[f64],
    other: &[f64],
    want: &[f64],
    what: &str,
) -> Result<(), String> {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
    let worst = cpu
        .iter()
        .zip(other)
        .map(|(p, q)| (p - q).abs())
        .fold(0f64, f64::max);
    let exact = cpu
        .iter()
        .zip(want)
        .map(|(p, q)| (p - q).abs())
        .fold(0f64, f64::max);
    eprintln!("{name}: {what} - CPU {worst:.2e}, CPU - exact {exact:.2e} (of {scale:.3})");
    // Q4_1 / Q5_1 leave ~1e-5: the CPU rounds their blocks' activation sums to f16 as well.
    let ulps = 4.0 * f32::EPSILON as f64 * scale;
    if worst <= 2e-5 * scale && (worst <= exact / 100.0 || worst <= ulps) {
        Ok(())
    } else {
        Err(format!(
            "{name}: {what} and CPU differ by {worst} (scale {scale}; the CPU and the exact product by {exact})"
        ))
    }
}

/// For a quantized product case (`dequant_matmul`, and `quant_linear`, which lowers to it):
/// [`quantized_agrees`] of `got` (from `what`) with the CPU's product. The golden's own
/// tolerance (1% of the terms' magnitudes, for activations rounded to 8 bits) is loose enough
/// to pass a backend that rounds differently from the CPU; this is the strict check.
pub(crate) fn quantized_agrees_if_product(
    c: &Value,
    b: &Built,
    got: &[f64],
    what: &str,
) -> Result<(), String> {
    if !matches!(c["op"].as_str(), Some("dequant_matmul" | "quant_linear")) {
        return Ok(());
    }
    let name = c["name"].as_str().unwrap_or("?");
    let cpu = run_on(Device::Cpu, b, true)?;
    let want = run_reference(b)?;
    quantized_agrees(name, &cpu, got, &want, what)
}
