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

/// Scratch floats one thread of [`attention_f32`] needs: a block of scores and GEMM buffers.
fn f32_scratch_per_thread(sk: usize, d: usize, dv: usize) -> usize {
    QB * sk.max(1) + super::gemm::scratch_per_thread(QB, sk.max(dv), sk.max(d))
}

/// f32 attention through the GEMM: each task takes one (batch, head) and a block of up to
/// [`QB`] queries, computes the block's scores against the keys it may see with one product,
/// scales and masks them, takes each row's softmax and multiplies by V with a second product.
/// Operands are read through their strides (no copies); the output's last axis must be dense.
/// Same results as [`attention`] up to f32 rounding (that one sums in f64).
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
    let per_thread = f32_scratch_per_thread(sk, d, dv);
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
    kernel(move |pool| {
        let blocks = sq.div_ceil(QB);
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        pool.run(b * hq * blocks, &|task, th| unsafe {
            // SAFETY: pointers come from the operands' layouts; each thread owns `per_thread`
            // scratch floats; each task writes the output rows of its own (batch, head, block).
            let (bh, blk) = (task / blocks, task % blocks);
            let (bi, h) = (bh / hq, bh % hq);
            let kh = h / group;
            let (i0, i1) = (blk * QB, ((blk + 1) * QB).min(sq));
            let qb = i1 - i0;
            let (lo0, _) = visible(i0 as isize + off);
            let (_, hi1) = visible(i1 as isize - 1 + off);
            let (c0, ncol) = (lo0.min(hi1), hi1.saturating_sub(lo0));
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
                let (lo, hi) = visible((i0 + i) as isize + off);
                let (lo, hi) = (lo.max(c0) - c0, hi.max(c0) - c0);
                if let (Some(m), Some(l)) = (&mask, &ml) {
                    // The query's mask row (a key-padding mask is one row for all queries).
                    let pm = (m.base::<f32>() as *const f32).add(at4(l, [bi, h, i0 + i, c0]));
                    let js = l.strides()[3];
                    if js == 1 {
                        let mrow = std::slice::from_raw_parts(pm, hi);
                        for (s, mv) in row[lo..hi].iter_mut().zip(&mrow[lo..hi]) {
                            *s = *s * scale + *mv;
                        }
                    } else {
                        for (j, s) in row.iter_mut().enumerate().take(hi).skip(lo) {
                            *s = *s * scale + *pm.add(j * js);
                        }
                    }
                    if hi > lo {
                        crate::math::scaled_softmax_in_place(&mut row[lo..hi], 1.0);
                    }
                } else if hi > lo {
                    crate::math::scaled_softmax_in_place(&mut row[lo..hi], scale);
                }
                row[..lo].fill(0.0);
                row[hi..].fill(0.0);
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
                info.threads * f32_scratch_per_thread(sk, d, dv) * 4
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
