//! The rewrite engine: named rules indexed by the kind of their pattern's root, applied to a
//! fixed point as the graph is rebuilt.
//!
//! A [`RuleSet`] rebuilds a graph node by node. Each node, with its operands already rewritten,
//! is offered to the rules whose root kinds include its op; the first rule that matches appends
//! its replacement with the ordinary [`Graph`] builders. The engine then takes those new nodes
//! back and offers each of them to the rules in turn (a worklist in definition order), so a
//! replacement is itself simplified, and a node enters the result only when no rule matches it:
//! the result is a fixed point of the rule list. Optionally the engine merges structurally equal
//! nodes as they are emitted (CSE keyed by a structural hash of op, attributes, operands and
//! shape), and it counts how often each rule fired.
//!
//! Rules follow cranelift's discipline: a rule's result is never worse than its input (no more
//! work by [`rlx_ir::ops::cost`], counting the operands it makes dead). The filetests check it.

use crate::Pass;
use rlx_ir::text::Attr;
use rlx_ir::{Error, Graph, NodeId, Op, OpKind, Result, Shape};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// A node offered to a rule: its op, its operands in the graph being built, its result shape,
/// and the node of the input graph it comes from (for errors).
pub struct Site<'a> {
    /// The op.
    pub op: &'a Op,
    /// Operands (ids in the graph being built, already rewritten).
    pub ins: &'a [NodeId],
    /// Result shape.
    pub shape: &'a Shape,
    /// The node of the input graph being rewritten (the root of this replacement chain).
    pub source: NodeId,
}

type Apply<'r> = dyn Fn(&mut Graph, &Site) -> Result<Option<NodeId>> + 'r;

/// A named rewrite: the op kinds its pattern's root may have, and a function that either builds
/// a replacement in the graph (returning its id, which must have the site's shape) or declines
/// with `None` (anything it appended is then dropped).
pub struct Rule<'r> {
    name: String,
    roots: Vec<OpKind>,
    apply: Box<Apply<'r>>,
}

impl<'r> Rule<'r> {
    /// A rule named `name` whose pattern's root is one of `roots`.
    pub fn new(
        name: impl Into<String>,
        roots: &[OpKind],
        apply: impl Fn(&mut Graph, &Site) -> Result<Option<NodeId>> + 'r,
    ) -> Rule<'r> {
        Rule {
            name: name.into(),
            roots: roots.to_vec(),
            apply: Box::new(apply),
        }
    }

    /// The rule's name (as counted in [`crate::PassRecord::fired`]).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Replacements may themselves be rewritten; past this depth a node is kept as it is, so a rule
/// list that would rewrite forever still terminates.
const MAX_DEPTH: usize = 32;

/// An ordered list of rules, indexed by root op kind, run as one pass.
pub struct RuleSet<'r> {
    name: String,
    rules: Vec<Rule<'r>>,
    by_kind: HashMap<OpKind, Vec<usize>>,
    cse: bool,
}

impl<'r> RuleSet<'r> {
    /// An empty rule list whose pass is called `name`.
    pub fn new(name: impl Into<String>) -> RuleSet<'r> {
        RuleSet {
            name: name.into(),
            rules: Vec::new(),
            by_kind: HashMap::new(),
            cse: false,
        }
    }

    /// Add a rule (tried after the ones already added).
    pub fn with(mut self, rule: Rule<'r>) -> RuleSet<'r> {
        for &k in &rule.roots {
            self.by_kind.entry(k).or_default().push(self.rules.len());
        }
        self.rules.push(rule);
        self
    }

    /// Merge structurally equal nodes as they are emitted (counted as `cse`).
    pub fn with_cse(mut self) -> RuleSet<'r> {
        self.cse = true;
        self
    }

    /// The rules, in the order they are tried.
    pub fn rules(&self) -> &[Rule<'r>] {
        &self.rules
    }

    /// Rewrite `g` to a fixed point of the rules. Returns the new graph and how often each rule
    /// fired (rules that never fired are absent).
    pub fn apply(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>)> {
        self.apply_logged(g).map(|(out, fired, _)| (out, fired))
    }

    /// [`RuleSet::apply`], also returning where each rule fired: the node of `g` being
    /// rebuilt when it did (a rule firing on nodes another rule appended counts at the node
    /// that started it), in order. CSE merges are counted, not logged.
    pub fn apply_logged(
        &self,
        g: &Graph,
    ) -> Result<(Graph, BTreeMap<String, usize>, Vec<RuleSite>)> {
        let mut e = Engine {
            set: self,
            out: Graph::new(g.name()),
            fired: BTreeMap::new(),
            log: Vec::new(),
            seen: HashMap::new(),
            source: NodeId(0),
            source_op: "",
        };
        let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
        for id in g.ids() {
            let n = g.node(id);
            e.source = id;
            e.source_op = n.op.name();
            let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.index()]).collect();
            map.push(e.emit(n.op.clone(), ins, n.shape.clone(), 0)?);
        }
        e.out
            .set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
        Ok((e.out, e.fired, e.log))
    }
}

/// Where a rule fired (see [`RuleSet::apply_logged`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuleSite {
    /// The node of the pass's input graph.
    pub node: u32,
    /// Its op.
    pub op: String,
    /// The rule.
    pub rule: String,
}

struct Engine<'a, 'r> {
    set: &'a RuleSet<'r>,
    out: Graph,
    fired: BTreeMap<String, usize>,
    log: Vec<RuleSite>,
    source_op: &'static str,
    /// Structural hash → nodes with that hash (for CSE).
    seen: HashMap<u64, Vec<NodeId>>,
    source: NodeId,
}

impl Engine<'_, '_> {
    fn emit(&mut self, op: Op, ins: Vec<NodeId>, shape: Shape, depth: usize) -> Result<NodeId> {
        if depth < MAX_DEPTH {
            if let Some(r) = self.try_rules(&op, &ins, &shape, depth)? {
                return Ok(r);
            }
        }
        // Inputs and params are never merged (their names are how callers feed them).
        let mergeable = self.set.cse && !matches!(op, Op::Input { .. } | Op::Param { .. });
        let key = mergeable.then(|| structural_hash(&op, &ins, &shape));
        if let Some(k) = key {
            let out = &self.out;
            let same = self.seen.get(&k).and_then(|c| {
                c.iter().copied().find(|&p| {
                    let n = out.node(p);
                    n.op == op && n.inputs == ins && n.shape == shape
                })
            });
            if let Some(prev) = same {
                *self.fired.entry("cse".to_string()).or_default() += 1;
                return Ok(prev);
            }
        }
        let id = self.out.push_unchecked(op, ins, shape);
        if let Some(k) = key {
            self.seen.entry(k).or_default().push(id);
        }
        Ok(id)
    }

    fn try_rules(
        &mut self,
        op: &Op,
        ins: &[NodeId],
        shape: &Shape,
        depth: usize,
    ) -> Result<Option<NodeId>> {
        let Some(candidates) = self.set.by_kind.get(&op.kind()) else {
            return Ok(None);
        };
        for &ri in candidates {
            let rule = &self.set.rules[ri];
            let start = self.out.len();
            let site = Site {
                op,
                ins,
                shape,
                source: self.source,
            };
            let Some(r) = (rule.apply)(&mut self.out, &site).map_err(|e| e.at(self.source))? else {
                self.out.split_off(start);
                continue;
            };
            if r.index() >= self.out.len() || self.out.shape(r) != shape {
                let got = self
                    .out
                    .get(r)
                    .map_or("no node".to_string(), |n| n.shape.to_string());
                return Err(Error::op(
                    op.name(),
                    format!("rule `{}` replaced a {shape} node by {got}", rule.name),
                )
                .at(self.source));
            }
            *self.fired.entry(rule.name.clone()).or_default() += 1;
            self.log.push(RuleSite {
                node: self.source.0,
                op: self.source_op.to_string(),
                rule: rule.name.clone(),
            });
            // Offer every node the rule appended to the rules again, in order.
            let fresh = self.out.split_off(start);
            let mut map: Vec<NodeId> = Vec::with_capacity(fresh.len());
            for n in fresh {
                let remap = |i: NodeId| {
                    if i.index() >= start {
                        map[i.index() - start]
                    } else {
                        i
                    }
                };
                let ins: Vec<NodeId> = n.inputs.iter().map(|&i| remap(i)).collect();
                let id = self.emit(n.op, ins, n.shape, depth + 1)?;
                map.push(id);
            }
            return Ok(Some(if r.index() >= start {
                map[r.index() - start]
            } else {
                r
            }));
        }
        Ok(None)
    }
}

/// A hash of what makes two nodes interchangeable: op kind, attributes, operands and shape.
/// Equal nodes hash equally (float attributes by their bits; nested graphs by name and size,
/// which only widens a bucket that exact comparison then splits).
pub fn structural_hash(op: &Op, ins: &[NodeId], shape: &Shape) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    op.kind().hash(&mut h);
    match op {
        // Large constants: hash the bytes without copying them into an attribute.
        Op::Constant { data } => data.hash(&mut h),
        _ => {
            for (k, a) in rlx_ir::ops::attrs(op) {
                k.hash(&mut h);
                hash_attr(&a, &mut h);
            }
        }
    }
    ins.hash(&mut h);
    shape.hash(&mut h);
    h.finish()
}

fn hash_attr(a: &Attr, h: &mut impl Hasher) {
    match a {
        Attr::Int(v) => v.hash(h),
        Attr::NegInt(v) => (!v).hash(h),
        Attr::Float(v) => v.to_bits().hash(h),
        Attr::Bool(v) => v.hash(h),
        Attr::Str(s) | Attr::Word(s) => s.hash(h),
        Attr::Tagged(w, a) => {
            w.hash(h);
            hash_attr(a, h);
        }
        Attr::List(items) => {
            items.len().hash(h);
            items.iter().for_each(|a| hash_attr(a, h));
        }
        Attr::Bytes(b) => b.hash(h),
        Attr::Graph(g) => {
            g.name().hash(h);
            g.len().hash(h);
        }
    }
}

impl Pass for RuleSet<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, g: &Graph) -> Result<(Graph, usize)> {
        let (out, fired) = self.apply(g)?;
        Ok((out, fired.values().sum()))
    }

    fn run_counted(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>)> {
        self.apply(g)
    }

    fn run_logged(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>, Vec<RuleSite>)> {
        self.apply_logged(g)
    }
}

/// What a [`rewrite()`] callback decides for one node.
pub enum Rewrite {
    /// Copy the node unchanged (with its operands remapped).
    Keep,
    /// Use this node of the new graph instead.
    Replace(NodeId),
}

/// Rebuild `g` node by node with one callback and no fixed point (for passes that are not rule
/// lists). `rule(new_graph, op, new_operands, shape)` may append nodes and return
/// [`Rewrite::Replace`]. Returns the new graph and how many nodes were replaced.
pub fn rewrite(
    g: &Graph,
    mut rule: impl FnMut(&mut Graph, &Op, &[NodeId], &Shape) -> Result<Rewrite>,
) -> Result<(Graph, usize)> {
    let mut out = Graph::new(g.name());
    let mut map: Vec<NodeId> = Vec::with_capacity(g.len());
    let mut changed = 0;
    for id in g.ids() {
        let n = g.node(id);
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.index()]).collect();
        let new = match rule(&mut out, &n.op, &ins, &n.shape)? {
            Rewrite::Keep => out.push_unchecked(n.op.clone(), ins, n.shape.clone()),
            Rewrite::Replace(r) => {
                changed += 1;
                r
            }
        };
        map.push(new);
    }
    out.set_outputs_unchecked(g.outputs().iter().map(|o| map[o.index()]).collect());
    Ok((out, changed))
}
