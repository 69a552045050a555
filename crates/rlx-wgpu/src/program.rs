//! Lowering a graph to a list of compute dispatches over one device arena.
//!
//! Every value is dense, one 32-bit word per element (GGUF rows: packed bytes; see [`Form`]), at
//! an offset of the graph's arena (constants, inputs, intermediates) or of the params buffers,
//! laid out by the memory planner; a reshape is the same words under
//! other dims, a transpose, narrow, expand or concat a strided copy. Each step reads its
//! shapes and offsets from its words in one meta buffer, so pipelines are shared by every step
//! of the same kind. A run is one command submission; outputs are copied out on request.
//!
//! The phases: each node's kernel, per op family (`select.rs`, the kernels in `kernel.rs`); the
//! arena's layout and buffers (`steps.rs`: one buffer, or buffers of `shaders::ARENA_CHUNK`
//! bytes bound side by side when the arena is larger than the adapter binds at once); each
//! step's meta words and shader (`meta.rs`); pipelines and bind groups (`steps.rs`).
//!
//! Mesa's software Vulkan (lavapipe) ends a shader invocation's loops after 65535 iterations
//! in all, silently. On such an adapter (`Gpu::loop_limited`) a node whose invocation would
//! loop longer is a compile error naming the op and node, never a wrong result; the native
//! kernels of `nn` are taken only within `nn::LOOP_LIMIT`, else decomposed.

mod kernel;
mod meta;
mod select;
mod steps;

use crate::shaders::{self, ARENA_CHUNK, PARAMS_CHUNK, RANK};
use crate::values::{device_bytes, forms, from_words, to_words, Form};
use crate::Gpu;
use rlx_driver::{Executable, IoSlot};
use rlx_ir::ops::complex::{primitive_of, Primitive};
use rlx_ir::{DType, Error, Graph, NodeId, Op, Result};
use std::sync::Arc;

struct Step {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    groups: (u32, u32, u32),
    /// The node it computes and its op, for the profile.
    node: usize,
    op: &'static str,
}

/// One dispatch's share of the runs profiled (`RLX_PROFILE`, [`GpuProgram::profile`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// The op the dispatch computes.
    pub op: &'static str,
    /// Its node.
    pub node: usize,
    /// Its workgroups.
    pub groups: (u32, u32, u32),
    /// Device time over every run, from timestamp queries (`None` where the adapter has none).
    pub ns: Option<u64>,
    /// Runs it took part in.
    pub runs: u64,
}

/// What `RLX_PROFILE` keeps for a program: per-dispatch timestamps where the device has them,
/// and the device's counts when profiling began.
struct Profile {
    /// Two timestamps per dispatch (the first [`PROFILED_STEPS`]).
    timing: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
    ns: Vec<u64>,
    runs: u64,
    /// What the runs (`execute`, the profile's own timestamp read included) asked of the
    /// device, summed over runs.
    work: crate::Counts,
    /// Outputs read (each a wait).
    reads: std::sync::atomic::AtomicU64,
}

/// Dispatches a profile times (a query set holds at most 4096 timestamps).
const PROFILED_STEPS: usize = 2048;

/// Where a value's words are: a byte offset in the graph's arena or in the params buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loc {
    Arena(u64),
    Params(u64),
}

/// A graph compiled for a wgpu device.
pub struct GpuProgram {
    gpu: Arc<Gpu>,
    /// The graph's arena: one buffer, or several of `ARENA_CHUNK` bytes when it is larger than
    /// one binding may be.
    arena: Vec<wgpu::Buffer>,
    /// The params buffers: this graph's own, or those of the graph it shares params with.
    pbuf: Arc<Vec<wgpu::Buffer>>,
    steps: Vec<Step>,
    inputs: Vec<IoSlot>,
    params: Vec<IoSlot>,
    outputs: Vec<IoSlot>,
    input_at: Vec<u64>,
    param_at: Vec<Loc>,
    output_at: Vec<Loc>,
    input_form: Vec<Form>,
    param_form: Vec<Form>,
    output_form: Vec<Form>,
    /// One mappable buffer per output, which every run's submission copies the output into:
    /// reading it back makes no buffer and submits nothing.
    staging: Vec<wgpu::Buffer>,
    profile: Option<Profile>,
}

impl GpuProgram {
    /// Number of dispatches per run.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The op of each dispatch, in order (a node may take several).
    pub fn step_ops(&self) -> Vec<&'static str> {
        self.steps.iter().map(|s| s.op).collect()
    }

    /// Per dispatch, what the runs since compiling took (`RLX_PROFILE` set; empty otherwise):
    /// device time from timestamp queries where the adapter has them.
    pub fn profile(&self) -> Vec<StepTime> {
        let Some(p) = &self.profile else {
            return Vec::new();
        };
        self.steps
            .iter()
            .enumerate()
            .map(|(i, s)| StepTime {
                op: s.op,
                node: s.node,
                groups: s.groups,
                ns: p.timing.as_ref().and_then(|_| p.ns.get(i).copied()),
                runs: p.runs,
            })
            .collect()
    }
}

impl Drop for GpuProgram {
    /// Under `RLX_PROFILE`: print the time per op kind and the slowest dispatches (op, node,
    /// workgroups, microseconds per run), and what each run asked of the device.
    fn drop(&mut self) {
        let Some(p) = &self.profile else {
            return;
        };
        if p.runs == 0 {
            return;
        }
        let c = p.work;
        let per = |n: u64| n as f64 / p.runs as f64;
        eprintln!(
            "rlx-wgpu profile: {} runs of {} dispatches on {}; per run: {:.1} submissions, {:.1} \
             buffers and {:.1} bind groups made, {:.1} waits (the profile's timestamp read \
             included), {:.1} outputs read (a wait each)",
            p.runs,
            self.steps.len(),
            self.gpu.info.name,
            per(c.submissions),
            per(c.buffers),
            per(c.bind_groups),
            per(c.waits),
            per(p.reads.load(std::sync::atomic::Ordering::Relaxed))
        );
        let steps = self.profile();
        if p.timing.is_none() {
            eprintln!("  (no timestamp queries on this adapter: counts only)");
            return;
        }
        let mut kinds: Vec<(&str, u64, u64)> = Vec::new();
        for s in &steps {
            let ns = s.ns.unwrap_or(0);
            match kinds.iter_mut().find(|k| k.0 == s.op) {
                Some(k) => {
                    k.1 += ns;
                    k.2 += 1;
                }
                None => kinds.push((s.op, ns, 1)),
            }
        }
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
        let total: u64 = kinds.iter().map(|k| k.1).sum::<u64>().max(1);
        for (op, ns, n) in &kinds {
            eprintln!(
                "  {op:<20} {:>10.1} us/run {:>5.1}%  {n} dispatches",
                *ns as f64 / 1e3 / p.runs as f64,
                100.0 * *ns as f64 / total as f64
            );
        }
        let mut order: Vec<&StepTime> = steps.iter().collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.ns.unwrap_or(0)));
        let top = rlx_ir::env::count(rlx_ir::env::PROFILE_TOP).unwrap_or(30);
        eprintln!("  slowest dispatches:");
        for s in order.into_iter().take(top) {
            eprintln!(
                "  {:>10.1} us/run  {} (node %{}) workgroups {:?}",
                s.ns.unwrap_or(0) as f64 / 1e3 / p.runs as f64,
                s.op,
                s.node,
                s.groups
            );
        }
    }
}

/// Why the wgpu backend cannot run node `id`, or `None` when it can.
pub fn unsupported(g: &Graph, id: NodeId) -> Option<String> {
    let n = g.node(id);
    let out = n.shape.dtype();
    let ins: Vec<DType> = n.inputs.iter().map(|i| g.shape(*i).dtype()).collect();
    // c64 values are pairs of f32 words: leaves hold them and the three complex primitives
    // move parts in and out (every other complex op decomposes into real ops on the parts).
    if let Some(p) = primitive_of(&n.op) {
        let want = match p {
            Primitive::Complex => (ins.iter().all(|&d| d == DType::F32), DType::C64),
            Primitive::Real | Primitive::Imag => (ins == [DType::C64], DType::F32),
        };
        if want.0 && out == want.1 && n.shape.rank() <= RANK {
            return None;
        }
    }
    let leaf = matches!(
        n.op,
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. }
    );
    if let Some(d) = std::iter::once(out)
        .chain(ins.iter().copied())
        .find(|&d| shaders::wgsl_type(d).is_none() && !(leaf && d == DType::C64))
    {
        return Some(format!(
            "{d} values do not run on the GPU (f32, f16, bf16, i32, i16, i8, u32, u8 and bool do; c64 through complex, real and imag)"
        ));
    }
    if n.shape.rank() > RANK || n.inputs.iter().any(|i| g.shape(*i).rank() > RANK) {
        return Some(format!("rank above {RANK}"));
    }
    let float = |d: DType| shaders::wgsl_type(d) == Some("f32");
    let ok = match &n.op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => true,
        Op::Binary(_) | Op::Activation(_) | Op::Compare(_) | Op::Where | Op::Cast { .. } => {
            shaders::elementwise_op(&n.op, out, &ins)
        }
        Op::MatMul => float(out) && (2..=6).contains(&n.shape.rank()),
        Op::Reduce { .. } | Op::Softmax { .. } => float(out),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Narrow { .. }
        | Op::Expand { .. }
        | Op::Concat { .. } => true,
        Op::Fused(r) => match r.kind {
            rlx_ir::FusionKind::Elementwise => shaders::elementwise(&r.body).is_some(),
            rlx_ir::FusionKind::MultiplyReduce => shaders::multiply_reduce(&r.body).is_some(),
            rlx_ir::FusionKind::NormMatMul => norm_region_runs(g, id),
            _ => false,
        },
        Op::DotGeneral(_) => false,
        Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Attention { .. }
        | Op::Rope { .. }
        | Op::Conv(_)
        | Op::Pool(_) => crate::nn::native(g, id),
        Op::Gather { .. } => matches!(ins[1], DType::I32 | DType::U32),
        Op::Cumsum { .. } => float(out),
        Op::ScatterAdd { .. } => float(out) && matches!(ins[1], DType::I32 | DType::U32),
        Op::TopK { .. } => ins[0] != DType::Bool,
        Op::DequantMatMul { scheme } => {
            float(out) && ins[0] == DType::F32 && shaders::gguf_decoder(*scheme).is_some()
        }
        Op::DequantizeRows { scheme } => float(out) && shaders::gguf_decoder(*scheme).is_some(),
        // The position form only (the slot form of a paged cache has no WGSL kernel yet).
        Op::CacheWrite => {
            float(out) && float(ins[1]) && g.shape(n.inputs[2]).static_dims() == Some(vec![1])
        }
        Op::CachedAttention { .. } => float(out) && float(ins[1]),
        Op::Custom(_) => false,
        Op::Defined(_) => crate::registered::kernel_for(g, id).is_some(),
        Op::PagedAttention { .. } => false,
    };
    (!ok).then(|| format!("{} on {} has no WGSL kernel yet", n.op.name(), n.shape))
}

/// Whether the decode product at `id` takes the RMSNorm it reads (and the residual add before
/// it, where the pattern joins it) into its step: what `WgpuBackend::fuses` answers for
/// `norm_matmul` regions. The product normalizes its staged activations
/// (`shaders::dequant_matvec`'s `norm`): a block type whose activations round to blocks of 32
/// or not at all ([`shaders::norm_fuses`]), a few rows that fit in workgroup memory, f32
/// operand, gamma and norm.
pub(crate) fn takes_norm(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    let Op::DequantMatMul { scheme } = n.op else {
        return false;
    };
    let h = n.inputs[0];
    let f32s = |x: NodeId| g.shape(x).dtype() == DType::F32;
    matches!(g.node(h).op, Op::RmsNorm { .. })
        && f32s(h)
        && g.node(h).inputs.iter().all(|&x| f32s(x))
        && norm_product_fits(g, h, scheme)
        && unsupported(g, id).is_none()
        && unsupported(g, h).is_none()
}

/// Activations `x` of a product of `scheme` a staged decode product can normalize itself.
fn norm_product_fits(g: &Graph, x: NodeId, scheme: rlx_ir::QuantScheme) -> bool {
    let Some(d) = g.shape(x).static_dims() else {
        return false;
    };
    let k = d.last().copied().unwrap_or(1).max(1);
    let xe: usize = d.iter().product();
    shaders::norm_fuses(scheme)
        && shaders::gguf_decoder(scheme).is_some()
        && shaders::matvec_staged(xe / k, xe)
}

/// Whether the `norm_matmul` region whose result `id` is runs here: one of a GGUF product
/// that normalizes its staged activations ([`takes_norm`]), every value f32.
fn norm_region_runs(g: &Graph, id: NodeId) -> bool {
    let f32s = |x: NodeId| g.shape(x).dtype() == DType::F32;
    rlx_opt::norm_matmul_parts(g, id).is_some_and(|p| {
        p.scheme.is_some_and(|s| norm_product_fits(g, p.x, s))
            && f32s(id)
            && f32s(p.x)
            && f32s(p.gamma)
            && p.residual.is_none_or(f32s)
    })
}

/// Compile `g` for `gpu`; params with the name and shape of a param that `share` holds in its
/// params buffer use that storage (`Backend::compile_sharing`), the others get their own.
///
/// In phases: each node's kernel and the arena requests of the values ([`select`]); the arena's
/// layout and buffers and the params buffers ([`steps`]); each step's meta words and shader
/// ([`meta`]), pipeline and bind group ([`steps`]).
pub fn compile(gpu: Arc<Gpu>, g: &Graph, share: Option<&GpuProgram>) -> Result<GpuProgram> {
    // f16 values as halves where the adapter can (RLX_WGPU_F16_STORAGE=0: as words).
    let half = gpu.f16
        && !rlx_ir::env::is_off(rlx_ir::env::WGPU_F16_STORAGE)
        && g.ids().any(|id| g.shape(id).dtype() == DType::F16);
    let form = forms(g, half)?;
    let sel = select::select(&gpu, g, share, &form)?;
    let layout = steps::layout(&gpu, g, &sel.reqs, &form)?;
    let offsets = &layout.plan.offsets;
    let arena = steps::arena(&gpu, &layout);
    let pbuf = steps::params(&gpu, g, share, sel.pbuf_size)?;
    steps::write_consts(&gpu, &arena, offsets, &sel.consts);
    let words = meta::Words {
        pbuf_of: &sel.pbuf_of,
        req_of: &sel.req_of,
        off_of: &sel.off_of,
        offsets,
        form: &form,
        subgroups: gpu.subgroups,
        matvec_groups: shaders::matvec_groups(gpu.loop_limited()),
    };
    let (meta, planned) = steps::pipelines(&gpu, g, &sel.pending, &words, layout.memory)?;
    let steps = steps::bind(&gpu, &meta, planned, &arena, &pbuf);
    let at = |rs: &[usize]| rs.iter().map(|&r| offsets[r] as u64).collect::<Vec<_>>();
    let param_at = sel
        .param_loc
        .iter()
        .zip(&sel.param_req)
        .map(|(p, &r)| match p {
            Some(off) => Loc::Params(*off),
            None => Loc::Arena(offsets[r] as u64),
        })
        .collect();
    let outputs = g
        .outputs()
        .iter()
        .enumerate()
        .map(|(i, o)| IoSlot {
            name: format!("out{i}"),
            shape: g.shape(*o).clone(),
        })
        .collect();
    let output_at = g
        .outputs()
        .iter()
        .map(|o| {
            let view = sel.off_of[o.index()] as u64;
            match sel.pbuf_of[o.index()] {
                Some(off) => Loc::Params(off + view),
                None => Loc::Arena(
                    offsets[sel.req_of[o.index()].expect("outputs have words")] as u64 + view,
                ),
            }
        })
        .collect();
    let leaf_forms = |leaf: fn(&Op) -> bool| -> Vec<Form> {
        g.ids()
            .filter(|&id| leaf(&g.node(id).op))
            .map(|id| form[id.index()])
            .collect()
    };
    let staging = g
        .outputs()
        .iter()
        .map(|&o| {
            let bytes = g.shape(o).size_bytes().unwrap_or(0);
            let size = (device_bytes(form[o.index()], bytes) as u64)
                .next_multiple_of(4)
                .max(4);
            gpu.create_buffer(&wgpu::BufferDescriptor {
                label: Some("rlx output"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
        .collect();
    let profile = rlx_ir::env::is_set(rlx_ir::env::PROFILE).then(|| {
        let timed = steps.len().min(PROFILED_STEPS);
        let timing = (gpu.timestamps && timed > 0).then(|| {
            let count = 2 * timed as u32;
            let bytes = (count as u64 * 8).next_multiple_of(wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT);
            let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("rlx profile"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let resolve = gpu.create_buffer(&wgpu::BufferDescriptor {
                label: Some("rlx profile resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let readback = gpu.create_buffer(&wgpu::BufferDescriptor {
                label: Some("rlx profile readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (queries, resolve, readback)
        });
        Profile {
            timing,
            ns: vec![0; steps.len()],
            runs: 0,
            work: crate::Counts::default(),
            reads: Default::default(),
        }
    });
    Ok(GpuProgram {
        profile,
        staging,
        input_form: leaf_forms(|op| matches!(op, Op::Input { .. })),
        param_form: leaf_forms(|op| matches!(op, Op::Param { .. })),
        output_form: g.outputs().iter().map(|o| form[o.index()]).collect(),
        input_at: at(&sel.input_req),
        param_at,
        output_at,
        gpu,
        arena,
        pbuf,
        steps,
        inputs: sel.inputs,
        params: sel.params,
        outputs,
    })
}

const _: () = assert!(ARENA_CHUNK == PARAMS_CHUNK, "pieces() splits both alike");

/// The pieces of `len` bytes at byte `off` of memory held in `bufs` (one buffer, or buffers of
/// [`ARENA_CHUNK`] = [`PARAMS_CHUNK`] bytes each): `(buffer, offset, start in the bytes, length)`.
fn pieces(bufs: &[wgpu::Buffer], off: u64, len: u64) -> Vec<(&wgpu::Buffer, u64, usize, usize)> {
    if bufs.len() == 1 {
        return vec![(&bufs[0], off, 0, len as usize)];
    }
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let at = off + done;
        let (c, within) = ((at / ARENA_CHUNK) as usize, at % ARENA_CHUNK);
        let n = (len - done).min(ARENA_CHUNK - within);
        out.push((&bufs[c], within, done as usize, n as usize));
        done += n;
    }
    out
}

impl GpuProgram {
    /// The pieces of `len` bytes at `loc` (see [`pieces`]).
    fn pieces(&self, loc: Loc, len: u64) -> Vec<(&wgpu::Buffer, u64, usize, usize)> {
        match loc {
            Loc::Arena(off) => pieces(&self.arena, off, len),
            Loc::Params(off) => pieces(&self.pbuf, off, len),
        }
    }

    /// Read the words at `loc` as `out.len()` host bytes of `dt`.
    fn read_words(&self, loc: Loc, f: Form, out: &mut [u8]) -> Result<()> {
        let mut words = vec![0u8; device_bytes(f, out.len())];
        for (buf, at, start, n) in self.pieces(loc, words.len() as u64) {
            self.gpu.read(buf, at, &mut words[start..start + n])?;
        }
        from_words(f, &words, out);
        Ok(())
    }

    fn write_words(&self, loc: Loc, f: Form, bytes: &[u8]) -> Result<()> {
        self.gpu.check()?;
        let words = to_words(f, bytes);
        for (buf, at, start, n) in self.pieces(loc, words.len() as u64) {
            self.gpu
                .queue
                .write_buffer(buf, at, &words[start..start + n]);
        }
        Ok(())
    }

    /// Count a profiled run and add its dispatches' times (a wait for the run).
    fn record_profile(&mut self) -> Result<()> {
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        p.runs += 1;
        let Some((_, _, readback)) = &p.timing else {
            return Ok(());
        };
        let mut bytes = vec![0u8; readback.size() as usize];
        self.gpu.read_staging(readback, &mut bytes)?;
        let period = self.gpu.queue.get_timestamp_period() as f64;
        let stamps: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        for (i, ns) in p.ns.iter_mut().enumerate().take(PROFILED_STEPS) {
            let (a, b) = (stamps[2 * i], stamps[2 * i + 1]);
            *ns += (b.saturating_sub(a) as f64 * period) as u64;
        }
        Ok(())
    }

    /// The device this program runs on (shared by every program of its device kind).
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

impl Executable for GpuProgram {
    fn inputs(&self) -> &[IoSlot] {
        &self.inputs
    }

    fn params(&self) -> &[IoSlot] {
        &self.params
    }

    fn outputs(&self) -> &[IoSlot] {
        &self.outputs
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.inputs[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("input", slot, bytes.len()));
        }
        self.write_words(Loc::Arena(self.input_at[idx]), self.input_form[idx], bytes)
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(bytes.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, bytes.len()));
        }
        self.write_words(self.param_at[idx], self.param_form[idx], bytes)
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let dt = self.params[idx].shape.dtype();
        let size = self.params[idx].shape.size_bytes().unwrap_or(0);
        if offset.checked_add(bytes.len()).is_none_or(|e| e > size) {
            return Err(Error::Invalid(format!(
                "bytes {offset}..+{} are outside param \"{}\" ({size} bytes)",
                bytes.len(),
                self.params[idx].name
            )));
        }
        let w = dt.size_bytes();
        if !offset.is_multiple_of(w) || !bytes.len().is_multiple_of(w) {
            // Not whole elements: go through the whole param.
            let mut all = vec![0u8; size];
            self.read_param(idx, &mut all)?;
            all[offset..offset + bytes.len()].copy_from_slice(bytes);
            return self.write_param(idx, &all);
        }
        let f = self.param_form[idx];
        let at = match self.param_at[idx] {
            Loc::Arena(o) => Loc::Arena(o + device_bytes(f, offset) as u64),
            Loc::Params(o) => Loc::Params(o + device_bytes(f, offset) as u64),
        };
        self.write_words(at, f, bytes)
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.params[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("param", slot, out.len()));
        }
        self.read_words(self.param_at[idx], self.param_form[idx], out)
    }

    fn execute(&mut self) -> Result<()> {
        self.gpu.check()?;
        let before = self.profile.as_ref().map(|_| self.gpu.counts());
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rlx run"),
            });
        let timing = self.profile.as_ref().and_then(|p| p.timing.as_ref());
        match timing {
            None => {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("rlx steps"),
                    timestamp_writes: None,
                });
                for s in &self.steps {
                    pass.set_pipeline(&s.pipeline);
                    pass.set_bind_group(0, &s.bind, &[]);
                    pass.dispatch_workgroups(s.groups.0, s.groups.1, s.groups.2);
                }
            }
            // Profiling with timestamps: a pass per dispatch, timed at its start and end.
            Some((queries, resolve, readback)) => {
                for (i, s) in self.steps.iter().enumerate() {
                    let timed = i < PROFILED_STEPS;
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("rlx step"),
                        timestamp_writes: timed.then(|| wgpu::ComputePassTimestampWrites {
                            query_set: queries,
                            beginning_of_pass_write_index: Some(2 * i as u32),
                            end_of_pass_write_index: Some(2 * i as u32 + 1),
                        }),
                    });
                    pass.set_pipeline(&s.pipeline);
                    pass.set_bind_group(0, &s.bind, &[]);
                    pass.dispatch_workgroups(s.groups.0, s.groups.1, s.groups.2);
                }
                let count = 2 * self.steps.len().min(PROFILED_STEPS) as u32;
                enc.resolve_query_set(queries, 0..count, resolve, 0);
                enc.copy_buffer_to_buffer(resolve, 0, readback, 0, resolve.size());
            }
        }
        // The outputs into their staging buffers, in the same submission.
        for (i, slot) in self.outputs.iter().enumerate() {
            let bytes = device_bytes(self.output_form[i], slot.shape.size_bytes().unwrap_or(0));
            for (buf, at, start, n) in self.pieces(self.output_at[i], bytes as u64) {
                if n > 0 {
                    let size = (n as u64).next_multiple_of(4);
                    enc.copy_buffer_to_buffer(buf, at, &self.staging[i], start as u64, size);
                }
            }
        }
        self.gpu.submit(enc.finish());
        self.gpu.check()?;
        self.record_profile()?;
        if let (Some(p), Some(before)) = (&mut self.profile, before) {
            let d = self.gpu.counts() - before;
            p.work = crate::Counts {
                submissions: p.work.submissions + d.submissions,
                buffers: p.work.buffers + d.buffers,
                bind_groups: p.work.bind_groups + d.bind_groups,
                waits: p.work.waits + d.waits,
            };
        }
        Ok(())
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.outputs[idx];
        if Some(out.len()) != slot.shape.size_bytes() {
            return Err(rlx_driver::byte_length_error("output", slot, out.len()));
        }
        if let Some(p) = &self.profile {
            p.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let f = self.output_form[idx];
        let mut words = vec![0u8; device_bytes(f, out.len())];
        self.gpu.read_staging(&self.staging[idx], &mut words)?;
        from_words(f, &words, out);
        Ok(())
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
