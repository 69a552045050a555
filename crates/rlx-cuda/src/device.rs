//! The device side: the CUDA driver through `cudarc` (loaded at run time, so a machine without
//! one builds and runs everything else), one context per process, kernels loaded from CUBINs by
//! source, and [`CudaProgram`], a lowered [`Program`] on a device: one arena allocated at
//! compile, params uploaded once, one stream, and every run one replay of a captured CUDA graph.

use crate::cublas::{BlasHandle, Cublas, WORKSPACE};
use crate::gemm::ColumnMajor;
use crate::lower::{Loc, Program, Word};
use crate::nvrtc::Nvrtc;
use cudarc::driver::{result, sys};
use rlx_driver::{byte_length_error, Executable, IoSlot};
use rlx_ir::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

fn failed(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device {
        backend: "cuda".into(),
        msg: format!("{what}: {e:?}"),
    }
}

/// A loaded kernel (the module stays loaded for the process).
#[derive(Clone, Copy)]
struct Func(sys::CUfunction);
// SAFETY: CUDA function handles may be used from any thread once their context is current.
unsafe impl Send for Func {}
// SAFETY: as above.
unsafe impl Sync for Func {}

/// An opened CUDA device: its primary context, compute capability and the kernels loaded so far.
pub struct Cuda {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    /// The device's name.
    pub name: String,
    /// Its compute capability as `10 * major + minor` (90 for an H100 or H200).
    pub arch: u32,
    funcs: Mutex<HashMap<String, Func>>,
}

// SAFETY: the context handle is used only to make it current; the driver API is thread-safe.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

impl Cuda {
    /// The device `Device::Cuda` runs on (`RLX_CUDA_DEVICE`, else 0), opened once per process;
    /// a named error when there is no driver or no device.
    pub fn get() -> Result<Arc<Cuda>> {
        static OPEN: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();
        OPEN.get_or_init(|| Cuda::open().map(Arc::new))
            .clone()
            .map_err(|hint| Error::DeviceUnavailable {
                device: "Cuda".into(),
                hint,
            })
    }

    fn open() -> std::result::Result<Cuda, String> {
        let ordinal: i32 = match rlx_ir::env::get(rlx_ir::env::CUDA_DEVICE) {
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| format!("RLX_CUDA_DEVICE={v} is not a device ordinal"))?,
            None => 0,
        };
        let count = rlx_driver::cuda::devices()?;
        if ordinal < 0 || ordinal >= count {
            return Err(format!(
                "RLX_CUDA_DEVICE={ordinal}, but the driver sees {count} device(s)"
            ));
        }
        let dev = result::device::get(ordinal).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
        // SAFETY: `dev` came from cuDeviceGet.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| format!("cannot open the device's context: {e:?}"))?;
        // SAFETY: a context just retained.
        unsafe { result::ctx::set_current(ctx) }.map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        let attr = |a| {
            // SAFETY: a valid device and attribute.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(|e| format!("cuDeviceGetAttribute: {e:?}"))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "a CUDA device".into());
        Ok(Cuda {
            dev,
            ctx,
            name,
            arch: (major * 10 + minor) as u32,
            funcs: Mutex::default(),
        })
    }

    /// Make the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        let _ = self.dev;
        // SAFETY: the context was retained at open and is never released.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| failed("cuCtxSetCurrent", e))
    }

    /// Kernel `k` of `source`, compiled for this device (NVRTC, cached) and loaded once.
    fn function(&self, source: &str) -> Result<Func> {
        let mut funcs = self.funcs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = funcs.get(source) {
            return Ok(*f);
        }
        let cubin = Nvrtc::get()?.cubin(source, self.arch)?;
        // SAFETY: `cubin` is a CUBIN NVRTC made for this device's architecture; the driver
        // copies it while loading.
        let module = unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(|e| failed(&format!("loading a kernel for sm_{}", self.arch), e))?;
        let name = CString::new("k").expect("no NUL");
        // SAFETY: a module just loaded, which defines `k`.
        let f = unsafe { result::module::get_function(module, name) }
            .map_err(|e| failed("cuModuleGetFunction", e))?;
        funcs.insert(source.to_string(), Func(f));
        Ok(Func(f))
    }
}

/// Device memory of one allocation, freed on drop.
struct DevMem {
    ptr: sys::CUdeviceptr,
}

impl DevMem {
    fn new(cuda: &Cuda, bytes: usize, what: &str) -> Result<DevMem> {
        cuda.bind()?;
        if bytes == 0 {
            return Ok(DevMem { ptr: 0 });
        }
        // SAFETY: a current context; the memory is freed once, on drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    backend: "cuda".into(),
                    what: what.into(),
                    bytes,
                }
            } else {
                failed(&format!("allocating {bytes} bytes for {what}"), e)
            }
        })?;
        // SAFETY: the allocation just made, `bytes` long.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(|e| failed("cuMemsetD8", e))?;
        Ok(DevMem { ptr })
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by malloc_sync, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory of one input or output, freed on drop: copies between it and the
/// device run at full speed and asynchronously.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// A copy from it may still be running (cleared when the stream is synchronized).
    in_flight: std::cell::Cell<bool>,
}

/// Inputs and outputs up to this size get page-locked staging (a decode step's tokens,
/// positions and logits); larger ones (a prompt's logits) are copied from pageable memory.
const PIN_AT_MOST: usize = 4 << 20;

impl Pinned {
    fn new(cuda: &Cuda, len: usize) -> Option<Pinned> {
        if len == 0 || len > PIN_AT_MOST || cuda.bind().is_err() {
            return None;
        }
        // SAFETY: a current context; freed once, on drop.
        let ptr = unsafe { result::malloc_host(len, 0) }.ok()? as *mut u8;
        Some(Pinned {
            ptr,
            len,
            in_flight: std::cell::Cell::new(false),
        })
    }

    // The staging is written through `&self` (a program reads its outputs through `&self`);
    // each caller holds the slice only for one copy.
    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated at `ptr`, used by one thread at a time (the program's).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host, freed once (after the program's stream is idle).
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

/// A launch with its addresses fixed: a kernel, or the cuBLAS call standing in for one.
enum Ready {
    Kernel {
        func: Func,
        grid: [u32; 3],
        block: u32,
        words: Vec<u64>,
    },
    Gemm {
        call: ColumnMajor,
        at: [u64; 3],
    },
}

impl Ready {
    /// Launch on `stream` (of the program whose allocations the words point into, whose cuBLAS
    /// handle is `blas`).
    fn launch(&mut self, stream: sys::CUstream, blas: Option<&BlasHandle>) -> Result<()> {
        match self {
            Ready::Kernel {
                func,
                grid,
                block,
                words,
            } => {
                let mut args = [words.as_mut_ptr() as *mut c_void];
                // SAFETY: the kernel takes one by-value struct of `words.len()` 64-bit words,
                // whose addresses point into the live allocations of the program that owns
                // this launch.
                unsafe {
                    result::launch_kernel(
                        func.0,
                        (grid[0], grid[1], grid[2]),
                        (*block, 1, 1),
                        0,
                        stream,
                        &mut args,
                    )
                }
                .map_err(|e| failed("launching a kernel", e))
            }
            Ready::Gemm { call, at } => blas
                .expect("a program with cuBLAS calls has a handle")
                .gemm(call, *at),
        }
    }
}

/// An instantiated CUDA graph of a program's launches.
struct GraphExec(sys::CUgraphExec);

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: instantiated once, destroyed once.
        let _ = unsafe { sys::cuGraphExecDestroy(self.0) };
    }
}

/// What `RLX_PROFILE` keeps for a program: CUDA events around every launch and the time each
/// took over the runs so far (a profiled run launches one by one, not as a graph).
struct Profile {
    events: Vec<sys::CUevent>,
    ms: Vec<f64>,
    runs: u64,
}

/// A graph compiled for a CUDA device.
pub struct CudaProgram {
    cuda: Arc<Cuda>,
    stream: sys::CUstream,
    arena: DevMem,
    params: Arc<DevMem>,
    launches: Vec<Ready>,
    /// Page-locked staging of each input and output (`None`: too large, copied from pageable
    /// memory).
    pinned_in: Vec<Option<Pinned>>,
    pinned_out: Vec<Option<Pinned>>,
    /// cuBLAS's handle and its workspace, where products go to cuBLAS (dropped before the
    /// stream is destroyed).
    blas: Option<(BlasHandle, DevMem)>,
    graph: Option<GraphExec>,
    use_graphs: bool,
    /// Whether it has run once (outside a capture).
    warm: bool,
    profile: Option<Profile>,
    prog: Program,
}

// SAFETY: the stream and graph handles are used by one thread at a time (`&mut self` for
// runs), with the context made current first.
unsafe impl Send for CudaProgram {}

impl CudaProgram {
    /// Load `prog` on `cuda`; params come from `share`'s buffer where `prog` reads them there.
    pub(crate) fn load(
        cuda: Arc<Cuda>,
        prog: Program,
        share: Option<&CudaProgram>,
    ) -> Result<CudaProgram> {
        cuda.bind()?;
        let arena = DevMem::new(&cuda, prog.arena_bytes as usize, "the arena")?;
        let params = match share {
            Some(o) => o.params.clone(),
            None => Arc::new(DevMem::new(
                &cuda,
                prog.params_bytes as usize,
                "the params",
            )?),
        };
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| failed("cuStreamCreate", e))?;
        let lib = Cublas::get().filter(|_| prog.launches.iter().any(|l| l.gemm.is_some()));
        // cuBLAS that cannot be set up (its workspace, its handle) leaves the products to RLX's
        // kernels, said once.
        let blas = lib.and_then(|lib| {
            let made = DevMem::new(&cuda, WORKSPACE, "cuBLAS's workspace")
                .and_then(|ws| Ok((BlasHandle::new(lib, stream as *mut c_void, ws.ptr)?, ws)));
            match made {
                Ok(b) => Some(b),
                Err(e) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        eprintln!(
                            "rlx-cuda: cuBLAS not used ({e}); RLX's kernels compute the products"
                        )
                    });
                    None
                }
            }
        });
        let mut launches = Vec::with_capacity(prog.launches.len());
        let mut funcs: Vec<Option<Func>> = vec![None; prog.kernels.len()];
        let addr = |w: Word| match w {
            Word::Imm(v) => v as u64,
            Word::Addr(Loc::Arena(o)) => arena.ptr + o,
            Word::Addr(Loc::Params(o)) => params.ptr + o,
        };
        for l in &prog.launches {
            if let (Some(g), Some(_)) = (&l.gemm, &blas) {
                let call = g.column_major();
                let at = [addr(call.a.0), addr(call.b.0), addr(call.c.0)];
                launches.push(Ready::Gemm { call, at });
                continue;
            }
            let words: Vec<u64> = l.words.iter().map(|w| addr(*w)).collect();
            let func = match funcs[l.kernel] {
                Some(f) => f,
                None => {
                    let f = cuda.function(&prog.kernels[l.kernel])?;
                    funcs[l.kernel] = Some(f);
                    f
                }
            };
            launches.push(Ready::Kernel {
                func,
                grid: l.grid,
                block: l.block,
                words,
            });
        }
        let profile = if rlx_ir::env::is_set(rlx_ir::env::PROFILE) {
            let events = (0..=launches.len())
                .map(|_| result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| failed("cuEventCreate", e))?;
            Some(Profile {
                events,
                ms: vec![0.0; launches.len()],
                runs: 0,
            })
        } else {
            None
        };
        let pin = |slots: &[IoSlot]| -> Vec<Option<Pinned>> {
            slots
                .iter()
                .map(|s| Pinned::new(&cuda, s.shape.size_bytes().unwrap_or(0)))
                .collect()
        };
        let (pinned_in, pinned_out) = (pin(&prog.inputs), pin(&prog.outputs));
        let p = CudaProgram {
            pinned_in,
            pinned_out,
            cuda,
            stream,
            arena,
            params,
            launches,
            blas,
            graph: None,
            warm: false,
            use_graphs: !rlx_ir::env::is_off(rlx_ir::env::CUDA_GRAPHS),
            profile,
            prog,
        };
        for k in 0..p.prog.consts.len() {
            let (at, bytes) = p.prog.consts[k].clone();
            p.copy_in(at, &bytes)?;
        }
        p.sync()?;
        Ok(p)
    }

    /// The lowered program.
    pub fn program(&self) -> &Program {
        &self.prog
    }

    fn addr(&self, at: Loc) -> u64 {
        match at {
            Loc::Arena(o) => self.arena.ptr + o,
            Loc::Params(o) => self.params.ptr + o,
        }
    }

    fn copy_in(&self, at: Loc, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the destination lies in this program's arena or params (sized by lowering).
        unsafe { result::memcpy_htod_async(self.addr(at), bytes, self.stream) }
            .map_err(|e| failed("copying to the device", e))
    }

    fn copy_out(&self, at: Loc, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the source lies in this program's arena or params; the stream is synchronized
        // before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, self.addr(at), self.stream) }
            .map_err(|e| failed("copying from the device", e))?;
        self.sync()
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: the program's own stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| failed(&format!("running on {}", self.cuda.name), e))?;
        for p in self.pinned_in.iter().flatten() {
            p.in_flight.set(false);
        }
        Ok(())
    }

    fn launch_all(&mut self) -> Result<()> {
        let blas = self.blas.as_ref().map(|b| &b.0);
        for l in &mut self.launches {
            l.launch(self.stream, blas)?;
        }
        Ok(())
    }

    /// One run launched kernel by kernel with an event before each and after the last; the
    /// time of each launch is added to the profile.
    fn profiled_run(&mut self) -> Result<()> {
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        let blas = self.blas.as_ref().map(|b| &b.0);
        for (l, &ev) in self.launches.iter_mut().zip(&p.events) {
            // SAFETY: an event of this program, recorded on its own stream.
            unsafe { result::event::record(ev, self.stream) }
                .map_err(|e| failed("cuEventRecord", e))?;
            l.launch(self.stream, blas)?;
        }
        let last = p.events[self.launches.len()];
        // SAFETY: as above; the last event is waited for before any time is read.
        unsafe { result::event::record(last, self.stream) }
            .map_err(|e| failed("cuEventRecord", e))?;
        // SAFETY: an event just recorded.
        unsafe { result::event::synchronize(last) }
            .map_err(|e| failed(&format!("running on {}", self.cuda.name), e))?;
        for i in 0..self.launches.len() {
            // SAFETY: both events recorded on this stream and complete.
            let ms = unsafe { result::event::elapsed(p.events[i], p.events[i + 1]) }
                .map_err(|e| failed("cuEventElapsedTime", e))?;
            p.ms[i] += ms as f64;
        }
        p.runs += 1;
        Ok(())
    }

    /// Print the profile: time per op kind and the slowest launches (op, node, grid,
    /// microseconds per run).
    fn print_profile(&self) {
        let Some(p) = &self.profile else {
            return;
        };
        if p.runs == 0 {
            return;
        }
        let runs = p.runs as f64;
        let total: f64 = p.ms.iter().sum();
        eprintln!(
            "rlx-cuda profile: {} runs of {} launches on {}: {:.1} us of kernels per run",
            p.runs,
            self.launches.len(),
            self.cuda.name,
            total * 1e3 / runs
        );
        let mut kinds: Vec<(&str, f64, usize)> = Vec::new();
        for (l, ms) in self.prog.launches.iter().zip(&p.ms) {
            match kinds.iter_mut().find(|k| k.0 == l.op) {
                Some(k) => {
                    k.1 += ms;
                    k.2 += 1;
                }
                None => kinds.push((l.op, *ms, 1)),
            }
        }
        kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (op, ms, n) in &kinds {
            eprintln!(
                "  {op:<20} {:>10.1} us/run {:>5.1}%  {n} launches",
                ms * 1e3 / runs,
                100.0 * ms / total.max(1e-12)
            );
        }
        let mut order: Vec<usize> = (0..p.ms.len()).collect();
        order.sort_by(|&a, &b| p.ms[b].total_cmp(&p.ms[a]));
        let top = rlx_ir::env::count(rlx_ir::env::PROFILE_TOP).unwrap_or(30);
        eprintln!("  slowest launches:");
        for i in order.into_iter().take(top) {
            let l = &self.prog.launches[i];
            let how = match &self.launches[i] {
                Ready::Gemm { call, .. } => format!(
                    "cuBLAS {}x{}x{} ({} batches)",
                    call.m, call.n, call.k, call.batches
                ),
                Ready::Kernel { .. } => {
                    format!("kernel {}, grid {:?} block {}", l.kernel, l.grid, l.block)
                }
            };
            eprintln!(
                "  {:>10.1} us/run  {} (node %{}, {how})",
                p.ms[i] * 1e3 / runs,
                l.op,
                l.node,
            );
        }
    }

    /// Capture the launches as a CUDA graph (once).
    fn capture(&mut self) -> Result<()> {
        // SAFETY: the program's own stream; capture ends below whatever the launches do.
        unsafe {
            result::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| failed("beginning a CUDA graph capture", e))?;
        let launched = self.launch_all();
        // SAFETY: capture began above on this stream.
        let graph = unsafe { result::stream::end_capture(self.stream) };
        launched?;
        let graph = graph.map_err(|e| failed("ending a CUDA graph capture", e))?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a graph just captured; instantiating copies it, so it is destroyed after.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        // SAFETY: the captured graph, destroyed once.
        unsafe { sys::cuGraphDestroy(graph) };
        made.result()
            .map_err(|e| failed("instantiating a CUDA graph", e))?;
        self.graph = Some(GraphExec(exec));
        Ok(())
    }
}

impl Drop for CudaProgram {
    fn drop(&mut self) {
        self.print_profile();
        if self.cuda.bind().is_ok() {
            let _ = self.sync();
            self.graph = None;
            self.blas = None;
            for &ev in self.profile.iter().flat_map(|p| &p.events) {
                // SAFETY: created at load, destroyed once.
                let _ = unsafe { result::event::destroy(ev) };
            }
            // SAFETY: the program's own stream, destroyed once.
            let _ = unsafe { result::stream::destroy(self.stream) };
        }
    }
}

impl Executable for CudaProgram {
    fn inputs(&self) -> &[IoSlot] {
        &self.prog.inputs
    }

    fn params(&self) -> &[IoSlot] {
        &self.prog.params
    }

    fn outputs(&self) -> &[IoSlot] {
        &self.prog.outputs
    }

    fn write_input(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.prog.inputs[idx];
        if bytes.len() != slot.shape.size_bytes().unwrap_or(0) {
            return Err(byte_length_error("input", slot, bytes.len()));
        }
        match &self.pinned_in[idx] {
            Some(p) => {
                // The last copy from the staging may still be reading it.
                if p.in_flight.get() {
                    self.sync()?;
                }
                p.bytes().copy_from_slice(bytes);
                p.in_flight.set(true);
                self.copy_in(self.prog.input_at[idx], p.bytes())
            }
            None => self.copy_in(self.prog.input_at[idx], bytes),
        }
    }

    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.prog.params[idx];
        if bytes.len() != slot.shape.size_bytes().unwrap_or(0) {
            return Err(byte_length_error("param", slot, bytes.len()));
        }
        self.copy_in(self.prog.param_at[idx], bytes)?;
        self.sync()
    }

    fn write_param_range(&mut self, idx: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.prog.params[idx];
        let len = slot.shape.size_bytes().unwrap_or(0);
        if offset.checked_add(bytes.len()).is_none_or(|e| e > len) {
            return Err(Error::Invalid(format!(
                "bytes {offset}..+{} are outside param \"{}\" ({len} bytes)",
                bytes.len(),
                slot.name
            )));
        }
        let at = match self.prog.param_at[idx] {
            Loc::Arena(o) => Loc::Arena(o + offset as u64),
            Loc::Params(o) => Loc::Params(o + offset as u64),
        };
        self.copy_in(at, bytes)?;
        self.sync()
    }

    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.prog.params[idx];
        if out.len() != slot.shape.size_bytes().unwrap_or(0) {
            return Err(byte_length_error("param", slot, out.len()));
        }
        self.copy_out(self.prog.param_at[idx], out)
    }

    fn execute(&mut self) -> Result<()> {
        self.cuda.bind()?;
        if self.profile.is_some() {
            return self.profiled_run();
        }
        // A program calling cuBLAS runs once outside a capture first, so that cuBLAS loads
        // its kernels and sets itself up before anything is captured.
        if !self.use_graphs || (self.blas.is_some() && !self.warm) {
            self.warm = true;
            return self.launch_all();
        }
        if self.graph.is_none() {
            // A run that cannot be captured (a library call refusing capture) is launched
            // one by one from then on, said once.
            if let Err(e) = self.capture() {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!("rlx-cuda: a program's run was not captured as a CUDA graph ({e}); launching its kernels one by one")
                });
                self.use_graphs = false;
                return self.launch_all();
            }
        }
        let exec = self.graph.as_ref().map(|g| g.0).expect("captured above");
        // SAFETY: an instantiated graph of this program's launches, on its own stream.
        unsafe { sys::cuGraphLaunch(exec, self.stream) }
            .result()
            .map_err(|e| failed("launching the program's CUDA graph", e))
    }

    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        let slot = &self.prog.outputs[idx];
        if out.len() != slot.shape.size_bytes().unwrap_or(0) {
            return Err(byte_length_error("output", slot, out.len()));
        }
        match &self.pinned_out[idx] {
            Some(p) => {
                self.copy_out(self.prog.output_at[idx], p.bytes())?;
                out.copy_from_slice(p.bytes());
                Ok(())
            }
            None => self.copy_out(self.prog.output_at[idx], out),
        }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn assign_param(&mut self, param: usize, output: usize) -> Result<()> {
        let bytes = self.prog.outputs[output].shape.size_bytes().unwrap_or(0);
        if bytes != self.prog.params[param].shape.size_bytes().unwrap_or(0) {
            return Err(Error::Invalid(format!(
                "output {output} and param \"{}\" differ in size",
                self.prog.params[param].name
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.cuda.bind()?;
        let (dst, src) = (
            self.addr(self.prog.param_at[param]),
            self.addr(self.prog.output_at[output]),
        );
        if dst == src {
            return Ok(());
        }
        // SAFETY: both ranges lie in this program's allocations, `bytes` long each.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(|e| failed("copying an output over a param", e))
    }
}
