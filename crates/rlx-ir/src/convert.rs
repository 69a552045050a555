//! Conversions between host values and the little-endian byte form of each dtype.

use crate::{DType, Error, Result};
use half::{bf16, f16};

/// Write `v` as one element of `dt` into `out` (`out.len() == dt.size_bytes()`).
///
/// Floats round to nearest; integers must be integral and in range; Bool is `v != 0`.
pub fn f64_to_bytes(v: f64, dt: DType, out: &mut [u8]) -> Result<()> {
    let int_ok = |lo: f64, hi: f64| v.fract() == 0.0 && v >= lo && v <= hi;
    let bad = || Error::Invalid(format!("value {v} does not fit dtype {dt}"));
    match dt {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::C64 => {
            out[..4].copy_from_slice(&(v as f32).to_le_bytes());
            out[4..].copy_from_slice(&0f32.to_le_bytes());
        }
        DType::Bool => out[0] = (v != 0.0) as u8,
        DType::I8 if int_ok(i8::MIN as f64, i8::MAX as f64) => out[0] = v as i8 as u8,
        DType::U8 if int_ok(0.0, u8::MAX as f64) => out[0] = v as u8,
        DType::I16 if int_ok(i16::MIN as f64, i16::MAX as f64) => {
            out.copy_from_slice(&(v as i16).to_le_bytes())
        }
        DType::I32 if int_ok(i32::MIN as f64, i32::MAX as f64) => {
            out.copy_from_slice(&(v as i32).to_le_bytes())
        }
        DType::U32 if int_ok(0.0, u32::MAX as f64) => {
            out.copy_from_slice(&(v as u32).to_le_bytes())
        }
        DType::I64 if int_ok(-9.223372036854776e18, 9.223372036854775e18) => {
            out.copy_from_slice(&(v as i64).to_le_bytes())
        }
        _ => return Err(bad()),
    }
    Ok(())
}

/// One element of a tensor read exactly in its dtype: what a rewrite rule compares with an
/// identity (`0`, `1`) without a lossy conversion in between.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Element {
    /// A float element (F16, BF16, F32, F64), held exactly as f64, signed zeros and NaNs kept.
    Float(f64),
    /// An integer element (I8, I16, I32, I64, U8, U32).
    Int(i64),
    /// A Bool element.
    Bool(bool),
    /// A C64 element: its real and imaginary parts.
    Complex(f64, f64),
}

/// Read one element of `dt` from `b` (`b.len() >= dt.size_bytes()`) exactly.
pub fn read_element(b: &[u8], dt: DType) -> Element {
    let a4 = |b: &[u8]| [b[0], b[1], b[2], b[3]];
    match dt {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Element::Float(bytes_to_f64(b, dt)),
        DType::C64 => Element::Complex(
            f32::from_le_bytes(a4(b)) as f64,
            f32::from_le_bytes(a4(&b[4..])) as f64,
        ),
        DType::I64 => Element::Int(i64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ])),
        DType::I8 | DType::U8 | DType::I16 | DType::I32 | DType::U32 => {
            // Each fits f64 (and i64) exactly.
            Element::Int(bytes_to_f64(b, dt) as i64)
        }
        DType::Bool => Element::Bool(b[0] != 0),
    }
}

/// Read one element of `dt` from `b` as f64 (C64 yields its real part).
pub fn bytes_to_f64(b: &[u8], dt: DType) -> f64 {
    let a2 = |b: &[u8]| [b[0], b[1]];
    let a4 = |b: &[u8]| [b[0], b[1], b[2], b[3]];
    let a8 = |b: &[u8]| [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dt {
        DType::F32 | DType::C64 => f32::from_le_bytes(a4(b)) as f64,
        DType::F64 => f64::from_le_bytes(a8(b)),
        DType::F16 => f16::from_le_bytes(a2(b)).to_f64(),
        DType::BF16 => bf16::from_le_bytes(a2(b)).to_f64(),
        DType::I8 => b[0] as i8 as f64,
        DType::U8 | DType::Bool => b[0] as f64,
        DType::I16 => i16::from_le_bytes(a2(b)) as f64,
        DType::I32 => i32::from_le_bytes(a4(b)) as f64,
        DType::U32 => u32::from_le_bytes(a4(b)) as f64,
        DType::I64 => i64::from_le_bytes(a8(b)) as f64,
    }
}

/// Convert f32 values into the byte form of `dt`. Fails with the index of the first value an
/// integer or bool dtype cannot hold exactly (non-integral or out of range; bool takes 0 and 1).
pub fn f32_to_dtype(src: &[f32], dt: DType, dst: &mut [u8]) -> std::result::Result<(), usize> {
    let w = dt.size_bytes();
    match dt {
        DType::F32 => {
            for (v, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (v, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        DType::Bool => {
            for (i, (v, o)) in src.iter().zip(dst.iter_mut()).enumerate() {
                if *v != 0.0 && *v != 1.0 {
                    return Err(i);
                }
                *o = (*v == 1.0) as u8;
            }
        }
        _ => {
            for (i, (v, o)) in src.iter().zip(dst.chunks_exact_mut(w)).enumerate() {
                f64_to_bytes(*v as f64, dt, o).map_err(|_| i)?;
            }
        }
    }
    Ok(())
}

/// Convert elements of `dt` to f32 (C64 yields real parts).
pub fn dtype_to_f32(src: &[u8], dt: DType, dst: &mut [f32]) {
    let w = dt.size_bytes();
    if dt == DType::F32 {
        for (b, o) in src.chunks_exact(4).zip(dst.iter_mut()) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        return;
    }
    for (b, o) in src.chunks_exact(w).zip(dst.iter_mut()) {
        *o = bytes_to_f64(b, dt) as f32;
    }
}
