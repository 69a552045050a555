//! The query-blocked kernels: f32 attention through the GEMM (or, for small heads, the
//! register-blocked products of [`super::small`]) and bf16 attention through AVX-512 BF16 dot
//! products ([`super::dot`]).

#[cfg(target_arch = "x86_64")]
use super::dot;
use super::{at4, small, Dims, Keys};
use crate::kernels::{kernel, Kernel, Ptr, TRef};
use rlx_ir::MaskKind;

/// Query rows per task of [`attention_f32`].
const QB: usize = 64;

/// Scratch floats one thread of [`attention_f32`] needs: a block of scores and GEMM buffers,
/// or, for heads of at most [`SMALL_D`], the keys transposed and every query's scores.
pub(super) fn f32_scratch_per_thread(sq: usize, sk: usize, d: usize, dv: usize) -> usize {
    let gemm = QB * sk.max(1) + crate::kernels::gemm::scratch_per_thread(QB, sk.max(dv), sk.max(d));
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
/// transposed once ([`small`]). Same results as [`super::attention`] up to f32 rounding (that one
/// sums in f64).
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_f32(
    q: TRef,
    k: TRef,
    v: TRef,
    mask: Option<TRef>,
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    use crate::kernels::gemm::{sgemm, Mat};
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

/// Query rows per task of [`attention_bf16`].
const QB16: usize = 128;

/// Bytes of scratch one thread of [`attention_bf16`] takes (see [`dot::attend`]).
pub(super) fn bf16_scratch_per_thread(sq: usize, sk: usize, d: usize, dv: usize) -> usize {
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
pub(super) fn attention_bf16(
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
