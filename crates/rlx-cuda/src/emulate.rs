//! Running lowered programs on the host, for checking the lowering and the kernels on a machine
//! without a GPU. The CUDA C of every kernel is compiled as C++ by the host's compiler
//! (`g++ -std=c++20 -O1`) against a small prelude that plays the CUDA execution model, and the
//! launches of a [`Program`] run over host memory laid out as the device's would be:
//!
//! - a block's threads are fibers on one host thread, switched by hand only at
//!   `__syncthreads`, `__shfl_xor_sync` (an exchange through memory among a warp's lanes) and
//!   `emu_mma_tf32`, the stand-in for a warp's `mma.sync`;
//! - the blocks of a launch are shared out among host threads, each running whole blocks;
//!   launches run one at a time in the process;
//! - `__shared__` arrays are `static thread_local`: one set per host thread, reused by every
//!   block it runs.
//!
//! A launch carrying a cuBLAS call runs that call by cuBLAS's definition
//! ([`crate::gemm::ColumnMajor::run_on_host`]), as on a device with cuBLAS, or its kernel
//! ([`Emulator::run_without_cublas`], or `RLX_CUBLAS=0` for [`EmulatedBackend`]). Where NVRTC
//! is present, every program [`EmulatedBackend`] compiles is also compile-checked for
//! [`crate::CHECKED_ARCHS`] (required under `RLX_REQUIRE_NVRTC=1`).
//!
//! What this checks: every word of every launch (sizes, strides, addresses the memory plan
//! gave), the kernels' arithmetic and their cooperation inside a block, against the reference
//! evaluator. What it cannot:
//!
//! - fused multiply-adds: NVRTC's default `--fmad=true` lets the device contract `a * b + c`,
//!   while g++ does not contract under `-std=c++20` (an ISO mode) and is given no `-march`;
//! - the device's math library: `expf` and friends are the host's `<math.h>`;
//! - code under `#ifdef __CUDA_ARCH__` (the PTX `cvt` of f16, `mma.sync` and its pre-Ampere
//!   form), which the host does not compile; `emu_mma_tf32` sums in k order, the hardware in
//!   its own;
//! - cuBLAS's own kernels and summation order;
//! - races and lock-step assumptions: between sync points the fibers run one after another in
//!   thread order, so a race always resolves the same way; a shuffle ignores its mask and waits
//!   for the whole warp (a divergent one aborts, naming the deadlock);
//! - uninitialised shared memory: zero the first time a host thread runs a kernel, then what
//!   the previous block left (undefined on the device);
//! - scheduling across blocks, streams, CUDA graphs, page-locked copies, the driver and timing.
//!
//! So bit-level results hold in emulation only until the tests that need a CUDA device have
//! passed on one (`scripts/gpu-check.sh`).

use crate::lower::{Loc, Program, Word};
use rlx_driver::{Backend, CompileOptions, Executable, IoSlot};
use rlx_ir::{Error, FusionKind, Graph, NodeId, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

const PRELUDE: &str = r#"#include <math.h>
#include <string.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>
#define __global__
#define __device__
#define __forceinline__ inline
// One set of shared arrays per host worker (a worker runs one block at a time).
#define __shared__ static thread_local
struct emu_dim3 { unsigned x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;

// A block's threads are fibers on one host thread, switched by hand (callee-saved registers
// and the stack pointer), so a barrier or a shuffle costs a few nanoseconds.
extern "C" void emu_swap(void** from, void* to);
asm(R"(
.text
.globl emu_swap
.type emu_swap, @function
emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
)");
struct emu_fiber { void* sp; unsigned tid; int state; int group; };  // state: 0 runs, 1 waits, 2 done
static thread_local void* emu_sched_sp;
static thread_local emu_fiber* emu_cur;
// The kernel a worker runs: a function of the launch's parameters.
static thread_local void (*emu_kf)(void*);
static thread_local void* emu_kc;
static thread_local unsigned emu_wait_block, emu_wait_warp[32];
static thread_local unsigned long long emu_ex[1024];
static void emu_wait(int group) {
    emu_cur->state = 1;
    emu_cur->group = group;
    if (group < 0) ++emu_wait_block; else ++emu_wait_warp[group];
    emu_swap(&emu_cur->sp, emu_sched_sp);
}
static inline void __syncthreads() { emu_wait(-1); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned t = threadIdx.x, w = t >> 5, lane = t & 31;
    memcpy(&emu_ex[t], &v, sizeof(T));
    emu_wait((int)w);
    T r;
    memcpy(&r, &emu_ex[(w << 5) | (lane ^ (unsigned)o)], sizeof(T));
    emu_wait((int)w);
    return r;
}
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
// One k-step of mma.sync.m16n8k8 over TF32 for a warp and `nt` column tiles, three products
// each (small A, big B; big A, small B; big A, big B, in that order), with the layouts of PTX's
// m16n8k8 .tf32: every lane's fragments exchanged through memory once, each lane summing its
// own results in k order.
static thread_local unsigned emu_frag[1024][40];
static inline void emu_mma_tf32(float* c, int nt, const unsigned* ab, const unsigned* as, const unsigned* bb, const unsigned* bs) {
    const unsigned t = threadIdx.x, w = t >> 5, lane = t & 31, g = lane >> 2, q = lane & 3;
    // One look-up of the thread-local array (each costs a call in a shared library).
    unsigned (*const frag)[40] = emu_frag;
    unsigned* mine = frag[t];
    for (int i = 0; i < 4; ++i) { mine[i] = ab[i]; mine[4 + i] = as[i]; }
    for (int i = 0; i < 2 * nt; ++i) { mine[8 + i] = bb[i]; mine[8 + 2 * nt + i] = bs[i]; }
    emu_wait((int)w);
    unsigned (*const wf)[40] = frag + (w << 5);
    // A[row][k] of the fragments at `off`: lane (row % 8) * 4 + k % 4, register (row >= 8) + 2 (k >= 4);
    // this lane's rows are g and g + 8 (h = 0, 1). a[h][0] is the big part (off 0), a[h][1] the small (off 4).
    float a[2][2][8];
    for (unsigned h = 0; h < 2; ++h)
        for (unsigned k = 0; k < 8; ++k) {
            const unsigned* f = wf[g * 4 + (k & 3)];
            a[h][0][k] = __uint_as_float(f[h + (k >= 4 ? 2 : 0)]);
            a[h][1][k] = __uint_as_float(f[4 + h + (k >= 4 ? 2 : 0)]);
        }
    for (int j = 0; j < nt; ++j) {
        for (unsigned i = 0; i < 4; ++i) {
            const unsigned h = i >= 2 ? 1u : 0u, col = 2 * q + (i & 1);
            // B[k][col] of tile j: lane col * 4 + k % 4, register 2 j + (k >= 4), big part at 8,
            // small at 8 + 2 nt.
            float big[8], small[8];
            for (unsigned k = 0; k < 8; ++k) {
                const unsigned* f = wf[col * 4 + (k & 3)];
                big[k] = __uint_as_float(f[8 + 2 * j + (k >= 4 ? 1 : 0)]);
                small[k] = __uint_as_float(f[8 + 2 * nt + 2 * j + (k >= 4 ? 1 : 0)]);
            }
            float s = c[4 * j + i];
            for (unsigned k = 0; k < 8; ++k) s += a[h][1][k] * big[k];
            for (unsigned k = 0; k < 8; ++k) s += a[h][0][k] * small[k];
            for (unsigned k = 0; k < 8; ++k) s += a[h][0][k] * big[k];
            c[4 * j + i] = s;
        }
    }
    emu_wait((int)w);
}
static void emu_tramp() {
    emu_kf(emu_kc);
    emu_cur->state = 2;
    emu_swap(&emu_cur->sp, emu_sched_sp);
    abort();
}
static const size_t EMU_STACK = 64 * 1024;
// Run one block of `bx` fibers to the end.
static void emu_block(unsigned bx, emu_fiber* fs, char* stacks) {
    for (unsigned t = 0; t < bx; ++t) {
        uintptr_t top = ((uintptr_t)(stacks + (size_t)(t + 1) * EMU_STACK)) & ~(uintptr_t)15;
        void** sp = (void**)(top - 16);
        sp[0] = (void*)&emu_tramp;
        sp -= 6;
        for (int r = 0; r < 6; ++r) sp[r] = 0;
        fs[t] = {sp, t, 0, 0};
    }
    emu_wait_block = 0;
    for (auto& w : emu_wait_warp) w = 0;
    unsigned done = 0;
    while (done < bx) {
        bool ran = false;
        for (unsigned t = 0; t < bx; ++t) {
            if (fs[t].state != 0) continue;
            ran = true;
            threadIdx = {t, 0, 0};
            emu_cur = &fs[t];
            emu_swap(&emu_sched_sp, fs[t].sp);
            if (fs[t].state == 2) ++done;
        }
        // Release the barriers every thread of their group reached.
        bool released = false;
        if (emu_wait_block > 0 && emu_wait_block + done == bx) {
            for (unsigned t = 0; t < bx; ++t) if (fs[t].state == 1 && fs[t].group < 0) fs[t].state = 0;
            emu_wait_block = 0;
            released = true;
        }
        for (unsigned w = 0; w < (bx + 31) / 32; ++w) {
            const unsigned size = bx - 32 * w < 32 ? bx - 32 * w : 32;
            if (emu_wait_warp[w] == size) {
                for (unsigned t = 32 * w; t < 32 * w + size; ++t) if (fs[t].state == 1 && fs[t].group == (int)w) fs[t].state = 0;
                emu_wait_warp[w] = 0;
                released = true;
            }
        }
        if (!ran && !released && done < bx) {
            fprintf(stderr, "rlx emulation: the threads of a block wait on each other forever\n");
            abort();
        }
    }
}
// One launch: the grid's blocks shared out among the host's threads. Only C headers and
// pthreads, so that a library of a few kernels compiles in a fraction of a second.
struct emu_grid { unsigned gx, gy, bx; unsigned long long blocks, next; void (*kf)(void*); void* kc; };
static void* emu_work(void* arg) {
    emu_grid* g = (emu_grid*)arg;
    emu_fiber* fs = (emu_fiber*)malloc(sizeof(emu_fiber) * g->bx);
    char* stacks = (char*)malloc((size_t)g->bx * EMU_STACK + 16);
    if (!fs || !stacks) { fprintf(stderr, "rlx emulation: out of memory for a block's fibers\n"); abort(); }
    emu_kf = g->kf;
    emu_kc = g->kc;
    for (unsigned long long b; (b = __atomic_fetch_add(&g->next, 1ull, __ATOMIC_RELAXED)) < g->blocks;) {
        blockIdx = {(unsigned)(b % g->gx), (unsigned)((b / g->gx) % g->gy), (unsigned)(b / ((unsigned long long)g->gx * g->gy))};
        emu_block(g->bx, fs, stacks);
    }
    free(stacks);
    free(fs);
    return 0;
}
static void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, void (*kf)(void*), void* kc) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, 1, 1};
    emu_grid g = {gx, gy, bx, (unsigned long long)gx * gy * gz, 0, kf, kc};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned workers = cores > 0 ? (unsigned)cores : 1;
    if (g.blocks < workers) workers = (unsigned)g.blocks;
    pthread_t ts[256];
    if (workers > 257) workers = 257;
    for (unsigned w = 1; w < workers; ++w) {
        if (pthread_create(&ts[w - 1], 0, emu_work, &g) != 0) { fprintf(stderr, "rlx emulation: cannot start a worker thread\n"); abort(); }
    }
    emu_work(&g);
    for (unsigned w = 1; w < workers; ++w) pthread_join(ts[w - 1], 0);
}
"#;

/// A word's value with the buffers at `abase` (arena) and `pbase` (params).
fn host(w: Word, abase: u64, pbase: u64) -> u64 {
    match w {
        Word::Imm(v) => v as u64,
        Word::Addr(Loc::Arena(o)) => abase + o,
        Word::Addr(Loc::Params(o)) => pbase + o,
    }
}

/// Every kernel run here is also compile-checked for the device ([`crate::CHECKED_ARCHS`])
/// where NVRTC is at hand; without it, an error under `RLX_REQUIRE_NVRTC=1` (as the tests set
/// it), else nothing.
fn nvrtc_check(sources: &[&str]) -> Result<()> {
    match crate::nvrtc::Nvrtc::get() {
        Ok(nvrtc) => {
            for &a in &crate::CHECKED_ARCHS {
                nvrtc.check_all(sources, a)?;
            }
            Ok(())
        }
        Err(e) if rlx_ir::env::get(rlx_ir::env::REQUIRE_NVRTC).as_deref() == Some("1") => Err(e),
        Err(_) => Ok(()),
    }
}

/// The libraries built so far in this process.
fn built() -> &'static Mutex<Vec<Arc<Emulator>>> {
    static LIBS: Mutex<Vec<Arc<Emulator>>> = Mutex::new(Vec::new());
    &LIBS
}

/// The kernels of some programs, compiled for the host and loaded.
pub struct Emulator {
    lib: libloading::Library,
    sources: std::collections::HashMap<String, usize>,
}

fn failed(msg: String) -> Error {
    Error::Device {
        backend: "cuda (host emulation)".into(),
        msg,
    }
}

impl Emulator {
    /// Compile `sources` (kernel sources of [`Program::kernels`]) into one host library, cached
    /// under the system's temporary directory by their hash.
    pub fn build<'a>(sources: impl IntoIterator<Item = &'a String>) -> Result<Emulator> {
        let mut list: Vec<&String> = sources.into_iter().collect();
        list.sort();
        list.dedup();
        let mut tu = String::from(PRELUDE);
        for (i, src) in list.iter().enumerate() {
            let body = src.replace("extern \"C\" __global__ void k(", "void k(");
            tu.push_str(&format!(
                "namespace k{i} {{\n{body}}}\nextern \"C\" void rlx_launch_{i}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, const void* words) {{\n    k{i}::M m;\n    memcpy(&m, words, sizeof(m));\n    emu_launch(gx, gy, gz, bx, [](void* p) {{ k{i}::k(*(k{i}::M*)p); }}, &m);\n}}\n"
            ));
        }
        let hash: String = Sha256::digest(tu.as_bytes())
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = std::env::temp_dir().join("rlx-cuda-emulation");
        std::fs::create_dir_all(&dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        let so: PathBuf = dir.join(format!("{hash}.so"));
        if !so.exists() {
            let cpp = dir.join(format!("{hash}.cpp"));
            std::fs::write(&cpp, &tu).map_err(|e| failed(format!("{}: {e}", cpp.display())))?;
            let tmp = dir.join(format!("{hash}.{}.so", std::process::id()));
            let out = std::process::Command::new("g++")
                .args([
                    "-std=c++20",
                    "-O1",
                    "-shared",
                    "-fPIC",
                    "-w",
                    "-pthread",
                    "-o",
                ])
                .arg(&tmp)
                .arg(&cpp)
                .output()
                .map_err(|e| failed(format!("running g++: {e}")))?;
            if !out.status.success() {
                return Err(failed(format!(
                    "g++ rejected the kernels ({}):\n{}",
                    cpp.display(),
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .take(40)
                        .collect::<Vec<_>>()
                        .join("\n")
                )));
            }
            std::fs::rename(&tmp, &so).map_err(|e| failed(format!("{}: {e}", so.display())))?;
        }
        // SAFETY: a library just compiled from RLX's own kernels and the prelude above, with no
        // initialisers of consequence.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| failed(format!("loading {}: {e}", so.display())))?;
        Ok(Emulator {
            lib,
            sources: list
                .into_iter()
                .enumerate()
                .map(|(i, s)| (s.clone(), i))
                .collect(),
        })
    }

    /// Build the kernels `sources` once for the programs compiled later by
    /// [`EmulatedBackend`] (which otherwise builds a library per program): one compile of many
    /// kernels is much cheaper than many compiles of a few.
    ///
    /// Where NVRTC is at hand the kernels are compile-checked here too, all in one batched
    /// check ([`crate::nvrtc::Nvrtc::check_all`]), so the programs' own checks find them cached.
    pub fn prebuild<'a>(sources: impl IntoIterator<Item = &'a String>) -> Result<()> {
        let sources: Vec<&String> = sources.into_iter().collect();
        nvrtc_check(&sources.iter().map(|s| s.as_str()).collect::<Vec<_>>())?;
        let e = Arc::new(Emulator::build(sources)?);
        built().lock().unwrap_or_else(|e| e.into_inner()).push(e);
        Ok(())
    }

    /// A library holding every kernel of `sources`: one built before, else a new one.
    fn shared(sources: &[String]) -> Result<Arc<Emulator>> {
        let mut libs = built().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = libs
            .iter()
            .find(|e| sources.iter().all(|s| e.sources.contains_key(s)))
        {
            return Ok(e.clone());
        }
        let e = Arc::new(Emulator::build(sources)?);
        libs.push(e.clone());
        Ok(e)
    }

    /// Run `prog`'s launches over an arena at `abase` and a params buffer at `pbase` (host
    /// addresses of buffers as large as the program's); `library`: products go to the cuBLAS
    /// calls standing in for their kernels (run by [`crate::gemm::ColumnMajor::run_on_host`]).
    fn launch_all(&self, prog: &Program, abase: u64, pbase: u64, library: bool) -> Result<()> {
        // The emulation's grid and barriers are globals of the library: one launch at a time
        // in the process.
        static ONE: Mutex<()> = Mutex::new(());
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        for l in &prog.launches {
            if let (Some(g), true) = (&l.gemm, library) {
                // SAFETY: the operands' places lie in the caller's buffers, where the lowering
                // placed every element of the product.
                unsafe { g.column_major().run_on_host(|w| host(w, abase, pbase)) };
                continue;
            }
            let i = *self
                .sources
                .get(&prog.kernels[l.kernel])
                .ok_or_else(|| failed("a kernel of the program was not built".into()))?;
            let words: Vec<u64> = l.words.iter().map(|w| host(*w, abase, pbase)).collect();
            let name = format!("rlx_launch_{i}\0");
            // SAFETY: the launcher `build` defined for this kernel, of this signature; the words
            // hold addresses inside the caller's buffers, which outlive the call.
            unsafe {
                let f: libloading::Symbol<unsafe extern "C" fn(u32, u32, u32, u32, *const u64)> =
                    self.lib
                        .get(name.as_bytes())
                        .map_err(|e| failed(format!("{name}: {e}")))?;
                f(l.grid[0], l.grid[1], l.grid[2], l.block, words.as_ptr());
            }
        }
        Ok(())
    }

    /// Run `prog` once as on a device with cuBLAS: `inputs` and `params` as bytes by slot (in
    /// [`Program::inputs`] / [`Program::params`] order), the outputs' bytes back.
    pub fn run(
        &self,
        prog: &Program,
        inputs: &[Vec<u8>],
        params: &[Vec<u8>],
    ) -> Result<Vec<Vec<u8>>> {
        self.run_with(prog, inputs, params, true)
    }

    /// [`Emulator::run`] as on a device without cuBLAS: every product on RLX's own kernel.
    pub fn run_without_cublas(
        &self,
        prog: &Program,
        inputs: &[Vec<u8>],
        params: &[Vec<u8>],
    ) -> Result<Vec<Vec<u8>>> {
        self.run_with(prog, inputs, params, false)
    }

    fn run_with(
        &self,
        prog: &Program,
        inputs: &[Vec<u8>],
        params: &[Vec<u8>],
        library: bool,
    ) -> Result<Vec<Vec<u8>>> {
        // u128 storage: every value aligned as the device's allocations are.
        let mut arena = vec![0u128; (prog.arena_bytes as usize).div_ceil(16).max(1)];
        let mut pbuf = vec![0u128; (prog.params_bytes as usize).div_ceil(16).max(1)];
        let (abase, pbase) = (arena.as_mut_ptr() as u64, pbuf.as_mut_ptr() as u64);
        let addr = |at: Loc| match at {
            Loc::Arena(o) => abase + o,
            Loc::Params(o) => pbase + o,
        };
        let put = |at: Loc, bytes: &[u8], cap: u64| -> Result<()> {
            let o = match at {
                Loc::Arena(o) | Loc::Params(o) => o,
            };
            if o + bytes.len() as u64 > cap {
                return Err(failed(format!(
                    "{} bytes at {at:?} overrun the buffer",
                    bytes.len()
                )));
            }
            // SAFETY: checked to lie inside the buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr(at) as *mut u8, bytes.len())
            };
            Ok(())
        };
        let cap = |at: Loc| match at {
            Loc::Arena(_) => arena.len() as u64 * 16,
            Loc::Params(_) => pbuf.len() as u64 * 16,
        };
        for (at, b) in &prog.consts {
            put(*at, b, cap(*at))?;
        }
        for (k, b) in inputs.iter().enumerate() {
            put(prog.input_at[k], b, cap(prog.input_at[k]))?;
        }
        for (k, b) in params.iter().enumerate() {
            put(prog.param_at[k], b, cap(prog.param_at[k]))?;
        }
        self.launch_all(prog, abase, pbase, library)?;
        let mut outs = Vec::new();
        for (k, o) in prog.outputs.iter().enumerate() {
            let n = o.shape.size_bytes().unwrap_or(0);
            let at = prog.output_at[k];
            let mut v = vec![0u8; n];
            // SAFETY: the output's place lies in the buffers (sized by the lowering).
            unsafe { std::ptr::copy_nonoverlapping(addr(at) as *const u8, v.as_mut_ptr(), n) };
            outs.push(v);
        }
        drop((arena, pbuf));
        Ok(outs)
    }
}

/// The CUDA backend's pipeline and lowering with the programs run in host emulation: register
/// it for `Device::Cuda` (`rlx_driver::register_backend`) and the products of RLX (the LLM
/// runner, the trainer, the serving engine) runs its CUDA programs on the host, for checking
/// them on a machine without a GPU (slowly).
#[derive(Clone, Copy, Debug, Default)]
pub struct EmulatedBackend;

impl Backend for EmulatedBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports(&self, graph: &Graph, id: NodeId) -> bool {
        crate::CudaBackend.supports(graph, id)
    }

    fn refusal(&self, graph: &Graph, id: NodeId) -> Option<String> {
        crate::CudaBackend.refusal(graph, id)
    }

    fn fuses(&self, graph: &Graph, id: NodeId, kind: FusionKind) -> bool {
        crate::CudaBackend.fuses(graph, id, kind)
    }

    fn compile(&self, graph: &Graph, _opts: &CompileOptions) -> Result<Box<dyn Executable>> {
        Ok(Box::new(EmulatedProgram::new(
            crate::lower(graph, &[])?,
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
            .and_then(|a| a.downcast_ref::<EmulatedProgram>())
            .ok_or_else(|| {
                Error::Invalid(
                    "params can only be shared with another emulated CUDA program".into(),
                )
            })?;
        let shared = other.prog.shared_params();
        Ok(Box::new(EmulatedProgram::new(
            crate::lower(graph, &shared)?,
            Some(other),
        )?))
    }
}

/// Host memory with the alignment of device allocations.
struct HostMem(Vec<u128>);

impl HostMem {
    fn new(bytes: u64) -> HostMem {
        HostMem(vec![0u128; (bytes as usize).div_ceil(16).max(1)])
    }
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.0.len() * 16;
        // SAFETY: u128 storage viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, n) }
    }
}

/// A lowered program with host buffers, run by an [`Emulator`].
pub struct EmulatedProgram {
    prog: Program,
    emu: Arc<Emulator>,
    arena: Mutex<HostMem>,
    params: Arc<Mutex<HostMem>>,
}

impl EmulatedProgram {
    /// The lowered program it runs.
    pub fn program(&self) -> &Program {
        &self.prog
    }

    fn new(prog: Program, share: Option<&EmulatedProgram>) -> Result<EmulatedProgram> {
        let sources: Vec<&str> = prog.kernels.iter().map(String::as_str).collect();
        nvrtc_check(&sources)?;
        let emu = Emulator::shared(&prog.kernels)?;
        let params = match share {
            Some(o) => o.params.clone(),
            None => Arc::new(Mutex::new(HostMem::new(prog.params_bytes))),
        };
        let p = EmulatedProgram {
            arena: Mutex::new(HostMem::new(prog.arena_bytes)),
            prog,
            emu,
            params,
        };
        for (at, b) in &p.prog.consts {
            p.put(*at, b)?;
        }
        Ok(p)
    }

    fn with<T>(&self, at: Loc, f: impl FnOnce(&mut [u8], usize) -> Result<T>) -> Result<T> {
        match at {
            Loc::Arena(o) => f(
                self.arena.lock().unwrap_or_else(|e| e.into_inner()).bytes(),
                o as usize,
            ),
            Loc::Params(o) => f(
                self.params
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .bytes(),
                o as usize,
            ),
        }
    }

    fn put(&self, at: Loc, bytes: &[u8]) -> Result<()> {
        self.with(at, |buf, o| {
            let end = o + bytes.len();
            if end > buf.len() {
                return Err(failed(format!(
                    "{} bytes at {at:?} overrun the buffer",
                    bytes.len()
                )));
            }
            buf[o..end].copy_from_slice(bytes);
            Ok(())
        })
    }

    fn get(&self, at: Loc, out: &mut [u8]) -> Result<()> {
        self.with(at, |buf, o| {
            let end = o + out.len();
            if end > buf.len() {
                return Err(failed(format!(
                    "{} bytes at {at:?} overrun the buffer",
                    out.len()
                )));
            }
            out.copy_from_slice(&buf[o..end]);
            Ok(())
        })
    }
}

impl Executable for EmulatedProgram {
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
            return Err(rlx_driver::byte_length_error("input", slot, bytes.len()));
        }
        self.put(self.prog.input_at[idx], bytes)
    }
    fn write_param(&mut self, idx: usize, bytes: &[u8]) -> Result<()> {
        let slot = &self.prog.params[idx];
        if bytes.len() != slot.shape.size_bytes().unwrap_or(0) {
            return Err(rlx_driver::byte_length_error("param", slot, bytes.len()));
        }
        self.put(self.prog.param_at[idx], bytes)
    }
    fn read_param(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        self.get(self.prog.param_at[idx], out)
    }
    fn execute(&mut self) -> Result<()> {
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        let mut params = self.params.lock().unwrap_or_else(|e| e.into_inner());
        let (abase, pbase) = (arena.0.as_mut_ptr() as u64, params.0.as_mut_ptr() as u64);
        let library = !rlx_ir::env::is_off(rlx_ir::env::CUBLAS);
        self.emu.launch_all(&self.prog, abase, pbase, library)
    }
    fn read_output(&self, idx: usize, out: &mut [u8]) -> Result<()> {
        self.get(self.prog.output_at[idx], out)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
