//! Scalar element types and the promotion lattice.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Scalar element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE-754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Boolean, stored as one byte holding 0 or 1.
    Bool,
    /// Complex number of two f32 (real, imaginary).
    C64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::Bool,
        DType::C64,
    ];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::C64 => 8,
        }
    }

    /// Real floating-point type (F16, BF16, F32, F64).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integer type, signed or unsigned (not Bool).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U32
        )
    }

    /// Signed integer or float.
    pub fn is_signed(self) -> bool {
        self.is_float() || matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// Short lowercase name, as used by the printer and JSON (`f32`, `bf16`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::C64 => "c64",
        }
    }

    /// Parse a name produced by [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Position in the promotion lattice: bool < unsigned < signed < float < complex.
    fn rank(self) -> (u8, usize) {
        let class = match self {
            DType::Bool => 0,
            DType::U8 | DType::U32 => 1,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => 2,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => 3,
            DType::C64 => 4,
        };
        (class, self.size_bytes())
    }

    /// The smallest dtype both operands convert to without losing their kind (JAX-like lattice).
    ///
    /// Mixed kinds go to the higher kind (`i32 + f16 -> f16`); f16 with bf16 gives f32; an unsigned
    /// with a signed integer of the same or smaller width gives the next wider signed type.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        let (ca, sa) = a.rank();
        let (cb, sb) = b.rank();
        if (ca, cb) == (1, 2) || (ca, cb) == (2, 1) {
            // unsigned meets signed: a signed type wide enough for both
            let (su, ss) = if ca == 1 { (sa, sb) } else { (sb, sa) };
            return match (2 * su).max(ss) {
                1 => I8,
                2 => I16,
                4 => I32,
                _ => I64,
            };
        }
        if ca != cb {
            return if (ca, sa) > (cb, sb) { a } else { b };
        }
        match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ if ca == 3 || ca == 2 => {
                if sa >= sb {
                    a
                } else {
                    b
                }
            }
            // unsigned pairs
            _ if ca == 1 => {
                if sa >= sb {
                    a
                } else {
                    b
                }
            }
            _ => a,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_is_symmetric_and_idempotent() {
        for a in DType::ALL {
            assert_eq!(DType::promote(a, a), a);
            for b in DType::ALL {
                assert_eq!(DType::promote(a, b), DType::promote(b, a), "{a} {b}");
            }
        }
        assert_eq!(DType::promote(DType::I32, DType::F16), DType::F16);
        assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
        assert_eq!(DType::promote(DType::Bool, DType::U8), DType::U8);
        assert_eq!(DType::promote(DType::I64, DType::F32), DType::F32);
        assert_eq!(DType::promote(DType::U8, DType::I8), DType::I16);
        assert_eq!(DType::promote(DType::U32, DType::I32), DType::I64);
        assert_eq!(DType::from_name("bf16"), Some(DType::BF16));
    }
}
