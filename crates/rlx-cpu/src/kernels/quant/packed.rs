//! The x86 kernels of the quantized products on packed rows: weight blocks decoded once for
//! up to four activation rows ([`dot_packed_rows`]: the 32-element block formats and the
//! k-quants), and four activation rows packed into one stream ([`dot_group`]). Every
//! (weight row, activation row) pair takes the same float steps in the same order whichever
//! kernel computes it, so a row's result does not depend on the rows beside it.

use super::*;

/// One quantized activation row: its quants, block scales and block sums (see `row_views`).
pub(super) type Act<'a> = (&'a [i8], &'a [f32], &'a [f32]);

/// Activation rows one call of [`dot_packed_rows`] takes at most.
pub(super) const ACTS: usize = 4;

/// Dot products of up to four packed rows of a 32-element block type with up to [`ACTS`]
/// quantized activation rows, straight from the packed bytes. Quants enter the integer product
/// as unsigned bytes; the format's offset (`-8`, `-16`) or min is applied through the
/// activation block sums. Four weight rows share each activation load and keep independent
/// accumulator chains; each weight block is decoded once for all the activation rows (a batch
/// of decode rows then costs little more than one), and every (weight row, activation row) pair
/// goes through the same operations in the same order as alone, so results do not depend on how
/// many rows come together.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and the VNNI form `vnni` names; `rows` points at `n` rows of
/// `row_bytes` bytes (`1 <= n <= 4`) holding `k / 32` blocks of `ty`; `acts` holds 1 to
/// [`ACTS`] rows of `k` quants; `out[a]` gets activation row `a`'s `n` results.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dot_packed_rows(
    ty: GgmlType,
    vnni: Vnni,
    far: bool,
    rows: *const u8,
    row_bytes: usize,
    n: usize,
    acts: &[Act<'_>],
    out: &mut [[f32; ROWS]; ACTS],
) {
    // Slots past `acts.len()` repeat the last row (computed, never read).
    let pick = |i: usize| acts[i.min(acts.len() - 1)];
    macro_rules! go {
        ($f:literal, $a:literal) => {{
            let a: [Act<'_>; $a] = std::array::from_fn(pick);
            let o = (&mut out[..$a]).try_into().expect("$a slots");
            match vnni {
                Vnni::Vex => dot_rows_vnni::<$f, $a>(rows, row_bytes, n, far, a, o),
                Vnni::Evex => dot_rows_vnni512::<$f, $a>(rows, row_bytes, n, far, a, o),
                Vnni::None => dot_rows_avx2::<$f, $a>(rows, row_bytes, n, far, a, o),
            }
        }};
    }
    macro_rules! by_acts {
        ($f:literal) => {
            match acts.len() {
                1 => go!($f, 1),
                2 => go!($f, 2),
                _ => go!($f, 4),
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => by_acts!(0),
        GgmlType::Q4_1 => by_acts!(1),
        GgmlType::Q5_0 => by_acts!(2),
        GgmlType::Q5_1 => by_acts!(3),
        GgmlType::Q8_0 => by_acts!(4),
        _ => {
            for r in 0..n {
                let row = std::slice::from_raw_parts(rows.add(r * row_bytes), row_bytes);
                macro_rules! k {
                    ($a:literal) => {{
                        let a: [Act<'_>; $a] = std::array::from_fn(pick);
                        for (o, v) in out.iter_mut().zip(dot_kquant_avx2(ty, row, far, a)) {
                            o[r] = v;
                        }
                    }};
                }
                match acts.len() {
                    1 => {
                        let (qx, la, xs) = acts[0];
                        out[0][r] = dot_kquant_one(ty, row, far, qx, la, xs);
                    }
                    2 => k!(2),
                    _ => k!(4),
                }
            }
        }
    }
}

/// Dot product of one packed Q4_K or Q6_K row with one `Q8_K`-quantized activation row, on the
/// packed bytes: per super-block, sub-block products are weighted by their integer scales in
/// 32-bit integers and converted to float once; mins (Q4_K) and the `-32` offset (Q6_K) go
/// through the activation's integer per-16 sums. The float steps follow llama.cpp's x86 code
/// for the same type (repacked 8-row Q4_K, plain Q6_K), so results are bit-identical to it.
///
/// This single-row form (token-by-token decode) is kept beside [`dot_kquant_avx2`], which
/// takes several rows: that one instantiated for one row decoded Gemma 3 ~6% slower (same-run
/// A/B, `rlx bench -t 1 -r 3 -p 64 -n 128`, 6 runs each: 55 against 58.5 tok/s, also with
/// its decoding interleaved per sub-block). Both take the same float steps in the same order.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds whole super-blocks of `ty`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_kquant_one(
    ty: GgmlType,
    row: &[u8],
    far: bool,
    qx: &[i8],
    la: &[f32],
    xs: &[f32],
) -> f32 {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    let mut acc = _mm256_setzero_ps();
    // Q4_K: the weighted sums and the min terms of each super-block are exact integers, scaled
    // and accumulated in f32 one super-block after the other (llama.cpp's repacked Q4_K order).
    let (mut acc_q4, mut acc_min) = (0f32, 0f32);
    let p = row.as_ptr();
    for sb in 0..row.len() / bb {
        let blk = p.add(sb * bb);
        for line in (0..bb).step_by(64) {
            prefetch_ahead(blk.wrapping_add(PREFETCH + line), far);
        }
        let a = qx.as_ptr().add(sb * 256);
        // Integer sums of the 16 activation groups.
        let xs = &xs[sb * 16..sb * 16 + 16];
        let dx = *la.get_unchecked(sb * 64);
        let isum;
        let d;
        if ty == GgmlType::Q4_K {
            let b = std::slice::from_raw_parts(blk, bb);
            d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let dmin = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
            // The pairs of sub-blocks decoded as they are used.
            let (total, mins) = q4k_sums(
                |j| {
                    let (s1, _) = rlx_gguf::k4_scale_min(2 * j, &b[4..16]);
                    let (s2, _) = rlx_gguf::k4_scale_min(2 * j + 1, &b[4..16]);
                    let (lo, hi) = rlx_gguf::simd::split_nibbles(_mm256_loadu_si256(
                        blk.add(16 + 32 * j) as *const __m256i,
                    ));
                    (s1, s2, lo, hi)
                },
                q4k_mins(&b[4..16]),
                a,
                xs,
            );
            acc_q4 = (total as f32).mul_add(d * dx, acc_q4);
            acc_min = (mins as f32).mul_add(dmin * dx, acc_min);
            continue;
        } else {
            let b = std::slice::from_raw_parts(blk, bb);
            d = half::f16::from_le_bytes([b[208], b[209]]).to_f32();
            let sc = &b[192..208];
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
            // The halves decoded as they are used (see this function's documentation).
            isum = q6k_isum(|n| rlx_gguf::simd::q6k_half(blk, n), sc, scales, a, xs);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc);
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    if ty == GgmlType::Q4_K {
        return acc_q4 - acc_min;
    }
    _mm_cvtss_f32(s)
}

/// The integer sums of one Q4_K super-block with one `Q8_K` activation super-block (quants at
/// `a`, per-16 sums `xs`): `(sum of the sub-block products weighted by their scales, sum of
/// the mins weighted by the activation sums)`. `part(j)` gives sub-blocks `2j` and `2j + 1`:
/// their scales and their two nibble halves; `mins` the eight mins in [`q4k_mins`]' order. Both
/// sums are exact integers, so the order they are added in does not matter: the mins go
/// through the activation's per-32 sums eight at a time, and the two sums are reduced across
/// lanes together.
///
/// # Safety
/// AVX2; `a` points at 256 quants; `xs` holds 16 sums.
#[inline(always)]
unsafe fn q4k_sums(
    part: impl Fn(
        usize,
    ) -> (
        u8,
        u8,
        std::arch::x86_64::__m256i,
        std::arch::x86_64::__m256i,
    ),
    mins: std::arch::x86_64::__m256i,
    a: *const i8,
    xs: &[f32],
) -> (i32, i32) {
    use std::arch::x86_64::*;
    let mut isum = _mm256_setzero_si256();
    for j in 0..4 {
        let (s1, s2, lo, hi) = part(j);
        let a_lo = _mm256_loadu_si256(a.add(64 * j) as *const __m256i);
        let a_hi = _mm256_loadu_si256(a.add(64 * j + 32) as *const __m256i);
        let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_set1_epi16(s1 as i16));
        let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), _mm256_set1_epi16(s2 as i16));
        isum = _mm256_add_epi32(isum, _mm256_add_epi32(p_lo, p_hi));
    }
    // The activation's per-32 sums (pairs of its per-16 sums, exact integers in f32), as
    // `_mm256_hadd_epi32` leaves them: sub-blocks 0, 1, 4, 5, 2, 3, 6, 7.
    let x0 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr()));
    let x1 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr().add(8)));
    let weighted = _mm256_mullo_epi32(_mm256_hadd_epi32(x0, x1), mins);
    // Lanes 0 and 1 of each half: the half's sum of `isum`, then of `weighted`.
    let h = _mm256_hadd_epi32(isum, weighted);
    let h = _mm256_hadd_epi32(h, h);
    let t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t))
}

/// The eight 6-bit mins of a Q4_K super-block (its 12 scale bytes `s`) as 32-bit lanes, in the
/// order [`q4k_sums`] pairs them with the activation sums: sub-blocks 0, 1, 4, 5, 2, 3, 6, 7.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn q4k_mins(s: &[u8]) -> std::arch::x86_64::__m256i {
    let m = |j: usize| rlx_gguf::k4_scale_min(j, s).1 as i32;
    std::arch::x86_64::_mm256_setr_epi32(m(0), m(1), m(4), m(5), m(2), m(3), m(6), m(7))
}

/// The integer sum of one Q6_K super-block (its quant halves from `q(0)`, `q(1)`, its scales
/// `sc`, widened in `scales`) with one `Q8_K` activation super-block (quants at `a`, per-16
/// sums `xs`): each 32-quant piece's products weighted by its two 16-element scales, less the
/// weights' -32 offset in integers (lane l takes 16-groups 2l and 2l + 1: 32 (sum_2l scale_2l +
/// sum_2l+1 scale_2l+1)).
///
/// # Safety
/// AVX2; `a` points at 256 quants; `sc` holds 16 scales and `xs` 16 sums.
#[inline(always)]
unsafe fn q6k_isum(
    q: impl Fn(usize) -> [std::arch::x86_64::__m256i; 4],
    sc: &[u8],
    scales: std::arch::x86_64::__m256i,
    a: *const i8,
    xs: &[f32],
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let halves = |a: i16, b: i16| _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
    let mut isum = _mm256_setzero_si256();
    for n in 0..2 {
        for (kk, qk) in q(n).iter().enumerate() {
            let (sa, sbv) = (sc[n * 8 + 2 * kk] as i8, sc[n * 8 + 2 * kk + 1] as i8);
            let ak = _mm256_loadu_si256(a.add(128 * n + 32 * kk) as *const __m256i);
            let pk =
                _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, ak), halves(sa as i16, sbv as i16));
            isum = _mm256_add_epi32(isum, pk);
        }
    }
    let s0 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr()));
    let s1 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr().add(8)));
    let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(s0, s1));
    _mm256_sub_epi32(
        isum,
        _mm256_slli_epi32::<5>(_mm256_madd_epi16(sums, scales)),
    )
}

/// Dot products of one packed Q4_K or Q6_K row with `A` `Q8_K`-quantized activation rows, on
/// the packed bytes: per super-block, sub-block products are weighted by their integer scales
/// in 32-bit integers and converted to float once; mins (Q4_K) and the `-32` offset (Q6_K) go
/// through the activation's integer per-16 sums. The float steps follow llama.cpp's x86 code
/// for the same type (repacked 8-row Q4_K, plain Q6_K), so results are bit-identical to it. A
/// super-block's scales and quants are decoded once for all `A` rows; each row's sums run in
/// the one-row order.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds whole super-blocks of `ty`; every activation row
/// covers them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_kquant_avx2<const A: usize>(
    ty: GgmlType,
    row: &[u8],
    far: bool,
    acts: [Act<'_>; A],
) -> [f32; A] {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    let mut acc = [_mm256_setzero_ps(); A];
    // Q4_K: the weighted sums and the min terms of each super-block are exact integers, scaled
    // and accumulated in f32 one super-block after the other (llama.cpp's repacked Q4_K order).
    let (mut acc_q4, mut acc_min) = ([0f32; A], [0f32; A]);
    let p = row.as_ptr();
    for sb in 0..row.len() / bb {
        let blk = p.add(sb * bb);
        for line in (0..bb).step_by(64) {
            prefetch_ahead(blk.wrapping_add(PREFETCH + line), far);
        }
        let b = std::slice::from_raw_parts(blk, bb);
        if ty == GgmlType::Q4_K {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let dmin = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
            // Per pair of sub-blocks: the scale of each and the two nibble halves.
            let parts: [_; 4] = std::array::from_fn(|j| {
                let (s1, _) = rlx_gguf::k4_scale_min(2 * j, &b[4..16]);
                let (s2, _) = rlx_gguf::k4_scale_min(2 * j + 1, &b[4..16]);
                let (lo, hi) = rlx_gguf::simd::split_nibbles(_mm256_loadu_si256(
                    blk.add(16 + 32 * j) as *const __m256i,
                ));
                (s1, s2, lo, hi)
            });
            let mins = q4k_mins(&b[4..16]);
            for (i, &(qx, la, xs)) in acts.iter().enumerate() {
                let a = qx.as_ptr().add(sb * 256);
                // Integer sums of the 16 activation groups.
                let xs = &xs[sb * 16..sb * 16 + 16];
                let dx = *la.get_unchecked(sb * 64);
                let (total, mins) = q4k_sums(|j| parts[j], mins, a, xs);
                acc_q4[i] = (total as f32).mul_add(d * dx, acc_q4[i]);
                acc_min[i] = (mins as f32).mul_add(dmin * dx, acc_min[i]);
            }
            continue;
        }
        let d = half::f16::from_le_bytes([b[208], b[209]]).to_f32();
        let sc = &b[192..208];
        let q = [
            rlx_gguf::simd::q6k_half(blk, 0),
            rlx_gguf::simd::q6k_half(blk, 1),
        ];
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        for (i, &(qx, la, xs)) in acts.iter().enumerate() {
            let a = qx.as_ptr().add(sb * 256);
            let xs = &xs[sb * 16..sb * 16 + 16];
            let dx = *la.get_unchecked(sb * 64);
            let isum = q6k_isum(|n| q[n], sc, scales, a, xs);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc[i]);
        }
    }
    std::array::from_fn(|i| {
        if ty == GgmlType::Q4_K {
            return acc_q4[i] - acc_min[i];
        }
        let s = _mm_add_ps(
            _mm256_castps256_ps128(acc[i]),
            _mm256_extractf128_ps(acc[i], 1),
        );
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    })
}

/// [`dot_rows`] compiled for one VNNI form: `dot_rows_vnni` (AVX-VNNI, VEX), `dot_rows_vnni512`
/// (the EVEX-encoded 256-bit `vpdpbusd` of AVX-512 VNNI + VL, for CPUs such as AMD Zen 4 that
/// have it but not the VEX form) and `dot_rows_avx2` (`vpmaddubsw` + `vpmaddwd`).
macro_rules! rows_form {
    ($name:ident, $features:literal, $vnni:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const F: u8, const A: usize>(
            rows: *const u8,
            rb: usize,
            n: usize,
            far: bool,
            acts: [Act<'_>; A],
            out: &mut [[f32; ROWS]; A],
        ) {
            dot_rows::<F, { $vnni as u8 }, A>(rows, rb, n, far, acts, out)
        }
    };
}
rows_form!(dot_rows_vnni, "avx2,fma,f16c,avxvnni", Vnni::Vex);
rows_form!(
    dot_rows_vnni512,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    Vnni::Evex
);
rows_form!(dot_rows_avx2, "avx2,fma,f16c", Vnni::None);

/// `u8 x i8 -> i32` dot products of 4-byte lanes in the `VNNI` form (the same integer sums
/// either way: exact, so any form gives identical results).
#[inline(always)]
unsafe fn lane_dots<const VNNI: u8>(
    q: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    lane_dots_onto::<VNNI>(std::arch::x86_64::_mm256_setzero_si256(), q, a)
}

/// `init` plus the lane dots of [`lane_dots`]: with VNNI the sums accumulate straight into
/// `init` (one instruction, no separate add); exact integers either way.
#[inline(always)]
unsafe fn lane_dots_onto<const VNNI: u8>(
    init: std::arch::x86_64::__m256i,
    q: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if VNNI == Vnni::Vex as u8 {
        _mm256_dpbusd_avx_epi32(init, q, a)
    } else if VNNI == Vnni::Evex as u8 {
        _mm256_dpbusd_epi32(init, q, a)
    } else {
        _mm256_add_epi32(
            init,
            _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1)),
        )
    }
}

/// The activation block's offset lanes of format `F`, negated: minus 8 or 16 times its sum
/// per 4-byte lane (Q4_0, Q5_0), minus 128 times it for Q8_0 with VNNI, zero otherwise (see
/// [`block_lanes`], whose products start from them).
#[inline(always)]
unsafe fn act_offset<const F: u8, const VNNI: u8>(
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let neg = |shifted: __m256i| _mm256_sub_epi32(_mm256_setzero_si256(), shifted);
    let sum = || lane_dots::<VNNI>(_mm256_set1_epi8(1), a);
    match F {
        0 => neg(_mm256_slli_epi32(sum(), 3)),
        2 => neg(_mm256_slli_epi32(sum(), 4)),
        4 if VNNI != Vnni::None as u8 => neg(_mm256_slli_epi32(sum(), 7)),
        _ => _mm256_setzero_si256(),
    }
}

/// The 32 weights of the format-`F` block at `blk`, decoded once for every activation row:
/// `(w, q)`, the signed bytes (Q8_0) and the unsigned quants the products take.
#[inline(always)]
unsafe fn block_quants<const F: u8>(
    blk: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    if F == 4 {
        let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        (w, _mm256_xor_si256(w, _mm256_set1_epi8(-128)))
    } else {
        let mut q = rlx_gguf::simd::nibbles32(blk.add([2, 4, 6, 8][F as usize]));
        if F == 2 || F == 3 {
            q = rlx_gguf::simd::with_fifth_bits(
                q,
                (blk.add(if F == 2 { 2 } else { 4 }) as *const i32).read_unaligned(),
            );
        }
        (q, q)
    }
}

/// The eight lane sums of a block's products with activation block `a` (negated offset lanes
/// `a_off` from [`act_offset`]), as the integers llama.cpp converts to float.
#[inline(always)]
unsafe fn block_lanes<const F: u8, const VNNI: u8>(
    w: std::arch::x86_64::__m256i,
    q: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
    a_off: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if F == 4 {
        if VNNI != Vnni::None as u8 {
            // `vpdpbusd` has no i16 saturation: take w + 128 (a u8, `q`) and subtract
            // 128 sum(a) (the products start from it), exact for every weight byte, -128
            // included.
            lane_dots_onto::<VNNI>(a_off, q, a)
        } else {
            // |w| and a * sign(w): a -128 weight is 128 as u8 (see `dot_avx2`).
            lane_dots::<VNNI>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
        }
    } else if F == 0 || F == 2 {
        // Q4_0 / Q5_0: the lane sums of the signed weights (q - 8, q - 16): sum(q a) - 8 sum(a).
        lane_dots_onto::<VNNI>(a_off, q, a)
    } else {
        lane_dots::<VNNI>(q, a)
    }
}

/// The body of [`dot_packed_rows`] for format `F` (0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0)
/// and `A` activation rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows<const F: u8, const VNNI: u8, const A: usize>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    acts: [Act<'_>; A],
    out: &mut [[f32; ROWS]; A],
) {
    use std::arch::x86_64::*;
    const R: usize = ROWS;
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = rb / bb;
    let mut acc = [[_mm256_setzero_ps(); R]; A];
    let mut off = [[0f32; R]; A];
    // Rows past `n` repeat the last one (computed, never stored).
    let rp: [*const u8; R] = std::array::from_fn(|r| rows.add(r.min(n - 1) * rb));
    for b in 0..nb {
        let dx: [f32; A] = std::array::from_fn(|i| *acts[i].1.get_unchecked(8 * b));
        let sx: [f32; A] = std::array::from_fn(|i| {
            *acts[i].2.get_unchecked(2 * b) + *acts[i].2.get_unchecked(2 * b + 1)
        });
        let av: [__m256i; A] = std::array::from_fn(|i| {
            _mm256_loadu_si256(acts[i].0.as_ptr().add(b * 32) as *const __m256i)
        });
        let a_off: [__m256i; A] = std::array::from_fn(|i| act_offset::<F, VNNI>(av[i]));
        for r in 0..R {
            let blk = rp[r].add(b * bb);
            // Decoding streams weights faster than the hardware prefetcher fetches them: ask for
            // the bytes `PREFETCH` ahead (rows further down the matrix).
            // Prefetches never fault, and `wrapping_add` keeps the address computation defined.
            prefetch_ahead(blk.wrapping_add(PREFETCH), far);
            // d (and m) as f32 through F16C.
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
            let d = _mm_cvtss_f32(dm);
            let (w, q) = block_quants::<F>(blk);
            for i in 0..A {
                let p32 = block_lanes::<F, VNNI>(w, q, av[i], a_off[i]);
                acc[i][r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p32),
                    _mm256_set1_ps(d * dx[i]),
                    acc[i][r],
                );
                // Offset term m sx of Q4_1 and Q5_1.
                if F == 1 || F == 3 {
                    off[i][r] += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * sx[i];
                }
            }
        }
    }
    for i in 0..A {
        for r in 0..n {
            let v = acc[i][r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[i][r] = _mm_cvtss_f32(s) + off[i][r];
        }
    }
}

/// Bytes of one block of a packed group of [`ACTS`] activation rows (32-element block formats):
/// the four rows' 32 quants, then their four scales, then their four block sums.
pub(super) const GROUP_BLOCK: usize = ACTS * 32 + 2 * ACTS * 4;

/// Lay four quantized activation rows out block by block for [`dot_group`]: one stream read
/// front to back instead of twelve, the block sums `s0 + s1` added once here (as the per-row
/// kernel adds them).
///
/// # Safety
/// `dst` holds `nb * GROUP_BLOCK` bytes; each act row holds `nb` blocks.
pub(super) unsafe fn pack_group(acts: &[Act<'_>; ACTS], nb: usize, dst: *mut u8) {
    for b in 0..nb {
        let blk = dst.add(b * GROUP_BLOCK);
        for (i, (qx, la, xs)) in acts.iter().enumerate() {
            std::ptr::copy_nonoverlapping(
                qx.as_ptr().add(b * 32) as *const u8,
                blk.add(32 * i),
                32,
            );
            let f = blk.add(ACTS * 32) as *mut f32;
            f.add(i).write_unaligned(la[8 * b]);
            f.add(ACTS + i).write_unaligned(xs[2 * b] + xs[2 * b + 1]);
        }
    }
}

/// [`dot_rows`] for a packed group of four activation rows ([`pack_group`]): the same float
/// steps per (weight row, activation row) in the same order (so the same results as the rows
/// taken one at a time), with the scale products `d dx` and offset terms `m sx` of the four
/// activation rows made four at a time and every activation read from one stream. Formats as
/// [`dot_rows`]: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0.
#[inline(always)]
unsafe fn dot_group<const F: u8, const VNNI: u8>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    pk: *const u8,
    out: &mut [[f32; ROWS]; ACTS],
) {
    use std::arch::x86_64::*;
    const R: usize = ROWS;
    const A: usize = ACTS;
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = rb / bb;
    let mut acc = [[_mm256_setzero_ps(); R]; A];
    // Offset terms m sx of weight row r in lane i (activation row) of `off[r]`.
    let mut off = [_mm_setzero_ps(); R];
    let rp: [*const u8; R] = std::array::from_fn(|r| rows.add(r.min(n - 1) * rb));
    // The scale products of the current block, read back as broadcasts.
    let mut scale = [0f32; R * A];
    for b in 0..nb {
        let blk = pk.add(b * GROUP_BLOCK);
        let av: [__m256i; A] =
            std::array::from_fn(|i| _mm256_loadu_si256(blk.add(32 * i) as *const __m256i));
        let dx = _mm_loadu_ps(blk.add(A * 32) as *const f32);
        let sx = _mm_loadu_ps(blk.add(A * 32 + 16) as *const f32);
        let a_off: [__m256i; A] = std::array::from_fn(|i| act_offset::<F, VNNI>(av[i]));
        for r in 0..R {
            let wb = rp[r].add(b * bb);
            prefetch_ahead(wb.wrapping_add(PREFETCH), far);
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((wb as *const i32).read_unaligned()));
            // d dx_i for the four activation rows: the products a scalar `d * dx` gives.
            _mm_storeu_ps(
                scale.as_mut_ptr().add(A * r),
                _mm_mul_ps(_mm_broadcastss_ps(dm), dx),
            );
            if F == 1 || F == 3 {
                // `off += m * sx`: product, then sum, each rounded as the scalar steps are.
                off[r] = _mm_add_ps(off[r], _mm_mul_ps(_mm_permute_ps::<0x55>(dm), sx));
            }
        }
        // Read back from memory (broadcast loads rather than shuffles).
        std::hint::black_box(&mut scale);
        for r in 0..R {
            let (w, q) = block_quants::<F>(rp[r].add(b * bb));
            for i in 0..A {
                let p32 = block_lanes::<F, VNNI>(w, q, av[i], a_off[i]);
                acc[i][r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p32),
                    _mm256_broadcast_ss(&*scale.as_ptr().add(A * r + i)),
                    acc[i][r],
                );
            }
        }
    }
    for r in 0..n {
        let mut o = [0f32; A];
        _mm_storeu_ps(o.as_mut_ptr(), off[r]);
        for i in 0..A {
            let v = acc[i][r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[i][r] = _mm_cvtss_f32(s) + o[i];
        }
    }
}

/// [`dot_group`] for `ty`, dispatched on the VNNI form; false (nothing computed) when `ty` is
/// not a 32-element block format (see [`grouped`]).
///
/// # Safety
/// As [`dot_packed_rows`], with `pk` a group packed by [`pack_group`] for this `k`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dot_group_rows(
    ty: GgmlType,
    vnni: Vnni,
    far: bool,
    rows: *const u8,
    rb: usize,
    n: usize,
    pk: *const u8,
    out: &mut [[f32; ROWS]; ACTS],
) -> bool {
    // One instance per VNNI form, each compiled with the features it needs.
    macro_rules! form {
        ($name:ident, $features:literal, $vnni:expr) => {
            #[target_feature(enable = $features)]
            unsafe fn $name<const F: u8>(
                rows: *const u8,
                rb: usize,
                n: usize,
                far: bool,
                pk: *const u8,
                out: &mut [[f32; ROWS]; ACTS],
            ) {
                dot_group::<F, { $vnni as u8 }>(rows, rb, n, far, pk, out)
            }
        };
    }
    form!(vex, "avx2,fma,f16c,avxvnni", Vnni::Vex);
    form!(
        evex,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        Vnni::Evex
    );
    form!(plain, "avx2,fma,f16c", Vnni::None);
    macro_rules! go {
        ($f:literal) => {
            match vnni {
                Vnni::Vex => vex::<$f>(rows, rb, n, far, pk, out),
                Vnni::Evex => evex::<$f>(rows, rb, n, far, pk, out),
                Vnni::None => plain::<$f>(rows, rb, n, far, pk, out),
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => go!(0),
        GgmlType::Q4_1 => go!(1),
        GgmlType::Q5_0 => go!(2),
        GgmlType::Q5_1 => go!(3),
        GgmlType::Q8_0 => go!(4),
        _ => return false,
    }
    true
}
