//! Sessions: pick a backend for a device and run the compile pipeline.
//!
//! A compile runs, in this order:
//!
//! ```text
//! backend_for(device)           a backend registered at run time, else the built-in one
//! optimize_graph                CompilePipeline, up to 4 rounds until nothing rewrites:
//!   LowerHir, AutoMixedPrecision (when a policy is set), AlgebraicSimplify, Cse,
//!   ConstantFolding, DeadCodeElimination (these four unless without_optimizations),
//!   Decompose (what the backend's supports refuses)
//! rlx_opt::prepare              fusion into the regions the backend's fuses takes,
//!                               and the LoweringPlan's side tables
//! plan_nested                   the same for the graphs control-flow ops carry, where
//!                               the backend runs those ops natively
//! Backend::compile              or compile_sharing, with CompileOptions { threads, updates, plan }
//! ```
//!
//! Everything before `Backend::compile` is what the compile cache keeps, when the session has
//! one.

use crate::{CompileCache, CompiledGraph};
use rlx_driver::{registered_backend, Backend, CompileOptions, Device};
use rlx_ir::{Error, Graph, Result};
use rlx_opt::{
    AlgebraicSimplify, AutoMixedPrecision, CompilePipeline, CompileResult, ConstantFolding, Cse,
    DeadCodeElimination, Decompose, LowerHir, LoweringOptions, PassRecord, PrecisionPolicy,
    RuleSite,
};
use std::sync::Arc;

/// What a compile starts from: a graph, or a graph built only when the compile cache does not
/// answer for its key.
enum Source<'a> {
    Graph(Graph),
    Built {
        key: &'a str,
        build: Box<dyn FnOnce() -> Result<Graph> + 'a>,
    },
}

/// A graph as a session's pipeline hands it to the backend ([`Session::try_lower`]).
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The graph after the passes, decomposition and fusion.
    pub graph: Graph,
    /// The compiler's decisions for it.
    pub plan: Arc<rlx_opt::LoweringPlan>,
    /// What each pass did.
    pub records: Vec<PassRecord>,
}

/// Compiles graphs for one device.
#[derive(Clone, Debug)]
pub struct Session {
    device: Device,
    threads: Option<usize>,
    optimize: bool,
    precision: PrecisionPolicy,
    cache: Option<Arc<CompileCache>>,
}

/// The backend serving `device`: one registered at run time, else the built-in one.
pub(crate) fn backend_for(device: Device) -> Result<Arc<dyn Backend>> {
    if let Some(b) = registered_backend(device) {
        return Ok(b);
    }
    match device {
        #[cfg(feature = "cpu")]
        Device::Cpu => Ok(Arc::new(rlx_cpu::CpuBackend)),
        #[cfg(feature = "gpu")]
        Device::Gpu | Device::Vulkan | Device::DirectX | Device::OpenGl | Device::WebGpu => {
            Ok(Arc::new(rlx_wgpu::WgpuBackend { device }))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda => Ok(Arc::new(rlx_cuda::CudaBackend)),
        d => Err(Error::DeviceUnavailable {
            device: d.to_string(),
            hint: d.availability_hint(),
        }),
    }
}

/// Print a compile report to stderr when environment variable `var` is `1` (text) or `json`.
/// Both forms are made only when asked for.
fn report(
    var: rlx_ir::env::Var,
    graph: &str,
    text: &dyn Fn() -> String,
    json: &dyn Fn() -> String,
) {
    match rlx_ir::env::get(var).as_deref() {
        Some("1") => eprintln!("rlx: graph \"{graph}\": {}", text()),
        Some("json") => eprintln!("{}", json()),
        _ => {}
    }
}

/// The process's shared compile cache when `RLX_COMPILE_CACHE` asks for one: `1` for
/// [`CompileCache::default_dir`], `memory` for memory only, anything else a directory.
fn env_cache() -> Option<Arc<CompileCache>> {
    static CACHE: std::sync::OnceLock<Option<Arc<CompileCache>>> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(
            || match rlx_ir::env::get(rlx_ir::env::COMPILE_CACHE)?.as_str() {
                "" | "0" => None,
                "1" => Some(CompileCache::on_disk()),
                "memory" => Some(CompileCache::in_memory()),
                dir => Some(CompileCache::at(dir)),
            },
        )
        .clone()
}

impl Session {
    /// A session for `device` (threads: `RLX_NUM_THREADS`, else one per core; a compile cache
    /// when `RLX_COMPILE_CACHE` is `1` (the RLX cache directory), `memory` or a directory).
    pub fn new(device: Device) -> Session {
        let threads = rlx_ir::env::threads();
        Session {
            device,
            threads,
            optimize: true,
            precision: PrecisionPolicy::default(),
            cache: env_cache(),
        }
    }

    /// Use `n` threads for kernels.
    pub fn with_threads(mut self, n: usize) -> Session {
        self.threads = Some(n.max(1));
        self
    }

    /// Compute as `policy` says (see [`PrecisionPolicy`]): with
    /// [`PrecisionPolicy::AutoMixedBf16`] matrix products run in bf16 (f32 sums, rounded once)
    /// and everything numerically sensitive in f32. Inputs, outputs and `run`'s f32 API are
    /// unchanged; a param read only by low-precision products is stored in that precision (so
    /// `get_param` returns it rounded), except params bound as updates, which keep their f32
    /// master copy and are cast at each run.
    pub fn with_precision(mut self, policy: PrecisionPolicy) -> Session {
        self.precision = policy;
        self
    }

    /// Keep the optimized graphs of compiles in `cache` (see [`CompileCache`]): a later compile
    /// of the same graph with the same options, by any session sharing the cache or, with a
    /// cache on disk, by another process, skips the optimizing passes.
    pub fn with_compile_cache(mut self, cache: Arc<CompileCache>) -> Session {
        self.cache = Some(cache);
        self
    }

    /// The compile cache, if any.
    pub fn compile_cache(&self) -> Option<&Arc<CompileCache>> {
        self.cache.as_ref()
    }

    /// The precision policy.
    pub fn precision(&self) -> &PrecisionPolicy {
        &self.precision
    }

    /// Skip the optimizing passes (decomposition of unsupported ops still runs).
    pub fn without_optimizations(mut self) -> Session {
        self.optimize = false;
        self
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Verify, optimize and compile `graph`.
    pub fn try_compile(&self, graph: Graph) -> Result<CompiledGraph> {
        self.compile_inner(Source::Graph(graph), None, &[])
    }

    /// What compiling `graph` hands the backend, without compiling it (no device needed): the
    /// graph after the session's passes, decomposed and fused for the device's backend, and its
    /// lowering plan and pass records (JAX's `jit(f).lower(...)`). A CUDA graph can be lowered
    /// and its kernels compile-checked on a machine without a GPU.
    pub fn try_lower(&self, graph: Graph) -> Result<Lowered> {
        if graph.outputs().is_empty() {
            return Err(Error::Invalid(format!(
                "graph \"{}\" has no outputs; call set_outputs before lowering",
                graph.name()
            )));
        }
        let backend = backend_for(self.device)?;
        let mut lowering = LoweringOptions::default();
        lowering.fusion.elementwise &= self.optimize;
        lowering.fusion.patterns &= self.optimize;
        lowering.param_panels = backend.param_panels();
        let lowering = lowering.with_env();
        let entry = self.plan(&graph, &backend, &[], &lowering)?;
        Ok(Lowered {
            graph: entry.graph,
            plan: entry.plan,
            records: entry.records,
        })
    }

    /// [`Session::try_compile`] with param updates bound as by
    /// [`CompiledGraph::try_bind_update`]: after every run, output `i` of each `(param, i)`
    /// overwrites that param. Known at compile time, an update whose old value nothing reads
    /// afterwards is computed straight into the param's storage, with no copy after the run.
    pub fn try_compile_with_updates(
        &self,
        graph: Graph,
        updates: &[(&str, usize)],
    ) -> Result<CompiledGraph> {
        self.compile_bound(Source::Graph(graph), updates)
    }

    /// [`Session::try_compile_with_updates`] of the graph `build` makes, which is made only when
    /// the compile cache has no entry for `key` (with this session's options): the training
    /// step skips differentiating its model when its step is cached. `key` must determine the
    /// graph completely (say, the canonical text of a model graph plus every setting the build
    /// reads, and the version of the code that builds it); without a cache `build` always runs.
    pub fn try_compile_built(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Graph>,
        updates: &[(&str, usize)],
    ) -> Result<CompiledGraph> {
        self.compile_bound(
            Source::Built {
                key,
                build: Box::new(build),
            },
            updates,
        )
    }

    /// Compile `source` and bind its param updates.
    fn compile_bound(
        &self,
        source: Source<'_>,
        updates: &[(&str, usize)],
    ) -> Result<CompiledGraph> {
        let mut c = self.compile_inner(source, None, updates)?;
        for &(name, output) in updates {
            c.try_bind_update(name, output)?;
        }
        Ok(c)
    }

    /// Like [`Session::try_compile`], but params with the same name and shape as a param of
    /// `other` share its storage instead of getting their own: one copy of a model's weights
    /// serves several graphs (say, prompt processing and single-token decoding). Setting such a
    /// param through either graph changes it for both.
    pub fn try_compile_sharing(
        &self,
        graph: Graph,
        other: &CompiledGraph,
    ) -> Result<CompiledGraph> {
        if other.device() != self.device {
            return Err(Error::Invalid(format!(
                "cannot share params between devices {} and {}",
                other.device(),
                self.device
            )));
        }
        self.compile_inner(Source::Graph(graph), Some(other), &[])
    }

    /// The shared pipeline: precision, simplification, CSE, constant folding, DCE, then
    /// decomposition of what `backend` does not run.
    fn optimize_graph(
        &self,
        graph: &Graph,
        backend: &dyn Backend,
        updates: &[(&str, usize)],
    ) -> Result<CompileResult> {
        let supports = move |g: &Graph, id| backend.supports(g, id);
        let why = move |g: &Graph, id| backend.refusal(g, id);
        // HIR blocks first, so every later pass (and the records) sees MIR.
        let mut pipe = CompilePipeline::new().with_pass(LowerHir);
        if !self.precision.is_identity() {
            pipe = pipe.with_pass(AutoMixedPrecision {
                policy: self.precision.clone(),
                keep_params: updates.iter().map(|&(p, _)| p.to_string()).collect(),
            });
        }
        if self.optimize {
            pipe = pipe
                .with_pass(AlgebraicSimplify)
                .with_pass(Cse)
                .with_pass(ConstantFolding {
                    max_elements: 1 << 16,
                })
                .with_pass(DeadCodeElimination);
        }
        pipe = pipe
            .with_pass(Decompose {
                backend: backend.name(),
                supports: &supports,
                why: Some(&why),
            })
            .rounds(4);
        let result = pipe.run(graph)?;
        rlx_opt::maybe_dump_pipeline(graph, &result.graph);
        Ok(result)
    }

    /// The backend-independent part of a compile: the passes ([`Session::optimize_graph`]),
    /// then fusion for `backend`'s region kernels and the lowering plan's side tables, with a
    /// record of each.
    fn plan(
        &self,
        graph: &Graph,
        backend: &Arc<dyn Backend>,
        updates: &[(String, usize)],
        lowering: &LoweringOptions,
    ) -> Result<crate::cache::Entry> {
        let refs: Vec<(&str, usize)> = updates.iter().map(|(p, o)| (p.as_str(), *o)).collect();
        let mut result = self.optimize_graph(graph, backend.as_ref(), &refs)?;
        let b = backend.clone();
        let accepts = move |g: &Graph, id, kind| b.fuses(g, id, kind);
        let (fused, mut plan) = rlx_opt::prepare(&result.graph, lowering, &accepts, updates)?;
        let fused = self.plan_nested(fused, &mut plan, backend, lowering)?;
        let mut fired: std::collections::BTreeMap<String, usize> = Default::default();
        let mut sites = Vec::new();
        for r in &plan.fusion.regions {
            let rule = format!("fuse:{}", r.kind.name());
            *fired.entry(rule.clone()).or_default() += 1;
            let root = *r.nodes.last().expect("a region has members");
            let op = result
                .graph
                .node(rlx_ir::NodeId(root))
                .op
                .name()
                .to_string();
            sites.push(RuleSite {
                node: root,
                op,
                rule,
            });
        }
        result.records.push(PassRecord {
            pass: "fusion".into(),
            nodes_before: result.graph.len(),
            nodes_after: fused.len(),
            rewrites: plan.fusion.regions.len(),
            fired,
            sites,
        });
        // Debug builds (the tests) check every plan as a cache read checks it, so the check
        // never refuses a plan `prepare` makes.
        if cfg!(debug_assertions) {
            rlx_ir::verify(&fused)?;
            plan.check(&fused)?;
        }
        Ok(crate::cache::Entry {
            graph: fused,
            records: result.records,
            plan: Arc::new(plan),
        })
    }

    /// The graphs carried by the nodes of `fused` that `backend` runs natively (control flow's
    /// branches and bodies), taken through the same pipeline as the graph holding them
    /// ([`Session::plan`], recursively): each node gets its graphs back optimized, decomposed
    /// for the backend and fused, and `plan.nested` their lowering plans. A node the backend
    /// does not run was decomposed (its graphs inlined) before this.
    fn plan_nested(
        &self,
        fused: Graph,
        plan: &mut rlx_opt::LoweringPlan,
        backend: &Arc<dyn Backend>,
        lowering: &LoweringOptions,
    ) -> Result<Graph> {
        let carries = |id: rlx_ir::NodeId| match &fused.node(id).op {
            rlx_ir::Op::Defined(d) => !d.def().graphs().is_empty(),
            _ => false,
        };
        if !fused.ids().any(carries) {
            return Ok(fused);
        }
        let mut out = Graph::new(fused.name());
        for id in fused.ids() {
            let node = fused.node(id);
            let op = match &node.op {
                rlx_ir::Op::Defined(d) if carries(id) && backend.supports(&fused, id) => {
                    let mut graphs = Vec::new();
                    let mut plans = Vec::new();
                    for (_, body) in d.def().graphs() {
                        let entry = self.plan(body, backend, &[], lowering)?;
                        graphs.push(entry.graph);
                        plans.push(Arc::unwrap_or_clone(entry.plan));
                    }
                    plan.nested.insert(id.0, plans);
                    rlx_ir::Op::Defined(d.def().with_graphs(graphs)?)
                }
                op => op.clone(),
            };
            out.push_unchecked(op, node.inputs.clone(), node.shape.clone());
        }
        out.set_outputs_unchecked(fused.outputs().to_vec());
        Ok(out)
    }

    fn compile_inner(
        &self,
        source: Source<'_>,
        share: Option<&CompiledGraph>,
        updates: &[(&str, usize)],
    ) -> Result<CompiledGraph> {
        /// The graph itself, built if need be, with outputs to compile.
        fn realize(source: Source<'_>) -> Result<Graph> {
            let graph = match source {
                Source::Graph(g) => g,
                Source::Built { build, .. } => build()?,
            };
            if graph.outputs().is_empty() {
                return Err(Error::Invalid(format!(
                    "graph \"{}\" has no outputs; call set_outputs before compiling",
                    graph.name()
                )));
            }
            Ok(graph)
        }
        let source = match source {
            Source::Graph(g) => Source::Graph(realize(Source::Graph(g))?),
            built => built,
        };
        let backend = backend_for(self.device)?;
        let updates: Vec<(String, usize)> =
            updates.iter().map(|&(p, o)| (p.to_string(), o)).collect();
        let mut lowering = LoweringOptions::default();
        lowering.fusion.elementwise &= self.optimize;
        lowering.fusion.patterns &= self.optimize;
        lowering.param_panels = backend.param_panels();
        let lowering = lowering.with_env();
        let entry = match &self.cache {
            Some(cache) => {
                let options = format!(
                    "optimize={} precision={:?} updates={:?} lowering={:?}",
                    self.optimize, self.precision, updates, lowering
                );
                let device = self.device.to_string();
                let key = match &source {
                    Source::Graph(g) => crate::cache::key(g, backend.name(), &device, &options),
                    Source::Built { key, .. } => {
                        crate::cache::key_of("built", key, backend.name(), &device, &options)
                    }
                };
                match cache.get(&key) {
                    Some(e) => e,
                    None => {
                        let graph = realize(source)?;
                        cache.put(&key, self.plan(&graph, &backend, &updates, &lowering)?)
                    }
                }
            }
            None => Arc::new(self.plan(&realize(source)?, &backend, &updates, &lowering)?),
        };
        let (graph, records, plan) = (&entry.graph, &entry.records, &entry.plan);
        report(
            rlx_ir::env::FUSION_REPORT,
            graph.name(),
            &|| plan.fusion.to_string(),
            &|| plan.fusion.to_json(),
        );
        if rlx_ir::env::is_set(rlx_ir::env::DISPATCH_REPORT) {
            let dispatch = crate::compiled::dispatch_report(backend.as_ref(), graph, records, plan);
            report(
                rlx_ir::env::DISPATCH_REPORT,
                graph.name(),
                &|| dispatch.to_string(),
                &|| dispatch.to_json(),
            );
        }
        let opts = CompileOptions {
            threads: self.threads,
            updates,
            plan: plan.clone(),
        };
        let exe = match share {
            Some(other) => backend.compile_sharing(graph, &opts, other.executable())?,
            None => backend.compile(graph, &opts)?,
        };
        Ok(CompiledGraph::new(exe, entry.clone(), backend, self.device))
    }

    /// Short form of [`Session::try_compile`]; panics with its error.
    #[track_caller]
    pub fn compile(&self, graph: Graph) -> CompiledGraph {
        self.try_compile(graph).unwrap_or_else(|e| panic!("{e}"))
    }
}
