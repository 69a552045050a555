//! Quantized matmul over packed GGUF rows, and GGUF row decoding.
//!
//! `DequantMatMul` never expands a weight matrix to f32. Activations are quantized once per
//! call to int8 in blocks of 32 (as llama.cpp does for its integer dot products); then each
//! thread decodes a few weight rows at a time into int8 values with one scale and one offset per
//! 16 elements — a form every GGUF block type maps to — and takes integer dot products of those
//! rows with every activation row (AVX2 `maddubs` when the CPU has it). F16/BF16 weights are
//! decoded to f32 rows instead. Like llama.cpp's kernels, the int8 products assume weight quants
//! in `-127..=127` (what every GGUF quantizer writes).

use super::reduce::for_each_line;
use super::{kernel, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::pool::Pool;
use rlx_gguf::GgmlType;
use rlx_ir::{Op, QuantScheme, Result};

#[cfg(target_arch = "x86_64")]
mod packed;
#[cfg(target_arch = "x86_64")]
use packed::{dot_group_rows, dot_packed_rows, pack_group, Act, ACTS, GROUP_BLOCK};

/// Elements per weight scale / offset.
const SUB: usize = 16;
/// Elements per activation scale.
const ABLK: usize = 32;
/// Weight rows decoded together (each activation row is loaded once per group).
const ROWS: usize = 4;
/// Software-prefetch distance (bytes) in the packed-row streams: 8 KiB gave 97 tok/s against
/// 57 at 512 bytes and 79 at 32 KiB (SmolLM2 decode, one thread, Sapphire Rapids). For
/// matrices of [`FAR_BYTES`] and more the prefetches ask for the L2 (`T1`), not the L1: on AMD
/// Zen 4 that took Gemma 3 decode from 36.5 to 62–64 tok/s (its LM head, a 178 MB Q8_0
/// matrix, from 9 to ~16 GB/s), where the distance mattered little (8 and 16 KiB alike, 4 KiB
/// 48 tok/s).
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 8192;

/// Weight matrices of at least this many bytes are prefetched into the L2 instead of the L1
/// (see [`prefetch_ahead`]).
#[cfg(target_arch = "x86_64")]
const FAR_BYTES: usize = 16 << 20;

/// Software prefetch of the weight bytes at `p`: into the L2 when `far` (a matrix too large to
/// stay in the caches between tokens, streamed from memory), else into the L1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(p: *const u8, far: bool) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    if far {
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
    } else {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
}

/// Which encoding of the `u8 × i8 → i32` dot-product instruction `vpdpbusd` the packed-row
/// kernels use.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vnni {
    /// None: `vpmaddubsw` + `vpmaddwd` (AVX2).
    None = 0,
    /// AVX-VNNI (VEX).
    Vex = 1,
    /// AVX-512 VNNI with VL (EVEX), on 256-bit registers.
    Evex = 2,
}

#[cfg(target_arch = "x86_64")]
impl Vnni {
    /// The best form the CPU has within the current [`crate::isa`] level.
    fn detect() -> Vnni {
        use crate::isa::Level;
        let level = crate::isa::current();
        if level >= Level::Avx2Vnni && std::is_x86_feature_detected!("avxvnni") {
            Vnni::Vex
        } else if level >= Level::Avx512
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512vl")
        {
            Vnni::Evex
        } else {
            Vnni::None
        }
    }
}

/// The `RLX_PROFILE` label of a quantized product with weights in `scheme`.
pub fn profile_name(scheme: QuantScheme) -> &'static str {
    use QuantScheme::*;
    match scheme {
        GgufF16 => "qmatmul f16",
        GgufBF16 => "qmatmul bf16",
        GgufQ4_0 => "qmatmul q4_0",
        GgufQ4_1 => "qmatmul q4_1",
        GgufQ5_0 => "qmatmul q5_0",
        GgufQ5_1 => "qmatmul q5_1",
        GgufQ8_0 => "qmatmul q8_0",
        GgufQ2K => "qmatmul q2_k",
        GgufQ3K => "qmatmul q3_k",
        GgufQ4K => "qmatmul q4_k",
        GgufQ5K => "qmatmul q5_k",
        GgufQ6K => "qmatmul q6_k",
        GgufQ8K => "qmatmul q8_k",
        _ => "dequant_matmul",
    }
}

#[inline(always)]
fn f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Decode one packed row into `w[i] = lane_scale * q[i] + min[i / 16]`, where the scale of
/// element `i` is stored lane-wise for the 32-element kernel: `ls[8 * (i / 32) + 0..4]` holds the
/// scale of the block's first 16 elements and `ls[8 * (i / 32) + 4..8]` that of the second 16.
fn unpack_row(ty: GgmlType, b: &[u8], q: &mut [i8], ls: &mut [f32], min: &mut [f32]) {
    let mut set = |s: usize, scale: f32, m: f32| {
        let lane = 8 * (s / 2) + 4 * (s % 2);
        ls[lane..lane + 4].fill(scale);
        min[s] = m;
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            let bb = ty.block_bytes();
            for (bi, blk) in b.chunks_exact(bb).enumerate() {
                let q = &mut q[bi * 32..bi * 32 + 32];
                let d = f16(blk, 0);
                let m = match ty {
                    GgmlType::Q4_1 | GgmlType::Q5_1 => f16(blk, 2),
                    _ => 0.0,
                };
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let (qs, off) = if ty == GgmlType::Q4_0 {
                            (&blk[2..18], 8)
                        } else {
                            (&blk[4..20], 0)
                        };
                        for j in 0..16 {
                            q[j] = (qs[j] & 15) as i8 - off;
                            q[j + 16] = (qs[j] >> 4) as i8 - off;
                        }
                    }
                    GgmlType::Q5_0 | GgmlType::Q5_1 => {
                        let (h, qs, off) = if ty == GgmlType::Q5_0 {
                            (2, &blk[6..22], 16)
                        } else {
                            (4, &blk[8..24], 0)
                        };
                        let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
                        for j in 0..16 {
                            q[j] = ((qs[j] & 15) as u32 | ((qh >> j) & 1) << 4) as i8 - off;
                            q[j + 16] =
                                ((qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i8 - off;
                        }
                    }
                    _ => {
                        for j in 0..32 {
                            q[j] = blk[2 + j] as i8;
                        }
                    }
                }
                set(2 * bi, d, m);
                set(2 * bi + 1, d, m);
            }
        }
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Q8_K => {
            for (bi, blk) in b.chunks_exact(ty.block_bytes()).enumerate() {
                let q = &mut q[bi * 256..bi * 256 + 256];
                let s0 = bi * 16;
                match ty {
                    GgmlType::Q2_K => {
                        let (sc, qs) = (&blk[0..16], &blk[16..80]);
                        let (d, dmin) = (f16(blk, 80), f16(blk, 82));
                        for n in 0..2 {
                            for j in 0..4 {
                                for h in 0..2 {
                                    let s = n * 8 + j * 2 + h;
                                    set(
                                        s0 + s,
                                        d * (sc[s] & 15) as f32,
                                        -(dmin * (sc[s] >> 4) as f32),
                                    );
                                    for l in 0..16 {
                                        q[n * 128 + j * 32 + h * 16 + l] =
                                            ((qs[n * 32 + h * 16 + l] >> (2 * j)) & 3) as i8;
                                    }
                                }
                            }
                        }
                    }
                    GgmlType::Q3_K => {
                        let (hm, qs) = (&blk[0..32], &blk[32..96]);
                        let sc = rlx_gguf::q3k_scales(&blk[96..108]);
                        let d = f16(blk, 108);
                        for n in 0..2 {
                            for j in 0..4 {
                                let bit = 1u8 << (n * 4 + j);
                                for h in 0..2 {
                                    let s = n * 8 + j * 2 + h;
                                    set(s0 + s, d * sc[s] as f32, 0.0);
                                    for l in 0..16 {
                                        let i = h * 16 + l;
                                        let v = ((qs[n * 32 + i] >> (2 * j)) & 3) as i8
                                            - if hm[i] & bit != 0 { 0 } else { 4 };
                                        q[n * 128 + j * 32 + i] = v;
                                    }
                                }
                            }
                        }
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        let (d, dmin) = (f16(blk, 0), f16(blk, 2));
                        let sc = &blk[4..16];
                        let (qh, qs) = if ty == GgmlType::Q5_K {
                            (Some(&blk[16..48]), &blk[48..176])
                        } else {
                            (None, &blk[16..144])
                        };
                        for j in 0..4 {
                            for h in 0..2 {
                                let (s, m) = rlx_gguf::k4_scale_min(2 * j + h, sc);
                                let (s, m) = (d * s as f32, -(dmin * m as f32));
                                set(s0 + 4 * j + 2 * h, s, m);
                                set(s0 + 4 * j + 2 * h + 1, s, m);
                            }
                            for l in 0..32 {
                                let v = qs[j * 32 + l];
                                let (mut lo, mut hi) = (v & 15, v >> 4);
                                if let Some(qh) = qh {
                                    lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                                    hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                                }
                                q[j * 64 + l] = lo as i8;
                                q[j * 64 + 32 + l] = hi as i8;
                            }
                        }
                    }
                    GgmlType::Q6_K => {
                        let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                        let d = f16(blk, 208);
                        for n in 0..2 {
                            let (ql, qh) = (&ql[n * 64..], &qh[n * 32..]);
                            for l in 0..32 {
                                let o = n * 128;
                                q[o + l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
                                q[o + l + 32] =
                                    ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                                q[o + l + 64] =
                                    ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                                q[o + l + 96] =
                                    ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                            }
                            for s in 0..8 {
                                set(s0 + n * 8 + s, d * (sc[n * 8 + s] as i8) as f32, 0.0);
                            }
                        }
                    }
                    _ => {
                        let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                        for j in 0..256 {
                            q[j] = blk[4 + j] as i8;
                        }
                        for s in 0..16 {
                            set(s0 + s, d, 0.0);
                        }
                    }
                }
            }
        }
        _ => unreachable!("float rows are decoded to f32"),
    }
}

/// Whether the CPU's products take weights of `scheme`: GGUF rows of a float type or of a type
/// whose activation rounding it knows ([`ActQuant::of`]).
pub(super) fn runs(scheme: rlx_ir::QuantScheme) -> bool {
    scheme.ggml_type().is_some_and(|ty| {
        matches!(ty, GgmlType::F16 | GgmlType::BF16) || ActQuant::of(ty).is_some()
    })
}

/// How activations are quantized for a weight type: exactly as llama.cpp's x86 code does for
/// that type's `vec_dot_type`, so the integer products (and hence the logits) match its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActQuant {
    /// `Q8_0`: blocks of 32, `d = amax / 127` stored as f16, `q = round_even(x * 127 / amax)`.
    Q8_0,
    /// `Q8_1`: as `Q8_0`, plus the block sum `s = d * sum(q)` stored as f16.
    Q8_1,
    /// `Q8_K`: blocks of 256, `d = 1 / iscale` in f32 with `iscale = -127 / (signed max)`.
    Q8K,
}

impl ActQuant {
    /// The activation rounding of products with `ty` weights; `None` for float weights (taken
    /// as they are) and for the types the CPU's products do not run (refused at lowering).
    fn of(ty: GgmlType) -> Option<ActQuant> {
        use GgmlType as G;
        match ty {
            G::Q4_1 | G::Q5_1 => Some(ActQuant::Q8_1),
            G::Q4_0 | G::Q5_0 | G::Q8_0 => Some(ActQuant::Q8_0),
            G::Q2_K | G::Q3_K | G::Q4_K | G::Q5_K | G::Q6_K | G::Q8_K => Some(ActQuant::Q8K),
            G::F32
            | G::F16
            | G::BF16
            | G::F64
            | G::Q8_1
            | G::IQ2_XXS
            | G::IQ2_XS
            | G::IQ3_XXS
            | G::IQ1_S
            | G::IQ4_NL
            | G::IQ3_S
            | G::IQ2_S
            | G::IQ4_XS
            | G::IQ1_M
            | G::I8
            | G::I16
            | G::I32
            | G::I64
            | G::TQ1_0
            | G::TQ2_0
            | G::MXFP4 => None,
        }
    }
}

#[inline(always)]
fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// Quantize an activation row to int8: `qx`, lane scales `la` (the scale of each 32-element
/// block repeated 8 times) and per-16 terms `xs` for the weight offsets and mins: for `Q8_0` and
/// `Q8_1` the two terms of a 32-block sum to its `d * sum(q)`; for `Q8_K` they are the integer
/// sums of the 16 quants (exact in f32; the scale is `la`), as llama.cpp's `bsums`.
fn quantize_act(
    mode: ActQuant,
    x: impl Fn(usize) -> f32,
    k: usize,
    qx: &mut [i8],
    la: &mut [f32],
    xs: &mut [f32],
) {
    // Compiled for AVX2 where the CPU has it: rounding is then one instruction, not a libm call.
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(
            mode: ActQuant,
            x: impl Fn(usize) -> f32,
            k: usize,
            qx: &mut [i8],
            la: &mut [f32],
            xs: &mut [f32],
        ) {
            quantize_act_imp(mode, x, k, qx, la, xs)
        }
        if crate::isa::avx2() {
            // SAFETY: the CPU has the feature.
            return unsafe { avx2(mode, x, k, qx, la, xs) };
        }
    }
    quantize_act_imp(mode, x, k, qx, la, xs)
}

#[inline(always)]
fn quantize_act_imp(
    mode: ActQuant,
    x: impl Fn(usize) -> f32,
    k: usize,
    qx: &mut [i8],
    la: &mut [f32],
    xs: &mut [f32],
) {
    if mode == ActQuant::Q8K {
        for sb in 0..k / 256 {
            let (mut amax, mut max) = (0f32, 0f32);
            for i in 0..256 {
                let v = x(sb * 256 + i);
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let q = &mut qx[sb * 256..(sb + 1) * 256];
            let d = if amax == 0.0 {
                q.fill(0);
                0.0
            } else {
                let iscale = -127.0 / max;
                for (i, qi) in q.iter_mut().enumerate() {
                    *qi = ((iscale * x(sb * 256 + i)).round_ties_even() as i32).min(127) as i8;
                }
                1.0 / iscale
            };
            la[sb * 64..(sb + 1) * 64].fill(d);
            for s in 0..16 {
                let sum: i32 = q[s * 16..(s + 1) * 16].iter().map(|&v| v as i32).sum();
                xs[sb * 16 + s] = sum as f32;
            }
        }
        return;
    }
    for b in 0..k / ABLK {
        let mut amax = 0f32;
        for i in 0..ABLK {
            amax = amax.max(x(b * ABLK + i).abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for i in 0..ABLK {
            let v = (x(b * ABLK + i) * id).round_ties_even() as i8;
            qx[b * ABLK + i] = v;
            sum += v as i32;
        }
        let dh = f16_round(d);
        la[b * 8..b * 8 + 8].fill(dh);
        xs[2 * b] = if mode == ActQuant::Q8_1 {
            f16_round(d * sum as f32)
        } else {
            dh * sum as f32
        };
        xs[2 * b + 1] = 0.0;
    }
}

/// `sum_i w[i] * x[i]` for a decoded weight row and a quantized activation row.
#[allow(clippy::too_many_arguments)]
fn dot(
    q: &[i8],
    ls: &[f32],
    min: &[f32],
    qx: &[i8],
    la: &[f32],
    xs: &[f32],
    raw_sums: bool,
    simd: bool,
) -> f32 {
    let mut off = 0f32;
    for (g, (m, s)) in min.iter().zip(xs).enumerate() {
        // Raw (`Q8_K`) sums take their 16-group's activation scale.
        off += m * if raw_sums { s * la[4 * g] } else { *s };
    }
    #[cfg(target_arch = "x86_64")]
    if simd && crate::isa::avx2() {
        // SAFETY: the CPU has the features; slices hold whole 32-element blocks.
        return off + unsafe { dot_avx2(q, ls, qx, la) };
    }
    let mut acc = 0f32;
    for b in 0..q.len() / ABLK {
        for h in 0..2 {
            let mut s = 0i32;
            for i in b * ABLK + h * SUB..b * ABLK + (h + 1) * SUB {
                s += q[i] as i32 * qx[i] as i32;
            }
            acc += s as f32 * ls[8 * b + 4 * h] * la[8 * b];
        }
    }
    acc + off
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(q: &[i8], ls: &[f32], qx: &[i8], la: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for b in 0..q.len() / ABLK {
        let w = _mm256_loadu_si256(q.as_ptr().add(b * ABLK) as *const __m256i);
        let a = _mm256_loadu_si256(qx.as_ptr().add(b * ABLK) as *const __m256i);
        // |w| * (a * sign(w)) pairs: u8 x i8 products summed in i16. The weight takes the
        // absolute value (a -128 quant becomes 128 as u8) and the activation the sign (|a| <= 127,
        // so negating it never overflows), as llama.cpp orders them.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
        let p32 = _mm256_madd_epi16(p16, ones);
        let scale = _mm256_mul_ps(
            _mm256_loadu_ps(ls.as_ptr().add(8 * b)),
            _mm256_loadu_ps(la.as_ptr().add(8 * b)),
        );
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc);
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Whether `ty` has a fused AVX2 dot product on its packed blocks (no decoding pass).
fn fused(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(
            ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q6_K
        ) && crate::isa::avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// Whether products of `ty` take four activation rows at a time through [`dot_group`].
fn grouped(ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && fused(ty)
        && matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
        )
}

/// Scratch bytes of the packed activation groups of an `m`-row product (whole groups of
/// [`ACTS`] rows; the rest go through [`dot_packed_rows`]).
fn group_bytes(ty: GgmlType, m: usize, k: usize) -> usize {
    if !grouped(ty) {
        return 0;
    }
    #[cfg(target_arch = "x86_64")]
    return (m / ACTS) * (k / ABLK) * GROUP_BLOCK;
    #[cfg(not(target_arch = "x86_64"))]
    return 0;
}

/// Byte sizes of the per-row scratch pieces for `K = k`.
struct Sizes {
    q: usize,
    ls: usize,
    min: usize,
}

impl Sizes {
    fn new(k: usize) -> Sizes {
        let r = |b: usize| b.div_ceil(64) * 64;
        Sizes {
            q: r(k),
            ls: r(k / ABLK * 8 * 4),
            min: r(k / SUB * 4),
        }
    }
    fn row(&self) -> usize {
        self.q + self.ls + self.min
    }
}

/// Raw views of one decoded/quantized row inside a scratch buffer.
///
/// # Safety
/// `base` points to `Sizes::row()` bytes owned by the caller for the duration of the borrow.
unsafe fn row_views<'a>(
    base: *mut u8,
    k: usize,
    z: &Sizes,
) -> (&'a mut [i8], &'a mut [f32], &'a mut [f32]) {
    (
        std::slice::from_raw_parts_mut(base as *mut i8, k),
        std::slice::from_raw_parts_mut(base.add(z.q) as *mut f32, k / ABLK * 8),
        std::slice::from_raw_parts_mut(base.add(z.q + z.ls) as *mut f32, k / SUB),
    )
}

/// Shared views of one quantized activation row inside a scratch buffer (see [`row_views`]).
///
/// # Safety
/// As [`row_views`], and no mutable view of the row is alive.
#[cfg(target_arch = "x86_64")]
unsafe fn act_views<'a>(base: *const u8, k: usize, z: &Sizes) -> Act<'a> {
    (
        std::slice::from_raw_parts(base as *const i8, k),
        std::slice::from_raw_parts(base.add(z.q) as *const f32, k / ABLK * 8),
        std::slice::from_raw_parts(base.add(z.q + z.ls) as *const f32, k / SUB),
    )
}

#[allow(clippy::too_many_arguments)]
fn dequant_matmul(
    ty: GgmlType,
    x: TRef,
    w: TRef,
    out: TRef,
    scratch: Ptr,
    m: usize,
    k: usize,
    n: usize,
) -> Box<dyn Kernel> {
    let z = Sizes::new(k);
    let row_bytes = ty.row_bytes(k).expect("checked by shape inference");
    let float = matches!(ty, GgmlType::F16 | GgmlType::BF16);
    let groups_at = if float { 0 } else { m * z.row() };
    let act_bytes = groups_at + group_bytes(ty, m, k);
    let per_thread = if float { ROWS * k * 4 } else { ROWS * z.row() };
    // Float weights (`float`) quantize no activations; `lower` refused every other type
    // without a rounding.
    let mode = ActQuant::of(ty).unwrap_or(ActQuant::Q8K);
    #[cfg(target_arch = "x86_64")]
    let far = n * row_bytes >= FAR_BYTES;
    kernel(move |pool: &Pool| {
        // The instruction-set choices are made per run, like every other kernel's, so a graph
        // runs at the level in force when it runs (`crate::isa::with_level`).
        let packed = fused(ty);
        #[cfg(target_arch = "x86_64")]
        let vnni = Vnni::detect();
        let simd = crate::isa::avx2();
        let axis = x.layout.rank() - 1;
        let xstride = x.layout.strides()[axis];
        let mut row_off = Vec::new();
        // The row offsets of x (allocation-free for the common 1- and 2-D contiguous cases).
        let contiguous = x.layout.is_contiguous();
        if !contiguous {
            row_off.reserve(m);
            for_each_line(&x.layout, &out.layout, axis, 0..m, |i, _| row_off.push(i));
        }
        let xrow = move |r: usize| {
            if contiguous {
                x.layout.offset + r * k
            } else {
                row_off[r]
            }
        };
        let xrow = &xrow;
        let sp = scratch;
        if !float {
            super::par_ranges(pool, m, 8, |rows| {
                let xp = x.base::<f32>() as *const f32;
                for r in rows {
                    // SAFETY: each activation row has its own scratch slice; x rows are in bounds.
                    unsafe {
                        let (qx, la, xs) = row_views(sp.get().add(r * z.row()), k, &z);
                        let base = xp.add(xrow(r));
                        quantize_act(mode, |i| *base.add(i * xstride), k, qx, la, xs);
                    }
                }
            });
            #[cfg(target_arch = "x86_64")]
            if grouped(ty) {
                super::par_ranges(pool, m / ACTS, 1, |gs| {
                    for g in gs {
                        // SAFETY: each group has its own slice of the groups area; the rows
                        // were quantized above.
                        unsafe {
                            let acts: [Act<'_>; ACTS] = std::array::from_fn(|i| {
                                act_views(sp.get().add((g * ACTS + i) * z.row()), k, &z)
                            });
                            let dst = sp.get().add(groups_at + g * (k / ABLK) * GROUP_BLOCK);
                            pack_group(&acts, k / ABLK, dst);
                        }
                    }
                });
            }
        }
        let groups = n.div_ceil(ROWS);
        let tasks = groups.min(pool.threads() * 8).max(1);
        pool.run(tasks, &|t, thread| {
            let (g0, g1) = (t * groups / tasks, (t + 1) * groups / tasks);
            // SAFETY: each thread owns its scratch slot; every output element is written once.
            unsafe {
                let xp = x.base::<f32>() as *const f32;
                let mine = sp.get().add(act_bytes + thread * per_thread);
                let wp = w.base::<u8>().add(w.layout.offset) as *const u8;
                let op = out.base::<f32>();
                // The first (often only) chunk of activation rows, made once for all groups.
                #[cfg(target_arch = "x86_64")]
                let first: [Act<'_>; ACTS] = std::array::from_fn(|i| {
                    act_views(sp.get().add(i.min(m.max(1) - 1) * z.row()), k, &z)
                });
                for gi in g0..g1 {
                    let (n0, n1) = (gi * ROWS, ((gi + 1) * ROWS).min(n));
                    if float {
                        let buf = std::slice::from_raw_parts_mut(mine as *mut f32, ROWS * k);
                        for j in n0..n1 {
                            let src = std::slice::from_raw_parts(wp.add(j * row_bytes), row_bytes);
                            rlx_gguf::dequantize_with(
                                ty,
                                src,
                                &mut buf[(j - n0) * k..(j - n0 + 1) * k],
                                crate::isa::avx2(),
                            )
                            .expect("sizes checked");
                        }
                        for r in 0..m {
                            let base = xp.add(xrow(r));
                            for j in n0..n1 {
                                let wrow = &buf[(j - n0) * k..(j - n0 + 1) * k];
                                let mut s = 0f32;
                                for (i, wv) in wrow.iter().enumerate() {
                                    s += wv * *base.add(i * xstride);
                                }
                                *op.add(out_index(&out, r, j, n)) = s;
                            }
                        }
                        continue;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if packed {
                        let mut res = [[0f32; ROWS]; ACTS];
                        let mut r0 = 0;
                        while r0 < m {
                            let take = (m - r0).min(ACTS);
                            // A whole group through its packed stream, else the rows as they are.
                            let grouped = take == ACTS
                                && dot_group_rows(
                                    ty,
                                    vnni,
                                    far,
                                    wp.add(n0 * row_bytes),
                                    row_bytes,
                                    n1 - n0,
                                    sp.get()
                                        .add(groups_at + r0 / ACTS * (k / ABLK) * GROUP_BLOCK),
                                    &mut res,
                                );
                            if !grouped {
                                let acts: [Act<'_>; ACTS] = if r0 == 0 {
                                    first
                                } else {
                                    std::array::from_fn(|i| {
                                        act_views(
                                            sp.get().add((r0 + i.min(take - 1)) * z.row()),
                                            k,
                                            &z,
                                        )
                                    })
                                };
                                dot_packed_rows(
                                    ty,
                                    vnni,
                                    far,
                                    wp.add(n0 * row_bytes),
                                    row_bytes,
                                    n1 - n0,
                                    &acts[..take],
                                    &mut res,
                                );
                            }
                            for (i, row) in res.iter().enumerate().take(take) {
                                for j in n0..n1 {
                                    *op.add(out_index(&out, r0 + i, j, n)) = row[j - n0];
                                }
                            }
                            r0 += take;
                        }
                        continue;
                    }
                    for j in n0..n1 {
                        let (q, ls, min) = row_views(mine.add((j - n0) * z.row()), k, &z);
                        let row = wp.add(j * row_bytes);
                        #[cfg(target_arch = "x86_64")]
                        for line in (0..row_bytes).step_by(64) {
                            prefetch_ahead(row.wrapping_add(PREFETCH + line), far);
                        }
                        unpack_row(ty, std::slice::from_raw_parts(row, row_bytes), q, ls, min);
                    }
                    for r in 0..m {
                        let (qx, la, xs) = row_views(sp.get().add(r * z.row()), k, &z);
                        for j in n0..n1 {
                            let (q, ls, min) = row_views(mine.add((j - n0) * z.row()), k, &z);
                            *op.add(out_index(&out, r, j, n)) =
                                dot(q, ls, min, qx, la, xs, mode == ActQuant::Q8K, simd);
                        }
                    }
                }
            }
        });
    })
}

/// Element offset of output row `r`, column `j` (outputs are dense).
#[inline(always)]
fn out_index(out: &TRef, r: usize, j: usize, n: usize) -> usize {
    out.layout.offset + r * n + j
}

fn dequantize_rows(
    ty: GgmlType,
    w: TRef,
    out: TRef,
    rows: usize,
    row_bytes: usize,
    k: usize,
) -> Box<dyn Kernel> {
    kernel(move |pool: &Pool| {
        let axis = w.layout.rank() - 1;
        let strided = !w.layout.is_contiguous();
        // A row whose bytes are not adjacent (a batch axis moved last by vmap) is gathered first.
        let step = w.layout.strides().last().copied().unwrap_or(1);
        super::par_ranges(pool, rows, 64, |range| {
            // SAFETY: rows lie inside the buffers; each output row is written by one task.
            unsafe {
                let op = out.base::<f32>();
                let emit = |i: usize, r: usize| {
                    let gathered: Vec<u8>;
                    let src = if step == 1 {
                        std::slice::from_raw_parts(w.base::<u8>().add(i) as *const u8, row_bytes)
                    } else {
                        gathered = (0..row_bytes)
                            .map(|j| *w.base::<u8>().add(i + j * step))
                            .collect();
                        &gathered
                    };
                    let dst = std::slice::from_raw_parts_mut(op.add(out.layout.offset + r * k), k);
                    rlx_gguf::dequantize_with(ty, src, dst, crate::isa::avx2())
                        .expect("sizes checked");
                };
                if strided {
                    let mut r = range.start;
                    for_each_line(&w.layout, &w.layout, axis, range, |i, _| {
                        emit(i, r);
                        r += 1;
                    });
                } else {
                    for r in range {
                        emit(w.layout.offset + r * row_bytes, r);
                    }
                }
            }
        });
    })
}

/// Matrices of at least this many activation rows go through the f32 GEMM instead of int8 dot
/// products (the IR's rule for when activations are rounded).
pub const GEMM_MIN_M: usize = QuantScheme::ROUNDED_ACTS_BELOW;
/// Weight rows dequantized per GEMM panel.
const PANEL: usize = 256;

/// Scratch bytes of [`dequant_gemm`].
fn gemm_scratch(m: usize, k: usize, threads: usize) -> usize {
    let shared = PANEL * k + super::gemm::scratch_len(m, PANEL, k, threads);
    let own = if own_panels(m, threads) {
        threads * own_panel_floats(m, k)
    } else {
        0
    };
    shared.max(own) * 4 + 64
}

/// Up to this many activation rows, a multi-threaded prompt product gives each thread whole
/// panels of its own (decoded and multiplied without waiting for the other threads) instead of
/// splitting every panel's decoding and then its product between the threads (two waits per
/// panel). On 2 cores (Gemma 3 270M) that took prefill from 491 to 575 tok/s at 32 tokens and
/// from 730 to 795 at 512.
const OWN_PANELS_MAX_M: usize = 1024;

/// Whether an `m`-row prompt product on `threads` threads uses per-thread panels.
fn own_panels(m: usize, threads: usize) -> bool {
    threads > 1 && m <= OWN_PANELS_MAX_M
}

/// Weight rows per panel when each thread takes its own panels.
const OWN_PANEL: usize = 64;

/// Floats of one thread's panel and serial GEMM scratch in the own-panels mode.
fn own_panel_floats(m: usize, k: usize) -> usize {
    OWN_PANEL * k + super::gemm::scratch_len(m, OWN_PANEL, k, 1)
}

/// Prompt-sized products: dequantize `PANEL` weight rows at a time to f32 and multiply with the
/// packed f32 GEMM (many activation rows amortize the decoding, and the GEMM beats int8 dot
/// products once every weight is reused that often); with several threads, each takes
/// `OWN_PANEL`-row panels of its own ([`OWN_PANELS_MAX_M`]).
#[allow(clippy::too_many_arguments)]
fn dequant_gemm(
    ty: GgmlType,
    x: TRef,
    w: TRef,
    out: TRef,
    scratch: Ptr,
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
) -> Box<dyn Kernel> {
    let row_bytes = ty.row_bytes(k).expect("checked by shape inference");
    kernel(move |pool: &Pool| {
        // SAFETY: the panel and GEMM scratch lie in this step's scratch; x is dense [m, k] and
        // out dense [m, n]; each panel row is written by one task.
        unsafe {
            let panel = scratch.get() as *mut f32;
            let gs = panel.add(PANEL * k);
            let xp = x.base::<f32>().add(x.layout.offset) as *const f32;
            let op = out.base::<f32>().add(out.layout.offset);
            let dequant_rows = |panel: *mut f32, n0: usize, rows: std::ops::Range<usize>| {
                for j in rows {
                    let src = std::slice::from_raw_parts(
                        w.base::<u8>().add(w.layout.offset + (n0 + j) * row_bytes) as *const u8,
                        row_bytes,
                    );
                    let dst = std::slice::from_raw_parts_mut(panel.add(j * k), k);
                    rlx_gguf::dequantize_with(ty, src, dst, crate::isa::avx2())
                        .expect("sizes checked");
                }
            };
            let a = super::gemm::Mat {
                ptr: xp,
                rs: k,
                cs: 1,
            };
            // The scratch was sized for the compiled thread count (the pool's).
            if own_panels(m, threads) {
                let (sp, opp, xpp) = (scratch, Ptr(op as *mut u8), Ptr(xp as *mut u8));
                let per = own_panel_floats(m, k);
                pool.run(n.div_ceil(OWN_PANEL), &|t, thread| {
                    // SAFETY: each thread's panel and GEMM scratch are its own slice of the
                    // scratch; each task writes output columns n0..n0 + nb only.
                    let panel = (sp.get() as *mut f32).add(thread * per);
                    let (n0, nb) = (t * OWN_PANEL, OWN_PANEL.min(n - t * OWN_PANEL));
                    dequant_rows(panel, n0, 0..nb);
                    let a = super::gemm::Mat {
                        ptr: xpp.get() as *const f32,
                        rs: k,
                        cs: 1,
                    };
                    let b = super::gemm::Mat {
                        ptr: panel,
                        rs: 1,
                        cs: k,
                    };
                    super::gemm::sgemm(
                        None,
                        m,
                        nb,
                        k,
                        a,
                        b,
                        (opp.get() as *mut f32).add(n0),
                        n,
                        panel.add(OWN_PANEL * k),
                    );
                });
                return;
            }
            for n0 in (0..n).step_by(PANEL) {
                let nb = PANEL.min(n - n0);
                let pp = Ptr(panel as *mut u8);
                super::par_ranges(pool, nb, 16, |rows| {
                    dequant_rows(pp.get() as *mut f32, n0, rows)
                });
                let b = super::gemm::Mat {
                    ptr: panel,
                    rs: 1,
                    cs: k,
                };
                super::gemm::sgemm(Some(pool), m, nb, k, a, b, op.add(n0), n, gs);
            }
        }
    })
}

/// Lower DequantMatMul / DequantizeRows with a GGUF scheme (others are decomposed before lowering).
pub fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    match &info.node.op {
        Op::DequantMatMul { scheme } => {
            let ty = scheme.ggml_type().ok_or_else(|| {
                info.unsupported(format!("{scheme:?} is decomposed, not lowered"))
            })?;
            if info.in_dtypes[0] != rlx_ir::DType::F32 {
                return Err(info.unsupported(format!("x must be f32, got {}", info.in_dtypes[0])));
            }
            if !matches!(ty, GgmlType::F16 | GgmlType::BF16) && ActQuant::of(ty).is_none() {
                return Err(info.unsupported(format!("no CPU product for {ty:?} weights")));
            }
            if info.ins[1].strides().last() != Some(&1) || !info.ins[1].is_contiguous() {
                return Err(info.unsupported("the packed weight must be a dense param or constant"));
            }
            let k = *info.ins[0].dims().last().unwrap_or(&0);
            let n = *info.dims.last().unwrap_or(&0);
            let m = info.ins[0].numel() / k.max(1);
            // Axes before the matrix rows are independent products: `x [B, 1, K]` is B one-row
            // products on the int8 path, each computed as a one-token step computes it, however
            // large B is (what batch-invariant serving relies on).
            let dims = info.ins[0].dims();
            let rows = if dims.len() >= 2 {
                dims[dims.len() - 2]
            } else {
                1
            };
            if rows >= GEMM_MIN_M && info.ins[0].is_contiguous() {
                let threads = info.threads;
                return Ok(Lowered::Compute {
                    scratch: gemm_scratch(m, k, threads),
                    build: Box::new(move |ins, out, s| {
                        dequant_gemm(ty, ins[0], ins[1], out, s, m, k, n, threads)
                    }),
                });
            }
            let z = Sizes::new(k);
            let float = matches!(ty, GgmlType::F16 | GgmlType::BF16);
            let scratch = if float {
                info.threads * ROWS * k * 4
            } else {
                (m + info.threads * ROWS) * z.row() + group_bytes(ty, m, k)
            };
            Ok(Lowered::Compute {
                scratch: scratch.max(64),
                build: Box::new(move |ins, out, s| {
                    dequant_matmul(ty, ins[0], ins[1], out, s, m, k, n)
                }),
            })
        }
        Op::DequantizeRows { scheme } => {
            let ty = scheme
                .ggml_type()
                .ok_or_else(|| info.unsupported(format!("{scheme:?} is not a GGUF scheme")))?;
            let row_bytes = *info.ins[0].dims().last().unwrap_or(&0);
            let k = *info.dims.last().unwrap_or(&0);
            let rows = info.ins[0].numel() / row_bytes.max(1);
            Ok(super::compute(move |ins, out| {
                dequantize_rows(ty, ins[0], out, rows, row_bytes, k)
            }))
        }
        other => Err(info.unsupported(format!("{} is not a quantized op", other.name()))),
    }
}
