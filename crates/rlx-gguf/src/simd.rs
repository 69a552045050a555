//! AVX2 unpacking of ggml quant bytes, shared by the decoders here and the CPU backend's
//! quantized dot products so both read the block layouts the same way.

use std::arch::x86_64::*;

/// The 32 4-bit quants of a 32-element block (`qs`: 16 bytes) as bytes: low nibbles
/// (elements 0..16) then high nibbles (elements 16..32).
///
/// # Safety
/// AVX2 is available; `qs` points at 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn nibbles32(qs: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(qs as *const __m128i);
    let low4 = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16(raw, 4), low4),
        _mm_and_si128(raw, low4),
    )
}

/// `q` with 16 added to byte `i` wherever bit `i` of `bits` is set (the fifth bit of Q5 quants).
///
/// # Safety
/// AVX2 is available.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn with_fifth_bits(q: __m256i, bits: i32) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bitsel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bitsel), bitsel);
    _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// The low and high nibbles of 32 bytes (a Q4_K sub-block pair).
///
/// # Safety
/// AVX2 is available.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn split_nibbles(raw: __m256i) -> (__m256i, __m256i) {
    let low4 = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(raw, low4),
        _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
    )
}

/// The 128 unsigned 6-bit quants (0..64, before the -32 offset) of one half `n` of a Q6_K
/// super-block at `blk`, as four runs of 32 elements in order.
///
/// # Safety
/// AVX2 is available; `blk` points at a whole Q6_K block; `n` is 0 or 1.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn q6k_half(blk: *const u8, n: usize) -> [__m256i; 4] {
    let low4 = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let qh = _mm256_loadu_si256(blk.add(128 + 32 * n) as *const __m256i);
    let ql_a = _mm256_loadu_si256(blk.add(64 * n) as *const __m256i);
    let ql_b = _mm256_loadu_si256(blk.add(64 * n + 32) as *const __m256i);
    let high = |shift: i32| -> __m256i {
        let h = match shift {
            0 => qh,
            2 => _mm256_srli_epi16(qh, 2),
            4 => _mm256_srli_epi16(qh, 4),
            _ => _mm256_srli_epi16(qh, 6),
        };
        _mm256_slli_epi16(_mm256_and_si256(h, three), 4)
    };
    [
        _mm256_or_si256(_mm256_and_si256(ql_a, low4), high(0)),
        _mm256_or_si256(_mm256_and_si256(ql_b, low4), high(2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_a, 4), low4), high(4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql_b, 4), low4), high(6)),
    ]
}
