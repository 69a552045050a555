//! Cached attention of a few query rows (decode) in one launch: a block per query row and
//! head computes the scores of the keys that row sees into shared memory, their softmax
//! weights in place, and the weighted sum of the value rows.

use super::*;

/// Cache rows a one-launch decode attention holds the scores of in shared memory (32 KiB): a
/// longer cache runs the three-launch path.
pub const ATTENTION_STAGE: usize = 8192;

/// Threads of a block of [`attention_decode`].
pub const ATTENTION_THREADS: u32 = 512;

/// Words of [`attention_decode`]: `[S*Hq, hq, d, t, hkv, q, k, v, pos, out, window,
/// scale_bits, dv]`.
pub const ATTENTION_DECODE_WORDS: usize = 13;

/// Cached attention for a few query rows in one launch, a block of [`ATTENTION_THREADS`] per
/// query row `qi` and head `h` of `q [S, Hq, D]`: the row sees cache rows `first ..= pos + qi`
/// (inside the window) of `k [T, Hkv, D]` / `v [T, Hkv, Dv]` (heads grouped), and only those
/// are read (the three-launch path scores every cache row). Each warp scores every
/// `warps`-th key, its lanes splitting the head dimension (queries rounded to the cache's
/// dtype first); the scores' maximum and the exponentials' sum are reduced over the block, and
/// the weights (rounded to the cache's dtype, as the CPU rounds them) replace the scores; then
/// groups of `Dv` threads (one per result column) each take every `groups`-th key, their sums
/// added in group order. The same arithmetic as [`attention_scores`], [`attention_weights`]
/// and [`attention_values`], summed in other orders.
pub fn attention_decode(q: DType, cache: DType, pos: DType, out: DType) -> Option<String> {
    if !real(q) || !real(cache) || !real(out) || pos.is_float() || pos == DType::Bool {
        return None;
    }
    let (qs, ks, ps, os) = (storage(q)?, storage(cache)?, storage(pos)?, storage(out)?);
    let qv = fit(cache, format!("(float)({})", load(q, "qp[e]")));
    let kv = load(cache, "kp[e]");
    let vv = load(cache, "vp[j * hkv * dv]");
    let w = fit(
        cache,
        "(mx == -INF_F32 ? 0.0f : expf(sc[j] - mx) / sum)".into(),
    );
    let val = store(out, &fit(out, "s".into()));
    let threads = ATTENTION_THREADS;
    let warps = threads / 32;
    let body = format!(
        r#"    __shared__ float sc[{ATTENTION_STAGE}];
    __shared__ float red[{warps}];
    __shared__ float sh[{threads}];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 hq = m.w[1], d = m.w[2], t = m.w[3], hkv = m.w[4], dv = m.w[12];
    if (dv == 0 || t == 0) return;
    const i64 groups = dv >= {threads} ? 1 : {threads} / dv;
    for (i64 rh = blockIdx.x; rh < m.w[0]; rh += gridDim.x) {{
        const i64 h = rh % hq, qi = rh / hq, kh = h / (hq / hkv);
        const i64 at = (i64)((const {ps}*)m.w[8])[0];
        const i64 p0 = at < 0 ? 0 : at;
        const i64 last = p0 + qi < t - 1 ? p0 + qi : t - 1;
        const i64 first = (m.w[10] > 0 && last + 1 > m.w[10]) ? last + 1 - m.w[10] : 0;
        const i64 len = last - first + 1;
        const {qs}* qp = (const {qs}*)m.w[5] + (qi * hq + h) * d;
        for (i64 j = warp; j < len; j += {warps}) {{
            const {ks}* kp = (const {ks}*)m.w[6] + ((first + j) * hkv + kh) * d;
            float s = 0.0f;
            for (i64 e = lane; e < d; e += 32) s += {qv} * (float)({kv});
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) sc[j] = s * __int_as_float((int)m.w[11]);
        }}
        __syncthreads();
        float mx = -INF_F32;
        for (i64 j = threadIdx.x; j < len; j += {threads}) mx = rmaxf(mx, sc[j]);
        for (int o = 16; o > 0; o >>= 1) mx = rmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red[warp] = mx;
        __syncthreads();
        mx = red[0];
        for (int o = 1; o < {warps}; ++o) mx = rmaxf(mx, red[o]);
        __syncthreads();
        float sum = 0.0f;
        for (i64 j = threadIdx.x; j < len; j += {threads}) sum += expf(sc[j] - mx);
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) red[warp] = sum;
        __syncthreads();
        sum = red[0];
        for (int o = 1; o < {warps}; ++o) sum += red[o];
        for (i64 j = threadIdx.x; j < len; j += {threads}) sc[j] = {w};
        __syncthreads();
        if (groups == 1) {{
            for (i64 c = threadIdx.x; c < dv; c += {threads}) {{
                const {ks}* vp = (const {ks}*)m.w[7] + (first * hkv + kh) * dv + c;
                float s = 0.0f;
                for (i64 j = 0; j < len; ++j) {{ const float p = sc[j]; if (p != 0.0f) s += p * (float)({vv}); }}
                (({os}*)m.w[9])[rh * dv + c] = {val};
            }}
        }} else {{
            const i64 c = threadIdx.x % dv, g = threadIdx.x / dv;
            const {ks}* vp = (const {ks}*)m.w[7] + (first * hkv + kh) * dv + c;
            float acc = 0.0f;
            if (g < groups) {{
                #pragma unroll 4
                for (i64 j = g; j < len; j += groups) {{ const float p = sc[j]; if (p != 0.0f) acc += p * (float)({vv}); }}
            }}
            sh[threadIdx.x] = acc;
            __syncthreads();
            if (g == 0) {{
                float s = 0.0f;
                for (i64 q = 0; q < groups; ++q) s += sh[q * dv + c];
                (({os}*)m.w[9])[rh * dv + c] = {val};
            }}
        }}
        __syncthreads();
    }}
"#
    );
    Some(kernel(ATTENTION_DECODE_WORDS, &body))
}

/// Keys a block of [`attention`] stages in shared memory at a time (with head dims up to
/// [`ATTENTION_MAX_D`]: 32 KiB of keys and values).
pub const ATTENTION_KEYS: usize = 16;

/// Largest query / key and value head dim [`attention`] takes (its lanes' accumulators).
pub const ATTENTION_MAX_D: usize = 256;

/// Query rows a block of [`attention`] takes: a warp each.
pub const ATTENTION_ROWS: usize = 8;

/// Words of [`attention`]: `[blocks, hq, sq, d, dv, hkv, sk, q, k, v, out, scale_bits, kind,
/// window, mask, mask strides over (b, h, i, j)]`; `kind` 0 none, 1 causal, 2 sliding window,
/// 3 custom (an additive mask).
pub const ATTENTION_WORDS: usize = 19;

/// Scaled dot-product attention (`Op::Attention`, f32) of `q [B, Hq, Sq, D]` over `k [B, Hkv,
/// Sk, D]` and `v [B, Hkv, Sk, Dv]`, heads grouped: a block per batch, head and
/// [`ATTENTION_ROWS`] query rows (a warp a row), flash-style: the block stages
/// [`ATTENTION_KEYS`] keys and their values at a time in shared memory for all its rows; each
/// warp scores them (lanes splitting the head dim, sums by shuffles), skipping the keys its
/// mask hides (query `i` sits at position `i + Sk - Sq`: causal sees keys up to it, a sliding
/// window the last `window` of those; a custom mask is added to the scaled score), and keeps an
/// online softmax (running maximum and sum) and the weighted values in its lanes' registers.
/// No score matrix in memory: one launch instead of the decomposition's six.
pub fn attention() -> String {
    let (kt, rows, maxd) = (ATTENTION_KEYS, ATTENTION_ROWS, ATTENTION_MAX_D);
    let per = maxd / 32;
    let body = format!(
        r#"    __shared__ float ks[{kt} * {maxd}], vs[{kt} * {maxd}];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 hq = m.w[1], sq = m.w[2], d = m.w[3], dv = m.w[4], hkv = m.w[5], sk = m.w[6];
    const i64 tiles = (sq + {rows} - 1) / {rows}, kind = m.w[12], win = m.w[13];
    const float scale = __int_as_float((int)m.w[11]);
    for (i64 blk = blockIdx.x; blk < m.w[0]; blk += gridDim.x) {{
        const i64 bh = blk / tiles, i0 = (blk % tiles) * {rows};
        const i64 h = bh % hq, b = bh / hq, kh = h / (hq / hkv);
        const i64 i = i0 + warp;
        const bool live = i < sq;
        const i64 p = i + sk - sq;
        const float* qp = (const float*)m.w[7] + ((b * hq + h) * sq + (live ? i : 0)) * d;
        const float* kb = (const float*)m.w[8] + (b * hkv + kh) * sk * d;
        const float* vb = (const float*)m.w[9] + (b * hkv + kh) * sk * dv;
        // The keys any row of the block may see.
        i64 jend = sk, jbeg = 0;
        if (kind == 1 || kind == 2) {{
            const i64 last = (i0 + {rows} - 1 < sq ? i0 + {rows} - 1 : sq - 1) + sk - sq;
            jend = last + 1 < sk ? last + 1 : sk;
            if (jend < 0) jend = 0;
        }}
        if (kind == 2) {{
            const i64 first = i0 + sk - sq - win + 1;
            jbeg = first > 0 ? first : 0;
        }}
        float acc[{per}];
        #pragma unroll
        for (int u = 0; u < {per}; ++u) acc[u] = 0.0f;
        float mx = -INF_F32, l = 0.0f;
        for (i64 j0 = jbeg; j0 < jend; j0 += {kt}) {{
            const i64 n = jend - j0 < {kt} ? jend - j0 : {kt};
            __syncthreads();
            for (i64 e = threadIdx.x; e < n * d; e += blockDim.x) ks[e] = kb[j0 * d + e];
            for (i64 e = threadIdx.x; e < n * dv; e += blockDim.x) vs[e] = vb[j0 * dv + e];
            __syncthreads();
            if (!live) continue;
            for (i64 jj = 0; jj < n; ++jj) {{
                const i64 j = j0 + jj;
                if ((kind == 1 || kind == 2) && j > p) continue;
                if (kind == 2 && j <= p - win) continue;
                float s = 0.0f;
                for (i64 e = lane; e < d; e += 32) s += qp[e] * ks[jj * d + e];
                for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                s *= scale;
                if (kind == 3) s += ((const float*)m.w[14])[b * m.w[15] + h * m.w[16] + i * m.w[17] + j * m.w[18]];
                if (s == -INF_F32) continue;
                const float mn = rmaxf(mx, s);
                const float corr = expf(mx - mn), w = expf(s - mn);
                l = l * corr + w;
                #pragma unroll
                for (int u = 0; u < {per}; ++u) {{
                    const i64 c = lane + 32 * u;
                    if (c < dv) acc[u] = acc[u] * corr + w * vs[jj * dv + c];
                }}
                mx = mn;
            }}
        }}
        if (live) {{
            float* o = (float*)m.w[10] + ((b * hq + h) * sq + i) * dv;
            #pragma unroll
            for (int u = 0; u < {per}; ++u) {{
                const i64 c = lane + 32 * u;
                if (c < dv) o[c] = acc[u] / l;
            }}
        }}
    }}
"#
    );
    kernel(ATTENTION_WORDS, &body)
}
