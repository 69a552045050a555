//! The graph: an arena of nodes in definition order, and its outputs.

use crate::{ops, DType, Error, Op, Result, Shape};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bool tensors hold bytes 0 and 1 only; describes the first other byte in `data`, if any.
pub(crate) fn bad_bool_data(shape: &Shape, data: &[u8]) -> Option<String> {
    if shape.dtype() != DType::Bool {
        return None;
    }
    let (at, b) = data.iter().enumerate().find(|(_, &b)| b > 1)?;
    Some(format!(
        "{shape} data holds byte {b} at index {at}; bools must be 0 or 1"
    ))
}

/// Identifier of a node: its index in the graph's arena. Ids are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One node: an op, its operands (all defined earlier) and its result shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Operand ids.
    pub inputs: Vec<NodeId>,
    /// Result shape and dtype.
    pub shape: Shape,
}

/// A computation graph. Nodes are appended in a topological order: every operand of a node has a
/// smaller id. Build it with the methods below; each has a `try_` form returning
/// [`crate::Result`] and a short form that panics with the same message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    name: String,
    nodes: Vec<Node>,
    outputs: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All nodes, indexed by [`NodeId::index`].
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node `id`. Panics if `id` is not in the graph; use [`Graph::get`] to check.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The node `id`, if it exists.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// Result shape of node `id`. Panics if `id` is not in the graph.
    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.nodes[id.index()].shape
    }

    /// Ids of all nodes in definition order.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId> + ExactSizeIterator + '_ {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// The graph's outputs.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// `(name, id)` of every `Input` node, in definition order.
    pub fn inputs(&self) -> Vec<(&str, NodeId)> {
        self.leaves(|op| matches!(op, Op::Input { .. }))
    }

    /// `(name, id)` of every `Param` node, in definition order.
    pub fn params(&self) -> Vec<(&str, NodeId)> {
        self.leaves(|op| matches!(op, Op::Param { .. }))
    }

    fn leaves(&self, pick: impl Fn(&Op) -> bool) -> Vec<(&str, NodeId)> {
        self.ids()
            .filter_map(|id| match &self.node(id).op {
                op @ (Op::Input { name } | Op::Param { name }) if pick(op) => {
                    Some((name.as_str(), id))
                }
                _ => None,
            })
            .collect()
    }

    /// Find an input or param by name.
    pub fn find_leaf(&self, name: &str) -> Option<NodeId> {
        self.ids().find(|&id| matches!(&self.node(id).op, Op::Input { name: n } | Op::Param { name: n } if n == name))
    }

    /// For a fused region's node (`Op::Fused`): the node holding the region's first result
    /// (output 0), where the region is computed, if it is in the graph: the node itself for a
    /// first result, the earlier node of the same `region` id for a further one (see
    /// [`crate::FusedRegion`]; this and [`Graph::fused_results`] are how backends and passes
    /// find a region's results).
    pub fn fused_head(&self, id: NodeId) -> Option<NodeId> {
        let Op::Fused(r) = &self.node(id).op else {
            return None;
        };
        if r.output == 0 {
            return Some(id);
        }
        r.region?;
        (0..id.0).map(NodeId).find(|&h| self.same_region(h, id))
    }

    /// For the node `head` holding a fused region's first result: the nodes of its further
    /// results in the graph, `(output, node)` in output order (a result no one reads may have
    /// been removed).
    pub fn fused_results(&self, head: NodeId) -> Vec<(usize, NodeId)> {
        let Op::Fused(r) = &self.node(head).op else {
            return Vec::new();
        };
        if r.output != 0 || r.region.is_none() {
            return Vec::new();
        }
        let mut out: Vec<(usize, NodeId)> = (head.0 + 1..self.len() as u32)
            .map(NodeId)
            .filter(|&s| self.same_region(head, s))
            .filter_map(|s| match &self.node(s).op {
                Op::Fused(b) => Some((b.output, s)),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether `other` is a further result of the region whose first result is `head`: the
    /// same region id, kind, operands and body.
    fn same_region(&self, head: NodeId, other: NodeId) -> bool {
        let (h, o) = (self.node(head), self.node(other));
        match (&h.op, &o.op) {
            (Op::Fused(a), Op::Fused(b)) => {
                a.output == 0
                    && b.output > 0
                    && a.region.is_some()
                    && a.region == b.region
                    && a.kind == b.kind
                    && h.inputs == o.inputs
                    && a.body == b.body
            }
            _ => false,
        }
    }

    /// Append a node without checking it (passes that rebuild graphs use this, then verify).
    pub fn push_unchecked(&mut self, op: Op, inputs: Vec<NodeId>, shape: Shape) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node { op, inputs, shape });
        id
    }

    /// Remove and return the nodes from index `start` on (a rewrite engine takes back the nodes
    /// a rule appended, to pass them through its rules). Outputs must not refer to them.
    pub fn split_off(&mut self, start: usize) -> Vec<Node> {
        self.nodes.split_off(start.min(self.nodes.len()))
    }

    /// Replace the output list without checking it.
    pub fn set_outputs_unchecked(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    fn check_operand(&self, op: &Op, id: NodeId) -> Result<()> {
        if id.index() >= self.nodes.len() {
            return Err(Error::op(
                op.name(),
                format!(
                    "operand {id} is not a node of graph \"{}\" (it has {} nodes)",
                    self.name,
                    self.nodes.len()
                ),
            ));
        }
        Ok(())
    }

    fn add_leaf(&mut self, op: Op, shape: Shape) -> Result<NodeId> {
        if let Op::Input { name } | Op::Param { name } = &op {
            if self.find_leaf(name).is_some() {
                return Err(Error::op(
                    op.name(),
                    format!("name \"{name}\" is already used by an input or param"),
                ));
            }
        }
        Ok(self.push_unchecked(op, Vec::new(), shape))
    }

    /// Append `op` applied to `inputs`, inferring and checking its result shape.
    pub fn try_op(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        for &i in inputs {
            self.check_operand(&op, i)?;
        }
        let shapes: Vec<&Shape> = inputs.iter().map(|&i| self.shape(i)).collect();
        let shape = ops::infer(&op, &shapes)?;
        Ok(self.push_unchecked(op, inputs.to_vec(), shape))
    }

    /// Append the op `def` defines (a block such as [`crate::ops::Linear`], or any
    /// [`crate::ops::OpDef`]) applied to `inputs`: block-level building of an HIR graph. The
    /// result is inferred and checked like any op's.
    pub fn define(&mut self, def: impl crate::ops::OpDef, inputs: &[NodeId]) -> Result<NodeId> {
        self.try_op(Op::defined(def), inputs)
    }

    /// Declare a graph input named `name`.
    pub fn try_input(&mut self, name: &str, shape: Shape) -> Result<NodeId> {
        self.add_leaf(
            Op::Input {
                name: name.to_string(),
            },
            shape,
        )
    }

    /// Declare a parameter (weight) named `name`.
    pub fn try_param(&mut self, name: &str, shape: Shape) -> Result<NodeId> {
        self.add_leaf(
            Op::Param {
                name: name.to_string(),
            },
            shape,
        )
    }

    /// A constant holding raw little-endian bytes of `shape`'s dtype.
    pub fn try_constant_bytes(&mut self, shape: Shape, data: Vec<u8>) -> Result<NodeId> {
        let want = shape
            .size_bytes()
            .ok_or_else(|| Error::op("constant", format!("shape {shape} must be static")))?;
        if data.len() != want {
            return Err(Error::op(
                "constant",
                format!("{shape} needs {want} bytes, got {}", data.len()),
            ));
        }
        if let Some(msg) = bad_bool_data(&shape, &data) {
            return Err(Error::op("constant", msg));
        }
        self.add_leaf(Op::Constant { data }, shape)
    }

    /// An f32 constant of shape `dims`.
    pub fn try_constant_f32(&mut self, dims: &[usize], values: &[f32]) -> Result<NodeId> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.try_constant_bytes(Shape::new(dims, DType::F32), data)
    }

    /// A c64 constant of shape `dims` from `(re, im)` pairs (numpy's `complex64` array).
    pub fn try_constant_c64(&mut self, dims: &[usize], values: &[(f32, f32)]) -> Result<NodeId> {
        let data = values
            .iter()
            .flat_map(|&(re, im)| re.to_le_bytes().into_iter().chain(im.to_le_bytes()))
            .collect();
        self.try_constant_bytes(Shape::new(dims, DType::C64), data)
    }

    /// A rank-0 c64 constant `re + im·i`.
    pub fn try_complex_scalar(&mut self, re: f32, im: f32) -> Result<NodeId> {
        self.try_constant_c64(&[], &[(re, im)])
    }

    /// A rank-0 constant `value` converted to `dtype`.
    pub fn try_scalar(&mut self, value: f64, dtype: DType) -> Result<NodeId> {
        let mut data = vec![0u8; dtype.size_bytes()];
        crate::convert::f64_to_bytes(value, dtype, &mut data)
            .map_err(|e| Error::op("constant", e.to_string()))?;
        self.try_constant_bytes(Shape::scalar(dtype), data)
    }

    /// `lhs @ rhs`, checking that the result has the `expected` shape.
    pub fn try_matmul(&mut self, lhs: NodeId, rhs: NodeId, expected: Shape) -> Result<NodeId> {
        let id = self.try_dot(lhs, rhs)?;
        if *self.shape(id) != expected {
            let got = self.shape(id).clone();
            self.nodes.pop();
            return Err(Error::op(
                "matmul",
                format!(
                    "expected result shape {expected} but lhs {} x rhs {} gives {got}",
                    self.shape(lhs),
                    self.shape(rhs)
                ),
            ));
        }
        Ok(id)
    }

    /// `lhs @ rhs` with the result shape inferred.
    pub fn try_dot(&mut self, lhs: NodeId, rhs: NodeId) -> Result<NodeId> {
        self.try_op(Op::MatMul, &[lhs, rhs])
    }

    /// Reshape to static `dims`.
    pub fn try_reshape(&mut self, x: NodeId, dims: &[usize]) -> Result<NodeId> {
        self.try_op(
            Op::Reshape {
                shape: dims.to_vec(),
            },
            &[x],
        )
    }

    /// Permute axes.
    pub fn try_transpose(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId> {
        self.try_op(
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Both halves of a top-k along the last axis: `(values, indices)`.
    pub fn try_topk(&mut self, x: NodeId, k: usize) -> Result<(NodeId, NodeId)> {
        let v = self.try_op(
            Op::TopK {
                k,
                output: crate::TopKOutput::Values,
            },
            &[x],
        )?;
        let i = self.try_op(
            Op::TopK {
                k,
                output: crate::TopKOutput::Indices,
            },
            &[x],
        )?;
        Ok((v, i))
    }

    /// Declare the graph's outputs; each must be a node of this graph.
    pub fn try_set_outputs(&mut self, outputs: Vec<NodeId>) -> Result<()> {
        if let Some(&bad) = outputs.iter().find(|o| o.index() >= self.nodes.len()) {
            return Err(Error::BadOutput {
                node: bad,
                nodes: self.nodes.len(),
            });
        }
        self.outputs = outputs;
        Ok(())
    }

    /// Short form of [`Graph::try_set_outputs`]; panics with its error.
    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.try_set_outputs(outputs)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Short form of [`Graph::try_topk`]; panics with its error.
    pub fn topk(&mut self, x: NodeId, k: usize) -> (NodeId, NodeId) {
        self.try_topk(x, k).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Short form of [`Graph::try_constant_f32`]; panics with its error.
    pub fn constant_f32(&mut self, dims: &[usize], values: &[f32]) -> NodeId {
        self.try_constant_f32(dims, values)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Short form of [`Graph::try_constant_c64`]; panics with its error.
    pub fn constant_c64(&mut self, dims: &[usize], values: &[(f32, f32)]) -> NodeId {
        self.try_constant_c64(dims, values)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Short form of [`Graph::try_complex_scalar`]; panics with its error.
    pub fn complex_scalar(&mut self, re: f32, im: f32) -> NodeId {
        self.try_complex_scalar(re, im)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

#[cfg(test)]
mod fused_results_tests {
    use crate::{DType, FusedRegion, FusionKind, Graph, NodeId, Op, Shape};

    fn region(output: usize, scale: f32, region: Option<u32>) -> Op {
        let mut body = Graph::new("body");
        let x = body.input("x", Shape::new(&[2], DType::F32));
        let s = body.constant_f32(&[2], &[scale, scale]);
        let a = body.mul(x, s);
        let b = body.add(a, x);
        body.set_outputs(vec![a, b]);
        Op::Fused(FusedRegion {
            kind: FusionKind::Elementwise,
            body: Box::new(body),
            output,
            region,
        })
    }

    #[test]
    fn a_regions_results_are_found_by_its_id_and_checked() {
        let mut g = Graph::new("g");
        let x = g.input("x", Shape::new(&[2], DType::F32));
        let h = g.try_op(region(0, 2.0, Some(0)), &[x]).unwrap();
        // Another region between a region's first result and its second.
        let h2 = g.try_op(region(0, 3.0, Some(1)), &[x]).unwrap();
        let r1 = g.try_op(region(1, 2.0, Some(0)), &[x]).unwrap();
        let r2 = g.try_op(region(1, 3.0, Some(1)), &[x]).unwrap();
        // A lone result (no id): computed on its own.
        let lone = g.try_op(region(1, 2.0, None), &[x]).unwrap();
        g.set_outputs(vec![h, h2, r1, r2, lone]);
        crate::verify(&g).unwrap();
        assert_eq!(g.fused_head(h), Some(h));
        assert_eq!(g.fused_head(r1), Some(h));
        assert_eq!(g.fused_head(r2), Some(h2));
        assert_eq!(g.fused_results(h), vec![(1, r1)]);
        assert_eq!(g.fused_results(h2), vec![(1, r2)]);
        assert_eq!(g.fused_head(lone), None);
        assert_eq!(g.fused_head(x), None);
        assert_eq!(g.fused_results(r1), Vec::<(usize, NodeId)>::new());

        // The verifier refuses a result claiming a region whose first result differs (another
        // body), one before its region's first result, and a region id used twice for output 1.
        let refused = |nodes: &[(usize, f32)], id: u32| {
            let mut bad = Graph::new("bad");
            let x = bad.input("x", Shape::new(&[2], DType::F32));
            for &(output, scale) in nodes {
                let op = region(output, scale, Some(id));
                bad.push_unchecked(op, vec![x], Shape::new(&[2], DType::F32));
            }
            let e = crate::verify(&bad).unwrap_err().to_string();
            assert!(e.contains(&format!("region {id}")), "{e}");
        };
        refused(&[(0, 2.0), (1, 3.0)], 5);
        refused(&[(1, 2.0), (0, 2.0)], 2);
        refused(&[(0, 2.0), (1, 2.0), (1, 2.0)], 3);
    }
}
