//! Quantized kernels against references: `DequantMatMul` for every GGUF scheme at every
//! instruction-set level the CPU can run equals llama.cpp's product (activations quantized as
//! its x86 code does, weights decoded by the reference decoder) within float rounding, and
//! `x @ dequantize(w)^T` for prompt-sized and float products; `DequantizeRows` is exact; the KV-cache
//! ops write in place and attend causally over the cache.

use rlx_cpu::compile;
use rlx_gguf::GgmlType;
use rlx_ir::{DType, Graph, QuantScheme, Shape};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Deterministic pseudo-random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Random blocks of `ty` with finite, modest scales (the f16/f32 scale fields overwritten).
fn random_rows(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let mut data = bytes(rows * k / be * bb, seed);
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for (i, b) in data.chunks_exact_mut(bb).enumerate() {
        let d = 0.01 + (i % 7) as f32 * 0.003;
        let scale_at: &[usize] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K => {
                &[0]
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            GgmlType::F16 | GgmlType::BF16 => &[],
            _ => &[],
        };
        for &o in scale_at {
            b[o..o + 2].copy_from_slice(&f16(if o == 2 { -d } else { d }));
        }
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            b[2..4].copy_from_slice(&f16(d * 0.5));
        }
        if ty == GgmlType::Q8_K {
            b[0..4].copy_from_slice(&(d * 0.1).to_le_bytes());
        }
        if ty == GgmlType::F16 {
            b.copy_from_slice(&f16(((i % 13) as f32 - 6.0) * 0.1));
        }
        if ty == GgmlType::BF16 {
            b.copy_from_slice(&half::bf16::from_f32(((i % 11) as f32 - 5.0) * 0.1).to_le_bytes());
        }
        // Int8 quants of -128 are outside what llama.cpp's quantizers write for weights (the
        // kernels, like llama.cpp's, rely on |q| <= 127).
        if ty == GgmlType::Q8_0 {
            for q in &mut b[2..] {
                *q = (*q as i8).max(-127) as u8;
            }
        }
        if ty == GgmlType::Q8_K {
            for q in &mut b[4..260] {
                *q = (*q as i8).max(-127) as u8;
            }
        }
    }
    data
}

const SCHEMES: &[(QuantScheme, GgmlType)] = &[
    (QuantScheme::GgufF16, GgmlType::F16),
    (QuantScheme::GgufBF16, GgmlType::BF16),
    (QuantScheme::GgufQ4_0, GgmlType::Q4_0),
    (QuantScheme::GgufQ4_1, GgmlType::Q4_1),
    (QuantScheme::GgufQ5_0, GgmlType::Q5_0),
    (QuantScheme::GgufQ5_1, GgmlType::Q5_1),
    (QuantScheme::GgufQ8_0, GgmlType::Q8_0),
    (QuantScheme::GgufQ2K, GgmlType::Q2_K),
    (QuantScheme::GgufQ3K, GgmlType::Q3_K),
    (QuantScheme::GgufQ4K, GgmlType::Q4_K),
    (QuantScheme::GgufQ5K, GgmlType::Q5_K),
    (QuantScheme::GgufQ6K, GgmlType::Q6_K),
    (QuantScheme::GgufQ8K, GgmlType::Q8_K),
];

#[test]
fn dequant_matmul_matches_the_reference_for_every_gguf_scheme_and_kernel_level() {
    use rlx_cpu::isa::{levels, with_level, Level};
    let mut outputs = Vec::new();
    for level in levels() {
        outputs.push((level, with_level(level, check_all_schemes)));
    }
    // The integer dot products are exact whichever instruction forms them (AVX2 `maddubs`, VNNI
    // in its VEX or EVEX encoding), and the float steps are shared: every SIMD level must give
    // the AVX2 level's results bit for bit.
    let avx2 = outputs
        .iter()
        .find(|(l, _)| *l == Level::Avx2)
        .map(|(_, o)| o.clone());
    for (level, out) in &outputs {
        if let (Some(a), true) = (&avx2, *level > Level::Avx2) {
            assert!(a == out, "the {level} kernels differ from the AVX2 ones");
        }
    }
}

#[test]
fn the_level_in_force_at_run_time_decides_the_kernels() {
    // Compiled at the best level, run at the portable one: the portable kernels' result (whose
    // float order differs from the packed-row SIMD kernels'), not the compiled-in level's.
    use rlx_cpu::isa::{with_level, Level};
    let (k, n, ty, scheme) = (512, 7, GgmlType::Q4_0, QuantScheme::GgufQ4_0);
    let w = random_rows(ty, n, k, 3);
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    let mut g = Graph::new("q");
    let xi = g.input("x", Shape::new(&[1, k], DType::F32));
    let wp = g.param("w", Shape::new(&[n, ty.row_bytes(k).unwrap()], DType::U8));
    let y = g.dequant_matmul(xi, wp, scheme);
    g.set_outputs(vec![y]);
    let run = |p: &mut rlx_cpu::Program| {
        p.write_param(0, &w);
        p.write_input(0, &f32_bytes(&x));
        p.execute();
        let mut out = vec![0u8; n * 4];
        p.read_output(0, &mut out);
        out
    };
    let mut best = compile(&g, 1).unwrap();
    let late = with_level(Level::Portable, || run(&mut best));
    let portable = with_level(Level::Portable, || run(&mut compile(&g, 1).unwrap()));
    assert_eq!(late, portable);
}

/// Activations quantized as llama.cpp's x86 code does for a weight type's `vec_dot_type`
/// (written here from its definition, independently of the kernels): each element's integer
/// quant and scale, and for `Q8_1` each 32-block's stored sum.
struct ActQ {
    q: Vec<i32>,
    /// Scale of each element's block.
    d: Vec<f64>,
    /// `Q8_1`'s per-block `s = f16(d * sum(q))` (empty for the other forms).
    s: Vec<f64>,
}

fn f16r(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// llama.cpp's activation quantization for a weight type: `Q8_0` (blocks of 32, `d = amax / 127`
/// rounded to f16, `q = round_even(x * 127 / amax)`), `Q8_1` (the same plus `s`), `Q8_K` (blocks
/// of 256, `iscale = -127 / signed max`, `q = min(127, round_even(iscale * x))`, `d = 1 / iscale`).
fn quantize_like_llama_cpp(ty: GgmlType, x: &[f32]) -> ActQ {
    let mut a = ActQ {
        q: vec![0; x.len()],
        d: vec![0.0; x.len()],
        s: Vec::new(),
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_1 | GgmlType::Q5_1 => {
            for (b, blk) in x.chunks(32).enumerate() {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                let mut sum = 0;
                for (i, v) in blk.iter().enumerate() {
                    let q = (v * id).round_ties_even() as i32;
                    a.q[b * 32 + i] = q;
                    a.d[b * 32 + i] = f16r(d) as f64;
                    sum += q;
                }
                a.s.push(f16r(d * sum as f32) as f64);
            }
            if !matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                a.s.clear();
            }
        }
        _ => {
            for (b, blk) in x.chunks(256).enumerate() {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in blk {
                    if v.abs() > amax {
                        (amax, max) = (v.abs(), v);
                    }
                }
                if amax == 0.0 {
                    continue;
                }
                let iscale = -127.0 / max;
                for (i, v) in blk.iter().enumerate() {
                    a.q[b * 256 + i] = ((iscale * v).round_ties_even() as i32).min(127);
                    a.d[b * 256 + i] = (1.0 / iscale) as f64;
                }
            }
        }
    }
    a
}

/// The value llama.cpp's `vec_dot` of a weight row (decoded by the reference decoder: `w`, and
/// the `Q4_1`/`Q5_1` block mins `mins`) with a quantized activation row has in exact
/// arithmetic, and the sum of the magnitudes of its terms (which bounds its float rounding).
fn reference_dot(w: &[f32], mins: &[f64], a: &ActQ) -> (f64, f64) {
    let (mut v, mut mag) = (0f64, 0f64);
    for (i, &wi) in w.iter().enumerate() {
        // `Q8_1` weights: the min's share goes through the block's stored sum `s` instead.
        let wi = wi as f64 - if a.s.is_empty() { 0.0 } else { mins[i / 32] };
        let t = wi * a.d[i] * a.q[i] as f64;
        v += t;
        mag += t.abs();
    }
    for (b, s) in a.s.iter().enumerate() {
        v += mins[b] * s;
        mag += (mins[b] * s).abs();
    }
    (v, mag)
}

/// The `Q4_1`/`Q5_1` block mins of a row (the f16 at byte 2 of every 32-element block).
fn block_mins(ty: GgmlType, row: &[u8]) -> Vec<f64> {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => row
            .chunks(ty.block_bytes())
            .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f64())
            .collect(),
        _ => Vec::new(),
    }
}

/// Bound on the float rounding of the products, in units of f32 epsilon times the sum of term
/// magnitudes: the integer parts are exact and the remaining float steps (scales, block sums,
/// lane and thread reductions) number far fewer than 32 per term chain. A 0.1% error in any
/// product exceeds it (shown by scaling the kernels' outputs by 1.001, which fails this test).
const ULPS: f64 = 32.0;

/// Checks every scheme against the reference; returns every product's output bits, in order.
fn check_all_schemes() -> Vec<u32> {
    let mut all = Vec::new();
    let k = 512;
    let eps = f32::EPSILON as f64 / 2.0;
    for &(scheme, ty) in SCHEMES {
        // Up to 7 rows take the int8 dot products (1, 3: several rows of one weight group);
        // 9 and 130 rows take the dequantize-then-GEMM path of prompt-sized products; 150
        // output columns span several weight panels (and threads).
        for (m, n) in [
            (1usize, 7usize),
            (3, 7),
            (9, 7),
            (130, 7),
            (9, 150),
            (2, 150),
        ] {
            let w = random_rows(ty, n, k, 7 + m as u64);
            let x: Vec<f32> = (0..m * k)
                .map(|i| (((i * 37 + m) % 101) as f32 - 50.0) / 40.0 * (1.0 + (i % 7) as f32 * 0.1))
                .collect();
            let mut g = Graph::new("q");
            let xi = g.input("x", Shape::new(&[m, k], DType::F32));
            let row_bytes = ty.row_bytes(k).unwrap();
            let wp = g.param("w", Shape::new(&[n, row_bytes], DType::U8));
            let y = g.dequant_matmul(xi, wp, scheme);
            let d = g.dequantize_rows(wp, scheme);
            g.set_outputs(vec![y, d]);
            let mut reference = vec![0f32; n * k];
            rlx_gguf::dequantize(ty, &w, &mut reference).unwrap();
            let float = matches!(ty, GgmlType::F16 | GgmlType::BF16);
            let int8 = !float && m < rlx_cpu::kernels::quant::GEMM_MIN_M;
            for threads in [1, 2] {
                let mut p = compile(&g, threads).unwrap();
                p.write_param(0, &w);
                p.write_input(0, &f32_bytes(&x));
                p.execute();
                let mut out = vec![0u8; m * n * 4];
                p.read_output(0, &mut out);
                let got = to_f32(&out);
                all.extend(got.iter().map(|v| v.to_bits()));
                let mut dq = vec![0u8; n * k * 4];
                p.read_output(1, &mut dq);
                assert_eq!(
                    to_f32(&dq),
                    reference,
                    "{ty}: DequantizeRows differs from the reference decoder"
                );
                for r in 0..m {
                    let xr = &x[r * k..(r + 1) * k];
                    // Int8 products quantize the activations as llama.cpp does; float weights
                    // and prompt products (f32 GEMM over decoded rows) use them as they are.
                    let act = if int8 {
                        quantize_like_llama_cpp(ty, xr)
                    } else {
                        ActQ {
                            q: Vec::new(),
                            d: Vec::new(),
                            s: Vec::new(),
                        }
                    };
                    for j in 0..n {
                        let wr = &reference[j * k..(j + 1) * k];
                        let (want, mag) = if int8 {
                            reference_dot(
                                wr,
                                &block_mins(ty, &w[j * row_bytes..(j + 1) * row_bytes]),
                                &act,
                            )
                        } else {
                            wr.iter().zip(xr).fold((0f64, 0f64), |(v, m), (&a, &b)| {
                                (v + a as f64 * b as f64, m + (a as f64 * b as f64).abs())
                            })
                        };
                        let err = (got[r * n + j] as f64 - want).abs();
                        let path = if int8 { "int8 dot" } else { "f32" };
                        assert!(
                            err <= ULPS * eps * mag,
                            "{ty} {path} m={m} t={threads} [{r},{j}]: {} vs {want} (error {:.2} eps of the term magnitudes {mag})",
                            got[r * n + j],
                            err / (eps * mag)
                        );
                    }
                }
            }
        }
    }
    all
}

#[test]
fn cache_write_updates_the_param_in_place_and_attention_reads_only_the_prefix() {
    rlx_cpu::isa::for_each_level(|_| {
        // Cache of 6 rows, 1 head of size 2; write 2 rows at position 3, attend with 2 queries.
        let mut g = Graph::new("kv");
        let kc = g.param("k", Shape::new(&[6, 1, 2], DType::F32));
        let vc = g.param("v", Shape::new(&[6, 1, 2], DType::F32));
        let knew = g.input("kn", Shape::new(&[2, 1, 2], DType::F32));
        let vnew = g.input("vn", Shape::new(&[2, 1, 2], DType::F32));
        let q = g.input("q", Shape::new(&[2, 1, 2], DType::F32));
        let pos = g.input("pos", Shape::new(&[1], DType::I32));
        let k2 = g.cache_write(kc, knew, pos);
        let v2 = g.cache_write(vc, vnew, pos);
        let a = g.cached_attention(q, k2, v2, pos, 1.0, None);
        g.set_outputs(vec![a]);
        let mut p = compile(&g, 2).unwrap();
        let kv: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
        p.write_param(0, &f32_bytes(&kv));
        p.write_param(
            1,
            &f32_bytes(&kv.iter().map(|v| v * 10.0).collect::<Vec<_>>()),
        );
        p.write_input(0, &f32_bytes(&[1.0, 1.0, 2.0, 2.0]));
        p.write_input(1, &f32_bytes(&[10.0, 10.0, 20.0, 20.0]));
        p.write_input(2, &f32_bytes(&[0.5, -0.5, 1.0, 0.0]));
        p.write_input(3, &3i32.to_le_bytes());
        p.execute();
        let mut kb = vec![0u8; 48];
        p.read_param(0, &mut kb);
        let k = to_f32(&kb);
        assert_eq!(
            &k[6..10],
            &[1.0, 1.0, 2.0, 2.0],
            "rows 3 and 4 written in place"
        );
        assert_eq!(k[10], kv[10], "row 5 untouched");
        // Reference: query i at position 3 + i attends to rows 0..=3+i.
        let mut vcache: Vec<f32> = kv.iter().map(|v| v * 10.0).collect();
        vcache[6..10].copy_from_slice(&[10.0, 10.0, 20.0, 20.0]);
        let qs = [[0.5f32, -0.5], [1.0, 0.0]];
        let mut out = vec![0u8; 16];
        p.read_output(0, &mut out);
        let got = to_f32(&out);
        for (i, q) in qs.iter().enumerate() {
            let last = 3 + i;
            let s: Vec<f32> = (0..=last)
                .map(|j| q[0] * k[2 * j] + q[1] * k[2 * j + 1])
                .collect();
            let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f32 = e.iter().sum();
            for d in 0..2 {
                let want: f32 = (0..=last).map(|j| e[j] / z * vcache[2 * j + d]).sum();
                assert!(
                    (got[2 * i + d] - want).abs() < 1e-5,
                    "query {i} dim {d}: {} vs {want}",
                    got[2 * i + d]
                );
            }
        }
    });
}

/// Reference causal attention of `s` queries at positions `pos..pos+s` over `k`, `v`
/// (`[t, hkv, d]`), with an optional sliding window.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    pos: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let mut out = vec![0f32; s * hq * d];
    for i in 0..s {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let last = pos + i;
            let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
            let sc: Vec<f32> = (first..=last)
                .map(|j| {
                    (0..d)
                        .map(|e| q[(i * hq + h) * d + e] * k[(j * hkv + kh) * d + e])
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let m = sc.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = sc.iter().map(|x| (x - m).exp()).sum();
            for e in 0..d {
                out[(i * hq + h) * d + e] = (first..=last)
                    .map(|j| (sc[j - first] - m).exp() / z * v[(j * hkv + kh) * d + e])
                    .sum();
            }
        }
    }
    out
}

#[test]
fn cached_attention_per_query_and_blocked_paths_match_the_reference() {
    rlx_cpu::isa::for_each_level(|_| {
        let (t, hq, hkv) = (160, 4, 2);
        // 3 queries take the per-query path, 70 the blocked GEMM path (two blocks of queries). The
        // per-query path sums in lanes of 64 positions and 64 head elements: cover ranges inside one
        // lane block, across blocks, windows across a block edge, and head sizes past 64.
        for (s, window, pos, d) in [
            (3usize, None, 7, 8),
            (70, None, 7, 8),
            (70, Some(5), 7, 8),
            (3, Some(4), 7, 8),
            (3, None, 80, 72),
            (3, Some(5), 62, 8),
            (1, Some(3), 70, 136),
            (2, None, 130, 64),
        ] {
            // An f16 cache (as the LLMs keep it) goes through the f16 loads and the f16 rounding of
            // the probabilities; the reference reads the same f16 values.
            for cache in [DType::F32, DType::F16] {
                check_cached_attention(t, hq, hkv, s, window, pos, d, cache);
            }
        }
    });
}

/// Decode attention takes the query heads of one key head together where the CPU has AVX-512
/// (two or three at a time): every head's output is bit for bit the one the head-by-head kernel
/// of the AVX2 levels gives, for groups of 2, 3 and 4 (three and one) heads, f16 and f32
/// caches, head sizes of 64, 72 and 256, windows and positions inside one lane block.
#[test]
fn grouped_decode_heads_give_each_heads_own_bits_at_every_level() {
    use rlx_cpu::isa::{levels, with_level};
    for (hq, hkv, d, s, pos, window) in [
        (6usize, 2usize, 64usize, 2usize, 130usize, None),
        (8, 2, 72, 3, 40, Some(20)),
        (4, 2, 256, 1, 90, None),
        (3, 1, 64, 2, 5, None),
    ] {
        for cache in [DType::F32, DType::F16] {
            let t = 160;
            let mut outs = Vec::new();
            // The portable level's exponential takes other float steps (no FMA).
            for level in levels().filter(|l| *l >= rlx_cpu::isa::Level::Avx2) {
                let got = with_level(level, || {
                    run_cached_attention(t, hq, hkv, s, window, pos, d, cache, 0.125).0
                });
                outs.push((level, got));
            }
            let (first, want) = &outs[0];
            for (level, got) in &outs[1..] {
                assert!(
                    got == want,
                    "{hq} heads over {hkv}, d={d}, {cache} cache: {level} differs from {first}"
                );
            }
        }
    }
}

/// A compiled `cached_attention` of `s` queries at `pos` over a `t`-row cache of `cache` type,
/// run on fixed values: its output bits and the (q, k, v) values it read (k and v as the cache
/// holds them).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn run_cached_attention(
    t: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    window: Option<usize>,
    pos: usize,
    d: usize,
    cache: DType,
    scale: f32,
) -> (Vec<u8>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut g = Graph::new("attn");
    let q = g.input("q", Shape::new(&[s, hq, d], DType::F32));
    let kc = g.param("k", Shape::new(&[t, hkv, d], cache));
    let vc = g.param("v", Shape::new(&[t, hkv, d], cache));
    let p = g.input("pos", Shape::new(&[1], DType::I32));
    let a = g.cached_attention(q, kc, vc, p, scale, window);
    g.set_outputs(vec![a]);
    let mut prog = compile(&g, 2).unwrap();
    let val = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919 % 1013) as f32 / 1013.0 - 0.5) * 2.0)
            .collect()
    };
    let (qv, mut kv, mut vv) = (val(s * hq * d, 1), val(t * hkv * d, 2), val(t * hkv * d, 3));
    let f16 = cache == DType::F16;
    if f16 {
        kv.iter_mut()
            .chain(vv.iter_mut())
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
    }
    let bytes = |v: &[f32]| {
        if f16 {
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect()
        } else {
            f32_bytes(v)
        }
    };
    prog.write_input(0, &f32_bytes(&qv));
    prog.write_input(1, &(pos as i32).to_le_bytes());
    prog.write_param(0, &bytes(&kv));
    prog.write_param(1, &bytes(&vv));
    prog.execute();
    let mut out = vec![0u8; s * hq * d * 4];
    prog.read_output(0, &mut out);
    (out, qv, kv, vv)
}

#[allow(clippy::too_many_arguments)]
fn check_cached_attention(
    t: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    window: Option<usize>,
    pos: usize,
    d: usize,
    cache: DType,
) {
    let (out, qv, kv, vv) = run_cached_attention(t, hq, hkv, s, window, pos, d, cache, 0.3);
    let tol = if cache == DType::F16 { 2e-3 } else { 1e-4 };
    let got = to_f32(&out);
    let want = attention_reference(&qv, &kv, &vv, s, hq, hkv, d, pos, 0.3, window);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() < tol,
            "{cache} cache, s={s} window={window:?} element {i}: {a} vs {b}"
        );
    }
}

/// Decode-shaped products (`x [M, 1, K]`, M one-row products as serving batches them): every
/// row's results are bit for bit those of the row alone, for every block format, at every SIMD
/// level, whether the row goes through a group of four activation rows or the per-row kernel
/// (M from 1 to 9 takes both, and groups with a partial last weight-row group: N = 7).
#[test]
fn rows_batched_together_equal_each_row_alone() {
    use rlx_cpu::isa::{levels, with_level};
    let (k, n) = (256, 7);
    let formats = [
        (QuantScheme::GgufQ4_0, GgmlType::Q4_0),
        (QuantScheme::GgufQ4_1, GgmlType::Q4_1),
        (QuantScheme::GgufQ5_0, GgmlType::Q5_0),
        (QuantScheme::GgufQ5_1, GgmlType::Q5_1),
        (QuantScheme::GgufQ8_0, GgmlType::Q8_0),
        (QuantScheme::GgufQ4K, GgmlType::Q4_K),
        (QuantScheme::GgufQ6K, GgmlType::Q6_K),
    ];
    let product = |scheme: QuantScheme, w: &[u8], rb: usize, x: &[f32], m: usize| {
        let mut g = Graph::new("rows");
        let xi = g.input("x", Shape::new(&[m, 1, k], DType::F32));
        let wp = g.param("w", Shape::new(&[n, rb], DType::U8));
        let y = g.dequant_matmul(xi, wp, scheme);
        g.set_outputs(vec![y]);
        let mut p = compile(&g, 2).unwrap();
        p.write_param(0, w);
        p.write_input(0, &f32_bytes(x));
        p.execute();
        let mut out = vec![0u8; m * n * 4];
        p.read_output(0, &mut out);
        out
    };
    for level in levels() {
        with_level(level, || {
            for (seed, &(scheme, ty)) in formats.iter().enumerate() {
                let rb = ty.row_bytes(k).unwrap();
                let w = random_rows(ty, n, k, 11 + seed as u64);
                for m in 1..=9 {
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 131 + seed * 7) % 211) as f32 / 53.0 - 2.0)
                        .collect();
                    let together = product(scheme, &w, rb, &x, m);
                    for r in 0..m {
                        let alone = product(scheme, &w, rb, &x[r * k..(r + 1) * k], 1);
                        assert!(
                            together[r * n * 4..(r + 1) * n * 4] == alone[..],
                            "{ty} at {level}: row {r} of {m} differs from the row alone"
                        );
                    }
                }
            }
        });
    }
}
