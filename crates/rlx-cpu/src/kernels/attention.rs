//! Attention (grouped-query, all mask kinds) and rotary position embedding.

use super::{kernel, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::elem::{FloatElem, Real};
use crate::layout::Layout;
use crate::with_float;
use rlx_ir::{MaskKind, Op, Result};

/// Offset of element `idx` of a rank-4 layout.
#[inline(always)]
fn at4(l: &Layout, i: [usize; 4]) -> usize {
    let s = l.strides();
    l.offset + i[0] * s[0] + i[1] * s[1] + i[2] * s[2] + i[3] * s[3]
}

#[allow(clippy::too_many_arguments)]
fn attention<T: FloatElem>(
    q: TRef,
    k: TRef,
    v: TRef,
    mask: Option<TRef>,
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    let [b, hq, sq, d] = [0, 1, 2, 3].map(|i| q.layout.dims()[i]);
    let (hkv, sk, dv) = (k.layout.dims()[1], k.layout.dims()[2], v.layout.dims()[3]);
    let group = hq / hkv.max(1);
    let ml = mask.map(|m| m.layout.broadcast_to(&[b, hq, sq, sk]));
    kernel(move |pool| {
        let rows = b * hq * sq;
        let c = |x: f64| <T as FloatElem>::C::c(x);
        pool.run(rows, &|row, th| unsafe {
            let (pq, pk, pv, po) = (
                q.base::<T>() as *const T,
                k.base::<T>() as *const T,
                v.base::<T>() as *const T,
                out.base::<T>(),
            );
            // SAFETY: offsets come from the operands' layouts; each thread owns `sk` scratch slots.
            let scores = (scratch.get() as *mut f64).add(th * sk);
            let (bi, rest) = (row / (hq * sq), row % (hq * sq));
            let (h, i) = (rest / sq, rest % sq);
            let kh = h / group.max(1);
            // Query i sits at absolute position i + (sk - sq).
            let pos = i as isize + sk as isize - sq as isize;
            let (lo, hi) = match kind {
                MaskKind::Causal => (0, pos + 1),
                MaskKind::SlidingWindow(w) => (pos - w as isize + 1, pos + 1),
                _ => (0, sk as isize),
            };
            let (lo, hi) = (lo.max(0) as usize, hi.clamp(0, sk as isize) as usize);
            let mut mx = f64::NEG_INFINITY;
            for j in lo..hi {
                let mut s = c(0.0);
                for t in 0..d {
                    s = s
                        + (*pq.add(at4(&q.layout, [bi, h, i, t]))).to_c()
                            * (*pk.add(at4(&k.layout, [bi, kh, j, t]))).to_c();
                }
                let mut s = s.f64() * scale as f64;
                if let (Some(m), Some(l)) = (&mask, &ml) {
                    s += (*m.base::<T>().add(at4(l, [bi, h, i, j]))).to_f64();
                }
                *scores.add(j) = s;
                mx = mx.max(s);
            }
            let mut sum = 0f64;
            for j in lo..hi {
                let e = (*scores.add(j) - mx).exp();
                *scores.add(j) = e;
                sum += e;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            let ob = at4(&out.layout, [bi, h, i, 0]);
            for t in 0..dv {
                let mut acc = 0f64;
                for j in lo..hi {
                    acc += *scores.add(j) * (*pv.add(at4(&v.layout, [bi, kh, j, t]))).to_f64();
                }
                *po.add(ob + t) = T::from_c(c(acc * inv));
            }
        });
    })
}

/// Query rows per task of [`attention_f32`].
const QB: usize = 64;

/// Scratch floats one thread of [`attention_f32`] needs: a block of scores and GEMM buffers,
/// or, for heads of at most [`SMALL_D`], the keys transposed and every query's scores.
fn f32_scratch_per_thread(sq: usize, sk: usize, d: usize, dv: usize) -> usize {
    let gemm = QB * sk.max(1) + super::gemm::scratch_per_thread(QB, sk.max(dv), sk.max(d));
    if d <= SMALL_D && dv <= SMALL_D {
        gemm.max(small::scratch(sq, sk, d))
    } else {
        gemm
    }
}

/// Widest heads (`D` and `Dv`) [`attention_f32`] runs through its register-blocked products
/// (encoders such as MiniLM: 32) instead of the general GEMM, whose packing costs as much as
/// the products at these sizes.
const SMALL_D: usize = 64;

/// f32 attention through the GEMM: each task takes one (batch, head) and a block of up to
/// [`QB`] queries, computes the block's scores against the keys it may see with one product,
/// scales and masks them, takes each row's softmax and multiplies by V with a second product.
/// Operands are read through their strides (no copies); the output's last axis must be dense.
/// With AVX-512 and heads of at most [`SMALL_D`] (V's last axis dense), a task takes all the
/// queries of one (batch, head) and its two products are register-blocked loops over the keys
/// transposed once ([`small`]). Same results as [`attention`] up to f32 rounding (that one
/// sums in f64).
#[allow(clippy::too_many_arguments)]
fn attention_f32(
    q: TRef,
    k: TRef,
    v: TRef,
    mask: Option<TRef>,
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    use super::gemm::{sgemm, Mat};
    let [b, hq, sq, d] = [0, 1, 2, 3].map(|i| q.layout.dims()[i]);
    let (hkv, sk, dv) = (k.layout.dims()[1], k.layout.dims()[2], v.layout.dims()[3]);
    let group = (hq / hkv.max(1)).max(1);
    let ml = mask.map(|m| m.layout.broadcast_to(&[b, hq, sq, sk]));
    let per_thread = f32_scratch_per_thread(sq, sk, d, dv);
    let small =
        (1..=SMALL_D).contains(&d) && (1..=SMALL_D).contains(&dv) && v.layout.strides()[3] == 1;
    // Query i sits at key position i + off (the last Sq positions when Sq < Sk).
    let off = sk as isize - sq as isize;
    // Keys query position `p` may see, as a half-open range clamped to [0, sk).
    let visible = move |p: isize| -> (usize, usize) {
        let (lo, hi) = match kind {
            MaskKind::Causal => (0, p + 1),
            MaskKind::SlidingWindow(w) => (p - w as isize + 1, p + 1),
            MaskKind::None | MaskKind::Custom => (0, sk as isize),
        };
        let lo = lo.clamp(0, sk as isize) as usize;
        (lo, (hi.clamp(0, sk as isize) as usize).max(lo))
    };
    // Keys `c0..c0 + ncol` that queries `i0..i1` see between them.
    let columns = move |i0: usize, i1: usize| {
        let (lo0, _) = visible(i0 as isize + off);
        let (_, hi1) = visible(i1 as isize - 1 + off);
        (lo0.min(hi1), hi1.saturating_sub(lo0))
    };
    // Scale, mask and softmax of query `i`'s scores over keys `c0..c0 + row.len()`; keys it
    // may not see get 0.
    let finish_row = move |row: &mut [f32], bi: usize, h: usize, i: usize, c0: usize| {
        let (lo, hi) = visible(i as isize + off);
        let (lo, hi) = (
            (lo.max(c0) - c0).min(row.len()),
            (hi.max(c0) - c0).min(row.len()),
        );
        let hi = hi.max(lo);
        if let (Some(m), Some(l)) = (&mask, &ml) {
            // SAFETY: the mask row lies inside the (broadcast) mask operand.
            unsafe {
                // The query's mask row (a key-padding mask is one row for all queries).
                let pm = (m.base::<f32>() as *const f32).add(at4(l, [bi, h, i, c0]));
                let js = l.strides()[3];
                if js == 1 {
                    let mrow = std::slice::from_raw_parts(pm, hi);
                    crate::math::masked_softmax_in_place(&mut row[lo..hi], scale, &mrow[lo..hi]);
                } else {
                    for (j, s) in row.iter_mut().enumerate().take(hi).skip(lo) {
                        *s = *s * scale + *pm.add(j * js);
                    }
                    crate::math::masked_softmax_in_place(&mut row[lo..hi], 1.0, &[]);
                }
            }
        } else if hi > lo {
            crate::math::masked_softmax_in_place(&mut row[lo..hi], scale, &[]);
        }
        row[..lo].fill(0.0);
        row[hi..].fill(0.0);
    };
    kernel(move |pool| {
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        #[cfg(target_arch = "x86_64")]
        if small && crate::isa::avx512() {
            let (c0, ncol) = columns(0, sq);
            pool.run(b * hq, &|bh, th| unsafe {
                // SAFETY: as below; each task writes the output rows of its own (batch, head).
                let (bi, h) = (bh / hq, bh % hq);
                let kh = h / group;
                let po = out.base::<f32>().add(at4(&out.layout, [bi, h, 0, 0]));
                if ncol == 0 {
                    for i in 0..sq {
                        std::ptr::write_bytes(po.add(i * os[2]), 0, dv);
                    }
                    return;
                }
                let heads = small::Head {
                    q: (q.base::<f32>() as *const f32).add(at4(&q.layout, [bi, h, 0, 0])),
                    q_strides: (qs[2], qs[3]),
                    k: (k.base::<f32>() as *const f32).add(at4(&k.layout, [bi, kh, c0, 0])),
                    k_strides: (ks[2], ks[3]),
                    v: (v.base::<f32>() as *const f32).add(at4(&v.layout, [bi, kh, c0, 0])),
                    v_row: vs[2],
                    out: po,
                    out_row: os[2],
                    sq,
                    ncol,
                    d,
                    dv,
                };
                let work = (scratch.get() as *mut f32).add(th * per_thread);
                small::attend(&heads, work, |i, row| finish_row(row, bi, h, i, c0));
            });
            return;
        }
        let blocks = sq.div_ceil(QB);
        pool.run(b * hq * blocks, &|task, th| unsafe {
            // SAFETY: pointers come from the operands' layouts; each thread owns `per_thread`
            // scratch floats; each task writes the output rows of its own (batch, head, block).
            let (bh, blk) = (task / blocks, task % blocks);
            let (bi, h) = (bh / hq, bh % hq);
            let kh = h / group;
            let (i0, i1) = (blk * QB, ((blk + 1) * QB).min(sq));
            let qb = i1 - i0;
            let (c0, ncol) = columns(i0, i1);
            let sm = (scratch.get() as *mut f32).add(th * per_thread);
            let gs = sm.add(QB * sk.max(1));
            let po = out.base::<f32>().add(at4(&out.layout, [bi, h, i0, 0]));
            if ncol == 0 {
                for i in 0..qb {
                    std::ptr::write_bytes(po.add(i * os[2]), 0, dv);
                }
                return;
            }
            let pq = (q.base::<f32>() as *const f32).add(at4(&q.layout, [bi, h, i0, 0]));
            let pk = (k.base::<f32>() as *const f32).add(at4(&k.layout, [bi, kh, c0, 0]));
            let pv = (v.base::<f32>() as *const f32).add(at4(&v.layout, [bi, kh, c0, 0]));
            let qm = Mat {
                ptr: pq,
                rs: qs[2],
                cs: qs[3],
            };
            let kt = Mat {
                ptr: pk,
                rs: ks[3],
                cs: ks[2],
            };
            sgemm(None, qb, ncol, d, qm, kt, sm, ncol, gs);
            for i in 0..qb {
                let row = std::slice::from_raw_parts_mut(sm.add(i * ncol), ncol);
                finish_row(row, bi, h, i0 + i, c0);
            }
            let p = Mat {
                ptr: sm,
                rs: ncol,
                cs: 1,
            };
            let vm = Mat {
                ptr: pv,
                rs: vs[2],
                cs: vs[3],
            };
            sgemm(None, qb, dv, ncol, p, vm, po, os[2], gs);
        });
    })
}

/// The register-blocked attention of one (batch, head) with small heads (AVX-512).
mod small {
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;

    /// Floats of scratch one head takes: its keys transposed and every query's scores, both
    /// with rows padded to whole vectors of keys.
    pub(super) fn scratch(sq: usize, sk: usize, d: usize) -> usize {
        let ncolp = sk.next_multiple_of(16).max(16);
        d * ncolp + sq.max(1) * ncolp
    }

    /// One (batch, head): queries `q` (`sq` rows of `d`, strides `q_strides` = (row, element)),
    /// the `ncol` keys it sees (strides `k_strides`), their values (rows of `dv` dense floats
    /// `v_row` apart) and where its `sq` output rows go (`out_row` apart, dense).
    pub(super) struct Head {
        pub q: *const f32,
        pub q_strides: (usize, usize),
        pub k: *const f32,
        pub k_strides: (usize, usize),
        pub v: *const f32,
        pub v_row: usize,
        pub out: *mut f32,
        pub out_row: usize,
        pub sq: usize,
        pub ncol: usize,
        pub d: usize,
        pub dv: usize,
    }

    /// Scores `S = Q Kᵀ` (rows of `ncolp` floats in `work`, after the transposed keys), each row
    /// finished by `finish(i, row)` (scale, mask, softmax), then `out = S V`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the pointers of `h` address what it says; `work` holds
    /// [`scratch`]`(sq, ncol, d)` floats.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn attend(h: &Head, work: *mut f32, finish: impl Fn(usize, &mut [f32])) {
        let ncolp = h.ncol.next_multiple_of(16);
        let kt = work;
        let sm = work.add(h.d * ncolp);
        // Kᵀ, padded with zero keys to whole vectors.
        for dd in 0..h.d {
            let dst = kt.add(dd * ncolp);
            for j in 0..h.ncol {
                *dst.add(j) = *h.k.add(j * h.k_strides.0 + dd * h.k_strides.1);
            }
            for j in h.ncol..ncolp {
                *dst.add(j) = 0.0;
            }
        }
        let mut j0 = 0;
        while j0 < ncolp {
            let two = j0 + 32 <= ncolp;
            let mut i0 = 0;
            while i0 < h.sq {
                let rows = (h.sq - i0).min(8);
                macro_rules! tile {
                    ($($r:literal)*) => {
                        match (rows, two) {
                            $(($r, true) => scores::<$r, 2>(h, i0, j0, kt, ncolp, sm),
                              ($r, false) => scores::<$r, 1>(h, i0, j0, kt, ncolp, sm),)*
                            // Eight rows.
                            (_, true) => scores::<8, 2>(h, i0, j0, kt, ncolp, sm),
                            (_, false) => scores::<8, 1>(h, i0, j0, kt, ncolp, sm),
                        }
                    };
                }
                tile!(1 2 3 4 5 6 7);
                i0 += rows;
            }
            j0 += if two { 32 } else { 16 };
        }
        for i in 0..h.sq {
            finish(i, std::slice::from_raw_parts_mut(sm.add(i * ncolp), h.ncol));
        }
        let nv = h.dv.div_ceil(16);
        let most = if nv <= 2 { 8 } else { 4 };
        let mut i0 = 0;
        while i0 < h.sq {
            let rows = (h.sq - i0).min(most);
            macro_rules! tile {
                ($($r:literal)*) => {
                    match (rows, nv) {
                        $(($r, 1) => values::<$r, 1>(h, i0, sm, ncolp),
                          ($r, 2) => values::<$r, 2>(h, i0, sm, ncolp),)*
                        (_, 1) => values::<8, 1>(h, i0, sm, ncolp),
                        (_, 2) => values::<8, 2>(h, i0, sm, ncolp),
                        (1, 3) => values::<1, 3>(h, i0, sm, ncolp),
                        (2, 3) => values::<2, 3>(h, i0, sm, ncolp),
                        (3, 3) => values::<3, 3>(h, i0, sm, ncolp),
                        (_, 3) => values::<4, 3>(h, i0, sm, ncolp),
                        (1, _) => values::<1, 4>(h, i0, sm, ncolp),
                        (2, _) => values::<2, 4>(h, i0, sm, ncolp),
                        (3, _) => values::<3, 4>(h, i0, sm, ncolp),
                        // Four rows of four vectors (heads of at most `SMALL_D`).
                        (_, _) => values::<4, 4>(h, i0, sm, ncolp),
                    }
                };
            }
            tile!(1 2 3 4 5 6 7);
            i0 += rows;
        }
    }

    /// Scores of queries `i0..i0 + R` against keys `j0..j0 + 16 NV`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scores<const R: usize, const NV: usize>(
        h: &Head,
        i0: usize,
        j0: usize,
        kt: *const f32,
        ncolp: usize,
        sm: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        let (qr, qc) = h.q_strides;
        for dd in 0..h.d {
            let kv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_loadu_ps(kt.add(dd * ncolp + j0 + 16 * v)));
            for (r, a) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*h.q.add((i0 + r) * qr + dd * qc));
                for (av, kvv) in a.iter_mut().zip(&kv) {
                    *av = _mm512_fmadd_ps(x, *kvv, *av);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (v, av) in a.iter().enumerate() {
                _mm512_storeu_ps(sm.add((i0 + r) * ncolp + j0 + 16 * v), *av);
            }
        }
    }

    /// Output rows `i0..i0 + R`: their weights (score rows of `ncolp`) times the values.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn values<const R: usize, const NV: usize>(
        h: &Head,
        i0: usize,
        sm: *const f32,
        ncolp: usize,
    ) {
        let lanes: [__mmask16; NV] = std::array::from_fn(|v| {
            let left = h.dv - 16 * v;
            if left >= 16 {
                0xffff
            } else {
                ((1u32 << left) - 1) as __mmask16
            }
        });
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for j in 0..h.ncol {
            let row = h.v.add(j * h.v_row);
            let vv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(lanes[v], row.add(16 * v)));
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*sm.add((i0 + r) * ncolp + j));
                for (av, vvv) in a.iter_mut().zip(&vv) {
                    *av = _mm512_fmadd_ps(w, *vvv, *av);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let o = h.out.add((i0 + r) * h.out_row);
            for (v, av) in a.iter().enumerate() {
                _mm512_mask_storeu_ps(o.add(16 * v), lanes[v], *av);
            }
        }
    }
}

/// Rotate one f32 head row (`d = 2 * table.len()` elements, source stride `sx`, dense
/// destination) by the (cos, sin) pairs of `table`, as llama.cpp's build computes it: the first
/// product of each output fused with the sum (`fma(a, c, -(b s))`, `fma(a, s, b c)`).
///
/// # Safety
/// `src` addresses `d` elements at stride `sx` and `dst` `d` dense writable elements; `fma` only
/// when the CPU has FMA.
#[inline(always)]
unsafe fn rotate_f32(
    src: *const f32,
    sx: usize,
    dst: *mut f32,
    table: &[(f64, f64)],
    interleaved: bool,
    fma: bool,
) {
    #[inline(always)]
    unsafe fn imp(
        src: *const f32,
        sx: usize,
        dst: *mut f32,
        table: &[(f64, f64)],
        interleaved: bool,
    ) {
        let half = table.len();
        for (k, &(cos, sin)) in table.iter().enumerate() {
            let (ia, ib) = if interleaved {
                (2 * k, 2 * k + 1)
            } else {
                (k, k + half)
            };
            let (a, b) = (*src.add(ia * sx), *src.add(ib * sx));
            let (c, s) = (cos as f32, sin as f32);
            *dst.add(ia) = a.mul_add(c, -(b * s));
            *dst.add(ib) = a.mul_add(s, b * c);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        unsafe fn with_fma(
            src: *const f32,
            sx: usize,
            dst: *mut f32,
            table: &[(f64, f64)],
            interleaved: bool,
        ) {
            imp(src, sx, dst, table, interleaved)
        }
        if fma {
            return with_fma(src, sx, dst, table, interleaved);
        }
    }
    let _ = fma;
    imp(src, sx, dst, table, interleaved)
}

fn rope<T: FloatElem>(
    x: TRef,
    pos: TRef,
    out: TRef,
    theta: f32,
    interleaved: bool,
    table: super::Ptr,
) -> Box<dyn Kernel> {
    let r = x.layout.rank();
    let (s_len, d) = (x.layout.dims()[r - 2], x.layout.dims()[r - 1]);
    let half = d / 2;
    let lines = x.layout.remove_axis(r - 1);
    let inv: Vec<f64> = (0..half)
        .map(|k| (theta as f64).powf(-2.0 * k as f64 / d as f64))
        .collect();
    kernel(move |pool| {
        let sx = x.layout.strides()[r - 1];
        let n = lines.numel();
        // (cos, sin) for every sequence position and frequency, shared by all heads. For f32 the
        // table follows llama.cpp's recurrence in f32 (theta_k = p * s^k with s = base^(-2/d),
        // multiplied step by step), so RLX rotates exactly as llama.cpp does; otherwise f64.
        // SAFETY: the scratch holds S * half pairs of f64; positions has length S.
        let tab =
            unsafe { std::slice::from_raw_parts_mut(table.get() as *mut (f64, f64), s_len * half) };
        let f32_table = T::DTYPE == rlx_ir::DType::F32;
        #[cfg(target_arch = "x86_64")]
        let fma = crate::isa::avx2();
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        let step = (theta).powf(-2.0 / d as f32);
        for s in 0..s_len {
            let p = unsafe {
                super::index::read_index(&pos, pos.layout.offset + s * pos.layout.strides()[0])
            };
            let mut th = p as f32;
            for k in 0..half {
                tab[s * half + k] = if f32_table {
                    let e = (th.cos() as f64, th.sin() as f64);
                    th *= step;
                    e
                } else {
                    let (sin, cos) = (p as f64 * inv[k]).sin_cos();
                    (cos, sin)
                };
            }
        }
        let tab = &*tab;
        super::par_ranges(pool, n, 64, |range| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            let dense = Layout::contiguous(lines.dims());
            crate::layout::for_each_run(
                lines.dims(),
                [&dense, &lines],
                range,
                |[o0, i0], len, [so, si]| {
                    for t in 0..len {
                        let (o, i) = ((o0 + t * so) * d, i0 + t * si);
                        // Row number within the lines = o / d; its sequence index is that mod S.
                        let s = (o / d) % s_len.max(1);
                        let row = &tab[s * half..(s + 1) * half];
                        if f32_table {
                            // SAFETY: as below.
                            unsafe {
                                rotate_f32(
                                    px.add(i) as *const f32,
                                    sx,
                                    po.add(o) as *mut f32,
                                    row,
                                    interleaved,
                                    fma,
                                )
                            };
                            continue;
                        }
                        for (k, &(cos, sin)) in row.iter().enumerate() {
                            let (ia, ib) = if interleaved {
                                (2 * k, 2 * k + 1)
                            } else {
                                (k, k + half)
                            };
                            // SAFETY: offsets come from layouts.
                            unsafe {
                                let a = (*px.add(i + ia * sx)).to_f64();
                                let b = (*px.add(i + ib * sx)).to_f64();
                                *po.add(o + ia) = T::from_f64(a * cos - b * sin);
                                *po.add(o + ib) = T::from_f64(a * sin + b * cos);
                            }
                        }
                    }
                },
            );
        });
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    if !dt.is_float() {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    Ok(match info.node.op {
        Op::Attention { mask, scale } => {
            let sk = info.ins[1].dims()[2];
            let (d, dv) = (info.ins[0].dims()[3], info.ins[2].dims()[3]);
            let f32_path = dt == rlx_ir::DType::F32;
            let scratch = if f32_path {
                info.threads * f32_scratch_per_thread(info.ins[0].dims()[2], sk, d, dv) * 4
            } else {
                info.threads * sk.max(1) * 8
            };
            Lowered::Compute {
                scratch,
                build: with_float!(dt, T => Box::new(move |i: &[TRef], o: TRef, s| {
                    let m = if mask == MaskKind::Custom {
                        Some(i[3])
                    } else {
                        None
                    };
                    // The GEMM path writes whole output rows: it needs a dense last axis.
                    if f32_path && o.layout.strides()[3] == 1 {
                        return attention_f32(i[0], i[1], i[2], m, o, mask, scale, s);
                    }
                    attention::<T>(i[0], i[1], i[2], m, o, mask, scale, s)
                }) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        Op::Rope { theta, interleaved } => {
            let r = info.ins[0].rank();
            let (s_len, d) = (info.ins[0].dims()[r - 2], info.ins[0].dims()[r - 1]);
            Lowered::Compute {
                scratch: (s_len * (d / 2) * 16).max(16),
                build: with_float!(dt, T => Box::new(
                    move |i: &[TRef], o, s| rope::<T>(i[0], i[1], o, theta, interleaved, s),
                ) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        _ => return Err(info.unsupported("not an attention op")),
    })
}
