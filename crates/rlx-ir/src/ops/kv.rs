//! Rules of the key/value-cache ops used for autoregressive decoding: CacheWrite and
//! CachedAttention. Both take the write position as a runtime `I32 [1]` operand, so one compiled
//! graph serves every decoding step.

use super::{require_float, same_dtype, static_dims};
use crate::{DType, Error, Result, Shape};

fn check_pos(op: &str, pos: &Shape) -> Result<()> {
    if pos.dtype() != DType::I32 || pos.static_dims().as_deref() != Some(&[1][..]) {
        return Err(Error::op(op, format!("position must be I32 [1], got {pos}")));
    }
    Ok(())
}

/// `cache [T, ...]` with rows `[pos, pos + S)` replaced by `update [S, ...]` (converted to the
/// cache's float type, so an f16 cache can hold f32 activations).
pub(super) fn cache_write(ins: &[&Shape]) -> Result<Shape> {
    const OP: &str = "cache_write";
    let (cache, upd) = (ins[0], ins[1]);
    require_float(OP, cache)?;
    require_float(OP, upd)?;
    check_pos(OP, ins[2])?;
    let (cd, ud) = (static_dims(OP, "cache", cache)?, static_dims(OP, "update", upd)?);
    if cd.is_empty() || cd.len() != ud.len() || cd[1..] != ud[1..] || ud[0] > cd[0] {
        return Err(Error::op(OP, format!("update {upd} must be [S, ...] with S <= T and the same trailing dims as cache {cache}")));
    }
    Ok(cache.clone())
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
        return Err(Error::op(OP, "a sliding window must hold at least one position"));
    }
    let (qd, kd, vd) = (static_dims(OP, "q", q)?, static_dims(OP, "k", k)?, static_dims(OP, "v", v)?);
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
