//! Ops defined in one file each.
//!
//! An [`OpDef`] is a value (the op with its attributes) whose methods are every rule the IR
//! needs: shape/dtype inference, the reference evaluator, cost, decomposition, reverse- and
//! forward-mode derivatives, batching and its text-form attributes. An [`OpRegistration`] names
//! the op and parses it back from the text form. [`Op::Defined`](crate::Op::Defined) holds one,
//! so adding such an op touches its own file and one line of the registry
//! ([`registrations`]); the IR's enum, the rule dispatchers, the passes and the backends stay as
//! they are (a backend without a native kernel for it gets its decomposition). A crate outside
//! the IR defines its ops the same way and [`register`]s them at run time.

use super::batch::Batched;
use super::Cost;
use crate::eval::Tensor;
use crate::text::{Attr, Attrs};
use crate::{Error, Graph, NodeId, Result, Shape};
use std::fmt;
use std::sync::Arc;

/// Every rule of one op. Implemented by a type holding the op's attributes (`Quantize { axis }`).
///
/// Required: the name, attributes, arity, inference, the reference evaluator and the cost. The
/// rest default to "none": a primitive without a decomposition, no derivative rules
/// (autodiff then differentiates the decomposition, or reports the op), no batching rule (vmap
/// batches the decomposition).
pub trait OpDef: AsAny + Send + Sync + 'static {
    /// The lowercase name, as printed and parsed; equal to its [`OpRegistration::name`].
    fn name(&self) -> &'static str;

    /// The attributes in print order. The text form, JSON, equality and hashing use them, so two
    /// ops with equal names and attributes are the same op.
    fn attrs(&self) -> Vec<(&'static str, Attr)>;

    /// Operand count bounds `(min, max)`.
    fn arity(&self) -> (usize, usize);

    /// The result shape and dtype for operands of shapes `ins` (the count is already checked
    /// against [`OpDef::arity`]). Errors name the op and the offending shapes.
    fn infer(&self, ins: &[&Shape]) -> Result<Shape>;

    /// The reference evaluator: the result for host values `ins` whose result shape is `out`.
    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor>;

    /// Estimated arithmetic and memory traffic.
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost;

    /// The op rewritten into simpler ops appended to `g` (`None`: a primitive, which a backend
    /// must run natively).
    fn decompose(&self, _g: &mut Graph, _ins: &[NodeId]) -> Option<Result<NodeId>> {
        None
    }

    /// Whether [`OpDef::vjp`] and [`OpDef::jvp`] are rules of this op. When false, autodiff
    /// differentiates the decomposition (or reports that the op has none). For one mode alone,
    /// see [`OpDef::has_vjp_rule`] and [`OpDef::has_jvp_rule`].
    fn has_ad_rules(&self) -> bool {
        false
    }

    /// Whether [`OpDef::vjp`] is a rule of this op; by default [`OpDef::has_ad_rules`]. An op
    /// may have a reverse-mode rule alone (a native backward kernel, say) and leave forward
    /// mode to its decomposition.
    fn has_vjp_rule(&self) -> bool {
        self.has_ad_rules()
    }

    /// Whether [`OpDef::jvp`] is a rule of this op; by default [`OpDef::has_ad_rules`].
    fn has_jvp_rule(&self) -> bool {
        self.has_ad_rules()
    }

    /// Reverse mode: the cotangents of the operands `ins` given the cotangent `ct` of the result
    /// `out` (`None`: zero or not differentiable). Only called when [`OpDef::has_vjp_rule`].
    fn vjp(
        &self,
        _g: &mut Graph,
        _ins: &[NodeId],
        _out: NodeId,
        _ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        Err(Error::op(self.name(), "has no reverse-mode (VJP) rule"))
    }

    /// Forward mode: the tangent of the result `out` given the operands' tangents (`None` is
    /// zero; at least one is present). Only called when [`OpDef::has_jvp_rule`].
    fn jvp(
        &self,
        _g: &mut Graph,
        _ins: &[NodeId],
        _out: NodeId,
        _tangents: &[Option<NodeId>],
    ) -> Result<Option<NodeId>> {
        Err(Error::op(self.name(), "has no forward-mode (JVP) rule"))
    }

    /// Whether [`OpDef::batch`] handles the operands flagged in `batched` carrying a batch axis.
    fn batchable(&self, _batched: &[bool]) -> bool {
        false
    }

    /// The batching rule: the result and its batch axis. Only called when
    /// [`OpDef::batchable`] said yes.
    fn batch(&self, _g: &mut Graph, _b: &Batched) -> Result<(NodeId, Option<usize>)> {
        Err(Error::op(
            self.name(),
            "has no batching rule; vmap batches its decomposition",
        ))
    }

    /// The graphs this op carries and runs (a branch, a loop's condition and body), by
    /// attribute name. A compile takes each through the same pipeline as the graph holding the
    /// op when the backend runs the op natively (see [`OpDef::with_graphs`]). None by default.
    fn graphs(&self) -> Vec<(&'static str, &Graph)> {
        Vec::new()
    }

    /// This op with its graphs replaced by `graphs`, given in the order of [`OpDef::graphs`]
    /// (each taking the same inputs and giving the same outputs as the one it replaces: the
    /// same graph after the compiler's passes). Only called for ops with graphs.
    fn with_graphs(&self, graphs: Vec<Graph>) -> Result<DefinedOp> {
        let _ = graphs;
        Err(Error::op(self.name(), "carries no graphs to replace"))
    }

    /// How the mixed-precision policies treat the op (see [`OpClass`]). By default
    /// [`OpClass::Fixed`]: its operands keep their dtypes.
    fn precision_class(&self) -> OpClass {
        OpClass::Fixed
    }
}

/// How an op is treated by a precision policy (`rlx_opt::precision` rewrites a graph by these
/// classes; ops defined by an [`OpDef`] give theirs with [`OpDef::precision_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// Matrix products (`matmul`, `dot_general`, convolution, and attention, whose two products
    /// take the low precision while its softmax stays in f32 inside the kernel, as PyTorch's
    /// autocast runs scaled dot-product attention): what low precision speeds up.
    Product,
    /// Ops that move or select values without arithmetic (reshape, transpose, narrow, concat,
    /// expand, gather, top-k): they follow their operand's precision.
    Movement,
    /// Numerically sensitive: exp, log, rsqrt, tan, pow, reductions, cumsum, scatter-add,
    /// softmax, norms and pooling; kept in f32 by the automatic policies.
    Sensitive,
    /// Other arithmetic: elementwise binaries, comparisons, selects, activations, RoPE.
    Elementwise,
    /// Never rewritten: leaves, casts, quantized and KV-cache ops, custom and fused bodies.
    Fixed,
}

/// How the text form (and JSON) finds a defined op by name.
pub struct OpRegistration {
    /// The op's name.
    pub name: &'static str,
    /// The op from its text-form attributes (unknown or missing ones are errors naming the op).
    pub from_attrs: fn(&mut Attrs) -> Result<DefinedOp>,
    /// A few instances with different attributes, for property tests of the text form.
    pub examples: fn() -> Vec<DefinedOp>,
}

/// Ops registered from outside the IR ([`register`]), after the IR's own.
static REGISTERED: std::sync::RwLock<Vec<&'static OpRegistration>> =
    std::sync::RwLock::new(Vec::new());

/// Register an op defined outside the IR (a downstream crate's [`OpDef`]): from then on the
/// text form and JSON parse it by name, [`crate::OpKind::from_name`] and [`crate::OpKind::all`]
/// know it, and every rule of the IR (inference, the reference evaluator, autodiff, vmap,
/// decomposition for backends without a native kernel, precision) works through its `OpDef`.
/// Registering the same registration again is a no-op; a name that is one of the IR's ops, or
/// that another registration holds, is an error naming it.
pub fn register(reg: OpRegistration) -> Result<()> {
    let name = reg.name;
    let well_formed = name.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !well_formed {
        return Err(Error::op(
            name.to_string(),
            "is not an op name (lowercase letters, digits and `_`, starting with a letter)",
        ));
    }
    if crate::OpKind::BUILTIN.iter().any(|k| k.name() == name)
        || super::DEFINED.iter().any(|r| r.name == name)
    {
        return Err(Error::op(name, "is the name of one of the IR's own ops"));
    }
    let mut held = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = held.iter().find(|r| r.name == name) {
        // The same registration again (the same parser) is fine: crates register on first use.
        if r.from_attrs as usize == reg.from_attrs as usize {
            return Ok(());
        }
        return Err(Error::op(
            name,
            "is registered already, by another definition",
        ));
    }
    held.push(Box::leak(Box::new(reg)));
    Ok(())
}

/// Every registered op: the IR's own, in the order their kinds enumerate, then those
/// [`register`]ed from outside, in registration order.
pub fn registrations() -> Vec<&'static OpRegistration> {
    let held = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    super::DEFINED.iter().chain(held.iter().copied()).collect()
}

/// The registration named `name`.
pub fn registration(name: &str) -> Option<&'static OpRegistration> {
    if let Some(r) = super::DEFINED.iter().find(|r| r.name == name) {
        return Some(r);
    }
    let held = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    held.iter().copied().find(|r| r.name == name)
}

/// The definition as `Any`, so a transform that needs an op's attributes as its own type (the
/// loop rules of `rlx_opt`) can get them back ([`DefinedOp::downcast`]). Implemented for every
/// type.
pub trait AsAny {
    /// `self` as `Any`.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: std::any::Any> AsAny for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An op defined by an [`OpDef`], shared cheaply between graphs.
#[derive(Clone)]
pub struct DefinedOp(Arc<dyn OpDef>);

impl DefinedOp {
    /// Wrap a definition.
    pub fn new(def: impl OpDef) -> DefinedOp {
        DefinedOp(Arc::new(def))
    }

    /// The definition and its rules.
    pub fn def(&self) -> &dyn OpDef {
        &*self.0
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The definition as a `T`, when it is one (`op.downcast::<While>()`).
    pub fn downcast<T: OpDef>(&self) -> Option<&T> {
        // Through the trait object: `self.0` itself (an `Arc`) is `Any` too.
        (*self.0).as_any().downcast_ref::<T>()
    }

    /// The attributes written as in the text form, `{axis = 0}` (empty without attributes).
    pub fn attrs_text(&self) -> String {
        crate::text::attrs_text(&self.0.attrs())
    }

    /// Parse the op named `name` with attributes written as [`DefinedOp::attrs_text`] gives.
    pub fn parse(name: &str, attrs: &str) -> Result<DefinedOp> {
        let reg = registration(name)
            .ok_or_else(|| Error::op(name.to_string(), "is not a registered op"))?;
        let mut a = Attrs::new(reg.name, crate::text::parse_attrs(attrs)?);
        let op = (reg.from_attrs)(&mut a)?;
        a.finish()?;
        Ok(op)
    }
}

impl fmt::Debug for DefinedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.name(), self.attrs_text())
    }
}

impl PartialEq for DefinedOp {
    fn eq(&self, o: &DefinedOp) -> bool {
        self.name() == o.name() && self.0.attrs() == o.0.attrs()
    }
}

impl serde::Serialize for DefinedOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        (self.name(), self.attrs_text()).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for DefinedOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let (name, attrs) = <(String, String)>::deserialize(d)?;
        DefinedOp::parse(&name, &attrs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::{Dequantize, Quantize};
    use crate::{DType, Graph, Op, OpKind, Shape};

    #[test]
    fn defined_ops_are_kinds_and_round_trip_through_text_and_json() {
        let kind = OpKind::from_name("quantize").expect("registered");
        assert_eq!(kind, OpKind::Defined("quantize"));
        assert!(OpKind::all().contains(&kind));
        assert_eq!(serde_json::to_string(&kind).unwrap(), "\"quantize\"");

        let mut g = Graph::new("q");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let s = g.constant_f32(&[3], &[0.5, 0.25, 1.0]);
        let z = g
            .try_constant_bytes(Shape::new(&[3], DType::I8), vec![0, 3, 254])
            .unwrap();
        let q = g.op(Op::defined(Quantize { axis: Some(1) }), &[x, s, z]);
        let y = g.op(Op::defined(Dequantize { axis: Some(1) }), &[q, s, z]);
        g.set_outputs(vec![y]);
        assert_eq!(g.shape(q).dtype(), DType::I8);
        assert_ne!(g.node(q).op, Op::defined(Quantize { axis: None }));

        let text = g.to_string();
        assert!(text.contains("quantize %0, %1, %2 {axis = 1}"), "{text}");
        assert_eq!(Graph::parse(&text).unwrap(), g);
        let json = g.to_json();
        assert_eq!(Graph::from_json(&json).unwrap(), g);
    }

    #[test]
    fn a_defined_op_gives_back_its_own_type_only() {
        let d = super::DefinedOp::new(Quantize { axis: Some(1) });
        assert_eq!(d.downcast::<Quantize>().map(|q| q.axis), Some(Some(1)));
        assert!(d.downcast::<Dequantize>().is_none());
        // Parsed back from text, it is the same type again.
        let p = super::DefinedOp::parse("quantize", &d.attrs_text()).unwrap();
        assert_eq!(p.downcast::<Quantize>().map(|q| q.axis), Some(Some(1)));
    }

    #[test]
    fn inlining_binds_arguments_in_order_and_checks_shapes() {
        let mut body = Graph::new("sub");
        let a = body.input("a", Shape::new(&[2], DType::F32));
        let b = body.input("b", Shape::new(&[2], DType::F32));
        let d = body.sub(a, b);
        body.set_outputs(vec![d, a]);
        let mut g = Graph::new("g");
        let x = g.constant_f32(&[2], &[5.0, 7.0]);
        let y = g.constant_f32(&[2], &[1.0, 2.0]);
        let outs = g.try_inline(&body, &[x, y]).unwrap();
        assert_eq!(outs[1], x);
        g.set_outputs(vec![outs[0]]);
        let r = crate::eval::evaluate(&g, &Default::default()).unwrap();
        assert_eq!(r[0].f64s(), vec![4.0, 5.0]);
        let z = g.constant_f32(&[3], &[0.0; 3]);
        let e = g.try_inline(&body, &[x, z]).unwrap_err();
        assert!(e.to_string().contains("argument 1"), "{e}");
    }

    #[test]
    fn bad_defined_ops_are_named_errors() {
        let e = Graph::parse(
            "graph \"g\" {\n  %0 = input {name = \"x\"} : f32[2]\n  %1 = quantize %0, %0, %0 {axes = 1} : i8[2]\n  return %1\n}",
        )
        .unwrap_err();
        assert!(e.to_string().contains("quantize"), "{e}");
        let e = super::DefinedOp::parse("no_such_op", "").unwrap_err();
        assert!(e.to_string().contains("no_such_op"), "{e}");
        let mut g = Graph::new("g");
        let x = g.input("x", Shape::new(&[2], DType::F32));
        let e = g
            .try_op(Op::defined(Quantize { axis: None }), &[x, x])
            .unwrap_err();
        assert!(e.to_string().contains("quantize"), "{e}");
    }
}
