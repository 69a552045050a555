//! Rules of the key/value-cache ops used for autoregressive decoding: CacheWrite,
//! CachedAttention and PagedAttention. Positions, slots and block tables are runtime `I32`
//! operands, so one compiled graph serves every decoding step.

use super::{require_float, same_dtype, static_dims};
use crate::{DType, Error, Result, Shape};

fn check_pos(op: &str, pos: &Shape) -> Result<()> {
    if pos.dtype() != DType::I32 || pos.static_dims().as_deref() != Some(&[1][..]) {
        return Err(Error::op(
            op,
            format!("position must be I32 [1], got {pos}"),
        ));
    }
    Ok(())
}

/// `cache [T, ...]` with rows `[pos, pos + S)` (or rows `slots[i]`) replaced by
/// `update [S, ...]` (converted to the cache's float type, so an f16 cache can hold f32
/// activations).
pub(super) fn cache_write(ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "cache_write";
    let (cache, upd, at) = (ins[0], ins[1], ins[2]);
    require_float(OP, cache)?;
    require_float(OP, upd)?;
    let (cd, ud) = (
        static_dims(OP, "cache", cache)?,
        static_dims(OP, "update", upd)?,
    );
    if cd.is_empty() || cd.len() != ud.len() || cd[1..] != ud[1..] || ud[0] > cd[0] {
        return Err(Error::op(OP, format!("update {upd} must be [S, ...] with S <= T and the same trailing dims as cache {cache}")));
    }
    let slots = at.dtype() == DType::I32 && at.static_dims().as_deref() == Some(&ud[..1]);
    if !slots {
        check_pos(OP, at).map_err(|_| {
            Error::op(
                OP,
                format!(
                    "the third operand must be the position I32 [1] or one slot per update row I32 [{}], got {at}",
                    ud[0]
                ),
            )
        })?;
    }
    Ok(cache.clone())
}

/// `q [S, Hq, D]` over a paged cache `k [R, Hkv, D]`, `v [R, Hkv, Dv]` with positions
/// `pos I32 [S]` and block tables `table I32 [S, M]`.
pub(super) fn paged_attention(
    window: Option<usize>,
    block: usize,
    ins: &[&Shape],
) -> Result<Shape> {
    const OP: &str = "paged_attention";
    let (q, k, v, pos, table) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
    let out = cached_attention(window, &[q, k, v, &Shape::new(&[1], DType::I32)])
        .map_err(|e| Error::op(OP, e.to_string()))?;
    let (qd, kd) = (static_dims(OP, "q", q)?, static_dims(OP, "k", k)?);
    if block == 0 || kd[0] % block != 0 {
        return Err(Error::op(
            OP,
            format!("the cache {k} must hold whole blocks of {block} rows"),
        ));
    }
    let s = qd[0];
    let ok_pos = pos.dtype() == DType::I32 && pos.static_dims().as_deref() == Some(&[s][..]);
    let td = table.static_dims();
    let ok_table = table.dtype() == DType::I32
        && td
            .as_ref()
            .is_some_and(|d| d.len() == 2 && d[0] == s && d[1] > 0);
    if !ok_pos || !ok_table {
        return Err(Error::op(
            OP,
            format!("expected pos I32 [{s}] and table I32 [{s}, M] (one block-table row per query), got pos {pos}, table {table}"),
        ));
    }
    Ok(out)
}

/// `q [S, Hq, D]` attending over `k [T, Hkv, D]`, `v [T, Hkv, Dv]` (the cache may be stored in
/// another float type than `q`; the result has `q`'s): query `i` sits at position
/// `pos + i` and sees keys `j <= pos + i` (and `j > pos + i - window` with a window).
pub(super) fn cached_attention(window: Option<usize>, ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "cached_attention";
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    require_float(OP, q)?;
    require_float(OP, k)?;
    same_dtype(OP, k, v)?;
    check_pos(OP, ins[3])?;
    if window == Some(0) {
        return Err(Error::op(
            OP,
            "a sliding window must hold at least one position",
        ));
    }
    let (qd, kd, vd) = (
        static_dims(OP, "q", q)?,
        static_dims(OP, "k", k)?,
        static_dims(OP, "v", v)?,
    );
    let ok = qd.len() == 3
        && kd.len() == 3
        && vd.len() == 3
        && qd[2] == kd[2]
        && kd[..2] == vd[..2]
        && kd[1] > 0
        && qd[1] % kd[1] == 0
        && qd[0] <= kd[0];
    if !ok {
        return Err(Error::op(
            OP,
            format!("expected q [S, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] with Hq a multiple of Hkv and S <= T; got q {q}, k {k}, v {v}"),
        ));
    }
    Ok(Shape::new(&[qd[0], qd[1], vd[2]], q.dtype()))
}

// ---------------------------------------------------------------- reference evaluation

use crate::eval::{strides, Tensor};

/// Reference CacheWrite (rows outside the cache are dropped; a negative position counts as 0).
pub(super) fn eval_cache_write(ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
    let (cache, upd) = (ins[0], ins[1]);
    let at = ins[2].i64s();
    let row = strides(cache.dims()).first().copied().unwrap_or(1);
    let mut v = cache.f64s();
    let u = upd.f64s();
    for r in 0..upd.dims()[0] {
        // The position form writes from `pos`; the slot form (and S = 1) row by row.
        let dst = if at.len() == 1 {
            at[0].max(0) + r as i64
        } else {
            at[r]
        };
        if (0..cache.dims()[0] as i64).contains(&dst) {
            let d = dst as usize;
            v[d * row..(d + 1) * row].copy_from_slice(&u[r * row..(r + 1) * row]);
        }
    }
    Ok(Tensor::from_f64(cache.dims(), out.dtype(), v))
}

/// Reference CachedAttention in f64: query `i` at position `pos + i` over keys `j <= pos + i`
/// (clamped to the cache) and inside the window, if any.
pub(super) fn eval_cached_attention(
    ins: &[&Tensor],
    out: &Shape,
    scale: f32,
    window: Option<usize>,
) -> Result<Tensor> {
    let pos = ins[3].i64s()[0].max(0) as usize;
    let t = ins[1].dims()[0];
    attend(ins, out, scale, |i| {
        let last = (pos + i).min(t - 1);
        let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
        (first..=last).collect()
    })
}

/// Reference PagedAttention in f64: query `i` over the cache rows of its sequence's positions
/// `j <= pos[i]` (inside the window), found through its block-table row.
pub(super) fn eval_paged_attention(
    ins: &[&Tensor],
    out: &Shape,
    scale: f32,
    window: Option<usize>,
    block: usize,
) -> Result<Tensor> {
    let (pos, table) = (ins[3].i64s(), ins[4].i64s());
    let (blocks, m) = ((ins[1].dims()[0] / block) as i64, ins[4].dims()[1]);
    attend(ins, out, scale, |i| {
        if pos[i] < 0 {
            return Vec::new();
        }
        let last = (pos[i] as usize).min(m * block - 1);
        let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
        (first..=last)
            .filter_map(|j| {
                let b = table[i * m + j / block];
                (0..blocks)
                    .contains(&b)
                    .then(|| b as usize * block + j % block)
            })
            .collect()
    })
}

/// Attention in f64 of every query row `i` of `q [S, Hq, D]` over the cache rows `rows(i)` of
/// `k`, `v` (heads grouped); a query with no rows gives zeros.
fn attend(
    ins: &[&Tensor],
    out: &Shape,
    scale: f32,
    rows: impl Fn(usize) -> Vec<usize>,
) -> Result<Tensor> {
    let (q, k, v) = (ins[0].f64s(), ins[1].f64s(), ins[2].f64s());
    let (qd, kd, vd) = (ins[0].dims(), ins[1].dims(), ins[2].dims());
    let (s, hq, d, hkv, dv) = (qd[0], qd[1], qd[2], kd[1], vd[2]);
    let group = hq / hkv;
    let mut o = vec![0.0; s * hq * dv];
    for i in 0..s {
        let rows = rows(i);
        if rows.is_empty() {
            continue;
        }
        for h in 0..hq {
            let kh = h / group;
            let qv = &q[(i * hq + h) * d..(i * hq + h + 1) * d];
            let scores: Vec<f64> = rows
                .iter()
                .map(|&j| {
                    scale as f64
                        * (0..d)
                            .map(|c| qv[c] * k[(j * hkv + kh) * d + c])
                            .sum::<f64>()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..dv {
                o[(i * hq + h) * dv + c] = rows
                    .iter()
                    .zip(&e)
                    .map(|(&j, w)| w * v[(j * hkv + kh) * dv + c])
                    .sum::<f64>()
                    / z;
            }
        }
    }
    Ok(Tensor::from_f64(&[s, hq, dv], out.dtype(), o))
}

/// Cost of CacheWrite (copies the update's rows; the cache is updated in place) and
/// CachedAttention / PagedAttention (scores against every cache row at worst).
pub(super) fn cost(op: &crate::Op, ins: &[&Shape], out: &Shape) -> super::Cost {
    match op {
        crate::Op::CacheWrite => super::Cost {
            flops: 0,
            bytes: 2 * super::bytes(ins[1]),
        },
        _ => {
            let d = |s: &Shape, i: usize| {
                s.dims().get(i).and_then(|d| d.as_static()).unwrap_or(0) as u64
            };
            let (s, hq, dk, t, dv) = (
                d(ins[0], 0),
                d(ins[0], 1),
                d(ins[0], 2),
                d(ins[1], 0),
                d(ins[2], 2),
            );
            super::Cost::streaming(ins, out, 0).with_flops(s * hq * t * (2 * dk + 2 * dv + 5))
        }
    }
}

/// Text-form attributes of cached_attention (cache_write has none).
pub fn attrs(scale: f32, window: Option<usize>) -> Vec<(&'static str, crate::text::Attr)> {
    vec![("scale", scale.into()), ("window", window.into())]
}

/// Text-form attributes of paged_attention.
pub fn paged_attrs(
    scale: f32,
    window: Option<usize>,
    block: usize,
) -> Vec<(&'static str, crate::text::Attr)> {
    let mut a = attrs(scale, window);
    a.push(("block", block.into()));
    a
}

/// A cached_attention or paged_attention from its text-form attributes.
pub fn from_attrs(kind: crate::OpKind, a: &mut crate::text::Attrs) -> Result<crate::Op> {
    let (scale, window) = (a.f32("scale")?, a.opt_usize("window")?);
    Ok(match kind {
        crate::OpKind::PagedAttention => crate::Op::PagedAttention {
            scale,
            window,
            block: a.usize("block")?,
        },
        crate::OpKind::CachedAttention => crate::Op::CachedAttention { scale, window },
        other => return Err(Error::op(other.name(), "is not a cached attention op")),
    })
}
