//! Rules of the quantized ops: DequantMatMul and DequantizeRows.
//!
//! GGUF schemes have no decomposition into primitive ops (their bit layouts need a native
//! decoder, which the CPU backend has). The other schemes decompose into casts, lookups and a
//! plain matmul, so every backend can run them.

use super::{require_float, static_dims};
use crate::text::{Attr, Attrs};
use crate::{DType, Error, Graph, NodeId, QuantScheme, Result, Shape};

fn gguf_rows(op: &str, scheme: QuantScheme, w: &Shape) -> Result<(usize, usize)> {
    let wd = static_dims(op, "packed weight", w)?;
    if w.dtype() != DType::U8 || wd.len() != 2 {
        return Err(Error::op(
            op,
            format!("{scheme:?} weights must be U8 [N, row_bytes], got {w}"),
        ));
    }
    let k = scheme.row_elems(wd[1]).ok_or_else(|| {
        let (_, bb) = scheme.gguf_block().unwrap_or((1, 1));
        Error::op(op, format!("packed rows of {} bytes are not whole {scheme:?} blocks of {bb} bytes (weight {w})", wd[1]))
    })?;
    Ok((wd[0], k))
}

/// `x [..., K] @ dequant(w)^T -> [..., N]`; `w` holds N rows of K weights.
pub(super) fn dequant_matmul(scheme: QuantScheme, ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "dequant_matmul";
    let x = ins[0];
    require_float(OP, x)?;
    let xd = static_dims(OP, "x", x)?;
    let Some(&kx) = xd.last() else {
        return Err(Error::op(OP, format!("x must have rank >= 1, got {x}")));
    };
    let n = if scheme.is_gguf() {
        let (n, k) = gguf_rows(OP, scheme, ins[1])?;
        if k != kx {
            return Err(Error::op(
                OP,
                format!(
                    "x {x} has K={kx} but the {scheme:?} weight rows hold {k} elements ({})",
                    ins[1]
                ),
            ));
        }
        n
    } else {
        legacy_shapes(scheme, kx, &ins[1..])?
    };
    let mut out = xd;
    *out.last_mut().expect("rank >= 1") = n;
    Ok(Shape::new(&out, x.dtype()))
}

/// Check the `(w_q, scale, zp)` operands of a non-GGUF scheme for `K = k`; returns N.
fn legacy_shapes(scheme: QuantScheme, k: usize, ins: &[&Shape]) -> Result<usize> {
    const OP: &str = "dequant_matmul";
    let (wq, scale, zp) = (ins[0], ins[1], ins[2]);
    let wd = static_dims(OP, "quantized weight", wq)?;
    let (want_dt, packed) = match scheme {
        QuantScheme::Int8Block { .. } | QuantScheme::Int8BlockAsym { .. } => (DType::I8, 1),
        QuantScheme::Int4Block { .. } => (DType::U8, 2),
        _ => (DType::U8, 1),
    };
    if wq.dtype() != want_dt || wd.len() != 2 || wd[1] * packed != k {
        return Err(Error::op(
            OP,
            format!(
                "{scheme:?} weight must be {want_dt} [N, {}] for K={k}, got {wq}",
                k / packed
            ),
        ));
    }
    let n = wd[0];
    let groups = match scheme.block_size() {
        Some(0) => return Err(Error::op(OP, "block_size must be positive")),
        Some(bs) if !k.is_multiple_of(bs) => {
            return Err(Error::op(
                OP,
                format!("K={k} is not a multiple of block_size {bs}"),
            ))
        }
        Some(bs) => vec![n, k / bs],
        None => vec![1],
    };
    for (what, s) in [("scale", scale), ("zero point", zp)] {
        if s.dtype() != DType::F32 || s.static_dims().as_deref() != Some(&groups[..]) {
            return Err(Error::op(
                OP,
                format!("{what} must be f32 {groups:?} for {scheme:?}, got {s}"),
            ));
        }
    }
    Ok(n)
}

/// `dequant(w) -> F32 [..., K]` for packed GGUF rows `U8 [..., row_bytes]`.
pub(super) fn dequantize(scheme: QuantScheme, ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "dequantize_rows";
    let w = ins[0];
    if !scheme.is_gguf() {
        return Err(Error::op(
            OP,
            format!("takes GGUF schemes; {scheme:?} weights dequantize inside dequant_matmul"),
        ));
    }
    let mut d = static_dims(OP, "packed rows", w)?;
    let Some(last) = d.last_mut() else {
        return Err(Error::op(
            OP,
            format!("packed rows must have rank >= 1, got {w}"),
        ));
    };
    if w.dtype() != DType::U8 {
        return Err(Error::op(OP, format!("packed rows must be U8, got {w}")));
    }
    *last = scheme.row_elems(*last).ok_or_else(|| {
        Error::op(
            OP,
            format!(
                "rows of {} bytes are not whole {scheme:?} blocks ({w})",
                *last
            ),
        )
    })?;
    Ok(Shape::new(&d, DType::F32))
}

/// Operand count of DequantMatMul: 2 for GGUF schemes, 4 otherwise.
pub(super) fn arity(scheme: QuantScheme) -> usize {
    if scheme.is_gguf() {
        2
    } else {
        4
    }
}

/// The f32 value of every FP8 byte (E4M3 finite-only or E5M2).
fn fp8_table(e5m2: bool) -> Vec<f32> {
    (0u16..256)
        .map(|b| {
            let (ebits, mbits, bias) = if e5m2 { (5, 2, 15) } else { (4, 3, 7) };
            let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
            let e = ((b >> mbits) & ((1 << ebits) - 1)) as i32;
            let m = (b & ((1 << mbits) - 1)) as f32;
            let frac = m / (1 << mbits) as f32;
            let emax = (1 << ebits) - 1;
            if e5m2 && e == emax {
                return if m == 0.0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                };
            }
            if !e5m2 && e == emax && m as u16 == 7 {
                return f32::NAN;
            }
            if e == 0 {
                sign * frac * 2f32.powi(1 - bias)
            } else {
                sign * (1.0 + frac) * 2f32.powi(e - bias)
            }
        })
        .collect()
}

/// Non-GGUF schemes as primitive ops: decode the quants (a cast, or a 256-entry lookup for
/// packed nibbles and FP8), apply `(q - zp) * scale` per block, then `x @ w^T`.
pub(super) fn decompose(
    g: &mut Graph,
    scheme: QuantScheme,
    ins: &[NodeId],
) -> Option<Result<NodeId>> {
    if scheme.is_gguf() {
        return None;
    }
    Some((|| {
        let (x, wq, scale, zp) = (ins[0], ins[1], ins[2], ins[3]);
        let wd = g.shape(wq).static_dims().unwrap_or_default();
        let n = wd[0];
        let lut = |g: &mut Graph, table: Vec<f32>| -> Result<NodeId> {
            let bytes = table.iter().flat_map(|v| v.to_le_bytes()).collect();
            g.try_constant_bytes(Shape::new(&[256], DType::F32), bytes)
        };
        let q = match scheme {
            QuantScheme::Int8Block { .. } | QuantScheme::Int8BlockAsym { .. } => {
                g.try_cast(wq, DType::F32)?
            }
            QuantScheme::Int4Block { .. } => {
                let idx = g.try_cast(wq, DType::I32)?;
                let lo = lut(g, (0..256).map(|b| (b & 15) as f32).collect())?;
                let hi = lut(g, (0..256).map(|b| (b >> 4) as f32).collect())?;
                let (lo, hi) = (g.try_gather(lo, idx, 0)?, g.try_gather(hi, idx, 0)?);
                let (lo, hi) = (
                    g.try_reshape(lo, &[n, wd[1], 1])?,
                    g.try_reshape(hi, &[n, wd[1], 1])?,
                );
                let both = g.try_concat(&[lo, hi], 2)?;
                g.try_reshape(both, &[n, wd[1] * 2])?
            }
            QuantScheme::Fp8E4m3 | QuantScheme::Fp8E5m2 => {
                let idx = g.try_cast(wq, DType::I32)?;
                let t = lut(g, fp8_table(scheme == QuantScheme::Fp8E5m2))?;
                g.try_gather(t, idx, 0)?
            }
            gguf => {
                return Err(Error::op(
                    "dequant_matmul",
                    format!("{gguf:?} rows need a native decoder; they have no decomposition"),
                ))
            }
        };
        let k = g.shape(q).static_dims().unwrap_or_default()[1];
        let w = match scheme.block_size() {
            Some(bs) => {
                let q = g.try_reshape(q, &[n, k / bs, bs])?;
                let zp = g.try_reshape(zp, &[n, k / bs, 1])?;
                let scale = g.try_reshape(scale, &[n, k / bs, 1])?;
                let centred = if matches!(scheme, QuantScheme::Int8Block { .. }) {
                    q
                } else {
                    g.try_sub(q, zp)?
                };
                let w = g.try_mul(centred, scale)?;
                g.try_reshape(w, &[n, k])?
            }
            None => g.try_mul(q, scale)?,
        };
        let w = g.try_cast(w, g.shape(x).dtype())?;
        let wt = g.try_transpose(w, &[1, 0])?;
        g.try_dot(x, wt)
    })())
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::Tensor;

/// Packed GGUF rows decoded with the portable reference decoder (bit-exact to the `gguf`
/// Python package), as f64.
fn decode_rows(scheme: QuantScheme, packed: &Tensor) -> Result<Vec<f64>> {
    let ty = scheme.ggml_type().ok_or_else(|| {
        Error::op(
            "dequantize_rows",
            format!("{scheme:?} is not a GGUF scheme"),
        )
    })?;
    let bytes = packed.to_bytes();
    let (be, bb) = scheme.gguf_block().unwrap_or((1, 1));
    let mut out = vec![0f32; bytes.len() / bb * be];
    rlx_gguf::dequantize_portable(ty, &bytes, &mut out)
        .map_err(|e| Error::op("dequantize_rows", e.to_string()))?;
    Ok(out.into_iter().map(f64::from).collect())
}

/// Reference DequantizeRows: the decoded rows.
pub(super) fn eval_dequantize(scheme: QuantScheme, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let od = static_dims("dequantize_rows", "result", out)?;
    Ok(Tensor::from_f64(
        &od,
        out.dtype(),
        decode_rows(scheme, ins[0])?,
    ))
}

/// Reference DequantMatMul of a GGUF scheme: `x @ decode(w)^T` summed in f64. Other schemes
/// are evaluated through their decomposition.
pub(super) fn eval_dequant_matmul(
    scheme: QuantScheme,
    ins: &[&Tensor],
    out: &Shape,
) -> Result<Tensor> {
    let od = static_dims("dequant_matmul", "result", out)?;
    let w = decode_rows(scheme, ins[1])?;
    let x = ins[0].f64s();
    let k = *ins[0].dims().last().unwrap_or(&1);
    let n = *od.last().unwrap_or(&1);
    let rows = x
        .len()
        .checked_div(k)
        .unwrap_or_else(|| od.iter().product::<usize>() / n.max(1));
    let mut o = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for j in 0..n {
            o.push((0..k).map(|p| x[r * k + p] * w[j * k + p]).sum());
        }
    }
    Ok(Tensor::from_f64(&od, out.dtype(), o))
}

/// Cost of the quantized ops: a multiply-add per weight and activation row (DequantMatMul,
/// reading the packed bytes once), or a few operations per decoded element (DequantizeRows).
pub(super) fn cost(op: &crate::Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    let base = super::Cost::streaming(ins, out, 0);
    match op {
        crate::Op::DequantMatMul { .. } => {
            let k = ins[0]
                .dims()
                .last()
                .and_then(|d| d.as_static())
                .unwrap_or(0) as u64;
            base.with_flops(2 * super::numel(out) * k)
        }
        _ => base.with_flops(2 * super::numel(out)),
    }
}

/// A scheme's text-form name: `q4_k`, `f16`, `int8_block(32)`, `fp8_e4m3`.
pub fn scheme_attr(s: QuantScheme) -> Attr {
    use QuantScheme::*;
    let tagged = |w: &str, n: usize| Attr::Tagged(w.to_string(), Box::new(n.into()));
    match s {
        Int8Block { block_size } => tagged("int8_block", block_size),
        Int8BlockAsym { block_size } => tagged("int8_block_asym", block_size),
        Int4Block { block_size } => tagged("int4_block", block_size),
        Fp8E4m3 => Attr::word("fp8_e4m3"),
        Fp8E5m2 => Attr::word("fp8_e5m2"),
        gguf => Attr::Word(
            gguf.ggml_type()
                .map_or_else(|| "?".to_string(), |t| t.to_string().to_lowercase()),
        ),
    }
}

/// The `scheme` attribute of a dequant_matmul or dequantize_rows.
pub fn scheme_from_attrs(op: &'static str, a: &mut Attrs) -> Result<QuantScheme> {
    let bad = || {
        Error::op(op, "attribute `scheme` must be a GGUF type (q4_0, q4_k, f16, ...), int8_block(n), int8_block_asym(n), int4_block(n), fp8_e4m3 or fp8_e5m2")
    };
    Ok(match a.take("scheme")? {
        Attr::Word(w) if w == "fp8_e4m3" => QuantScheme::Fp8E4m3,
        Attr::Word(w) if w == "fp8_e5m2" => QuantScheme::Fp8E5m2,
        w @ Attr::Word(_) => QuantScheme::GGUF
            .into_iter()
            .find(|&s| scheme_attr(s) == w)
            .ok_or_else(bad)?,
        Attr::Tagged(w, n) => {
            let Attr::Int(n) = *n else { return Err(bad()) };
            let block_size = n as usize;
            match w.as_str() {
                "int8_block" => QuantScheme::Int8Block { block_size },
                "int8_block_asym" => QuantScheme::Int8BlockAsym { block_size },
                "int4_block" => QuantScheme::Int4Block { block_size },
                _ => return Err(bad()),
            }
        }
        _ => return Err(bad()),
    })
}

// Batching.

/// Whether the batching rule covers the operands flagged `batched`: quantized products only
/// with weights shared by the batch.
pub(super) fn batchable(op: &crate::Op, batched: &[bool]) -> bool {
    !matches!(op, crate::Op::DequantMatMul { .. }) || !batched[1..].iter().any(|&b| b)
}

/// Batching rule: the product maps over x's leading axes, so the batch goes in front of them;
/// packed rows keep their bytes last, so the batch goes in front of the rows.
pub(super) fn batch(
    g: &mut Graph,
    op: &crate::Op,
    b: &super::batch::Batched,
) -> Result<(NodeId, Option<usize>)> {
    let mut args = vec![b.front(g, 0)?];
    args.extend_from_slice(&b.ins[1..]);
    Ok((g.try_op(op.clone(), &args)?, Some(0)))
}
