//! `cuda-gemm`: square products on a CUDA device through RLX (`Device::Cuda`: cuBLAS where the
//! machine has it, else RLX's tiled kernel) against PyTorch's `torch.matmul` on the same GPU,
//! in one run, blocks alternating.
//!
//! Both sides time the same work per repetition: the product of two resident matrices, the sum
//! of its elements and that one value read back (the host waits for the device each time), so
//! neither side's launch or wait is left out. TFLOP/s count the product's `2 n³` only.

use crate::stats::{ratio, Samples};
use rlx::prelude::*;
use std::process::Command;
use std::time::Instant;

const TORCH: &str = r#"
import json, sys, time, torch
n, dt, reps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dt]
torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.rand((n, n), device="cuda", dtype=dtype, generator=g) - 0.5
b = torch.rand((n, n), device="cuda", dtype=dtype, generator=g) - 0.5
for _ in range(3):
    (a @ b).sum().item()
times = []
for _ in range(reps):
    t = time.perf_counter()
    (a @ b).sum().item()
    times.append(time.perf_counter() - t)
print(json.dumps({"times_s": times, "device": torch.cuda.get_device_name()}))
"#;

fn torch_block(python: &str, n: usize, dt: &str, reps: usize) -> Option<(Vec<f64>, String)> {
    let out = Command::new(python)
        .args(["-c", TORCH, &n.to_string(), dt, &reps.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "PyTorch ({python}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let times = v["times_s"]
        .as_array()?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    Some((times, v["device"].as_str().unwrap_or("?").to_string()))
}

/// RLX's program: `sum(a · b)` over params `a`, `b` of `[n, n]` in `dt`.
fn rlx_program(n: usize, dt: DType) -> CompiledGraph {
    let mut g = Graph::new("cuda_gemm");
    let a = g.param("a", Shape::new(&[n, n], dt));
    let b = g.param("b", Shape::new(&[n, n], dt));
    let y = g.op(Op::MatMul, &[a, b]);
    let s = g.sum(y, &[0, 1], false);
    g.set_outputs(vec![s]);
    let mut c = Session::new(Device::Cuda)
        .try_compile(g)
        .unwrap_or_else(|e| panic!("compiling the product for CUDA: {e}"));
    let mut seed = 0x9e3779b97f4a7c15u64;
    for name in ["a", "b"] {
        let vals: Vec<f32> = (0..n * n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let bytes: Vec<u8> = match dt {
            DType::BF16 => vals
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::F16 => vals
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        c.try_set_param_typed(name, &bytes, dt)
            .unwrap_or_else(|e| panic!("setting {name}: {e}"));
    }
    c
}

/// The suite: each size in f32 and bf16, `rounds` blocks of `reps` repetitions a side.
pub fn suite(sizes: &[usize], rounds: usize, reps: usize, python: &str) {
    if !Device::Cuda.is_available() {
        println!("no CUDA device: {}", Device::Cuda.availability_hint());
        return;
    }
    println!(
        "RLX products through {}",
        if rlx_cuda::cublas_found() {
            "cuBLAS"
        } else {
            "RLX's tiled kernel (no cuBLAS found)"
        }
    );
    println!("\n### Square products on CUDA, TFLOP/s: median [min–max]\n");
    println!("| n | dtype | RLX | PyTorch | RLX / PyTorch |");
    println!("|---:|---|---:|---:|---:|");
    let mut device = String::new();
    for &n in sizes {
        for (dt, name) in [(DType::F32, "f32"), (DType::BF16, "bf16")] {
            let tflop = 2.0 * (n as f64).powi(3) / 1e12;
            let mut c = rlx_program(n, dt);
            for _ in 0..3 {
                c.run_typed(&[]);
            }
            let (mut ours, mut theirs) = (Samples::default(), Samples::default());
            for _ in 0..rounds {
                for _ in 0..reps {
                    let t = Instant::now();
                    c.run_typed(&[]);
                    ours.push(tflop / t.elapsed().as_secs_f64());
                }
                if let Some((times, dev)) = torch_block(python, n, name, reps) {
                    theirs.extend(times.into_iter().map(|s| tflop / s));
                    device = dev;
                }
            }
            println!(
                "| {n} | {name} | {} | {} | {} |",
                ours.show(1),
                theirs.show(1),
                ratio(&ours, &theirs)
            );
        }
    }
    println!("\nPyTorch on {device}; each repetition: the product, its sum, one value read back.");
}
