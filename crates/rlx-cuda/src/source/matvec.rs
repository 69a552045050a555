//! The quantized matrix-vector product of decode steps: the word-load decoders of the common
//! GGUF block types, the staging (rounding, RMSNorm, residual add) of its activations in shared
//! memory, and the kernel.

use super::*;

/// Words of the quantized matrix-vector product: `[rows, k, n, x, w, row_bytes, out, round,
/// sums, gamma, eps_bits, x2, sum]`: `round`, the activation block a staged kernel rounds `x`
/// to (0 for none); `sums`, where an unstaged kernel finds the rounded activations' block sums
/// ([`quantize_acts`]; 0 for none); `gamma` and `eps_bits`, the RMSNorm a kernel with `norm`
/// applies to `x` first; `x2` and `sum`, with `add`, the second operand of the residual add
/// that `x` is the first of, and where the add's result goes (0 otherwise).
pub const DEQUANT_MATVEC_WORDS: usize = 13;

/// Whether an RMSNorm (f32) can be taken into a staged matrix-vector product of `scheme`
/// ([`dequant_matvec`]'s `norm`): for the block types whose activations round to blocks of 32,
/// or do not round.
pub fn norm_fuses(scheme: rlx_ir::QuantScheme) -> bool {
    scheme.act_block(1) != Some(256)
}

/// Warps of the matrix-vector product's blocks.
pub const MATVEC_WARPS: usize = 8;

/// Activations (`rows * k` f32) a staged matrix-vector product holds in shared memory.
pub const MATVEC_STAGE: usize = 8192;

/// Blocks of a staged matrix-vector product at most (each stages the activations once, then
/// strides over the columns): about as many as an H100/H200 holds at once with the stage's
/// 33 KB of shared memory a block (six on each of 132 multiprocessors).
pub const MATVEC_GRID: u32 = 792;

/// CUDA C `grp(row, s, w, &e0, &e1)` for the block types whose blocks split into groups of
/// eight weights readable by a few word loads: the weights of group `s / 8` of the row (`s` a
/// multiple of 8), as four elements from `e0` and four from `e1` (offsets inside the block),
/// each weight computed by the same expression as [`gguf_decoder`]'s `deq` (so the same
/// value), and `GBLK`, the block's element count. `None` for the block types read element by
/// element.
pub fn group_decoder(scheme: rlx_ir::QuantScheme) -> Option<&'static str> {
    use rlx_ir::QuantScheme::*;
    Some(match scheme {
        GgufQ4_0 => {
            r#"#define GMIN 0
#define GBLK 32u
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 32u) * 18u; const u32 g = (s % 32u) / 8u;
    const float d = f16at(b); const u32 q = ld32h(b + 2u + 4u * g);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) { w[i] = ((float)((q >> (8u * i)) & 0xfu) - 8.0f) * d; w[4u + i] = ((float)((q >> (8u * i + 4u)) & 0xfu) - 8.0f) * d; }
    *e0 = 4u * g; *e1 = 16u + 4u * g; *gm = 0.0f;
}"#
        }
        GgufQ4_1 => {
            r#"#define GBLK 32u
#define GMIN 1
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 32u) * 20u; const u32 g = (s % 32u) / 8u;
    const float d = f16at(b); const u32 q = ld32w(b + 4u + 4u * g);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) { w[i] = (float)((q >> (8u * i)) & 0xfu) * d; w[4u + i] = (float)((q >> (8u * i + 4u)) & 0xfu) * d; }
    *e0 = 4u * g; *e1 = 16u + 4u * g; *gm = f16at(b + 2);
}"#
        }
        GgufQ5_0 => {
            r#"#define GMIN 0
#define GBLK 32u
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 32u) * 22u; const u32 g = (s % 32u) / 8u;
    const float d = f16at(b); const u32 h = ld32h(b + 2u), q = ld32h(b + 6u + 4u * g);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        const u32 j = 4u * g + i;
        w[i] = ((float)(((q >> (8u * i)) & 0xfu) | (((h >> j) & 1u) << 4)) - 16.0f) * d;
        w[4u + i] = ((float)(((q >> (8u * i + 4u)) & 0xfu) | (((h >> (j + 16u)) & 1u) << 4)) - 16.0f) * d;
    }
    *e0 = 4u * g; *e1 = 16u + 4u * g; *gm = 0.0f;
}"#
        }
        GgufQ5_1 => {
            r#"#define GBLK 32u
#define GMIN 1
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 32u) * 24u; const u32 g = (s % 32u) / 8u;
    const float d = f16at(b); const u32 h = ld32w(b + 4u), q = ld32w(b + 8u + 4u * g);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        const u32 j = 4u * g + i;
        w[i] = (float)(((q >> (8u * i)) & 0xfu) | (((h >> j) & 1u) << 4)) * d;
        w[4u + i] = (float)(((q >> (8u * i + 4u)) & 0xfu) | (((h >> (j + 16u)) & 1u) << 4)) * d;
    }
    *e0 = 4u * g; *e1 = 16u + 4u * g; *gm = f16at(b + 2);
}"#
        }
        GgufQ8_0 => {
            r#"#define GMIN 0
#define GBLK 32u
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 32u) * 34u; const u32 g = (s % 32u) / 8u;
    const float d = f16at(b); const u32 qa = ld32h(b + 2u + 8u * g), qb = ld32h(b + 6u + 8u * g);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) { w[i] = (float)(signed char)(qa >> (8u * i)) * d; w[4u + i] = (float)(signed char)(qb >> (8u * i)) * d; }
    *e0 = 8u * g; *e1 = 8u * g + 4u; *gm = 0.0f;
}"#
        }
        GgufQ4K => {
            r#"#define GMIN 0
#define GBLK 256u
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 256u) * 144u; const u32 g = (s % 256u) / 8u, c = g / 8u, t = g % 8u;
    const float d = f16at(b), dm = f16at(b + 2); const u32 q = ld32w(b + 16u + c * 32u + 4u * t);
    u32 sa, ma, sb, mb; scmin(b + 4, 2u * c, &sa, &ma); scmin(b + 4, 2u * c + 1u, &sb, &mb);
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        w[i] = d * (float)sa * (float)((q >> (8u * i)) & 0xfu) - dm * (float)ma;
        w[4u + i] = d * (float)sb * (float)((q >> (8u * i + 4u)) & 0xfu) - dm * (float)mb;
    }
    *e0 = 64u * c + 4u * t; *e1 = 64u * c + 32u + 4u * t; *gm = 0.0f;
}"#
        }
        GgufQ6K => {
            r#"#define GMIN 0
#define GBLK 256u
__device__ __forceinline__ void grp(const unsigned char* row, u32 s, float* w, u32* e0, u32* e1, float* gm) {
    const unsigned char* b = row + (s / 256u) * 210u; const u32 g = (s % 256u) / 8u, h = g / 16u, qa = (g % 16u) / 8u, t = g % 8u;
    const float d = f16at(b + 208); const u32 ql = ld32h(b + h * 64u + qa * 32u + 4u * t), qh = ld32h(b + 128u + h * 32u + 4u * t);
    const int sa = (int)(signed char)b[192u + h * 8u + t / 4u + 2u * qa], sb = (int)(signed char)b[192u + h * 8u + t / 4u + 2u * (qa + 2u)];
    #pragma unroll
    for (u32 i = 0; i < 4u; ++i) {
        const u32 l = (ql >> (8u * i)) & 0xffu, hb = (qh >> (8u * i)) & 0xffu;
        w[i] = d * (float)sa * (float)((int)((l & 0xfu) | (((hb >> (2u * qa)) & 3u) << 4)) - 32);
        w[4u + i] = d * (float)sb * (float)((int)((l >> 4) | (((hb >> (2u * qa + 4u)) & 3u) << 4)) - 32);
    }
    *e0 = h * 128u + qa * 32u + 4u * t; *e1 = h * 128u + (qa + 2u) * 32u + 4u * t; *gm = 0.0f;
}"#
        }
        _ => return None,
    })
}

/// Word loads of the group decoders: `ld32w` at a 4-byte boundary (block types whose blocks
/// are a whole number of words), `ld32h` at a 2-byte one.
const WORDS: &str = r#"__device__ __forceinline__ u32 ld32w(const unsigned char* p) { return *(const u32*)p; }
__device__ __forceinline__ u32 ld32h(const unsigned char* p) { const u16* h = (const u16*)p; return (u32)h[0] | ((u32)h[1] << 16); }
"#;

/// The staging of a matrix-vector product's activations in shared memory: the warps take
/// activation blocks of `blk` (32: eight lanes a block, four elements a lane; 256: a warp a
/// block; the words' `round` says whether to round them) and write them as [`quantize_acts`]
/// rounds them: the block's largest magnitude (and for 256, the first element that has it)
/// found across its lanes; with `sums`, also each 32-block's `Q8_1` sum.
fn stage_acts(blk: usize, sums: bool, norm: bool, add: bool) -> String {
    let round = match blk {
        32 => {
            r#"        for (i64 b0 = 4 * warp; b0 < rows * k / 32; b0 += 4 * MATVEC_WARPS) {
            const i64 b = b0 + lane / 8, at = b * 32 + 4 * (lane % 8);
            const bool live = b < rows * k / 32;
            float v[4], amax = 0.0f;
            #pragma unroll
            for (int i = 0; i < 4; ++i) { v[i] = live ? XSRC[at + i] : 0.0f; amax = fmaxf(amax, fabsf(v[i])); }
            for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float d = r16(amax / 127.0f);
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            float qs = 0.0f;
            #pragma unroll
            for (int i = 0; i < 4; ++i) { const float q = rintf(v[i] * id); if (live) xs[at + i] = d * q; qs += q; }
SUMS        }
"#
        }
        _ => {
            r#"        for (i64 b = warp; b < rows * k / 256; b += MATVEC_WARPS) {
            float v[8], amax = 0.0f;
            #pragma unroll
            for (int i = 0; i < 8; ++i) { v[i] = xg[b * 256 + lane + 32 * i]; amax = fmaxf(amax, fabsf(v[i])); }
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            int at = 256;
            #pragma unroll
            for (int i = 7; i >= 0; --i) if (fabsf(v[i]) == amax) at = lane + 32 * i;
            for (int o = 16; o > 0; o >>= 1) { const int u = __shfl_xor_sync(0xffffffffu, at, o); at = u < at ? u : at; }
            if (amax == 0.0f) {
                #pragma unroll
                for (int i = 0; i < 8; ++i) xs[b * 256 + lane + 32 * i] = 0.0f;
                continue;
            }
            const float iscale = -127.0f / xg[b * 256 + at];
            const float d = 1.0f / iscale;
            #pragma unroll
            for (int i = 0; i < 8; ++i) xs[b * 256 + lane + 32 * i] = d * fminf(rintf(iscale * v[i]), 127.0f);
        }
"#
        }
    };
    let sums = if sums {
        "            for (int o = 1; o < 8; o <<= 1) qs += __shfl_xor_sync(0xffffffffu, qs, o);\n            if (live && lane % 8 == 0) ssh[b] = r16(amax / 127.0f * qs);\n"
    } else {
        ""
    };
    // RMSNorm first (into `xs`, as `norm` computes it), then rounded there in place: each
    // element is read and written by the same thread.
    // With `add`, the norm's operand is the sum of two (a residual add): block 0 also writes it.
    let (xe, keep) = if add {
        (
            "(xg[r * k + e] + ((const float*)m.w[11])[r * k + e])",
            " if (blockIdx.x == 0) ((float*)m.w[12])[r * k + e] = c;",
        )
    } else {
        ("xg[r * k + e]", "")
    };
    let (first, src, copy) = if norm {
        (
            format!(
                r#"    __shared__ float red[{MATVEC_WARPS}];
    for (int r = 0; r < (int)rows; ++r) {{
        float v = 0.0f;
        for (i64 e = threadIdx.x; e < k; e += blockDim.x) {{ const float c = {xe};{keep} v += c * c; }}
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp] = v;
        __syncthreads();
        float tot = 0.0f;
        #pragma unroll
        for (int w = 0; w < {MATVEC_WARPS}; ++w) tot += red[w];
        __syncthreads();
        const float inv = 1.0f / sqrtf(tot / (float)k + __int_as_float((int)m.w[10]));
        for (i64 e = threadIdx.x; e < k; e += blockDim.x) xs[r * k + e] = ({xe} - 0.0f) * inv * ((const float*)m.w[9])[e];
    }}
    __syncthreads();
"#
            ),
            "xs",
            "",
        )
    } else {
        (
            String::new(),
            "xg",
            "        for (i64 e = threadIdx.x; e < rows * k; e += blockDim.x) xs[e] = xg[e];\n",
        )
    };
    format!(
        r#"    __shared__ float xs[{MATVEC_STAGE}], ssh[{MATVEC_STAGE} / 32];
    const bool has_sums = m.w[7] == 32;
    const float* sums = ssh;
{first}    if (m.w[7] == {blk}) {{
{round}    }} else {{
{copy}    }}
    __syncthreads();
"#
    )
    .replace("MATVEC_WARPS", &MATVEC_WARPS.to_string())
    .replace("SUMS", sums)
    .replace("XSRC", src)
}

/// Warps per result column of the matrix-vector product ([`dequant_matvec`]) for `n` columns
/// of `k` elements: one where the columns alone fill the GPU (the output head), else enough
/// that each lane has a few loads in flight: chunks of 256 elements (eight a lane) for the
/// block types with a [`group_decoder`], of 32 for the others.
pub fn matvec_split(scheme: rlx_ir::QuantScheme, k: usize, n: usize) -> usize {
    if n >= 4096 {
        return 1;
    }
    let chunk = if group_decoder(scheme).is_some() {
        256
    } else {
        32
    };
    k.div_ceil(2 * chunk)
        .next_power_of_two()
        .clamp(1, MATVEC_WARPS)
}

/// `x [R, K] (f32) @ decode(w)^T` for a few rows (`R <= QROWS`: decode), reading each packed
/// weight once for all rows: `split` warps per result column (1, 2, 4 or 8; a block of
/// [`MATVEC_WARPS`] warps takes `8 / split` columns), each warp taking every `split`-th chunk of
/// the row: for the block types with a [`group_decoder`], 256 elements a chunk, each lane eight
/// weights from one or two word loads; for the others 32, a lane per element. So each load of
/// a warp reads one stretch of the row and a column's loads are in flight together; each
/// warp's sum by shuffles, a column's warps' sums added in warp order through shared memory.
///
/// `staged`: the block first copies `x` (at most [`MATVEC_STAGE`] values) into shared memory,
/// rounding it to the scheme's activation blocks as [`quantize_acts`] does when the `round`
/// word asks, so a decode product is one launch. Unstaged, activations the scheme rounds come
/// rounded by a [`quantize_acts`] launch before. `norm` (staged): `x` is an RMSNorm's operand,
/// normalized in shared memory first (as [`norm`] computes it, f32 `gamma`), so the norm takes
/// no launch of its own. `add` (with `norm`): the norm's operand is the sum of `x` and `x2` (a
/// residual add), which block 0 also writes to `sum`, so the add takes no launch either.
pub fn dequant_matvec(
    scheme: rlx_ir::QuantScheme,
    out: DType,
    split: usize,
    staged: bool,
    norm: bool,
    add: bool,
) -> Option<String> {
    if !real(out)
        || out == DType::F64
        || !matches!(split, 1 | 2 | 4 | 8)
        || (norm && !norm_fuses(scheme))
        || (add && !norm)
    {
        return None;
    }
    let dec = gguf_decoder(scheme)?;
    let st = storage(out)?;
    let val = store(out, &fit(out, "s".into()));
    let cols = MATVEC_WARPS / split;
    let staged = staged || norm;
    let (stage, xv) = if staged {
        use rlx_ir::QuantScheme::{GgufQ4_1, GgufQ5_1};
        let blk = scheme.act_block(1).unwrap_or(32);
        (
            stage_acts(blk, matches!(scheme, GgufQ4_1 | GgufQ5_1), norm, add),
            "xs",
        )
    } else {
        (
            "    const bool has_sums = m.w[8] != 0;\n    const float* sums = (const float*)m.w[8];\n"
                .to_string(),
            "xg",
        )
    };
    let grouped = group_decoder(scheme);
    let inner = if grouped.is_some() {
        format!(
            r#"            #pragma unroll 2
            for (i64 s = 256 * part + 8 * lane; s < k; s += 256 * {split}) {{
                float wv[8], gm;
                u32 e0, e1;
                grp(row, (u32)s, wv, &e0, &e1, &gm);
                const i64 a = s - s % GBLK + e0, c = s - s % GBLK + e1;
#if GMIN
                // The block's offset: times its activations' sum where they are rounded (as
                // the CPU takes it, rounded to f16), else in each weight.
                const bool lead = has_sums && s % GBLK == 0;
                if (!has_sums) {{
                    #pragma unroll
                    for (int i = 0; i < 8; ++i) wv[i] += gm;
                }}
#endif
                #pragma unroll
                for (int r = 0; r < {QROWS}; ++r) {{
                    if (r >= rows) continue;
                    float t = acc[r];
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) t += wv[i] * {xv}[r * k + a + i];
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) t += wv[4 + i] * {xv}[r * k + c + i];
#if GMIN
                    if (lead) t += gm * sums[r * (k / 32) + s / 32];
#endif
                    acc[r] = t;
                }}
            }}
"#
        )
    } else {
        format!(
            r#"            #pragma unroll 4
            for (i64 c = 32 * part; c < k; c += 32 * {split}) {{
                const i64 e = c + lane;
                if (e < k) {{
                    const float wv = deq(row, (u32)e);
                    #pragma unroll
                    for (int r = 0; r < {QROWS}; ++r) if (r < rows) acc[r] += {xv}[r * k + e] * wv;
                }}
            }}
"#
        )
    };
    let body = format!(
        r#"    __shared__ float sh[{MATVEC_WARPS}][{QROWS}];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % {split}, slot = warp / {split};
    const i64 rows = m.w[0], k = m.w[1], n = m.w[2];
    const float* xg = (const float*)m.w[3];
{stage}    for (i64 j0 = blockIdx.x * (i64){cols}; j0 < n; j0 += (i64)gridDim.x * {cols}) {{
        const i64 j = j0 + slot;
        if (j < n) {{
            const unsigned char* row = (const unsigned char*)m.w[4] + j * m.w[5];
            float acc[{QROWS}];
            #pragma unroll
            for (int r = 0; r < {QROWS}; ++r) acc[r] = 0.0f;
{inner}            #pragma unroll
            for (int r = 0; r < {QROWS}; ++r) {{
                if (r >= rows) continue;
                for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
                if (lane == 0) sh[warp][r] = acc[r];
            }}
        }}
        __syncthreads();
        if (threadIdx.x < {cols} * rows) {{
            const int cs = threadIdx.x / (int)rows, r = threadIdx.x % (int)rows;
            const i64 jj = j0 + cs;
            if (jj < n) {{
                float s = 0.0f;
                #pragma unroll
                for (int q = 0; q < {split}; ++q) s += sh[cs * {split} + q][r];
                (({st}*)m.w[6])[r * n + jj] = {val};
            }}
        }}
        __syncthreads();
    }}
"#
    );
    let src = kernel(DEQUANT_MATVEC_WORDS, &body);
    let helpers = format!("{BYTES}{WORDS}{dec}\n{}\n", grouped.unwrap_or(""));
    Some(src.replacen("struct M", &format!("{helpers}struct M"), 1))
}
