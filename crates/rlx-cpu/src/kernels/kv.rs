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

mod decode;
use decode::{PerQuery, GROUP_MAX};

/// The float types the KV-cache kernels load and store (resolved at lowering, so the kernels
/// touch only these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Real {
    F16,
    BF16,
    F32,
    F64,
}

impl Real {
    /// The float type of `dt`, `None` for a dtype that is not a real float.
    fn of(dt: DType) -> Option<Real> {
        match dt {
            DType::F16 => Some(Real::F16),
            DType::BF16 => Some(Real::BF16),
            DType::F32 => Some(Real::F32),
            DType::F64 => Some(Real::F64),
            DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U32
            | DType::Bool
            | DType::C64 => None,
        }
    }
}

/// The float types of an attention's query, key cache, value cache and result.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reals {
    q: Real,
    k: Real,
    v: Real,
    out: Real,
}

/// Read the `I32 [1]` position operand (negative values count as 0).
///
/// # Safety
/// `pos` must be a live I32 value.
unsafe fn read_pos(pos: &TRef) -> usize {
    (*pos.base::<i32>().add(pos.layout.offset)).max(0) as usize
}

#[inline(always)]
unsafe fn load(p: &TRef, r: Real, i: usize) -> f32 {
    match r {
        Real::F16 => (*p.base::<f16>().add(i)).to_f32(),
        Real::BF16 => (*p.base::<half::bf16>().add(i)).to_f32(),
        Real::F64 => *p.base::<f64>().add(i) as f32,
        Real::F32 => *p.base::<f32>().add(i),
    }
}

/// `dst.len()` consecutive elements of `p` from element `at`, as f32 (an f16 row eight at a
/// time through F16C).
///
/// # Safety
/// The elements lie inside `p`'s buffer and are contiguous.
unsafe fn load_row(p: &TRef, r: Real, at: usize, dst: &mut [f32]) {
    if r == Real::F16 {
        let src = std::slice::from_raw_parts(p.base::<f16>().add(at) as *const f16, dst.len());
        return super::elementwise::f16_to_f32(src, dst, f16::to_f32);
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = load(p, r, at + i);
    }
}

#[inline(always)]
unsafe fn store(p: &TRef, r: Real, i: usize, v: f32) {
    match r {
        Real::F16 => *p.base::<f16>().add(i) = f16::from_f32(v),
        Real::BF16 => *p.base::<half::bf16>().add(i) = half::bf16::from_f32(v),
        Real::F64 => *p.base::<f64>().add(i) = v as f64,
        Real::F32 => *p.base::<f32>().add(i) = v,
    }
}

/// Round to the precision of `dt` (what storing there and loading back gives).
#[inline(always)]
fn round_to(r: Real, v: f32) -> f32 {
    match r {
        Real::F16 => f16::from_f32(v).to_f32(),
        Real::BF16 => half::bf16::from_f32(v).to_f32(),
        Real::F32 | Real::F64 => v,
    }
}

/// [`round_to`] over a slice, eight values at a time through F16C when the cache is f16.
fn round_slice(r: Real, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if r == Real::F16 && crate::isa::avx2() {
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn f16c(x: &mut [f32]) {
            use std::arch::x86_64::*;
            let mut c = x.chunks_exact_mut(8);
            for c in &mut c {
                let v = _mm256_loadu_ps(c.as_ptr());
                let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
                _mm256_storeu_ps(c.as_mut_ptr(), r);
            }
            for v in c.into_remainder() {
                *v = f16::from_f32(*v).to_f32();
            }
        }
        // SAFETY: the CPU has the features.
        return unsafe { f16c(x) };
    }
    if r != Real::F32 {
        for v in x.iter_mut() {
            *v = round_to(r, *v);
        }
    }
}

/// CacheWrite: rows `[pos, pos + S)` of the cache, or (with one slot per update row) row
/// `slots[i]` for update row `i`; rows outside the cache are dropped.
fn cache_write(cache: TRef, upd: TRef, pos: TRef, cr: Real, ur: Real) -> Box<dyn Kernel> {
    kernel(move |_pool: &Pool| {
        let dims = upd.layout.dims().to_vec();
        let t = cache.layout.dims()[0];
        // SAFETY: rows outside the cache are dropped, so every write lands inside the param
        // buffer.
        unsafe {
            if pos.layout.dims()[0] > 1 {
                let inner: usize = dims[1..].iter().product();
                let mut d = dims.clone();
                d[0] = 1;
                for r in 0..dims[0] {
                    let slot = *pos
                        .base::<i32>()
                        .add(pos.layout.offset + r * pos.layout.strides()[0]);
                    if slot < 0 || slot as usize >= t {
                        continue;
                    }
                    let dst = cache.layout.narrow(0, slot as usize, 1);
                    let src = upd.layout.narrow(0, r, 1);
                    for_each_run(&d, [&dst, &src], 0..inner, |[o, i], len, [so, si]| {
                        for k in 0..len {
                            store(&cache, cr, o + k * so, load(&upd, ur, i + k * si));
                        }
                    });
                }
                return;
            }
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
                    store(&cache, cr, o + k * so, load(&upd, ur, i + k * si));
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

/// Lanes of the f16 dot products RLX reproduces: llama.cpp's x86 AVX-512 build sums an f16 dot
/// product in 4 accumulators of 16 floats over blocks of 64 elements, then combines them.
const LANES: usize = 64;

/// Sum 16 floats in the order of GCC's `_mm512_reduce_add_ps`: lane `l` with `l + 8`, then
/// with `l + 4`, then lanes 0 with 2 and 1 with 3, then the two.
#[inline(always)]
fn reduce16(x: &[f32]) -> f32 {
    let h: [f32; 8] = std::array::from_fn(|l| x[l + 8] + x[l]);
    let q: [f32; 4] = std::array::from_fn(|l| h[l + 4] + h[l]);
    (q[2] + q[0]) + (q[3] + q[1])
}

/// Combine the 64 lane sums of a blocked dot product (accumulator `a` holds lanes `16a..16a+16`)
/// as ggml does: `(a0 + a2) + (a1 + a3)`, then [`reduce16`].
#[inline(always)]
fn reduce64(a: &[f32; LANES]) -> f32 {
    let x: [f32; 16] = std::array::from_fn(|l| (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]));
    reduce16(&x)
}

/// One cache row element as f32.
#[inline(always)]
unsafe fn at(rows: Rows, i: usize) -> f32 {
    match rows {
        Rows::F16(p) => f16::from_bits(*p.add(i)).to_f32(),
        Rows::F32(p) => *p.add(i),
    }
}

/// `sum(q[d] * row[d])` for the `q.len()` elements of a cache row starting at element `off`,
/// summed like llama.cpp's f16 dot product: lane `d % 64` of full blocks of 64 (reduced by
/// [`reduce64`]), then the leftover products one by one in f64. With an f16 cache and f16-rounded
/// queries every product is exact in f32, so only this order decides the rounding.
///
/// # Safety
/// The row lies inside the buffer.
#[inline]
unsafe fn row_dot(q: &[f32], rows: Rows, off: usize) -> f32 {
    let full = q.len() / LANES * LANES;
    let mut s = row_dot_blocks(&q[..full], rows, off) as f64;
    for (d, x) in q.iter().enumerate().skip(full) {
        s += (x * at(rows, off + d)) as f64;
    }
    s as f32
}

/// The whole-block part of [`row_dot`] (`q.len()` is a multiple of 64), portable.
///
/// # Safety
/// As [`row_dot`].
unsafe fn row_dot_blocks(q: &[f32], rows: Rows, off: usize) -> f32 {
    let mut acc = [0f32; LANES];
    for b in (0..q.len()).step_by(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += q[b + l] * at(rows, off + b + l);
        }
    }
    reduce64(&acc)
}

/// `acc[d] += w * row[d]` over a cache row starting at element `off`.
///
/// # Safety
/// As [`row_dot`].
#[inline]
unsafe fn row_axpy(acc: &mut [f32], w: f32, rows: Rows, off: usize) {
    for (d, a) in acc.iter_mut().enumerate() {
        *a += w * at(rows, off + d);
    }
}

/// `sc[j] = e^(sc[j] - max)` over `first..=last` and the sum of those values, accumulated like
/// llama.cpp's softmax: per aligned block of 16 positions in f32 ([`reduce16`]), the block sums
/// in f64 (masked positions count as 0).
#[inline(always)]
fn exp_blocks(sc: &mut [f32], first: usize, last: usize, max: f32) -> f64 {
    let mut sum = 0f64;
    let mut b = first / 16 * 16;
    while b <= last {
        let mut block = [0f32; 16];
        for j in b.max(first)..(b + 16).min(last + 1) {
            let e = crate::math::exp_f32(sc[j] - max);
            sc[j] = e;
            block[j - b] = e;
        }
        sum += reduce16(&block) as f64;
        b += 16;
    }
    sum
}

/// Attention of a few queries over the cache, one query and one head per task (with AVX-512,
/// up to three heads of one key head, which then read each key and value row once). With an f16 cache the
/// arithmetic is that of llama.cpp's non-flash decode on x86 (AVX-512 build) operation for
/// operation: queries rounded to f16, blocked f16 dot products ([`row_dot`]), scores scaled,
/// its exponential and block sums ([`exp_blocks`]), weights `e * (1 / sum)` rounded to f16, and
/// the weighted sum of values taken as a dot product over positions (lane `j % 64`).
#[allow(clippy::too_many_arguments)]
fn cached_attention(
    q: TRef,
    k: TRef,
    v: TRef,
    pos: TRef,
    out: TRef,
    scratch: super::Ptr,
    scale: f32,
    window: Option<usize>,
    reals: Reals,
) -> Box<dyn Kernel> {
    let a = PerQuery::new(q, k, v, out, reals, scratch, scale, k.layout.dims()[0]);
    let t_len = a.positions;
    kernel(move |pool: &Pool| {
        // SAFETY: reads stay below row pos + S <= T (clamped).
        unsafe {
            let p = read_pos(&pos);
            a.run(
                pool,
                |i| {
                    let last = (p + i).min(t_len - 1);
                    let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
                    Some((first, last))
                },
                |_, j| Some(j),
            );
        }
    })
}

/// [`cached_attention`] over a paged cache: query `i` sees positions `j <= pos[i]` of its
/// sequence at cache rows `table[i, j / block] * block + j % block`, computed operation for
/// operation as [`cached_attention`] computes them over that sequence's rows laid end to end.
/// When `gemm` is set, each prompt piece among the queries — a run of at least
/// [`GEMM_MIN_S`] rows with one table row and consecutive positions, every block of it in the
/// pool — runs as [`cached_attention_gemm`] runs a chunk of that length, so the prompts of
/// several sequences computed in one step each give the rows the contiguous cache gives.
#[allow(clippy::too_many_arguments)]
fn paged_attention(
    ins: &[TRef],
    out: TRef,
    scratch: super::Ptr,
    scale: f32,
    window: Option<usize>,
    block: usize,
    gemm: bool,
    reals: Reals,
) -> Box<dyn Kernel> {
    let (pos, table) = (ins[3], ins[4]);
    let (s_len, m) = (ins[0].layout.dims()[0], table.layout.dims()[1]);
    let blocks = (ins[1].layout.dims()[0] / block) as i32;
    let a = PerQuery::new(
        ins[0],
        ins[1],
        ins[2],
        out,
        reals,
        scratch,
        scale,
        m * block,
    );
    let chunk = GemmAttention {
        q: ins[0],
        k: ins[1],
        v: ins[2],
        out,
        reals,
        scratch,
        scale,
        window,
        positions: m * block,
    };
    let (ps, ts) = (pos.layout.strides()[0], table.layout.strides().to_vec());
    kernel(move |pool: &Pool| {
        // SAFETY: positions are clamped to the table, block ids outside the pool are skipped
        // (a run of queries goes through the GEMM form only when all of its blocks are in the
        // pool), so every cache row read lies inside the pool.
        unsafe {
            let pos_at = |i: usize| *pos.base::<i32>().add(pos.layout.offset + i * ps);
            let block_of = |i: usize, b: usize| {
                *table
                    .base::<i32>()
                    .add(table.layout.offset + i * ts[0] + b * ts[1])
            };
            // The runs of queries that are prompt pieces long enough for the GEMM form.
            let mut runs: Vec<(usize, usize)> = Vec::new();
            let mut i = 0;
            while gemm && i < s_len {
                let mut e = i + 1;
                while e < s_len
                    && pos_at(e) == pos_at(e - 1).wrapping_add(1)
                    && (0..m).all(|b| block_of(e, b) == block_of(i, b))
                {
                    e += 1;
                }
                let (p0, len) = (pos_at(i), e - i);
                if len >= GEMM_MIN_S
                    && p0 >= 0
                    && (p0 as usize + len) <= m * block
                    && (0..(p0 as usize + len).div_ceil(block))
                        .all(|b| (0..blocks).contains(&block_of(i, b)))
                {
                    runs.push((i, len));
                }
                i = e;
            }
            let in_run = |i: usize| runs.iter().any(|&(r, len)| (r..r + len).contains(&i));
            if runs.iter().map(|r| r.1).sum::<usize>() < s_len {
                // The other queries one by one (the runs' rows are written below).
                a.run(
                    pool,
                    |i| {
                        let p = pos_at(i);
                        (p >= 0 && !in_run(i)).then(|| {
                            let last = (p as usize).min(m * block - 1);
                            (window.map_or(0, |w| (last + 1).saturating_sub(w)), last)
                        })
                    },
                    |i, j| {
                        let b = block_of(i, j / block);
                        (0..blocks)
                            .contains(&b)
                            .then(|| b as usize * block + j % block)
                    },
                );
            }
            for &(r, len) in &runs {
                let piece = GemmAttention {
                    q: TRef {
                        layout: chunk.q.layout.narrow(0, r, len),
                        ..chunk.q
                    },
                    out: TRef {
                        layout: chunk.out.layout.narrow(0, r, len),
                        ..chunk.out
                    },
                    ..chunk
                };
                piece.run(pool, pos_at(r) as usize, |j| {
                    block_of(r, j / block) as usize * block + j % block
                });
            }
        }
    })
}

/// The sizes of an attention's `q [S, Hq, D]`, `k [.., Hkv, D]`, `v [.., Hkv, Dv]`.
struct AttentionShape {
    s_len: usize,
    hq: usize,
    dh: usize,
    hkv: usize,
    dv: usize,
    /// Query heads per key head.
    group: usize,
}

impl AttentionShape {
    fn of(q: &TRef, k: &TRef, v: &TRef) -> AttentionShape {
        let (qd, kd, vd) = (q.layout.dims(), k.layout.dims(), v.layout.dims());
        AttentionShape {
            s_len: qd[0],
            hq: qd[1],
            dh: qd[2],
            hkv: kd[1],
            dv: vd[2],
            group: qd[1] / kd[1],
        }
    }
}

/// Scratch floats per head of [`cached_attention`]: scores, the query, 64 partial value rows
/// (a thread has [`GROUP_MAX`] such slots).
fn scratch_floats(t: usize, dh: usize, dv: usize) -> usize {
    t + dh + LANES * dv
}

/// Queries per block of the prompt-processing attention.
const QB: usize = 64;
/// Prompt chunks of at least this many queries use [`cached_attention_gemm`] (the IR's rule,
/// which every backend keeps).
const GEMM_MIN_S: usize = rlx_ir::QuantScheme::MATRIX_ATTENTION_ROWS;

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
fn cached_attention_gemm(
    q: TRef,
    k: TRef,
    v: TRef,
    pos: TRef,
    out: TRef,
    scratch: super::Ptr,
    scale: f32,
    window: Option<usize>,
    reals: Reals,
) -> Box<dyn Kernel> {
    let a = GemmAttention {
        q,
        k,
        v,
        out,
        reals,
        scratch,
        scale,
        window,
        positions: k.layout.dims()[0],
    };
    // SAFETY: reads stay below row pos + S (clamped to the cache).
    kernel(move |pool: &Pool| unsafe { a.run(pool, read_pos(&pos), |j| j) })
}

/// The prompt-chunk attention both cache forms share (see [`cached_attention_gemm`]): `S`
/// queries of one sequence at positions `p..p + S`.
#[derive(Clone, Copy)]
struct GemmAttention {
    q: TRef,
    k: TRef,
    v: TRef,
    out: TRef,
    reals: Reals,
    scratch: super::Ptr,
    scale: f32,
    window: Option<usize>,
    /// Positions a query may see.
    positions: usize,
}

impl GemmAttention {
    /// Run the chunk whose first query is at position `p`; `cache_row(j)` is the cache row of
    /// position `j`.
    ///
    /// # Safety
    /// Every row `cache_row` gives for `j < min(p + S, positions)` lies inside the cache.
    unsafe fn run(&self, pool: &Pool, p: usize, cache_row: impl Fn(usize) -> usize + Sync) {
        use super::gemm::{scratch_len, sgemm, Mat};
        let GemmAttention {
            q,
            k,
            v,
            out,
            reals,
            scratch,
            scale,
            window,
            positions: t_len,
        } = *self;
        let AttentionShape {
            s_len,
            hq,
            dh,
            hkv,
            dv,
            group,
        } = AttentionShape::of(&q, &k, &v);
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        let cdt = reals.k;
        let per_thread = QB * dh + QB * t_len + scratch_len(QB, t_len.max(dv), t_len.max(dh), 1);
        // SAFETY: cache rows below pos + S (clamped to T) are read; the f32 copies, query
        // blocks, score blocks and GEMM buffers are disjoint slices of this step's scratch; each
        // task writes the output rows of its own (head, query block).
        unsafe {
            let filled = (p + s_len).min(t_len);
            let k32 = scratch.get() as *mut f32;
            let v32 = k32.add(t_len * hkv * dh);
            let work = v32.add(t_len * hkv * dv);
            let (kp, vp, wp) = (
                super::Ptr(k32 as *mut u8),
                super::Ptr(v32 as *mut u8),
                super::Ptr(work as *mut u8),
            );
            // Cache rows to f32, head-major: K32[kh][j][d], V32[kh][j][d].
            super::par_ranges(pool, filled * hkv, 64, |r| {
                for row in r {
                    let (j, kh) = (row / hkv, row % hkv);
                    let kdst = std::slice::from_raw_parts_mut(
                        (kp.get() as *mut f32).add((kh * t_len + j) * dh),
                        dh,
                    );
                    load_row(
                        &k,
                        reals.k,
                        k.layout.offset + cache_row(j) * ks[0] + kh * ks[1],
                        kdst,
                    );
                    let vdst = std::slice::from_raw_parts_mut(
                        (vp.get() as *mut f32).add((kh * t_len + j) * dv),
                        dv,
                    );
                    load_row(
                        &v,
                        reals.v,
                        v.layout.offset + cache_row(j) * vs[0] + kh * vs[1],
                        vdst,
                    );
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
                        *qm.add(i * dh + d) = round_to(cdt, load(&q, reals.q, qo + d * qs[2]));
                    }
                }
                let kh32 = (kp.get() as *const f32).add(kh * t_len * dh);
                let vh32 = (vp.get() as *const f32).add(kh * t_len * dv);
                sgemm(
                    None,
                    qb,
                    tb,
                    dh,
                    Mat {
                        ptr: qm,
                        rs: dh,
                        cs: 1,
                    },
                    Mat {
                        ptr: kh32,
                        rs: 1,
                        cs: dh,
                    },
                    sm,
                    tb,
                    gs,
                );
                for i in 0..qb {
                    let row = std::slice::from_raw_parts_mut(sm.add(i * tb), tb);
                    let last = (p + i0 + i).min(t_len - 1);
                    let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
                    crate::math::scaled_softmax_in_place(&mut row[first..=last], scale);
                    round_slice(cdt, &mut row[first..=last]);
                    row[..first].fill(0.0);
                    row[last + 1..].fill(0.0);
                }
                let op = out
                    .base::<f32>()
                    .add(out.layout.offset + i0 * os[0] + h * os[1]);
                sgemm(
                    None,
                    qb,
                    dv,
                    tb,
                    Mat {
                        ptr: sm,
                        rs: tb,
                        cs: 1,
                    },
                    Mat {
                        ptr: vh32,
                        rs: dv,
                        cs: 1,
                    },
                    op,
                    os[0],
                    gs,
                );
            });
        }
    }
}

/// Lower CacheWrite (in place on its param), CachedAttention and PagedAttention.
pub fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    float_values(info)?;
    let real = |d: DType| {
        Real::of(d).ok_or_else(|| info.unsupported(format!("{d} is not a float a cache holds")))
    };
    let out = real(info.dtype())?;
    // An attention's query, key cache and value cache (operands 0, 1, 2).
    let attention_reals = || -> Result<Reals> {
        Ok(Reals {
            q: real(info.in_dtypes[0])?,
            k: real(info.in_dtypes[1])?,
            v: real(info.in_dtypes[2])?,
            out,
        })
    };
    match &info.node.op {
        Op::CacheWrite => Ok(Lowered::InPlace {
            src: 0,
            build: {
                let update = real(info.in_dtypes[1])?;
                Box::new(move |ins, o| cache_write(o, ins[1], ins[2], out, update))
            },
        }),
        Op::PagedAttention {
            scale,
            window,
            block,
        } => {
            let (scale, window, block) = (*scale, *window, *block);
            dense_caches(info)?;
            let reals = attention_reals()?;
            let positions = info.ins[4].dims()[1] * block;
            let (s_len, hkv) = (info.ins[0].dims()[0], info.ins[1].dims()[1]);
            let (dh, dv) = (info.ins[0].dims()[2], info.ins[2].dims()[2]);
            // As CachedAttention: a chunk of this many queries would run as GEMMs.
            let gemm = s_len >= GEMM_MIN_S && info.dtype() == DType::F32;
            let per_query = info.threads * GROUP_MAX * scratch_floats(positions, dh, dv) * 4;
            let scratch = if gemm {
                per_query.max(gemm_scratch(positions, hkv, dh, dv, info.threads))
            } else {
                per_query
            };
            Ok(Lowered::Compute {
                scratch,
                build: Box::new(move |ins, out, s| {
                    paged_attention(ins, out, s, scale, window, block, gemm, reals)
                }),
            })
        }
        Op::CachedAttention { scale, window } => {
            let (scale, window) = (*scale, *window);
            let t = info.ins[1].dims()[0];
            dense_caches(info)?;
            let reals = attention_reals()?;
            let (s_len, hkv) = (info.ins[0].dims()[0], info.ins[1].dims()[1]);
            let (dh, dv) = (info.ins[0].dims()[2], info.ins[2].dims()[2]);
            let dense_out = info.dtype() == DType::F32;
            if s_len >= GEMM_MIN_S && dense_out {
                return Ok(Lowered::Compute {
                    scratch: gemm_scratch(t, hkv, dh, dv, info.threads),
                    build: Box::new(move |ins, out, s| {
                        cached_attention_gemm(
                            ins[0], ins[1], ins[2], ins[3], out, s, scale, window, reals,
                        )
                    }),
                });
            }
            Ok(Lowered::Compute {
                scratch: info.threads * GROUP_MAX * scratch_floats(t, dh, dv) * 4,
                build: Box::new(move |ins, out, s| {
                    cached_attention(ins[0], ins[1], ins[2], ins[3], out, s, scale, window, reals)
                }),
            })
        }
        other => Err(info.unsupported(format!("{} is not a KV-cache op", other.name()))),
    }
}

/// The values these kernels load and store (every operand but positions, slots and block
/// tables, and the result) are f16, bf16, f32 or f64: a named error for anything else, so no
/// other dtype reaches the loads and stores.
fn float_values(info: &NodeInfo<'_>) -> Result<()> {
    let index_operands: &[usize] = match info.node.op {
        Op::CacheWrite => &[2],
        Op::CachedAttention { .. } => &[3],
        Op::PagedAttention { .. } => &[3, 4],
        ref other => return Err(info.unsupported(format!("{} is not a KV-cache op", other.name()))),
    };
    let values = info
        .in_dtypes
        .iter()
        .enumerate()
        .filter(|(i, _)| !index_operands.contains(i))
        .map(|(_, d)| *d)
        .chain([info.dtype()]);
    for d in values {
        if !matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
            return Err(info.unsupported(format!(
                "KV-cache values must be f16, bf16, f32 or f64, got {d} (operands {:?})",
                info.in_dtypes
            )));
        }
    }
    Ok(())
}

/// The attention kernels read the caches as dense f16 or f32 rows.
fn dense_caches(info: &NodeInfo<'_>) -> Result<()> {
    for (what, i) in [("k", 1), ("v", 2)] {
        if !matches!(info.in_dtypes[i], DType::F16 | DType::F32)
            || info.ins[i].strides().last() != Some(&1)
        {
            return Err(info.unsupported(format!(
                "the {what} cache must be a dense f16 or f32 tensor, got {}",
                info.in_dtypes[i]
            )));
        }
    }
    Ok(())
}
