//! The int8 integer ops (`qlinear`, `qconv2d`, `qadd`, `qpool`; `rlx_ir::ops::qint`), bit for
//! bit as the reference evaluator computes them: products summed exactly in `i32`, then the
//! fixed-point requantization of `rlx_ir::quant::fixed`.
//!
//! The products take the input less its zero point as `i16` (exact: `[-255, 255]`) against the
//! `i8` weights widened to `i16`, in pairs summed to `i32` (x86's `pmaddwd`; `vpdpwssd` where
//! AVX-512 VNNI is present), 32 or 64 lanes at a time. A convolution gathers each output
//! position's window into such a row first (padding as zero, which the zero point makes it).
//! Work is split over output channels for one row and over rows for several.

use super::registered::{view, CpuKernel};
use super::{par_ranges, Ptr};
use crate::pool::Pool;
use rlx_ir::ops::{pool_window, DefinedOp, QAdd, QConv2d, QLinear, QOut, QPool};
use rlx_ir::quant::fixed;
use rlx_ir::Shape;
use std::sync::Arc;

pub(super) fn kernel_of(op: &DefinedOp) -> Option<CpuKernel> {
    if let Some(&q) = op.downcast::<QLinear>() {
        return Some(Arc::new(move |_, ins, out, _, pool| {
            qlinear(q, ins, out, pool)
        }));
    }
    if let Some(&q) = op.downcast::<QConv2d>() {
        return Some(Arc::new(move |_, ins, out, shape, pool| {
            qconv2d(q, ins, out, shape, pool)
        }));
    }
    if let Some(&q) = op.downcast::<QAdd>() {
        return Some(Arc::new(move |_, ins, out, _, pool| {
            let (a, b) = (view::<i8>(ins[0].0), view::<i8>(ins[1].0));
            let o = Ptr(out.as_mut_ptr());
            par_ranges(pool, out.len(), 1 << 14, |r| {
                for i in r {
                    // SAFETY: `i` is within the result; ranges are disjoint.
                    unsafe { *o.get().add(i) = q.apply(a[i] as i32, b[i] as i32) as i8 as u8 };
                }
            });
        }));
    }
    if let Some(&q) = op.downcast::<QPool>() {
        return Some(Arc::new(move |_, ins, out, shape, pool| {
            qpool(q, ins, out, shape, pool)
        }));
    }
    None
}

/// A product of an `i16` row and an `i8` row of one length, exactly in `i32`.
type Dot = fn(&[i16], &[i8]) -> i32;

/// The best product this thread's instruction-set level allows.
fn dot_fn() -> Dot {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::avx512() && std::is_x86_feature_detected!("avx512bw") {
            if std::is_x86_feature_detected!("avx512vnni") {
                // SAFETY: AVX-512 F, BW and VNNI are present.
                return |a, b| unsafe { dot_vnni(a, b) };
            }
            // SAFETY: AVX-512 F and BW are present.
            return |a, b| unsafe { dot_avx512(a, b) };
        }
        if crate::isa::avx2() {
            // SAFETY: AVX2 is present.
            return |a, b| unsafe { dot_avx2(a, b) };
        }
    }
    dot_scalar
}

fn dot_scalar(a: &[i16], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .fold(0i32, |s, (&x, &w)| s.wrapping_add(x as i32 * w as i32))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[i16], b: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 i16 and 16 i8 in bounds.
        let x = unsafe { _mm256_loadu_si256(a.as_ptr().add(i) as *const __m256i) };
        let w =
            _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(b.as_ptr().add(i) as *const __m128i) });
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, w));
        i += 16;
    }
    let mut lanes = [0i32; 8];
    // SAFETY: 8 i32 fit.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc) };
    lanes
        .iter()
        .fold(0i32, |s, &v| s.wrapping_add(v))
        .wrapping_add(dot_scalar(&a[i..n], &b[i..n]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_vnni(a: &[i16], b: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 32 i16 and 32 i8 in bounds.
        let x = unsafe { _mm512_loadu_si512(a.as_ptr().add(i) as *const __m512i) };
        let w = _mm512_cvtepi8_epi16(unsafe {
            _mm256_loadu_si256(b.as_ptr().add(i) as *const __m256i)
        });
        acc = _mm512_dpwssd_epi32(acc, x, w);
        i += 32;
    }
    _mm512_reduce_add_epi32(acc).wrapping_add(dot_scalar(&a[i..n], &b[i..n]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot_avx512(a: &[i16], b: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 32 i16 and 32 i8 in bounds.
        let x = unsafe { _mm512_loadu_si512(a.as_ptr().add(i) as *const __m512i) };
        let w = _mm512_cvtepi8_epi16(unsafe {
            _mm256_loadu_si256(b.as_ptr().add(i) as *const __m256i)
        });
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(x, w));
        i += 32;
    }
    _mm512_reduce_add_epi32(acc).wrapping_add(dot_scalar(&a[i..n], &b[i..n]))
}

/// Per output channel: `(bias, multiplier, shift)`.
fn channels(ins: &[(&[u8], &Shape)]) -> Vec<(i32, i32, i32)> {
    let (b, m, s) = (
        view::<i32>(ins[2].0),
        view::<i32>(ins[3].0),
        view::<i32>(ins[4].0),
    );
    b.iter()
        .zip(m.iter())
        .zip(s.iter())
        .map(|((&b, &m), &s)| (b, m, s))
        .collect()
}

#[inline]
fn requant(acc: i32, (_, m, s): (i32, i32, i32), out: QOut) -> u8 {
    fixed::requantize(acc, m, s, out.zero_point, out.lo, out.hi) as i8 as u8
}

/// `x - zp` as `i16`.
fn centred(x: &[i8], zp: i32, dst: &mut [i16]) {
    for (d, &v) in dst.iter_mut().zip(x) {
        *d = (v as i32 - zp) as i16;
    }
}

fn qlinear(q: QLinear, ins: &[(&[u8], &Shape)], out: &mut [u8], pool: &Pool) {
    let x = view::<i8>(ins[0].0);
    let w = view::<i8>(ins[1].0);
    let ch = channels(ins);
    let n = ch.len();
    let k = ins[1].1.static_dims().map_or(0, |d| d[1]);
    if n == 0 {
        return;
    }
    let rows = out.len() / n;
    let mut xc = vec![0i16; rows * k];
    centred(&x, q.x_zero_point, &mut xc);
    let o = Ptr(out.as_mut_ptr());
    let dot = dot_fn();
    let one = |r: usize, c: usize| {
        let acc = dot(&xc[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]).wrapping_add(ch[c].0);
        // SAFETY: `r * n + c` is within the result; tasks write disjoint elements.
        unsafe { *o.get().add(r * n + c) = requant(acc, ch[c], q.out) };
    };
    if rows == 1 {
        par_ranges(pool, n, (4096 / k.max(1)).max(8), |cs| {
            cs.for_each(|c| one(0, c))
        });
    } else {
        par_ranges(pool, rows, (4096 / (n * k).max(1)).max(1), |rs| {
            for r in rs {
                (0..n).for_each(|c| one(r, c));
            }
        });
    }
}

fn qconv2d(q: QConv2d, ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape, pool: &Pool) {
    let x = view::<i8>(ins[0].0);
    let w = view::<i8>(ins[1].0);
    let ch = channels(ins);
    let (Some(xd), Some(wd), Some(od)) = (
        ins[0].1.static_dims(),
        ins[1].1.static_dims(),
        shape.static_dims(),
    ) else {
        return;
    };
    let (c, h, wi) = (xd[1], xd[2], xd[3]);
    let (o, kh, kw) = (wd[0], wd[2], wd[3]);
    let (ho, wo) = (od[2], od[3]);
    let k = c * kh * kw;
    let positions = od[0] * ho * wo;
    let out_ptr = Ptr(out.as_mut_ptr());
    let dot = dot_fn();
    par_ranges(pool, positions, (2048 / (o * k).max(1)).max(1), |ps| {
        let mut row = vec![0i16; k];
        for p in ps {
            let (b, oy, ox) = (p / (ho * wo), (p / wo) % ho, p % wo);
            // The window of (x - zp), zero where it is padding.
            for ci in 0..c {
                for ky in 0..kh {
                    let iy = (oy * q.stride[0] + ky) as isize - q.padding[0].0 as isize;
                    for kx in 0..kw {
                        let ix = (ox * q.stride[1] + kx) as isize - q.padding[1].0 as isize;
                        let inside = iy >= 0 && iy < h as isize && ix >= 0 && ix < wi as isize;
                        row[(ci * kh + ky) * kw + kx] = if inside {
                            let v = x[((b * c + ci) * h + iy as usize) * wi + ix as usize];
                            (v as i32 - q.x_zero_point) as i16
                        } else {
                            0
                        };
                    }
                }
            }
            for (oc, &cp) in ch.iter().enumerate().take(o) {
                let acc = dot(&row, &w[oc * k..(oc + 1) * k]).wrapping_add(cp.0);
                let at = ((b * o + oc) * ho + oy) * wo + ox;
                // SAFETY: within the result; each position is one task's.
                unsafe { *out_ptr.get().add(at) = requant(acc, cp, q.out) };
            }
        }
    });
}

fn qpool(q: QPool, ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape, pool: &Pool) {
    let x = view::<i8>(ins[0].0);
    let (Some(xd), Some(od)) = (ins[0].1.static_dims(), shape.static_dims()) else {
        return;
    };
    let (h, w) = (xd[2], xd[3]);
    let (ho, wo) = (od[2], od[3]);
    let o = Ptr(out.as_mut_ptr());
    par_ranges(pool, xd[0] * xd[1], 64, |planes| {
        for p in planes {
            let xp = &x[p * h * w..(p + 1) * h * w];
            for oy in 0..ho {
                let ys = pool_window(oy, q.stride[0], q.padding[0].0, q.kernel[0], h);
                for ox in 0..wo {
                    let xs = pool_window(ox, q.stride[1], q.padding[1].0, q.kernel[1], w);
                    let vals = ys
                        .clone()
                        .flat_map(|iy| xs.clone().map(move |ix| xp[iy * w + ix] as i32));
                    // SAFETY: within the result; planes are disjoint.
                    unsafe { *o.get().add((p * ho + oy) * wo + ox) = q.reduce(vals) as i8 as u8 };
                }
            }
        }
    });
}
