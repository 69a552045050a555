//! Each step's meta words (shapes, strides, word addresses) and shader, by kernel family: what
//! [`super::steps`] compiles and binds once the arena is planned.

use super::kernel::{
    broadcast_strides, dense_strides, dims, pad, Elementwise, Kernel, Movement, QuantKv, Reduction,
    SumAt,
};
use crate::shaders::{self, HALF, MAX_GROUPS, SHARED, TILE, WG};
use crate::values::Form;
use rlx_ir::{DType, Error, Graph, NodeId, Op, Result};

/// Workgroups of a dispatch.
pub(super) type Groups = (u32, u32, u32);

/// Where each value's words are, once the arena is planned.
pub(super) struct Words<'a> {
    /// Byte offset in the params buffer of each node that is a param (or an alias of one).
    pub(super) pbuf_of: &'a [Option<u64>],
    /// Arena request of each node's words.
    pub(super) req_of: &'a [Option<usize>],
    /// Bytes into its request (or param) at which each node's words begin.
    pub(super) off_of: &'a [usize],
    /// Byte offset of each arena request.
    pub(super) offsets: &'a [usize],
    /// Each value's form.
    pub(super) form: &'a [Form],
    /// Whether kernels may use subgroup operations ([`crate::Gpu::subgroups`]).
    pub(super) subgroups: bool,
    /// Workgroups of a staged matrix-vector product at most ([`shaders::matvec_groups`]).
    pub(super) matvec_groups: usize,
}

impl Words<'_> {
    /// The address of value `node`'s first word, as the shaders take it (the [`SHARED`] bit
    /// for the params buffer, the [`HALF`] bit and a half index for f16 storage).
    fn word(&self, node: usize) -> usize {
        let byte = self.off_of[node]
            + match self.pbuf_of[node] {
                Some(off) => off as usize,
                None => self.offsets[self.req_of[node].expect("every value has words")],
            };
        let space = if self.pbuf_of[node].is_some() {
            SHARED
        } else {
            0
        };
        match self.form[node] {
            Form::Half => space | HALF | (byte / 2),
            _ => space | (byte / 4),
        }
    }

    /// Byte address of a packed value: from SHARED on in the params buffer.
    fn byte_addr(&self, node: usize) -> usize {
        self.off_of[node]
            + match self.pbuf_of[node] {
                Some(off) => SHARED + off as usize,
                None => self.offsets[self.req_of[node].expect("every value has words")],
            }
    }

    /// Word address of arena request `r` (a scratch of f32 words).
    fn scratch(&self, r: usize) -> usize {
        self.offsets[r] / 4
    }
}

/// The step being encoded: the node it computes (for), and that node's dims and elements.
struct Site<'a> {
    g: &'a Graph,
    w: &'a Words<'a>,
    id: NodeId,
    node: usize,
    out_d: Vec<usize>,
    count: usize,
}

impl Site<'_> {
    fn dims(&self, x: usize) -> Result<Vec<usize>> {
        dims(self.g, NodeId(x as u32))
    }

    fn dtype(&self, x: usize) -> DType {
        self.g.shape(NodeId(x as u32)).dtype()
    }

    /// The address of the node's own words.
    fn out(&self) -> u32 {
        self.w.word(self.node) as u32
    }

    fn word(&self, x: usize) -> u32 {
        self.w.word(x) as u32
    }
}

/// Workgroups of `WG` invocations for `count` of them (at most `MAX_GROUPS` along x).
fn groups_1d(count: usize) -> Groups {
    let g = (count as u32).div_ceil(WG).max(1);
    (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1)
}

/// Append the meta words of the step computing `k` for `node` to `meta`; the step's shader
/// (before [`shaders::finish`]) and workgroups.
pub(super) fn encode(
    g: &Graph,
    w: &Words,
    node: usize,
    k: &Kernel,
    meta: &mut Vec<u32>,
) -> Result<(String, Groups)> {
    let id = NodeId(node as u32);
    let out_d = dims(g, id)?;
    let count = out_d.iter().product::<usize>();
    let s = Site {
        g,
        w,
        id,
        node,
        out_d,
        count,
    };
    match k {
        Kernel::Native => {
            let (source, words, invocations) =
                crate::nn::step(g, id, &|x: NodeId| w.word(x.index()) as u32)?;
            meta.extend(words);
            Ok((source, groups_1d(invocations)))
        }
        Kernel::Registered => {
            let k = crate::registered::kernel_for(g, id).ok_or_else(|| Error::Unsupported {
                backend: "wgpu".into(),
                op: g.node(id).op.name().into(),
                node: id,
                msg: "its registered kernel no longer takes these operands".into(),
            })?;
            meta.extend([k.invocations as u32, s.out()]);
            meta.extend(g.node(id).inputs.iter().map(|x| s.word(x.index())));
            meta.extend(k.words);
            Ok((shaders::one_d("i", &k.body), groups_1d(k.invocations)))
        }
        Kernel::Elementwise(e) => elementwise(&s, e, meta),
        Kernel::Movement(m) => movement(&s, m, meta),
        Kernel::Reduction(r) => reduction(&s, r, meta),
        Kernel::MatMul { a, b } => matmul(&s, *a, *b, meta),
        Kernel::QuantKv(q) => quant_kv(&s, q, meta),
    }
}

/// Elementwise bodies and multiply-reduce regions.
fn elementwise(s: &Site, k: &Elementwise, meta: &mut Vec<u32>) -> Result<(String, Groups)> {
    let (out_d, count) = (&s.out_d, s.count);
    match k {
        Elementwise::Map {
            body,
            operands,
            extra,
        } => {
            meta.extend([count as u32, out_d.len() as u32, s.out()]);
            meta.extend(pad(out_d));
            for &x in operands {
                let xd = s.dims(x)?;
                meta.push(s.word(x));
                meta.extend(pad(&broadcast_strides(&xd, out_d)));
            }
            for &e in extra {
                meta.push(s.word(e));
            }
            Ok((
                shaders::elementwise(body).expect("checked by unsupported()"),
                groups_1d(count),
            ))
        }
        Elementwise::MultiplyReduce { body, operands } => {
            let at = meta.len();
            // The reduction walks the dense index space of the reduced value.
            let last = body.node(*body.outputs().first().expect("one output"));
            let Op::Reduce { axes, .. } = &last.op else {
                return Err(Error::Unsupported {
                    backend: "wgpu".into(),
                    op: "fused".into(),
                    node: s.id,
                    msg: "a multiply-reduce region must end in a reduction".into(),
                });
            };
            let pre = body.shape(last.inputs[0]).static_dims().expect("static");
            let ps = dense_strides(&pre);
            let keep: Vec<usize> = (0..pre.len()).filter(|a| !axes.contains(a)).collect();
            let m: usize = axes.iter().map(|&a| pre[a]).product();
            meta.extend([count as u32, m as u32, 0, s.out(), keep.len() as u32]);
            meta.extend(pad(&keep.iter().map(|&a| pre[a]).collect::<Vec<_>>()));
            meta.extend(pad(&keep.iter().map(|&a| ps[a]).collect::<Vec<_>>()));
            meta.push(axes.len() as u32);
            meta.extend(pad(&axes.iter().map(|&a| pre[a]).collect::<Vec<_>>()));
            meta.extend(pad(&axes.iter().map(|&a| ps[a]).collect::<Vec<_>>()));
            debug_assert_eq!(meta.len() - at, shaders::MR_EW);
            meta.push(pre.len() as u32);
            meta.extend(pad(&pre));
            for &x in operands {
                let xd = s.dims(x)?;
                meta.push(s.word(x));
                meta.extend(pad(&broadcast_strides(&xd, &pre)));
            }
            Ok((
                shaders::multiply_reduce(body).expect("checked by unsupported()"),
                groups_1d(count),
            ))
        }
    }
}

/// Strided copies, gathers and scatter-adds.
fn movement(s: &Site, k: &Movement, meta: &mut Vec<u32>) -> Result<(String, Groups)> {
    let count = s.count;
    match k {
        Movement::Copy {
            src,
            src_off,
            src_strides,
            dims,
            dst_off,
            dst_strides,
        } => {
            let c = dims.iter().product::<usize>();
            meta.extend([
                c as u32,
                dims.len() as u32,
                (s.w.word(s.node) + dst_off) as u32,
            ]);
            meta.extend(pad(dims));
            meta.extend(pad(dst_strides));
            meta.push((s.w.word(*src) + src_off) as u32);
            meta.extend(pad(src_strides));
            Ok((shaders::copy(), groups_1d(c)))
        }
        Movement::ScatterAdd { x, idx, u, axis } => {
            let (ud, id_d) = (s.dims(*u)?, s.dims(*idx)?);
            meta.extend([count as u32, s.out_d.len() as u32, s.out()]);
            meta.extend(pad(&s.out_d));
            meta.extend([s.word(*x), s.word(*u)]);
            meta.extend(pad(&dense_strides(&ud)));
            meta.extend([s.word(*idx), id_d[0] as u32, *axis as u32]);
            Ok((
                shaders::scatter_add(s.dtype(*idx) == DType::I32, s.dtype(s.node)),
                groups_1d(count),
            ))
        }
        Movement::Gather { x, idx, axis } => {
            let (mut xd, id_d) = (s.dims(*x)?, s.dims(*idx)?);
            let mut out_d = s.out_d.clone();
            if s.w.form[s.node] == Form::Packed {
                // Packed rows move as words (their byte length is a multiple of 4).
                *xd.last_mut().expect("rank >= 2") /= 4;
                *out_d.last_mut().expect("rank >= 2") /= 4;
            }
            let count: usize = out_d.iter().product();
            let (xs, is) = (dense_strides(&xd), dense_strides(&id_d));
            let ir = id_d.len();
            // Strides over the result's axes: [pre..., idx..., post...].
            let mut x_str = vec![0; out_d.len()];
            let mut i_str = vec![0; out_d.len()];
            x_str[..*axis].copy_from_slice(&xs[..*axis]);
            i_str[*axis..*axis + ir].copy_from_slice(&is[..ir]);
            for a in axis + 1..xd.len() {
                x_str[a - 1 + ir] = xs[a];
            }
            meta.extend([count as u32, out_d.len() as u32, s.out()]);
            meta.extend(pad(&out_d));
            meta.push(s.word(*x));
            meta.extend(pad(&x_str));
            meta.push(s.word(*idx));
            meta.extend(pad(&i_str));
            meta.extend([xs[*axis] as u32, xd[*axis] as u32]);
            Ok((
                shaders::gather(s.dtype(*idx) == DType::I32),
                groups_1d(count),
            ))
        }
    }
}

/// Reductions over axes, softmax, cumsum and top-k.
fn reduction(s: &Site, k: &Reduction, meta: &mut Vec<u32>) -> Result<(String, Groups)> {
    let count = s.count;
    let out = s.dtype(s.node);
    match k {
        Reduction::Reduce { kind, src, axes } => {
            let sd = s.dims(*src)?;
            let ss = dense_strides(&sd);
            let keep: Vec<usize> = (0..sd.len()).filter(|a| !axes.contains(a)).collect();
            let m: usize = axes.iter().map(|&a| sd[a]).product();
            meta.extend([
                count as u32,
                m as u32,
                s.word(*src),
                s.out(),
                keep.len() as u32,
            ]);
            meta.extend(pad(&keep.iter().map(|&a| sd[a]).collect::<Vec<_>>()));
            meta.extend(pad(&keep.iter().map(|&a| ss[a]).collect::<Vec<_>>()));
            meta.push(axes.len() as u32);
            meta.extend(pad(&axes.iter().map(|&a| sd[a]).collect::<Vec<_>>()));
            meta.extend(pad(&axes.iter().map(|&a| ss[a]).collect::<Vec<_>>()));
            if m >= shaders::WIDE_REDUCE {
                // Long rows: a workgroup per result.
                return Ok((
                    shaders::reduce_wide(*kind, out),
                    groups_1d(count * WG as usize),
                ));
            }
            Ok((shaders::reduce(*kind, out), groups_1d(count)))
        }
        Reduction::Softmax { src, axis } => {
            along(s, *src, *axis, meta);
            if s.out_d[*axis] >= shaders::WIDE_ROW {
                // Long rows: a workgroup per row.
                let rows = count / s.out_d[*axis];
                return Ok((shaders::softmax_wide(out), groups_1d(rows * WG as usize)));
            }
            Ok((shaders::softmax(out), groups_1d(count)))
        }
        Reduction::Cumsum { src, axis } => {
            along(s, *src, *axis, meta);
            if s.out_d[*axis] >= shaders::WIDE_ROW {
                let rows = count / s.out_d[*axis];
                return Ok((shaders::cumsum_wide(out), groups_1d(rows * WG as usize)));
            }
            Ok((shaders::cumsum(out), groups_1d(count)))
        }
        Reduction::TopK { x, k, indices } => {
            let xd = s.dims(*x)?;
            let rows: usize = xd[..xd.len().saturating_sub(1)].iter().product();
            meta.extend([
                rows as u32,
                *k as u32,
                *xd.last().unwrap_or(&1) as u32,
                s.word(*x),
                s.out(),
            ]);
            // A workgroup per row.
            Ok((
                shaders::topk(s.dtype(*x), *indices),
                groups_1d(rows * WG as usize),
            ))
        }
    }
}

/// The meta words of a kernel along `axis` of `src` (softmax, cumsum).
fn along(s: &Site, src: usize, axis: usize, meta: &mut Vec<u32>) {
    let ss = dense_strides(&s.out_d);
    meta.extend([
        s.count as u32,
        s.out_d[axis] as u32,
        ss[axis] as u32,
        s.word(src),
        s.out(),
    ]);
}

/// The tiled product (batch axes broadcast).
fn matmul(s: &Site, a: usize, b: usize, meta: &mut Vec<u32>) -> Result<(String, Groups)> {
    let out_d = &s.out_d;
    let (ad, bd) = (s.dims(a)?, s.dims(b)?);
    let r = out_d.len();
    let (m, kk, nn) = (out_d[r - 2], ad[ad.len() - 1], out_d[r - 1]);
    let batch: Vec<usize> = out_d[..r - 2].to_vec();
    let stride_of = |xd: &[usize]| -> Vec<usize> {
        let xb = &xd[..xd.len() - 2];
        let mat = xd[xd.len() - 2] * xd[xd.len() - 1];
        let mut st = broadcast_strides(xb, &batch);
        st.iter_mut().for_each(|v| *v *= mat);
        st
    };
    if batch.len() > 4 {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            op: "matmul".into(),
            node: s.id,
            msg: "more than 4 batch axes".into(),
        });
    }
    let nb: usize = batch.iter().product();
    meta.extend([
        m as u32,
        kk as u32,
        nn as u32,
        s.word(a),
        s.word(b),
        s.out(),
        batch.len() as u32,
    ]);
    let p4 = |v: &[usize]| {
        let mut w: Vec<u32> = v.iter().map(|&x| x as u32).collect();
        w.resize(4, 0);
        w
    };
    meta.extend(p4(&batch));
    meta.extend(p4(&stride_of(&ad)));
    meta.extend(p4(&stride_of(&bd)));
    Ok((
        shaders::matmul(s.dtype(s.node)),
        (
            (nn as u32).div_ceil(TILE).max(1),
            (m as u32).div_ceil(TILE).max(1),
            nb.max(1) as u32,
        ),
    ))
}

/// Activation rounding, GGUF products and rows, and cache writes (cached attention:
/// [`cached_attention`]).
fn quant_kv(s: &Site, k: &QuantKv, meta: &mut Vec<u32>) -> Result<(String, Groups)> {
    let (out_d, count) = (&s.out_d, s.count);
    let out = s.dtype(s.node);
    match k {
        QuantKv::QuantizeActs { x, to, blk } => {
            let elems: usize = s.dims(*x)?.iter().product();
            let blocks = elems / *blk as usize;
            // Blocks of 32 write their sums after the rounded values.
            meta.extend([
                blocks as u32,
                s.word(*x),
                s.w.scratch(*to) as u32,
                (s.w.scratch(*to) + elems) as u32,
            ]);
            Ok((shaders::quantize_acts(*blk), groups_1d(blocks)))
        }
        QuantKv::DequantMatMul {
            x,
            w,
            scheme,
            acts,
            norm,
            add,
            ..
        } => {
            let (xd, wd) = (s.dims(*x)?, s.dims(*w)?);
            let (k, nn) = (*xd.last().unwrap_or(&1), *out_d.last().unwrap_or(&1));
            let rows = count / nn.max(1);
            if norm.is_some() && !shaders::matvec_staged(rows, rows * k) {
                return Err(rlx_ir::Error::Unsupported {
                    backend: "wgpu".into(),
                    op: "norm_matmul".into(),
                    node: s.id,
                    msg: format!("{rows} rows of {k}: too many to normalize in workgroup memory (a lowering bug: the backend takes only those that fit)"),
                });
            }
            let x_at = match acts {
                Some(r) => s.w.scratch(*r),
                None => s.w.word(*x),
            };
            meta.extend([
                rows as u32,
                k as u32,
                nn as u32,
                x_at as u32,
                s.w.byte_addr(*w) as u32,
                *wd.last().unwrap_or(&0) as u32,
                s.out(),
            ]);
            let dec = shaders::gguf_decoder(*scheme).expect("checked by unsupported()");
            if rows <= shaders::QROWS as usize {
                // A few rows (decode): a workgroup per result column, rounding the activations
                // itself where they fit in its memory, else reading them (and the 32-blocks'
                // sums) from the rounding step.
                // Rounding goes by the rows of the last matrix, as on the CPU (`x [B, 1, K]`
                // is B one-row products), the kernel by all rows.
                let staged = shaders::matvec_staged(rows, rows * k);
                let mrows = if xd.len() >= 2 { xd[xd.len() - 2] } else { 1 };
                let round = scheme.act_block(mrows).unwrap_or(0);
                let sums = acts.map_or(0, |r| s.w.scratch(r) + rows * k);
                // Staged, a workgroup takes several columns, so the head stages its
                // activations once per workgroup, not per column.
                let cols = if staged {
                    shaders::matvec_columns(nn, k, s.w.matvec_groups)
                } else {
                    1
                };
                meta.extend([
                    if staged { round as u32 } else { 0 },
                    sums as u32,
                    u32::from(acts.is_some() && round == 32),
                    cols as u32,
                ]);
                // A `norm_matmul` region's norm and residual add (staged: the backend takes
                // only regions whose activations fit).
                match norm {
                    Some((gamma, eps)) => meta.extend([s.word(*gamma), eps.to_bits()]),
                    None => meta.extend([0, 0]),
                }
                match add {
                    Some((x2, to)) => meta.extend([
                        s.word(*x2),
                        match to {
                            SumAt::Value(v) => s.word(*v),
                            SumAt::Scratch(r) => s.w.scratch(*r) as u32,
                        },
                    ]),
                    None => meta.extend([0, 0]),
                }
                let grouped = shaders::group_decoder(*scheme);
                return Ok((
                    shaders::dequant_matvec(
                        dec,
                        grouped,
                        out,
                        shaders::MatvecForm {
                            subgroups: s.w.subgroups,
                            staged,
                            norm: norm.is_some(),
                            add: add.is_some(),
                            one_row: rows == 1,
                        },
                    ),
                    groups_1d(nn.div_ceil(cols) * WG as usize),
                ));
            }
            // Prompts: a workgroup per tile of rows and columns. Activations rounded to
            // 32-blocks (`x [B, 1, K]`: B one-row products) come with their `Q8_1` sums after
            // them, which Q4_1 / Q5_1's offsets multiply.
            let tile = shaders::tile_rows(rows);
            let groups = (
                nn.div_ceil(shaders::TILE_COLS as usize) as u32,
                rows.div_ceil(tile as usize) as u32,
                1,
            );
            let split = shaders::offset_decoder(*scheme);
            match (acts, split) {
                (Some(r), Some(dec)) if scheme.act_block(1) == Some(32) => {
                    meta.push((s.w.scratch(*r) + rows * k) as u32);
                    Ok((shaders::dequant_matmul(&dec, out, true, tile), groups))
                }
                _ => Ok((shaders::dequant_matmul(dec, out, false, tile), groups)),
            }
        }
        QuantKv::DequantizeRows { w, scheme } => {
            let wd = s.dims(*w)?;
            let k = *out_d.last().unwrap_or(&1);
            meta.extend([
                count as u32,
                k as u32,
                *wd.last().unwrap_or(&0) as u32,
                s.w.byte_addr(*w) as u32,
                s.out(),
            ]);
            let dec = shaders::gguf_decoder(*scheme).expect("checked by unsupported()");
            Ok((shaders::dequantize_rows(dec, out), groups_1d(count)))
        }
        QuantKv::CacheWrite { cache, upd, pos } => {
            let (cd, ud) = (s.dims(*cache)?, s.dims(*upd)?);
            let row: usize = cd[1..].iter().product();
            let n_upd: usize = ud.iter().product();
            meta.extend([
                n_upd as u32,
                row.max(1) as u32,
                cd[0] as u32,
                s.word(*cache),
                s.word(*upd),
                s.word(*pos),
            ]);
            Ok((shaders::cache_write(s.dtype(*cache)), groups_1d(n_upd)))
        }
        QuantKv::CachedAttention {
            q,
            k,
            v,
            pos,
            scale,
            window,
            scores,
            step,
        } => cached_attention(s, [*q, *k, *v, *pos], *scale, *window, *scores, *step, meta),
        QuantKv::RopeIntoCache { rope } => {
            let (source, words, invocations) =
                crate::nn::rope_into_cache(s.g, NodeId(*rope as u32), s.id, &|x: NodeId| {
                    s.w.word(x.index()) as u32
                })?;
            meta.extend(words);
            Ok((source, groups_1d(invocations)))
        }
        QuantKv::DecodeAttention {
            q,
            k,
            v,
            pos,
            scale,
            window,
        } => {
            let (qd, kd, vd) = (s.dims(*q)?, s.dims(*k)?, s.dims(*v)?);
            let rows = qd[0] * qd[1];
            meta.extend([
                rows as u32,
                qd[1] as u32,
                qd[2] as u32,
                kd[0] as u32,
                kd[1] as u32,
                s.word(*q),
                s.word(*k),
                s.word(*v),
                s.word(*pos),
                s.out(),
                window.unwrap_or(0) as u32,
                scale.to_bits(),
                vd[2] as u32,
            ]);
            // A workgroup per query row and head.
            let g = (rows as u32).max(1);
            Ok((
                shaders::attention_decode(s.dtype(*k), s.dtype(s.node)),
                (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1),
            ))
        }
    }
}

/// Step `step` of cached attention over operands `[q, k, v, pos]` (see
/// [`QuantKv::CachedAttention`]).
fn cached_attention(
    s: &Site,
    [q, k, v, pos]: [usize; 4],
    scale: f32,
    window: Option<usize>,
    scores: usize,
    step: u8,
    meta: &mut Vec<u32>,
) -> Result<(String, Groups)> {
    let (qd, kd, vd) = (s.dims(q)?, s.dims(k)?, s.dims(v)?);
    let (rows, t) = (qd[0] * qd[1], kd[0]);
    let sc = s.w.scratch(scores) as u32;
    let cache = s.dtype(k);
    Ok(match step {
        0 => {
            meta.extend([
                (rows * t) as u32,
                qd[1] as u32,
                qd[2] as u32,
                t as u32,
                kd[1] as u32,
                s.word(q),
                s.word(k),
                s.word(pos),
                sc,
                window.unwrap_or(0) as u32,
                scale.to_bits(),
            ]);
            (shaders::attention_scores(cache), groups_1d(rows * t))
        }
        1 => {
            meta.extend([rows as u32, t as u32, sc]);
            (
                shaders::attention_weights(cache),
                groups_1d(rows * WG as usize),
            )
        }
        _ => {
            meta.extend([
                s.count as u32,
                qd[1] as u32,
                vd[2] as u32,
                t as u32,
                kd[1] as u32,
                s.word(v),
                sc,
                s.out(),
            ]);
            // A workgroup per query row and head.
            let g = (rows as u32).max(1);
            (
                shaders::attention_values(s.dtype(s.node)),
                (g.min(MAX_GROUPS), g.div_ceil(MAX_GROUPS), 1),
            )
        }
    })
}
