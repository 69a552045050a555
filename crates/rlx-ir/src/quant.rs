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
