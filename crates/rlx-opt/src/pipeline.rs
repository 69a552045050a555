//! The compile pipeline: passes run in order with verification and an optional IR dump.

use crate::rewrite::RuleSite;
use rlx_ir::{verify, Graph, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A graph-to-graph transformation.
pub trait Pass {
    /// Short name (used in records and dump file names).
    fn name(&self) -> &str;
    /// Transform `g`, returning the new graph and how many rewrites happened.
    fn run(&self, g: &Graph) -> Result<(Graph, usize)>;
    /// [`Pass::run`] with the count of each rule that fired (a pass that is not a rule list
    /// counts its rewrites under its own name).
    fn run_counted(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>)> {
        let (out, n) = self.run(g)?;
        let fired = if n > 0 {
            BTreeMap::from([(self.name().to_string(), n)])
        } else {
            BTreeMap::new()
        };
        Ok((out, fired))
    }
    /// [`Pass::run_counted`] with where each rule fired (rule lists log it; other passes do not).
    fn run_logged(&self, g: &Graph) -> Result<(Graph, BTreeMap<String, usize>, Vec<RuleSite>)> {
        let (out, fired) = self.run_counted(g)?;
        Ok((out, fired, Vec::new()))
    }
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PassRecord {
    /// Pass name.
    pub pass: String,
    /// Nodes before.
    pub nodes_before: usize,
    /// Nodes after.
    pub nodes_after: usize,
    /// Rewrites reported by the pass.
    pub rewrites: usize,
    /// How often each rule fired (rule name → count; rules that never fired are absent).
    pub fired: BTreeMap<String, usize>,
    /// Where rules fired, for rule lists: node of the pass's input graph, its op, the rule.
    pub sites: Vec<RuleSite>,
}

/// The optimized graph and the record of every pass.
#[derive(Clone, Debug)]
pub struct CompileResult {
    /// The final graph.
    pub graph: Graph,
    /// One record per pass run, in order.
    pub records: Vec<PassRecord>,
}

/// Runs a list of passes. Verification after each pass is on in debug builds (and can be
/// forced); when the `RLX_IR_DUMP` environment variable names a directory, the graph before and
/// after each pass is written there as text.
pub struct CompilePipeline<'a> {
    passes: Vec<Box<dyn Pass + 'a>>,
    verify_each: bool,
    dump_dir: Option<PathBuf>,
    rounds: usize,
}

impl<'a> CompilePipeline<'a> {
    /// An empty pipeline reading `RLX_IR_DUMP`.
    pub fn new() -> Self {
        CompilePipeline {
            passes: Vec::new(),
            verify_each: cfg!(debug_assertions),
            dump_dir: rlx_ir::env::get(rlx_ir::env::IR_DUMP).map(PathBuf::from),
            rounds: 1,
        }
    }

    /// Append a pass.
    pub fn with_pass(mut self, p: impl Pass + 'a) -> Self {
        self.passes.push(Box::new(p));
        self
    }

    /// Append a boxed pass (a pass list chosen at run time).
    pub fn with_boxed_pass(mut self, p: Box<dyn Pass + 'a>) -> Self {
        self.passes.push(p);
        self
    }

    /// Verify after every pass (default: on in debug builds).
    pub fn verify_each(mut self, on: bool) -> Self {
        self.verify_each = on;
        self
    }

    /// Dump the graph before and after every pass into `dir` (overrides `RLX_IR_DUMP`).
    pub fn dump_to(mut self, dir: Option<PathBuf>) -> Self {
        self.dump_dir = dir;
        self
    }

    /// Repeat the pass list until no pass rewrites anything, at most `n` times.
    pub fn rounds(mut self, n: usize) -> Self {
        self.rounds = n.max(1);
        self
    }

    fn dump(&self, step: usize, pass: &str, when: &str, g: &Graph) {
        if let Some(dir) = &self.dump_dir {
            let _ = std::fs::create_dir_all(dir);
            let safe = safe_name(g.name());
            let path = dir.join(format!("{safe}.{step:02}.{pass}.{when}.txt"));
            if let Err(e) = std::fs::write(&path, g.to_string()) {
                eprintln!("rlx: cannot write IR dump {}: {e}", path.display());
            }
        }
    }

    /// Whether the pipeline writes IR dumps.
    pub(crate) fn dumps(&self) -> bool {
        self.dump_dir.is_some()
    }

    /// Write `text` as `<graph>.<stage>.txt` in the dump directory, if any.
    pub(crate) fn dump_stage(&self, g: &Graph, stage: &str, text: &str) {
        if let Some(dir) = &self.dump_dir {
            let _ = std::fs::create_dir_all(dir);
            let path = dir.join(format!("{}.{stage}.txt", safe_name(g.name())));
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("rlx: cannot write IR dump {}: {e}", path.display());
            }
        }
    }

    /// Run the passes over `g`.
    pub fn run(&self, g: &Graph) -> Result<CompileResult> {
        verify(g)?;
        let mut cur = g.clone();
        let mut records = Vec::new();
        let mut step = 0;
        for _ in 0..self.rounds {
            let mut any = false;
            for p in &self.passes {
                self.dump(step, p.name(), "before", &cur);
                let (next, fired, sites) = p.run_logged(&cur)?;
                let rewrites = fired.values().sum();
                if self.verify_each {
                    verify(&next)?;
                }
                self.dump(step, p.name(), "after", &next);
                records.push(PassRecord {
                    pass: p.name().to_string(),
                    nodes_before: cur.len(),
                    nodes_after: next.len(),
                    rewrites,
                    fired,
                    sites,
                });
                any |= rewrites > 0;
                cur = next;
                step += 1;
            }
            if !any {
                break;
            }
        }
        Ok(CompileResult {
            graph: cur,
            records,
        })
    }
}

/// A graph name usable in a file name.
fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_alphanumeric() { c } else { '_' })
        .collect()
}

impl Default for CompilePipeline<'_> {
    fn default() -> Self {
        Self::new()
    }
}
