//! RLX GPU backend on wgpu: the same graphs the CPU runs, on Vulkan, Metal, DX12 or WebGPU
//! adapters (tested on Mesa's software Vulkan, lavapipe).
//!
//! The backend only lowers: the compiler has already decomposed what it does not run
//! ([`WgpuBackend::supports`]) and formed the fused regions it takes ([`WgpuBackend::fuses`]).
//! Each elementwise region becomes one generated WGSL shader ([`shaders::elementwise`]);
//! products use a tiled kernel with workgroup-memory tiles; every value lives in one device
//! arena laid out by the memory planner; a run is one command submission.
//!
//! What runs: elementwise ops and regions on f32, f16, bf16, i32, i16, i8, u32, u8 and bool
//! values, multiply-reduce regions, matmul, reductions, softmax, cumsum, top-k, the movement and
//! index ops, and the LLM ops (GGUF `DequantMatMul` / `DequantizeRows` with the rows packed on
//! the device, `CacheWrite`, `CachedAttention`); composites the compiler decomposes into them
//! (dot_general, norms, attention, RoPE, conv, pool, Quantize / Dequantize / FakeQuantize, ...)
//! run too, and c64 values (pairs of f32 words; `complex`, `real` and `imag` are word copies,
//! the rest of complex arithmetic and the FFT's decomposition real ops on the parts). Ops
//! registered from other crates run natively where their crate gave a WGSL kernel
//! ([`register_kernel`]). What does not ([`unsupported`] says why) is a compile error naming the
//! op and node.

#![deny(missing_docs)]

mod nn;
mod program;
pub mod registered;
pub mod shaders;
mod values;

pub use program::{unsupported, GpuProgram, StepTime};
pub use registered::{register_kernel, WgpuKernel, WgslKernel};
pub use values::{from_words, to_words, Form};

use rlx_driver::{Backend, CompileOptions, Device, Executable};
use rlx_ir::{Error, FusionKind, Graph, NodeId, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// An opened adapter: device, queue, limits, and the pipelines compiled so far (by source).
pub struct Gpu {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The adapter's name, backend and driver.
    pub info: wgpu::AdapterInfo,
    /// The limits the device was opened with (the adapter's own).
    pub limits: wgpu::Limits,
    /// Whether f16 values are stored as 16 bits: the adapter has `SHADER_F16` (opened with it)
    /// and binds enough storage buffers to bind each buffer a second time as `array<f16>`.
    pub f16: bool,
    /// Whether the device was opened with subgroup operations (the adapter has `SUBGROUP`;
    /// `RLX_WGPU_SUBGROUPS=0` leaves them off): the few-rows quantized products then add each
    /// subgroup's sums with `subgroupAdd` before the workgroup's.
    pub subgroups: bool,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// Why the device was lost, once it was (then every exchange and run fails with it, and
    /// [`Gpu::get`] opens the adapter again).
    lost: Arc<Mutex<Option<String>>>,
    /// An error the device raised outside an error scope since the last exchange (reported by
    /// the next one).
    error: Arc<Mutex<Option<String>>>,
    counts: Counters,
    /// Whether the device was opened with timestamp queries (when profiling, where the adapter
    /// has them): programs then time each dispatch.
    pub timestamps: bool,
}

/// What the host asked of a device so far (see [`Gpu::counts`]): per run of a compiled graph,
/// one submission, no buffer or bind group created, one wait per output read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Command buffers submitted to the queue.
    pub submissions: u64,
    /// Buffers created (arenas, params, staging).
    pub buffers: u64,
    /// Bind groups created.
    pub bind_groups: u64,
    /// Times the host waited for the device.
    pub waits: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            submissions: self.submissions - o.submissions,
            buffers: self.buffers - o.buffers,
            bind_groups: self.bind_groups - o.bind_groups,
            waits: self.waits - o.waits,
        }
    }
}

#[derive(Default)]
struct Counters {
    submissions: std::sync::atomic::AtomicU64,
    buffers: std::sync::atomic::AtomicU64,
    bind_groups: std::sync::atomic::AtomicU64,
    waits: std::sync::atomic::AtomicU64,
}

fn bump(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

impl Gpu {
    /// Whether the adapter ends a shader invocation's loops after 65535 iterations in all, as
    /// Mesa's software rasterizers (lavapipe) do: a CPU-type adapter.
    pub fn loop_limited(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// What the host has asked of this device since it was opened (submissions, buffer and
    /// bind-group creations, waits); the difference over a run shows what the run cost.
    pub fn counts(&self) -> Counts {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        Counts {
            submissions: get(&self.counts.submissions),
            buffers: get(&self.counts.buffers),
            bind_groups: get(&self.counts.bind_groups),
            waits: get(&self.counts.waits),
        }
    }

    /// A buffer (counted).
    pub fn create_buffer(&self, desc: &wgpu::BufferDescriptor<'_>) -> wgpu::Buffer {
        bump(&self.counts.buffers);
        self.device.create_buffer(desc)
    }

    /// A bind group (counted).
    pub fn create_bind_group(&self, desc: &wgpu::BindGroupDescriptor<'_>) -> wgpu::BindGroup {
        bump(&self.counts.bind_groups);
        self.device.create_bind_group(desc)
    }

    /// Submit one command buffer (counted).
    pub fn submit(&self, commands: wgpu::CommandBuffer) {
        bump(&self.counts.submissions);
        self.queue.submit([commands]);
    }

    /// Wait for the queue to finish (counted), then report a failure of the device.
    fn wait(&self) -> Result<()> {
        bump(&self.counts.waits);
        let polled = self.device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        });
        self.check()?;
        polled.map(|_| ()).map_err(|e| Error::Device {
            backend: "wgpu".into(),
            msg: format!(
                "{} ({:?}): waiting for the queue failed: {e}",
                self.info.name, self.info.backend
            ),
        })
    }

    /// Copy `out.len()` bytes from the start of `staging` (a `MAP_READ` buffer a submitted copy
    /// filled) to the host: map, wait, copy, unmap.
    pub fn read_staging(&self, staging: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
        self.check()?;
        if out.is_empty() {
            return Ok(());
        }
        let size = (out.len() as u64).next_multiple_of(4);
        let slice = staging.slice(..size);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        let failed = |msg: String| Error::Device {
            backend: "wgpu".into(),
            msg: format!("{} ({:?}): {msg}", self.info.name, self.info.backend),
        };
        // Another thread polling the same device may be the one that runs this map's callback:
        // wait for it (a lost device answers it with an error, so this does not hang).
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(Ok(())) => {
                {
                    let data = slice
                        .get_mapped_range()
                        .map_err(|e| failed(format!("the readback buffer is not mapped: {e:?}")))?;
                    out.copy_from_slice(&data[..out.len()]);
                }
                staging.unmap();
                Ok(())
            }
            Ok(Err(e)) => Err(failed(format!("reading back from the device failed: {e}"))),
            Err(_) => Err(failed(
                "reading back from the device failed: the copy never completed".into(),
            )),
        }
    }

    /// Whether the device was lost.
    pub fn is_lost(&self) -> bool {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The device's failure, if it failed since the last check: a lost device (for good) or an
    /// error it raised (once), as a named error.
    pub fn check(&self) -> Result<()> {
        let failed = |msg: String| Error::Device {
            backend: "wgpu".into(),
            msg: format!("{} ({:?}): {msg}", self.info.name, self.info.backend),
        };
        if let Some(why) = self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(failed(format!("the device was lost: {why}")));
        }
        match self.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(failed(e)),
            None => Ok(()),
        }
    }

    /// The device for `device` (opened once per process and device kind).
    pub fn get(device: Device) -> Result<Arc<Gpu>> {
        type Opened = Mutex<Vec<(Device, Arc<Gpu>)>>;
        static OPEN: OnceLock<Opened> = OnceLock::new();
        let open = OPEN.get_or_init(Default::default);
        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
        // A lost device is opened again.
        open.retain(|(_, g)| !g.is_lost());
        if let Some((_, g)) = open.iter().find(|(d, _)| *d == device) {
            return Ok(g.clone());
        }
        let unavailable = |hint: String| Error::DeviceUnavailable {
            device: device.to_string(),
            hint,
        };
        let adapter = rlx_driver::gpu::adapter(device).map_err(unavailable)?;
        let limits = adapter.limits();
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16)
            && limits.max_storage_buffers_per_shader_stage >= 16;
        // Timestamps only when profiling (`RLX_PROFILE`) and where the adapter has them.
        let timestamps = rlx_ir::env::is_set(rlx_ir::env::PROFILE)
            && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let subgroups = adapter.features().contains(wgpu::Features::SUBGROUP)
            && !rlx_ir::env::is_off(rlx_ir::env::WGPU_SUBGROUPS);
        let mut features = wgpu::Features::empty();
        if f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        if timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("rlx"),
            required_limits: limits.clone(),
            required_features: features,
            ..Default::default()
        };
        let (dev, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| unavailable(format!("cannot open the adapter: {e}")))?;
        // wgpu's default for both is a panic; RLX answers them as errors of the next exchange.
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let on_lost = lost.clone();
        dev.set_device_lost_callback(move |reason, msg| {
            *on_lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{reason:?}: {msg}"));
        });
        let on_error = error.clone();
        dev.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            on_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }));
        let gpu = Arc::new(Gpu {
            device: dev,
            queue,
            info: adapter.get_info(),
            limits,
            f16,
            subgroups,
            pipelines: Mutex::default(),
            lost,
            error,
            counts: Counters::default(),
            timestamps,
        });
        open.push((device, gpu.clone()));
        Ok(gpu)
    }

    /// The compute pipeline of WGSL `source` (entry point `main`), compiled once; a shader the
    /// device rejects gives its error text.
    pub fn pipeline(
        &self,
        source: &str,
    ) -> std::result::Result<Arc<wgpu::ComputePipeline>, String> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(source) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("rlx kernel"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("rlx kernel"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(e.to_string());
        }
        let p = Arc::new(pipeline);
        cache.insert(source.to_string(), p.clone());
        Ok(p)
    }

    /// Copy `out.len()` bytes at `offset` of `buffer` back to the host (waits for the queue;
    /// a staging buffer of its own, for reads outside runs: params).
    pub fn read(&self, buffer: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check()?;
        if out.is_empty() {
            return Ok(());
        }
        let size = (out.len() as u64).next_multiple_of(4);
        let staging = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rlx readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rlx readback"),
            });
        enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.submit(enc.finish());
        self.read_staging(&staging, out)
    }
}

/// The wgpu backend for one kind of device (`Device::Gpu`, `Device::Vulkan`, ...).
#[derive(Clone, Copy, Debug)]
pub struct WgpuBackend {
    /// The device kind (which wgpu backends it may use).
    pub device: Device,
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn supports(&self, graph: &Graph, id: NodeId) -> bool {
        if unsupported(graph, id).is_some() {
            return false;
        }
        // A registered kernel whose loops this adapter would end early: the decomposition.
        match registered::kernel_for(graph, id) {
            Some(k) if k.longest_loop > nn::LOOP_LIMIT => {
                Gpu::get(self.device).is_ok_and(|gpu| !gpu.loop_limited())
            }
            _ => true,
        }
    }

    fn refusal(&self, graph: &Graph, id: NodeId) -> Option<String> {
        unsupported(graph, id)
    }

    fn fuses(&self, graph: &Graph, id: NodeId, kind: FusionKind) -> bool {
        if kind == FusionKind::NormMatMul {
            return program::takes_norm(graph, id);
        }
        let n = graph.node(id);
        let ins: Vec<rlx_ir::DType> = n.inputs.iter().map(|i| graph.shape(*i).dtype()).collect();
        if kind == FusionKind::MultiplyReduce {
            return matches!(
                n.op,
                rlx_ir::Op::Reduce {
                    kind: rlx_ir::ReduceKind::Sum | rlx_ir::ReduceKind::Mean,
                    ..
                }
            ) && n.shape.dtype() == rlx_ir::DType::F32
                && unsupported(graph, id).is_none();
        }
        kind == FusionKind::Elementwise
            && matches!(
                n.op,
                rlx_ir::Op::Binary(_)
                    | rlx_ir::Op::Activation(_)
                    | rlx_ir::Op::Compare(_)
                    | rlx_ir::Op::Where
                    | rlx_ir::Op::Cast { .. }
            )
            && shaders::elementwise_op(&n.op, n.shape.dtype(), &ins)
            && unsupported(graph, id).is_none()
    }

    fn compile(&self, graph: &Graph, _opts: &CompileOptions) -> Result<Box<dyn Executable>> {
        Ok(Box::new(program::compile(
            Gpu::get(self.device)?,
            graph,
            None,
        )?))
    }

    fn compile_sharing(
        &self,
        graph: &Graph,
        _opts: &CompileOptions,
        other: &dyn Executable,
    ) -> Result<Box<dyn Executable>> {
        let other = other
            .as_any()
            .and_then(|a| a.downcast_ref::<GpuProgram>())
            .ok_or_else(|| {
                Error::Invalid(
                    "params can only be shared with another graph compiled for the GPU".into(),
                )
            })?;
        Ok(Box::new(program::compile(
            Gpu::get(self.device)?,
            graph,
            Some(other),
        )?))
    }
}
