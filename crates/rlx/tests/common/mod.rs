//! Helpers shared by the integration tests: encode / decode typed buffers.

#![allow(dead_code)]

pub mod digits;
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

/// `n` deterministic values in `[lo, hi)` (xorshift from `seed`): inputs for tests that must
/// not depend on a crate's random stream.
pub fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}
