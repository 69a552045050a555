//! Cached attention's shaders: the three steps over a scratch of scores, and decode
//! attention in one dispatch.

use super::*;

// Cached attention: query row `i` of `q [S, Hq, D]` sees cache rows `first ..= pos + i` (inside
// the window) of `k [T, Hkv, D]`, `v [T, Hkv, Dv]` (heads grouped), in three steps over a
// scratch of scores `[S, Hq, T]`, each invocation looping over one axis (lavapipe ends an
// invocation's loops after 65535 iterations in all). With an f16 or bf16 cache the arithmetic
// is the CPU's (llama.cpp's default path): queries and the normalized weights are rounded to the
// cache's dtype before their products.

/// Step 1, one invocation per score: meta `[S * Hq * T, hq, d, t, hkv, q, k, pos, scores,
/// window, scale]`; masked keys score -inf.
pub fn attention_scores(cache: DType) -> String {
    let qv = round_to(cache, "ld(q + e)".into());
    one_d(
        "idx",
        &format!(
            r#"    let hq = mt[1]; let d = mt[2]; let t = mt[3]; let hkv = mt[4];
    let j = idx % t;
    let h = (idx / t) % hq;
    let i = idx / (t * hq);
    let pos = u32(max(bitcast<i32>(rd(mt[7])), 0));
    let last = min(pos + i, t - 1u);
    var first = 0u;
    if (mt[9] > 0u && last + 1u > mt[9]) {{ first = last + 1u - mt[9]; }}
    if (j < first || j > last) {{ st(mt[8] + idx, bitcast<f32>(0xff800000u)); return; }}
    let q = mt[5] + (i * hq + h) * d;
    let kr = mt[6] + (j * hkv + h / (hq / hkv)) * d;
    var s = 0.0;
    for (var e = 0u; e < d; e++) {{ s += {qv} * ld(kr + e); }}
    st(mt[8] + idx, s * bitcast<f32>(mt[10]));
"#
        ),
    )
}

/// Step 2, a workgroup per query row and head (dispatch `S * Hq * WG` invocations): meta
/// `[S * Hq, t, scores]`; the scores become the normalized weights (rounded to the cache's
/// dtype), in place, the maximum and the sum found by the workgroup (`WG_SUM`).
pub fn attention_weights(cache: DType) -> String {
    let w = round_to(cache, "exp(ld(r + j) - mx) / sum".into());
    format!(
        r#"{HEADER}
{WG_SUM}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let row = wg.x + wg.y * {MAX_GROUPS}u;
    let live = row < mt[0];
    let t = mt[1];
    let r = mt[2] + row * t;
    var mx = bitcast<f32>(0xff800000u);
    if (live) {{ for (var j = lid; j < t; j += {WG}u) {{ mx = max(mx, ld(r + j)); }} }}
    mx = wg_max(mx, lid);
    var sum = 0.0;
    if (live) {{ for (var j = lid; j < t; j += {WG}u) {{ sum += exp(ld(r + j) - mx); }} }}
    sum = wg_sum(sum, lid);
    if (live) {{ for (var j = lid; j < t; j += {WG}u) {{ st(r + j, {w}); }} }}
}}
"#
    )
}

/// Invocations of a workgroup of step 3.
pub const VALUES_WG: u32 = 256;

/// Step 3, a workgroup of [`VALUES_WG`] invocations per query row and head (dispatch one
/// workgroup each): meta `[S * Hq * Dv, hq, dv, t, hkv, v, weights, out]`. Rows narrower than
/// the workgroup: `VALUES_WG / Dv` groups of `Dv` invocations (one per result column), each group
/// taking every `VALUES_WG / Dv`-th key, their sums added in group order through workgroup
/// memory; wider rows: an invocation per column over every key.
pub fn attention_values(out: DType) -> String {
    let rnd = round_to(out, "acc".into());
    let rnd_sum = round_to(out, "sum".into());
    format!(
        r#"{HEADER}
var<workgroup> vpart: array<f32, {VALUES_WG}>;
var<workgroup> vdv: u32;
@compute @workgroup_size({VALUES_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let rh = wg.x + wg.y * {MAX_GROUPS}u;
    // The row width, uniform across the workgroup, so the branch below may hold a barrier.
    if (lid == 0u) {{ vdv = max(mt[2], 1u); }}
    let dv = workgroupUniformLoad(&vdv);
    let hq = mt[1]; let t = mt[3]; let hkv = mt[4];
    let live = rh < mt[0] / dv;
    let h = rh % hq;
    let w = mt[6] + rh * t;
    let groups = max({VALUES_WG}u / dv, 1u);
    if (groups == 1u) {{
        // Wide rows: no key groups, so no barrier (uniform: `groups` is the same everywhere).
        if (live) {{
            for (var c = lid; c < dv; c += {VALUES_WG}u) {{
                let vr = mt[5] + (h / (hq / hkv)) * dv + c;
                var acc = 0.0;
                for (var j = 0u; j < t; j++) {{
                    let p = ld(w + j);
                    if (p != 0.0) {{ acc += p * ld(vr + j * hkv * dv); }}
                }}
                st(mt[7] + rh * dv + c, {rnd});
            }}
        }}
    }} else {{
        let c = lid % dv;
        let g = lid / dv;
        var acc = 0.0;
        if (live && g < groups) {{
            let vr = mt[5] + (h / (hq / hkv)) * dv + c;
            // Masked keys weigh exactly 0: their cache rows (maybe never written) are not read.
            for (var j = g; j < t; j += groups) {{
                let p = ld(w + j);
                if (p != 0.0) {{ acc += p * ld(vr + j * hkv * dv); }}
            }}
        }}
        vpart[lid] = acc;
        workgroupBarrier();
        if (live && g == 0u) {{
            var sum = 0.0;
            for (var q = 0u; q < groups; q++) {{ sum += vpart[q * dv + c]; }}
            st(mt[7] + rh * dv + c, {rnd_sum});
        }}
    }}
}}
"#
    )
}

/// Cache rows a one-dispatch decode attention holds the scores of in workgroup memory (with
/// its partial sums, under the 16 KiB every adapter has): a longer cache takes the three steps.
pub const ATTENTION_STAGE: usize = 3072;

/// Decode attention (a few query rows) in one dispatch, a workgroup of [`VALUES_WG`]
/// invocations per query row and head: meta `[S * Hq, hq, d, t, hkv, q, k, v, pos, out,
/// window, scale, dv]`. Only the cache rows the row sees are read: their scores (an invocation
/// a key, queries rounded to the cache's dtype) into workgroup memory, the maximum and the sum
/// of the exponentials by trees there, the weights (rounded to the cache's dtype) in place,
/// then the weighted values as [`attention_values`] sums them. The three steps' arithmetic,
/// summed in other orders.
pub fn attention_decode(cache: DType, out: DType) -> String {
    let qv = round_to(cache, "ld(q + e)".into());
    let w = round_to(cache, "exp(sc[j] - mx) / sum".into());
    let rnd = round_to(out, "acc".into());
    let rnd_sum = round_to(out, "tot".into());
    let tree = |op: &str| {
        format!(
            r#"    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ vpart[lid] = {op}; }}
        workgroupBarrier();
    }}"#,
            half = VALUES_WG / 2,
            op = op
        )
    };
    let tmax = tree("max(vpart[lid], vpart[lid + s])");
    let tsum = tree("vpart[lid] + vpart[lid + s]");
    format!(
        r#"{HEADER}
var<workgroup> sc: array<f32, {ATTENTION_STAGE}>;
var<workgroup> vpart: array<f32, {VALUES_WG}>;
var<workgroup> vdv: u32;
@compute @workgroup_size({VALUES_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let rh = wg.x + wg.y * {MAX_GROUPS}u;
    // The row width, uniform across the workgroup, so the branch below may hold a barrier.
    if (lid == 0u) {{ vdv = max(mt[12], 1u); }}
    let dv = workgroupUniformLoad(&vdv);
    let hq = mt[1]; let d = mt[2]; let t = mt[3]; let hkv = mt[4];
    let live = rh < mt[0];
    let h = rh % hq;
    let i = rh / hq;
    let kh = h / (hq / hkv);
    let pos = u32(max(bitcast<i32>(rd(mt[8])), 0));
    let last = min(pos + i, t - 1u);
    var first = 0u;
    if (mt[10] > 0u && last + 1u > mt[10]) {{ first = last + 1u - mt[10]; }}
    let len = last - first + 1u;
    if (live) {{
        let q = mt[5] + (i * hq + h) * d;
        for (var j = lid; j < len; j += {VALUES_WG}u) {{
            let kr = mt[6] + ((first + j) * hkv + kh) * d;
            var s = 0.0;
            for (var e = 0u; e < d; e++) {{ s += {qv} * ld(kr + e); }}
            sc[j] = s * bitcast<f32>(mt[11]);
        }}
    }}
    workgroupBarrier();
    var mx = bitcast<f32>(0xff800000u);
    if (live) {{ for (var j = lid; j < len; j += {VALUES_WG}u) {{ mx = max(mx, sc[j]); }} }}
    vpart[lid] = mx;
    workgroupBarrier();
{tmax}
    mx = vpart[0];
    workgroupBarrier();
    var sum = 0.0;
    if (live) {{ for (var j = lid; j < len; j += {VALUES_WG}u) {{ sum += exp(sc[j] - mx); }} }}
    vpart[lid] = sum;
    workgroupBarrier();
{tsum}
    sum = vpart[0];
    workgroupBarrier();
    if (live) {{ for (var j = lid; j < len; j += {VALUES_WG}u) {{ sc[j] = {w}; }} }}
    workgroupBarrier();
    let vr = mt[7] + (first * hkv + kh) * dv;
    let groups = max({VALUES_WG}u / dv, 1u);
    if (groups == 1u) {{
        // Wide rows: no key groups, so no barrier (uniform: `groups` is the same everywhere).
        if (live) {{
            for (var c = lid; c < dv; c += {VALUES_WG}u) {{
                var acc = 0.0;
                for (var j = 0u; j < len; j++) {{
                    let p = sc[j];
                    if (p != 0.0) {{ acc += p * ld(vr + c + j * hkv * dv); }}
                }}
                st(mt[9] + rh * dv + c, {rnd});
            }}
        }}
    }} else {{
        let c = lid % dv;
        let g = lid / dv;
        var acc = 0.0;
        if (live && g < groups) {{
            for (var j = g; j < len; j += groups) {{
                let p = sc[j];
                if (p != 0.0) {{ acc += p * ld(vr + c + j * hkv * dv); }}
            }}
        }}
        vpart[lid] = acc;
        workgroupBarrier();
        if (live && g == 0u) {{
            var tot = 0.0;
            for (var q = 0u; q < groups; q++) {{ tot += vpart[q * dv + c]; }}
            st(mt[9] + rh * dv + c, {rnd_sum});
        }}
    }}
}}
"#
    )
}
