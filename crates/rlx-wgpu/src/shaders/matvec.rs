//! The quantized matrix-vector product of decode steps: the word-load decoders of the common
//! GGUF block types, the staging of its activations in workgroup memory, and the shader.

use super::*;

/// Activations (`rows * K` f32) a staged matrix-vector product holds in workgroup memory:
/// with its block sums and the product's partial sums, under the 16 KiB every adapter has.
pub const MATVEC_STAGE: u32 = 3072;

/// Workgroups of a staged matrix-vector product at most on a GPU: each stages the activations
/// once and then takes [`matvec_columns`] result columns in turn.
pub const MATVEC_GROUPS: usize = 1024;

/// Workgroups of a staged matrix-vector product at most on a CPU-type adapter (lavapipe), which
/// runs a workgroup at a time on each of a few threads: there every workgroup's staging (and
/// norm) is work taken from the product, so fewer workgroups take more columns each. The
/// columns' sums are the same either way (a column's sum does not depend on its workgroup).
pub const MATVEC_GROUPS_CPU: usize = 64;

/// [`MATVEC_GROUPS`], or [`MATVEC_GROUPS_CPU`] for a CPU-type adapter.
pub fn matvec_groups(cpu: bool) -> usize {
    if cpu {
        MATVEC_GROUPS_CPU
    } else {
        MATVEC_GROUPS
    }
}

/// Loop iterations an invocation of a matrix-vector product runs per result column of `k`
/// elements (a generous count: an element a step, every row).
pub fn matvec_column_loops(k: usize) -> usize {
    k.div_ceil(WG as usize) * (QROWS as usize + 1) + 16
}

/// Result columns each workgroup of a staged matrix-vector product of `n` columns of `k`
/// elements takes: enough for at most `groups` workgroups ([`matvec_groups`]), but never so
/// many that an invocation's loops pass 32,768 iterations (lavapipe cuts invocations off at
/// 65,535).
pub fn matvec_columns(n: usize, k: usize, groups: usize) -> usize {
    let most = (32_768 / matvec_column_loops(k)).max(1);
    n.div_ceil(groups.max(1)).clamp(1, most)
}

/// Whether a decode product of `rows` rows and `elems` activations stages them
/// ([`dequant_matvec`]'s `staged`), rounding them itself: no rounding step before it.
pub fn matvec_staged(rows: usize, elems: usize) -> bool {
    rows <= QROWS as usize && elems <= MATVEC_STAGE as usize
}

/// Whether a decode product of `scheme` can normalize its staged activations itself
/// ([`dequant_matvec`]'s `norm`: a `norm_matmul` region): its activations round to blocks of
/// 32 or not at all, each block by one invocation, so the rounding in place reads only what
/// that invocation wrote (a 256-block's largest element comes from another's part).
pub fn norm_fuses(scheme: rlx_ir::QuantScheme) -> bool {
    scheme.act_block(1) != Some(256)
}

/// Word loads of the group decoders: the word holding byte `b`, the 32 bits from byte `b` (on
/// a 2-byte boundary) and the f16 at byte `b` (on a 2-byte boundary), each by one or two
/// whole-word reads instead of a read a byte.
const GROUP_WORDS: &str = r#"fn wordof(b: u32) -> u32 { return select(b >> 2u, SHARED + ((b - SHARED) >> 2u), b >= SHARED); }
fn ld32(b: u32) -> u32 {
    let w = rd(wordof(b));
    if ((b & 3u) == 0u) { return w; }
    return (w >> 16u) | (rd(wordof(b + 2u)) << 16u);
}
fn h16(b: u32) -> f32 { return unpack2x16float(rd(wordof(b)) >> ((b & 2u) * 8u)).x; }
fn nib4(q: u32, hi: u32) -> vec4<f32> { return vec4<f32>(f32((q >> hi) & 0xfu), f32((q >> (8u + hi)) & 0xfu), f32((q >> (16u + hi)) & 0xfu), f32((q >> (24u + hi)) & 0xfu)); }
fn bit4(h: u32, j: u32) -> vec4<f32> { return vec4<f32>(f32((h >> j) & 1u), f32((h >> (j + 1u)) & 1u), f32((h >> (j + 2u)) & 1u), f32((h >> (j + 3u)) & 1u)) * 16.0; }
fn two4(h: u32, j: u32) -> vec4<f32> { return vec4<f32>(f32((h >> j) & 3u), f32((h >> (8u + j)) & 3u), f32((h >> (16u + j)) & 3u), f32((h >> (24u + j)) & 3u)) * 16.0; }
fn sb4(q: u32) -> vec4<f32> { return vec4<f32>(f32(bitcast<i32>(q << 24u) >> 24u), f32(bitcast<i32>(q << 16u) >> 24u), f32(bitcast<i32>(q << 8u) >> 24u), f32(bitcast<i32>(q) >> 24u)); }
fn sbyte(b: u32) -> f32 { return f32(bitcast<i32>(byte(b) << 24u) >> 24u); }
// Eight weights of a block: four from element e0 of the block on, four from e1; m the block's
// offset where its type has one (Q4_1, Q5_1: not in the weights).
struct Grp { w0: vec4<f32>, w1: vec4<f32>, e0: u32, e1: u32, m: f32 }
"#;

/// WGSL `grp(row, s) -> Grp` for the block types whose blocks split into groups of eight
/// weights readable by a few word loads (group `s / 8` of the row, `s` a multiple of 8), each
/// weight computed as [`gguf_decoder`]'s `deq` computes it; `GBLK` the block's elements, `GMIN`
/// whether the type has an offset (`m`, left out of the weights). `None` for the others.
pub fn group_decoder(scheme: rlx_ir::QuantScheme) -> Option<&'static str> {
    use rlx_ir::QuantScheme::*;
    Some(match scheme {
        GgufQ4_0 => "const GBLK = 32u;\nconst GMIN = false;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 32u) * 18u; let g = (s % 32u) / 8u; let d = h16(b); let q = ld32(b + 2u + 4u * g); return Grp((nib4(q, 0u) - 8.0) * d, (nib4(q, 4u) - 8.0) * d, 4u * g, 16u + 4u * g, 0.0); }",
        GgufQ4_1 => "const GBLK = 32u;\nconst GMIN = true;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 32u) * 20u; let g = (s % 32u) / 8u; let d = h16(b); let q = ld32(b + 4u + 4u * g); return Grp(nib4(q, 0u) * d, nib4(q, 4u) * d, 4u * g, 16u + 4u * g, h16(b + 2u)); }",
        GgufQ5_0 => "const GBLK = 32u;\nconst GMIN = false;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 32u) * 22u; let g = (s % 32u) / 8u; let d = h16(b); let h = ld32(b + 2u); let q = ld32(b + 6u + 4u * g); return Grp((nib4(q, 0u) + bit4(h, 4u * g) - 16.0) * d, (nib4(q, 4u) + bit4(h, 16u + 4u * g) - 16.0) * d, 4u * g, 16u + 4u * g, 0.0); }",
        GgufQ5_1 => "const GBLK = 32u;\nconst GMIN = true;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 32u) * 24u; let g = (s % 32u) / 8u; let d = h16(b); let h = ld32(b + 4u); let q = ld32(b + 8u + 4u * g); return Grp((nib4(q, 0u) + bit4(h, 4u * g)) * d, (nib4(q, 4u) + bit4(h, 16u + 4u * g)) * d, 4u * g, 16u + 4u * g, h16(b + 2u)); }",
        GgufQ8_0 => "const GBLK = 32u;\nconst GMIN = false;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 32u) * 34u; let g = (s % 32u) / 8u; let d = h16(b); return Grp(sb4(ld32(b + 2u + 8u * g)) * d, sb4(ld32(b + 6u + 8u * g)) * d, 8u * g, 8u * g + 4u, 0.0); }",
        GgufQ4K => "const GBLK = 256u;\nconst GMIN = false;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 256u) * 144u; let g = (s % 256u) / 8u; let c = g / 8u; let t = g % 8u; let d = h16(b); let dm = h16(b + 2u); let q = ld32(b + 16u + c * 32u + 4u * t); let sa = scmin(b + 4u, 2u * c); let sb = scmin(b + 4u, 2u * c + 1u); return Grp(d * f32(sa.x) * nib4(q, 0u) - dm * f32(sa.y), d * f32(sb.x) * nib4(q, 4u) - dm * f32(sb.y), 64u * c + 4u * t, 64u * c + 32u + 4u * t, 0.0); }",
        GgufQ6K => "const GBLK = 256u;\nconst GMIN = false;\nfn grp(row: u32, s: u32) -> Grp { let b = row + (s / 256u) * 210u; let g = (s % 256u) / 8u; let h = g / 16u; let qa = (g % 16u) / 8u; let t = g % 8u; let d = h16(b + 208u); let ql = ld32(b + h * 64u + qa * 32u + 4u * t); let qh = ld32(b + 128u + h * 32u + 4u * t); let sa = sbyte(b + 192u + h * 8u + t / 4u + 2u * qa); let sb = sbyte(b + 192u + h * 8u + t / 4u + 2u * (qa + 2u)); return Grp(d * sa * (nib4(ql, 0u) + two4(qh, 2u * qa) - 32.0), d * sb * (nib4(ql, 4u) + two4(qh, 2u * qa + 4u) - 32.0), h * 128u + qa * 32u + 4u * t, h * 128u + (qa + 2u) * 32u + 4u * t, 0.0); }",
        _ => return None,
    })
}

/// The staging of a matrix-vector product's activations in workgroup memory (`xs`, and the
/// 32-blocks' `Q8_1` sums in `ssum`): rounded to blocks of 32 (an invocation a block) or 256
/// (eight invocations a block, each a 32nd, then the block's first element of largest
/// magnitude from their eight) exactly as [`quantize_acts`] rounds them, where the `round`
/// meta word says; else copied.
///
/// `norm`: the activations are an RMSNorm's operand (gamma at meta word 11, eps at 12), first
/// normalized into `xs` as the norm step computes them, each row's sum of squares by a tree
/// in `part`; then rounded there in place (blocks of 32 only: [`norm_fuses`]). `add` (with
/// `norm`): the operand is the sum of `x` and the value at meta word 13 (a residual add),
/// which workgroup 0 also writes at word 14.
fn stage(norm: bool, add: bool) -> String {
    let (xe, keep) = if add {
        (
            "ld(mt[3] + e) + ld(mt[13] + e)",
            " if (wg.x == 0u && wg.y == 0u) { st(mt[14] + e, c); }",
        )
    } else {
        ("ld(mt[3] + e)", "")
    };
    let (first, src, copy) = if norm {
        (
            format!(
                r#"    for (var e = lid; e < nx; e += 64u) {{ let c = {xe}; xs[e] = c;{keep} }}
    workgroupBarrier();
    for (var t = 0u; t < rows; t++) {{
        var v = 0.0;
        for (var e = lid; e < k; e += 64u) {{ let c = xs[t * k + e]; v += c * c; }}
        part[t * 64u + lid] = v;
    }}
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{
            for (var t = 0u; t < rows; t++) {{ part[t * 64u + lid] += part[t * 64u + lid + s]; }}
        }}
        workgroupBarrier();
    }}
    for (var e = lid; e < nx; e += 64u) {{
        let inv = 1.0 / sqrt(part[(e / k) * 64u] / f32(k) + bitcast<f32>(mt[12]));
        xs[e] = (xs[e] - 0.0) * inv * ld(mt[11] + e % k);
    }}
    workgroupBarrier();
"#
            ),
            "xs[IDX]",
            "",
        )
    } else {
        (
            String::new(),
            "ld(mt[3] + IDX)",
            "        for (var e = lid; e < nx; e += 64u) { xs[e] = ld(mt[3] + e); }\n",
        )
    };
    let x = |i: &str| src.replace("IDX", i);
    format!(
        r#"    let nx = rows * k;
{first}    if (mt[7] == 32u) {{
        for (var b = lid; b < nx / 32u; b += 64u) {{
            var amax = 0.0;
            for (var e = 0u; e < 32u; e++) {{ amax = max(amax, abs({xb})); }}
            let d = f16r(amax / 127.0);
            let id = select(0.0, 127.0 / amax, amax != 0.0);
            var qs = 0.0;
            for (var e = 0u; e < 32u; e++) {{ let q = round({xb} * id); xs[b * 32u + e] = d * q; qs += q; }}
            ssum[b] = f16r(amax / 127.0 * qs);
        }}
    }} else if (mt[7] == 256u) {{
        for (var b0 = 0u; b0 < nx / 256u; b0 += 8u) {{
            let b = b0 + lid / 8u;
            let x = b * 256u + (lid % 8u) * 32u;
            let live = b < nx / 256u;
            var amax = 0.0;
            var at = 256u;
            if (live) {{
                for (var e = 0u; e < 32u; e++) {{ let v = abs({xx}); if (v > amax) {{ amax = v; at = (lid % 8u) * 32u + e; }} }}
            }}
            smax[lid] = amax;
            sidx[lid] = at;
            workgroupBarrier();
            var mx = 0.0;
            var ix = 256u;
            for (var p = 0u; p < 8u; p++) {{ let a = smax[(lid / 8u) * 8u + p]; if (a > mx) {{ mx = a; ix = sidx[(lid / 8u) * 8u + p]; }} }}
            if (live) {{
                let o = b * 256u + (lid % 8u) * 32u;
                if (mx == 0.0) {{
                    for (var e = 0u; e < 32u; e++) {{ xs[o + e] = 0.0; }}
                }} else {{
                    let iscale = -127.0 / {xi};
                    let d = 1.0 / iscale;
                    for (var e = 0u; e < 32u; e++) {{ xs[o + e] = d * min(round(iscale * {xx}), 127.0); }}
                }}
            }}
            workgroupBarrier();
        }}
    }} else {{
{copy}    }}
    workgroupBarrier();
"#,
        xb = x("b * 32u + e"),
        xx = x("x + e"),
        xi = x("b * 256u + ix"),
    )
}

/// Which form of [`dequant_matvec`]'s shader: with subgroup sums, staged activations, a norm
/// and a residual add taken in, and specialized to one row (a decode step's product: the row
/// loops and the accumulator array fold away; the same sums as the general shader's row 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct MatvecForm {
    /// Partial sums added by `subgroupAdd` (else by a workgroup tree).
    pub subgroups: bool,
    /// Activations staged (and rounded) in workgroup memory ([`matvec_staged`]).
    pub staged: bool,
    /// A `norm_matmul` region: the activations are an RMSNorm's operand.
    pub norm: bool,
    /// With `norm`: that operand is the sum of two values (a residual add).
    pub add: bool,
    /// Exactly one row.
    pub one_row: bool,
}

/// `x [R, K] @ decode(w)^T` for a few rows (`R <= QROWS`: decode): meta `[R, K, N, x_off,
/// w_byte, row_bytes, out_off, round, sums_off, sums, cols, gamma_off, eps, x2_off, sum_off]`
/// (the last four for `norm` and `add`, else 0); a workgroup per `cols` result
/// columns, taken in turn (dispatch `⌈N / cols⌉ * WG` invocations; `cols` is 1 unstaged,
/// [`matvec_columns`] staged), each weight decoded once for all rows. With a `grouped`
/// decoder ([`group_decoder`]) each invocation takes eight weights of a block from one or two
/// word loads, chunks of 512 elements a step; else invocations on consecutive elements. The
/// partial sums of the product's rows are added by a tree in workgroup memory, or with
/// `subgroups` by `subgroupAdd` in each subgroup and then the subgroups' sums in subgroup order
/// (one barrier instead of six).
///
/// `staged` ([`matvec_staged`]): the workgroup first stages the activations in workgroup
/// memory, rounding them as the `round` word says; else they come rounded by a
/// [`quantize_acts`] step, with the 32-blocks' sums at `sums_off` where the `sums` word is 1.
/// Q4_1 / Q5_1 blocks' offsets multiply those sums (rounded to f16, as the CPU takes them);
/// unrounded, the offsets go into the weights.
///
/// `norm` (staged, a `norm_matmul` region): `x` is an RMSNorm's operand, normalized in
/// workgroup memory first, so the norm takes no step of its own; `add` (with `norm`): that
/// operand is the sum of `x` and `x2` (a residual add), which workgroup 0 also writes.
pub fn dequant_matvec(
    decoder: &str,
    grouped: Option<&str>,
    out: DType,
    form: MatvecForm,
) -> String {
    let MatvecForm {
        subgroups,
        staged,
        norm,
        add,
        one_row,
    } = form;
    let staged = staged || norm;
    let (builtins, sum, result) = if subgroups {
        (
            ", @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) ns: u32, \
             @builtin(subgroup_invocation_id) sl: u32",
            r#"    // Every invocation reaches the subgroup sums (uniform: `rows` is a meta word).
    for (var t = 0u; t < rows; t++) {
        let v = subgroupAdd(acc[t]);
        if (sl == 0u) { part[t * 64u + sg] = v; }
    }
    workgroupBarrier();
    var tot = 0.0;
    if (lid < rows) { for (var q = 0u; q < ns; q++) { tot += part[lid * 64u + q]; } }"#,
            "tot",
        )
    } else {
        (
            "",
            r#"    for (var t = 0u; t < rows; t++) { part[t * 64u + lid] = acc[t]; }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var t = 0u; t < rows; t++) { part[t * 64u + lid] += part[t * 64u + lid + s]; }
        }
        workgroupBarrier();
    }"#,
            "part[lid * 64u]",
        )
    };
    let rnd = round_to(out, result.into());
    let (decls, stage, xv, sv, has_sums) = if staged {
        (
            format!(
                "var<workgroup> xs: array<f32, {MATVEC_STAGE}>;\nvar<workgroup> ssum: array<f32, {}>;\nvar<workgroup> smax: array<f32, 64>;\nvar<workgroup> sidx: array<u32, 64>;\n",
                MATVEC_STAGE / 32
            ),
            stage(norm, add && norm),
            "xs[IDX]",
            "ssum[IDX]",
            "mt[7] == 32u",
        )
    } else {
        (
            String::new(),
            String::new(),
            "ld(mt[3] + IDX)",
            "ld(mt[8] + IDX)",
            "mt[9] == 1u",
        )
    };
    let x = |idx: &str| xv.replace("IDX", idx);
    let inner = if grouped.is_some() {
        let xa = format!(
            "vec4<f32>({}, {}, {}, {})",
            x("o + a"),
            x("o + a + 1u"),
            x("o + a + 2u"),
            x("o + a + 3u")
        );
        let xc = format!(
            "vec4<f32>({}, {}, {}, {})",
            x("o + c"),
            x("o + c + 1u"),
            x("o + c + 2u"),
            x("o + c + 3u")
        );
        let sm = sv.replace("IDX", "t * (k / 32u) + s / 32u");
        format!(
            r#"        let has_sums = {has_sums};
        for (var s = 8u * lid; s < k; s += 512u) {{
            let g = grp(row, s);
            var w0 = g.w0;
            var w1 = g.w1;
            let a = s - s % GBLK + g.e0;
            let c = s - s % GBLK + g.e1;
            // The block's offset: times its activations' sum where they are rounded (as the
            // CPU takes it), else in each weight.
            let lead = GMIN && has_sums && s % GBLK == 0u;
            if (GMIN && !has_sums) {{ w0 += g.m; w1 += g.m; }}
            for (var t = 0u; t < rows; t++) {{
                let o = t * k;
                var v = dot(w0, {xa}) + dot(w1, {xc});
                if (lead) {{ v += g.m * {sm}; }}
                acc[t] += v;
            }}
        }}
"#
        )
    } else {
        let xp = x("t * k + p");
        format!(
            r#"        for (var p = lid; p < k; p += {WG}u) {{
            let w = deq(row, p);
            for (var t = 0u; t < rows; t++) {{ acc[t] += {xp} * w; }}
        }}
"#
        )
    };
    let (words, grp) = match grouped {
        Some(g) => (GROUP_WORDS, g),
        None => ("", ""),
    };
    format!(
        r#"{HEADER}{BYTES}{decoder}
{words}{grp}
var<workgroup> part: array<f32, {parts}>;
{decls}@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32{builtins}) {{
    let rows = {rows};
    let k = mt[1];
    let n = mt[2];
{stage}    // `mt[10]` result columns a workgroup, in turn (uniform: a meta word).
    for (var jc = 0u; jc < mt[10]; jc++) {{
    let j = (wg.x + wg.y * {MAX_GROUPS}u) * mt[10] + jc;
    let live = j < n;
    var acc: array<f32, {acc}>;
    if (live) {{
        let row = mt[4] + j * mt[5];
{inner}    }}
    // Only the product's rows are summed (one for a decode step, not QROWS).
{sum}
    if (live && lid < rows) {{ st(mt[6] + lid * n + j, {rnd}); }}
    workgroupBarrier();
    }}
}}
"#,
        parts = QROWS * 64,
        rows = if one_row { "1u" } else { "mt[0]" },
        acc = if one_row { 1 } else { QROWS },
    )
}
