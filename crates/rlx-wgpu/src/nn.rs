//! Native kernels of the composite ops the compiler would otherwise decompose: LayerNorm and
//! RmsNorm (a workgroup per row, its sums by a tree in workgroup memory), RoPE (per element, frequencies computed on the host as the
//! decomposition does), attention (one invocation per query row, an online softmax over the keys
//! it may see: no score matrix in memory, one dispatch instead of six), convolution and pooling
//! (one invocation per result). Each computes in f32 and rounds its result to the op's dtype once.
//!
//! [`native`] says which nodes these kernels take; [`step`] gives a node's shader source, meta
//! words and invocation count. Both read the node's attributes, so the op table's cases of these
//! ops run here rather than through their decompositions.

use crate::shaders::{one_d, round_to, wgsl_type, HEADER, MAX_GROUPS, WG, WG_SUM};
use rlx_ir::{DType, Graph, MaskKind, NodeId, Op, PoolKind, Result};

/// Largest value head dim the attention kernel takes (its per-row accumulator).
pub const MAX_DV: usize = 256;
/// Loop iterations one invocation may run: lavapipe ends an invocation's loops after 65535 in
/// all, silently (a few spare here for the kernels' short loops).
pub const LOOP_LIMIT: usize = 65000;

/// The last dim of a node's static shape (1 for a scalar).
fn od_last(n: &rlx_ir::Node) -> usize {
    n.shape
        .static_dims()
        .and_then(|d| d.last().copied())
        .unwrap_or(1)
}

fn static_dims(g: &Graph, id: NodeId) -> Vec<usize> {
    g.shape(id).static_dims().unwrap_or_default()
}

/// Whether node `id` runs on a kernel of this module.
pub fn native(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    if wgsl_type(n.shape.dtype()) != Some("f32") || n.shape.static_dims().is_none() {
        return false;
    }
    match &n.op {
        Op::Rope { .. } => wgsl_type(g.shape(n.inputs[1]).dtype()).is_some_and(|t| t != "f32"),
        // One invocation loops over keys x (D + Dv): within lavapipe's loop limit.
        Op::Attention { .. } => {
            let (kd, vd) = (static_dims(g, n.inputs[1]), static_dims(g, n.inputs[2]));
            vd.get(3).is_some_and(|&dv| dv <= MAX_DV) && kd[2] * (kd[3] + vd[3] + 2) <= LOOP_LIMIT
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            n.shape.rank() >= 1 && 3 * od_last(n) <= LOOP_LIMIT
        }
        // One invocation loops over the window (and a convolution's input channels).
        Op::Conv(_) => {
            let wd = static_dims(g, n.inputs[1]);
            matches!(n.shape.rank(), 3 | 4) && wd[1..].iter().product::<usize>() <= LOOP_LIMIT
        }
        Op::Pool(a) => {
            matches!(n.shape.rank(), 3 | 4) && a.kernel.iter().product::<usize>() <= LOOP_LIMIT
        }
        _ => false,
    }
}

/// One step of node `id` (which [`native`] takes): WGSL source, meta words and invocations.
/// `word(node)` is the word address of a value.
pub fn step(
    g: &Graph,
    id: NodeId,
    word: &dyn Fn(NodeId) -> u32,
) -> Result<(String, Vec<u32>, usize)> {
    let n = g.node(id);
    let out = n.shape.dtype();
    let od = static_dims(g, id);
    let count: usize = od.iter().product();
    let ins = &n.inputs;
    Ok(match &n.op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let rms = matches!(n.op, Op::RmsNorm { .. });
            let d = *od.last().unwrap_or(&1);
            let rows = count / d.max(1);
            let beta = if rms { 0 } else { word(ins[2]) };
            let meta = vec![
                rows as u32,
                d as u32,
                word(ins[0]),
                word(ins[1]),
                beta,
                word(id),
                eps.to_bits(),
            ];
            (norm(rms, out), meta, rows * WG as usize)
        }
        Op::Rope { theta, interleaved } => {
            let (s, d) = (od[od.len() - 2], od[od.len() - 1]);
            let mut meta = vec![
                count as u32,
                s as u32,
                d as u32,
                word(ins[0]),
                word(ins[1]),
                word(id),
            ];
            // The decomposition's frequencies: theta^(-2k/D) in f64, rounded to the dtype.
            meta.extend((0..d / 2).map(|k| {
                let f = (*theta as f64).powf(-2.0 * k as f64 / d as f64);
                round_host(out, f).to_bits()
            }));
            let signed = wgsl_type(g.shape(ins[1]).dtype()) == Some("i32");
            (rope(*interleaved, signed, out, None), meta, count)
        }
        Op::Attention { mask, scale } => {
            let (qd, kd, vd) = (
                static_dims(g, ins[0]),
                static_dims(g, ins[1]),
                static_dims(g, ins[2]),
            );
            let rows = qd[0] * qd[1] * qd[2];
            let (kind, window) = match mask {
                MaskKind::None => (0, 0),
                MaskKind::Causal => (1, 0),
                MaskKind::SlidingWindow(w) => (2, *w),
                MaskKind::Custom => (3, 0),
            };
            let mut meta = vec![
                rows as u32,
                qd[1] as u32,
                qd[2] as u32,
                qd[3] as u32,
                vd[3] as u32,
                kd[1] as u32,
                kd[2] as u32,
                word(ins[0]),
                word(ins[1]),
                word(ins[2]),
                word(id),
                scale.to_bits(),
                kind,
                window as u32,
            ];
            // The custom mask's strides over [B, H, Sq, Sk] (zero on broadcast axes).
            let (moff, mstr) = if *mask == MaskKind::Custom {
                let md = static_dims(g, ins[3]);
                let full = [qd[0], qd[1], qd[2], kd[2]];
                (word(ins[3]), broadcast(&md, &full))
            } else {
                (0, vec![0; 4])
            };
            meta.push(moff);
            meta.extend(mstr.iter().map(|&s| s as u32));
            (attention(out), meta, rows)
        }
        Op::Conv(a) => {
            let (xd, wd) = (static_dims(g, ins[0]), static_dims(g, ins[1]));
            let (x2, w2, o2) = (two(&xd[2..], 1), two(&wd[2..], 1), two(&od[2..], 1));
            let (s, dl, p) = (two(&a.stride, 1), two(&a.dilation, 1), low_pads(&a.padding));
            let meta = [
                count, xd[1], x2[0], x2[1], od[1], o2[0], o2[1], w2[0], w2[1], s[0], s[1], p[0],
                p[1], dl[0], dl[1], a.groups,
            ]
            .iter()
            .map(|&v| v as u32)
            .chain([word(ins[0]), word(ins[1]), word(id)])
            .collect();
            (conv(out), meta, count)
        }
        Op::Pool(a) => {
            let xd = static_dims(g, ins[0]);
            let (x2, o2) = (two(&xd[2..], 1), two(&od[2..], 1));
            let (k, s, p) = (two(&a.kernel, 1), two(&a.stride, 1), low_pads(&a.padding));
            let meta = [
                count, x2[0], x2[1], o2[0], o2[1], k[0], k[1], s[0], s[1], p[0], p[1],
            ]
            .iter()
            .map(|&v| v as u32)
            .chain([word(ins[0]), word(id)])
            .collect();
            (pool(a.kind, out), meta, count)
        }
        other => {
            return Err(rlx_ir::Error::Unsupported {
                backend: "wgpu".into(),
                op: other.name().into(),
                node: id,
                msg: "no native kernel".into(),
            })
        }
    })
}

/// A 1-d or 2-d spatial attribute as two (a 1-d one as `[one, v]`: height 1).
fn two(v: &[usize], one: usize) -> [usize; 2] {
    match v {
        [w] => [one, *w],
        [h, w, ..] => [*h, *w],
        [] => [one, one],
    }
}

/// The low padding of each spatial axis, as two.
fn low_pads(p: &[(usize, usize)]) -> [usize; 2] {
    two(&p.iter().map(|q| q.0).collect::<Vec<_>>(), 0)
}

/// `v` rounded to `dt`'s precision, as an f32.
fn round_host(dt: DType, v: f64) -> f32 {
    match dt {
        DType::F16 => half::f16::from_f64(v).to_f32(),
        DType::BF16 => half::bf16::from_f64(v).to_f32(),
        _ => v as f32,
    }
}

/// Strides of dims `d` broadcast (right-aligned) against `full`.
fn broadcast(d: &[usize], full: &[usize]) -> Vec<usize> {
    let lead = full.len() - d.len();
    let mut s = vec![0; full.len()];
    let mut acc = 1;
    for a in (0..d.len()).rev() {
        if d[a] != 1 {
            s[a + lead] = acc;
        }
        acc *= d[a];
    }
    s
}

/// A workgroup per row (dispatch `rows * WG` invocations): meta `[rows, d, x, gamma, beta,
/// out, eps]`; the mean and the variance summed by the workgroup ([`shaders::WG_SUM`]).
fn norm(rms: bool, out: DType) -> String {
    let (mean, shift) = if rms {
        ("", "")
    } else {
        (
            "var s = 0.0;\n    if (live) { for (var j = lid; j < d; j += WGu) { s += ld(x + j); } }\n    mean = wg_sum(s, lid) / f32(d);",
            " + ld(mt[4] + j)",
        )
    };
    let y = round_to(
        out,
        format!("(ld(x + j) - mean) * inv * ld(mt[3] + j){shift}"),
    );
    let body = format!(
        r#"{HEADER}
{WG_SUM}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let r = wg.x + wg.y * {MAX_GROUPS}u;
    let live = r < mt[0];
    let d = mt[1];
    let x = mt[2] + r * d;
    let o = mt[5] + r * d;
    var mean = 0.0;
    {mean}
    var v = 0.0;
    if (live) {{ for (var j = lid; j < d; j += WGu) {{ let c = ld(x + j) - mean; v += c * c; }} }}
    v = wg_sum(v, lid);
    let inv = 1.0 / sqrt(v / f32(d) + bitcast<f32>(mt[6]));
    if (live) {{ for (var j = lid; j < d; j += WGu) {{ st(o + j, {y}); }} }}
}}
"#
    );
    body.replace("WGu", &format!("{WG}u"))
}

/// One invocation per element: meta `[n, S, D, x, pos, out, freq[D/2]...]`; the rotation and
/// its roundings are the decomposition's.
/// The rotation of RoPE node `rope` written straight into the cache of the cache write `write`
/// that reads it (through reshapes; `rlx_opt::ropes_into_cache_writes`): one step for both.
/// Meta as [`step`]'s rope, with the result's word unused and `[cache, row, T, pos]` before the
/// frequencies; each element `i` of the rotation goes to cache row `pos + i / row` (dropped
/// past the cache, a negative position counting as 0), rounded to the cache's dtype.
pub fn rope_into_cache(
    g: &Graph,
    rope_id: NodeId,
    write: NodeId,
    word: &dyn Fn(NodeId) -> u32,
) -> Result<(String, Vec<u32>, usize)> {
    let n = g.node(rope_id);
    let Op::Rope { theta, interleaved } = n.op else {
        return Err(rlx_ir::Error::Unsupported {
            backend: "wgpu".into(),
            op: g.node(write).op.name().into(),
            node: write,
            msg: format!("node {rope_id:?} taken in as a rotation is not one (a lowering bug)"),
        });
    };
    let out = n.shape.dtype();
    let od = static_dims(g, rope_id);
    let count: usize = od.iter().product();
    let (s, d) = (od[od.len() - 2], od[od.len() - 1]);
    let w = g.node(write);
    let (cache, pos) = (w.inputs[0], w.inputs[2]);
    let cd = static_dims(g, cache);
    let row: usize = cd[1..].iter().product();
    let mut meta = vec![
        count as u32,
        s as u32,
        d as u32,
        word(n.inputs[0]),
        word(n.inputs[1]),
        0,
        word(cache),
        row as u32,
        cd[0] as u32,
        word(pos),
    ];
    meta.extend((0..d / 2).map(|k| {
        let f = (theta as f64).powf(-2.0 * k as f64 / d as f64);
        round_host(out, f).to_bits()
    }));
    let signed = wgsl_type(g.shape(n.inputs[1]).dtype()) == Some("i32");
    let src = rope(interleaved, signed, out, Some(g.shape(cache).dtype()));
    Ok((src, meta, count))
}

/// RoPE, an invocation per element; with `cache` (its dtype) the result goes into the cache's
/// rows from a position instead (meta words 6 to 9, see [`rope_into_cache`]).
fn rope(interleaved: bool, signed: bool, out: DType, cache: Option<DType>) -> String {
    let (k, first, partner) = if interleaved {
        ("c / 2u", "(c % 2u) == 0u", "c ^ 1u")
    } else {
        (
            "c % (d / 2u)",
            "c < d / 2u",
            "select(c - d / 2u, c + d / 2u, c < d / 2u)",
        )
    };
    let pos = if signed {
        "f32(bitcast<i32>(rd(mt[4] + s)))"
    } else {
        "f32(rd(mt[4] + s))"
    };
    let r = |e: &str| round_to(out, e.to_string());
    let freq = if cache.is_some() { 10 } else { 6 };
    let ang = r(&format!("{} * bitcast<f32>(mt[{freq}u + k])", r(pos)));
    let put = |v: String| {
        match cache {
        Some(c) => format!(
            "let r = u32(max(bitcast<i32>(rd(mt[9])), 0)) + i / mt[7];\n        if (r < mt[8]) {{ st(mt[6] + r * mt[7] + i % mt[7], {}); }}",
            round_to(c, v)
        ),
        None => format!("st(mt[5] + i, {v});"),
    }
    };

    let (cs, sn) = (r("cos(ang)"), r("sin(ang)"));
    let lo = r(&format!("{} - {}", r("a * cs"), r("b * sn")));
    let hi = r(&format!("{} + {}", r("a * sn"), r("b * cs")));
    let (put_lo, put_hi) = (put(lo), put(hi));
    one_d(
        "i",
        &format!(
            r#"    let d = mt[2];
    let c = i % d;
    let s = (i / d) % mt[1];
    let k = {k};
    let ang = {ang};
    let cs = {cs};
    let sn = {sn};
    let me = ld(mt[3] + i);
    let other = ld(mt[3] + i - c + ({partner}));
    if ({first}) {{
        let a = me; let b = other;
        {put_lo}
    }} else {{
        let a = other; let b = me;
        {put_hi}
    }}
"#
        ),
    )
}

/// One invocation per query row `(b, h, i)`: meta `[rows, hq, sq, d, dv, hkv, sk, q, k, v, out,
/// scale, mask kind (0 none, 1 causal, 2 window, 3 custom), window, mask, mask strides[4]]`.
/// An online softmax over the keys the mask lets the row see, accumulating `dv` outputs.
fn attention(out: DType) -> String {
    let y = round_to(out, "acc[c] / l".into());
    one_d(
        "row",
        &format!(
            r#"    let hq = mt[1]; let sq = mt[2]; let d = mt[3]; let dv = mt[4]; let hkv = mt[5]; let sk = mt[6];
    let i = row % sq;
    let h = (row / sq) % hq;
    let b = row / (sq * hq);
    let kh = h / (hq / hkv);
    let q = mt[7] + row * d;
    let kbase = mt[8] + (b * hkv + kh) * sk * d;
    let vbase = mt[9] + (b * hkv + kh) * sk * dv;
    let scale = bitcast<f32>(mt[11]);
    let kind = mt[12];
    // The query's position among the keys (queries are the last sq positions).
    let p = i32(i) + i32(sk) - i32(sq);
    var acc: array<f32, {MAX_DV}>;
    for (var c = 0u; c < dv; c++) {{ acc[c] = 0.0; }}
    var m = bitcast<f32>(0xff800000u);
    var l = 0.0;
    for (var j = 0u; j < sk; j++) {{
        if ((kind == 1u || kind == 2u) && i32(j) > p) {{ continue; }}
        if (kind == 2u && i32(j) <= p - i32(mt[13])) {{ continue; }}
        var s = 0.0;
        for (var e = 0u; e < d; e++) {{ s += ld(q + e) * ld(kbase + j * d + e); }}
        s = s * scale;
        if (kind == 3u) {{
            s += ld(mt[14] + b * mt[15] + h * mt[16] + i * mt[17] + j * mt[18]);
        }}
        if (s == bitcast<f32>(0xff800000u)) {{ continue; }}
        let mn = max(m, s);
        let corr = exp(m - mn);
        let w = exp(s - mn);
        l = l * corr + w;
        for (var c = 0u; c < dv; c++) {{ acc[c] = acc[c] * corr + w * ld(vbase + j * dv + c); }}
        m = mn;
    }}
    let o = mt[10] + row * dv;
    for (var c = 0u; c < dv; c++) {{ st(o + c, {y}); }}
"#
        ),
    )
}

/// One invocation per result of `[N, O, H, W]` (1-d as H = 1): meta `[n, C, H, W, O, OH, OW,
/// KH, KW, stride h w, pad h w, dilation h w, groups, x, w, out]`.
fn conv(out: DType) -> String {
    let y = round_to(out, "acc".into());
    one_d(
        "idx",
        &format!(
            r#"    let C = mt[1]; let H = mt[2]; let W = mt[3]; let O = mt[4]; let OH = mt[5]; let OW = mt[6];
    let KH = mt[7]; let KW = mt[8];
    let ow = idx % OW;
    let oh = (idx / OW) % OH;
    let o = (idx / (OW * OH)) % O;
    let nb = idx / (OW * OH * O);
    let cpg = C / mt[15];
    let g = o / (O / mt[15]);
    var acc = 0.0;
    for (var c = 0u; c < cpg; c++) {{
        let xc = mt[16] + (nb * C + g * cpg + c) * H * W;
        let wc = mt[17] + (o * cpg + c) * KH * KW;
        for (var kh = 0u; kh < KH; kh++) {{
            let ih = i32(oh * mt[9] + kh * mt[13]) - i32(mt[11]);
            if (ih < 0 || ih >= i32(H)) {{ continue; }}
            for (var kw = 0u; kw < KW; kw++) {{
                let iw = i32(ow * mt[10] + kw * mt[14]) - i32(mt[12]);
                if (iw < 0 || iw >= i32(W)) {{ continue; }}
                acc += ld(xc + u32(ih) * W + u32(iw)) * ld(wc + kh * KW + kw);
            }}
        }}
    }}
    st(mt[18] + idx, {y});
"#
        ),
    )
}

/// One invocation per result of `[N, C, H, W]` (1-d as H = 1): meta `[n, H, W, OH, OW, KH, KW,
/// stride h w, pad h w, x, out]`. Padding never wins a max; a mean divides by the window's
/// non-padding elements.
fn pool(kind: PoolKind, out: DType) -> String {
    let (init, update, y) = match kind {
        PoolKind::Max => (
            "bitcast<f32>(0xff800000u)",
            "acc = rmax(acc, v);",
            round_to(out, "acc".into()),
        ),
        PoolKind::Mean => (
            "0.0",
            "acc += v;",
            round_to(out, "acc / f32(max(cnt, 1u))".into()),
        ),
    };
    one_d(
        "idx",
        &format!(
            r#"    let H = mt[1]; let W = mt[2]; let OH = mt[3]; let OW = mt[4];
    let ow = idx % OW;
    let oh = (idx / OW) % OH;
    let plane = idx / (OW * OH);
    let x = mt[11] + plane * H * W;
    var acc = {init};
    var cnt = 0u;
    for (var kh = 0u; kh < mt[5]; kh++) {{
        let ih = i32(oh * mt[7] + kh) - i32(mt[9]);
        if (ih < 0 || ih >= i32(H)) {{ continue; }}
        for (var kw = 0u; kw < mt[6]; kw++) {{
            let iw = i32(ow * mt[8] + kw) - i32(mt[10]);
            if (iw < 0 || iw >= i32(W)) {{ continue; }}
            let v = ld(x + u32(ih) * W + u32(iw));
            {update}
            cnt++;
        }}
    }}
    st(mt[12] + idx, {y});
"#
        ),
    )
}
