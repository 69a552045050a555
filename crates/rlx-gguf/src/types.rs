//! ggml tensor types: ids as stored in GGUF, block geometry, and which ones RLX can decode.

use std::fmt;

/// A ggml tensor type as stored in a GGUF tensor table.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// `(type, id, elements per block, bytes per block)` of every type this reader knows.
const TABLE: &[(GgmlType, u32, usize, usize)] = &[
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2_K, 10, 256, 84),
    (GgmlType::Q3_K, 11, 256, 110),
    (GgmlType::Q4_K, 12, 256, 144),
    (GgmlType::Q5_K, 13, 256, 176),
    (GgmlType::Q6_K, 14, 256, 210),
    (GgmlType::Q8_K, 15, 256, 292),
    (GgmlType::IQ2_XXS, 16, 256, 66),
    (GgmlType::IQ2_XS, 17, 256, 74),
    (GgmlType::IQ3_XXS, 18, 256, 98),
    (GgmlType::IQ1_S, 19, 256, 50),
    (GgmlType::IQ4_NL, 20, 32, 18),
    (GgmlType::IQ3_S, 21, 256, 110),
    (GgmlType::IQ2_S, 22, 256, 82),
    (GgmlType::IQ4_XS, 23, 256, 136),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::IQ1_M, 29, 256, 56),
    (GgmlType::BF16, 30, 1, 2),
    (GgmlType::TQ1_0, 34, 256, 54),
    (GgmlType::TQ2_0, 35, 256, 66),
    (GgmlType::MXFP4, 39, 32, 17),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every variant is in the table")
    }

    /// The type with GGUF id `id`, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().3
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_elems())
            .then(|| n / self.block_elems() * self.block_bytes())
    }

    /// Whether [`crate::dequantize`] decodes this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | F64
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }

    /// Every known type.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
