//! The register-blocked attention of one (batch, head) with small heads (AVX-512).

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
