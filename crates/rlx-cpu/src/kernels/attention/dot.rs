//! The two products of a bf16 attention tile with AVX-512 BF16.

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
/// holds [`super::blocked::bf16_scratch_per_thread`] bytes for at least `t.rows` and `t.ncol`.
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
    let at = |p: *const u16, i: usize, n: usize, s: usize| if i < n { *p.add(i * s) } else { 0 };
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
