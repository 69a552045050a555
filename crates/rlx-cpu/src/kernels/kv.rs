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

/// `dst.len()` consecutive elements of `p` from element `at`, as f32 (an f16 row eight at a
/// time through F16C).
///
/// # Safety
/// The elements lie inside `p`'s buffer and are contiguous.
unsafe fn load_row(p: &TRef, at: usize, dst: &mut [f32]) {
    if p.dtype == DType::F16 {
        let src = std::slice::from_raw_parts(p.base::<f16>().add(at) as *const f16, dst.len());
        return super::elementwise::f16_to_f32(src, dst, f16::to_f32);
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = load(p, at + i);
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

/// [`round_to`] over a slice, eight values at a time through F16C when the cache is f16.
fn round_slice(dt: DType, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if dt == DType::F16 && crate::isa::avx2() {
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
    if dt != DType::F32 {
        for v in x.iter_mut() {
            *v = round_to(dt, *v);
        }
    }
}

/// CacheWrite: rows `[pos, pos + S)` of the cache, or (with one slot per update row) row
/// `slots[i]` for update row `i`; rows outside the cache are dropped.
fn cache_write(cache: TRef, upd: TRef, pos: TRef) -> Box<dyn Kernel> {
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
                            store(&cache, o + k * so, load(&upd, i + k * si));
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
/// The row lies inside the buffer; `simd` only when the CPU has AVX2, FMA and F16C.
#[inline]
unsafe fn row_dot(q: &[f32], rows: Rows, off: usize, simd: bool) -> f32 {
    let n = q.len();
    let full = n / LANES * LANES;
    #[cfg(target_arch = "x86_64")]
    let blocks = if simd {
        row_dot_avx2(&q[..full], rows, off)
    } else {
        row_dot_blocks(&q[..full], rows, off)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let blocks = row_dot_blocks(&q[..full], rows, off);
    let mut s = blocks as f64;
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
unsafe fn row_axpy(acc: &mut [f32], w: f32, rows: Rows, off: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        return row_axpy_avx2(acc, w, rows, off);
    }
    let _ = simd;
    for (d, a) in acc.iter_mut().enumerate() {
        *a += w * at(rows, off + d);
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

/// [`row_dot_blocks`] with AVX2: the 64 lanes in eight registers, reduced in registers in
/// [`reduce64`]'s order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot_avx2(q: &[f32], rows: Rows, off: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm256_setzero_ps(); LANES / 8];
    for b in (0..q.len()).step_by(LANES) {
        for (m, am) in a.iter_mut().enumerate() {
            *am = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.as_ptr().add(b + 8 * m)),
                load8(rows, off + b + 8 * m),
                *am,
            );
        }
    }
    // Register m holds lanes 8m..8m+8: lanes l and l + 32 are registers m and m + 4, l + 16 is m + 2.
    let x0 = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    let x1 = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    let h = _mm256_add_ps(x1, x0);
    let q4 = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
    let q2 = _mm_add_ps(q4, _mm_movehl_ps(q4, q4));
    _mm_cvtss_f32(_mm_add_ss(q2, _mm_shuffle_ps(q2, q2, 1)))
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
        _mm256_storeu_ps(
            a,
            _mm256_fmadd_ps(wv, load8(rows, off + d), _mm256_loadu_ps(a)),
        );
        d += 8;
    }
    for (i, a) in acc.iter_mut().enumerate().skip(d) {
        *a += w * at(rows, off + i);
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

/// [`exp_blocks`] compiled with FMA (its exponential uses fused multiply-adds).
fn exp_blocks_fast(sc: &mut [f32], first: usize, last: usize, max: f32, simd: bool) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma(sc: &mut [f32], first: usize, last: usize, max: f32) -> f64 {
            exp_blocks(sc, first, last, max)
        }
        if simd {
            // SAFETY: `simd` is set only when the CPU has AVX2 and FMA.
            return unsafe { fma(sc, first, last, max) };
        }
    }
    let _ = simd;
    exp_blocks(sc, first, last, max)
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
) -> Box<dyn Kernel> {
    let a = PerQuery::new(q, k, v, out, scratch, scale, k.layout.dims()[0]);
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
) -> Box<dyn Kernel> {
    let (pos, table) = (ins[3], ins[4]);
    let (s_len, m) = (ins[0].layout.dims()[0], table.layout.dims()[1]);
    let blocks = (ins[1].layout.dims()[0] / block) as i32;
    let a = PerQuery::new(ins[0], ins[1], ins[2], out, scratch, scale, m * block);
    let chunk = GemmAttention {
        q: ins[0],
        k: ins[1],
        v: ins[2],
        out,
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

/// The per-query attention both cache forms share: one query and one head — or up to
/// [`GROUP_MAX`] heads of one key head ([`attend_group`]) — per task, the scores of positions
/// `first..=last` in the thread's scratch slots, lanes by position.
#[derive(Clone, Copy)]
struct PerQuery {
    q: TRef,
    k: TRef,
    v: TRef,
    out: TRef,
    kr: Rows,
    vr: Rows,
    scratch: super::Ptr,
    scale: f32,
    /// Positions a query may see (the scores' length).
    positions: usize,
    simd: bool,
    /// Query heads of one key head a task takes together (see [`attend_group`]): up to
    /// [`GROUP_MAX`] with AVX-512 VL, else 1.
    heads: usize,
}

impl PerQuery {
    fn new(
        q: TRef,
        k: TRef,
        v: TRef,
        out: TRef,
        scratch: super::Ptr,
        scale: f32,
        positions: usize,
    ) -> PerQuery {
        #[cfg(target_arch = "x86_64")]
        let simd = crate::isa::avx2();
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        #[cfg(target_arch = "x86_64")]
        let wide = crate::isa::avx512() && std::is_x86_feature_detected!("avx512vl");
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        let group = AttentionShape::of(&q, &k, &v).group;
        PerQuery {
            q,
            k,
            v,
            out,
            kr: Rows::of(&k).expect("checked at lowering"),
            vr: Rows::of(&v).expect("checked at lowering"),
            scratch,
            scale,
            positions,
            simd,
            heads: if wide { group.clamp(1, GROUP_MAX) } else { 1 },
        }
    }

    /// Run every (query, head): `span(i)` gives the positions `(first, last)` query `i` sees
    /// (`None`: none, zeros out), `row(i, j)` the cache row of its position `j` (`None`: skipped).
    ///
    /// # Safety
    /// Every row `row` gives lies inside the cache; `last < positions`.
    unsafe fn run(
        &self,
        pool: &Pool,
        span: impl Fn(usize) -> Option<(usize, usize)> + Sync,
        row: impl Fn(usize, usize) -> Option<usize> + Sync,
    ) {
        let PerQuery {
            q,
            k,
            v,
            out,
            kr,
            vr,
            scratch,
            scale,
            positions,
            simd,
            heads,
        } = *self;
        let AttentionShape {
            s_len,
            hq: _,
            dh,
            hkv,
            dv,
            group,
        } = AttentionShape::of(&q, &k, &v);
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        let cdt = k.dtype;
        let slot = scratch_floats(positions, dh, dv);
        // A task: one query, one key head, `heads` of its query heads (the last chunk fewer).
        let chunks = group.div_ceil(heads);
        pool.run(s_len * hkv * chunks, &|task, thread| {
            let (i, kh, c) = (task / (hkv * chunks), task / chunks % hkv, task % chunks);
            let h0 = kh * group + c * heads;
            let n = heads.min(kh * group + group - h0);
            let zero = |h: usize| {
                let oo = out.layout.offset + i * os[0] + h * os[1];
                (0..dv).for_each(|d| store(&out, oo + d * os[2], 0.0));
            };
            let Some((first, last)) = span(i) else {
                (h0..h0 + n).for_each(zero);
                return;
            };
            // SAFETY (of the block): each task owns its (query, head) output rows and its
            // thread's scratch slots; cache rows come from `row`, inside the cache.
            let (koff, voff) = (k.layout.offset + kh * ks[1], v.layout.offset + kh * vs[1]);
            let (ks0, vs0) = (ks[0], vs[0]);
            let kpos = |j: usize| row(i, j).map(|r| koff + r * ks0);
            let vpos = |j: usize| row(i, j).map(|r| voff + r * vs0);
            // Lane rows that receive a product: all of them once the range spans a block,
            // else the lanes first % 64 ..= last % 64. Untouched rows count as zero below.
            let (lo, hi) = if last / LANES == first / LANES {
                (first % LANES, last % LANES + 1)
            } else {
                (0, LANES)
            };
            // Head `g` of the chunk: its scores, query and lane rows in slot `g`.
            let parts = |g: usize| {
                let buf = scratch.get().add((thread * GROUP_MAX + g) * slot * 4) as *mut f32;
                let h = h0 + g;
                let qv = std::slice::from_raw_parts_mut(buf.add(positions), dh);
                let qo = q.layout.offset + i * qs[0] + h * qs[1];
                for (d, x) in qv.iter_mut().enumerate() {
                    *x = round_to(cdt, load(&q, qo + d * qs[2]));
                }
                (
                    std::slice::from_raw_parts_mut(buf, positions),
                    qv,
                    std::slice::from_raw_parts_mut(buf.add(positions + dh), LANES * dv),
                )
            };
            let finish = |h: usize, acc: &mut [f32]| {
                let oo = out.layout.offset + i * os[0] + h * os[1];
                reduce_lanes(acc, dv, lo, hi, simd);
                for (d, v) in acc[..dv].iter().enumerate() {
                    store(&out, oo + d * os[2], *v);
                }
            };
            #[cfg(target_arch = "x86_64")]
            if simd {
                let span = Span {
                    first,
                    last,
                    lo,
                    hi,
                    scale,
                    cdt,
                };
                // SAFETY: the CPU has the features (`heads > 1` only with AVX-512 VL); each
                // head its own slot; rows as above.
                macro_rules! group {
                    ($($g:literal)*) => {{
                        let mut sl = [$(parts($g)),*];
                        let ok = attend_avx2(&mut sl, dv, kr, vr, span, &kpos, &vpos);
                        for (g, (_, _, acc)) in sl.iter_mut().enumerate() {
                            if ok[g] {
                                finish(h0 + g, acc);
                            } else {
                                zero(h0 + g);
                            }
                        }
                    }};
                }
                match n {
                    1 => group!(0),
                    2 => group!(0 1),
                    _ => group!(0 1 2),
                }
                return;
            }
            for g in 0..n {
                let h = h0 + g;
                let (sc, qv, acc) = parts(g);
                let mut mx = f32::NEG_INFINITY;
                for (j, s) in sc.iter_mut().enumerate().take(last + 1).skip(first) {
                    *s = match kpos(j) {
                        Some(at) => row_dot(qv, kr, at, simd) * scale,
                        None => f32::NEG_INFINITY,
                    };
                    mx = mx.max(*s);
                }
                if mx == f32::NEG_INFINITY {
                    zero(h);
                    continue;
                }
                let inv = (1.0 / exp_blocks_fast(sc, first, last, mx, simd)) as f32;
                acc[lo * dv..hi * dv].fill(0.0);
                for (j, &e) in sc.iter().enumerate().take(last + 1).skip(first) {
                    let Some(at) = vpos(j) else { continue };
                    let lane = &mut acc[(j % LANES) * dv..][..dv];
                    row_axpy(lane, round_to(cdt, e * inv), vr, at, simd);
                }
                finish(h, acc);
            }
        });
    }
}

/// Where one query's attention runs: positions `first..=last`, lane rows `lo..hi`, the score
/// scale and the cache type.
#[derive(Clone, Copy)]
struct Span {
    first: usize,
    last: usize,
    lo: usize,
    hi: usize,
    scale: f32,
    cdt: DType,
}

/// Eight elements of a cache row from element `at` as f32 (`$h`: the row is f16).
#[cfg(target_arch = "x86_64")]
macro_rules! ld8 {
    ($h:expr, $p:expr, $at:expr) => {
        if $h {
            _mm256_cvtph_ps(_mm_loadu_si128(
                ($p as *const u16).add($at) as *const __m128i
            ))
        } else {
            _mm256_loadu_ps(($p as *const f32).add($at))
        }
    };
}

/// One element of a cache row as f32 (`$h`: the row is f16).
#[cfg(target_arch = "x86_64")]
macro_rules! ld1 {
    ($h:expr, $p:expr, $at:expr) => {
        if $h {
            f16::from_bits(*($p as *const u16).add($at)).to_f32()
        } else {
            *($p as *const f32).add($at)
        }
    };
}

/// Query heads of one key head that decode attention takes together at most.
const GROUP_MAX: usize = 3;

/// One query's attention for one to [`GROUP_MAX`] query heads of one key head, compiled for
/// AVX2 with the cache types fixed: the scores of the positions, their softmax weights rounded
/// to the cache type, and the 64 lane rows of the value sum (row `l` holding positions
/// `j % 64 == l` in order), each accumulated in registers rather than in memory. The operations
/// and their order are those of the portable path, head by head; heads taken together
/// (grouped-query attention) share each key and value row's load, conversion and location, so
/// each head's result is bit for bit the one it gets alone. `heads[g]` = (scores, query, lane
/// rows) of head `g`; `kpos`/`vpos` give a position's key/value row offset (`None`: not in the
/// cache). Returns, per head, whether any position was visible.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and AVX-512 F and VL for more than one head (the
/// accumulators of three heads need its 32 registers); each head's scores hold `last + 1`
/// floats and its lane rows `64 * dv`; every offset `kpos`/`vpos` gives starts a whole row of
/// `kr`/`vr`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
unsafe fn attend_avx2(
    heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
    dv: usize,
    kr: Rows,
    vr: Rows,
    span: Span,
    kpos: &impl Fn(usize) -> Option<usize>,
    vpos: &impl Fn(usize) -> Option<usize>,
) -> [bool; GROUP_MAX] {
    let raw = |r: Rows| match r {
        Rows::F16(p) => (true, p as *const u8),
        Rows::F32(p) => (false, p as *const u8),
    };
    let ((kh, kp), (vh, vp)) = (raw(kr), raw(vr));
    /// The one-head form on AVX2 and the grouped forms on AVX-512 VL.
    macro_rules! forms {
        ($($name:ident, $features:literal);*) => {$(
            #[target_feature(enable = $features)]
            #[allow(clippy::type_complexity)]
            unsafe fn $name<const KH: bool, const VH: bool, const G: usize>(
                heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
                dv: usize,
                kp: *const u8,
                vp: *const u8,
                span: Span,
                kpos: &impl Fn(usize) -> Option<usize>,
                vpos: &impl Fn(usize) -> Option<usize>,
            ) -> [bool; GROUP_MAX] {
                attend_heads::<KH, VH, G>(heads, dv, kp, vp, span, kpos, vpos)
            }
        )*};
    }
    forms!(one, "avx2,fma,f16c"; wide, "avx2,fma,f16c,avx512f,avx512vl");
    macro_rules! go {
        ($k:literal, $v:literal) => {
            match heads.len() {
                1 => one::<$k, $v, 1>(heads, dv, kp, vp, span, kpos, vpos),
                2 => wide::<$k, $v, 2>(heads, dv, kp, vp, span, kpos, vpos),
                _ => wide::<$k, $v, 3>(heads, dv, kp, vp, span, kpos, vpos),
            }
        };
    }
    match (kh, vh) {
        (true, true) => go!(true, true),
        (true, false) => go!(true, false),
        (false, true) => go!(false, true),
        (false, false) => go!(false, false),
    }
}

/// The body of [`attend_avx2`] for `G` heads (`heads.len() == G`) and keys (`KH`) and values
/// (`VH`) stored as f16 (else f32).
///
/// # Safety
/// As [`attend_avx2`], inlined into a function with its features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    clippy::type_complexity,
    clippy::needless_range_loop
)]
unsafe fn attend_heads<const KH: bool, const VH: bool, const G: usize>(
    heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
    dv: usize,
    kp: *const u8,
    vp: *const u8,
    span: Span,
    kpos: &impl Fn(usize) -> Option<usize>,
    vpos: &impl Fn(usize) -> Option<usize>,
) -> [bool; GROUP_MAX] {
    use std::arch::x86_64::*;
    let (first, last, lo, hi) = (span.first, span.last, span.lo, span.hi);
    let (scale, cdt) = (span.scale, span.cdt);
    let dh = heads[0].1.len();
    let full = dh / LANES * LANES;
    let q: [*const f32; G] = std::array::from_fn(|g| heads[g].1.as_ptr());
    let sc: [*mut f32; G] = std::array::from_fn(|g| heads[g].0.as_mut_ptr());
    let mut mx = [f32::NEG_INFINITY; G];
    let vrow = dv * if VH { 2 } else { 4 };
    // The value rows are read lane by lane below (64 positions apart), which the hardware
    // prefetcher does not follow: ask for each as its position's score is made.
    let fetch_value = |j: usize| {
        if let Some(at) = vpos(j) {
            let p = vp.add(at * if VH { 2 } else { 4 });
            let mut o = 0;
            while o < vrow {
                _mm_prefetch::<_MM_HINT_T0>(p.add(o) as *const i8);
                o += 64;
            }
        }
    };
    let mut j = first;
    while j <= last {
        // Eight positions whose keys are all in the cache, for heads of whole blocks (no
        // leftover products): their eight-lane sums reduced together, each position's lanes
        // added in the pairs the one-position reduction below adds (lanes i and i + 4, then
        // 0 + 2 and 1 + 3, then the two), so the same scores.
        if full == dh && j + 8 <= last + 1 {
            let at: [Option<usize>; 8] = std::array::from_fn(|p| kpos(j + p));
            if at.iter().all(Option::is_some) {
                let mut hv = [[_mm256_setzero_ps(); 8]; G];
                for (p, at) in at.iter().enumerate() {
                    fetch_value(j + p);
                    let h = lane_sums::<KH, G>(&q, kp, at.unwrap_unchecked(), full);
                    for g in 0..G {
                        hv[g][p] = h[g];
                    }
                }
                for g in 0..G {
                    let s = _mm256_mul_ps(sum_lanes8(&hv[g]), _mm256_set1_ps(scale));
                    _mm256_storeu_ps(sc[g].add(j), s);
                    for p in 0..8 {
                        mx[g] = mx[g].max(*sc[g].add(j + p));
                    }
                }
                j += 8;
                continue;
            }
        }
        fetch_value(j);
        let Some(at) = kpos(j) else {
            for g in 0..G {
                *sc[g].add(j) = f32::NEG_INFINITY;
            }
            j += 1;
            continue;
        };
        let h = lane_sums::<KH, G>(&q, kp, at, full);
        for g in 0..G {
            let mut t = sum_lanes(h[g]) as f64;
            for d in full..dh {
                t += (*q[g].add(d) * ld1!(KH, kp, at + d)) as f64;
            }
            let s = t as f32 * scale;
            *sc[g].add(j) = s;
            mx[g] = mx[g].max(s);
        }
        j += 1;
    }
    let mut ok = [false; GROUP_MAX];
    for g in 0..G {
        if mx[g] == f32::NEG_INFINITY {
            continue;
        }
        ok[g] = true;
        let w = &mut heads[g].0[..=last];
        let inv = (1.0 / exp_blocks(w, first, last, mx[g])) as f32;
        let w = &mut w[first..];
        for e in w.iter_mut() {
            *e *= inv;
        }
        round_slice(cdt, w);
    }
    if !ok.contains(&true) {
        return ok;
    }
    // The heads with no visible position keep their scores out of the sums (their lane rows are
    // not read): give them zero weights so the shared loop below stays branch-free.
    for g in 0..G {
        if !ok[g] {
            heads[g].0[first..=last].fill(0.0);
        }
    }
    let sc: [*const f32; G] = std::array::from_fn(|g| heads[g].0.as_ptr());
    let acc: [*mut f32; G] = std::array::from_fn(|g| heads[g].2.as_mut_ptr());
    // The lane rows of `attend_avx2`, every head's from the same value registers.
    for l in lo..hi {
        let j0 = first + (l + LANES - first % LANES) % LANES;
        let mut c = 0;
        while c + 64 <= dv {
            let mut r = [[_mm256_setzero_ps(); 8]; G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let mut wv = [_mm256_setzero_ps(); G];
                    for g in 0..G {
                        wv[g] = _mm256_set1_ps(*sc[g].add(j));
                    }
                    for m in 0..8 {
                        let vv = ld8!(VH, vp, at + c + 8 * m);
                        for g in 0..G {
                            r[g][m] = _mm256_fmadd_ps(wv[g], vv, r[g][m]);
                        }
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                for m in 0..8 {
                    _mm256_storeu_ps(acc[g].add(l * dv + c + 8 * m), r[g][m]);
                }
            }
            c += 64;
        }
        while c + 8 <= dv {
            let mut r = [_mm256_setzero_ps(); G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let vv = ld8!(VH, vp, at + c);
                    for g in 0..G {
                        r[g] = _mm256_fmadd_ps(_mm256_set1_ps(*sc[g].add(j)), vv, r[g]);
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                _mm256_storeu_ps(acc[g].add(l * dv + c), r[g]);
            }
            c += 8;
        }
        for d in c..dv {
            let mut a = [0f32; G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let x = ld1!(VH, vp, at + d);
                    for g in 0..G {
                        a[g] += *sc[g].add(j) * x;
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                *acc[g].add(l * dv + d) = a[g];
            }
        }
    }
    ok
}

/// `row_dot`'s products of the whole 64-element blocks (`full` elements) of `G` queries with the
/// key row at `at`, each key register shared by the queries, summed over the blocks' eight
/// registers in `reduce64`'s order: lane `d % 8` of each query's sum.
///
/// # Safety
/// Inlined into a function with AVX2, FMA and F16C; each query holds `full` floats and the key
/// row `full` elements from `at`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn lane_sums<const KH: bool, const G: usize>(
    q: &[*const f32; G],
    kp: *const u8,
    at: usize,
    full: usize,
) -> [std::arch::x86_64::__m256; G] {
    use std::arch::x86_64::*;
    let mut a = [[_mm256_setzero_ps(); LANES / 8]; G];
    let mut b = 0;
    while b < full {
        for m in 0..LANES / 8 {
            let kv = ld8!(KH, kp, at + b + 8 * m);
            for g in 0..G {
                a[g][m] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g].add(b + 8 * m)), kv, a[g][m]);
            }
        }
        b += LANES;
    }
    // (Loops rather than closures here and below: a closure does not get the target features
    // of the function it is inlined into, and its intrinsics would be calls.)
    let mut h = [_mm256_setzero_ps(); G];
    for g in 0..G {
        let a = &a[g];
        let x0 = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let x1 = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        h[g] = _mm256_add_ps(x1, x0);
    }
    h
}

/// The sum of a register's eight lanes in `reduce64`'s order: lanes i + (i + 4), then
/// 0 + 2 and 1 + 3, then the two.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_lanes(h: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let q4 = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
    let q2 = _mm_add_ps(q4, _mm_movehl_ps(q4, q4));
    _mm_cvtss_f32(_mm_add_ss(q2, _mm_shuffle_ps(q2, q2, 1)))
}

/// [`sum_lanes`] of eight registers at once, lane `p` of the result the sum of `h[p]`: the same
/// pairs added in the same order, so the same bits, in ~3 instructions a register instead of 6.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_lanes8(h: &[std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // Registers 2k and 2k + 1: lanes i + (i + 4) of each, in one register's two halves.
    let mut quad = [_mm256_setzero_ps(); 4];
    for (k, x) in quad.iter_mut().enumerate() {
        let (a, b) = (h[2 * k], h[2 * k + 1]);
        *x = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(a, b),
            _mm256_permute2f128_ps::<0x20>(a, b),
        );
    }
    // Lanes 0 + 2 and 1 + 3 of registers (0, 2), (1, 3) and (4, 6), (5, 7).
    let mut r = [_mm256_setzero_ps(); 2];
    for (i, x) in r.iter_mut().enumerate() {
        let (a, b) = (quad[2 * i], quad[2 * i + 1]);
        *x = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        );
    }
    let [r0, r1] = r;
    // The two: registers 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high; then in order.
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(r0, r1),
        _mm256_shuffle_ps::<0b11_01_11_01>(r0, r1),
    );
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Sum the 64 lane rows `acc[l * dv..]` (live: `lo..hi`) into row 0 in [`reduce64`]'s order,
/// for every column at once; rows outside `lo..hi` count as zero.
fn reduce_lanes(acc: &mut [f32], dv: usize, lo: usize, hi: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd && lo == 0 && hi == LANES {
        // SAFETY: `simd` is set only when the CPU has AVX2; `acc` holds the 64 rows.
        unsafe { reduce_all_lanes(acc, dv) };
        return;
    }
    // Adding a zero row is a copy.
    let mut live: [bool; LANES] = std::array::from_fn(|l| (lo..hi).contains(&l));
    let mut combine = |dst: usize, a: usize, b: usize| {
        let (src, other) = match (live[a], live[b]) {
            (true, true) => (a, Some(b)),
            (true, false) => (a, None),
            (false, true) => (b, None),
            (false, false) => {
                live[dst] = false;
                return;
            }
        };
        // SAFETY: the three rows lie in `acc`; `dst` may be `src` (element-wise).
        unsafe {
            let base = acc.as_mut_ptr();
            add_rows(
                base.add(dst * dv),
                base.add(src * dv),
                other.map(|o| base.add(o * dv) as *const f32),
                dv,
                simd,
            );
        }
        live[dst] = true;
    };
    for l in 0..16 {
        combine(l, l, l + 32);
        combine(l + 16, l + 16, l + 48);
        combine(l, l, l + 16);
    }
    for l in 0..8 {
        combine(l, l + 8, l);
    }
    for l in 0..4 {
        combine(l, l + 4, l);
    }
    combine(0, 2, 0);
    combine(1, 3, 1);
    combine(0, 0, 1);
}

/// [`reduce_lanes`] when every lane row is live (a range of 64 positions or more): the same
/// sums in the same order — rows `l + 32`, `l + 16`, `l + 48` into `l`, then `l + 8`, `l + 4`,
/// `2`, `3` and `1` — taken eight columns at a time in registers, each lane row read once
/// instead of every partial sum being stored and read back.
///
/// # Safety
/// The CPU has AVX; `acc` holds `64 * dv` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn reduce_all_lanes(acc: &mut [f32], dv: usize) {
    use std::arch::x86_64::*;
    let p = acc.as_mut_ptr();
    let mut c = 0;
    while c + 8 <= dv {
        macro_rules! row {
            ($l:expr) => {
                _mm256_loadu_ps(p.add(($l) * dv + c))
            };
        }
        // Lane rows q, q + 32, q + 16 and q + 48 summed as the first level sums them.
        macro_rules! quad {
            ($q:expr) => {
                _mm256_add_ps(
                    _mm256_add_ps(row!($q), row!($q + 32)),
                    _mm256_add_ps(row!($q + 16), row!($q + 48)),
                )
            };
        }
        let mut e = [_mm256_setzero_ps(); 4];
        for (l, e) in e.iter_mut().enumerate() {
            let d = _mm256_add_ps(quad!(l + 8), quad!(l));
            let d4 = _mm256_add_ps(quad!(l + 12), quad!(l + 4));
            *e = _mm256_add_ps(d4, d);
        }
        let (f0, f1) = (_mm256_add_ps(e[2], e[0]), _mm256_add_ps(e[3], e[1]));
        _mm256_storeu_ps(p.add(c), _mm256_add_ps(f0, f1));
        c += 8;
    }
    for c in c..dv {
        let r = |l: usize| *p.add(l * dv + c);
        let quad = |q: usize| (r(q) + r(q + 32)) + (r(q + 16) + r(q + 48));
        let e: [f32; 4] =
            std::array::from_fn(|l| (quad(l + 12) + quad(l + 4)) + (quad(l + 8) + quad(l)));
        *p.add(c) = (e[2] + e[0]) + (e[3] + e[1]);
    }
}

/// `x[d] = y[d] + z[d]` for `d < n` (`y[d] + 0.0` without `z`), eight at a time with AVX.
///
/// # Safety
/// The three rows hold `n` floats; `x` may be `y` or `z` (element-wise), else they do not
/// overlap. `simd` only when the CPU has AVX2.
#[inline]
unsafe fn add_rows(x: *mut f32, y: *const f32, z: Option<*const f32>, n: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        #[target_feature(enable = "avx")]
        unsafe fn avx(x: *mut f32, y: *const f32, z: Option<*const f32>, n: usize) {
            use std::arch::x86_64::*;
            let mut d = 0;
            while d + 8 <= n {
                let b = z.map_or(_mm256_setzero_ps(), |z| _mm256_loadu_ps(z.add(d)));
                _mm256_storeu_ps(x.add(d), _mm256_add_ps(_mm256_loadu_ps(y.add(d)), b));
                d += 8;
            }
            for d in d..n {
                *x.add(d) = *y.add(d) + z.map_or(0.0, |z| *z.add(d));
            }
        }
        // SAFETY: the CPU has AVX; the rows as the caller promises.
        return avx(x, y, z, n);
    }
    let _ = simd;
    match z {
        Some(z) => (0..n).for_each(|d| *x.add(d) = *y.add(d) + *z.add(d)),
        None => (0..n).for_each(|d| *x.add(d) = *y.add(d) + 0.0),
    }
}

/// Scratch floats per head of [`cached_attention`]: scores, the query, 64 partial value rows
/// (a thread has [`GROUP_MAX`] such slots).
fn scratch_floats(t: usize, dh: usize, dv: usize) -> usize {
    t + dh + LANES * dv
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
fn cached_attention_gemm(
    q: TRef,
    k: TRef,
    v: TRef,
    pos: TRef,
    out: TRef,
    scratch: super::Ptr,
    scale: f32,
    window: Option<usize>,
) -> Box<dyn Kernel> {
    let a = GemmAttention {
        q,
        k,
        v,
        out,
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
        let cdt = k.dtype;
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
                        k.layout.offset + cache_row(j) * ks[0] + kh * ks[1],
                        kdst,
                    );
                    let vdst = std::slice::from_raw_parts_mut(
                        (vp.get() as *mut f32).add((kh * t_len + j) * dv),
                        dv,
                    );
                    load_row(
                        &v,
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
                        *qm.add(i * dh + d) = round_to(cdt, load(&q, qo + d * qs[2]));
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
    match &info.node.op {
        Op::CacheWrite => Ok(Lowered::InPlace {
            src: 0,
            build: Box::new(|ins, out| cache_write(out, ins[1], ins[2])),
        }),
        Op::PagedAttention {
            scale,
            window,
            block,
        } => {
            let (scale, window, block) = (*scale, *window, *block);
            dense_caches(info)?;
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
                    paged_attention(ins, out, s, scale, window, block, gemm)
                }),
            })
        }
        Op::CachedAttention { scale, window } => {
            let (scale, window) = (*scale, *window);
            let t = info.ins[1].dims()[0];
            dense_caches(info)?;
            let (s_len, hkv) = (info.ins[0].dims()[0], info.ins[1].dims()[1]);
            let (dh, dv) = (info.ins[0].dims()[2], info.ins[2].dims()[2]);
            let dense_out = info.dtype() == DType::F32;
            if s_len >= GEMM_MIN_S && dense_out {
                return Ok(Lowered::Compute {
                    scratch: gemm_scratch(t, hkv, dh, dv, info.threads),
                    build: Box::new(move |ins, out, s| {
                        cached_attention_gemm(ins[0], ins[1], ins[2], ins[3], out, s, scale, window)
                    }),
                });
            }
            Ok(Lowered::Compute {
                scratch: info.threads * GROUP_MAX * scratch_floats(t, dh, dv) * 4,
                build: Box::new(move |ins, out, s| {
                    cached_attention(ins[0], ins[1], ins[2], ins[3], out, s, scale, window)
                }),
            })
        }
        other => Err(info.unsupported(format!("{} is not a KV-cache op", other.name()))),
    }
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The all-lanes reduction in registers is bit for bit the row-by-row one, with and
    /// without leftover columns, on values of mixed magnitudes.
    #[test]
    fn all_lanes_reduced_in_registers_equal_row_by_row() {
        if !crate::isa::avx2() {
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for dv in [64usize, 12, 256] {
            let acc: Vec<f32> = (0..LANES * dv)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    unit * 2f32.powi(((seed >> 20) % 24) as i32 - 12)
                })
                .collect();
            let (mut fast, mut slow) = (acc.clone(), acc);
            reduce_lanes(&mut fast, dv, 0, LANES, true);
            reduce_lanes(&mut slow, dv, 0, LANES, false);
            for d in 0..dv {
                assert_eq!(fast[d].to_bits(), slow[d].to_bits(), "dv {dv} column {d}");
            }
        }
    }

    /// Eight registers' lane sums taken at once are bit for bit each register's sum alone, on
    /// values of mixed magnitudes (whose sums round differently when the pairs change).
    #[test]
    fn eight_lane_sums_at_once_equal_each_alone() {
        if !crate::isa::avx2() {
            return;
        }
        #[target_feature(enable = "avx2")]
        unsafe fn check() {
            use std::arch::x86_64::*;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                unit * 2f32.powi(((seed >> 20) % 24) as i32 - 12)
            };
            for _ in 0..500 {
                let h: [__m256; 8] = std::array::from_fn(|_| {
                    let v: [f32; 8] = std::array::from_fn(|_| next());
                    _mm256_loadu_ps(v.as_ptr())
                });
                let mut got = [0f32; 8];
                _mm256_storeu_ps(got.as_mut_ptr(), sum_lanes8(&h));
                for (p, g) in got.iter().enumerate() {
                    assert_eq!(g.to_bits(), sum_lanes(h[p]).to_bits(), "register {p}");
                }
            }
        }
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { check() }
    }
}
