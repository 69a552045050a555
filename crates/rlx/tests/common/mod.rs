//! Helpers shared by the integration tests: encode / decode typed buffers.

#![allow(dead_code)]

pub mod gpt;
pub mod llm;
pub mod table;

use rlx::ir::convert;
use rlx::prelude::*;

/// Encode f64 values as the little-endian bytes of `dt` (values must fit).
pub fn encode(values: &[f64], dt: DType) -> Vec<u8> {
    if dt == DType::C64 {
        // Each c64 element is two values: its real and imaginary parts.
        return encode(values, DType::F32);
    }
    let w = dt.size_bytes();
    let mut out = vec![0u8; values.len() * w];
    for (v, o) in values.iter().zip(out.chunks_exact_mut(w)) {
        convert::f64_to_bytes(*v, dt, o).unwrap_or_else(|e| panic!("encoding {v} as {dt}: {e}"));
    }
    out
}

/// Decode little-endian bytes of `dt` as f64.
pub fn decode(bytes: &[u8], dt: DType) -> Vec<f64> {
    if dt == DType::C64 {
        return decode(bytes, DType::F32);
    }
    bytes
        .chunks_exact(dt.size_bytes())
        .map(|b| convert::bytes_to_f64(b, dt))
        .collect()
}
