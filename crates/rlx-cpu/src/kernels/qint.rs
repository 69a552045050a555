//! The int8 integer ops (`qlinear`, `qconv2d`, `qadd`, `qpool`; `rlx_ir::ops::qint`), bit for
//! bit as the reference evaluator computes them: products summed exactly in `i32`, then the
//! fixed-point requantization of `rlx_ir::quant::fixed`.
//!
//! The products take the input less its zero point as `i16` (exact: `[-255, 255]`) against the
//! `i8` weights widened to `i16`, in pairs summed to `i32` (x86's `pmaddwd`; `vpdpwssd` where
//! AVX-512 VNNI is present), 32 or 64 lanes at a time. A convolution gathers each output
//! position's window into such a row first (padding as zero, which the zero point makes it).
//! Work is split over output channels for one row and over rows for several. With AVX-512
//! VNNI, several rows (a batch, or a convolution's output positions) take `vpdpbusd` instead:
//! the input as u8 (`x + 128`) against weights packed 16 channels by 4 products per register,
//! four rows sharing each weight load, the offset taken back out through the weight sums.
//! Convolutions whose kernel rows are at most four wide take output positions as lanes
//! instead ([`conv_lanes`], with AVX-512 VBMI): sixteen positions' window rows gathered by one
//! byte permute of a 64-byte load, each output channel's sixteen results requantized together
//! and stored straight into the NCHW result. Max pooling of planes of at most 64 bytes is a
//! byte permute per window element.

use super::registered::{view, CpuKernel};
use super::{par_ranges, Ptr};
use crate::pool::Pool;
use rlx_ir::ops::{pool_window, DefinedOp, QAdd, QConv2d, QLinear, QOut, QPool};
use rlx_ir::quant::fixed;
use rlx_ir::{PoolKind, Shape};
use std::sync::Arc;

pub(super) fn kernel_of(op: &DefinedOp) -> Option<CpuKernel> {
    if let Some(&q) = op.downcast::<QLinear>() {
        return Some(Arc::new(move |_, ins, out, _, pool| {
            qlinear(q, ins, out, pool, None)
        }));
    }
    if let Some(&q) = op.downcast::<QConv2d>() {
        return Some(Arc::new(move |_, ins, out, shape, pool| {
            qconv2d(q, ins, out, shape, pool, None)
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

/// Weights packed for AVX-512 VNNI's `vpdpbusd` (u8 × s8 in groups of four, summed into i32
/// lanes): per block of 16 output channels, per group of 4 products, the 16 channels' 4
/// weights (64 bytes); channels and products past the end are zero. With each channel's
/// weight sum, which turns the products of `x + 128` (the u8 operand) back into those of
/// `x - zp`: `Σ (x - zp) w = Σ (x + 128) w - (128 + zp) Σ w`, exactly (wrapping i32).
struct Packed {
    data: Vec<i8>,
    sums: Vec<i32>,
    /// Groups of four products.
    groups: usize,
    /// Blocks of 16 channels.
    blocks: usize,
}

fn pack(w: &[i8], n: usize, k: usize) -> Packed {
    let groups = k.div_ceil(4);
    let blocks = n.div_ceil(16);
    let mut data = vec![0i8; blocks * groups * 64];
    for c in 0..n {
        let (b, lane) = (c / 16, c % 16);
        for (i, &v) in w[c * k..(c + 1) * k].iter().enumerate() {
            data[(b * groups + i / 4) * 64 + lane * 4 + i % 4] = v;
        }
    }
    let sums = (0..n)
        .map(|c| w[c * k..(c + 1) * k].iter().map(|&v| v as i32).sum())
        .collect();
    Packed {
        data,
        sums,
        groups,
        blocks,
    }
}

/// Whether this thread may use the packed VNNI products.
fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx512()
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `acc[r][c] = Σ_i rows[r][i] · w[c][i]` for `m` rows of u8 (`4 · groups` bytes each) against
/// packed weights; `acc` holds `16 · blocks` lanes per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_vnni(rows: &[u8], m: usize, p: &Packed, acc: &mut [i32]) {
    use std::arch::x86_64::*;
    let kp = 4 * p.groups;
    let np = 16 * p.blocks;
    debug_assert!(rows.len() >= m * kp && acc.len() >= m * np);
    // SAFETY: row `r < m` has `kp = 4 · groups` bytes, so group `g` is in bounds.
    let word = |r: usize, g: usize| -> i32 {
        unsafe { std::ptr::read_unaligned(rows.as_ptr().add(r * kp + 4 * g) as *const i32) }
    };
    let mut r = 0;
    while r < m {
        let rs = (m - r).min(4);
        for b in 0..p.blocks {
            let mut a = [_mm512_setzero_si512(); 4];
            for g in 0..p.groups {
                // SAFETY: 64 packed bytes per (block, group).
                let wv = unsafe {
                    _mm512_loadu_si512(
                        p.data.as_ptr().add((b * p.groups + g) * 64) as *const __m512i
                    )
                };
                for (i, ai) in a.iter_mut().enumerate().take(rs) {
                    *ai = _mm512_dpbusd_epi32(*ai, _mm512_set1_epi32(word(r + i, g)), wv);
                }
            }
            for (i, ai) in a.iter().enumerate().take(rs) {
                // SAFETY: row `r + i` has `np` lanes, block `b` 16 of them.
                unsafe {
                    _mm512_storeu_si512(
                        acc.as_mut_ptr().add((r + i) * np + 16 * b) as *mut __m512i,
                        *ai,
                    )
                };
            }
        }
        r += rs;
    }
}

/// The accumulators of `m` u8 rows against packed weights (see [`gemm_vnni`]); only called
/// where [`vnni`] holds.
fn gemm(rows: &[u8], m: usize, p: &Packed, acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: callers checked `vnni()`.
    unsafe {
        gemm_vnni(rows, m, p, acc)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, m, p, acc);
    }
}

/// Per output channel, padded to whole blocks of 16, as lanes: what turns a product of u8
/// rows into the accumulator (`bias - (128 + zp) Σ w`, wrapping), the multiplier and the
/// shift.
struct Lanes {
    corr: Vec<i32>,
    mult: Vec<i32>,
    shift: Vec<i32>,
}

impl Lanes {
    fn of(ch: &[(i32, i32, i32)], p: &Packed, x_zero_point: i32) -> Lanes {
        let n = 16 * p.blocks;
        let mut l = Lanes {
            corr: vec![0; n],
            mult: vec![0; n],
            shift: vec![0; n],
        };
        let off = 128 + x_zero_point;
        for (c, &(b, m, s)) in ch.iter().enumerate() {
            l.corr[c] = b.wrapping_sub(off.wrapping_mul(p.sums[c]));
            (l.mult[c], l.shift[c]) = (m, s);
        }
        l
    }
}

/// Sixteen accumulators of a row (block `b` of its channels, `acc` holding the row's lanes)
/// corrected by the weight sums, biased and requantized: the int8 results, bit for bit
/// [`fixed::requantize`] per lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn requant_x16(acc: &[i32], b: usize, l: &Lanes, out: QOut) -> [u8; 16] {
    use std::arch::x86_64::*;
    let at = 16 * b;
    debug_assert!(acc.len() >= at + 16 && l.corr.len() >= at + 16);
    // SAFETY (all loads): the row's lanes and the channel lanes hold `16 · blocks` values.
    let ld = |v: &[i32]| unsafe { _mm512_loadu_si512(v.as_ptr().add(at) as *const __m512i) };
    let a = _mm512_add_epi32(ld(acc), ld(&l.corr));
    let mut bytes = [0u8; 16];
    // SAFETY: 16 bytes; AVX-512 F and BW are enabled here.
    unsafe {
        _mm_storeu_si128(
            bytes.as_mut_ptr() as *mut __m128i,
            requant_v(a, ld(&l.mult), ld(&l.shift), out),
        )
    };
    bytes
}

/// Sixteen corrected accumulators `a` requantized by multipliers `m` and shifts `sh` (per
/// lane): the int8 results, bit for bit [`fixed::requantize`] per lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn requant_v(
    a: std::arch::x86_64::__m512i,
    m: std::arch::x86_64::__m512i,
    sh: std::arch::x86_64::__m512i,
    out: QOut,
) -> std::arch::x86_64::__m128i {
    std::arch::x86_64::_mm512_cvtepi32_epi8(requant_lanes(a, m, sh, out))
}

/// [`requant_v`], each result in its lane's i32. The saturating left shift in 32 bits; the
/// doubling high multiply and the rounding right shift in 64 bits, on the products of the
/// even lanes and (shifted down) of the odd ones: gemmlowp's nudge-and-truncate is
/// `floor((ab + 2^30) / 2^31)` for either sign of `ab` (`i32::MAX` for `MIN · MIN`, the one
/// product of `2^62`), and its rounding divide by `2^e` (ties away from zero) is
/// `floor((h + 2^(e-1) - [h < 0]) / 2^e)` for `e > 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn requant_lanes(
    a: std::arch::x86_64::__m512i,
    m: std::arch::x86_64::__m512i,
    sh: std::arch::x86_64::__m512i,
    out: QOut,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_si512();
    let left = _mm512_max_epi32(sh, zero);
    let right = _mm512_max_epi32(_mm512_sub_epi32(zero, sh), zero);
    // Saturating left shift: where shifting back does not restore the value, the result
    // saturates to the sign's end.
    let shifted = _mm512_sllv_epi32(a, left);
    let lost = _mm512_cmpneq_epi32_mask(_mm512_srav_epi32(shifted, left), a);
    let neg = _mm512_cmplt_epi32_mask(a, zero);
    let x = _mm512_mask_mov_epi32(shifted, lost, _mm512_set1_epi32(i32::MAX));
    let x = _mm512_mask_mov_epi32(x, lost & neg, _mm512_set1_epi32(i32::MIN));
    let one = _mm512_set1_epi64(1);
    let scaled = |p: __m512i, e: __m512i| -> __m512i {
        let h = _mm512_srai_epi64::<31>(_mm512_add_epi64(p, _mm512_set1_epi64(1 << 30)));
        let both_min = _mm512_cmpeq_epi64_mask(p, _mm512_set1_epi64(1 << 62));
        let h = _mm512_mask_mov_epi64(h, both_min, _mm512_set1_epi64(i32::MAX as i64));
        // 2^(e-1), and 0 for e = 0 (a count past 63 shifts everything out).
        let half = _mm512_sllv_epi64(one, _mm512_sub_epi64(e, one));
        let sign = _mm512_maskz_mov_epi64(
            _mm512_cmpneq_epi64_mask(e, zero),
            _mm512_srai_epi64::<63>(h),
        );
        _mm512_srav_epi64(_mm512_add_epi64(_mm512_add_epi64(h, half), sign), e)
    };
    let low = _mm512_set1_epi64(0xffff_ffff);
    let even = scaled(_mm512_mul_epi32(x, m), _mm512_and_si512(right, low));
    let odd = scaled(
        _mm512_mul_epi32(_mm512_srli_epi64::<32>(x), _mm512_srli_epi64::<32>(m)),
        _mm512_srli_epi64::<32>(right),
    );
    let r = _mm512_mask_blend_epi32(0xaaaa, even, _mm512_slli_epi64::<32>(odd));
    // Offset and clamp: clamping to [lo - zp, hi - zp] then adding zp is the reference's
    // saturating add and clamp.
    let r = _mm512_min_epi32(
        _mm512_max_epi32(r, _mm512_set1_epi32(out.lo - out.zero_point)),
        _mm512_set1_epi32(out.hi - out.zero_point),
    );
    _mm512_add_epi32(r, _mm512_set1_epi32(out.zero_point))
}

/// The int8 results of a row's channels in block `b` (see [`requant_x16`]); only called where
/// [`vnni`] holds.
fn requant_block(acc: &[i32], b: usize, l: &Lanes, out: QOut) -> [u8; 16] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: callers checked `vnni()`, which includes AVX-512 F and BW.
    unsafe {
        requant_x16(acc, b, l, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (acc, b, l, out);
        [0; 16]
    }
}

/// Packed weights and their channels' lanes: once, at lowering, where the weights and
/// requantization operands are constants; at each run otherwise.
struct Prepared {
    packed: Packed,
    lanes: Lanes,
    /// A convolution's weights for [`conv_lanes`], where its kernel rows fit a word.
    words: Option<ConvWords>,
}

impl Prepared {
    fn new(w: &[i8], ch: &[(i32, i32, i32)], k: usize, x_zero_point: i32) -> Prepared {
        let packed = pack(&w[..ch.len() * k], ch.len(), k);
        let lanes = Lanes::of(ch, &packed, x_zero_point);
        Prepared {
            packed,
            lanes,
            words: None,
        }
    }

    /// A convolution's weights `[o, c, kh, kw]`, packed both ways.
    fn conv(w: &[i8], ch: &[(i32, i32, i32)], wd: &[usize], x_zero_point: i32) -> Prepared {
        let mut p = Prepared::new(w, ch, wd[1] * wd[2] * wd[3], x_zero_point);
        p.words = ConvWords::new(w, wd, &p.lanes);
        p
    }
}

/// A convolution's weights for [`conv_lanes`]: per output channel (padded with zero channels
/// to whole blocks of 16), per input channel and kernel row, the row's weights (`kw ≤ 4`) as
/// one word, zero past `kw`; with the channels' corrected biases, multipliers and shifts.
struct ConvWords {
    /// `[blocks · 16][rows]`, `rows = c · kh`.
    words: Vec<i32>,
    rows: usize,
    corr: Vec<i32>,
    mult: Vec<i32>,
    shift: Vec<i32>,
}

impl ConvWords {
    fn new(w: &[i8], wd: &[usize], l: &Lanes) -> Option<ConvWords> {
        let (o, c, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
        if kw > 4 || w.len() < o * c * kh * kw {
            return None;
        }
        let rows = c * kh;
        let o16 = o.div_ceil(16) * 16;
        let mut words = vec![0i32; o16 * rows];
        for oc in 0..o {
            for r in 0..rows {
                let mut b = [0u8; 4];
                for (kx, v) in b.iter_mut().enumerate().take(kw) {
                    *v = w[(oc * rows + r) * kw + kx] as u8;
                }
                words[oc * rows + r] = i32::from_le_bytes(b);
            }
        }
        let lane =
            |v: &[i32]| -> Vec<i32> { (0..o16).map(|i| v.get(i).copied().unwrap_or(0)).collect() };
        Some(ConvWords {
            words,
            rows,
            corr: lane(&l.corr),
            mult: lane(&l.mult),
            shift: lane(&l.shift),
        })
    }
}

/// [`requant_lanes`] for one multiplier `m` and `shift` across the lanes (one channel's
/// accumulators), its shifts by a scalar count: the same results, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn requant_uniform(
    a: std::arch::x86_64::__m512i,
    m: i32,
    shift: i32,
    out: QOut,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let (left, right) = (shift.max(0), (-shift).max(0));
    let zero = _mm512_setzero_si512();
    let x = if left > 0 {
        let count = _mm_cvtsi32_si128(left);
        let shifted = _mm512_sll_epi32(a, count);
        let lost = _mm512_cmpneq_epi32_mask(_mm512_sra_epi32(shifted, count), a);
        let neg = _mm512_cmplt_epi32_mask(a, zero);
        let x = _mm512_mask_mov_epi32(shifted, lost, _mm512_set1_epi32(i32::MAX));
        _mm512_mask_mov_epi32(x, lost & neg, _mm512_set1_epi32(i32::MIN))
    } else {
        a
    };
    let mv = _mm512_set1_epi32(m);
    let half = _mm512_set1_epi64(if right > 0 { 1i64 << (right - 1) } else { 0 });
    let count = _mm_cvtsi64_si128(right as i64);
    let scaled = |p: __m512i| -> __m512i {
        let h = _mm512_srai_epi64::<31>(_mm512_add_epi64(p, _mm512_set1_epi64(1 << 30)));
        let h = if m == i32::MIN {
            let both_min = _mm512_cmpeq_epi64_mask(p, _mm512_set1_epi64(1 << 62));
            _mm512_mask_mov_epi64(h, both_min, _mm512_set1_epi64(i32::MAX as i64))
        } else {
            h
        };
        if right == 0 {
            return h;
        }
        let t = _mm512_add_epi64(_mm512_add_epi64(h, half), _mm512_srai_epi64::<63>(h));
        _mm512_sra_epi64(t, count)
    };
    let even = scaled(_mm512_mul_epi32(x, mv));
    let odd = scaled(_mm512_mul_epi32(_mm512_srli_epi64::<32>(x), mv));
    let r = _mm512_mask_blend_epi32(0xaaaa, even, _mm512_slli_epi64::<32>(odd));
    let r = _mm512_min_epi32(
        _mm512_max_epi32(r, _mm512_set1_epi32(out.lo - out.zero_point)),
        _mm512_set1_epi32(out.hi - out.zero_point),
    );
    _mm512_add_epi32(r, _mm512_set1_epi32(out.zero_point))
}

/// The `rows` rows of `wi` int8 values of `x` (`h` to a plane) as u8 (`x + 128`) into the
/// padded planes of `xp` (`hp × wp`, the rows placed `pt` down and `pl` across), by masked
/// 64-byte loads and stores.
#[target_feature(enable = "avx512f,avx512bw")]
#[cfg(target_arch = "x86_64")]
unsafe fn shifted_rows(
    x: &[i8],
    xp: &mut [u8],
    (rows, h, wi): (usize, usize, usize),
    (hp, wp): (usize, usize),
    (pt, pl): (usize, usize),
) {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(i8::MIN);
    for r in 0..rows {
        let (plane, y) = (r / h, r % h);
        let dst = (plane * hp + y + pt) * wp + pl;
        debug_assert!(dst + wi <= xp.len() && (r + 1) * wi <= x.len());
        let mut i = 0;
        while i < wi {
            let n = (wi - i).min(64);
            let mask: __mmask64 = if n == 64 { !0 } else { (1u64 << n) - 1 };
            // SAFETY: bytes `i..i + n` of row `r` and of its place in `xp` are in bounds; the
            // rest of each 64 is masked off.
            unsafe {
                let v = _mm512_maskz_loadu_epi8(mask, x.as_ptr().add(r * wi + i));
                _mm512_mask_storeu_epi8(
                    xp.as_mut_ptr().add(dst + i) as *mut i8,
                    mask,
                    _mm512_xor_si512(v, flip),
                );
            }
            i += n;
        }
    }
}

/// Whether this thread may use [`conv_lanes`] (AVX-512 VBMI's byte permutes besides VNNI).
fn vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        vnni()
            && std::is_x86_feature_detected!("avx512vbmi")
            && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where the windows of 16 consecutive output positions of one image lie in the padded
/// input: per block of 16 positions, the offset of its first position's window (from the
/// image's kernel-row base) and the byte permute giving lane `j` its window row's four bytes,
/// and how many of its positions are real. `None` when a block's windows span more than one
/// 64-byte load.
struct Windows {
    blocks: Vec<(usize, [u8; 64], usize)>,
}

impl Windows {
    fn new(ho: usize, wo: usize, wp: usize, stride: [usize; 2]) -> Option<Windows> {
        let positions = ho * wo;
        let off = |p: usize| (p / wo) * stride[0] * wp + (p % wo) * stride[1];
        let mut blocks = Vec::new();
        for b in 0..positions.div_ceil(16) {
            let (p0, real) = (16 * b, (positions - 16 * b).min(16));
            let base = off(p0);
            let mut idx = [0u8; 64];
            for j in 0..real {
                let rel = off(p0 + j) - base;
                if rel + 3 >= 64 {
                    return None;
                }
                for t in 0..4 {
                    idx[4 * j + t] = (rel + t) as u8;
                }
            }
            blocks.push((base, idx, real));
        }
        Some(Windows { blocks })
    }
}

/// A convolution with output positions as lanes: for each image and block of 16 positions,
/// each input channel and kernel row's window bytes of all 16 positions come from one 64-byte
/// load of the padded u8 input by one byte permute (four bytes a lane: the row's `kw ≤ 4`
/// values, the rest multiplied by zero weights), and take `vpdpbusd` against each of 16
/// output channels' broadcast weight word; each channel's 16 accumulators are then
/// requantized and stored straight into the NCHW result. `xp` is the padded input (planes of
/// `hp × wp`, 64 bytes of slack at the end).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn conv_lanes(
    xp: &[u8],
    images: std::ops::Range<usize>,
    (c, o, kh): (usize, usize, usize),
    (hp, wp): (usize, usize),
    win: &Windows,
    cw: &ConvWords,
    out_q: QOut,
    out: Ptr,
) {
    use std::arch::x86_64::*;
    let positions: usize = win.blocks.iter().map(|b| b.2).sum();
    for b in images {
        for (blk, &(base, ref idx, real)) in win.blocks.iter().enumerate() {
            let p0 = 16 * blk;
            // SAFETY: 64 bytes.
            let perm = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) };
            for ob in (0..o).step_by(16) {
                let mut acc = [_mm512_setzero_si512(); 16];
                for ci in 0..c {
                    for ky in 0..kh {
                        let at = ((b * c + ci) * hp + ky) * wp + base;
                        debug_assert!(at + 64 <= xp.len());
                        // SAFETY: the padded input has 64 bytes of slack past its last plane.
                        let raw =
                            unsafe { _mm512_loadu_si512(xp.as_ptr().add(at) as *const __m512i) };
                        let xv = _mm512_permutexvar_epi8(perm, raw);
                        let r = ci * kh + ky;
                        for (j, a) in acc.iter_mut().enumerate() {
                            // SAFETY: channel `ob + j < blocks · 16` has `rows` words.
                            let wv = unsafe { *cw.words.get_unchecked((ob + j) * cw.rows + r) };
                            *a = _mm512_dpbusd_epi32(*a, xv, _mm512_set1_epi32(wv));
                        }
                    }
                }
                let mask: __mmask16 = if real == 16 {
                    0xffff
                } else {
                    (1u16 << real) - 1
                };
                for (j, a) in acc.iter().enumerate().take(o - ob) {
                    let oc = ob + j;
                    let v = _mm512_add_epi32(*a, _mm512_set1_epi32(cw.corr[oc]));
                    let y = requant_uniform(v, cw.mult[oc], cw.shift[oc], out_q);
                    // SAFETY: positions p0..p0 + real of channel oc of image b are within the
                    // result and this task's.
                    unsafe {
                        _mm_mask_storeu_epi8(
                            out.get().add((b * o + oc) * positions + p0) as *mut i8,
                            mask,
                            _mm512_cvtepi32_epi8(y),
                        )
                    };
                }
            }
        }
    }
}

/// A kernel for a `qlinear` or `qconv2d` whose weights, bias, multipliers and shifts are
/// constants: the packing done now instead of at every run.
pub(super) fn prepared(info: &super::NodeInfo<'_>, op: &DefinedOp) -> Option<CpuKernel> {
    let c = |i: usize| info.consts.get(i).copied().flatten();
    let (w, b, m, s) = (c(1)?, c(2)?, c(3)?, c(4)?);
    // The buffers may be longer than the values (rounded up): read the operands' lengths.
    let n = info.ins[2].numel();
    let ch: Vec<(i32, i32, i32)> = view::<i32>(b)
        .iter()
        .zip(view::<i32>(m).iter())
        .zip(view::<i32>(s).iter())
        .take(n)
        .map(|((&b, &m), &s)| (b, m, s))
        .collect();
    let k = info.ins[1].numel() / n.max(1);
    if ch.len() != n || w.len() < n * k {
        return None;
    }
    let zp = match (op.downcast::<QLinear>(), op.downcast::<QConv2d>()) {
        (Some(q), _) => q.x_zero_point,
        (None, Some(q)) => q.x_zero_point,
        (None, None) => return None,
    };
    let pre = Arc::new(match op.downcast::<QConv2d>() {
        Some(_) => Prepared::conv(&view::<i8>(w), &ch, info.ins[1].dims(), zp),
        None => Prepared::new(&view::<i8>(w), &ch, k, zp),
    });
    if let Some(&q) = op.downcast::<QLinear>() {
        return Some(Arc::new(move |_, ins, out, _, pool| {
            qlinear(q, ins, out, pool, Some(&pre))
        }));
    }
    if let Some(&q) = op.downcast::<QConv2d>() {
        return Some(Arc::new(move |_, ins, out, shape, pool| {
            qconv2d(q, ins, out, shape, pool, Some(&pre))
        }));
    }
    None
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

fn qlinear(
    q: QLinear,
    ins: &[(&[u8], &Shape)],
    out: &mut [u8],
    pool: &Pool,
    pre: Option<&Prepared>,
) {
    let x = view::<i8>(ins[0].0);
    let w = view::<i8>(ins[1].0);
    let ch = channels(ins);
    let n = ch.len();
    let k = ins[1].1.static_dims().map_or(0, |d| d[1]);
    if n == 0 {
        return;
    }
    let rows = out.len() / n;
    if rows > 1 && vnni() {
        return qlinear_packed(q, &x, &w, &ch, k, rows, out, pool, pre);
    }
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

/// Several rows with VNNI: the rows as u8 (`x + 128`), products of packed weights, in blocks
/// of 16 rows per task.
#[allow(clippy::too_many_arguments)]
fn qlinear_packed(
    q: QLinear,
    x: &[i8],
    w: &[i8],
    ch: &[(i32, i32, i32)],
    k: usize,
    rows: usize,
    out: &mut [u8],
    pool: &Pool,
    pre: Option<&Prepared>,
) {
    let n = ch.len();
    let own;
    let Prepared {
        packed: p,
        lanes: l,
        ..
    } = match pre {
        Some(pre) => pre,
        None => {
            own = Prepared::new(w, ch, k, q.x_zero_point);
            &own
        }
    };
    let kp = 4 * p.groups;
    let np = 16 * p.blocks;
    let o = Ptr(out.as_mut_ptr());
    // Tasks of at least ~256k products: below that, handing work to another thread costs more
    // than it saves.
    let per_block = 16 * n * k;
    par_ranges(
        pool,
        rows.div_ceil(16),
        (1 << 18) / per_block.max(1) + 1,
        |blocks| {
            let r0 = blocks.start * 16;
            let r1 = (blocks.end * 16).min(rows);
            let m = r1 - r0;
            let mut u = vec![0u8; m * kp];
            for (r, row) in u.chunks_exact_mut(kp).enumerate() {
                for (d, &v) in row.iter_mut().zip(&x[(r0 + r) * k..(r0 + r + 1) * k]) {
                    *d = (v as u8) ^ 0x80;
                }
            }
            let mut acc = vec![0i32; m * np];
            gemm(&u, m, p, &mut acc);
            for r in 0..m {
                for b in 0..p.blocks {
                    let y = requant_block(&acc[r * np..(r + 1) * np], b, l, q.out);
                    let len = (n - 16 * b).min(16);
                    // SAFETY: row `r0 + r` of the result; tasks own disjoint rows.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            y.as_ptr(),
                            o.get().add((r0 + r) * n + 16 * b),
                            len,
                        )
                    };
                }
            }
        },
    );
}

fn qconv2d(
    q: QConv2d,
    ins: &[(&[u8], &Shape)],
    out: &mut [u8],
    shape: &Shape,
    pool: &Pool,
    pre: Option<&Prepared>,
) {
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
    if positions > 1 && vnni() {
        // Each position's window as a u8 row (`x + 128`; padding is the zero point, which
        // the weight sums take back out), 16 positions per product.
        let own;
        let prep = match pre {
            Some(pre) => pre,
            None => {
                own = Prepared::conv(&w, &ch, &wd, q.x_zero_point);
                &own
            }
        };
        let Prepared {
            packed: p,
            lanes: l,
            words,
        } = prep;
        let (kp, np) = (4 * p.groups, 16 * p.blocks);
        let pad = (q.x_zero_point as i8 as u8) ^ 0x80;
        // The input as u8 with its padding around it, so each window row is a plain copy.
        let ((pt, pb), (pl, pr)) = (q.padding[0], q.padding[1]);
        let (hp, wp) = (h + pt + pb, wi + pl + pr);
        let planes = od[0] * c;
        // 64 bytes of slack: windows are read as whole 64-byte loads or 4-byte words.
        let mut xp = vec![pad; planes * hp * wp + 64];
        let rows = planes * h;
        #[cfg(target_arch = "x86_64")]
        if x.len() >= rows * wi {
            // SAFETY: `vnni()` includes AVX-512 BW; `x` holds `rows` rows of `wi` bytes and
            // `xp` every padded plane.
            unsafe { shifted_rows(&x, &mut xp, (rows, h, wi), (hp, wp), (pt, pl)) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        for r in 0..rows {
            let (plane, y) = (r / h, r % h);
            let dst = &mut xp[(plane * hp + y + pt) * wp + pl..][..wi];
            for (d, &v) in dst.iter_mut().zip(&x[r * wi..(r + 1) * wi]) {
                *d = (v as u8) ^ 0x80;
            }
        }
        let xp = &xp;
        #[cfg(target_arch = "x86_64")]
        if let (Some(cw), Some(win), true) = (words, Windows::new(ho, wo, wp, q.stride), vbmi()) {
            let per_image = win.blocks.len() * c * kh * o.div_ceil(16) * 16;
            par_ranges(pool, od[0], (1 << 14) / per_image.max(1) + 1, |images| {
                // SAFETY: `vbmi()` holds; `xp` has its slack; each task owns its images.
                unsafe { conv_lanes(xp, images, (c, o, kh), (hp, wp), &win, cw, q.out, out_ptr) }
            });
            return;
        }
        let per_block = 16 * o * k;
        par_ranges(
            pool,
            positions.div_ceil(16),
            (1 << 18) / per_block.max(1) + 1,
            |blocks| {
                let p0 = blocks.start * 16;
                let p1 = (blocks.end * 16).min(positions);
                let m = p1 - p0;
                let mut u = vec![0u8; m * kp + 4];
                for i in 0..m {
                    let pi = p0 + i;
                    let (b, oy, ox) = (pi / (ho * wo), (pi / wo) % ho, pi % wo);
                    let base = (b * c * hp + oy * q.stride[0]) * wp + ox * q.stride[1];
                    for ci in 0..c {
                        for ky in 0..kh {
                            let at = base + (ci * hp + ky) * wp;
                            let d = i * kp + (ci * kh + ky) * kw;
                            if kw <= 4 {
                                // SAFETY: `at + 4 <= xp.len()` and `d + 4 <= u.len()` (the slack of
                                // both); a word past the window's `kw` bytes is overwritten by the
                                // next window or lies in the row's padding, whose weights are 0.
                                unsafe {
                                    let v =
                                        std::ptr::read_unaligned(xp.as_ptr().add(at) as *const u32);
                                    std::ptr::write_unaligned(u.as_mut_ptr().add(d) as *mut u32, v);
                                }
                            } else {
                                u[d..d + kw].copy_from_slice(&xp[at..at + kw]);
                            }
                        }
                    }
                }
                let mut acc = vec![0i32; m * np];
                gemm(&u, m, p, &mut acc);
                for i in 0..m {
                    let pi = p0 + i;
                    let (b, pos) = (pi / (ho * wo), pi % (ho * wo));
                    let at = b * o * ho * wo + pos;
                    for blk in 0..p.blocks {
                        let y = requant_block(&acc[i * np..(i + 1) * np], blk, l, q.out);
                        for (j, &v) in y.iter().enumerate().take((o - 16 * blk).min(16)) {
                            // SAFETY: within the result; each position is one task's.
                            unsafe { *out_ptr.get().add(at + (16 * blk + j) * ho * wo) = v };
                        }
                    }
                }
            },
        );
        return;
    }
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
    #[cfg(target_arch = "x86_64")]
    if q.kind == PoolKind::Max && h * w <= 64 && ho * wo <= 64 && vbmi() {
        // Each window element of every output of a plane as one byte permute of the plane.
        let mut idx = Vec::new();
        for ky in 0..q.kernel[0] {
            for kx in 0..q.kernel[1] {
                let mut v = [0u8; 64];
                for oy in 0..ho {
                    let ys = pool_window(oy, q.stride[0], q.padding[0].0, q.kernel[0], h);
                    for ox in 0..wo {
                        let xs = pool_window(ox, q.stride[1], q.padding[1].0, q.kernel[1], w);
                        // The window's element (ky, kx) where the window has it, else its
                        // first (the maximum does not change).
                        let iy = (oy * q.stride[0] + ky).checked_sub(q.padding[0].0);
                        let ix = (ox * q.stride[1] + kx).checked_sub(q.padding[1].0);
                        let at = match (iy, ix) {
                            (Some(iy), Some(ix)) if ys.contains(&iy) && xs.contains(&ix) => {
                                iy * w + ix
                            }
                            _ => ys.start * w + xs.start,
                        };
                        v[oy * wo + ox] = at as u8;
                    }
                }
                idx.push(v);
            }
        }
        let planes = xd[0] * xd[1];
        par_ranges(pool, planes, 256, |ps| {
            // SAFETY: `vbmi()` holds; planes of `h · w ≤ 64` bytes in, `ho · wo ≤ 64` out.
            unsafe { max_pool_small(&x, ps, h * w, ho * wo, &idx, o) }
        });
        return;
    }
    let plain2 = q.kind == PoolKind::Max
        && q.kernel == [2, 2]
        && q.stride == [2, 2]
        && q.padding == [(0, 0), (0, 0)];
    par_ranges(pool, xd[0] * xd[1], 64, |planes| {
        for p in planes {
            let xp = &x[p * h * w..(p + 1) * h * w];
            if plain2 {
                // The common 2×2 max pool: two rows at a time, pairs of columns.
                for oy in 0..ho {
                    let (r0, r1) = (
                        &xp[2 * oy * w..][..2 * wo],
                        &xp[(2 * oy + 1) * w..][..2 * wo],
                    );
                    for (ox, (a, b)) in r0.chunks_exact(2).zip(r1.chunks_exact(2)).enumerate() {
                        let v = a[0].max(a[1]).max(b[0].max(b[1]));
                        // SAFETY: within the result; planes are disjoint.
                        unsafe { *o.get().add((p * ho + oy) * wo + ox) = v as u8 };
                    }
                }
                continue;
            }
            for oy in 0..ho {
                let ys = pool_window(oy, q.stride[0], q.padding[0].0, q.kernel[0], h);
                for ox in 0..wo {
                    let xs = pool_window(ox, q.stride[1], q.padding[1].0, q.kernel[1], w);
                    let v = match q.kind {
                        PoolKind::Max => {
                            let mut best = i8::MIN;
                            for iy in ys.clone() {
                                for &v in &xp[iy * w + xs.start..iy * w + xs.end] {
                                    best = best.max(v);
                                }
                            }
                            best as i32
                        }
                        PoolKind::Mean => q.reduce(
                            ys.clone()
                                .flat_map(|iy| xs.clone().map(move |ix| xp[iy * w + ix] as i32)),
                        ),
                    };
                    // SAFETY: within the result; planes are disjoint.
                    unsafe { *o.get().add((p * ho + oy) * wo + ox) = v as i8 as u8 };
                }
            }
        }
    });
}

/// Max pooling of planes of at most 64 bytes: each plane one masked load, each window element
/// one byte permute (`idx`), their maximum one masked store.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn max_pool_small(
    x: &[i8],
    planes: std::ops::Range<usize>,
    plane: usize,
    plane_out: usize,
    idx: &[[u8; 64]],
    out: Ptr,
) {
    use std::arch::x86_64::*;
    let mask_in: __mmask64 = if plane == 64 { !0 } else { (1u64 << plane) - 1 };
    let mask_out: __mmask64 = if plane_out == 64 {
        !0
    } else {
        (1u64 << plane_out) - 1
    };
    // SAFETY: 64 bytes each.
    let perms: Vec<__m512i> = idx
        .iter()
        .map(|v| unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) })
        .collect();
    for p in planes {
        debug_assert!((p + 1) * plane <= x.len());
        // SAFETY: bytes past the plane are masked off (and not read).
        let v = unsafe { _mm512_maskz_loadu_epi8(mask_in, x.as_ptr().add(p * plane)) };
        let mut m = _mm512_set1_epi8(i8::MIN);
        for &perm in &perms {
            m = _mm512_max_epi8(m, _mm512_permutexvar_epi8(perm, v));
        }
        // SAFETY: plane `p` of the result, this task's.
        unsafe { _mm512_mask_storeu_epi8(out.get().add(p * plane_out) as *mut i8, mask_out, m) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector requantization against `fixed::requantize`, lane by lane: accumulators at
    /// the ends of i32 and around rounding ties, every shift, multipliers at their ends (0,
    /// 2^30, i32::MAX, i32::MIN) and random, the same for all lanes and different in each.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_requantization_is_the_scalar_one() {
        use std::arch::x86_64::*;
        if !(crate::isa::avx512() && std::is_x86_feature_detected!("avx512bw")) {
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let outs = [
            QOut {
                zero_point: -3,
                lo: -128,
                hi: 127,
            },
            QOut {
                zero_point: 100,
                lo: 0,
                hi: 127,
            },
        ];
        let span = (fixed::MAX_SHIFT - fixed::MIN_SHIFT + 1) as u64;
        let mut checked = 0;
        for shift in fixed::MIN_SHIFT..=fixed::MAX_SHIFT {
            for m in [
                0,
                1 << 30,
                (1 << 30) + 12345,
                i32::MAX,
                i32::MIN,
                rnd() as i32,
                -1,
            ] {
                for round in 0..10 {
                    let acc: [i32; 16] = std::array::from_fn(|i| match (round, i) {
                        (0, 0) => i32::MIN,
                        (0, 1) => i32::MAX,
                        (0, 2) => 0,
                        (0, 3) => -1,
                        // Ties of the right shift: ±(2k + 1) · 2^(right - 1).
                        (1, _) => (i as i32 - 8) << (-shift).clamp(0, 30),
                        (2, _) => {
                            ((2 * i as i32 + 1) << (-shift - 1).clamp(0, 30))
                                * if i % 2 == 0 { 1 } else { -1 }
                        }
                        (3, _) => (rnd() as i32) >> (rnd() % 31),
                        _ => rnd() as i32,
                    });
                    // Rounds 8 and 9: a multiplier and shift of each lane's own.
                    let (ms, shifts): ([i32; 16], [i32; 16]) = if round >= 8 {
                        (
                            std::array::from_fn(|_| match rnd() % 4 {
                                0 => i32::MIN,
                                1 => m,
                                _ => (1 << 30) + (rnd() % (1 << 30)) as i32,
                            }),
                            std::array::from_fn(|_| fixed::MIN_SHIFT + (rnd() % span) as i32),
                        )
                    } else {
                        ([m; 16], [shift; 16])
                    };
                    for out in outs {
                        let want: Vec<u8> = (0..16)
                            .map(|i| {
                                let (a, m, sh) = (acc[i], ms[i], shifts[i]);
                                fixed::requantize(a, m, sh, out.zero_point, out.lo, out.hi) as i8
                                    as u8
                            })
                            .collect();
                        let mut got = [0u8; 16];
                        // SAFETY: AVX-512 F and BW are present (checked above).
                        unsafe {
                            let ld =
                                |v: &[i32; 16]| _mm512_loadu_si512(v.as_ptr() as *const __m512i);
                            let y = requant_v(ld(&acc), ld(&ms), ld(&shifts), out);
                            _mm_storeu_si128(got.as_mut_ptr() as *mut __m128i, y);
                            if round < 8 {
                                let u = requant_uniform(ld(&acc), m, shift, out);
                                let mut one = [0u8; 16];
                                let y = _mm512_cvtepi32_epi8(u);
                                _mm_storeu_si128(one.as_mut_ptr() as *mut __m128i, y);
                                assert_eq!(
                                    one.to_vec(),
                                    want,
                                    "uniform: m {m} shift {shift} acc {acc:?}"
                                );
                            }
                        }
                        assert_eq!(
                            got.to_vec(),
                            want,
                            "multipliers {ms:?} shifts {shifts:?} acc {acc:?}"
                        );
                        checked += 16;
                    }
                }
            }
        }
        assert!(checked > 60_000);
    }
}
