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
    let keys = Keys::new(kind, sq, sk);
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
            let (lo, hi) = keys.visible(i as isize + keys.off);
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

/// The sizes of an attention: `q [b, hq, sq, d]`, `k [b, hq / group, sk, d]`,
/// `v [b, hq / group, sk, dv]`.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    sq: usize,
    d: usize,
    sk: usize,
    dv: usize,
    /// Query heads per key / value head.
    group: usize,
}

impl Dims {
    fn of(q: &TRef, k: &TRef, v: &TRef) -> Dims {
        let [b, hq, sq, d] = [0, 1, 2, 3].map(|i| q.layout.dims()[i]);
        let (hkv, sk, dv) = (k.layout.dims()[1], k.layout.dims()[2], v.layout.dims()[3]);
        Dims {
            b,
            hq,
            sq,
            d,
            sk,
            dv,
            group: (hq / hkv.max(1)).max(1),
        }
    }
}

/// Which keys each query of an attention may see under its mask kind.
#[derive(Clone, Copy)]
struct Keys {
    kind: MaskKind,
    sk: usize,
    /// Query i sits at key position i + off (the last Sq positions when Sq < Sk).
    off: isize,
}

impl Keys {
    fn new(kind: MaskKind, sq: usize, sk: usize) -> Keys {
        Keys {
            kind,
            sk,
            off: sk as isize - sq as isize,
        }
    }

    /// Keys query position `p` may see, as a half-open range clamped to [0, sk).
    fn visible(&self, p: isize) -> (usize, usize) {
        let sk = self.sk as isize;
        let (lo, hi) = match self.kind {
            MaskKind::Causal => (0, p + 1),
            MaskKind::SlidingWindow(w) => (p - w as isize + 1, p + 1),
            MaskKind::None | MaskKind::Custom => (0, sk),
        };
        let lo = lo.clamp(0, sk) as usize;
        (lo, (hi.clamp(0, sk) as usize).max(lo))
    }

    /// Keys `c0..c0 + ncol` that queries `i0..i1` see between them.
    fn columns(&self, i0: usize, i1: usize) -> (usize, usize) {
        let (lo0, _) = self.visible(i0 as isize + self.off);
        let (_, hi1) = self.visible(i1 as isize - 1 + self.off);
        (lo0.min(hi1), hi1.saturating_sub(lo0))
    }

    /// The keys query `i` sees among `c0..c0 + n`, relative to `c0`.
    fn span(&self, i: usize, c0: usize, n: usize) -> (usize, usize) {
        let (lo, hi) = self.visible(i as isize + self.off);
        let (lo, hi) = ((lo.max(c0) - c0).min(n), (hi.max(c0) - c0).min(n));
        (lo, hi.max(lo))
    }
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
    let Dims {
        b,
        hq,
        sq,
        d,
        sk,
        dv,
        group,
    } = Dims::of(&q, &k, &v);
    let ml = mask.map(|m| m.layout.broadcast_to(&[b, hq, sq, sk]));
    let per_thread = f32_scratch_per_thread(sq, sk, d, dv);
    let small =
        (1..=SMALL_D).contains(&d) && (1..=SMALL_D).contains(&dv) && v.layout.strides()[3] == 1;
    let keys = Keys::new(kind, sq, sk);
    // Scale, mask and softmax of query `i`'s scores over keys `c0..c0 + row.len()`; keys it
    // may not see get 0.
    let finish_row = move |row: &mut [f32], bi: usize, h: usize, i: usize, c0: usize| {
        let (lo, hi) = keys.span(i, c0, row.len());
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
            let (c0, ncol) = keys.columns(0, sq);
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
            let (c0, ncol) = keys.columns(i0, i1);
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

/// Query rows per task of [`attention_bf16`].
const QB16: usize = 128;

/// Bytes of scratch one thread of [`attention_bf16`] takes (see [`dot::attend`]).
fn bf16_scratch_per_thread(sq: usize, sk: usize, d: usize, dv: usize) -> usize {
    let ncolp = sk.next_multiple_of(32).max(32);
    let rows = sq.clamp(1, QB16);
    let (dp, dvp) = (d.div_ceil(2), dv.next_multiple_of(16));
    4 * (dp * ncolp + rows * dp + rows * ncolp + rows * ncolp / 2 + ncolp / 2 * dvp + rows + ncolp)
}

/// bf16 attention with AVX-512 BF16: each task takes one (batch, head) and a block of up to
/// [`QB16`] queries; both products run as `vdpbf16ps` dot products of bf16 pairs summed in f32
/// ([`dot::attend`]), the scores are scaled, masked (a bf16 mask widened) and exponentiated in
/// f32 (the softmax's numerators), rounded to bf16 for the second product, and each output row
/// is divided by its sum of exponentials in f32 before it is rounded to bf16 once, as
/// flash-attention kernels do. The output's last axis must be dense; operands are read through
/// their strides.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn attention_bf16(
    q: TRef,
    k: TRef,
    v: TRef,
    mask: Option<TRef>,
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    let Dims {
        b,
        hq,
        sq,
        d,
        sk,
        dv,
        group,
    } = Dims::of(&q, &k, &v);
    let ml = mask.map(|m| m.layout.broadcast_to(&[b, hq, sq, sk]));
    let per_thread = bf16_scratch_per_thread(sq, sk, d, dv);
    let keys = Keys::new(kind, sq, sk);
    kernel(move |pool| {
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        let blocks = sq.div_ceil(QB16);
        pool.run(b * hq * blocks, &|task, th| unsafe {
            // SAFETY: pointers come from the operands' layouts; each thread owns `per_thread`
            // bytes of scratch; each task writes the output rows of its own (batch, head, block).
            let (bh, blk) = (task / blocks, task % blocks);
            let (bi, h) = (bh / hq, bh % hq);
            let kh = h / group;
            let (i0, i1) = (blk * QB16, ((blk + 1) * QB16).min(sq));
            let (c0, ncol) = keys.columns(i0, i1);
            let po = out.base::<u16>().add(at4(&out.layout, [bi, h, i0, 0]));
            if ncol == 0 {
                for i in 0..i1 - i0 {
                    std::ptr::write_bytes(po.add(i * os[2]), 0, dv);
                }
                return;
            }
            let work = scratch.get().add(th * per_thread) as *mut u32;
            // The widened mask row sits at the end of the thread's scratch.
            let mrow = (work as *mut f32).add(per_thread / 4 - sk.next_multiple_of(32).max(32));
            // A mask whose rows do not change with the query (a key-padding mask) is widened once.
            let mut widened = false;
            let tile = dot::Tile {
                q: (q.base::<u16>() as *const u16).add(at4(&q.layout, [bi, h, i0, 0])),
                q_strides: (qs[2], qs[3]),
                k: (k.base::<u16>() as *const u16).add(at4(&k.layout, [bi, kh, c0, 0])),
                k_strides: (ks[2], ks[3]),
                v: (v.base::<u16>() as *const u16).add(at4(&v.layout, [bi, kh, c0, 0])),
                v_strides: (vs[2], vs[3]),
                out: po,
                out_row: os[2],
                rows: i1 - i0,
                ncol,
                d,
                dv,
            };
            dot::attend(&tile, work, |i, row| {
                let i = i0 + i;
                let (lo, hi) = keys.span(i, c0, row.len());
                let m = match (&mask, &ml) {
                    (Some(m), Some(l)) => {
                        let [_, _, is, js] = [0, 1, 2, 3].map(|a| l.strides()[a]);
                        if !widened || is != 0 {
                            let pm = (m.base::<u16>() as *const u16).add(at4(l, [bi, h, i, c0]));
                            for j in 0..row.len() {
                                *mrow.add(j) = f32::from_bits((*pm.add(j * js) as u32) << 16);
                            }
                            widened = true;
                        }
                        std::slice::from_raw_parts(mrow.add(lo), hi - lo)
                    }
                    _ => &[],
                };
                row[..lo].fill(0.0);
                row[hi..].fill(0.0);
                if hi > lo {
                    1.0 / crate::math::masked_exp_in_place(&mut row[lo..hi], scale, m)
                } else {
                    0.0
                }
            });
        });
    })
}

/// The two products of a bf16 attention tile with AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
mod dot {
    use std::arch::x86_64::*;

    /// One (batch, head) and a block of `rows` queries: queries `q` (strides `q_strides` =
    /// (row, element)), the `ncol` keys they see and their values (strides likewise), and
    /// where the output rows go (`out_row` apart, dense), all bf16.
    pub(super) struct Tile {
        pub q: *const u16,
        pub q_strides: (usize, usize),
        pub k: *const u16,
        pub k_strides: (usize, usize),
        pub v: *const u16,
        pub v_strides: (usize, usize),
        pub out: *mut u16,
        pub out_row: usize,
        pub rows: usize,
        pub ncol: usize,
        pub d: usize,
        pub dv: usize,
    }

    /// The transpose of a 16 × 16 matrix of 4-byte words held one row a register: pairs of
    /// rows interleaved by words, then by 8-byte halves, which leaves each 128-bit lane `L` of
    /// register `4k + m` holding column `4L + m` of rows `4k..4k + 4`; those lanes are then
    /// transposed as a 4 × 4 matrix for each `m`.
    #[inline(always)]
    unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        let t: [__m512i; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(a, b)
            } else {
                _mm512_unpackhi_epi32(a, b)
            }
        });
        let u: [__m512i; 16] = std::array::from_fn(|i| {
            let (k, m) = (i / 4, i % 4);
            let (a, b) = (t[4 * k + m / 2], t[4 * k + m / 2 + 2]);
            if m % 2 == 0 {
                _mm512_unpacklo_epi64(a, b)
            } else {
                _mm512_unpackhi_epi64(a, b)
            }
        });
        let mut out = [_mm512_setzero_si512(); 16];
        for m in 0..4 {
            let (a, b, c, d) = (u[m], u[4 + m], u[8 + m], u[12 + m]);
            let s0 = _mm512_shuffle_i32x4::<0x44>(a, b);
            let s1 = _mm512_shuffle_i32x4::<0xEE>(a, b);
            let s2 = _mm512_shuffle_i32x4::<0x44>(c, d);
            let s3 = _mm512_shuffle_i32x4::<0xEE>(c, d);
            out[m] = _mm512_shuffle_i32x4::<0x88>(s0, s2);
            out[4 + m] = _mm512_shuffle_i32x4::<0xDD>(s0, s2);
            out[8 + m] = _mm512_shuffle_i32x4::<0x88>(s1, s3);
            out[12 + m] = _mm512_shuffle_i32x4::<0xDD>(s1, s3);
        }
        out
    }

    /// Two bf16 (bits) as one pair, `lo` in the low half as `vdpbf16ps` takes it.
    #[inline(always)]
    fn pair(lo: u16, hi: u16) -> u32 {
        lo as u32 | (hi as u32) << 16
    }

    /// Scores `S = Q Kᵀ` in f32, each row finished by `finish(i, row)` (`row` is the `ncol`
    /// scores, turned into weights in place: scaled, masked, exponentiated), which returns the
    /// factor of that row's output (the reciprocal of the weights' sum); the weights rounded to
    /// bf16, then `out = factor × S V` rounded to bf16.
    ///
    /// `work` holds, in 4-byte words (`ncolp` = keys rounded up to 32, `dp` = depth pairs):
    /// the keys transposed into depth pairs (`dp × ncolp`), the queries in depth pairs
    /// (`rows × dp`), the scores (`rows × ncolp` f32), the weights in key pairs
    /// (`rows × ncolp / 2`), the values in key pairs (`ncolp / 2 × dv` rounded up to 16) and the
    /// rows' factors; pairs past the depth, keys or values are zero, so they add nothing.
    ///
    /// # Safety
    /// The CPU has AVX-512F, BW, VL and BF16; the pointers of `t` address what it says; `work`
    /// holds [`super::bf16_scratch_per_thread`] bytes for at least `t.rows` and `t.ncol`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn attend(
        t: &Tile,
        work: *mut u32,
        mut finish: impl FnMut(usize, &mut [f32]) -> f32,
    ) {
        let ncolp = t.ncol.next_multiple_of(32);
        let (dp, dvp, half) = (t.d.div_ceil(2), t.dv.next_multiple_of(16), ncolp / 2);
        let kt = work;
        let qp = kt.add(dp * ncolp);
        let sm = qp.add(t.rows * dp) as *mut f32;
        let pp = (sm as *mut u32).add(t.rows * ncolp);
        let vp = pp.add(t.rows * half);
        let factors = vp.add(half * dvp) as *mut f32;
        let (kr, kc) = t.k_strides;
        let at =
            |p: *const u16, i: usize, n: usize, s: usize| if i < n { *p.add(i * s) } else { 0 };
        let odd = t.d % 2 == 1;
        if kc == 1 {
            // Blocks of 16 keys × 16 depth pairs (a row's 4-byte words), transposed in registers;
            // keys past `ncol` and elements past the depth load as zero.
            for j0 in (0..ncolp).step_by(16) {
                for q0 in (0..dp).step_by(16) {
                    let left = t.d - 2 * q0;
                    let elems = if left >= 32 {
                        u32::MAX
                    } else {
                        (1u32 << left) - 1
                    };
                    let rows: [__m512i; 16] = std::array::from_fn(|j| {
                        if j0 + j < t.ncol {
                            _mm512_maskz_loadu_epi16(
                                elems,
                                t.k.add((j0 + j) * kr + 2 * q0) as *const i16,
                            )
                        } else {
                            _mm512_setzero_si512()
                        }
                    });
                    let cols = transpose16(rows);
                    for (c, col) in cols.iter().enumerate().take((dp - q0).min(16)) {
                        _mm512_storeu_si512(kt.add((q0 + c) * ncolp + j0) as *mut __m512i, *col);
                    }
                }
            }
        } else {
            for q in 0..dp {
                let dst = kt.add(q * ncolp);
                for j in 0..ncolp {
                    *dst.add(j) = if j < t.ncol {
                        let row = t.k.add(j * kr);
                        pair(*row.add(2 * q * kc), at(row, 2 * q + 1, t.d, kc))
                    } else {
                        0
                    };
                }
            }
        }
        let (qr, qc) = t.q_strides;
        for i in 0..t.rows {
            let row = t.q.add(i * qr);
            let dst = qp.add(i * dp);
            if qc == 1 {
                std::ptr::copy_nonoverlapping(row, dst as *mut u16, t.d);
                if odd {
                    *(dst as *mut u16).add(t.d) = 0;
                }
            } else {
                for q in 0..dp {
                    *dst.add(q) = pair(*row.add(2 * q * qc), at(row, 2 * q + 1, t.d, qc));
                }
            }
        }
        let (vr, vc) = t.v_strides;
        for p in 0..half {
            let (j0, j1) = (2 * p, 2 * p + 1);
            let dst = vp.add(p * dvp);
            if vc == 1 {
                // Rows j0 and j1, 16 columns at a time, interleaved into pairs; columns past
                // `dv` and a row past the keys are zero.
                for c in (0..dvp).step_by(16) {
                    let lanes = if t.dv - c.min(t.dv) >= 16 {
                        0xffff
                    } else {
                        ((1u32 << (t.dv - c.min(t.dv))) - 1) as __mmask16
                    };
                    let row = |j: usize| {
                        if j < t.ncol {
                            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                lanes,
                                t.v.add(j * vr + c) as *const i16,
                            ))
                        } else {
                            _mm512_setzero_si512()
                        }
                    };
                    let w = _mm512_or_si512(row(j0), _mm512_slli_epi32::<16>(row(j1)));
                    _mm512_storeu_si512(dst.add(c) as *mut __m512i, w);
                }
            } else {
                for c in 0..dvp {
                    *dst.add(c) = if c < t.dv {
                        let col = t.v.add(c * vc);
                        pair(at(col, j0, t.ncol, vr), at(col, j1, t.ncol, vr))
                    } else {
                        0
                    };
                }
            }
        }
        for j0 in (0..ncolp).step_by(32) {
            let mut i0 = 0;
            while i0 < t.rows {
                let r = (t.rows - i0).min(8);
                macro_rules! tile {
                    ($($r:literal)*) => {
                        match r {
                            $($r => scores::<$r>(kt, ncolp, dp, qp, i0, j0, sm),)*
                            _ => scores::<8>(kt, ncolp, dp, qp, i0, j0, sm),
                        }
                    };
                }
                tile!(1 2 3 4 5 6 7);
                i0 += r;
            }
        }
        for i in 0..t.rows {
            let row = sm.add(i * ncolp);
            *factors.add(i) = finish(i, std::slice::from_raw_parts_mut(row, t.ncol));
            std::ptr::write_bytes(row.add(t.ncol), 0, ncolp - t.ncol);
            for c in 0..half / 16 {
                let lo = _mm512_loadu_ps(row.add(32 * c));
                let hi = _mm512_loadu_ps(row.add(32 * c + 16));
                let p: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(pp.add(i * half + 16 * c) as *mut __m512i, p);
            }
        }
        let (nv, kp) = (dvp / 16, t.ncol.div_ceil(2));
        let mut v0 = 0;
        while v0 < nv {
            let n = (nv - v0).min(4);
            let most = if n <= 2 { 8 } else { 4 };
            let mut i0 = 0;
            while i0 < t.rows {
                let r = (t.rows - i0).min(most);
                macro_rules! tile {
                    ($($r:literal)*) => {
                        match (r, n) {
                            $(($r, 1) => values::<$r, 1>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                              ($r, 2) => values::<$r, 2>(t, pp, half, vp, dvp, kp, factors, i0, v0),)*
                            (_, 1) => values::<8, 1>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (_, 2) => values::<8, 2>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (1, 3) => values::<1, 3>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (2, 3) => values::<2, 3>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (3, 3) => values::<3, 3>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (_, 3) => values::<4, 3>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (1, _) => values::<1, 4>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (2, _) => values::<2, 4>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            (3, _) => values::<3, 4>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                            // Four rows of four vectors.
                            (_, _) => values::<4, 4>(t, pp, half, vp, dvp, kp, factors, i0, v0),
                        }
                    };
                }
                tile!(1 2 3 4 5 6 7);
                i0 += r;
            }
            v0 += n;
        }
    }

    /// Scores of queries `i0..i0 + R` against keys `j0..j0 + 32`.
    #[inline(always)]
    unsafe fn scores<const R: usize>(
        kt: *const u32,
        ncolp: usize,
        dp: usize,
        qp: *const u32,
        i0: usize,
        j0: usize,
        sm: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for q in 0..dp {
            let k0: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(kt.add(q * ncolp + j0) as *const __m512i));
            let k1: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                kt.add(q * ncolp + j0 + 16) as *const __m512i
            ));
            for (r, a) in acc.iter_mut().enumerate() {
                let x: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*qp.add((i0 + r) * dp + q) as i32));
                a[0] = _mm512_dpbf16_ps(a[0], x, k0);
                a[1] = _mm512_dpbf16_ps(a[1], x, k1);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(sm.add((i0 + r) * ncolp + j0), a[0]);
            _mm512_storeu_ps(sm.add((i0 + r) * ncolp + j0 + 16), a[1]);
        }
    }

    /// Output rows `i0..i0 + R`, value vectors `v0..v0 + NV`: the weights (`half` pairs a row)
    /// times the values in key pairs, over the `kp` pairs holding keys, times each row's factor.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn values<const R: usize, const NV: usize>(
        t: &Tile,
        pp: *const u32,
        half: usize,
        vp: *const u32,
        dvp: usize,
        kp: usize,
        factors: *const f32,
        i0: usize,
        v0: usize,
    ) {
        let lanes: [__mmask16; NV] = std::array::from_fn(|v| {
            let left = t.dv - 16 * (v0 + v);
            if left >= 16 {
                0xffff
            } else {
                ((1u32 << left) - 1) as __mmask16
            }
        });
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for p in 0..kp {
            let row = vp.add(p * dvp + 16 * v0);
            let vv: [__m512bh; NV] = std::array::from_fn(|v| {
                std::mem::transmute(_mm512_loadu_si512(row.add(16 * v) as *const __m512i))
            });
            for (r, a) in acc.iter_mut().enumerate() {
                let w: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*pp.add((i0 + r) * half + p) as i32));
                for (av, vvv) in a.iter_mut().zip(&vv) {
                    *av = _mm512_dpbf16_ps(*av, w, *vvv);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let o = t.out.add((i0 + r) * t.out_row + 16 * v0);
            let f = _mm512_set1_ps(*factors.add(i0 + r));
            for (v, av) in a.iter().enumerate() {
                let x: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_mul_ps(*av, f)));
                _mm256_mask_storeu_epi16(o.add(16 * v) as *mut i16, lanes[v], x);
            }
        }
    }
}

/// Offsets, in bytes, of the f32 copies [`attention_widened`] makes in its scratch (q, k, v,
/// the mask if any, the output, then where the f32 kernel's own scratch starts), and their
/// total size.
fn widened_parts(ins: &[&[usize]], out: &[usize]) -> (Vec<usize>, usize) {
    let mut offs = Vec::with_capacity(ins.len() + 2);
    let mut at = 0;
    for dims in ins.iter().copied().chain([out]) {
        offs.push(at);
        at += (dims.iter().product::<usize>() * 4).next_multiple_of(64);
    }
    offs.push(at);
    (offs, at)
}

/// Half-precision attention without a dot-product kernel for its dtype (f16, or bf16 without
/// AVX-512 BF16): the operands widened to f32 into scratch, [`attention_f32`] on the copies, and
/// its output rounded once into `out`.
fn attention_widened<T: FloatElem>(
    ins: &[TRef],
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    use super::elementwise::map1;
    let dims: Vec<&[usize]> = ins.iter().map(|t| t.layout.dims()).collect();
    let (offs, _) = widened_parts(&dims, out.layout.dims());
    let copy = |t: &TRef, i: usize| TRef {
        // SAFETY: `lower` sized the scratch with `widened_parts` of these operands.
        ptr: Ptr(unsafe { scratch.get().add(offs[i]) }),
        layout: Layout::contiguous(t.layout.dims()),
        dtype: rlx_ir::DType::F32,
    };
    let wide: Vec<TRef> = ins.iter().enumerate().map(|(i, t)| copy(t, i)).collect();
    let wout = copy(&out, ins.len());
    let widen: Vec<Box<dyn Kernel>> = ins
        .iter()
        .zip(&wide)
        .map(|(&t, &w)| map1(t, w, |x: T| x.to_f64() as f32))
        .collect();
    // SAFETY: as above; the f32 kernel's scratch follows the copies.
    let rest = Ptr(unsafe { scratch.get().add(offs[ins.len() + 1]) });
    let inner = attention_f32(
        wide[0],
        wide[1],
        wide[2],
        wide.get(3).copied(),
        wout,
        kind,
        scale,
        rest,
    );
    let narrow = map1(wout, out, |x: f32| T::from_f64(x as f64));
    kernel(move |pool| {
        for w in &widen {
            w.run(pool);
        }
        inner.run(pool);
        narrow.run(pool);
    })
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

/// Which rotations a `Rope` node's table holds: those of its positions operand (node), base and
/// width, for its sequence length, in f32 (llama.cpp's recurrence) or f64. Nodes with equal keys
/// share one [`RopeTable`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RopeKey {
    pub(crate) positions: usize,
    pub(crate) theta_bits: u32,
    pub(crate) d: usize,
    pub(crate) s_len: usize,
    pub(crate) f32_table: bool,
}

/// (cos, sin) for every sequence position and frequency, shared by the `Rope` nodes of one key
/// (see [`super::Shared`]), with the positions they were made for: a run whose positions equal
/// those reads the table, any other makes it anew.
#[derive(Default)]
pub(crate) struct RopeTable(std::sync::Mutex<RopeMemo>);

#[derive(Default)]
struct RopeMemo {
    positions: Vec<i64>,
    pairs: Vec<(f64, f64)>,
    /// The f64 table's frequencies, base^(-2k/d), made when first needed (the f32 table's
    /// recurrence needs none).
    inv: Vec<f64>,
}

fn rope<T: FloatElem>(
    x: TRef,
    pos: TRef,
    out: TRef,
    theta: f32,
    interleaved: bool,
    table: std::sync::Arc<RopeTable>,
) -> Box<dyn Kernel> {
    let r = x.layout.rank();
    let (s_len, d) = (x.layout.dims()[r - 2], x.layout.dims()[r - 1]);
    let half = d / 2;
    let lines = x.layout.remove_axis(r - 1);
    kernel(move |pool| {
        let sx = x.layout.strides()[r - 1];
        let n = lines.numel();
        let f32_table = T::DTYPE == rlx_ir::DType::F32;
        #[cfg(target_arch = "x86_64")]
        let fma = crate::isa::avx2();
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        // SAFETY: positions has length S.
        let position = |s: usize| unsafe {
            super::index::read_index(&pos, pos.layout.offset + s * pos.layout.strides()[0])
        };
        // The table, made for these positions unless a node sharing it already did this run.
        // For f32 it follows llama.cpp's recurrence in f32 (theta_k = p * s^k with s =
        // base^(-2/d), multiplied step by step), so RLX rotates exactly as llama.cpp does;
        // otherwise f64.
        let mut memo = table.0.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = memo.positions.len() == s_len
            && memo.pairs.len() == s_len * half
            && (0..s_len).all(|s| memo.positions[s] == position(s));
        if !fresh {
            let RopeMemo {
                positions,
                pairs,
                inv,
            } = &mut *memo;
            positions.clear();
            positions.extend((0..s_len).map(position));
            pairs.clear();
            let step = (theta).powf(-2.0 / d as f32);
            if !f32_table && inv.len() != half {
                inv.clear();
                inv.extend((0..half).map(|k| (theta as f64).powf(-2.0 * k as f64 / d as f64)));
            }
            for &p in positions.iter() {
                if f32_table {
                    let mut th = p as f32;
                    pairs.extend((0..half).map(|_| {
                        let e = (th.cos() as f64, th.sin() as f64);
                        th *= step;
                        e
                    }));
                } else {
                    pairs.extend(inv.iter().map(|&inv_k| {
                        let (sin, cos) = (p as f64 * inv_k).sin_cos();
                        (cos, sin)
                    }));
                }
            }
        }
        let tab = &memo.pairs[..];
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
            let sq = info.ins[0].dims()[2];
            let (d, dv) = (info.ins[0].dims()[3], info.ins[2].dims()[3]);
            let f32_scratch = info.threads * f32_scratch_per_thread(sq, sk, d, dv) * 4;
            let half = matches!(dt, rlx_ir::DType::BF16 | rlx_ir::DType::F16);
            let dot = dt == rlx_ir::DType::BF16
                && super::gemm::half::path(super::gemm::half::Half::Bf16)
                    == super::gemm::half::Path::Dot;
            let ins: Vec<&[usize]> = info.ins.iter().map(|s| s.dims()).collect();
            let scratch = match dt {
                rlx_ir::DType::F32 => f32_scratch,
                _ if half => {
                    // The widened path (taken for a strided output too), or the dot kernel's.
                    let wide = widened_parts(&ins, &info.dims).1 + f32_scratch;
                    let dot = if dot {
                        info.threads * bf16_scratch_per_thread(sq, sk, d, dv)
                    } else {
                        0
                    };
                    wide.max(dot)
                }
                _ => info.threads * sk.max(1) * 8,
            };
            Lowered::Compute {
                scratch,
                build: with_float!(dt, T => Box::new(move |i: &[TRef], o: TRef, s| {
                    let m = if mask == MaskKind::Custom {
                        Some(i[3])
                    } else {
                        None
                    };
                    // The GEMM and dot paths write whole output rows: they need a dense last axis.
                    let dense = o.layout.strides()[3] == 1;
                    if dt == rlx_ir::DType::F32 && dense {
                        return attention_f32(i[0], i[1], i[2], m, o, mask, scale, s);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if dot && dense {
                        return attention_bf16(i[0], i[1], i[2], m, o, mask, scale, s);
                    }
                    if half {
                        return attention_widened::<T>(i, o, mask, scale, s);
                    }
                    attention::<T>(i[0], i[1], i[2], m, o, mask, scale, s)
                }) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        Op::Rope { theta, interleaved } => {
            let r = info.ins[0].rank();
            let (s_len, d) = (info.ins[0].dims()[r - 2], info.ins[0].dims()[r - 1]);
            let table = info.shared.rope(RopeKey {
                positions: info.node.inputs[1].index(),
                theta_bits: theta.to_bits(),
                d,
                s_len,
                f32_table: dt == rlx_ir::DType::F32,
            });
            Lowered::Compute {
                scratch: 0,
                build: with_float!(dt, T => Box::new(
                    move |i: &[TRef], o, _| rope::<T>(i[0], i[1], o, theta, interleaved, table),
                ) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        _ => return Err(info.unsupported("not an attention op")),
    })
}
