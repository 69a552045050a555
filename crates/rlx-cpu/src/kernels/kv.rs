//! KV-cache ops: CacheWrite updates its param in place; CachedAttention attends over the first
//! `pos + S` cache rows only.
//!
//! With an F16 cache the arithmetic follows llama.cpp's default (non-flash) path: keys and
//! values are stored as f16, queries and attention weights are rounded to f16 before their
//! products, and products accumulate in f32.

use super::{kernel, Kernel, Lowered, NodeInfo, TRef};
use crate::layout::for_each_run;
use crate::pool::Pool;
use half::f16;
use rlx_ir::{DType, Op, Result};

/// Read the `I32 [1]` position operand (negative values count as 0).
///
/// # Safety
/// `pos` must be a live I32 value.
unsafe fn read_pos(pos: &TRef) -> usize {
    (*pos.base::<i32>().add(pos.layout.offset)).max(0) as usize
}

#[inline(always)]
unsafe fn load(p: &TRef, i: usize) -> f32 {
    match p.dtype {
        DType::F16 => (*p.base::<f16>().add(i)).to_f32(),
        DType::BF16 => (*p.base::<half::bf16>().add(i)).to_f32(),
        DType::F64 => *p.base::<f64>().add(i) as f32,
        _ => *p.base::<f32>().add(i),
    }
}

#[inline(always)]
unsafe fn store(p: &TRef, i: usize, v: f32) {
    match p.dtype {
        DType::F16 => *p.base::<f16>().add(i) = f16::from_f32(v),
        DType::BF16 => *p.base::<half::bf16>().add(i) = half::bf16::from_f32(v),
        DType::F64 => *p.base::<f64>().add(i) = v as f64,
        _ => *p.base::<f32>().add(i) = v,
    }
}

/// Round to the precision of `dt` (what storing there and loading back gives).
#[inline(always)]
fn round_to(dt: DType, v: f32) -> f32 {
    match dt {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn cache_write(cache: TRef, upd: TRef, pos: TRef) -> Box<dyn Kernel> {
    kernel(move |_pool: &Pool| {
        let dims = upd.layout.dims().to_vec();
        let t = cache.layout.dims()[0];
        // SAFETY: rows past the cache are dropped, so every write lands inside the param buffer.
        unsafe {
            let p = read_pos(&pos);
            let rows = dims[0].min(t.saturating_sub(p));
            if rows == 0 {
                return;
            }
            let mut d = dims.clone();
            d[0] = rows;
            let dst = cache.layout.narrow(0, p, rows);
            let src = upd.layout.narrow(0, 0, rows);
            let n: usize = d.iter().product();
            for_each_run(&d, [&dst, &src], 0..n, |[o, i], len, [so, si]| {
                for k in 0..len {
                    store(&cache, o + k * so, load(&upd, i + k * si));
                }
            });
        }
    })
}

/// Dense cache rows as the attention loops read them.
#[derive(Clone, Copy)]
enum Rows {
    F16(*const u16),
    F32(*const f32),
}

// SAFETY: the pointers address buffers owned by the compiled program, which outlives its kernels;
// attention only reads them.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

impl Rows {
    fn of(t: &TRef) -> Option<Rows> {
        if t.layout.strides().last() != Some(&1) {
            return None;
        }
        match t.dtype {
            DType::F16 => Some(Rows::F16(t.base::<u16>() as *const u16)),
            DType::F32 => Some(Rows::F32(t.base::<f32>() as *const f32)),
            _ => None,
        }
    }
}

/// `sum(q[d] * row[d])` for the `q.len()` elements of a cache row starting at element `off`.
///
/// # Safety
/// The row lies inside the buffer; `simd` only when the CPU has AVX2, FMA and F16C.
#[inline]
unsafe fn row_dot(q: &[f32], rows: Rows, off: usize, simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        return row_dot_avx2(q, rows, off);
    }
    let _ = simd;
    let mut s = 0f32;
    for (d, x) in q.iter().enumerate() {
        s += x * match rows {
            Rows::F16(p) => f16::from_bits(*p.add(off + d)).to_f32(),
            Rows::F32(p) => *p.add(off + d),
        };
    }
    s
}

/// `acc[d] += w * row[d]` over a cache row starting at element `off`.
///
/// # Safety
/// As [`row_dot`].
#[inline]
unsafe fn row_axpy(acc: &mut [f32], w: f32, rows: Rows, off: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        return row_axpy_avx2(acc, w, rows, off);
    }
    let _ = simd;
    for (d, a) in acc.iter_mut().enumerate() {
        *a += w * match rows {
            Rows::F16(p) => f16::from_bits(*p.add(off + d)).to_f32(),
            Rows::F32(p) => *p.add(off + d),
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(rows: Rows, at: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match rows {
        Rows::F16(p) => _mm256_cvtph_ps(_mm_loadu_si128(p.add(at) as *const __m128i)),
        Rows::F32(p) => _mm256_loadu_ps(p.add(at)),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot_avx2(q: &[f32], rows: Rows, off: usize) -> f32 {
    use std::arch::x86_64::*;
    let n = q.len();
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut d = 0;
    while d + 16 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(d)), load8(rows, off + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(d + 8)), load8(rows, off + d + 8), a1);
        d += 16;
    }
    while d + 8 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(d)), load8(rows, off + d), a0);
        d += 8;
    }
    let v = _mm256_add_ps(a0, a1);
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let mut r = _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
    for (i, x) in q.iter().enumerate().skip(d) {
        r += x * match rows {
            Rows::F16(p) => f16::from_bits(*p.add(off + i)).to_f32(),
            Rows::F32(p) => *p.add(off + i),
        };
    }
    r
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_axpy_avx2(acc: &mut [f32], w: f32, rows: Rows, off: usize) {
    use std::arch::x86_64::*;
    let n = acc.len();
    let wv = _mm256_set1_ps(w);
    let mut d = 0;
    while d + 8 <= n {
        let a = acc.as_mut_ptr().add(d);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(wv, load8(rows, off + d), _mm256_loadu_ps(a)));
        d += 8;
    }
    for (i, a) in acc.iter_mut().enumerate().skip(d) {
        *a += w * match rows {
            Rows::F16(p) => f16::from_bits(*p.add(off + i)).to_f32(),
            Rows::F32(p) => *p.add(off + i),
        };
    }
}

#[allow(clippy::too_many_arguments)]
fn cached_attention(q: TRef, k: TRef, v: TRef, pos: TRef, out: TRef, scratch: super::Ptr, scale: f32, window: Option<usize>) -> Box<dyn Kernel> {
    let (qd, kd, vd) = (q.layout.dims().to_vec(), k.layout.dims().to_vec(), v.layout.dims().to_vec());
    let (s_len, hq, dh) = (qd[0], qd[1], qd[2]);
    let (t_len, hkv, dv) = (kd[0], kd[1], vd[2]);
    let group = hq / hkv;
    let (qs, ks, vs) = (q.layout.strides().to_vec(), k.layout.strides().to_vec(), v.layout.strides().to_vec());
    let os = out.layout.strides().to_vec();
    let cdt = k.dtype;
    let (kr, vr) = (Rows::of(&k).expect("checked at lowering"), Rows::of(&v).expect("checked at lowering"));
    #[cfg(target_arch = "x86_64")]
    let simd = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    let slot = t_len + dh + dv;
    kernel(move |pool: &Pool| {
        // SAFETY: reads stay below row pos + S <= T (clamped); each task owns one (query, head)
        // output row and its thread's scratch slot of T + D + Dv floats.
        unsafe {
            let p = read_pos(&pos);
            pool.run(s_len * hq, &|task, thread| {
                let (i, h) = (task / hq, task % hq);
                let kh = h / group;
                let last = (p + i).min(t_len - 1);
                let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
                let buf = scratch.get().add(thread * slot * 4) as *mut f32;
                let sc = std::slice::from_raw_parts_mut(buf, t_len);
                let qv = std::slice::from_raw_parts_mut(buf.add(t_len), dh);
                let acc = std::slice::from_raw_parts_mut(buf.add(t_len + dh), dv);
                let qo = q.layout.offset + i * qs[0] + h * qs[1];
                for (d, x) in qv.iter_mut().enumerate() {
                    *x = round_to(cdt, load(&q, qo + d * qs[2]));
                }
                let mut mx = f32::NEG_INFINITY;
                for (j, s) in sc.iter_mut().enumerate().take(last + 1).skip(first) {
                    *s = row_dot(qv, kr, k.layout.offset + j * ks[0] + kh * ks[1], simd) * scale;
                    mx = mx.max(*s);
                }
                let mut sum = 0f32;
                for s in &mut sc[first..=last] {
                    *s = (*s - mx).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                acc.fill(0.0);
                for (j, &e) in sc.iter().enumerate().take(last + 1).skip(first) {
                    row_axpy(acc, round_to(cdt, e * inv), vr, v.layout.offset + j * vs[0] + kh * vs[1], simd);
                }
                let oo = out.layout.offset + i * os[0] + h * os[1];
                for (d, a) in acc.iter().enumerate() {
                    store(&out, oo + d * os[2], *a);
                }
            });
        }
    })
}

/// Queries per block of the prompt-processing attention.
const QB: usize = 64;
/// Prompt chunks of at least this many queries use [`cached_attention_gemm`].
const GEMM_MIN_S: usize = 16;

/// Scratch bytes of [`cached_attention_gemm`].
fn gemm_scratch(t: usize, hkv: usize, dh: usize, dv: usize, threads: usize) -> usize {
    let shared = t * hkv * (dh + dv);
    let per_thread = QB * dh + QB * t + super::gemm::scratch_len(QB, t.max(dv), t.max(dh), 1);
    (shared + threads * per_thread) * 4 + 64
}

/// Attention for prompt chunks as two small GEMMs per (head, block of queries): the filled
/// cache rows are converted to f32 once, then `scores = Q K^T` and `out = P V` run on the packed
/// f32 GEMM. The rounding matches the per-query path (queries and probabilities rounded to the
/// cache type before their products, as llama.cpp does).
#[allow(clippy::too_many_arguments)]
fn cached_attention_gemm(q: TRef, k: TRef, v: TRef, pos: TRef, out: TRef, scratch: super::Ptr, scale: f32, window: Option<usize>) -> Box<dyn Kernel> {
    use super::gemm::{scratch_len, sgemm, Mat};
    let (qd, kd, vd) = (q.layout.dims().to_vec(), k.layout.dims().to_vec(), v.layout.dims().to_vec());
    let (s_len, hq, dh) = (qd[0], qd[1], qd[2]);
    let (t_len, hkv, dv) = (kd[0], kd[1], vd[2]);
    let group = hq / hkv;
    let (qs, ks, vs, os) = (q.layout.strides().to_vec(), k.layout.strides().to_vec(), v.layout.strides().to_vec(), out.layout.strides().to_vec());
    let cdt = k.dtype;
    let per_thread = QB * dh + QB * t_len + scratch_len(QB, t_len.max(dv), t_len.max(dh), 1);
    kernel(move |pool: &Pool| {
        // SAFETY: cache rows below pos + S (clamped to T) are read; the f32 copies, query
        // blocks, score blocks and GEMM buffers are disjoint slices of this step's scratch; each
        // task writes the output rows of its own (head, query block).
        unsafe {
            let p = read_pos(&pos);
            let filled = (p + s_len).min(t_len);
            let k32 = scratch.get() as *mut f32;
            let v32 = k32.add(t_len * hkv * dh);
            let work = v32.add(t_len * hkv * dv);
            let (kp, vp, wp) = (super::Ptr(k32 as *mut u8), super::Ptr(v32 as *mut u8), super::Ptr(work as *mut u8));
            // Cache rows to f32, head-major: K32[kh][j][d], V32[kh][j][d].
            super::par_ranges(pool, filled * hkv, 64, |r| {
                for row in r {
                    let (j, kh) = (row / hkv, row % hkv);
                    let kdst = (kp.get() as *mut f32).add((kh * t_len + j) * dh);
                    for d in 0..dh {
                        *kdst.add(d) = load(&k, k.layout.offset + j * ks[0] + kh * ks[1] + d * ks[2]);
                    }
                    let vdst = (vp.get() as *mut f32).add((kh * t_len + j) * dv);
                    for d in 0..dv {
                        *vdst.add(d) = load(&v, v.layout.offset + j * vs[0] + kh * vs[1] + d * vs[2]);
                    }
                }
            });
            let blocks = s_len.div_ceil(QB);
            pool.run(hq * blocks, &|task, thread| {
                let (h, blk) = (task / blocks, task % blocks);
                let kh = h / group;
                let (i0, i1) = (blk * QB, ((blk + 1) * QB).min(s_len));
                let qb = i1 - i0;
                let tb = (p + i1).min(t_len);
                let base = (wp.get() as *mut f32).add(thread * per_thread);
                let (qm, sm, gs) = (base, base.add(QB * dh), base.add(QB * dh + QB * t_len));
                for i in 0..qb {
                    let qo = q.layout.offset + (i0 + i) * qs[0] + h * qs[1];
                    for d in 0..dh {
                        *qm.add(i * dh + d) = round_to(cdt, load(&q, qo + d * qs[2]));
                    }
                }
                let kh32 = (kp.get() as *const f32).add(kh * t_len * dh);
                let vh32 = (vp.get() as *const f32).add(kh * t_len * dv);
                sgemm(None, qb, tb, dh, Mat { ptr: qm, rs: dh, cs: 1 }, Mat { ptr: kh32, rs: 1, cs: dh }, sm, tb, gs);
                for i in 0..qb {
                    let row = std::slice::from_raw_parts_mut(sm.add(i * tb), tb);
                    let last = (p + i0 + i).min(t_len - 1);
                    let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
                    let mut mx = f32::NEG_INFINITY;
                    for s in &mut row[first..=last] {
                        *s *= scale;
                        mx = mx.max(*s);
                    }
                    let mut sum = 0f32;
                    for s in &mut row[first..=last] {
                        *s = (*s - mx).exp();
                        sum += *s;
                    }
                    let inv = 1.0 / sum;
                    for (j, s) in row.iter_mut().enumerate() {
                        *s = if j < first || j > last { 0.0 } else { round_to(cdt, *s * inv) };
                    }
                }
                let op = out.base::<f32>().add(out.layout.offset + i0 * os[0] + h * os[1]);
                sgemm(None, qb, dv, tb, Mat { ptr: sm, rs: tb, cs: 1 }, Mat { ptr: vh32, rs: dv, cs: 1 }, op, os[0], gs);
            });
        }
    })
}

/// Lower CacheWrite (in place on its param) and CachedAttention.
pub fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    match &info.node.op {
        Op::CacheWrite => Ok(Lowered::InPlace {
            src: 0,
            build: Box::new(|ins, out| cache_write(out, ins[1], ins[2])),
        }),
        Op::CachedAttention { scale, window } => {
            let (scale, window) = (*scale, *window);
            let t = info.ins[1].dims()[0];
            let d = info.ins[0].dims()[2] + info.ins[2].dims()[2];
            for (what, i) in [("k", 1), ("v", 2)] {
                if !matches!(info.in_dtypes[i], DType::F16 | DType::F32) || info.ins[i].strides().last() != Some(&1) {
                    return Err(info.unsupported(format!("the {what} cache must be a dense f16 or f32 tensor, got {}", info.in_dtypes[i])));
                }
            }
            let (s_len, hkv) = (info.ins[0].dims()[0], info.ins[1].dims()[1]);
            let (dh, dv) = (info.ins[0].dims()[2], info.ins[2].dims()[2]);
            let dense_out = info.dtype() == DType::F32;
            if s_len >= GEMM_MIN_S && dense_out {
                return Ok(Lowered::Compute {
                    scratch: gemm_scratch(t, hkv, dh, dv, info.threads),
                    build: Box::new(move |ins, out, s| cached_attention_gemm(ins[0], ins[1], ins[2], ins[3], out, s, scale, window)),
                });
            }
            Ok(Lowered::Compute {
                scratch: info.threads * (t + d) * 4,
                build: Box::new(move |ins, out, s| cached_attention(ins[0], ins[1], ins[2], ins[3], out, s, scale, window)),
            })
        }
        _ => unreachable!("dispatched by op"),
    }
}
