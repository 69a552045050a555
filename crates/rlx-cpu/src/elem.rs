//! Element types: one trait for storage-level arithmetic and one for floating-point math, so each
//! kernel is written once and monomorphized per dtype. f16 / bf16 compute in f32 and round once
//! per op, which is also numpy's semantics.

use half::{bf16, f16};
use rlx_ir::DType;

/// Storage type of one dtype, with the arithmetic every kernel needs.
pub trait Elem: Copy + Send + Sync + PartialOrd + PartialEq + 'static {
    /// The dtype it stores.
    const DTYPE: DType;
    /// Additive identity.
    fn zero() -> Self;
    /// Multiplicative identity.
    fn one() -> Self;
    /// Smallest value (identity of max).
    fn lowest() -> Self;
    /// Largest value (identity of min).
    fn highest() -> Self;
    /// `self + o` (wrapping for integers).
    fn add(self, o: Self) -> Self;
    /// `self - o` (wrapping for integers).
    fn sub(self, o: Self) -> Self;
    /// `self * o` (wrapping for integers).
    fn mul(self, o: Self) -> Self;
    /// `self / o`; integers truncate, `x / 0` is all-ones (-1 signed), like XLA.
    fn div(self, o: Self) -> Self;
    /// As f64 (`as` semantics).
    fn to_f64(self) -> f64;
    /// From f64 (`as` semantics: truncation toward zero, saturating).
    fn from_f64(v: f64) -> Self;
    /// As i64 (`as` semantics).
    fn to_i64(self) -> i64;
    /// From i64 (`as` semantics, wrapping).
    fn from_i64(v: i64) -> Self;
    /// Maximum (NaN wins).
    #[inline(always)]
    fn max_of(self, o: Self) -> Self {
        if self >= o || self.partial_cmp(&self).is_none() {
            self
        } else {
            o
        }
    }
    /// Minimum (NaN wins).
    #[inline(always)]
    fn min_of(self, o: Self) -> Self {
        if self <= o || self.partial_cmp(&self).is_none() {
            self
        } else {
            o
        }
    }
}

macro_rules! int_elem {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline(always)]
            fn zero() -> Self {
                0
            }
            #[inline(always)]
            fn one() -> Self {
                1
            }
            #[inline(always)]
            fn lowest() -> Self {
                <$t>::MIN
            }
            #[inline(always)]
            fn highest() -> Self {
                <$t>::MAX
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                if o == 0 {
                    !0
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
int_elem!(i8, DType::I8);
int_elem!(i16, DType::I16);
int_elem!(i32, DType::I32);
int_elem!(i64, DType::I64);
int_elem!(u8, DType::U8);
int_elem!(u32, DType::U32);

/// Bool storage: one byte holding 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Default)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
    fn zero() -> Self {
        Bool8(0)
    }
    fn one() -> Self {
        Bool8(1)
    }
    fn lowest() -> Self {
        Bool8(0)
    }
    fn highest() -> Self {
        Bool8(1)
    }
    fn add(self, o: Self) -> Self {
        Bool8(self.0 | o.0)
    }
    fn sub(self, o: Self) -> Self {
        Bool8(self.0 & !o.0)
    }
    fn mul(self, o: Self) -> Self {
        Bool8(self.0 & o.0)
    }
    fn div(self, o: Self) -> Self {
        Bool8(self.0 & o.0)
    }
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    fn to_i64(self) -> i64 {
        self.0 as i64
    }
    fn from_i64(v: i64) -> Self {
        Bool8((v != 0) as u8)
    }
}

/// Floating-point math in the compute type (f32 or f64).
pub trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + 'static
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    /// Convert from f64.
    fn c(v: f64) -> Self;
    /// Convert to f64.
    fn f64(self) -> f64;
    /// e^x
    fn exp(self) -> Self;
    /// e^x where only inputs in `[-86, 88]` matter (see [`crate::math::exp_fast_f32`]); f64
    /// computes `exp`.
    fn exp_fast(self) -> Self;
    /// ln x
    fn ln(self) -> Self;
    /// sqrt
    fn sqrt(self) -> Self;
    /// tanh
    fn tanh(self) -> Self;
    /// erf
    fn erf(self) -> Self;
    /// sin
    fn sin(self) -> Self;
    /// cos
    fn cos(self) -> Self;
    /// tan
    fn tan(self) -> Self;
    /// atan
    fn atan(self) -> Self;
    /// x^y
    fn powf(self, y: Self) -> Self;
    /// Round half to even.
    fn round_even(self) -> Self;
    /// |x|
    fn abs(self) -> Self;
}

macro_rules! real {
    ($t:ty, $erf:path, $exp:path, $exp_fast:path, $tanh:path) => {
        impl Real for $t {
            #[inline(always)]
            fn c(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn exp_fast(self) -> Self {
                $exp_fast(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tan(self) -> Self {
                <$t>::tan(self)
            }
            #[inline(always)]
            fn atan(self) -> Self {
                <$t>::atan(self)
            }
            #[inline(always)]
            fn powf(self, y: Self) -> Self {
                <$t>::powf(self, y)
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
        }
    };
}
real!(
    f32,
    crate::math::erf_f32,
    crate::math::exp_f32,
    crate::math::exp_fast_f32,
    crate::math::tanh_f32
);
real!(f64, libm::erf, f64::exp, f64::exp, f64::tanh);

/// A floating-point storage type and its compute type.
pub trait FloatElem: Elem {
    /// Compute type.
    type C: Real;
    /// Widen to the compute type.
    fn to_c(self) -> Self::C;
    /// Round from the compute type.
    fn from_c(c: Self::C) -> Self;
}

macro_rules! native_float {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline(always)]
            fn zero() -> Self {
                0.0
            }
            #[inline(always)]
            fn one() -> Self {
                1.0
            }
            #[inline(always)]
            fn lowest() -> Self {
                <$t>::NEG_INFINITY
            }
            #[inline(always)]
            fn highest() -> Self {
                <$t>::INFINITY
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
        impl FloatElem for $t {
            type C = $t;
            #[inline(always)]
            fn to_c(self) -> $t {
                self
            }
            #[inline(always)]
            fn from_c(c: $t) -> Self {
                c
            }
        }
    };
}
native_float!(f32, DType::F32);
native_float!(f64, DType::F64);

macro_rules! half_float {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline(always)]
            fn zero() -> Self {
                <$t>::ZERO
            }
            #[inline(always)]
            fn one() -> Self {
                <$t>::ONE
            }
            #[inline(always)]
            fn lowest() -> Self {
                <$t>::NEG_INFINITY
            }
            #[inline(always)]
            fn highest() -> Self {
                <$t>::INFINITY
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.to_f32() as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
        }
        impl FloatElem for $t {
            type C = f32;
            #[inline(always)]
            fn to_c(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn from_c(c: f32) -> Self {
                <$t>::from_f32(c)
            }
        }
    };
}
half_float!(f16, DType::F16);
half_float!(bf16, DType::BF16);

/// Run `$body` with `$T` bound to the storage type of `$dt`; `$else` for dtypes not handled.
#[macro_export]
#[doc(hidden)]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dt {
            rlx_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            rlx_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            rlx_ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            rlx_ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            rlx_ir::DType::I8 => {
                type $T = i8;
                $body
            }
            rlx_ir::DType::I16 => {
                type $T = i16;
                $body
            }
            rlx_ir::DType::I32 => {
                type $T = i32;
                $body
            }
            rlx_ir::DType::I64 => {
                type $T = i64;
                $body
            }
            rlx_ir::DType::U8 => {
                type $T = u8;
                $body
            }
            rlx_ir::DType::U32 => {
                type $T = u32;
                $body
            }
            rlx_ir::DType::Bool => {
                type $T = $crate::elem::Bool8;
                $body
            }
            // Exhaustive: a new dtype is a compile error here until it gets an element type.
            rlx_ir::DType::C64 => $other,
        }
    };
}

/// Like `with_dtype!` for the floating-point dtypes only.
#[macro_export]
#[doc(hidden)]
macro_rules! with_float {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {
        match $dt {
            rlx_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            rlx_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            rlx_ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            rlx_ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            // Exhaustive: a new dtype is a compile error here until it is sorted in or out.
            rlx_ir::DType::I8
            | rlx_ir::DType::I16
            | rlx_ir::DType::I32
            | rlx_ir::DType::I64
            | rlx_ir::DType::U8
            | rlx_ir::DType::U32
            | rlx_ir::DType::Bool
            | rlx_ir::DType::C64 => $other,
        }
    };
}
