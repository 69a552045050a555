//! Vectorizable f32 math. Plain Rust over arrays and slices, written so LLVM turns each loop
//! into SIMD code: no branches in the element path, rounding by the 1.5·2²³ trick.

/// `e^x` for f32, within 2 ulp of the correctly rounded result; 0 far below -87 and +inf above
/// 88.73; NaN stays NaN. Branch-free so loops over it vectorize.
///
/// The algorithm and its coefficients are those of llama.cpp's vectorized `expf` (itself from
/// Arm's optimized-routines): `n = round(x / ln 2)`, `b = x - n ln 2` with ln 2 split in two,
/// a degree-5 minimax polynomial in `b` evaluated with fused multiply-adds in a fixed order,
/// and `2^n` applied with a single rounding. Using the same operations in the same order makes
/// every result bit-identical to llama.cpp's, which keeps SiLU and softmax — and so whole LLM
/// logits — equal to its outputs rather than merely close. `mul_add` is an exact fused
/// multiply-add everywhere (a library call where the CPU has no FMA), so the results do not
/// depend on the instruction set; hot loops are compiled with FMA enabled.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let (j, n, ni) = exp_reduced(x);
    // j * 2^n with one rounding. For |n| <= 192 (all that is used) n sits in z's low mantissa
    // bits; split the power so both factors are normal floats and only the last product rounds
    // (into the subnormals, or to infinity, when it must).
    let (n1, n2) = if ni > 127 {
        (127, ni.wrapping_sub(127))
    } else if ni < -126 {
        (ni.wrapping_add(96), -96)
    } else {
        (ni, 0)
    };
    let pow2 = |e: i32| f32::from_bits((e.wrapping_add(127) as u32 & 0xff) << 23);
    let res = j * pow2(n1) * pow2(n2);
    if n.abs() > 192.0 {
        if n <= 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    } else {
        res
    }
}

/// `x = n ln 2 + b` and the polynomial `j ≈ e^b` of [`exp_f32`]: `(j, n, n as i32)`.
#[inline(always)]
fn exp_reduced(x: f32) -> (f32, f32, i32) {
    // The constants, by their bit patterns (exact).
    const SHIFT: f32 = 12_582_912.0; // 1.5 * 2^23: z - SHIFT is x / ln 2 rounded to an integer
    const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    const C: [f32; 5] = [
        f32::from_bits(0x3f7f_fff6),
        f32::from_bits(0x3eff_fedb),
        f32::from_bits(0x3e2a_af33),
        f32::from_bits(0x3d2b_9f17),
        f32::from_bits(0x3c07_2010),
    ];
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C[4]
        .mul_add(b, C[3])
        .mul_add(u, C[2].mul_add(b, C[1]))
        .mul_add(u, C[0].mul_add(b, 1.0));
    (
        j,
        n,
        (z.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32),
    )
}

/// `e^x` for f32 where only `x` in `[-86, 88]` matters: the input is clamped to that range, so
/// `2^n` is applied by adding `n` to the exponent bits (about half the operations of
/// [`exp_f32`]). Inside the range the result is bit-identical to [`exp_f32`]'s; below it is
/// `e^-86` (~4e-38) instead of a smaller or zero value, above it `e^88` instead of a larger one
/// or infinity. NaN stays NaN. For formulas such as the GELU's `x / (1 + e^t)`, where those
/// differences are far below one ulp of the result.
#[inline(always)]
pub fn exp_fast_f32(x: f32) -> f32 {
    let (j, _, ni) = exp_reduced(x.clamp(-86.0, 88.0));
    let r = f32::from_bits((j.to_bits() as i32).wrapping_add(ni << 23) as u32);
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// `erf(x)` for f32, within 1.5 ulp (the sweep in this file's tests; about 1.1 ulp measured),
/// branch-free so loops over it (GELU) vectorize. For `|x| < 1`, `x + x P(x^2)`; for `1 <= |x|`,
/// `1 - e^(-x^2) Q(u)` with `u = (1/|x| - 0.625) / 0.375`, `|x|` clamped to 4 (beyond, erf
/// rounds to 1), and `e^(-x^2)` taken from `x^2` split into its rounded value and the
/// remainder (`e^-hi (1 - lo)`) so the rounding of the square does not show. `P` (degree 6) and
/// `Q` (degree 9) are least-squares fits on Chebyshev nodes made for RLX by
/// `scripts/fit-erf.py`, which also reports their f32 error.
#[inline(always)]
// The fitted values as the script prints them; each rounds to its nearest f32.
#[allow(clippy::excessive_precision)]
pub fn erf_f32(x: f32) -> f32 {
    const P: [f32; 7] = [
        0.128_379_17,
        -0.376_126_27,
        0.112_835_975,
        -0.026_854_33,
        0.005_189_313,
        -0.000_801_885_9,
        0.000_078_825,
    ];
    const Q: [f32; 10] = [
        0.305_952_99,
        0.143_356_41,
        -0.024_242_835,
        0.002_308_021_2,
        0.000_459_936_2,
        -0.000_348_115_3,
        0.000_124_209_83,
        -0.000_028_078_298,
        -0.000_002_779_389_3,
        0.000_003_816_666_5,
    ];
    let a = x.abs();
    let t = a * a;
    let mut p = P[6];
    for c in P[..6].iter().rev() {
        p = p.mul_add(t, *c);
    }
    let small = a.mul_add(p, a);
    let b = a.clamp(1.0, 4.0);
    let hi = b * b;
    let lo = b.mul_add(b, -hi);
    // -hi lies in [-16, -1], where exp_fast_f32 is exp_f32 to the bit with half the work.
    let eh = exp_fast_f32(-hi);
    let e = eh.mul_add(-lo, eh);
    let u = (1.0 / b).mul_add(1.0 / 0.375, -0.625 / 0.375);
    let mut q = Q[9];
    for c in Q[..9].iter().rev() {
        q = q.mul_add(u, *c);
    }
    let large = (-e).mul_add(q, 1.0);
    // NaN takes the first arm (and stays NaN).
    let r = if a < 1.0 {
        small
    } else if a >= 1.0 {
        large
    } else {
        x
    };
    r.copysign(x)
}

/// `tanh(x)` for f32, within a few ulp, branch-free so loops over it vectorize: an odd Taylor
/// polynomial near zero (where `1 - 2/(e^2x + 1)` would cancel) and the exponential form
/// elsewhere.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    // Series up to x^15 for |x| < 0.55 (next term below 1e-7 relative).
    let z = x * x;
    let mut p = 6_404_582.0 / 10_854_718_875.0;
    p = p * z - 929_569.0 / 638_512_875.0;
    p = p * z + 21_844.0 / 6_081_075.0;
    p = p * z - 1_382.0 / 155_925.0;
    p = p * z + 62.0 / 2_835.0;
    p = p * z - 17.0 / 315.0;
    p = p * z + 2.0 / 15.0;
    p = p * z - 1.0 / 3.0;
    p = p * z + 1.0;
    let small = x * p;
    let e = exp_fast_f32(2.0 * ax.min(15.0));
    let big = 1.0 - 2.0 / (e + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if ax < 0.55 {
        small
    } else {
        big
    }
}

/// Run `$body` compiled for AVX-512 or AVX2+FMA when the CPU has them (the body is inlined into
/// each variant, so LLVM vectorizes it for that instruction set), else for the build target.
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident($($a:ident: $t:ty),*) -> $r:ty $body:block) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) -> $r {
            #[inline(always)]
            fn imp($($a: $t),*) -> $r $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn v512($($a: $t),*) -> $r { imp($($a),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v256($($a: $t),*) -> $r { imp($($a),*) }
                if crate::isa::avx512() {
                    // SAFETY: the CPU has the feature.
                    return unsafe { v512($($a),*) };
                }
                if crate::isa::avx2() {
                    // SAFETY: the CPU has the features.
                    return unsafe { v256($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}

/// Maximum of a slice (−inf when empty), 16 lanes at a time.
#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = if *v > *l { *v } else { *l };
        }
    }
    let mut m = tail
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    for l in lanes {
        m = if l > m { l } else { m };
    }
    m
}

multiversion! {
/// Maximum of a slice (−inf when empty), 16 lanes at a time.
pub fn max_f32(x: &[f32]) -> f32 {
    max_lanes(x)
}
}

/// `y = e^(x - m)` and the sum of `y`, 16 lanes at a time.
#[inline(always)]
fn exp_shift_sum_lanes(x: &[f32], m: f32, y: &mut [f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let n = x.len() / 16 * 16;
    for (xc, yc) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact_mut(16)) {
        for i in 0..16 {
            let e = exp_f32(xc[i] - m);
            yc[i] = e;
            lanes[i] += e;
        }
    }
    let mut s = 0f32;
    for (xv, yv) in x[n..].iter().zip(&mut y[n..]) {
        let e = exp_f32(xv - m);
        *yv = e;
        s += e;
    }
    s + lanes.iter().sum::<f32>()
}

/// `ln(1 + t)` for `t` in `[0, 1]`, branch-free: `2 atanh(s)` with `s = t / (2 + t) <= 1/3`,
/// its odd series to `s^17` (the next term is below 2e-10 of the sum).
#[inline(always)]
fn ln_1p_unit(t: f32) -> f32 {
    let s = t / (2.0 + t);
    let s2 = s * s;
    let p = (1.0 / 17.0f32)
        .mul_add(s2, 1.0 / 15.0)
        .mul_add(s2, 1.0 / 13.0)
        .mul_add(s2, 1.0 / 11.0)
        .mul_add(s2, 1.0 / 9.0)
        .mul_add(s2, 1.0 / 7.0)
        .mul_add(s2, 1.0 / 5.0)
        .mul_add(s2, 1.0 / 3.0)
        .mul_add(s2, 1.0);
    2.0 * s * p
}

multiversion! {
/// `y = softplus(x) = max(x, 0) + ln(1 + e^-|x|)`, vectorized (selective scan's delta).
pub fn softplus_rows(x: &[f32], y: &mut [f32]) -> () {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = xv.max(0.0) + ln_1p_unit(exp_f32(-xv.abs()));
    }
}
}

multiversion! {
/// `y *= z / (1 + e^-z)` (a SiLU gate), vectorized.
pub fn silu_gate_in_place(y: &mut [f32], z: &[f32]) -> () {
    for (yv, &zv) in y.iter_mut().zip(z) {
        *yv *= zv / (1.0 + exp_f32(-zv));
    }
}
}

multiversion! {
/// One channel of Mamba's selective scan: with `a [N]`, `b`, `c` `[L, N]` (the channel's batch,
/// sequence-major), `dl [L]` (delta after softplus) and `u [L]`, runs the state `x [N]` through
/// `x = e^(dl_l a) x + dl_l u_l b_l` and writes `y_l = Σ_n x c_l`. The `N` states of a step are
/// one vector (exp by [`exp_f32`]).
pub fn scan_channel(x: &mut [f32], a: &[f32], b: &[f32], c: &[f32], dl: &[f32], u: &[f32], y: &mut [f32]) -> () {
    let ns = x.len();
    let full = ns / 16 * 16;
    for (l, yl) in y.iter_mut().enumerate() {
        let (d, du) = (dl[l], dl[l] * u[l]);
        let (bl, cl) = (&b[l * ns..(l + 1) * ns], &c[l * ns..(l + 1) * ns]);
        // Sixteen states at a time with sixteen partial sums (a sequential sum would keep the
        // loop scalar), then the rest.
        let mut lanes = [0f32; 16];
        for (((xc, ac), bc), cc) in x[..full]
            .chunks_exact_mut(16)
            .zip(a[..full].chunks_exact(16))
            .zip(bl[..full].chunks_exact(16))
            .zip(cl[..full].chunks_exact(16))
        {
            for i in 0..16 {
                let v = exp_f32(d * ac[i]) * xc[i] + du * bc[i];
                xc[i] = v;
                lanes[i] += v * cc[i];
            }
        }
        let mut acc = 0f32;
        for n in full..ns {
            let v = exp_f32(d * a[n]) * x[n] + du * bl[n];
            x[n] = v;
            acc += v * cl[n];
        }
        *yl = acc + lanes.iter().sum::<f32>();
    }
}
}

multiversion! {
/// `y = e^(x - m)` and the sum of `y`, 16 lanes at a time.
pub fn exp_shift_sum(x: &[f32], m: f32, y: &mut [f32]) -> f32 {
    exp_shift_sum_lanes(x, m, y)
}
}

multiversion! {
/// Softmax of `x` in place after multiplying it by `scale`: `x = e^(scale x - max) / sum`,
/// vectorized (the attention rows of prompt processing).
pub fn scaled_softmax_in_place(x: &mut [f32], scale: f32) -> () {
    for v in x.iter_mut() {
        *v *= scale;
    }
    let m = max_lanes(x);
    let mut lanes = [0f32; 16];
    let n = x.len() / 16 * 16;
    for c in x[..n].chunks_exact_mut(16) {
        for (v, l) in c.iter_mut().zip(&mut lanes) {
            let e = exp_f32(*v - m);
            *v = e;
            *l += e;
        }
    }
    let mut s = 0f32;
    for v in &mut x[n..] {
        let e = exp_f32(*v - m);
        *v = e;
        s += e;
    }
    let inv = 1.0 / (s + lanes.iter().sum::<f32>());
    for v in x.iter_mut() {
        *v *= inv;
    }
}
}

/// The softmax of an attention row: `x = x * scale + mask` (`mask` empty for none, else as
/// long as `x`; a product then a sum, each rounded), then `e^(x - max) / sum` in place, in three
/// passes over the row: [`masked_exp_in_place`]'s two, then the normalization.
pub fn masked_softmax_in_place(x: &mut [f32], scale: f32, mask: &[f32]) {
    let inv = 1.0 / masked_exp_in_place(x, scale, mask);
    scale_in_place(x, inv);
}

multiversion! {
/// `x *= s`, 16 lanes at a time.
pub fn scale_in_place(x: &mut [f32], s: f32) -> () {
    for v in x.iter_mut() {
        *v *= s;
    }
}
}

multiversion! {
/// The unnormalized softmax of an attention row: `x = x * scale + mask` (`mask` empty for none,
/// else as long as `x`; a product then a sum, each rounded), then `x = e^(x - max)` in place;
/// returns the sum of the exponentials. Two passes over the row (the scaled, masked scores and
/// their maximum; the exponentials and their sum), 16 lanes at a time. A shifted score below
/// -86 (a weight under 1e-37 of the largest) gets 0; the others [`exp_fast_f32`], which equals
/// [`exp_f32`] there.
pub fn masked_exp_in_place(x: &mut [f32], scale: f32, mask: &[f32]) -> f32 {
    let n = x.len() / 16 * 16;
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut m = f32::NEG_INFINITY;
    let pick = |v: f32, l: f32| if v > l { v } else { l };
    if mask.is_empty() {
        for c in x[..n].chunks_exact_mut(16) {
            for (v, l) in c.iter_mut().zip(&mut lanes) {
                *v *= scale;
                *l = pick(*v, *l);
            }
        }
        for v in &mut x[n..] {
            *v *= scale;
            m = pick(*v, m);
        }
    } else {
        let mask = &mask[..x.len()];
        for (c, mc) in x[..n].chunks_exact_mut(16).zip(mask[..n].chunks_exact(16)) {
            for ((v, mv), l) in c.iter_mut().zip(mc).zip(&mut lanes) {
                *v = *v * scale + *mv;
                *l = pick(*v, *l);
            }
        }
        for (v, mv) in x[n..].iter_mut().zip(&mask[n..]) {
            *v = *v * scale + *mv;
            m = pick(*v, m);
        }
    }
    for l in lanes {
        m = pick(l, m);
    }
    let exp = |d: f32| if d < -86.0 { 0.0 } else { exp_fast_f32(d) };
    let mut sums = [0f32; 16];
    for c in x[..n].chunks_exact_mut(16) {
        for (v, l) in c.iter_mut().zip(&mut sums) {
            let e = exp(*v - m);
            *v = e;
            *l += e;
        }
    }
    let mut s = 0f32;
    for v in &mut x[n..] {
        let e = exp(*v - m);
        *v = e;
        s += e;
    }
    s + sums.iter().sum::<f32>()
}
}

multiversion! {
/// Softmax of each `n`-element row of `x` into `y` (both whole rows, dense): the row's
/// maximum, [`exp_shift_sum`] from it, then every value times the reciprocal of the sum — the
/// same operations as those three calls row by row, in one function compiled for the vector
/// unit (no dispatch per row).
pub fn softmax_rows(x: &[f32], y: &mut [f32], n: usize) -> () {
    for (xs, ys) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let m = max_lanes(xs);
        let inv = 1.0 / exp_shift_sum_lanes(xs, m, ys);
        for y in ys.iter_mut() {
            *y *= inv;
        }
    }
}
}

multiversion! {
/// RMSNorm of each `n`-element row of `x` into `y` (both whole rows, dense), times the gain
/// `g` (`n` values): every row's squares summed in f64 one after the other, as llama.cpp does,
/// then `1 / sqrt(mean + eps)` in f32 and `x * inv * g`. Four rows advance together, each in its
/// own sequential chain, so a row's result is bit-identical to summing it alone while four
/// additions are in flight instead of one (a lone chain waits on the adder's latency).
pub fn rms_norm_rows(x: &[f32], g: &[f32], y: &mut [f32], n: usize, eps: f32) -> () {
    let finish = |xs: &[f32], ys: &mut [f32], v: f64| {
        let inv = 1.0f32 / ((v / n as f64) as f32 + eps).sqrt();
        for ((y, &x), &g) in ys.iter_mut().zip(xs).zip(g) {
            *y = x * inv * g;
        }
    };
    let rows = x.len() / n.max(1);
    let mut r = 0;
    while r + 4 <= rows {
        let xs: [&[f32]; 4] = std::array::from_fn(|l| &x[(r + l) * n..(r + l + 1) * n]);
        let mut v = [0f64; 4];
        for (((&a, &b), &c), &d) in xs[0].iter().zip(xs[1]).zip(xs[2]).zip(xs[3]) {
            for (v, a) in v.iter_mut().zip([a, b, c, d]) {
                *v += (a * a) as f64;
            }
        }
        for l in 0..4 {
            finish(xs[l], &mut y[(r + l) * n..(r + l + 1) * n], v[l]);
        }
        r += 4;
    }
    for r in r..rows {
        let xs = &x[r * n..(r + 1) * n];
        let mut v = 0f64;
        for &a in xs {
            v += (a * a) as f64;
        }
        finish(xs, &mut y[r * n..(r + 1) * n], v);
    }
}
}

multiversion! {
/// Sum of a slice in f64 (as Reduce sums f32), in 16 interleaved lanes: a different order of
/// additions than a sequential f64 sum, which moves the f64 result by a few of its own ulps —
/// far below the f32 ulp the sum is rounded to, except after massive cancellation.
pub fn sum_f64(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += *v as f64;
        }
    }
    let mut s = 0f64;
    for v in tail {
        s += *v as f64;
    }
    s + lanes.iter().sum::<f64>()
}
}

multiversion! {
/// LayerNorm of each dense `n`-element row of `x` into `y`: the mean and then the variance of
/// `x - mean` (differences in f32, squares and sums in f64, each sum over 8 lanes so it
/// vectorizes), `1/sqrt(var + eps)` in f64 rounded to f32, then `(x - mean) * inv * g + b` in
/// f32 — the scalar kernel's operations with only the order of the f64 sums changed.
pub fn layer_norm_rows(x: &[f32], g: &[f32], b: &[f32], y: &mut [f32], n: usize, eps: f32) -> () {
    for (xs, ys) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mut lanes = [0f64; 8];
        let chunks = xs.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for (l, v) in lanes.iter_mut().zip(c) {
                *l += *v as f64;
            }
        }
        let s = lanes.iter().sum::<f64>() + tail.iter().map(|v| *v as f64).sum::<f64>();
        let mean = (s / n as f64) as f32;
        let mut lanes = [0f64; 8];
        let chunks = xs.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for (l, v) in lanes.iter_mut().zip(c) {
                let d = (*v - mean) as f64;
                *l += d * d;
            }
        }
        let v = lanes.iter().sum::<f64>()
            + tail
                .iter()
                .map(|v| {
                    let d = (*v - mean) as f64;
                    d * d
                })
                .sum::<f64>();
        let inv = (1.0 / (v / n as f64 + eps as f64).sqrt()) as f32;
        for (((o, xv), gv), bv) in ys.iter_mut().zip(xs).zip(g).zip(b) {
            *o = (*xv - mean) * inv * *gv + *bv;
        }
    }
}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_and_the_silu_gate_match_f64() {
        let x: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.01).collect();
        crate::isa::for_each_level(|level| {
            let mut y = vec![0f32; x.len()];
            softplus_rows(&x, &mut y);
            for (&xv, &yv) in x.iter().zip(&y) {
                let w = (xv as f64).max(0.0) + (-(xv as f64).abs()).exp().ln_1p();
                assert!(
                    ((yv as f64) - w).abs() <= 4.0 * f32::EPSILON as f64 * w,
                    "softplus({xv}) = {yv}, want {w} at {level}"
                );
            }
            let mut g = vec![1.5f32; x.len()];
            silu_gate_in_place(&mut g, &x);
            for (&xv, &gv) in x.iter().zip(&g) {
                let w = 1.5 * xv as f64 / (1.0 + (-(xv as f64)).exp());
                assert!(
                    ((gv as f64) - w).abs() <= 4.0 * f32::EPSILON as f64 * w.abs() + 1e-30,
                    "1.5 silu({xv}) = {gv}, want {w} at {level}"
                );
            }
        });
    }

    #[test]
    fn rms_norm_rows_equals_a_sequential_f64_sum_per_row() {
        crate::isa::for_each_level(|_| {
            for (rows, n) in [(1usize, 7usize), (4, 64), (9, 640), (6, 1)] {
                let x: Vec<f32> = (0..rows * n)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0 + (i % 3) as f32 * 1e-3)
                    .collect();
                let g: Vec<f32> = (0..n).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
                let mut y = vec![0f32; rows * n];
                rms_norm_rows(&x, &g, &mut y, n, 1e-6);
                for r in 0..rows {
                    let xs = &x[r * n..(r + 1) * n];
                    let mut v = 0f64;
                    for &a in xs {
                        v += (a * a) as f64;
                    }
                    let inv = 1.0f32 / ((v / n as f64) as f32 + 1e-6f32).sqrt();
                    for t in 0..n {
                        assert_eq!(
                            y[r * n + t].to_bits(),
                            (xs[t] * inv * g[t]).to_bits(),
                            "row {r} of {rows}, element {t}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn layer_norm_rows_matches_f64() {
        crate::isa::for_each_level(|_| {
            for (rows, n) in [(1usize, 1usize), (3, 7), (4, 384), (2, 1000)] {
                let x: Vec<f32> = (0..rows * n)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0 + 3.0)
                    .collect();
                let g: Vec<f32> = (0..n).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
                let b: Vec<f32> = (0..n).map(|i| (i % 3) as f32 - 1.0).collect();
                let mut y = vec![0f32; rows * n];
                layer_norm_rows(&x, &g, &b, &mut y, n, 1e-5);
                for r in 0..rows {
                    let xs: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
                    let mean = xs.iter().sum::<f64>() / n as f64;
                    let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                    for t in 0..n {
                        let want = (xs[t] - mean) / (var + 1e-5).sqrt() * g[t] as f64 + b[t] as f64;
                        let got = y[r * n + t] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{n}: {got} vs {want}"
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn erf_f32_is_within_one_and_a_half_ulp_of_erf() {
        let mut worst = (0f64, 0f32);
        let mut check = |x: f32| {
            let got = erf_f32(x);
            let want = libm::erf(x as f64);
            let ulp = (want as f32).abs().max(f32::MIN_POSITIVE);
            let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
            let e = (got as f64 - want).abs() / ulp;
            assert!(e <= 1.5, "erf({x:e}) = {got:e}, want {want:e}: {e} ulp");
            if e > worst.0 {
                worst = (e, x);
            }
        };
        // A dense sweep of [-6, 6], tiny magnitudes, and the subnormals' edge.
        for i in -600_000..=600_000 {
            check(i as f32 * 1e-5);
        }
        for k in -149..0 {
            check(2f32.powi(k));
            check(-(2f32.powi(k)) * 1.37);
        }
        for x in [1.0, -1.0, 3.95, 4.0, 9.5, 1e30, f32::MAX] {
            check(x);
        }
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        assert!(erf_f32(-0.0).is_sign_negative() && erf_f32(-0.0) == 0.0);
        eprintln!("erf_f32: worst {} ulp at {:e}", worst.0, worst.1);
    }

    #[test]
    fn scaled_softmax_in_place_matches_f64() {
        crate::isa::for_each_level(|_| {
            for n in [1usize, 5, 16, 37, 300] {
                let mut x: Vec<f32> = (0..n)
                    .map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0)
                    .collect();
                let scale = 0.0625f32;
                let xs: Vec<f64> = x.iter().map(|&v| (v * scale) as f64).collect();
                let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = xs.iter().map(|v| (v - m).exp()).sum();
                scaled_softmax_in_place(&mut x, scale);
                for (got, v) in x.iter().zip(&xs) {
                    let want = (v - m).exp() / z;
                    assert!(
                        (*got as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-9,
                        "n {n}: {got} vs {want}"
                    );
                }
            }
        });
    }

    #[test]
    fn masked_softmax_matches_f64_and_zeroes_masked_scores() {
        crate::isa::for_each_level(|_| {
            for n in [1usize, 5, 16, 37, 300] {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0)
                    .collect();
                // Every third key masked with f32::MIN (a key-padding mask) except the first.
                let mask: Vec<f32> = (0..n)
                    .map(|i| {
                        if i % 3 == 2 {
                            f32::MIN
                        } else {
                            (i % 5) as f32 * 0.25
                        }
                    })
                    .collect();
                let scale = 0.0625f32;
                for masked in [false, true] {
                    let xs: Vec<f64> = x
                        .iter()
                        .zip(&mask)
                        .map(|(&v, &mv)| {
                            if masked {
                                (v * scale + mv) as f64
                            } else {
                                (v * scale) as f64
                            }
                        })
                        .collect();
                    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = xs.iter().map(|v| (v - m).exp()).sum();
                    let mut got = x.clone();
                    masked_softmax_in_place(&mut got, scale, if masked { &mask } else { &[] });
                    for (i, (g, v)) in got.iter().zip(&xs).enumerate() {
                        let want = (v - m).exp() / z;
                        assert!(
                            (*g as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-9,
                            "n {n} masked {masked} at {i}: {g} vs {want}"
                        );
                        if masked && i % 3 == 2 {
                            assert_eq!(*g, 0.0, "n {n}: masked key {i}");
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn softmax_rows_equals_the_row_by_row_calls() {
        crate::isa::for_each_level(|_| {
            for n in [1usize, 13, 16, 64, 100] {
                let rows = 7;
                let mut x: Vec<f32> = (0..rows * n)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
                    .collect();
                x[n / 2] = f32::NEG_INFINITY; // a masked entry
                let mut fast = vec![f32::NAN; rows * n];
                softmax_rows(&x, &mut fast, n);
                let mut slow = vec![f32::NAN; rows * n];
                for (xs, ys) in x.chunks_exact(n).zip(slow.chunks_exact_mut(n)) {
                    let m = max_f32(xs);
                    let inv = 1.0 / exp_shift_sum(xs, m, ys);
                    ys.iter_mut().for_each(|y| *y *= inv);
                }
                assert!(
                    fast.iter()
                        .zip(&slow)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n {n}"
                );
            }
        });
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.5 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            let ulp = (want as f32).abs() as f64 * f32::EPSILON as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.0137;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        // Subnormal results, underflow, overflow.
        let tiny = exp_f32(-100.0) as f64;
        assert!(
            (tiny - (-100f64).exp()).abs() <= f32::from_bits(1) as f64,
            "{tiny}"
        );
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        // Near the top (2^n needs its factor split in two): still within 2 ulp.
        let (got, want) = (exp_f32(88.7) as f64, (88.7f32 as f64).exp());
        assert!(
            (got - want).abs() <= 2.0 * (want as f32) as f64 * f32::EPSILON as f64,
            "{got} vs {want}"
        );
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn fast_exp_equals_exp_inside_its_range_and_clamps_outside() {
        let mut x = -86.0f32;
        while x <= 88.0 {
            assert_eq!(exp_fast_f32(x).to_bits(), exp_f32(x).to_bits(), "at {x}");
            x += 0.0113;
        }
        for (x, at) in [
            (-87.5f32, -86.0f32),
            (-1e30, -86.0),
            (f32::NEG_INFINITY, -86.0),
            (88.5, 88.0),
            (1e30, 88.0),
            (f32::INFINITY, 88.0),
        ] {
            assert_eq!(exp_fast_f32(x), exp_f32(at), "at {x}");
        }
        assert!(exp_fast_f32(f32::NAN).is_nan());
        assert!(exp_fast_f32(-f32::NAN).is_nan());
    }

    #[test]
    fn tanh_is_within_a_few_ulp() {
        let mut worst = 0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (x as f64).tanh();
            let got = tanh_f32(x) as f64;
            let ulp = (want.abs().max(1e-30) as f32) as f64 * f32::EPSILON as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.00731;
        }
        assert!(worst <= 4.0, "worst error {worst} ulp");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(50.0), 1.0);
        assert_eq!(tanh_f32(-50.0), -1.0);
    }

    #[test]
    fn reductions_match_scalar() {
        crate::isa::for_each_level(|_| {
            let x: Vec<f32> = (0..37)
                .map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0)
                .collect();
            assert_eq!(max_f32(&x), x.iter().cloned().fold(f32::MIN, f32::max));
            let mut y = vec![0f32; x.len()];
            let s = exp_shift_sum(&x, 1.0, &mut y);
            let want: f64 = x.iter().map(|v| ((v - 1.0) as f64).exp()).sum();
            assert!((s as f64 - want).abs() < 1e-5 * want);
            let seq: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((sum_f64(&x) - seq).abs() <= 1e-12 * seq.abs().max(1.0));
            assert_eq!(
                sum_f64(&x[..5]),
                x[..5].iter().map(|&v| v as f64).sum::<f64>()
            );
        });
    }
}
