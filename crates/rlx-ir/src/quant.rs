//! Quantization schemes: how a packed weight tensor is laid out, so kernels can decode it
//! without a side table.

use serde::{Deserialize, Serialize};

/// The layout of a quantized weight consumed by [`crate::Op::DequantMatMul`] and
/// [`crate::Op::DequantizeRows`].
///
/// GGUF schemes store each weight row as consecutive llama.cpp blocks (scales inside the bytes):
/// the packed operand is `U8 [N, row_bytes]`. The other schemes keep quants and scales apart
/// (see [`crate::Op::DequantMatMul`]).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantScheme {
    /// Symmetric int8 with one f32 scale per `block_size` elements of a row.
    Int8Block {
        /// Elements per scale.
        block_size: usize,
    },
    /// Int8 with a per-block scale and zero point: `w = (q - zp) * scale`.
    Int8BlockAsym {
        /// Elements per scale.
        block_size: usize,
    },
    /// Unsigned 4-bit quants packed two per byte (low nibble first) with a per-block scale and
    /// zero point: `w = (q - zp) * scale`.
    Int4Block {
        /// Elements per scale.
        block_size: usize,
    },
    /// FP8 E4M3 (finite-only, as in the OCP spec) with one f32 scale per tensor.
    Fp8E4m3,
    /// FP8 E5M2 with one f32 scale per tensor.
    Fp8E5m2,
    /// ggml F16 rows.
    GgufF16,
    /// ggml BF16 rows.
    GgufBF16,
    /// ggml Q4_0: 32-element blocks, f16 scale, 4-bit quants offset by 8.
    GgufQ4_0,
    /// ggml Q4_1: 32-element blocks, f16 scale and min.
    GgufQ4_1,
    /// ggml Q5_0: 32-element blocks, 5-bit quants offset by 16.
    GgufQ5_0,
    /// ggml Q5_1: 32-element blocks, 5-bit quants, f16 scale and min.
    GgufQ5_1,
    /// ggml Q8_0: 32-element blocks, f16 scale, int8 quants.
    GgufQ8_0,
    /// ggml Q2_K super-blocks of 256.
    GgufQ2K,
    /// ggml Q3_K super-blocks of 256.
    GgufQ3K,
    /// ggml Q4_K super-blocks of 256.
    GgufQ4K,
    /// ggml Q5_K super-blocks of 256.
    GgufQ5K,
    /// ggml Q6_K super-blocks of 256.
    GgufQ6K,
    /// ggml Q8_K super-blocks of 256 (f32 scale).
    GgufQ8K,
}

impl QuantScheme {
    /// Every GGUF scheme.
    pub const GGUF: [QuantScheme; 13] = [
        QuantScheme::GgufF16,
        QuantScheme::GgufBF16,
        QuantScheme::GgufQ4_0,
        QuantScheme::GgufQ4_1,
        QuantScheme::GgufQ5_0,
        QuantScheme::GgufQ5_1,
        QuantScheme::GgufQ8_0,
        QuantScheme::GgufQ2K,
        QuantScheme::GgufQ3K,
        QuantScheme::GgufQ4K,
        QuantScheme::GgufQ5K,
        QuantScheme::GgufQ6K,
        QuantScheme::GgufQ8K,
    ];

    /// Whether the scheme is a GGUF block format (packed operand `U8 [N, row_bytes]`).
    pub fn is_gguf(self) -> bool {
        !matches!(
            self,
            QuantScheme::Int8Block { .. }
                | QuantScheme::Int8BlockAsym { .. }
                | QuantScheme::Int4Block { .. }
                | QuantScheme::Fp8E4m3
                | QuantScheme::Fp8E5m2
        )
    }

    /// `(elements, bytes)` of one GGUF block; `None` for the non-GGUF schemes.
    pub fn gguf_block(self) -> Option<(usize, usize)> {
        use QuantScheme::*;
        Some(match self {
            GgufF16 | GgufBF16 => (1, 2),
            GgufQ4_0 => (32, 18),
            GgufQ4_1 => (32, 20),
            GgufQ5_0 => (32, 22),
            GgufQ5_1 => (32, 24),
            GgufQ8_0 => (32, 34),
            GgufQ2K => (256, 84),
            GgufQ3K => (256, 110),
            GgufQ4K => (256, 144),
            GgufQ5K => (256, 176),
            GgufQ6K => (256, 210),
            GgufQ8K => (256, 292),
            _ => return None,
        })
    }

    /// Bytes of a packed GGUF row of `k` elements (`None` if `k` is not a whole number of
    /// blocks, or for non-GGUF schemes).
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        let (be, bb) = self.gguf_block()?;
        k.is_multiple_of(be).then(|| k / be * bb)
    }

    /// Elements of a packed GGUF row of `bytes` bytes.
    pub fn row_elems(self, bytes: usize) -> Option<usize> {
        let (be, bb) = self.gguf_block()?;
        bytes.is_multiple_of(bb).then(|| bytes / bb * be)
    }

    /// Elements sharing one scale, for the blocked non-GGUF schemes.
    pub fn block_size(self) -> Option<usize> {
        match self {
            QuantScheme::Int8Block { block_size }
            | QuantScheme::Int8BlockAsym { block_size }
            | QuantScheme::Int4Block { block_size } => Some(block_size),
            _ => None,
        }
    }

    /// Products of GGUF weights with fewer activation rows than this round the activations to
    /// int8 blocks first, as llama.cpp's CPU code does (the weight type's `vec_dot_type`);
    /// prompt-sized ones take the activations as they are. Every backend keeps this rule, so
    /// their results agree with each other far more closely than with the exact product.
    pub const ROUNDED_ACTS_BELOW: usize = 8;

    /// `CachedAttention` over at least this many query rows (a prompt chunk) computes each row
    /// the way the matrix path does (two products per head and block of queries), fewer rows
    /// row by row, as llama.cpp's CPU code does; every backend keeps this rule. Together with
    /// [`Self::ROUNDED_ACTS_BELOW`] it is what batch invariance rests on: a prompt piece of at
    /// least this many rows computes the same rows as the whole chunk it belongs to (the
    /// serving engine cuts pieces no shorter, `serve::engine::MIN_PIECE`).
    pub const MATRIX_ATTENTION_ROWS: usize = 16;

    /// The block an `rows`-row product with these weights rounds its activations to int8 in
    /// (32: `Q8_0` / `Q8_1` for the 32-blocks, 256: `Q8_K` for the K-quants), or `None` when it
    /// takes them as they are (float weights, the other schemes, [`Self::ROUNDED_ACTS_BELOW`]
    /// rows or more). `rows` is the second-to-last axis of the activations (1 for a vector).
    pub fn act_block(self, rows: usize) -> Option<usize> {
        use QuantScheme::*;
        if rows >= Self::ROUNDED_ACTS_BELOW {
            return None;
        }
        match self {
            GgufQ4_0 | GgufQ4_1 | GgufQ5_0 | GgufQ5_1 | GgufQ8_0 => Some(32),
            GgufQ2K | GgufQ3K | GgufQ4K | GgufQ5K | GgufQ6K | GgufQ8K => Some(256),
            GgufF16
            | GgufBF16
            | Int8Block { .. }
            | Int8BlockAsym { .. }
            | Int4Block { .. }
            | Fp8E4m3
            | Fp8E5m2 => None,
        }
    }

    /// The ggml block type of a GGUF scheme (`None` for the others).
    pub fn ggml_type(self) -> Option<rlx_gguf::GgmlType> {
        use rlx_gguf::GgmlType as G;
        use QuantScheme::*;
        Some(match self {
            GgufF16 => G::F16,
            GgufBF16 => G::BF16,
            GgufQ4_0 => G::Q4_0,
            GgufQ4_1 => G::Q4_1,
            GgufQ5_0 => G::Q5_0,
            GgufQ5_1 => G::Q5_1,
            GgufQ8_0 => G::Q8_0,
            GgufQ2K => G::Q2_K,
            GgufQ3K => G::Q3_K,
            GgufQ4K => G::Q4_K,
            GgufQ5K => G::Q5_K,
            GgufQ6K => G::Q6_K,
            GgufQ8K => G::Q8_K,
            Int8Block { .. } | Int8BlockAsym { .. } | Int4Block { .. } | Fp8E4m3 | Fp8E5m2 => {
                return None
            }
        })
    }
}

/// Integer requantization as TFLite's reference kernels, gemmlowp and CMSIS-NN compute it: a
/// real factor `r` becomes a Q31 multiplier `m` and a power-of-two `shift` with
/// `r ≈ m · 2^(shift - 31)`, and an `i32` accumulator is scaled by them with two roundings
/// (a rounding doubling high multiply, then a rounding right shift). The integer ops
/// (`qlinear`, `qconv2d`, `qadd`), the CPU kernels, and the C and SystemVerilog that the edge
/// writers produce all compute exactly this.
pub mod fixed {
    /// The lowest `shift` a multiplier may carry (a factor of at least `2^-32`).
    pub const MIN_SHIFT: i32 = -31;
    /// The highest `shift` (a factor below `2^31`).
    pub const MAX_SHIFT: i32 = 30;

    /// `r` as `(multiplier, shift)`: `multiplier` in `[2^30, 2^31)` and `r = multiplier ·
    /// 2^(shift - 31)` to within half a unit of the multiplier, rounding half away from zero
    /// (TFLite's `QuantizeMultiplier`). Zero, and factors below `2^-32`, give `(0, 0)`. `None`
    /// for a negative, non-finite or too large (`≥ 2^31`) factor.
    pub fn quantize_multiplier(r: f64) -> Option<(i32, i32)> {
        if !r.is_finite() || r < 0.0 {
            return None;
        }
        if r == 0.0 {
            return Some((0, 0));
        }
        // r = q · 2^e with q in [0.5, 1).
        let e = r.log2().floor() as i32 + 1;
        let mut e = e;
        let mut q = r / 2f64.powi(e);
        // log2 can be off by one at exact powers of two.
        while q >= 1.0 {
            q /= 2.0;
            e += 1;
        }
        while q < 0.5 {
            q *= 2.0;
            e -= 1;
        }
        let mut fixed = (q * (1u64 << 31) as f64).round() as i64;
        if fixed == 1 << 31 {
            fixed /= 2;
            e += 1;
        }
        if e < MIN_SHIFT {
            return Some((0, 0));
        }
        if e > MAX_SHIFT {
            return None;
        }
        Some((fixed as i32, e))
    }

    /// gemmlowp's `SaturatingRoundingDoublingHighMul`: the high 32 bits of `2ab`, rounded to
    /// nearest (ties away from zero); `i32::MAX` for `a = b = i32::MIN`.
    #[inline]
    pub fn doubling_high_mul(a: i32, b: i32) -> i32 {
        if a == i32::MIN && b == i32::MIN {
            return i32::MAX;
        }
        let ab = a as i64 * b as i64;
        let nudge: i64 = if ab >= 0 { 1 << 30 } else { 1 - (1 << 30) };
        // Integer division truncates toward zero, as in C.
        ((ab + nudge) / (1i64 << 31)) as i32
    }

    /// gemmlowp's `RoundingDivideByPOT`: `x / 2^exponent` rounded to nearest, ties away from
    /// zero (`exponent` in `0..=31`).
    #[inline]
    pub fn rounding_shift_right(x: i32, exponent: u32) -> i32 {
        let mask = ((1i64 << exponent) - 1) as i32;
        let remainder = x & mask;
        let threshold = (mask >> 1) + i32::from(x < 0);
        (x >> exponent) + i32::from(remainder > threshold)
    }

    /// TFLite's `MultiplyByQuantizedMultiplier`: `x · multiplier · 2^(shift - 31)`, rounded
    /// twice as the reference kernels round. A positive `shift` shifts `x` left first, saturated
    /// to `i32`. `shift` must lie in [`MIN_SHIFT`]`..=`[`MAX_SHIFT`].
    #[inline]
    pub fn multiply_by_quantized_multiplier(x: i32, multiplier: i32, shift: i32) -> i32 {
        debug_assert!((MIN_SHIFT..=MAX_SHIFT).contains(&shift));
        let left = shift.max(0) as u32;
        let right = (-shift).max(0) as u32;
        let shifted = ((x as i64) << left).clamp(i32::MIN as i64, i32::MAX as i64) as i32;
        rounding_shift_right(doubling_high_mul(shifted, multiplier), right)
    }

    /// An accumulator requantized to an 8-bit value: scaled, offset by the result's zero
    /// point and clamped to `[lo, hi]` (the type's range, or a fused activation's).
    #[inline]
    pub fn requantize(
        acc: i32,
        multiplier: i32,
        shift: i32,
        zero_point: i32,
        lo: i32,
        hi: i32,
    ) -> i32 {
        multiply_by_quantized_multiplier(acc, multiplier, shift)
            .saturating_add(zero_point)
            .clamp(lo, hi)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn multipliers_round_trip_the_factor() {
            for r in [
                1.0,
                0.5,
                0.75,
                1e-3,
                0.0123456,
                3.999,
                1234.5,
                2f64.powi(-31),
            ] {
                let (m, s) = quantize_multiplier(r).unwrap();
                assert!((1 << 30..=i32::MAX).contains(&m), "{r}: {m}");
                let back = m as f64 * 2f64.powi(s - 31);
                assert!((back - r).abs() <= r * 2f64.powi(-30), "{r}: {back}");
            }
            assert_eq!(quantize_multiplier(0.0), Some((0, 0)));
            assert_eq!(quantize_multiplier(1e-12), Some((0, 0)));
            assert_eq!(quantize_multiplier(-1.0), None);
            assert_eq!(quantize_multiplier(f64::NAN), None);
            assert_eq!(quantize_multiplier(2f64.powi(31)), None);
        }

        /// Hand-computed cases. 0.5 is `(2^30, 0)`: the doubling multiply rounds its ties
        /// upward (2.5 to 3, -2.5 to -2); the rounding shift rounds ties away from zero.
        #[test]
        fn requantization_rounds_as_the_reference_kernels() {
            let (m, s) = quantize_multiplier(0.5).unwrap();
            assert_eq!((m, s), (1 << 30, 0));
            let got: Vec<i32> = [-5, -3, -1, 1, 3, 5, 100]
                .iter()
                .map(|&x| multiply_by_quantized_multiplier(x, m, s))
                .collect();
            assert_eq!(got, [-2, -1, 0, 1, 2, 3, 50]);
            // 0.25 = (2^30, -1): one more rounding shift; 6·0.25 = 1.5 rounds to 2, -6 to -2,
            // and 5·0.25 = 1.25 gives 2 (rounded twice: 2.5 to 3, then 1.5 to 2).
            let (m, s) = quantize_multiplier(0.25).unwrap();
            assert_eq!((m, s), (1 << 30, -1));
            assert_eq!(multiply_by_quantized_multiplier(6, m, s), 2);
            assert_eq!(multiply_by_quantized_multiplier(-6, m, s), -2);
            assert_eq!(multiply_by_quantized_multiplier(5, m, s), 2);
            // A factor above one shifts left first: 3 · 3 = 9.
            let (m, s) = quantize_multiplier(3.0).unwrap();
            assert_eq!(multiply_by_quantized_multiplier(3, m, s), 9);
            // Saturation of the doubling multiply and of the left shift: x · 2 as (x << 2)
            // saturated, then halved.
            assert_eq!(doubling_high_mul(i32::MIN, i32::MIN), i32::MAX);
            assert_eq!(
                multiply_by_quantized_multiplier(i32::MAX, 1 << 30, 2),
                1 << 30
            );
            assert_eq!(requantize(1000, 1 << 30, 0, -10, -128, 127), 127);
            assert_eq!(requantize(-1000, 1 << 30, 0, -10, -128, 127), -128);
            assert_eq!(requantize(40, 1 << 30, 0, -10, -128, 127), 10);
        }
    }
}
