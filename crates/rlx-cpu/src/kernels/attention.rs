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
            let scratch = info.threads * sk.max(1) * 8;
            Lowered::Compute {
                scratch,
                build: with_float!(dt, T => Box::new(move |i: &[TRef], o, s| {
                    let m = if mask == MaskKind::Custom {
                        Some(i[3])
                    } else {
                        None
                    };
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
