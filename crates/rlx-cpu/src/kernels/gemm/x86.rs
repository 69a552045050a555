//! The x86 micro-kernels of [`super`]: AVX-512 (12×32 tiles and 4- / 8-row short tiles) and
//! AVX2 (6×16) tiles of C from packed or in-place A and B, and the packing helpers that use
//! vector shuffles (transposed B, column-major A).

use super::store_tile;
use std::arch::x86_64::*;

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn micro_12x32(
    kc: usize,
    a: *const f32,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    micro_avx512::<12, 2, 32, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, next)
}

/// [`micro_12x32`] reading A in place from rows `ars` apart (row-major A).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn micro_12x32_rows(
    kc: usize,
    a: *const f32,
    ars: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    micro_avx512::<12, 2, 32, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, next)
}

/// A tile of at most 8 rows (the last of a block whose height is not a multiple of 12): a
/// 4- or 8-row kernel, so the missing rows cost no multiply-adds.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn micro_short(
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
) {
    let null = std::ptr::null();
    match (rows <= 4, ars == 1) {
        (true, true) => {
            micro_avx512::<4, 2, 32, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, null)
        }
        (true, false) => {
            micro_avx512::<4, 2, 32, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, null)
        }
        (false, true) => {
            micro_avx512::<8, 2, 32, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, null)
        }
        (false, false) => {
            micro_avx512::<8, 2, 32, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, null)
        }
    }
}

/// `MR` rows of C by `NV` vectors of 16 columns (`NR = 16 * NV`). A element `(i, p)` is
/// at `a[i * lda + p]` when `ROWS`, else at `a[p * lda + i]` (packed A: `lda = MR`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn micro_avx512<const MR: usize, const NV: usize, const NR: usize, const ROWS: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    let mut r = [[_mm512_setzero_ps(); NV]; MR];
    // The C tile of the next call (rows `ldc` apart, so they share L1 sets) is fetched one
    // line per `chunk` k steps, spread over this call's loop: all at once they would fill
    // the line-fill buffers the A and B streams need, and C's rows would evict B from L1
    // long before they are read.
    let lines = if next.is_null() { 0 } else { MR * NV };
    let chunk = kc.checked_div(lines).unwrap_or(kc).max(1);
    let mut line = 0;
    let mut p0 = 0;
    while p0 < kc {
        if line < lines {
            // `wrapping_add`: a partial next tile has fewer rows; prefetching past them is harmless.
            _mm_prefetch::<_MM_HINT_T0>(
                next.wrapping_add((line / NV) * ldc + 16 * (line % NV)) as *const i8
            );
            line += 1;
        }
        let end = (p0 + chunk).min(kc);
        for p in p0..end {
            let bp = b.add(p * ldb);
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(bp.add(16 * v));
            }
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm512_set1_ps(if ROWS {
                    *a.add(i * lda + p)
                } else {
                    *a.add(p * lda + i)
                });
                for v in 0..NV {
                    ri[v] = _mm512_fmadd_ps(av, bv[v], ri[v]);
                }
            }
        }
        p0 = end;
    }
    if rows == MR && cols == NR {
        for (i, ri) in r.iter().enumerate() {
            let cp = c.add(i * ldc);
            for (v, x) in ri.iter().enumerate() {
                let mut y = *x;
                if acc {
                    y = _mm512_add_ps(y, _mm512_loadu_ps(cp.add(16 * v)));
                }
                _mm512_storeu_ps(cp.add(16 * v), y);
            }
        }
    } else {
        let mut t = [[0f32; NR]; MR];
        for (i, ri) in r.iter().enumerate() {
            for (v, x) in ri.iter().enumerate() {
                _mm512_storeu_ps(t[i].as_mut_ptr().add(16 * v), *x);
            }
        }
        store_tile(&t, c, ldc, acc, rows, cols);
    }
}

/// Pack rows `0..kc` (a multiple of 16) of an `nr`-column sliver (a multiple of 16) of a B
/// whose columns are contiguous (`b[j * cs + p]`) as `dst[p * nr + j]`, transposing 16×16
/// blocks in registers: 16 loads, 64 shuffles and 16 stores per 256 floats instead of 256
/// scalar copies.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_b_transposed(
    kc: usize,
    nr: usize,
    b: *const f32,
    cs: usize,
    dst: *mut f32,
) {
    let mut p = 0;
    while p < kc {
        for j0 in (0..nr).step_by(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (j, x) in r.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add((j0 + j) * cs + p));
            }
            transpose16(&mut r);
            for (q, x) in r.iter().enumerate() {
                _mm512_storeu_ps(dst.add((p + q) * nr + j0), *x);
            }
        }
        p += 16;
    }
}

/// Copy `rows` rows of `W` floats (at most 32), `stride` apart in `src`, to consecutive rows
/// of `dst`: the packing copies, as masked vector moves instead of a `memcpy` call each.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn copy_rows<const W: usize>(
    rows: usize,
    src: *const f32,
    stride: usize,
    dst: *mut f32,
) {
    let lo: __mmask16 = if W >= 16 {
        0xffff
    } else {
        (1u32 << W) as u16 - 1
    };
    let hi: __mmask16 = if W >= 32 {
        0xffff
    } else if W > 16 {
        (1u32 << (W - 16)) as u16 - 1
    } else {
        0
    };
    for p in 0..rows {
        let (sp, dp) = (src.add(p * stride), dst.add(p * W));
        _mm512_mask_storeu_ps(dp, lo, _mm512_maskz_loadu_ps(lo, sp));
        if hi != 0 {
            _mm512_mask_storeu_ps(dp.add(16), hi, _mm512_maskz_loadu_ps(hi, sp.add(16)));
        }
    }
}

/// Pack `slivers` full 12-row slivers of a column-major A (`a[i + p * cs]`) over `kc` k
/// steps as `dst[(s * kc + p) * 12 + i]`, reading each column's `12 * slivers` floats as
/// one run.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_a_columns(
    slivers: usize,
    kc: usize,
    a: *const f32,
    cs: usize,
    dst: *mut f32,
) {
    const M: __mmask16 = 0x0fff;
    for p in 0..kc {
        let col = a.add(p * cs);
        for s in 0..slivers {
            _mm512_mask_storeu_ps(
                dst.add((s * kc + p) * 12),
                M,
                _mm512_maskz_loadu_ps(M, col.add(s * 12)),
            );
        }
    }
}

/// Transpose a 16×16 block held as 16 rows: afterwards `r[q]` holds column `q`.
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    // Interleave 32-bit elements of row pairs, then 64-bit pairs of those, then move
    // 128-bit lanes twice: the classic four-stage transpose.
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for k in 0..4 {
        let (a, b, c, d) = (t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
        r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(c)));
        r[4 * k + 1] =
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(c)));
        r[4 * k + 2] =
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b), _mm512_castps_pd(d)));
        r[4 * k + 3] =
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b), _mm512_castps_pd(d)));
    }
    for base in [0, 8] {
        for k in 0..4 {
            t[base + k] = _mm512_shuffle_f32x4::<0x88>(r[base + k], r[base + k + 4]);
            t[base + k + 4] = _mm512_shuffle_f32x4::<0xdd>(r[base + k], r[base + k + 4]);
        }
    }
    for k in 0..8 {
        r[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
        r[k + 8] = _mm512_shuffle_f32x4::<0xdd>(t[k], t[k + 8]);
    }
}

/// AVX2 tile of 16 columns: 6 rows, or a 2- or 4-row kernel for a short tile (the tail of
/// a block whose height is not a multiple of 6), so missing rows cost no multiply-adds. A
/// is packed (`ars = 1`, `acs = 6`) or read in place from rows `ars` apart (`acs = 1`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro_avx2(
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    let null = std::ptr::null();
    match (rows, ars == 1) {
        (5.., true) => micro_ymm::<6, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, next),
        (5.., false) => micro_ymm::<6, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, next),
        (3..=4, true) => micro_ymm::<4, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, null),
        (3..=4, false) => micro_ymm::<4, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, null),
        (_, true) => micro_ymm::<2, false>(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, null),
        (_, false) => micro_ymm::<2, true>(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, null),
    }
}

/// `MR` rows of C by 16 columns in 256-bit registers; A element `(i, p)` at `a[i * lda + p]`
/// when `ROWS`, else at `a[p * lda + i]`. The next call's C tile is prefetched one line
/// every few k steps, as in the AVX-512 kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn micro_ymm<const MR: usize, const ROWS: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    let mut r = [[_mm256_setzero_ps(); 2]; MR];
    let lines = if next.is_null() { 0 } else { MR };
    let chunk = kc.checked_div(lines).unwrap_or(kc).max(1);
    let mut line = 0;
    let mut p0 = 0;
    while p0 < kc {
        if line < lines {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line * ldc) as *const i8);
            line += 1;
        }
        let end = (p0 + chunk).min(kc);
        for p in p0..end {
            let bp = b.add(p * ldb);
            let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*if ROWS {
                    a.add(i * lda + p)
                } else {
                    a.add(p * lda + i)
                });
                ri[0] = _mm256_fmadd_ps(av, b0, ri[0]);
                ri[1] = _mm256_fmadd_ps(av, b1, ri[1]);
            }
        }
        p0 = end;
    }
    if rows == MR && cols == 16 {
        for (i, ri) in r.iter().enumerate() {
            let cp = c.add(i * ldc);
            for (v, x) in ri.iter().enumerate() {
                let y = if acc {
                    _mm256_add_ps(*x, _mm256_loadu_ps(cp.add(8 * v)))
                } else {
                    *x
                };
                _mm256_storeu_ps(cp.add(8 * v), y);
            }
        }
    } else {
        let mut t = [[0f32; 16]; MR];
        for (i, ri) in r.iter().enumerate() {
            _mm256_storeu_ps(t[i].as_mut_ptr(), ri[0]);
            _mm256_storeu_ps(t[i].as_mut_ptr().add(8), ri[1]);
        }
        store_tile(&t, c, ldc, acc, rows, cols);
    }
}

/// Pack rows `0..kc` (a multiple of 8) of a 16-column sliver of a B whose columns are
/// contiguous (`b[j * cs + p]`) as `dst[p * 16 + j]`, transposing 8×8 blocks in registers.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_b_transposed8(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    let mut p = 0;
    while p < kc {
        for j0 in [0, 8] {
            let mut r = [_mm256_setzero_ps(); 8];
            for (j, x) in r.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(b.add((j0 + j) * cs + p));
            }
            transpose8(&mut r);
            for (q, x) in r.iter().enumerate() {
                _mm256_storeu_ps(dst.add((p + q) * 16 + j0), *x);
            }
        }
        p += 8;
    }
}

/// Transpose an 8×8 block held as 8 rows: afterwards `r[q]` holds column `q`.
#[inline(always)]
unsafe fn transpose8(r: &mut [__m256; 8]) {
    let mut t = [_mm256_setzero_ps(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for k in 0..2 {
        let (a, b, c, d) = (t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
        r[4 * k] = _mm256_shuffle_ps::<0x44>(a, c);
        r[4 * k + 1] = _mm256_shuffle_ps::<0xee>(a, c);
        r[4 * k + 2] = _mm256_shuffle_ps::<0x44>(b, d);
        r[4 * k + 3] = _mm256_shuffle_ps::<0xee>(b, d);
    }
    for k in 0..4 {
        t[k] = _mm256_permute2f128_ps::<0x20>(r[k], r[k + 4]);
        t[k + 4] = _mm256_permute2f128_ps::<0x31>(r[k], r[k + 4]);
    }
    *r = t;
}
