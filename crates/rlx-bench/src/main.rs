//! `rlx-bench`: RLX CPU kernels measured side by side with numpy (OpenBLAS) in the same run.
//!
//! Each configuration alternates blocks of RLX repetitions with blocks of numpy repetitions
//! (numpy runs in a subprocess pinned to the same thread count), so drifting machine load hits
//! both sides alike. Results are medians with the min–max spread, and the ratio RLX / numpy.

mod amp;
mod compile;
mod cuda_gemm;
mod edge;
mod int8;
mod numpy;
mod science;
mod stats;
mod train;

use rlx::prelude::*;
use rlx_cpu::gemm::{self, Mat};
use rlx_cpu::pool::Pool;
use stats::Samples;
use std::time::Instant;

const HELP: &str = "\
rlx-bench: RLX CPU benchmarks against numpy (OpenBLAS), interleaved in one run

USAGE:
    rlx-bench [SUITE] [OPTIONS]

SUITES:
    gemm         f32 C = A·B GFLOP/s for square sizes (default)
    bf16         bf16 and f16 GEMM (f32 sums, rounded once) against RLX's f32 GEMM, square
                 sizes, interleaved in one run (RLX only)
    elementwise  f32 add of two vectors, GB/s (kernel only, preallocated output)
    softmax      f32 row softmax of a [rows, cols] matrix, GB/s
    overhead     microseconds per CompiledGraph::run of a tiny graph (RLX only)
    linalg       f64 solve, cholesky, qr (r) and svd (singular values) of square matrices
                 (rlx-linalg on faer), GFLOP/s at nominal counts, against numpy.linalg
    sparse       f32 sparse × dense products (rlx-sparse's spmm_csr; SpMV and SpMM), GFLOP/s,
                 against scipy.sparse's CSR product
    scan         Mamba's selective scan (f32), G state updates per second, against
                 PyTorch's selective_scan_ref recurrence (python from --train-python)
    fft          c64 fft (1-D, powers of two and a prime; 2-D), f32 rfft, GFLOP/s (5 N log2 N),
                 against numpy.fft (pocketfft, one thread) and scipy.fft (workers = threads)
    amp          the character GPT trained on Genesis in f32 and under --precision, one step
                 of each in turn: step times and final losses (RLX only)
    compile      compiling the character GPT's training step in new processes without and
                 with the compile cache (on disk), and again in one process (in memory)
    edge         the digits models as int8 C for Cortex-M (flash and RAM against the float
                 weights) and as FPGA datapaths at both ends of the MAC lanes (Verilator
                 cycles, Yosys cells); needs the tools scripts/test.sh installs (RLX only)
    int8         the digits MLP and CNN quantized to int8 (rlx::quant) on the CPU, µs per batch
                 at batch 1 and 64, against ONNX Runtime's static int8 model (python from
                 .venv-edge, created by scripts/setup-edge-pyenv.sh)
    cuda-gemm    square f32 and bf16 products on a CUDA device (cuBLAS where found), TFLOP/s,
                 against torch.matmul on the same GPU (python from --train-python, else
                 python3); --sizes [default here: 4096,8192]
    train        training step (forward + backward + AdamW) of an MLP and a character GPT,
                 against JAX jit and PyTorch eager (python from --train-python)
    all          gemm, elementwise, softmax and overhead

OPTIONS:
    --sizes LIST      GEMM sizes, comma separated   [default: 256,512,1024,2048,4096]
    --shapes LIST     rectangular GEMMs instead, as MxKxN, comma separated; a trailing `t`
                      reads A transposed (e.g. 1024x512x128,512x1024x128t); RLX only
    --threads LIST    thread counts                 [default: 1,2]
    --gpt LIST        `amp` models as DIMxLAYERS     [default: 128x2,256x4]
    --steps N         `amp` training steps           [default: 300]
    --precision P     `amp` policy: auto_mixed_bf16, auto_mixed, always_bf16, always_f16
                                                    [default: auto_mixed_bf16]
    --rounds N        alternating RLX/numpy blocks   [default: 3]
    --reps N          repetitions per block          [default: 3]
    --elems N         elementwise length             [default: 10000000]
    --rows N --cols N softmax shape                  [default: 4096 x 1024]
    --linalg LIST     linalg sizes                   [default: 256,512,1024,2048]
    --scan BxDxLxN    scan shape                     [default: 4x1536x2048x16]
    --fft LIST        fft transforms as KIND:SHAPE, comma separated, KIND fft, rfft or fft2
                      [default: fft:1024,fft:16384,fft:65536,fft:1048576,fft:65537,
                       rfft:1048576,fft2:1024x1024]
    --python PATH     python with numpy              [default: .venv/bin/python, created by
                                                      scripts/setup-pyenv.sh when missing]
    --no-numpy        measure RLX only (also skips JAX / PyTorch in `train`)
    --train-python P  python with jax and torch for `train` [default: .venv-train/bin/python,
                      created by scripts/setup-train-bench-pyenv.sh]
    -h, --help        this text

Prints one markdown table per suite. Check that the machine is idle first (`top`).";

struct Opts {
    suite: String,
    sizes: Vec<usize>,
    shapes: Vec<(usize, usize, usize, bool)>,
    threads: Vec<usize>,
    rounds: usize,
    reps: usize,
    elems: usize,
    rows: usize,
    cols: usize,
    python: Option<String>,
    train_python: Option<String>,
    numpy: bool,
    gpt: Vec<(usize, usize)>,
    steps: usize,
    precision: PrecisionPolicy,
    fft: Vec<(String, Vec<usize>)>,
    linalg: Vec<usize>,
    scan: (usize, usize, usize, usize),
}

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| die(&format!("not a number: {x}")))
        })
        .collect()
}

/// `MxKxN` with an optional trailing `t` (A transposed).
fn shape(v: &str) -> (usize, usize, usize, bool) {
    let v = v.trim();
    let (dims, t) = match v.strip_suffix('t') {
        Some(d) => (d, true),
        None => (v, false),
    };
    let d: Vec<usize> = dims.split('x').filter_map(|x| x.parse().ok()).collect();
    match d[..] {
        [m, k, n] => (m, k, n, t),
        _ => die(&format!("not a GEMM shape MxKxN[t]: {v}")),
    }
}

/// `KIND:SHAPE` transforms (`fft:1024`, `fft2:1024x1024`).
fn fft_list(v: &str) -> Vec<(String, Vec<usize>)> {
    v.split(',')
        .map(|t| {
            let (kind, shape) = t
                .trim()
                .split_once(':')
                .unwrap_or_else(|| die(&format!("--fft: not KIND:SHAPE: {t}")));
            let dims: Vec<usize> = shape.split('x').filter_map(|d| d.parse().ok()).collect();
            let ok = match kind {
                "fft" | "rfft" => dims.len() == 1,
                "fft2" => dims.len() == 2,
                _ => false,
            };
            if !ok || dims.iter().any(|&d| d < 2) {
                die(&format!("--fft: not fft:N, rfft:N or fft2:NxM: {t}"));
            }
            (kind.to_string(), dims)
        })
        .collect()
}

fn die(msg: &str) -> ! {
    eprintln!("rlx-bench: {msg}\n(see rlx-bench --help)");
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        suite: "gemm".into(),
        sizes: vec![256, 512, 1024, 2048, 4096],
        shapes: Vec::new(),
        threads: vec![1, 2],
        rounds: 3,
        reps: 3,
        elems: 10_000_000,
        rows: 4096,
        cols: 1024,
        python: None,
        train_python: None,
        numpy: true,
        gpt: vec![(128, 2), (256, 4)],
        steps: 300,
        precision: PrecisionPolicy::AutoMixedBf16,
        linalg: vec![256, 512, 1024, 2048],
        scan: (4, 1536, 2048, 16),
        fft: fft_list(
            "fft:1024,fft:16384,fft:65536,fft:1048576,fft:65537,rfft:1048576,fft2:1024x1024",
        ),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                std::process::exit(0)
            }
            "--sizes" => o.sizes = list(&val()),
            "--shapes" => o.shapes = val().split(',').map(shape).collect(),
            "--threads" => o.threads = list(&val()),
            "--rounds" => o.rounds = list(&val())[0].max(1),
            "--reps" => o.reps = list(&val())[0].max(1),
            "--elems" => o.elems = list(&val())[0],
            "--rows" => o.rows = list(&val())[0],
            "--cols" => o.cols = list(&val())[0],
            "--python" => o.python = Some(val()),
            "--fft" => o.fft = fft_list(&val()),
            "--linalg" => o.linalg = list(&val()),
            "--scan" => {
                let d = val()
                    .split('x')
                    .map(|x| x.parse().unwrap_or(0))
                    .collect::<Vec<usize>>();
                match d[..] {
                    [b, dim, l, n] if b * dim * l * n > 0 => o.scan = (b, dim, l, n),
                    _ => die("--scan: not BxDxLxN"),
                }
            }
            "--train-python" => o.train_python = Some(val()),
            "--no-numpy" => o.numpy = false,
            "--steps" => o.steps = list(&val())[0].max(1),
            "--gpt" => {
                o.gpt = val()
                    .split(',')
                    .map(|v| match v.trim().split_once('x') {
                        Some((d, l)) => match (d.parse(), l.parse()) {
                            (Ok(d), Ok(l)) if d >= 32 && d % 32 == 0 && l > 0 => (d, l),
                            _ => die(&format!(
                                "--gpt: not DIMxLAYERS with DIM a multiple of 32: {v}"
                            )),
                        },
                        None => die(&format!("--gpt: not DIMxLAYERS: {v}")),
                    })
                    .collect()
            }
            "--precision" => {
                let v = val();
                o.precision = PrecisionPolicy::from_name(&v)
                    .unwrap_or_else(|| die(&format!("--precision: unknown policy {v}")))
            }
            s if !s.starts_with('-') => o.suite = s.to_string(),
            s => die(&format!("unknown option {s}")),
        }
    }
    o
}

/// Time `f` `reps` times after one untimed warm-up call (numpy_ref.py warms up likewise at the
/// start of each of its blocks), returning seconds per call.
fn time_reps(reps: usize, mut f: impl FnMut()) -> Vec<f64> {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect()
}

fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// `data` copied into a buffer allocated as the runtime's arena is (on Linux, buffers of 2 MiB
/// and more get huge pages, as numpy's large arrays do), so the kernel timings see the memory
/// a compiled graph's matmul sees.
fn arena(data: &[f32]) -> rlx_cpu::buffer::Buffer {
    // SAFETY: any f32 slice is valid as bytes.
    rlx_cpu::buffer::Buffer::from_bytes(unsafe {
        std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
    })
}

fn gemm_suite(o: &Opts, py: Option<&numpy::Numpy>) {
    if !o.shapes.is_empty() {
        return gemm_shapes(o);
    }
    println!(
        "\n### f32 GEMM (C = A·B, square), GFLOP/s: median [min–max] of {} samples\n",
        o.rounds * o.reps
    );
    println!("| n | threads | RLX | numpy (OpenBLAS) | RLX / numpy |");
    println!("|---:|---:|---:|---:|---:|");
    for &n in &o.sizes {
        let (a, b, c) = (
            arena(&fill(n * n, 1)),
            arena(&fill(n * n, 2)),
            arena(&vec![0f32; n * n]),
        );
        let (a, b, c) = (
            a.ptr() as *const f32,
            b.ptr() as *const f32,
            c.ptr() as *mut f32,
        );
        for &t in &o.threads {
            let pool = Pool::shared(t);
            let scratch = arena(&vec![0f32; gemm::scratch_len(n, n, n, t)]);
            let flops = 2.0 * (n as f64).powi(3);
            let mut run = || unsafe {
                // SAFETY: buffers sized for n×n; scratch sized by scratch_len.
                gemm::sgemm(
                    Some(&pool),
                    n,
                    n,
                    n,
                    Mat {
                        ptr: a,
                        rs: n,
                        cs: 1,
                    },
                    Mat {
                        ptr: b,
                        rs: n,
                        cs: 1,
                    },
                    c,
                    n,
                    scratch.ptr() as *mut f32,
                )
            };
            run();
            let reps = if n >= 2048 {
                o.reps.clamp(1, 2)
            } else {
                o.reps
            };
            let mut ours = Samples::default();
            let mut theirs = Samples::default();
            for _ in 0..o.rounds {
                ours.extend(
                    time_reps(reps, &mut run)
                        .into_iter()
                        .map(|s| flops / s / 1e9),
                );
                if let Some(py) = py {
                    theirs.extend(py.run(&["--op", "gemm", "--size", &n.to_string()], t, reps));
                }
            }
            println!(
                "| {n} | {t} | {} | {} | {} |",
                ours.show(1),
                theirs.show(1),
                stats::ratio(&ours, &theirs)
            );
        }
    }
}

/// Half-precision GEMMs against the f32 GEMM of the same size, alternating blocks.
fn half_suite(o: &Opts) {
    use gemm::half::{self, HMat, Half};
    println!(
        "\n### bf16 / f16 GEMM against f32 (C = A·B, square), GFLOP/s: median [min–max] of {} samples\n",
        o.rounds * o.reps
    );
    println!("| n | threads | f32 | bf16 | bf16 / f32 | f16 | f16 / f32 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &o.sizes {
        let (a, b) = (fill(n * n, 1), fill(n * n, 2));
        let bits = |v: &[f32], h: Half| -> Vec<f32> {
            // Two halves per f32 slot of an arena buffer.
            let h: Vec<u16> = v.iter().map(|&x| h.from_f32(x)).collect();
            h.chunks(2)
                .map(|c| f32::from_bits(c[0] as u32 | (*c.get(1).unwrap_or(&0) as u32) << 16))
                .collect()
        };
        let (af, bf, cf) = (arena(&a), arena(&b), arena(&vec![0f32; n * n]));
        let hs: Vec<_> = [Half::Bf16, Half::F16]
            .iter()
            .map(|&h| {
                (
                    h,
                    arena(&bits(&a, h)),
                    arena(&bits(&b, h)),
                    arena(&vec![0f32; n * n / 2 + 1]),
                )
            })
            .collect();
        for &t in &o.threads {
            let pool = Pool::shared(t);
            let s32 = arena(&vec![0f32; gemm::scratch_len(n, n, n, t)]);
            let sh = arena(&vec![
                0f32;
                half::scratch_bytes(n, n, n, t, Half::Bf16)
                    .max(half::scratch_bytes(n, n, n, t, Half::F16))
                    / 4
                    + 1
            ]);
            let flops = 2.0 * (n as f64).powi(3);
            let m32 = |p: *const u8| Mat {
                ptr: p as *const f32,
                rs: n,
                cs: 1,
            };
            let mh = |p: *const u8| HMat::strided(p as *const u16, n, 1);
            let reps = if n >= 2048 {
                o.reps.clamp(1, 2)
            } else {
                o.reps
            };
            let mut f32s = Samples::default();
            let mut per = [Samples::default(), Samples::default()];
            for _ in 0..o.rounds {
                // SAFETY: buffers sized for n×n; scratch sized by scratch_len / scratch_bytes.
                f32s.extend(
                    time_reps(reps, || unsafe {
                        gemm::sgemm(
                            Some(&pool),
                            n,
                            n,
                            n,
                            m32(af.ptr()),
                            m32(bf.ptr()),
                            cf.ptr() as *mut f32,
                            n,
                            s32.ptr() as *mut f32,
                        )
                    })
                    .into_iter()
                    .map(|s| flops / s / 1e9),
                );
                for (i, (h, ah, bh, ch)) in hs.iter().enumerate() {
                    per[i].extend(
                        time_reps(reps, || unsafe {
                            half::hgemm(
                                Some(&pool),
                                *h,
                                n,
                                n,
                                n,
                                mh(ah.ptr()),
                                mh(bh.ptr()),
                                ch.ptr() as *mut u16,
                                n,
                                sh.ptr(),
                            )
                        })
                        .into_iter()
                        .map(|s| flops / s / 1e9),
                    );
                }
            }
            println!(
                "| {n} | {t} | {} | {} | {} | {} | {} |",
                f32s.show(1),
                per[0].show(1),
                stats::ratio(&per[0], &f32s),
                per[1].show(1),
                stats::ratio(&per[1], &f32s),
            );
        }
    }
}

/// Rectangular GEMMs (`--shapes`), RLX only.
fn gemm_shapes(o: &Opts) {
    println!("\n### f32 GEMM (C = A·B, A m×k or its transpose), GFLOP/s: median [min–max] of {} samples\n", o.rounds * o.reps);
    println!("| m×k×n | A | threads | RLX |");
    println!("|---|---|---:|---:|");
    for &(m, k, n, trans) in &o.shapes {
        let (a, b, c) = (
            arena(&fill(m * k, 1)),
            arena(&fill(k * n, 2)),
            arena(&vec![0f32; m * n]),
        );
        let (a, b, c) = (
            a.ptr() as *const f32,
            b.ptr() as *const f32,
            c.ptr() as *mut f32,
        );
        let am = if trans {
            Mat {
                ptr: a,
                rs: 1,
                cs: m,
            }
        } else {
            Mat {
                ptr: a,
                rs: k,
                cs: 1,
            }
        };
        for &t in &o.threads {
            let pool = Pool::shared(t);
            let scratch = arena(&vec![0f32; gemm::scratch_len(m, n, k, t)]);
            let flops = 2.0 * (m * n * k) as f64;
            // SAFETY: buffers sized for the shape; scratch sized by scratch_len.
            let mut run = || unsafe {
                gemm::sgemm(
                    Some(&pool),
                    m,
                    n,
                    k,
                    am,
                    Mat {
                        ptr: b,
                        rs: n,
                        cs: 1,
                    },
                    c,
                    n,
                    scratch.ptr() as *mut f32,
                )
            };
            run();
            let mut ours = Samples::default();
            for _ in 0..o.rounds {
                ours.extend(
                    time_reps(o.reps, &mut run)
                        .into_iter()
                        .map(|s| flops / s / 1e9),
                );
            }
            println!(
                "| {m}×{k}×{n} | {} | {t} | {} |",
                if trans { "transposed" } else { "row-major" },
                ours.show(1)
            );
        }
    }
}

/// Compile `g` straight to a CPU program (kernel-level timing, no I/O copies).
fn program(g: &Graph, threads: usize, params: &[(&str, &[f32])]) -> rlx_cpu::Program {
    let bytes: Vec<(&str, Vec<u8>)> = params
        .iter()
        .map(|(n, v)| (*n, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    science::program(g, threads, &bytes)
}

fn stream_suite(o: &Opts, py: Option<&numpy::Numpy>, softmax: bool) {
    let (title, n) = if softmax {
        (
            format!("f32 softmax over rows of [{}, {}]", o.rows, o.cols),
            o.rows * o.cols,
        )
    } else {
        (
            format!("f32 add of two vectors of {} elements", o.elems),
            o.elems,
        )
    };
    println!(
        "\n### {title}, GB/s: median [min–max] of {} samples\n",
        o.rounds * o.reps
    );
    if softmax {
        println!("numpy's softmax is six passes over the rows (max, subtract, exp, sum, reciprocal, multiply); RLX's is one kernel.\n");
    }
    // numpy's ufuncs run on one thread whatever the BLAS thread count: its column is always
    // one thread, and rows with more RLX threads say so.
    println!("| RLX threads | RLX | numpy (1 thread) | RLX / numpy |");
    println!("|---:|---:|---:|---:|");
    let mut g = Graph::new("stream");
    let a = fill(n, 3);
    let b = fill(n, 4);
    let (bytes, params): (f64, Vec<(&str, &[f32])>) = if softmax {
        let x = g.param("a", Shape::new(&[o.rows, o.cols], DType::F32));
        let y = g.softmax(x, 1);
        g.set_outputs(vec![y]);
        (8.0 * n as f64, vec![("a", &a)])
    } else {
        let x = g.param("a", Shape::new(&[n], DType::F32));
        let y = g.param("b", Shape::new(&[n], DType::F32));
        let z = g.add(x, y);
        g.set_outputs(vec![z]);
        (12.0 * n as f64, vec![("a", &a), ("b", &b)])
    };
    for &t in &o.threads {
        let mut p = program(&g, t, &params);
        p.execute();
        let mut ours = Samples::default();
        let mut theirs = Samples::default();
        for _ in 0..o.rounds {
            ours.extend(
                time_reps(o.reps, || p.execute())
                    .into_iter()
                    .map(|s| bytes / s / 1e9),
            );
            if let Some(py) = py {
                let args: Vec<String> = if softmax {
                    vec![
                        "--op".into(),
                        "softmax".into(),
                        "--rows".into(),
                        o.rows.to_string(),
                        "--cols".into(),
                        o.cols.to_string(),
                    ]
                } else {
                    vec!["--op".into(), "add".into(), "--elems".into(), n.to_string()]
                };
                let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                theirs.extend(py.run(&args, 1, o.reps));
            }
        }
        println!(
            "| {t} | {} | {} | {} |",
            ours.show(2),
            theirs.show(2),
            stats::ratio(&ours, &theirs)
        );
    }
}

fn fft_suite(o: &Opts, py: Option<&numpy::Numpy>) {
    println!(
        "\n### FFT, GFLOP/s (5 N log2 N per complex transform of N points, 2.5 N log2 N per real one): median [min–max] of {} samples\n",
        o.rounds * o.reps
    );
    println!("numpy.fft (pocketfft) runs on one thread; scipy.fft gets `workers` = the RLX thread count. A 1-D transform runs on one thread in all three; a 2-D one splits its rows.\n");
    println!("| transform | threads | RLX | numpy.fft | scipy.fft | RLX / numpy | RLX / scipy |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (kind, dims) in &o.fft {
        let n: usize = dims.iter().product();
        let real = kind == "rfft";
        let dt = if real { DType::F32 } else { DType::C64 };
        let mut g = Graph::new("fft");
        let x = g.param("x", Shape::new(dims, dt));
        let y = match kind.as_str() {
            "fft" => g.fft(x, 0, None),
            "rfft" => g.rfft(x, 0, None),
            _ => g.fft2(x),
        };
        g.set_outputs(vec![y]);
        let data = fill(if real { n } else { 2 * n }, 9);
        let flops = if real { 2.5 } else { 5.0 } * n as f64 * (n as f64).log2();
        let shape: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
        let shape = shape.join("x");
        for &t in &o.threads {
            let mut p = program(&g, t, &[("x", &data)]);
            p.execute();
            let (mut ours, mut np, mut sp) =
                (Samples::default(), Samples::default(), Samples::default());
            for _ in 0..o.rounds {
                ours.extend(
                    time_reps(o.reps, || p.execute())
                        .into_iter()
                        .map(|s| flops / s / 1e9),
                );
                if let Some(py) = py {
                    for (lib, into) in [("numpy", &mut np), ("scipy", &mut sp)] {
                        let args = [
                            "--op", "fft", "--kind", kind, "--shape", &shape, "--lib", lib,
                        ];
                        into.extend(py.run(&args, t, o.reps));
                    }
                }
            }
            println!(
                "| {kind} {shape} | {t} | {} | {} | {} | {} | {} |",
                ours.show(2),
                np.show(2),
                sp.show(2),
                stats::ratio(&ours, &np),
                stats::ratio(&ours, &sp)
            );
        }
    }
}

fn overhead_suite(o: &Opts) {
    println!("\n### Per-run overhead of a tiny graph ([1,4] x [4,2] matmul through CompiledGraph::run), µs\n");
    println!("| threads | median [min–max] per run |");
    println!("|---:|---:|");
    for &t in &o.threads {
        let mut g = Graph::new("tiny");
        let x = g.input("x", Shape::new(&[1, 4], DType::F32));
        let w = g.param("w", Shape::new(&[4, 2], DType::F32));
        let y = g.matmul(x, w, Shape::new(&[1, 2], DType::F32));
        g.set_outputs(vec![y]);
        let mut c = Session::new(Device::Cpu).with_threads(t).compile(g);
        c.set_param("w", &[1.0; 8]);
        let xv = [1.0f32, 2.0, 3.0, 4.0];
        let mut s = Samples::default();
        for _ in 0..o.rounds * o.reps {
            const N: usize = 20_000;
            let t0 = Instant::now();
            for _ in 0..N {
                std::hint::black_box(c.run(&[("x", &xv)]));
            }
            s.push(t0.elapsed().as_secs_f64() / N as f64 * 1e6);
        }
        println!("| {t} | {} |", s.show(3));
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("compile-child") {
        let arg = |i| {
            std::env::args()
                .nth(i)
                .unwrap_or_else(|| die("compile-child WHAT DIR"))
        };
        compile::child(&arg(2), &arg(3));
        return;
    }
    let o = parse();
    if o.suite == "compile" {
        compile::suite(o.rounds.max(5));
        return;
    }
    if o.suite == "amp" {
        println!("{}", stats::machine_report());
        amp::suite(&o.gpt, &o.threads, o.steps, &o.precision);
        return;
    }
    if o.suite == "scan" {
        println!("{}", stats::machine_report());
        let python = o
            .numpy
            .then(|| train::reference_python(o.train_python.as_deref()));
        science::scan_suite(o.scan, &o.threads, o.rounds, o.reps, python.as_deref());
        return;
    }
    if o.suite == "edge" {
        edge::suite();
        return;
    }
    if o.suite == "int8" {
        println!("{}", stats::machine_report());
        int8::suite(&o.threads, o.rounds, o.reps, o.numpy);
        return;
    }
    if o.suite == "cuda-gemm" {
        let sizes = if std::env::args().any(|a| a == "--sizes") {
            o.sizes.clone()
        } else {
            vec![4096, 8192]
        };
        let py = o.train_python.clone().unwrap_or_else(|| "python3".into());
        cuda_gemm::suite(&sizes, o.rounds, o.reps.max(10), &py);
        return;
    }
    if o.suite == "train" {
        println!("{}", stats::machine_report());
        train::suite(
            &o.threads,
            o.rounds,
            o.reps,
            if o.numpy {
                Some(train::reference_python(o.train_python.as_deref()))
            } else {
                None
            },
        );
        return;
    }
    let py = if o.numpy {
        Some(numpy::Numpy::find(o.python.as_deref()))
    } else {
        None
    };
    println!("{}", stats::machine_report());
    if let Some(p) = &py {
        println!("numpy reference: {}", p.describe());
    }
    let all = o.suite == "all";
    let mut ran = false;
    if o.suite == "bf16" {
        half_suite(&o);
        ran = true;
    }
    if all || o.suite == "gemm" {
        gemm_suite(&o, py.as_ref());
        ran = true;
    }
    if all || o.suite == "elementwise" {
        stream_suite(&o, py.as_ref(), false);
        ran = true;
    }
    if all || o.suite == "softmax" {
        stream_suite(&o, py.as_ref(), true);
        ran = true;
    }
    if o.suite == "fft" {
        fft_suite(&o, py.as_ref());
        ran = true;
    }
    if o.suite == "sparse" {
        science::sparse_suite(
            &[(100_000, 16, 1), (1_000_000, 16, 1), (100_000, 16, 16)],
            &o.threads,
            o.rounds,
            o.reps,
            py.as_ref(),
        );
        ran = true;
    }
    if o.suite == "linalg" {
        science::linalg_suite(&o.linalg, &o.threads, o.rounds, o.reps, py.as_ref());
        ran = true;
    }
    if all || o.suite == "overhead" {
        overhead_suite(&o);
        ran = true;
    }
    if !ran {
        die(&format!("unknown suite {}", o.suite));
    }
}
