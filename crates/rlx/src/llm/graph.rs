//! The decoder as an RLX graph: one graph per number of new tokens `S`, taking the tokens,
//! their positions and the cache position, and updating per-layer KV-cache params in place.

use super::config::{Arch, LlmConfig};
use rlx_gguf::{GgmlType, GgufFile};
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
}

impl Builder<'_> {
    fn param(&mut self, name: &str) -> Result<NodeId> {
        if let Some(&p) = self.params.get(name) {
            return Ok(p);
        }
        let t = self
            .f
            .require_tensor(name)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let p = self.g.try_param(name, param_shape(t)?)?;
        self.params.insert(name.to_string(), p);
        Ok(p)
    }

    fn has(&self, name: &str) -> bool {
        self.f.tensor(name).is_some()
    }

    /// `x @ W^T (+ b)` for weight `name.weight`.
    fn linear(&mut self, x: NodeId, name: &str) -> Result<NodeId> {
        let wname = format!("{name}.weight");
        let ty = self
            .f
            .require_tensor(&wname)
            .map_err(|e| Error::Invalid(e.to_string()))?
            .ty;
        let w = self.param(&wname)?;
        let y = match scheme_of(ty) {
            Some(s) => self.g.try_dequant_matmul(x, w, s)?,
            None => {
                let wt = self.g.try_transpose(w, &[1, 0])?;
                self.g.try_dot(x, wt)?
            }
        };
        let bname = format!("{name}.bias");
        if self.has(&bname) {
            let b = self.param(&bname)?;
            return self.g.try_add(y, b);
        }
        Ok(y)
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
        let rows = self.g.try_gather(table, tokens, 0)?;
        match scheme_of(ty) {
            Some(s) => self.g.try_dequantize_rows(rows, s),
            None => Ok(rows),
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
    let mut b = Builder {
        g: Graph::new(&format!("{}_step{s}", cfg.arch_name)),
        f,
        params: HashMap::new(),
    };
    let tokens = b.g.try_input("tokens", Shape::new(&[s], DType::I32))?;
    let positions = b.g.try_input("positions", Shape::new(&[s], DType::I32))?;
    let pos = b.g.try_input("pos", Shape::new(&[1], DType::I32))?;
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
        let q = b.linear(h, &p("attn_q"))?;
        let k = b.linear(h, &p("attn_k"))?;
        let v = b.linear(h, &p("attn_v"))?;
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
            b.g.try_param(&kn, Shape::new(&[spec.ctx, hkv, dh], spec.cache_dtype))?;
        let vc =
            b.g.try_param(&vn, Shape::new(&[spec.ctx, hkv, dv], spec.cache_dtype))?;
        let kc = b.g.try_cache_write(kc, k, pos)?;
        let vc = b.g.try_cache_write(vc, v, pos)?;
        // Gemma scales the queries before the (f16) products, llama the scores after them; the
        // two round differently, and RLX follows each model's reference.
        let (q, scale) = if gemma {
            let s = b.g.try_scalar(cfg.attn_scale as f64, DType::F32)?;
            (b.g.try_mul(q, s)?, 1.0)
        } else {
            (q, cfg.attn_scale)
        };
        let a =
            b.g.try_cached_attention(q, kc, vc, pos, scale, cfg.window(l))?;
        let a = b.g.try_reshape(a, &[s, hq * dv])?;
        let mut o = b.linear(a, &p("attn_output"))?;
        if gemma {
            o = b.norm(o, &p("post_attention_norm"), cfg.eps)?;
        }
        x = b.g.try_add(x, o)?;
        let h = b.norm(x, &p("ffn_norm"), cfg.eps)?;
        let gate = b.linear(h, &p("ffn_gate"))?;
        let up = b.linear(h, &p("ffn_up"))?;
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
    if !spec.all_logits && s > 1 {
        x = b.g.try_narrow(x, 0, s - 1, 1)?;
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
