//! Elementwise kernels: Binary, Compare, Where, Activation, Cast. One strided map engine
//! (`map1`..`map3`) serves every op and dtype; operands broadcast through stride-0 layouts.

use super::{compute, kernel, par_ranges, Kernel, Lowered, NodeInfo, TRef};
use crate::elem::{Bool8, Elem, FloatElem, Real};
use crate::layout::{for_each_run, Layout};
use crate::{with_dtype, with_float};
use rlx_ir::{Activation, BinaryOp, CmpOp, Op, Result};

/// Elements per task below which splitting across threads does not pay.
const MIN_CHUNK: usize = 1 << 15;

fn bcast(x: &TRef, out: &TRef) -> Layout {
    x.layout.broadcast_to(out.layout.dims())
}

/// `out = f(a)` over broadcast operands.
pub fn map1<A: Elem, O: Elem>(
    a: TRef,
    out: TRef,
    f: impl Fn(A) -> O + Copy + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    map1_with(a, out, f, apply1)
}

/// [`map1`] with `dense` applied to the contiguous runs (a vectorized form of `f`).
fn map1_with<A: Elem, O: Elem, F: Fn(A) -> O + Copy + Send + Sync + 'static>(
    a: TRef,
    out: TRef,
    f: F,
    dense: fn(&[A], &mut [O], F),
) -> Box<dyn Kernel> {
    let la = bcast(&a, &out);
    kernel(move |pool| {
        par_ranges(pool, out.layout.numel(), MIN_CHUNK, |r| {
            let (pa, po) = (a.base::<A>() as *const A, out.base::<O>());
            for_each_run(
                out.layout.dims(),
                [&out.layout, &la],
                r,
                |[o, i], n, [so, si]| unsafe {
                    // SAFETY: offsets come from layouts inside the planned buffers.
                    if so == 1 && si == 1 {
                        let src = std::slice::from_raw_parts(pa.add(i), n);
                        let dst = std::slice::from_raw_parts_mut(po.add(o), n);
                        dense(src, dst, f);
                    } else {
                        for k in 0..n {
                            *po.add(o + k * so) = f(*pa.add(i + k * si));
                        }
                    }
                },
            )
        })
    })
}

/// `dst[i] = f(src[i])`, compiled with AVX2 and FMA when the CPU has them: the closures' math
/// (`exp_f32` and friends) uses fused multiply-adds, which are library calls otherwise.
#[inline(always)]
fn apply1<A: Elem, O: Elem>(src: &[A], dst: &mut [O], f: impl Fn(A) -> O) {
    #[inline(always)]
    fn plain<A: Elem, O: Elem>(src: &[A], dst: &mut [O], f: impl Fn(A) -> O) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f(*s);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma<A: Elem, O: Elem>(src: &[A], dst: &mut [O], f: impl Fn(A) -> O) {
            plain(src, dst, f)
        }
        if crate::isa::avx2() {
            // SAFETY: the CPU has the features.
            return unsafe { fma(src, dst, f) };
        }
    }
    plain(src, dst, f)
}

/// One run of [`map2`]: `out[k*so] = f(a[k*sa], b[k*sb])` for `k < n`, with the dense and
/// one-side-broadcast cases as plain slice loops, compiled with AVX2 and FMA where the CPU has
/// them (so LLVM vectorizes them 8 lanes wide).
///
/// # Safety
/// The three strided ranges are valid for `n` elements.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn apply2<A: Elem, B: Elem, O: Elem>(
    a: *const A,
    sa: usize,
    b: *const B,
    sb: usize,
    o: *mut O,
    so: usize,
    n: usize,
    f: impl Fn(A, B) -> O,
) {
    #[inline(always)]
    unsafe fn plain<A: Elem, B: Elem, O: Elem>(
        a: *const A,
        sa: usize,
        b: *const B,
        sb: usize,
        o: *mut O,
        so: usize,
        n: usize,
        f: impl Fn(A, B) -> O,
    ) {
        if so == 1 && sa == 1 && sb == 1 {
            let (x, y, d) = (
                std::slice::from_raw_parts(a, n),
                std::slice::from_raw_parts(b, n),
                std::slice::from_raw_parts_mut(o, n),
            );
            for ((d, x), y) in d.iter_mut().zip(x).zip(y) {
                *d = f(*x, *y);
            }
        } else if so == 1 && sa == 1 && sb == 0 {
            let (x, y, d) = (
                std::slice::from_raw_parts(a, n),
                *b,
                std::slice::from_raw_parts_mut(o, n),
            );
            for (d, x) in d.iter_mut().zip(x) {
                *d = f(*x, y);
            }
        } else if so == 1 && sa == 0 && sb == 1 {
            let (x, y, d) = (
                *a,
                std::slice::from_raw_parts(b, n),
                std::slice::from_raw_parts_mut(o, n),
            );
            for (d, y) in d.iter_mut().zip(y) {
                *d = f(x, *y);
            }
        } else {
            for k in 0..n {
                *o.add(k * so) = f(*a.add(k * sa), *b.add(k * sb));
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma<A: Elem, B: Elem, O: Elem>(
            a: *const A,
            sa: usize,
            b: *const B,
            sb: usize,
            o: *mut O,
            so: usize,
            n: usize,
            f: impl Fn(A, B) -> O,
        ) {
            plain(a, sa, b, sb, o, so, n, f)
        }
        if crate::isa::avx2() {
            return fma(a, sa, b, sb, o, so, n, f);
        }
    }
    plain(a, sa, b, sb, o, so, n, f)
}

/// `out = f(a, b)` over broadcast operands.
pub fn map2<A: Elem, B: Elem, O: Elem>(
    a: TRef,
    b: TRef,
    out: TRef,
    f: impl Fn(A, B) -> O + Copy + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    let (la, lb) = (bcast(&a, &out), bcast(&b, &out));
    kernel(move |pool| {
        par_ranges(pool, out.layout.numel(), MIN_CHUNK, |r| {
            let (pa, pb, po) = (
                a.base::<A>() as *const A,
                b.base::<B>() as *const B,
                out.base::<O>(),
            );
            for_each_run(
                out.layout.dims(),
                [&out.layout, &la, &lb],
                r,
                |[o, i, j], n, [so, si, sj]| unsafe {
                    // SAFETY: offsets come from layouts inside the planned buffers.
                    apply2(pa.add(i), si, pb.add(j), sj, po.add(o), so, n, f)
                },
            )
        })
    })
}

/// One dense run of [`map3`], `o[k] = f(a[k], b[k], c[k])`, compiled with AVX2 where the CPU
/// has it (so a select becomes a vector blend).
///
/// # Safety
/// The four ranges hold `n` elements each.
#[inline(always)]
unsafe fn apply3<A: Elem, B: Elem, C: Elem, O: Elem>(
    a: *const A,
    b: *const B,
    c: *const C,
    o: *mut O,
    n: usize,
    f: impl Fn(A, B, C) -> O,
) {
    #[inline(always)]
    unsafe fn plain<A: Elem, B: Elem, C: Elem, O: Elem>(
        a: *const A,
        b: *const B,
        c: *const C,
        o: *mut O,
        n: usize,
        f: impl Fn(A, B, C) -> O,
    ) {
        for k in 0..n {
            *o.add(k) = f(*a.add(k), *b.add(k), *c.add(k));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma<A: Elem, B: Elem, C: Elem, O: Elem>(
            a: *const A,
            b: *const B,
            c: *const C,
            o: *mut O,
            n: usize,
            f: impl Fn(A, B, C) -> O,
        ) {
            plain(a, b, c, o, n, f)
        }
        if crate::isa::avx2() {
            return fma(a, b, c, o, n, f);
        }
    }
    plain(a, b, c, o, n, f)
}

/// `out = f(a, b, c)` over broadcast operands.
pub fn map3<A: Elem, B: Elem, C: Elem, O: Elem>(
    a: TRef,
    b: TRef,
    c: TRef,
    out: TRef,
    f: impl Fn(A, B, C) -> O + Copy + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    let (la, lb, lc) = (bcast(&a, &out), bcast(&b, &out), bcast(&c, &out));
    kernel(move |pool| {
        par_ranges(pool, out.layout.numel(), MIN_CHUNK, |r| {
            let (pa, pb, pc, po) = (
                a.base::<A>() as *const A,
                b.base::<B>() as *const B,
                c.base::<C>() as *const C,
                out.base::<O>(),
            );
            for_each_run(
                out.layout.dims(),
                [&out.layout, &la, &lb, &lc],
                r,
                |[o, i, j, l], n, [so, si, sj, sl]| {
                    if (so, si, sj, sl) == (1, 1, 1, 1) {
                        // SAFETY: four dense runs of `n` elements inside the planned buffers (the
                        // output may alias an operand exactly, which a slice loop reads before it
                        // writes each element).
                        unsafe { apply3(pa.add(i), pb.add(j), pc.add(l), po.add(o), n, f) };
                        return;
                    }
                    for k in 0..n {
                        // SAFETY: offsets come from layouts inside the planned buffers.
                        unsafe {
                            *po.add(o + k * so) = f(
                                *pa.add(i + k * si),
                                *pb.add(j + k * sj),
                                *pc.add(l + k * sl),
                            )
                        };
                    }
                },
            )
        })
    })
}

fn binary<T: Elem>(op: BinaryOp, a: TRef, b: TRef, out: TRef) -> Box<dyn Kernel> {
    match op {
        BinaryOp::Add => map2(a, b, out, |x: T, y: T| x.add(y)),
        BinaryOp::Sub => map2(a, b, out, |x: T, y: T| x.sub(y)),
        BinaryOp::Mul => map2(a, b, out, |x: T, y: T| x.mul(y)),
        BinaryOp::Div => map2(a, b, out, |x: T, y: T| x.div(y)),
        BinaryOp::Max => map2(a, b, out, |x: T, y: T| x.max_of(y)),
        BinaryOp::Min => map2(a, b, out, |x: T, y: T| x.min_of(y)),
        BinaryOp::Pow => unreachable!("pow is dispatched on float dtypes"),
    }
}

fn pow<T: FloatElem>(a: TRef, b: TRef, out: TRef) -> Box<dyn Kernel> {
    map2(a, b, out, |x: T, y: T| T::from_c(x.to_c().powf(y.to_c())))
}

fn compare<T: Elem>(op: CmpOp, a: TRef, b: TRef, out: TRef) -> Box<dyn Kernel> {
    match op {
        CmpOp::Eq => map2(a, b, out, |x: T, y: T| Bool8((x == y) as u8)),
        CmpOp::Ne => map2(a, b, out, |x: T, y: T| Bool8((x != y) as u8)),
        CmpOp::Lt => map2(a, b, out, |x: T, y: T| Bool8((x < y) as u8)),
        CmpOp::Le => map2(a, b, out, |x: T, y: T| Bool8((x <= y) as u8)),
        CmpOp::Gt => map2(a, b, out, |x: T, y: T| Bool8((x > y) as u8)),
        CmpOp::Ge => map2(a, b, out, |x: T, y: T| Bool8((x >= y) as u8)),
    }
}

/// Bind `$f` to the function of activation `$a` over the real type `$R`, then evaluate `$body`.
/// The formulas live here once; the plain kernels and the fused kernels both use them.
#[macro_export]
#[doc(hidden)]
macro_rules! with_float_fn {
    ($a:expr, $R:ty, $f:ident => $body:expr) => {{
        use $crate::elem::Real as R;
        let c = |v: f64| <$R as R>::c(v);
        let (half, one, zero) = (c(0.5), c(1.0), c(0.0));
        let inv_sqrt2 = c(std::f64::consts::FRAC_1_SQRT_2);
        let (k1, k2) = (c(0.044715), c(-2.0 * (2.0 / std::f64::consts::PI).sqrt()));
        let k3 = c(3.0 * 0.044715 * 2.0 * (2.0 / std::f64::consts::PI).sqrt());
        let _ = (half, one, zero, inv_sqrt2, k1, k2, k3);
        $crate::with_float_fn!(@arms $a, $R, $f, $body,
            // Trait paths, not methods: on f32 the inherent methods would bypass RLX's SIMD math.
            Gelu => |v| half * v * (one + R::erf(v * inv_sqrt2)),
            // x (1 + tanh(u)) / 2 written as x sigmoid(2u): one exp and one division, no tanh.
            // The exponential's argument is clamped to [-86, 88] (`exp_fast`): beyond it the
            // result is still x for large x, and x * ~6e-39 instead of -0 for very negative x
            // (-inf instead of NaN at -inf).
            GeluApprox => |v| v / (one + R::exp_fast(k2 * (v + k1 * v * v * v))),
            // Its derivative s + x s (1 - s) (k0 + k3 x^2), s = sigmoid(2u) (k0 = -k2).
            GeluApproxGrad => |v| {
                let x2 = v * v;
                let s = one / (one + R::exp_fast(k2 * (v + k1 * x2 * v)));
                s + v * s * (one - s) * (k3 * x2 - k2)
            },
            Silu => |v| v / (one + R::exp(-v)),
            Relu => |v| if v > zero { v } else { zero },
            Sigmoid => |v| one / (one + R::exp(-v)),
            Tanh => |v| R::tanh(v),
            Exp => |v| R::exp(v),
            Log => |v| R::ln(v),
            Sqrt => |v| R::sqrt(v),
            Rsqrt => |v| one / R::sqrt(v),
            Neg => |v| -v,
            Abs => |v| R::abs(v),
            Sin => |v| R::sin(v),
            Cos => |v| R::cos(v),
            Tan => |v| R::tan(v),
            Atan => |v| R::atan(v),
            Round => |v| R::round_even(v),
            Erf => |v| R::erf(v),
        )
    }};
    (@arms $a:expr, $R:ty, $f:ident, $body:expr, $($arm:ident => |$v:ident| $e:expr),* $(,)?) => {
        match $a {
            $(rlx_ir::Activation::$arm => {
                let $f = move |$v: $R| -> $R { $e };
                $body
            })*
        }
    };
}

fn activation_float<T: FloatElem>(a: Activation, x: TRef, out: TRef) -> Box<dyn Kernel> {
    crate::with_float_fn!(a, T::C, f => map1(x, out, move |s: T| T::from_c(f(s.to_c()))))
}

/// GELU (tanh form) of every f16 value, rounded to f16: f16 GeluApprox is a lookup. The f32
/// arithmetic is llama.cpp's (`(x/2) * (1 + tanh((sqrt(2/pi) x) * (0.044715 x * x + 1)))` with
/// that inner multiply-add fused, libm `tanhf`), so the table equals the one llama.cpp applies
/// to its activations — which RLX's Gemma graphs reproduce by rounding the gate to f16.
fn gelu_f16_table() -> &'static [u16; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[u16; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt() as f32;
        const A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                let y = (0.5 * x) * (1.0 + ((sqrt_2_over_pi * x) * (A * x).mul_add(x, 1.0)).tanh());
                half::f16::from_f32(y).to_bits()
            })
            .collect::<Vec<u16>>()
            .try_into()
            .expect("one value per f16")
    })
}

/// The activations defined on integers (`Activation::allows_int`).
#[derive(Clone, Copy)]
enum IntAct {
    Neg,
    Abs,
    Relu,
}

impl IntAct {
    fn of(a: Activation) -> Option<IntAct> {
        match a {
            Activation::Neg => Some(IntAct::Neg),
            Activation::Abs => Some(IntAct::Abs),
            Activation::Relu => Some(IntAct::Relu),
            Activation::Gelu
            | Activation::GeluApprox
            | Activation::GeluApproxGrad
            | Activation::Silu
            | Activation::Sigmoid
            | Activation::Tanh
            | Activation::Exp
            | Activation::Log
            | Activation::Sqrt
            | Activation::Rsqrt
            | Activation::Sin
            | Activation::Cos
            | Activation::Tan
            | Activation::Atan
            | Activation::Round
            | Activation::Erf => None,
        }
    }
}

fn activation_int<T: Elem>(a: IntAct, x: TRef, out: TRef) -> Box<dyn Kernel> {
    match a {
        IntAct::Neg => map1(x, out, |v: T| T::zero().sub(v)),
        IntAct::Abs => map1(
            x,
            out,
            |v: T| if v < T::zero() { T::zero().sub(v) } else { v },
        ),
        IntAct::Relu => map1(x, out, |v: T| v.max_of(T::zero())),
    }
}

/// f32 → f16 (round to nearest even) on dense runs, 8 at a time with F16C where the CPU has it.
fn f32_to_f16(src: &[f32], dst: &mut [half::f16], f: fn(f32) -> half::f16) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        #[target_feature(enable = "avx,f16c")]
        unsafe fn simd(src: &[f32], dst: &mut [half::f16]) -> usize {
            use std::arch::x86_64::*;
            let n = src.len() / 8 * 8;
            for i in (0..n).step_by(8) {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(
                    src.as_ptr().add(i),
                ));
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            n
        }
        // SAFETY: the CPU has the features; the slices have equal lengths.
        done = unsafe { simd(src, dst) };
    }
    for (d, s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f(*s);
    }
}

/// f16 → f32 (exact) on dense runs, 8 at a time with F16C where the CPU has it.
pub(super) fn f16_to_f32(src: &[half::f16], dst: &mut [f32], f: fn(half::f16) -> f32) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        #[target_feature(enable = "avx,f16c")]
        unsafe fn simd(src: &[half::f16], dst: &mut [f32]) -> usize {
            use std::arch::x86_64::*;
            let n = src.len() / 8 * 8;
            for i in (0..n).step_by(8) {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            n
        }
        // SAFETY: the CPU has the features; the slices have equal lengths.
        done = unsafe { simd(src, dst) };
    }
    for (d, s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f(*s);
    }
}

/// f32 → i8 as Rust's `as` converts (toward zero, saturating, NaN to 0) on dense runs, 16 at a
/// time with AVX-512: clamped to [-128, 127] first, so the truncating conversion cannot
/// overflow, and NaN lanes zeroed.
fn f32_to_i8(src: &[f32], dst: &mut [i8], f: fn(f32) -> i8) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx512() {
        #[target_feature(enable = "avx512f")]
        unsafe fn simd(src: &[f32], dst: &mut [i8]) -> usize {
            use std::arch::x86_64::*;
            let n = src.len() / 16 * 16;
            let (lo, hi) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
            for i in (0..n).step_by(16) {
                // SAFETY: 16 values from `i < n` in both slices.
                unsafe {
                    let v = _mm512_loadu_ps(src.as_ptr().add(i));
                    let num = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
                    let c = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                    let q = _mm512_maskz_mov_epi32(num, _mm512_cvttps_epi32(c));
                    _mm_storeu_si128(
                        dst.as_mut_ptr().add(i) as *mut __m128i,
                        _mm512_cvtepi32_epi8(q),
                    );
                }
            }
            n
        }
        // SAFETY: the CPU has AVX-512 F; the slices have equal lengths.
        done = unsafe { simd(src, dst) };
    }
    for (d, s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f(*s);
    }
}

/// `x` rounded to bf16 (nearest even; a NaN stays a quiet NaN), as bits, without branches.
#[inline(always)]
pub(super) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if x.is_nan() { nan } else { rounded }) as u16
}

fn cast<A: Elem, O: Elem>(x: TRef, out: TRef) -> Box<dyn Kernel> {
    let ints = |d: rlx_ir::DType| d.is_int() || d == rlx_ir::DType::Bool;
    if ints(A::DTYPE) && ints(O::DTYPE) {
        map1(x, out, |v: A| O::from_i64(v.to_i64()))
    } else if O::DTYPE == rlx_ir::DType::Bool {
        map1(x, out, |v: A| O::from_f64((v.to_f64() != 0.0) as u8 as f64))
    } else {
        map1(x, out, |v: A| O::from_f64(v.to_f64()))
    }
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.in_dtypes[0];
    let out_dt = info.dtype();
    let no = |what: &str| info.unsupported(format!("{what} is not supported for dtype {dt}"));
    let op = info.node.op.clone();
    // Check the dtype is handled now, so the build closure cannot fail later.
    let handled = with_dtype!(dt, T => { let _ = std::marker::PhantomData::<T>; true }, else false)
        && with_dtype!(out_dt, T => { let _ = std::marker::PhantomData::<T>; true }, else false);
    if !handled {
        return Err(no(op.name()));
    }
    Ok(match op {
        Op::Binary(BinaryOp::Pow) => {
            with_float!(dt, T => compute(move |i, o| pow::<T>(i[0], i[1], o)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::Binary(b) => {
            with_dtype!(dt, T => compute(move |i, o| binary::<T>(b, i[0], i[1], o)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::Compare(c) => {
            with_dtype!(dt, T => compute(move |i, o| compare::<T>(c, i[0], i[1], o)), else return Err(info.unsupported(format!("dtype {}", dt))))
        }
        Op::Where => {
            let vt = info.in_dtypes[1];
            with_dtype!(vt, T => compute(move |i, o| map3(i[0], i[1], i[2], o, |c: Bool8, x: T, y: T| if c.0 != 0 { x } else { y })), else return Err(info.unsupported(format!("dtype {}", vt))))
        }
        // The table is made when a kernel first runs, not when one is built: a compile (of a
        // graph that may never run) does not pay for it.
        Op::Activation(Activation::GeluApprox) if dt == rlx_ir::DType::F16 => compute(|i, o| {
            map1(i[0], o, |v: half::f16| {
                half::f16::from_bits(gelu_f16_table()[v.to_bits() as usize])
            })
        }),
        Op::Activation(a) => {
            with_float!(dt, T => compute(move |i, o| activation_float::<T>(a, i[0], o)),
            else {
                let Some(ia) = IntAct::of(a) else {
                    return Err(info.unsupported(format!("{a:?} on {dt}: integers take neg, abs and relu")));
                };
                with_dtype!(dt, T => compute(move |i, o| activation_int::<T>(ia, i[0], o)), else return Err(info.unsupported(format!("dtype {dt}"))))
            })
        }
        Op::Cast {
            to: rlx_ir::DType::I8,
        } if dt == rlx_ir::DType::F32 => {
            compute(|i, o| map1_with(i[0], o, (|v: f32| v as i8) as fn(f32) -> i8, f32_to_i8))
        }
        Op::Cast {
            to: rlx_ir::DType::F16,
        } if dt == rlx_ir::DType::F32 => compute(|i, o| {
            map1_with(
                i[0],
                o,
                half::f16::from_f32 as fn(f32) -> half::f16,
                f32_to_f16,
            )
        }),
        Op::Cast {
            to: rlx_ir::DType::F32,
        } if dt == rlx_ir::DType::F16 => compute(|i, o| {
            map1_with(
                i[0],
                o,
                half::f16::to_f32 as fn(half::f16) -> f32,
                f16_to_f32,
            )
        }),
        // bf16 casts as branch-free integer code (round to nearest even, NaN kept quiet), which
        // the compiler vectorizes: through f64 they cost ~10x more.
        Op::Cast {
            to: rlx_ir::DType::BF16,
        } if dt == rlx_ir::DType::F32 => {
            compute(|i, o| map1(i[0], o, |v: f32| half::bf16::from_bits(bf16_bits(v))))
        }
        Op::Cast {
            to: rlx_ir::DType::F32,
        } if dt == rlx_ir::DType::BF16 => compute(|i, o| {
            map1(i[0], o, |v: half::bf16| {
                f32::from_bits((v.to_bits() as u32) << 16)
            })
        }),
        Op::Cast { to } => {
            with_dtype!(dt, A => with_dtype!(to, B => compute(move |i, o| cast::<A, B>(i[0], o)),
            else return Err(info.unsupported(format!("cast to {to}")))), else return Err(info.unsupported(format!("dtype {dt}"))))
        }
        _ => return Err(info.unsupported("not an elementwise op")),
    })
}

/// Dense copy of a strided value of any dtype (used by reshape and concat).
pub(super) fn copy(x: TRef, out: TRef) -> Box<dyn Kernel> {
    let w = x.dtype.size_bytes();
    match w {
        1 => map1(x, out, |v: u8| v),
        2 => map1(x, out, |v: i16| v),
        4 => map1(x, out, |v: i32| v),
        8 => map1(x, out, |v: i64| v),
        // Any other width: element by element, as bytes.
        w => kernel(move |_| {
            let n = out.layout.numel() * w;
            // SAFETY: the output is a fresh contiguous buffer of `n` bytes from its offset.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.ptr.get().add(out.layout.offset * w), n)
            };
            super::materialize(&x, dst);
        }),
    }
}

#[cfg(test)]
mod tests {
    /// The vector f32 → i8 conversion is Rust's `as` on every value that matters: NaN,
    /// infinities, values past either end, halves and values just inside the ends, at every
    /// position of a 16-lane block and in the scalar tail.
    #[test]
    fn f32_to_i8_is_as() {
        let special = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e10,
            -1e10,
            3e9,
            -3e9,
            127.0,
            127.99,
            128.0,
            -128.0,
            -128.99,
            -129.0,
            0.5,
            -0.5,
            -0.0,
            1.5,
            -1.5,
            2.5e-40,
            f32::MAX,
            f32::MIN,
        ];
        let src: Vec<f32> = (0..16 * 5 + 7)
            .map(|i| {
                special[(i * 7) % special.len()]
                    * if i % 3 == 0 {
                        1.0
                    } else {
                        1.0 + i as f32 * 0.01
                    }
            })
            .collect();
        let mut dst = vec![0i8; src.len()];
        let f = (|v: f32| v as i8) as fn(f32) -> i8;
        super::f32_to_i8(&src, &mut dst, f);
        for (s, d) in src.iter().zip(&dst) {
            assert_eq!(*d, *s as i8, "{s}");
        }
    }
}
