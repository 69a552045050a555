//! Mixed precision: a pass that moves chosen ops of an f32 graph to bf16 or f16, as PyTorch's
//! autocast and JAX's precision policies do, by inserting casts around them.
//!
//! Each op belongs to an [`OpClass`]; a [`PrecisionPolicy`] says which classes compute in the
//! low precision. [`PrecisionPolicy::AutoMixedBf16`] (and [`PrecisionPolicy::AutoMixed`], f16)
//! runs the matrix products (attention's included) in low precision and keeps everything numerically sensitive (exp /
//! log, reductions, norms, softmax and so losses, which are built from them) and all other
//! arithmetic in f32; ops that only move data follow their operand, so a product feeding another
//! through reshapes and transposes needs no cast between them. Inputs and outputs keep their
//! declared dtypes. A param read only through casts to one low dtype is stored in it (the
//! conversion happens once, when the param is set) unless it is listed in
//! [`AutoMixedPrecision::keep_params`] (params a training step updates keep their f32 master
//! copy and are cast at each step).
//!
//! The low-precision products accumulate in f32 and round their result once (the CPU's bf16
//! GEMM; its bf16 attention takes the softmax in f32 and rounds the probabilities to bf16 for
//! the second product, as flash-attention kernels do); a backend without a fast kernel for a low dtype still runs it (more slowly).

use crate::Pass;
use rlx_ir::{DType, Error, Graph, NodeId, Op, OpKind, Result, Shape};
use std::collections::HashMap;

/// A floating-point precision an op may compute in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Precision {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (range to 65504: products of large values can overflow).
    F16,
    /// bfloat16 (f32's range, 8 significant bits).
    Bf16,
}

impl Precision {
    /// The dtype of values in this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// Its name as the text form and the command line spell it (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        }
    }
}

pub use rlx_ir::ops::OpClass;

/// The class of `op`.
pub fn op_class(op: &Op) -> OpClass {
    use rlx_ir::{Activation as A, BinaryOp as B};
    match op {
        Op::MatMul | Op::DotGeneral(_) | Op::Conv(_) | Op::Attention { .. } => OpClass::Product,
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Concat { .. }
        | Op::Expand { .. }
        | Op::Gather { .. }
        | Op::TopK { .. } => OpClass::Movement,
        Op::Binary(B::Pow)
        | Op::Activation(A::Exp | A::Log | A::Rsqrt | A::Tan)
        | Op::Reduce { .. }
        | Op::Cumsum { .. }
        | Op::ScatterAdd { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Pool(_) => OpClass::Sensitive,
        Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Activation(_) | Op::Rope { .. } => {
            OpClass::Elementwise
        }
        Op::Input { .. }
        | Op::Param { .. }
        | Op::Constant { .. }
        | Op::Cast { .. }
        | Op::Custom(_)
        | Op::DequantMatMul { .. }
        | Op::DequantizeRows { .. }
        | Op::CacheWrite
        | Op::CachedAttention { .. }
        | Op::PagedAttention { .. }
        | Op::Fused(_) => OpClass::Fixed,
        Op::Defined(d) => d.def().precision_class(),
    }
}

/// A policy of [`PrecisionPolicy::Custom`]: which op kinds compute in `low`; movement ops follow
/// their operand, everything else stays f32.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomPrecision {
    /// The low precision.
    pub low: Precision,
    /// The op kinds that compute in it.
    pub ops: Vec<OpKind>,
}

/// Which precision each op of a graph computes in. Chosen with `Session::with_precision`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrecisionPolicy {
    /// Every op as the graph declares it (the default).
    #[default]
    AlwaysF32,
    /// Every f32 op but the fixed ones in f16.
    AlwaysF16,
    /// Every f32 op but the fixed ones in bf16.
    AlwaysBf16,
    /// Products in f16, sensitive and other arithmetic in f32, movement following.
    AutoMixed,
    /// Products in bf16, sensitive and other arithmetic in f32, movement following.
    AutoMixedBf16,
    /// Listed op kinds in a low precision, movement following, the rest f32.
    Custom(CustomPrecision),
}

/// What a policy does with one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Compute in this low dtype (f32 operands cast to it).
    Low(DType),
    /// Compute in the declared dtypes.
    Declared,
    /// Take the operands as they come (declared dtypes where they disagree).
    Follow,
}

impl PrecisionPolicy {
    /// The policy's name (`always_f32`, `auto_mixed_bf16`, `custom`, ...), for reports and
    /// cache keys.
    pub fn name(&self) -> &'static str {
        match self {
            PrecisionPolicy::AlwaysF32 => "always_f32",
            PrecisionPolicy::AlwaysF16 => "always_f16",
            PrecisionPolicy::AlwaysBf16 => "always_bf16",
            PrecisionPolicy::AutoMixed => "auto_mixed",
            PrecisionPolicy::AutoMixedBf16 => "auto_mixed_bf16",
            PrecisionPolicy::Custom(_) => "custom",
        }
    }

    /// Parse a policy name as [`PrecisionPolicy::name`] gives it (also `f32`, `f16`, `bf16`,
    /// `mixed`, `mixed-bf16`); `custom` needs its lists and is not parsed.
    pub fn from_name(name: &str) -> Option<PrecisionPolicy> {
        Some(match name.to_ascii_lowercase().replace('-', "_").as_str() {
            "always_f32" | "f32" => PrecisionPolicy::AlwaysF32,
            "always_f16" | "f16" => PrecisionPolicy::AlwaysF16,
            "always_bf16" | "bf16" => PrecisionPolicy::AlwaysBf16,
            "auto_mixed" | "mixed" | "mixed_f16" => PrecisionPolicy::AutoMixed,
            "auto_mixed_bf16" | "mixed_bf16" => PrecisionPolicy::AutoMixedBf16,
            _ => return None,
        })
    }

    /// Whether the policy leaves every graph as it is.
    pub fn is_identity(&self) -> bool {
        *self == PrecisionPolicy::AlwaysF32
    }

    fn want(&self, op: &Op) -> Want {
        let class = op_class(op);
        if class == OpClass::Fixed {
            return Want::Declared;
        }
        let mixed = |low: Precision| match class {
            OpClass::Product => Want::Low(low.dtype()),
            OpClass::Movement => Want::Follow,
            _ => Want::Declared,
        };
        match self {
            PrecisionPolicy::AlwaysF32 => Want::Declared,
            PrecisionPolicy::AlwaysF16 => Want::Low(DType::F16),
            PrecisionPolicy::AlwaysBf16 => Want::Low(DType::BF16),
            PrecisionPolicy::AutoMixed => mixed(Precision::F16),
            PrecisionPolicy::AutoMixedBf16 => mixed(Precision::Bf16),
            PrecisionPolicy::Custom(c) => {
                if c.ops.contains(&op.kind()) && c.low != Precision::F32 {
                    Want::Low(c.low.dtype())
                } else if class == OpClass::Movement {
                    Want::Follow
                } else {
                    Want::Declared
                }
            }
        }
    }
}

/// The pass: rewrites a graph as its [`PrecisionPolicy`] says.
#[derive(Clone, Debug, Default)]
pub struct AutoMixedPrecision {
    /// The policy.
    pub policy: PrecisionPolicy,
    /// Params kept in their declared dtype even when every reader casts them (the ones a
    /// training step updates).
    pub keep_params: Vec<String>,
}

impl Pass for AutoMixedPrecision {
    fn name(&self) -> &str {
        "precision"
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        if self.policy.is_identity() {
            return Ok((g.clone(), 0));
        }
        let (out, changed) = apply(g, &self.policy)?;
        if changed == 0 {
            return Ok((g.clone(), 0));
        }
        let (out, stored) = store_params_low(&out, &self.keep_params)?;
        Ok((out, changed + stored))
    }
}

/// The graph being rebuilt: new ids of old nodes, and casts already made.
struct Rebuild {
    out: Graph,
    casts: HashMap<(NodeId, DType), NodeId>,
}

impl Rebuild {
    /// `x` (a new node) as `dt`, through one shared cast. A transpose, reshape, narrow or
    /// expand is cast through its operand instead (`transpose(cast(y))`): the cast then reads
    /// dense data once (a backend's views stay views, and a backend that fuses elementwise ops
    /// rounds `y` as it computes it) and is shared with every other reader of `y`, such as a
    /// forward product and the backward product that reads its operand transposed, or the
    /// query, key and value slices of one projection.
    fn cast(&mut self, x: NodeId, dt: DType) -> Result<NodeId> {
        if self.out.shape(x).dtype() == dt {
            return Ok(x);
        }
        if let Some(&c) = self.casts.get(&(x, dt)) {
            return Ok(c);
        }
        let n = self.out.node(x);
        let c = if matches!(
            n.op,
            Op::Transpose { .. } | Op::Reshape { .. } | Op::Narrow { .. } | Op::Expand { .. }
        ) {
            let (op, y) = (n.op.clone(), n.inputs[0]);
            let inner = self.cast(y, dt)?;
            self.out.try_op(op, &[inner])?
        } else {
            self.out.try_cast(x, dt)?
        };
        self.casts.insert((x, dt), c);
        Ok(c)
    }
}

/// Rebuild `g` under `policy`; returns the graph and how many ops changed precision.
fn apply(g: &Graph, policy: &PrecisionPolicy) -> Result<(Graph, usize)> {
    let mut r = Rebuild {
        out: Graph::new(g.name()),
        casts: HashMap::new(),
    };
    let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
    let mut changed = 0;
    for id in g.ids() {
        let n = g.node(id);
        if n.inputs.is_empty() {
            map.push(
                r.out
                    .push_unchecked(n.op.clone(), Vec::new(), n.shape.clone()),
            );
            continue;
        }
        let declared: Vec<DType> = n.inputs.iter().map(|&i| g.shape(i).dtype()).collect();
        let current: Vec<NodeId> = n.inputs.iter().map(|&i| map[i.index()]).collect();
        let want = match policy.want(&n.op) {
            // Only ops computing in f32 move to a low precision.
            Want::Low(dt) if n.shape.dtype() == DType::F32 && declared.contains(&DType::F32) => {
                Want::Low(dt)
            }
            Want::Low(_) => Want::Declared,
            w => w,
        };
        let built = match want {
            Want::Low(dt) => {
                let mut ins = Vec::with_capacity(current.len());
                for (&x, &d) in current.iter().zip(&declared) {
                    ins.push(r.cast(x, if d == DType::F32 { dt } else { d })?);
                }
                // An op that does not take the low dtype (say, an integer operand it must
                // match) computes as declared.
                let mark = r.out.len();
                match r.out.try_op(n.op.clone(), &ins) {
                    Ok(y) => {
                        changed += 1;
                        Some(y)
                    }
                    Err(_) => {
                        r.out.split_off(mark);
                        None
                    }
                }
            }
            Want::Follow => {
                let floats: Vec<DType> = current
                    .iter()
                    .zip(&declared)
                    .filter(|(_, d)| d.is_float())
                    .map(|(&x, _)| r.out.shape(x).dtype())
                    .collect();
                let agree = floats.windows(2).all(|w| w[0] == w[1]);
                let moved = current
                    .iter()
                    .zip(&declared)
                    .any(|(&x, &d)| r.out.shape(x).dtype() != d);
                if agree && moved {
                    let mark = r.out.len();
                    match r.out.try_op(n.op.clone(), &current) {
                        Ok(y) => Some(y),
                        Err(_) => {
                            r.out.split_off(mark);
                            None
                        }
                    }
                } else {
                    None
                }
            }
            Want::Declared => None,
        };
        let y = match built {
            Some(y) => y,
            None => {
                let mut ins = Vec::with_capacity(current.len());
                for (&x, &d) in current.iter().zip(&declared) {
                    ins.push(r.cast(x, d)?);
                }
                r.out.push_unchecked(n.op.clone(), ins, n.shape.clone())
            }
        };
        map.push(y);
    }
    let mut outs = Vec::with_capacity(g.outputs().len());
    for &o in g.outputs() {
        let dt = g.shape(o).dtype();
        outs.push(r.cast(map[o.index()], dt)?);
    }
    r.out.set_outputs_unchecked(outs);
    Ok((r.out, changed))
}

/// Params (not in `keep`) read only by casts to one dtype, and not outputs, are stored in that
/// dtype: the casts disappear and the param is converted once, when it is set.
fn store_params_low(g: &Graph, keep: &[String]) -> Result<(Graph, usize)> {
    let mut target: Vec<Option<DType>> = vec![None; g.len()];
    let mut ok = vec![true; g.len()];
    for &o in g.outputs() {
        ok[o.index()] = false;
    }
    for id in g.ids() {
        let n = g.node(id);
        for &i in &n.inputs {
            if !matches!(g.node(i).op, Op::Param { .. }) {
                continue;
            }
            match n.op {
                Op::Cast { to } if to.is_float() && to.size_bytes() < 4 => {
                    let t = &mut target[i.index()];
                    ok[i.index()] &= t.is_none_or(|d| d == to);
                    *t = Some(to);
                }
                _ => ok[i.index()] = false,
            }
        }
    }
    let low = |id: NodeId| -> Option<DType> {
        let n = g.node(id);
        match &n.op {
            Op::Param { name }
                if ok[id.index()]
                    && n.shape.dtype() == DType::F32
                    && !keep.iter().any(|k| k == name) =>
            {
                target[id.index()]
            }
            _ => None,
        }
    };
    if !g.ids().any(|id| low(id).is_some()) {
        return Ok((g.clone(), 0));
    }
    let mut out = Graph::new(g.name());
    let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
    let mut stored = 0;
    for id in g.ids() {
        let n = g.node(id);
        if let Some(dt) = low(id) {
            let dims = n.shape.static_dims().ok_or_else(|| {
                Error::Invalid(format!("param {id} of dynamic shape {}", n.shape))
            })?;
            map.push(out.push_unchecked(n.op.clone(), Vec::new(), Shape::new(&dims, dt)));
            stored += 1;
            continue;
        }
        if matches!(n.op, Op::Cast { .. }) && low(n.inputs[0]).is_some() {
            map.push(map[n.inputs[0].index()]);
            continue;
        }
        let ins = n.inputs.iter().map(|i| map[i.index()]).collect();
        map.push(out.push_unchecked(n.op.clone(), ins, n.shape.clone()));
    }
    out.set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
    Ok((out, stored))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_ir::{Activation, ReduceKind};

    fn mlp() -> Graph {
        let mut g = Graph::new("mlp");
        let x = g.input("x", Shape::new(&[4, 8], DType::F32));
        let w = g.param("w", Shape::new(&[8, 6], DType::F32));
        let b = g.param("b", Shape::new(&[6], DType::F32));
        let h = g.dot(x, w);
        let h = g.add(h, b);
        let h = g.activation(Activation::Gelu, h);
        let t = g.transpose(h, &[1, 0]);
        let s = g.dot(t, h);
        let s = g.reduce(ReduceKind::Sum, s, &[1], false);
        g.set_outputs(vec![s]);
        g
    }

    fn dtypes(g: &Graph, kind: OpKind) -> Vec<DType> {
        g.ids()
            .filter(|&i| g.node(i).op.kind() == kind)
            .map(|i| g.shape(i).dtype())
            .collect()
    }

    #[test]
    fn auto_mixed_runs_products_low_and_the_rest_as_declared() {
        let g = mlp();
        let pass = AutoMixedPrecision {
            policy: PrecisionPolicy::AutoMixedBf16,
            keep_params: vec![],
        };
        let (out, n) = pass.run(&g).unwrap();
        rlx_ir::verify(&out).unwrap();
        assert!(n >= 2);
        assert_eq!(dtypes(&out, OpKind::MatMul), vec![DType::BF16; 2]);
        assert_eq!(dtypes(&out, OpKind::Add), vec![DType::F32]);
        assert_eq!(dtypes(&out, OpKind::Reduce), vec![DType::F32]);
        // The second product reads the GELU (f32) transposed: the GELU is cast once, before
        // the transpose, and the transpose reads the bf16 copy.
        assert_eq!(dtypes(&out, OpKind::Cast).len(), 4, "{out}");
        let (out_dce, _) = crate::DeadCodeElimination.run(&out).unwrap();
        assert_eq!(dtypes(&out_dce, OpKind::Transpose), vec![DType::BF16]);
        // `w` is read only by its cast: stored in bf16. `b` is not cast: f32.
        let w = out.find_leaf("w").unwrap();
        assert_eq!(out.shape(w).dtype(), DType::BF16);
        assert_eq!(out.shape(out.find_leaf("b").unwrap()).dtype(), DType::F32);
        assert_eq!(out.shape(out.outputs()[0]).dtype(), DType::F32);
        // Kept params keep their dtype and are cast instead.
        let keep = AutoMixedPrecision {
            policy: PrecisionPolicy::AutoMixedBf16,
            keep_params: vec!["w".into()],
        };
        let (out, _) = keep.run(&g).unwrap();
        assert_eq!(out.shape(out.find_leaf("w").unwrap()).dtype(), DType::F32);
        // A second run changes nothing.
        let (again, n) = pass.run(&pass.run(&g).unwrap().0).unwrap();
        assert_eq!(n, 0);
        assert_eq!(again.to_string(), pass.run(&g).unwrap().0.to_string());
    }

    /// An encoder's attention block: one projection split into query, key and value by
    /// narrows, attention with an additive mask, an output projection.
    #[test]
    fn auto_mixed_runs_attention_low_and_casts_a_projection_once() {
        let mut g = Graph::new("attention");
        let x = g.input("x", Shape::new(&[6, 8], DType::F32));
        let mask = g.input("mask", Shape::new(&[1, 1, 1, 6], DType::F32));
        let w = g.param("w", Shape::new(&[8, 24], DType::F32));
        let b = g.param("b", Shape::new(&[24], DType::F32));
        let wo = g.param("wo", Shape::new(&[8, 8], DType::F32));
        let qkv = g.dot(x, w);
        let qkv = g.add(qkv, b);
        let heads: Vec<NodeId> = (0..3)
            .map(|i| {
                let t = g.narrow(qkv, 1, 8 * i, 8);
                let t = g.reshape(t, &[1, 6, 2, 4]);
                g.transpose(t, &[0, 2, 1, 3])
            })
            .collect();
        let a = g.attention_masked(heads[0], heads[1], heads[2], mask, 0.5);
        let a = g.transpose(a, &[0, 2, 1, 3]);
        let a = g.reshape(a, &[6, 8]);
        let y = g.dot(a, wo);
        g.set_outputs(vec![y]);
        let pass = AutoMixedPrecision {
            policy: PrecisionPolicy::AutoMixedBf16,
            keep_params: vec![],
        };
        let (out, _) = pass.run(&g).unwrap();
        let (out, _) = crate::DeadCodeElimination.run(&out).unwrap();
        rlx_ir::verify(&out).unwrap();
        assert_eq!(dtypes(&out, OpKind::Attention), vec![DType::BF16], "{out}");
        assert_eq!(dtypes(&out, OpKind::MatMul), vec![DType::BF16; 2]);
        // The bias add stays f32; its result is cast once, before the narrows (not once per
        // slice). With the input, the first product's result, the mask and the output: five
        // casts. The attention's result feeds the output projection without one.
        assert_eq!(dtypes(&out, OpKind::Add), vec![DType::F32]);
        assert_eq!(dtypes(&out, OpKind::Narrow), vec![DType::BF16; 3]);
        assert_eq!(dtypes(&out, OpKind::Cast).len(), 5, "{out}");
        // Under a policy that keeps products as declared, attention stays f32.
        let custom = AutoMixedPrecision {
            policy: PrecisionPolicy::Custom(CustomPrecision {
                low: Precision::Bf16,
                ops: vec![OpKind::MatMul],
            }),
            keep_params: vec![],
        };
        let (out, _) = custom.run(&g).unwrap();
        assert_eq!(dtypes(&out, OpKind::Attention), vec![DType::F32]);
    }

    #[test]
    fn always_low_moves_every_float_op_and_keeps_the_interface() {
        let g = mlp();
        let pass = AutoMixedPrecision {
            policy: PrecisionPolicy::AlwaysF16,
            keep_params: vec![],
        };
        let (out, _) = pass.run(&g).unwrap();
        rlx_ir::verify(&out).unwrap();
        for k in [
            OpKind::MatMul,
            OpKind::Add,
            OpKind::Gelu,
            OpKind::Reduce,
            OpKind::Transpose,
        ] {
            assert!(dtypes(&out, k).iter().all(|&d| d == DType::F16), "{k:?}");
        }
        assert_eq!(out.shape(out.find_leaf("x").unwrap()).dtype(), DType::F32);
        assert_eq!(out.shape(out.outputs()[0]).dtype(), DType::F32);
    }

    #[test]
    fn custom_lists_and_names() {
        let g = mlp();
        let pass = AutoMixedPrecision {
            policy: PrecisionPolicy::Custom(CustomPrecision {
                low: Precision::Bf16,
                ops: vec![OpKind::Gelu],
            }),
            keep_params: vec![],
        };
        let (out, _) = pass.run(&g).unwrap();
        assert_eq!(dtypes(&out, OpKind::Gelu), vec![DType::BF16]);
        assert_eq!(dtypes(&out, OpKind::MatMul), vec![DType::F32; 2]);
        // The transpose reads the bf16 GELU: it follows it.
        assert_eq!(dtypes(&out, OpKind::Transpose)[0], DType::BF16);
        for p in [
            PrecisionPolicy::AlwaysF32,
            PrecisionPolicy::AlwaysF16,
            PrecisionPolicy::AlwaysBf16,
            PrecisionPolicy::AutoMixed,
            PrecisionPolicy::AutoMixedBf16,
        ] {
            assert_eq!(PrecisionPolicy::from_name(p.name()), Some(p));
        }
        assert_eq!(PrecisionPolicy::from_name("nope"), None);
    }
}
