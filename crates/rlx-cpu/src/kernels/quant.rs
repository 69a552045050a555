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
    fn of(ty: GgmlType) -> ActQuant {
        match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 => ActQuant::Q8_1,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => ActQuant::Q8_0,
            _ => ActQuant::Q8K,
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

/// One quantized activation row: its quants, block scales and block sums (see `row_views`).
#[cfg(target_arch = "x86_64")]
type Act<'a> = (&'a [i8], &'a [f32], &'a [f32]);

/// Activation rows one call of [`dot_packed_rows`] takes at most.
#[cfg(target_arch = "x86_64")]
const ACTS: usize = 4;

/// Dot products of up to four packed rows of a 32-element block type with up to [`ACTS`]
/// quantized activation rows, straight from the packed bytes. Quants enter the integer product
/// as unsigned bytes; the format's offset (`-8`, `-16`) or min is applied through the
/// activation block sums. Four weight rows share each activation load and keep independent
/// accumulator chains; each weight block is decoded once for all the activation rows (a batch
/// of decode rows then costs little more than one), and every (weight row, activation row) pair
/// goes through the same operations in the same order as alone, so results do not depend on how
/// many rows come together.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and the VNNI form `vnni` names; `rows` points at `n` rows of
/// `row_bytes` bytes (`1 <= n <= 4`) holding `k / 32` blocks of `ty`; `acts` holds 1 to
/// [`ACTS`] rows of `k` quants; `out[a]` gets activation row `a`'s `n` results.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_packed_rows(
    ty: GgmlType,
    vnni: Vnni,
    far: bool,
    rows: *const u8,
    row_bytes: usize,
    n: usize,
    acts: &[Act<'_>],
    out: &mut [[f32; ROWS]; ACTS],
) {
    // Slots past `acts.len()` repeat the last row (computed, never read).
    let pick = |i: usize| acts[i.min(acts.len() - 1)];
    macro_rules! go {
        ($f:literal, $a:literal) => {{
            let a: [Act<'_>; $a] = std::array::from_fn(pick);
            let o = (&mut out[..$a]).try_into().expect("$a slots");
            match vnni {
                Vnni::Vex => dot_rows_vnni::<$f, $a>(rows, row_bytes, n, far, a, o),
                Vnni::Evex => dot_rows_vnni512::<$f, $a>(rows, row_bytes, n, far, a, o),
                Vnni::None => dot_rows_avx2::<$f, $a>(rows, row_bytes, n, far, a, o),
            }
        }};
    }
    macro_rules! by_acts {
        ($f:literal) => {
            match acts.len() {
                1 => go!($f, 1),
                2 => go!($f, 2),
                _ => go!($f, 4),
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => by_acts!(0),
        GgmlType::Q4_1 => by_acts!(1),
        GgmlType::Q5_0 => by_acts!(2),
        GgmlType::Q5_1 => by_acts!(3),
        GgmlType::Q8_0 => by_acts!(4),
        _ => {
            for r in 0..n {
                let row = std::slice::from_raw_parts(rows.add(r * row_bytes), row_bytes);
                macro_rules! k {
                    ($a:literal) => {{
                        let a: [Act<'_>; $a] = std::array::from_fn(pick);
                        for (o, v) in out.iter_mut().zip(dot_kquant_avx2(ty, row, far, a)) {
                            o[r] = v;
                        }
                    }};
                }
                match acts.len() {
                    1 => {
                        let (qx, la, xs) = acts[0];
                        out[0][r] = dot_kquant_one(ty, row, far, qx, la, xs);
                    }
                    2 => k!(2),
                    _ => k!(4),
                }
            }
        }
    }
}

/// Dot product of one packed Q4_K or Q6_K row with one `Q8_K`-quantized activation row, on the
/// packed bytes: per super-block, sub-block products are weighted by their integer scales in
/// 32-bit integers and converted to float once; mins (Q4_K) and the `-32` offset (Q6_K) go
/// through the activation's integer per-16 sums. The float steps follow llama.cpp's x86 code
/// for the same type (repacked 8-row Q4_K, plain Q6_K), so results are bit-identical to it.
///
/// This single-row form (token-by-token decode) is kept beside [`dot_kquant_avx2`], which
/// takes several rows: that one instantiated for one row decoded Gemma 3 ~6% slower (same-run
/// A/B, `rlx bench -t 1 -r 3 -p 64 -n 128`, 6 runs each: 55 against 58.5 tok/s, also with
/// its decoding interleaved per sub-block). Both take the same float steps in the same order.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds whole super-blocks of `ty`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_kquant_one(
    ty: GgmlType,
    row: &[u8],
    far: bool,
    qx: &[i8],
    la: &[f32],
    xs: &[f32],
) -> f32 {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    let mut acc = _mm256_setzero_ps();
    // Q4_K: the weighted sums and the min terms of each super-block are exact integers, scaled
    // and accumulated in f32 one super-block after the other (llama.cpp's repacked Q4_K order).
    let (mut acc_q4, mut acc_min) = (0f32, 0f32);
    let p = row.as_ptr();
    let halves = |a: i16, b: i16| _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
    for sb in 0..row.len() / bb {
        let blk = p.add(sb * bb);
        for line in (0..bb).step_by(64) {
            prefetch_ahead(blk.wrapping_add(PREFETCH + line), far);
        }
        let a = qx.as_ptr().add(sb * 256);
        // Integer sums of the 16 activation groups.
        let xs = &xs[sb * 16..sb * 16 + 16];
        let dx = *la.get_unchecked(sb * 64);
        let mut isum = _mm256_setzero_si256();
        let d;
        if ty == GgmlType::Q4_K {
            let b = std::slice::from_raw_parts(blk, bb);
            d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let dmin = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
            let mut mins = 0i32;
            for j in 0..4 {
                let (s1, m1) = rlx_gguf::k4_scale_min(2 * j, &b[4..16]);
                let (s2, m2) = rlx_gguf::k4_scale_min(2 * j + 1, &b[4..16]);
                let (lo, hi) = rlx_gguf::simd::split_nibbles(_mm256_loadu_si256(
                    blk.add(16 + 32 * j) as *const __m256i,
                ));
                let a_lo = _mm256_loadu_si256(a.add(64 * j) as *const __m256i);
                let a_hi = _mm256_loadu_si256(a.add(64 * j + 32) as *const __m256i);
                let p_lo =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_set1_epi16(s1 as i16));
                let p_hi =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), _mm256_set1_epi16(s2 as i16));
                isum = _mm256_add_epi32(isum, _mm256_add_epi32(p_lo, p_hi));
                mins += m1 as i32 * (xs[4 * j] + xs[4 * j + 1]) as i32
                    + m2 as i32 * (xs[4 * j + 2] + xs[4 * j + 3]) as i32;
            }
            let h = _mm_add_epi32(
                _mm256_castsi256_si128(isum),
                _mm256_extracti128_si256(isum, 1),
            );
            let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0b01_00_11_10));
            let total = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0b10_11_00_01)));
            acc_q4 = (total as f32).mul_add(d * dx, acc_q4);
            acc_min = (mins as f32).mul_add(dmin * dx, acc_min);
            continue;
        } else {
            let b = std::slice::from_raw_parts(blk, bb);
            d = half::f16::from_le_bytes([b[208], b[209]]).to_f32();
            let sc = &b[192..208];
            for n in 0..2 {
                let q = rlx_gguf::simd::q6k_half(blk, n);
                for (kk, qk) in q.iter().enumerate() {
                    let (sa, sbv) = (sc[n * 8 + 2 * kk] as i8, sc[n * 8 + 2 * kk + 1] as i8);
                    let ak = _mm256_loadu_si256(a.add(128 * n + 32 * kk) as *const __m256i);
                    let pk = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(*qk, ak),
                        halves(sa as i16, sbv as i16),
                    );
                    isum = _mm256_add_epi32(isum, pk);
                }
            }
            // The -32 offset of every weight, in integers: lane l takes 16-groups 2l and 2l + 1,
            // 32 * (sum_2l * scale_2l + sum_2l+1 * scale_2l+1).
            let s0 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr()));
            let s1 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr().add(8)));
            let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(s0, s1));
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
            isum = _mm256_sub_epi32(
                isum,
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sums, scales)),
            );
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc);
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    if ty == GgmlType::Q4_K {
        return acc_q4 - acc_min;
    }
    _mm_cvtss_f32(s)
}

/// Dot products of one packed Q4_K or Q6_K row with `A` `Q8_K`-quantized activation rows, on
/// the packed bytes: per super-block, sub-block products are weighted by their integer scales
/// in 32-bit integers and converted to float once; mins (Q4_K) and the `-32` offset (Q6_K) go
/// through the activation's integer per-16 sums. The float steps follow llama.cpp's x86 code
/// for the same type (repacked 8-row Q4_K, plain Q6_K), so results are bit-identical to it. A
/// super-block's scales and quants are decoded once for all `A` rows; each row's sums run in
/// the one-row order.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds whole super-blocks of `ty`; every activation row
/// covers them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_kquant_avx2<const A: usize>(
    ty: GgmlType,
    row: &[u8],
    far: bool,
    acts: [Act<'_>; A],
) -> [f32; A] {
    use std::arch::x86_64::*;
    let bb = ty.block_bytes();
    let mut acc = [_mm256_setzero_ps(); A];
    // Q4_K: the weighted sums and the min terms of each super-block are exact integers, scaled
    // and accumulated in f32 one super-block after the other (llama.cpp's repacked Q4_K order).
    let (mut acc_q4, mut acc_min) = ([0f32; A], [0f32; A]);
    let p = row.as_ptr();
    let halves = |a: i16, b: i16| _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
    for sb in 0..row.len() / bb {
        let blk = p.add(sb * bb);
        for line in (0..bb).step_by(64) {
            prefetch_ahead(blk.wrapping_add(PREFETCH + line), far);
        }
        let b = std::slice::from_raw_parts(blk, bb);
        if ty == GgmlType::Q4_K {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let dmin = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
            // Per pair of sub-blocks: (scale, min) of each and the two nibble halves.
            let parts: [_; 4] = std::array::from_fn(|j| {
                let (s1, m1) = rlx_gguf::k4_scale_min(2 * j, &b[4..16]);
                let (s2, m2) = rlx_gguf::k4_scale_min(2 * j + 1, &b[4..16]);
                let (lo, hi) = rlx_gguf::simd::split_nibbles(_mm256_loadu_si256(
                    blk.add(16 + 32 * j) as *const __m256i,
                ));
                (s1, m1, s2, m2, lo, hi)
            });
            for (i, &(qx, la, xs)) in acts.iter().enumerate() {
                let a = qx.as_ptr().add(sb * 256);
                // Integer sums of the 16 activation groups.
                let xs = &xs[sb * 16..sb * 16 + 16];
                let dx = *la.get_unchecked(sb * 64);
                let mut isum = _mm256_setzero_si256();
                let mut mins = 0i32;
                for (j, &(s1, m1, s2, m2, lo, hi)) in parts.iter().enumerate() {
                    let a_lo = _mm256_loadu_si256(a.add(64 * j) as *const __m256i);
                    let a_hi = _mm256_loadu_si256(a.add(64 * j + 32) as *const __m256i);
                    let p_lo = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(lo, a_lo),
                        _mm256_set1_epi16(s1 as i16),
                    );
                    let p_hi = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(hi, a_hi),
                        _mm256_set1_epi16(s2 as i16),
                    );
                    isum = _mm256_add_epi32(isum, _mm256_add_epi32(p_lo, p_hi));
                    mins += m1 as i32 * (xs[4 * j] + xs[4 * j + 1]) as i32
                        + m2 as i32 * (xs[4 * j + 2] + xs[4 * j + 3]) as i32;
                }
                let h = _mm_add_epi32(
                    _mm256_castsi256_si128(isum),
                    _mm256_extracti128_si256(isum, 1),
                );
                let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0b01_00_11_10));
                let total =
                    _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0b10_11_00_01)));
                acc_q4[i] = (total as f32).mul_add(d * dx, acc_q4[i]);
                acc_min[i] = (mins as f32).mul_add(dmin * dx, acc_min[i]);
            }
            continue;
        }
        let d = half::f16::from_le_bytes([b[208], b[209]]).to_f32();
        let sc = &b[192..208];
        let q = [
            rlx_gguf::simd::q6k_half(blk, 0),
            rlx_gguf::simd::q6k_half(blk, 1),
        ];
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        for (i, &(qx, la, xs)) in acts.iter().enumerate() {
            let a = qx.as_ptr().add(sb * 256);
            let xs = &xs[sb * 16..sb * 16 + 16];
            let dx = *la.get_unchecked(sb * 64);
            let mut isum = _mm256_setzero_si256();
            for (n, qn) in q.iter().enumerate() {
                for (kk, qk) in qn.iter().enumerate() {
                    let (sa, sbv) = (sc[n * 8 + 2 * kk] as i8, sc[n * 8 + 2 * kk + 1] as i8);
                    let ak = _mm256_loadu_si256(a.add(128 * n + 32 * kk) as *const __m256i);
                    let pk = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(*qk, ak),
                        halves(sa as i16, sbv as i16),
                    );
                    isum = _mm256_add_epi32(isum, pk);
                }
            }
            // The -32 offset of every weight, in integers: lane l takes 16-groups 2l and 2l + 1,
            // 32 * (sum_2l * scale_2l + sum_2l+1 * scale_2l+1).
            let s0 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr()));
            let s1 = _mm256_cvtps_epi32(_mm256_loadu_ps(xs.as_ptr().add(8)));
            let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(s0, s1));
            isum = _mm256_sub_epi32(
                isum,
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sums, scales)),
            );
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc[i]);
        }
    }
    std::array::from_fn(|i| {
        if ty == GgmlType::Q4_K {
            return acc_q4[i] - acc_min[i];
        }
        let s = _mm_add_ps(
            _mm256_castps256_ps128(acc[i]),
            _mm256_extractf128_ps(acc[i], 1),
        );
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_vnni<const F: u8, const A: usize>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    acts: [Act<'_>; A],
    out: &mut [[f32; ROWS]; A],
) {
    dot_rows::<F, { Vnni::Vex as u8 }, A>(rows, rb, n, far, acts, out)
}

/// [`dot_rows`] with the EVEX-encoded 256-bit `vpdpbusd` of AVX-512 VNNI + VL (CPUs such as
/// AMD Zen 4 that have it but not the VEX form).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_vnni512<const F: u8, const A: usize>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    acts: [Act<'_>; A],
    out: &mut [[f32; ROWS]; A],
) {
    dot_rows::<F, { Vnni::Evex as u8 }, A>(rows, rb, n, far, acts, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_avx2<const F: u8, const A: usize>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    acts: [Act<'_>; A],
    out: &mut [[f32; ROWS]; A],
) {
    dot_rows::<F, { Vnni::None as u8 }, A>(rows, rb, n, far, acts, out)
}

/// `u8 x i8 -> i32` dot products of 4-byte lanes in the `VNNI` form (the same integer sums
/// either way: exact, so any form gives identical results).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn lane_dots<const VNNI: u8>(
    q: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if VNNI == Vnni::Vex as u8 {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, a)
    } else if VNNI == Vnni::Evex as u8 {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1))
    }
}

/// The activation block's offset lanes of format `F`: 8 or 16 times its sum per 4-byte lane
/// (Q4_0, Q5_0), 128 times it for Q8_0 with VNNI, zero otherwise (see [`block_lanes`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn act_offset<const F: u8, const VNNI: u8>(
    a: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let sum = || lane_dots::<VNNI>(_mm256_set1_epi8(1), a);
    match F {
        0 => _mm256_slli_epi32(sum(), 3),
        2 => _mm256_slli_epi32(sum(), 4),
        4 if VNNI != Vnni::None as u8 => _mm256_slli_epi32(sum(), 7),
        _ => _mm256_setzero_si256(),
    }
}

/// The 32 weights of the format-`F` block at `blk`, decoded once for every activation row:
/// `(w, q)`, the signed bytes (Q8_0) and the unsigned quants the products take.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_quants<const F: u8>(
    blk: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    if F == 4 {
        let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        (w, _mm256_xor_si256(w, _mm256_set1_epi8(-128)))
    } else {
        let mut q = rlx_gguf::simd::nibbles32(blk.add([2, 4, 6, 8][F as usize]));
        if F == 2 || F == 3 {
            q = rlx_gguf::simd::with_fifth_bits(
                q,
                (blk.add(if F == 2 { 2 } else { 4 }) as *const i32).read_unaligned(),
            );
        }
        (q, q)
    }
}

/// The eight lane sums of a block's products with activation block `a` (offset lanes `a_off`
/// from [`act_offset`]), as the integers llama.cpp converts to float.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_lanes<const F: u8, const VNNI: u8>(
    w: std::arch::x86_64::__m256i,
    q: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
    a_off: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if F == 4 {
        if VNNI != Vnni::None as u8 {
            // `vpdpbusd` has no i16 saturation: take w + 128 (a u8, `q`) and subtract
            // 128 sum(a), exact for every weight byte, -128 included.
            _mm256_sub_epi32(lane_dots::<VNNI>(q, a), a_off)
        } else {
            // |w| and a * sign(w): a -128 weight is 128 as u8 (see `dot_avx2`).
            lane_dots::<VNNI>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
        }
    } else if F == 0 || F == 2 {
        // Q4_0 / Q5_0: the lane sums of the signed weights (q - 8, q - 16): sum(q a) - 8 sum(a).
        _mm256_sub_epi32(lane_dots::<VNNI>(q, a), a_off)
    } else {
        lane_dots::<VNNI>(q, a)
    }
}

/// The body of [`dot_packed_rows`] for format `F` (0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0)
/// and `A` activation rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows<const F: u8, const VNNI: u8, const A: usize>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    acts: [Act<'_>; A],
    out: &mut [[f32; ROWS]; A],
) {
    use std::arch::x86_64::*;
    const R: usize = ROWS;
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = rb / bb;
    let mut acc = [[_mm256_setzero_ps(); R]; A];
    let mut off = [[0f32; R]; A];
    // Rows past `n` repeat the last one (computed, never stored).
    let rp: [*const u8; R] = std::array::from_fn(|r| rows.add(r.min(n - 1) * rb));
    for b in 0..nb {
        let dx: [f32; A] = std::array::from_fn(|i| *acts[i].1.get_unchecked(8 * b));
        let sx: [f32; A] = std::array::from_fn(|i| {
            *acts[i].2.get_unchecked(2 * b) + *acts[i].2.get_unchecked(2 * b + 1)
        });
        let av: [__m256i; A] = std::array::from_fn(|i| {
            _mm256_loadu_si256(acts[i].0.as_ptr().add(b * 32) as *const __m256i)
        });
        let a_off: [__m256i; A] = std::array::from_fn(|i| act_offset::<F, VNNI>(av[i]));
        for r in 0..R {
            let blk = rp[r].add(b * bb);
            // Decoding streams weights faster than the hardware prefetcher fetches them: ask for
            // the bytes `PREFETCH` ahead (rows further down the matrix).
            // Prefetches never fault, and `wrapping_add` keeps the address computation defined.
            prefetch_ahead(blk.wrapping_add(PREFETCH), far);
            // d (and m) as f32 through F16C.
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
            let d = _mm_cvtss_f32(dm);
            let (w, q) = block_quants::<F>(blk);
            for i in 0..A {
                let p32 = block_lanes::<F, VNNI>(w, q, av[i], a_off[i]);
                acc[i][r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p32),
                    _mm256_set1_ps(d * dx[i]),
                    acc[i][r],
                );
                // Offset term m sx of Q4_1 and Q5_1.
                if F == 1 || F == 3 {
                    off[i][r] += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * sx[i];
                }
            }
        }
    }
    for i in 0..A {
        for r in 0..n {
            let v = acc[i][r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[i][r] = _mm_cvtss_f32(s) + off[i][r];
        }
    }
}

/// Bytes of one block of a packed group of [`ACTS`] activation rows (32-element block formats):
/// the four rows' 32 quants, then their four scales, then their four block sums.
#[cfg(target_arch = "x86_64")]
const GROUP_BLOCK: usize = ACTS * 32 + 2 * ACTS * 4;

/// Lay four quantized activation rows out block by block for [`dot_group`]: one stream read
/// front to back instead of twelve, the block sums `s0 + s1` added once here (as the per-row
/// kernel adds them).
///
/// # Safety
/// `dst` holds `nb * GROUP_BLOCK` bytes; each act row holds `nb` blocks.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_group(acts: &[Act<'_>; ACTS], nb: usize, dst: *mut u8) {
    for b in 0..nb {
        let blk = dst.add(b * GROUP_BLOCK);
        for (i, (qx, la, xs)) in acts.iter().enumerate() {
            std::ptr::copy_nonoverlapping(
                qx.as_ptr().add(b * 32) as *const u8,
                blk.add(32 * i),
                32,
            );
            let f = blk.add(ACTS * 32) as *mut f32;
            f.add(i).write_unaligned(la[8 * b]);
            f.add(ACTS + i).write_unaligned(xs[2 * b] + xs[2 * b + 1]);
        }
    }
}

/// [`dot_rows`] for a packed group of four activation rows ([`pack_group`]): the same float
/// steps per (weight row, activation row) in the same order (so the same results as the rows
/// taken one at a time), with the scale products `d dx` and offset terms `m sx` of the four
/// activation rows made four at a time and every activation read from one stream. Formats as
/// [`dot_rows`]: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot_group<const F: u8, const VNNI: u8>(
    rows: *const u8,
    rb: usize,
    n: usize,
    far: bool,
    pk: *const u8,
    out: &mut [[f32; ROWS]; ACTS],
) {
    use std::arch::x86_64::*;
    const R: usize = ROWS;
    const A: usize = ACTS;
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = rb / bb;
    let mut acc = [[_mm256_setzero_ps(); R]; A];
    // Offset terms m sx of weight row r in lane i (activation row) of `off[r]`.
    let mut off = [_mm_setzero_ps(); R];
    let rp: [*const u8; R] = std::array::from_fn(|r| rows.add(r.min(n - 1) * rb));
    // The scale products of the current block, read back as broadcasts.
    let mut scale = [0f32; R * A];
    for b in 0..nb {
        let blk = pk.add(b * GROUP_BLOCK);
        let av: [__m256i; A] =
            std::array::from_fn(|i| _mm256_loadu_si256(blk.add(32 * i) as *const __m256i));
        let dx = _mm_loadu_ps(blk.add(A * 32) as *const f32);
        let sx = _mm_loadu_ps(blk.add(A * 32 + 16) as *const f32);
        let a_off: [__m256i; A] = std::array::from_fn(|i| act_offset::<F, VNNI>(av[i]));
        for r in 0..R {
            let wb = rp[r].add(b * bb);
            prefetch_ahead(wb.wrapping_add(PREFETCH), far);
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((wb as *const i32).read_unaligned()));
            // d dx_i for the four activation rows: the products a scalar `d * dx` gives.
            _mm_storeu_ps(
                scale.as_mut_ptr().add(A * r),
                _mm_mul_ps(_mm_broadcastss_ps(dm), dx),
            );
            if F == 1 || F == 3 {
                // `off += m * sx`: product, then sum, each rounded as the scalar steps are.
                off[r] = _mm_add_ps(off[r], _mm_mul_ps(_mm_permute_ps::<0x55>(dm), sx));
            }
        }
        // Read back from memory (broadcast loads rather than shuffles).
        std::hint::black_box(&mut scale);
        for r in 0..R {
            let (w, q) = block_quants::<F>(rp[r].add(b * bb));
            for i in 0..A {
                let p32 = block_lanes::<F, VNNI>(w, q, av[i], a_off[i]);
                acc[i][r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(p32),
                    _mm256_broadcast_ss(&*scale.as_ptr().add(A * r + i)),
                    acc[i][r],
                );
            }
        }
    }
    for r in 0..n {
        let mut o = [0f32; A];
        _mm_storeu_ps(o.as_mut_ptr(), off[r]);
        for i in 0..A {
            let v = acc[i][r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[i][r] = _mm_cvtss_f32(s) + o[i];
        }
    }
}

/// [`dot_group`] for `ty`, dispatched on the VNNI form; false (nothing computed) when `ty` is
/// not a 32-element block format (see [`grouped`]).
///
/// # Safety
/// As [`dot_packed_rows`], with `pk` a group packed by [`pack_group`] for this `k`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_group_rows(
    ty: GgmlType,
    vnni: Vnni,
    far: bool,
    rows: *const u8,
    rb: usize,
    n: usize,
    pk: *const u8,
    out: &mut [[f32; ROWS]; ACTS],
) -> bool {
    // One instance per VNNI form, each compiled with the features it needs.
    macro_rules! form {
        ($name:ident, $features:literal, $vnni:expr) => {
            #[target_feature(enable = $features)]
            unsafe fn $name<const F: u8>(
                rows: *const u8,
                rb: usize,
                n: usize,
                far: bool,
                pk: *const u8,
                out: &mut [[f32; ROWS]; ACTS],
            ) {
                dot_group::<F, { $vnni as u8 }>(rows, rb, n, far, pk, out)
            }
        };
    }
    form!(vex, "avx2,fma,f16c,avxvnni", Vnni::Vex);
    form!(
        evex,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        Vnni::Evex
    );
    form!(plain, "avx2,fma,f16c", Vnni::None);
    macro_rules! go {
        ($f:literal) => {
            match vnni {
                Vnni::Vex => vex::<$f>(rows, rb, n, far, pk, out),
                Vnni::Evex => evex::<$f>(rows, rb, n, far, pk, out),
                Vnni::None => plain::<$f>(rows, rb, n, far, pk, out),
            }
        };
    }
    match ty {
        GgmlType::Q4_0 => go!(0),
        GgmlType::Q4_1 => go!(1),
        GgmlType::Q5_0 => go!(2),
        GgmlType::Q5_1 => go!(3),
        GgmlType::Q8_0 => go!(4),
        _ => return false,
    }
    true
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
    let mode = ActQuant::of(ty);
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
                            if take == ACTS
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
                                )
                            {
                                for (i, row) in res.iter().enumerate() {
                                    for j in n0..n1 {
                                        *op.add(out_index(&out, r0 + i, j, n)) = row[j - n0];
                                    }
                                }
                                r0 += ACTS;
                                continue;
                            }
                            let acts: [Act<'_>; ACTS] = if r0 == 0 {
                                first
                            } else {
                                std::array::from_fn(|i| {
                                    act_views(sp.get().add((r0 + i.min(take - 1)) * z.row()), k, &z)
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
        _ => unreachable!("dispatched by op"),
    }
}
