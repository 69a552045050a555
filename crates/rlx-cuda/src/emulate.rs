//! Running lowered programs on the host, for checking the lowering and the kernels on a machine
//! without a GPU: the CUDA C of every kernel is compiled as C++ by the host's compiler (`g++`)
//! against a small header that plays the CUDA execution model (a block's threads are host
//! threads; `__syncthreads` a barrier; `__shfl_xor_sync` an exchange through memory among a
//! warp's 32 threads; `__shared__` arrays one per kernel, blocks run one after another), and the
//! launches of a [`Program`] run over host memory laid out as the device's would be.
//!
//! What this checks: every word of every launch (sizes, strides, addresses the memory plan
//! gave), the kernels' arithmetic and their cooperation inside a block, against the reference
//! evaluator. What it cannot: device-only behaviour (scheduling across blocks, the driver,
//! CUDA graphs, timing), and the device's math library (the host's `expf` is not the GPU's).

use crate::lower::{Loc, Program, Word};
use rlx_ir::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

const PRELUDE: &str = r#"#include <math.h>
#include <string.h>
#include <stdint.h>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct emu_dim3 { unsigned x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;
static std::barrier<>* emu_block;
static std::barrier<>* emu_warps[32];
static unsigned long long emu_ex[1024];
static inline void __syncthreads() { emu_block->arrive_and_wait(); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned t = threadIdx.x, w = t >> 5, lane = t & 31;
    memcpy(&emu_ex[t], &v, sizeof(T));
    emu_warps[w]->arrive_and_wait();
    T r;
    memcpy(&r, &emu_ex[(w << 5) | (lane ^ (unsigned)o)], sizeof(T));
    emu_warps[w]->arrive_and_wait();
    return r;
}
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, const std::function<void()>& k) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, 1, 1};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                std::barrier<> block(bx);
                std::vector<std::barrier<>*> warps;
                for (unsigned w = 0; w < (bx + 31) / 32; ++w) warps.push_back(new std::barrier<>(bx - 32 * w < 32 ? bx - 32 * w : 32));
                emu_block = &block;
                for (unsigned w = 0; w < warps.size(); ++w) emu_warps[w] = warps[w];
                std::vector<std::thread> ts;
                for (unsigned t = 0; t < bx; ++t)
                    ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; k(); });
                for (auto& t : ts) t.join();
                for (auto* w : warps) delete w;
            }
}
"#;

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
                "namespace k{i} {{\n{body}}}\nextern \"C\" void rlx_launch_{i}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, const void* words) {{\n    k{i}::M m;\n    memcpy(&m, words, sizeof(m));\n    emu_launch(gx, gy, gz, bx, [&] {{ k{i}::k(m); }});\n}}\n"
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

    /// Run `prog` once: `inputs` and `params` as bytes by slot (in [`Program::inputs`] /
    /// [`Program::params`] order), the outputs' bytes back.
    pub fn run(
        &self,
        prog: &Program,
        inputs: &[Vec<u8>],
        params: &[Vec<u8>],
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
        for l in &prog.launches {
            let i = *self
                .sources
                .get(&prog.kernels[l.kernel])
                .ok_or_else(|| failed("a kernel of the program was not built".into()))?;
            let words: Vec<u64> = l
                .words
                .iter()
                .map(|w| match *w {
                    Word::Imm(v) => v as u64,
                    Word::Addr(at) => addr(at),
                })
                .collect();
            let name = format!("rlx_launch_{i}\0");
            // SAFETY: the launcher `build` defined for this kernel, of this signature; the words
            // hold addresses inside `arena` and `pbuf`, which outlive the call.
            unsafe {
                let f: libloading::Symbol<unsafe extern "C" fn(u32, u32, u32, u32, *const u64)> =
                    self.lib
                        .get(name.as_bytes())
                        .map_err(|e| failed(format!("{name}: {e}")))?;
                f(l.grid[0], l.grid[1], l.grid[2], l.block, words.as_ptr());
            }
        }
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
