//! Decoding of every supported ggml block type to f32.
//!
//! The arithmetic follows the order of the reference decoders (one rounding per operation, no
//! fused multiply-add), so results are bit-identical to the `gguf` Python package's `dequantize`
//! (checked by `tests/dequant_golden.rs`).

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use half::{bf16, f16};

#[inline(always)]
fn h(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block.
#[inline(always)]
pub fn k4_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The sixteen signed 6-bit scales of a Q3_K super-block (already offset by -32).
#[inline(always)]
pub fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = ((low | (high << 4)) as i8).wrapping_sub(32);
    }
    out
}

/// Decode one block of `ty` (`b` holds exactly its bytes) into `y` (its elements).
#[inline]
pub fn dequantize_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    use GgmlType::*;
    match ty {
        F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => y[0] = h(b, 0),
        BF16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        F64 => y[0] = f64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as f32,
        Q4_0 => {
            let d = h(b, 0);
            for j in 0..16 {
                let q = b[2 + j];
                y[j] = d * ((q & 0xF) as i32 - 8) as f32;
                y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
            }
        }
        Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            for j in 0..16 {
                let q = b[4 + j];
                y[j] = d * (q & 0xF) as f32 + m;
                y[j + 16] = d * (q >> 4) as f32 + m;
            }
        }
        Q5_0 => {
            let d = h(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                let q = b[6 + j];
                let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                y[j] = d * (lo as i32 - 16) as f32;
                y[j + 16] = d * (hi as i32 - 16) as f32;
            }
        }
        Q5_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            for j in 0..16 {
                let q = b[8 + j];
                let lo = (q & 0xF) as u32 | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                y[j] = d * lo as f32 + m;
                y[j + 16] = d * hi as f32 + m;
            }
        }
        Q8_0 => {
            let d = h(b, 0);
            for j in 0..32 {
                y[j] = d * (b[2 + j] as i8) as f32;
            }
        }
        Q2_K => {
            let (sc, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (h(b, 80), h(b, 82));
            for n in 0..2 {
                for j in 0..4 {
                    for half in 0..2 {
                        let s = sc[n * 8 + j * 2 + half];
                        let (dl, ml) = (d * (s & 0xF) as f32, dmin * (s >> 4) as f32);
                        for l in 0..16 {
                            let q = (qs[n * 32 + half * 16 + l] >> (2 * j)) & 3;
                            y[n * 128 + j * 32 + half * 16 + l] = dl * q as f32 - ml;
                        }
                    }
                }
            }
        }
        Q3_K => {
            let (hm, qs) = (&b[0..32], &b[32..96]);
            let scales = q3k_scales(&b[96..108]);
            let d = h(b, 108);
            for n in 0..2 {
                for j in 0..4 {
                    let bit = 1u8 << (n * 4 + j);
                    for half in 0..2 {
                        let dl = d * scales[n * 8 + j * 2 + half] as f32;
                        for l in 0..16 {
                            let i = half * 16 + l;
                            let q = ((qs[n * 32 + i] >> (2 * j)) & 3) as i32
                                - if hm[i] & bit != 0 { 0 } else { 4 };
                            y[n * 128 + j * 32 + i] = dl * q as f32;
                        }
                    }
                }
            }
        }
        Q4_K | Q5_K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let sc = &b[4..16];
            let (qh, qs) = if ty == Q5_K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for j in 0..4 {
                let (s1, m1) = k4_scale_min(2 * j, sc);
                let (s2, m2) = k4_scale_min(2 * j + 1, sc);
                let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                for l in 0..32 {
                    let q = qs[j * 32 + l];
                    let (mut lo, mut hi) = ((q & 0xF) as u32, (q >> 4) as u32);
                    if let Some(qh) = qh {
                        lo |= (((qh[l] >> (2 * j)) & 1) as u32) << 4;
                        hi |= (((qh[l] >> (2 * j + 1)) & 1) as u32) << 4;
                    }
                    y[j * 64 + l] = d1 * lo as f32 - m1;
                    y[j * 64 + 32 + l] = d2 * hi as f32 - m2;
                }
            }
        }
        Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            let sc = &b[192..208];
            let d = h(b, 208);
            for n in 0..2 {
                let (ql, qh, sc) = (&ql[n * 64..], &qh[n * 32..], &sc[n * 8..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    let y = &mut y[n * 128..];
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
        Q8_K => {
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            for j in 0..256 {
                y[j] = d * (b[4 + j] as i8) as f32;
            }
        }
        _ => unreachable!("dequantize checks can_dequantize first"),
    }
}

/// Decode `data` (whole blocks of `ty`) into `out`, which must hold exactly its elements.
/// Uses AVX2 where the CPU has it (bit-identical to [`dequantize_portable`]).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_with(ty, data, out, true)
}

/// [`dequantize`] through the portable code only, whatever the CPU has: what runs on CPUs
/// without AVX2, for tests and for callers restricted to a lower instruction-set level.
pub fn dequantize_portable(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_with(ty, data, out, false)
}

/// [`dequantize`], using SIMD code only when `simd` is set and the CPU has it.
pub fn dequantize_with(ty: GgmlType, data: &[u8], out: &mut [f32], simd: bool) -> Result<()> {
    if !ty.can_dequantize() {
        return Err(GgufError::new(
            0,
            "dequantize",
            format!("decoding {ty} is not supported"),
        ));
    }
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    if !data.len().is_multiple_of(bb) || data.len() / bb * be != out.len() {
        return Err(GgufError::new(
            0,
            "dequantize",
            format!(
                "{} bytes of {ty} do not hold exactly {} elements ({bb}-byte blocks of {be})",
                data.len(),
                out.len()
            ),
        ));
    }
    #[cfg(target_arch = "x86_64")]
    if simd && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has the features; `data` and `out` hold whole blocks (checked above).
        match ty {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => {
                unsafe { dequantize_32_avx2(ty, data, out) };
                return Ok(());
            }
            Q4_K | Q6_K => {
                unsafe { dequantize_k_avx2(ty, data, out) };
                return Ok(());
            }
            _ => {}
        }
    }
    for (b, y) in data.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        dequantize_block(ty, b, y);
    }
    Ok(())
}

use GgmlType::*;

/// [`dequantize`] of the 32-element block types with AVX2: the same operations as
/// [`dequantize_block`] (`d * q` then `+ m`, no fused multiply-add), so the results are
/// identical, eight lanes at a time.
///
/// # Safety
/// The CPU has AVX2 and F16C; `data` holds whole blocks of `ty` and `out` their elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_32_avx2(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    use crate::simd::{nibbles32, with_fifth_bits};
    for (i, b) in data.chunks_exact(bb).enumerate() {
        let p = b.as_ptr();
        let y = out.as_mut_ptr().add(32 * i);
        let d = _mm256_set1_ps(f16::from_le_bytes([b[0], b[1]]).to_f32());
        // The 32 quants as signed bytes (offsets applied), and the min if any.
        let (q, m) = match ty {
            Q8_0 => (_mm256_loadu_si256(p.add(2) as *const __m256i), None),
            _ => {
                let (qs, hbits, off, m) = match ty {
                    Q4_0 => (2, None, 8, None),
                    Q4_1 => (4, None, 0, Some(f16::from_le_bytes([b[2], b[3]]).to_f32())),
                    Q5_0 => (6, Some(2), 16, None),
                    _ => (
                        8,
                        Some(4),
                        0,
                        Some(f16::from_le_bytes([b[2], b[3]]).to_f32()),
                    ),
                };
                let mut q = nibbles32(p.add(qs));
                if let Some(h) = hbits {
                    q = with_fifth_bits(q, (p.add(h) as *const i32).read_unaligned());
                }
                (
                    _mm256_sub_epi8(q, _mm256_set1_epi8(off)),
                    m.map(|m| _mm256_set1_ps(m)),
                )
            }
        };
        let lo = _mm256_castsi256_si128(q);
        let hi = _mm256_extracti128_si256(q, 1);
        for (j, part) in [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)]
            .into_iter()
            .enumerate()
        {
            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
            let mut v = _mm256_mul_ps(d, f);
            if let Some(m) = m {
                v = _mm256_add_ps(v, m);
            }
            _mm256_storeu_ps(y.add(8 * j), v);
        }
    }
}

/// Store `scale * q - bias` (`q`: 32 bytes; no fused multiply-add, matching
/// [`dequantize_block`]) for 32 elements at `y`; `q` is read as signed bytes when `signed`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store32(y: *mut f32, q: std::arch::x86_64::__m256i, scale: f32, bias: f32, signed: bool) {
    use std::arch::x86_64::*;
    let (s, b) = (_mm256_set1_ps(scale), _mm256_set1_ps(bias));
    let lo = _mm256_castsi256_si128(q);
    let hi = _mm256_extracti128_si256(q, 1);
    for (j, part) in [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)]
        .into_iter()
        .enumerate()
    {
        let i = if signed {
            _mm256_cvtepi8_epi32(part)
        } else {
            _mm256_cvtepu8_epi32(part)
        };
        let v = _mm256_mul_ps(s, _mm256_cvtepi32_ps(i));
        _mm256_storeu_ps(
            y.add(8 * j),
            if bias != 0.0 { _mm256_sub_ps(v, b) } else { v },
        );
    }
}

/// [`dequantize`] of Q4_K and Q6_K with AVX2, operation for operation as
/// [`dequantize_block`] (so bit-identical).
///
/// # Safety
/// The CPU has AVX2 and F16C; `data` holds whole blocks of `ty` and `out` their elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_k_avx2(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    for (i, b) in data.chunks_exact(bb).enumerate() {
        let p = b.as_ptr();
        let y = out.as_mut_ptr().add(256 * i);
        if ty == Q4_K {
            let (d, dmin) = (h(b, 0), h(b, 2));
            for j in 0..4 {
                let (s1, m1) = k4_scale_min(2 * j, &b[4..16]);
                let (s2, m2) = k4_scale_min(2 * j + 1, &b[4..16]);
                let (lo, hi) = crate::simd::split_nibbles(_mm256_loadu_si256(
                    p.add(16 + 32 * j) as *const __m256i
                ));
                store32(y.add(64 * j), lo, d * s1 as f32, dmin * m1 as f32, false);
                store32(
                    y.add(64 * j + 32),
                    hi,
                    d * s2 as f32,
                    dmin * m2 as f32,
                    false,
                );
            }
        } else {
            let d = h(b, 208);
            let sc = &b[192..208];
            for n in 0..2 {
                let m32 = _mm256_set1_epi8(32);
                let q = crate::simd::q6k_half(p, n);
                for (k, qk) in q.into_iter().enumerate() {
                    // `d * sc * (q - 32)` with the scale of each 16-element half.
                    let signed = _mm256_sub_epi8(qk, m32);
                    let base = y.add(128 * n + 32 * k);
                    let (sa, sb) = (
                        sc[n * 8 + 2 * k] as i8 as f32,
                        sc[n * 8 + 2 * k + 1] as i8 as f32,
                    );
                    let mut tmp = [0f32; 32];
                    store32(tmp.as_mut_ptr(), signed, 1.0, 0.0, true);
                    for (l, t) in tmp.iter().enumerate() {
                        *base.add(l) = d * if l < 16 { sa } else { sb } * t;
                    }
                }
            }
        }
    }
}
