//! The decoder as an RLX graph: one graph per number of new tokens `S`, taking the tokens,
//! their positions and the cache position, and updating per-layer KV-cache params in place.

use super::config::{Arch, LlmConfig};
use rlx_gguf::{GgmlType, GgufFile};
use rlx_ir::ops::{Embedding, Linear, QuantLinear};
use rlx_ir::{Activation, CmpOp, DType, Error, Graph, NodeId, QuantScheme, Result, Shape};
use std::collections::HashMap;

/// The quantization scheme that keeps a tensor of type `ty` packed.
pub fn scheme_of(ty: GgmlType) -> Option<QuantScheme> {
    Some(match ty {
        GgmlType::F16 => QuantScheme::GgufF16,
        GgmlType::BF16 => QuantScheme::GgufBF16,
        GgmlType::Q4_0 => QuantScheme::GgufQ4_0,
        GgmlType::Q4_1 => QuantScheme::GgufQ4_1,
        GgmlType::Q5_0 => QuantScheme::GgufQ5_0,
        GgmlType::Q5_1 => QuantScheme::GgufQ5_1,
        GgmlType::Q8_0 => QuantScheme::GgufQ8_0,
        GgmlType::Q2_K => QuantScheme::GgufQ2K,
        GgmlType::Q3_K => QuantScheme::GgufQ3K,
        GgmlType::Q4_K => QuantScheme::GgufQ4K,
        GgmlType::Q5_K => QuantScheme::GgufQ5K,
        GgmlType::Q6_K => QuantScheme::GgufQ6K,
        GgmlType::Q8_K => QuantScheme::GgufQ8K,
        _ => return None,
    })
}

/// The graph param holding GGUF tensor `t`: f32 tensors as F32 (numpy shape), every other
/// type as its packed bytes `U8 [rows, row_bytes]`.
pub fn param_shape(t: &rlx_gguf::TensorInfo) -> Result<Shape> {
    let shape = t.shape();
    if t.ty == GgmlType::F32 {
        return Ok(Shape::new(&shape, DType::F32));
    }
    if scheme_of(t.ty).is_none() {
        return Err(Error::Invalid(format!(
            "tensor \"{}\" has type {}, which RLX cannot compute with",
            t.name, t.ty
        )));
    }
    let row = *shape.last().unwrap_or(&1);
    let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
    let row_bytes = t.ty.row_bytes(row).ok_or_else(|| {
        Error::Invalid(format!("tensor \"{}\": rows are not whole blocks", t.name))
    })?;
    Ok(Shape::new(&[rows, row_bytes], DType::U8))
}

/// The shape of graph param `name`: a GGUF tensor's [`param_shape`], or, for a name joining
/// tensor names with `+` (weights stacked by `Builder::linears`), their rows stacked (all of one
/// packed type and row length, checked).
pub fn stacked_shape(f: &GgufFile, name: &str) -> Result<Shape> {
    if !name.contains('+') {
        let t = f
            .require_tensor(name)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        return param_shape(t);
    }
    let mut rows = 0;
    let mut first: Option<Shape> = None;
    for part in name.split('+') {
        let t = f
            .require_tensor(part)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let s = param_shape(t)?;
        let dims = s.static_dims().unwrap_or_default();
        if let Some(f0) = &first {
            let d0 = f0.static_dims().unwrap_or_default();
            if s.dtype() != f0.dtype() || dims.len() != 2 || dims.get(1) != d0.get(1) {
                return Err(Error::Invalid(format!(
                    "tensor \"{part}\" cannot be stacked under \"{name}\": {s} against {f0}"
                )));
            }
        }
        rows += dims.first().copied().unwrap_or(0);
        first.get_or_insert(s);
    }
    let s = first.ok_or_else(|| Error::Invalid(format!("empty param name \"{name}\"")))?;
    let dims = s.static_dims().unwrap_or_default();
    Ok(Shape::new(
        &[rows, dims.get(1).copied().unwrap_or(0)],
        s.dtype(),
    ))
}

/// Name of the KV-cache params of layer `l`.
pub fn cache_names(l: usize) -> (String, String) {
    (format!("cache.k.{l}"), format!("cache.v.{l}"))
}

/// What one step graph computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepSpec {
    /// New tokens per run.
    pub tokens: usize,
    /// Logits for every new token (else only the last).
    pub all_logits: bool,
    /// KV-cache rows.
    pub ctx: usize,
    /// Cache element type (F16 like llama.cpp's default, or F32).
    pub cache_dtype: DType,
}

struct Builder<'a> {
    g: Graph,
    f: &'a GgufFile,
    params: HashMap<String, NodeId>,
    /// The rows of the values `linear` takes: a chunk's rows (one product, a GEMM from 8 rows
    /// on), then rows that are each a one-row product.
    rows: (usize, usize),
}

impl Builder<'_> {
    fn param(&mut self, name: &str) -> Result<NodeId> {
        if let Some(&p) = self.params.get(name) {
            return Ok(p);
        }
        let p = self.g.try_param(name, stacked_shape(self.f, name)?)?;
        self.params.insert(name.to_string(), p);
        Ok(p)
    }

    fn has(&self, name: &str) -> bool {
        self.f.tensor(name).is_some()
    }

    /// Rows stacked along axis 0 (one part as it is).
    fn concat_rows(&mut self, parts: &[NodeId]) -> Result<NodeId> {
        match parts {
            [one] => Ok(*one),
            _ => self.g.try_concat(parts, 0),
        }
    }

    /// `x @ W^T (+ b)` for weight `name.weight`, on rows laid out as [`Builder::rows`] says:
    /// the chunk's rows as one product, each further row as its own (`[D, 1, K]`), so every row
    /// gets the kernel a step of its own size would give it.
    fn linear(&mut self, x: NodeId, name: &str) -> Result<NodeId> {
        let (np, nd) = self.rows;
        if nd == 0 {
            return self.linear_rows(x, name);
        }
        self.split_rows(x, np, nd, |b, x| b.linear_rows(x, name))
    }

    /// `f` over the chunk's rows and, as one-row products, over the decode rows (see
    /// [`Builder::rows`]), the results stacked.
    fn split_rows(
        &mut self,
        x: NodeId,
        np: usize,
        nd: usize,
        mut f: impl FnMut(&mut Self, NodeId) -> Result<NodeId>,
    ) -> Result<NodeId> {
        let k = *self
            .g
            .shape(x)
            .static_dims()
            .unwrap_or_default()
            .last()
            .unwrap_or(&0);
        let mut parts = Vec::new();
        if np > 0 {
            let xp = self.g.try_narrow(x, 0, 0, np)?;
            parts.push(f(self, xp)?);
        }
        let xd = if np > 0 {
            self.g.try_narrow(x, 0, np, nd)?
        } else {
            x
        };
        let xd = self.g.try_reshape(xd, &[nd, 1, k])?;
        let yd = f(self, xd)?;
        let n = *self
            .g
            .shape(yd)
            .static_dims()
            .unwrap_or_default()
            .last()
            .unwrap_or(&0);
        parts.push(self.g.try_reshape(yd, &[nd, n])?);
        self.concat_rows(&parts)
    }

    fn linear_rows(&mut self, x: NodeId, name: &str) -> Result<NodeId> {
        let wname = format!("{name}.weight");
        let ty = self
            .f
            .require_tensor(&wname)
            .map_err(|e| Error::Invalid(e.to_string()))?
            .ty;
        let w = self.param(&wname)?;
        // HIR blocks, lowered by the compiler to exactly `dequant_matmul` / `dot`.
        let y = match scheme_of(ty) {
            Some(scheme) => self.g.define(QuantLinear { scheme }, &[x, w])?,
            None => {
                let wt = self.g.try_transpose(w, &[1, 0])?;
                self.g.define(Linear, &[x, wt])?
            }
        };
        let bname = format!("{name}.bias");
        if self.has(&bname) {
            let b = self.param(&bname)?;
            return self.g.try_add(y, b);
        }
        Ok(y)
    }

    /// [`Builder::linear`] for weights that share their input (a layer's query, key and value
    /// projections; its gate and up projections). When they are all of one packed type with
    /// rows of one length, they are one param — their rows stacked, named `a.weight+b.weight`
    /// ([`stacked_shape`], loaded by `load_weights`) — and one product whose columns are then
    /// split: every output is the same dot product of the same rows, so the same bits, while
    /// the input is quantized and the product dispatched once rather than once per weight.
    fn linears<const N: usize>(&mut self, x: NodeId, names: [&str; N]) -> Result<[NodeId; N]> {
        let ws = names.map(|n| format!("{n}.weight"));
        let info = |w: &String| {
            self.f
                .require_tensor(w)
                .map(|t| (t.ty, t.shape().last().copied(), t.shape()[0..].to_vec()))
                .map_err(|e| Error::Invalid(e.to_string()))
        };
        let first = info(&ws[0])?;
        let mut rows = [0usize; N];
        let mut stack = N > 1 && first.0 != GgmlType::F32 && scheme_of(first.0).is_some();
        for (i, w) in ws.iter().enumerate() {
            let (ty, k, shape) = info(w)?;
            stack &= ty == first.0 && k == first.1 && shape.len() == 2;
            rows[i] = shape.first().copied().unwrap_or(0);
        }
        if !stack {
            let mut out = [x; N];
            for (o, n) in out.iter_mut().zip(names) {
                *o = self.linear(x, n)?;
            }
            return Ok(out);
        }
        let scheme = scheme_of(first.0).expect("checked above");
        let w = self.param(&ws.join("+"))?;
        let (np, nd) = self.rows;
        let y = if nd == 0 {
            self.g.define(QuantLinear { scheme }, &[x, w])?
        } else {
            self.split_rows(x, np, nd, |b, x| {
                b.g.define(QuantLinear { scheme }, &[x, w])
            })?
        };
        let axis = self.g.shape(y).rank() - 1;
        let mut out = [y; N];
        let mut at = 0;
        for ((o, n), r) in out.iter_mut().zip(names).zip(rows) {
            *o = self.g.try_narrow(y, axis, at, r)?;
            at += r;
            let bname = format!("{n}.bias");
            if self.has(&bname) {
                let b = self.param(&bname)?;
                *o = self.g.try_add(*o, b)?;
            }
        }
        Ok(out)
    }

    fn norm(&mut self, x: NodeId, name: &str, eps: f32) -> Result<NodeId> {
        let w = self.param(&format!("{name}.weight"))?;
        self.g.try_rms_norm(x, w, eps)
    }

    /// GELU (tanh form) as llama.cpp computes it on f32 activations: the input rounded to f16
    /// and looked up in a table of f16 results (RLX's f16 GeluApprox is that table), except that
    /// inputs of 10 and more pass through unchanged.
    fn gelu_like_llama_cpp(&mut self, x: NodeId) -> Result<NodeId> {
        let h = self.g.try_cast(x, DType::F16)?;
        let h = self.g.try_activation(Activation::GeluApprox, h)?;
        let y = self.g.try_cast(h, DType::F32)?;
        let ten = self.g.try_scalar(10.0, DType::F32)?;
        let big = self.g.try_compare(CmpOp::Ge, x, ten)?;
        self.g.try_select(big, x, y)
    }

    /// Rows `tokens` of the embedding table, as f32.
    fn embed(&mut self, tokens: NodeId) -> Result<NodeId> {
        let name = "token_embd.weight";
        let ty = self
            .f
            .require_tensor(name)
            .map_err(|e| Error::Invalid(e.to_string()))?
            .ty;
        let table = self.param(name)?;
        let rows = self.g.define(Embedding, &[table, tokens])?;
        match scheme_of(ty) {
            Some(s) => self.g.try_dequantize_rows(rows, s),
            None => Ok(rows),
        }
    }
}

/// What one run of the paged (serving) graph holds: `prefill` prompt rows in `pieces` pieces,
/// each a run of consecutive tokens of its own sequence (0 rows: none), followed by `decode`
/// rows, each the next token of its own sequence, over a paged cache of `blocks` blocks of
/// `block` rows, every sequence's table `max_blocks` long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchSpec {
    /// Prompt rows, all pieces together. Each piece is computed as the chunk of `rlx generate`
    /// holding it computes it, provided a step with several pieces has none shorter than
    /// [`QuantScheme::ROUNDED_ACTS_BELOW`](rlx_ir::QuantScheme::ROUNDED_ACTS_BELOW) rows (their
    /// products share one matrix product, whose rows then do not depend on each other).
    pub prefill: usize,
    /// Prompt pieces (sequences) among the `prefill` rows; their last rows are the input
    /// `last_rows`. 0 when `prefill` is.
    pub pieces: usize,
    /// Decode rows (each computed as a one-token step computes it).
    pub decode: usize,
    /// Blocks in the cache pool.
    pub blocks: usize,
    /// Rows per block.
    pub block: usize,
    /// Block-table length (the longest sequence is `max_blocks * block` tokens).
    pub max_blocks: usize,
    /// Cache element type.
    pub cache_dtype: DType,
}

/// How a run's rows are laid out and where their cache is.
enum Layout {
    /// One chunk of one sequence over a contiguous cache: inputs `tokens`, `positions`, `pos`.
    Contiguous(StepSpec),
    /// A prompt chunk and decode rows over the paged cache: inputs `tokens`, `positions`,
    /// `slots I32 [N]` (each row's cache row) and `table I32 [N, max_blocks]`.
    Paged(BatchSpec),
}

impl Layout {
    /// Rows of the prompt chunk and decode rows.
    fn rows(&self) -> (usize, usize) {
        match self {
            Layout::Contiguous(s) => (s.tokens, 0),
            Layout::Paged(b) => (b.prefill, b.decode),
        }
    }
}

/// Build the graph that feeds `spec.tokens` new tokens: inputs `tokens I32 [S]`,
/// `positions I32 [S]` and `pos I32 [1]` (the cache row of the first new token); output the
/// logits `[S or 1, vocab]`.
pub fn build_step(cfg: &LlmConfig, f: &GgufFile, spec: StepSpec) -> Result<Graph> {
    let s = spec.tokens;
    if s == 0 || s > spec.ctx {
        return Err(Error::Invalid(format!(
            "a step takes 1..={} tokens, got {s}",
            spec.ctx
        )));
    }
    build(cfg, f, Layout::Contiguous(spec))
}

/// Build the paged graph of one serving step (see [`BatchSpec`]): inputs `tokens I32 [N]`,
/// `positions I32 [N]`, `slots I32 [N]`, `table I32 [N, max_blocks]` (N = prefill + decode,
/// the prompt pieces first) and, when there are prompt rows, `last_rows I32 [pieces]` (the row
/// ending each piece); output the logits of each piece's last row and of every decode row,
/// `[pieces + decode, vocab]`. Every row is computed with the
/// kernels and float order of the `rlx generate` step that would compute it, so a sequence's
/// tokens do not depend on what runs beside it.
pub fn build_batch(cfg: &LlmConfig, f: &GgufFile, spec: BatchSpec) -> Result<Graph> {
    if spec.prefill + spec.decode == 0 || spec.block == 0 || spec.max_blocks == 0 {
        return Err(Error::Invalid(format!(
            "a serving step needs rows, blocks and a table: {spec:?}"
        )));
    }
    if (spec.prefill == 0) != (spec.pieces == 0) || spec.pieces > spec.prefill {
        return Err(Error::Invalid(format!(
            "a serving step's prompt rows come in 1..=prefill pieces: {spec:?}"
        )));
    }
    build(cfg, f, Layout::Paged(spec))
}

fn build(cfg: &LlmConfig, f: &GgufFile, layout: Layout) -> Result<Graph> {
    let (np, nd) = layout.rows();
    let s = np + nd;
    let name = match &layout {
        Layout::Contiguous(_) => format!("{}_step{s}", cfg.arch_name),
        Layout::Paged(_) => format!("{}_batch{np}p{nd}d", cfg.arch_name),
    };
    let mut b = Builder {
        g: Graph::new(&name),
        f,
        params: HashMap::new(),
        rows: (np, nd),
    };
    let tokens = b.g.try_input("tokens", Shape::new(&[s], DType::I32))?;
    let positions = b.g.try_input("positions", Shape::new(&[s], DType::I32))?;
    let (kv_rows, cache_dtype) = match &layout {
        Layout::Contiguous(spec) => (spec.ctx, spec.cache_dtype),
        Layout::Paged(p) => (p.blocks * p.block, p.cache_dtype),
    };
    // Where rows are written: the position of the first (contiguous) or one slot per row.
    let at = match &layout {
        Layout::Contiguous(_) => b.g.try_input("pos", Shape::new(&[1], DType::I32))?,
        Layout::Paged(_) => b.g.try_input("slots", Shape::new(&[s], DType::I32))?,
    };
    let table = match &layout {
        Layout::Contiguous(_) => None,
        Layout::Paged(p) => {
            Some(b.g.try_input("table", Shape::new(&[s, p.max_blocks], DType::I32))?)
        }
    };
    let (hq, hkv, dh, dv) = (cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.v_head_dim);
    let gemma = cfg.arch == Arch::Gemma3;
    let mut x = b.embed(tokens)?;
    if gemma {
        let scale = b.g.try_scalar((cfg.n_embd as f64).sqrt(), DType::F32)?;
        x = b.g.try_mul(x, scale)?;
    }
    for l in 0..cfg.n_layer {
        let p = |n: &str| format!("blk.{l}.{n}");
        let h = b.norm(x, &p("attn_norm"), cfg.eps)?;
        let [q, k, v] = b.linears(h, [&p("attn_q"), &p("attn_k"), &p("attn_v")])?;
        let mut q = b.g.try_reshape(q, &[s, hq, dh])?;
        let mut k = b.g.try_reshape(k, &[s, hkv, dh])?;
        let v = b.g.try_reshape(v, &[s, hkv, dv])?;
        if gemma {
            q = b.norm(q, &p("attn_q_norm"), cfg.eps)?;
            k = b.norm(k, &p("attn_k_norm"), cfg.eps)?;
        }
        // RoPE works on [..., S, D]: rotate with heads in front, then put S back first.
        let rope = |b: &mut Builder, t: NodeId| -> Result<NodeId> {
            let th = b.g.try_transpose(t, &[1, 0, 2])?;
            let r =
                b.g.try_rope(th, positions, cfg.rope_base(l), cfg.rope_interleaved)?;
            b.g.try_transpose(r, &[1, 0, 2])
        };
        let q = rope(&mut b, q)?;
        let k = rope(&mut b, k)?;
        let (kn, vn) = cache_names(l);
        let kc =
            b.g.try_param(&kn, Shape::new(&[kv_rows, hkv, dh], cache_dtype))?;
        let vc =
            b.g.try_param(&vn, Shape::new(&[kv_rows, hkv, dv], cache_dtype))?;
        let kc = b.g.try_cache_write(kc, k, at)?;
        let vc = b.g.try_cache_write(vc, v, at)?;
        // Gemma scales the queries before the (f16) products, llama the scores after them; the
        // two round differently, and RLX follows each model's reference.
        let (q, scale) = if gemma {
            let s = b.g.try_scalar(cfg.attn_scale as f64, DType::F32)?;
            (b.g.try_mul(q, s)?, 1.0)
        } else {
            (q, cfg.attn_scale)
        };
        let a = match (&layout, table) {
            (Layout::Paged(spec), Some(table)) => {
                // The chunk and the decode rows attend separately, each as its own step would.
                let mut parts = Vec::new();
                for (from, len) in [(0, np), (np, nd)] {
                    if len == 0 {
                        continue;
                    }
                    let rows = |b: &mut Builder, t: NodeId| b.g.try_narrow(t, 0, from, len);
                    let (qr, pr, tr) = (
                        rows(&mut b, q)?,
                        rows(&mut b, positions)?,
                        rows(&mut b, table)?,
                    );
                    parts.push(b.g.try_paged_attention(
                        qr,
                        kc,
                        vc,
                        pr,
                        tr,
                        scale,
                        cfg.window(l),
                        spec.block,
                    )?);
                }
                b.concat_rows(&parts)?
            }
            _ => {
                b.g.try_cached_attention(q, kc, vc, at, scale, cfg.window(l))?
            }
        };
        let a = b.g.try_reshape(a, &[s, hq * dv])?;
        let mut o = b.linear(a, &p("attn_output"))?;
        if gemma {
            o = b.norm(o, &p("post_attention_norm"), cfg.eps)?;
        }
        x = b.g.try_add(x, o)?;
        let h = b.norm(x, &p("ffn_norm"), cfg.eps)?;
        let [gate, up] = b.linears(h, [&p("ffn_gate"), &p("ffn_up")])?;
        let gate = if gemma {
            b.gelu_like_llama_cpp(gate)?
        } else {
            b.g.try_activation(Activation::Silu, gate)?
        };
        let hidden = b.g.try_mul(gate, up)?;
        let mut d = b.linear(hidden, &p("ffn_down"))?;
        if gemma {
            d = b.norm(d, &p("post_ffw_norm"), cfg.eps)?;
        }
        x = b.g.try_add(x, d)?;
    }
    // The rows whose logits are wanted: a chunk's last (unless all are asked for) and every
    // decode row, each a one-row product as a one-token step computes it.
    match &layout {
        Layout::Contiguous(spec) => {
            if !spec.all_logits && s > 1 {
                x = b.g.try_narrow(x, 0, s - 1, 1)?;
            }
        }
        Layout::Paged(spec) => {
            let mut rows = Vec::new();
            if np > 0 {
                let last =
                    b.g.try_input("last_rows", Shape::new(&[spec.pieces], DType::I32))?;
                let prompt = b.g.try_narrow(x, 0, 0, np)?;
                rows.push(b.g.try_gather(prompt, last, 0)?);
            }
            if nd > 0 {
                rows.push(b.g.try_narrow(x, 0, np, nd)?);
            }
            x = b.concat_rows(&rows)?;
            b.rows = (0, spec.pieces + nd);
        }
    }
    let x = b.norm(x, "output_norm", cfg.eps)?;
    let head = if b.has("output.weight") {
        "output"
    } else {
        "token_embd"
    };
    let logits = b.linear(x, head)?;
    b.g.set_outputs(vec![logits]);
    Ok(b.g)
}
