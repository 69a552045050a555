//! Scientific suites: dense linear algebra (`rlx-linalg`) against numpy.linalg, and Mamba's
//! selective scan against PyTorch.

use crate::stats::{self, Samples};
use crate::{die, time_reps};
use rlx::driver::Executable;
use rlx::prelude::*;
use rlx_linalg::{apply, Linalg, QrOutput, SvdOutput};
use std::path::Path;
use std::process::Command;

/// A program of `g` with params given as bytes.
pub fn program(g: &Graph, threads: usize, params: &[(&str, Vec<u8>)]) -> rlx_cpu::Program {
    let mut p = rlx_cpu::compile(g, threads).unwrap_or_else(|e| die(&e.to_string()));
    for (name, bytes) in params {
        let i = p
            .params()
            .iter()
            .position(|s| s.name == *name)
            .expect("param");
        p.write_param(i, bytes);
    }
    p
}

/// `rounds` alternations of `reps` timed executions of `p` (as `work / seconds / 1e9`) with a
/// block of the reference's values from `reference` (skipped when it gives none).
fn alternate(
    p: &mut rlx_cpu::Program,
    rounds: usize,
    reps: usize,
    work: f64,
    mut reference: impl FnMut() -> Vec<f64>,
) -> (Samples, Samples) {
    let (mut ours, mut theirs) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        ours.extend(
            time_reps(reps, || p.execute())
                .into_iter()
                .map(|s| work / s / 1e9),
        );
        theirs.extend(reference());
    }
    (ours, theirs)
}

/// Deterministic values in [-0.5, 0.5) as f64.
fn values(n: usize, seed: u64) -> Vec<f64> {
    crate::fill(n, seed).into_iter().map(f64::from).collect()
}

fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The nominal flop count of `kind` on an n × n matrix (as numpy_ref.py counts it).
fn linalg_flops(kind: &str, n: usize) -> f64 {
    let n3 = (n as f64).powi(3);
    match kind {
        "solve" => 2.0 / 3.0 * n3,
        "cholesky" => n3 / 3.0,
        "qr_r" => 4.0 / 3.0 * n3,
        _ => 8.0 / 3.0 * n3,
    }
}

/// `solve`, `cholesky`, `qr` (r only) and `svd` (singular values only) of f64 n × n matrices,
/// GFLOP/s at nominal counts, against numpy.linalg with OpenBLAS at the same thread count.
pub fn linalg_suite(
    sizes: &[usize],
    threads: &[usize],
    rounds: usize,
    reps: usize,
    py: Option<&crate::numpy::Numpy>,
) {
    rlx_linalg::register().unwrap_or_else(|e| die(&e.to_string()));
    println!(
        "\n### Dense linear algebra, f64, GFLOP/s at nominal counts (LU 2/3 n³, Cholesky 1/3 n³, QR 4/3 n³, SVD 8/3 n³): median [min–max] of {} samples\n",
        rounds * reps
    );
    println!("| op | n | threads | RLX (faer) | numpy (OpenBLAS LAPACK) | RLX / numpy |");
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in ["solve", "cholesky", "qr_r", "svd_s"] {
        for &n in sizes {
            let mut a = values(n * n, 5);
            if kind == "cholesky" {
                // a aᵀ + n I: symmetric positive definite.
                let mut s = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..n {
                        s[i * n + j] = (0..n).map(|k| a[i * n + k] * a[j * n + k]).sum::<f64>()
                            + if i == j { n as f64 } else { 0.0 };
                    }
                }
                a = s;
            }
            let mut g = Graph::new(kind);
            let am = g.param("a", Shape::new(&[n, n], DType::F64));
            let mut params = vec![("a", f64_bytes(&a))];
            let y = match kind {
                "solve" => {
                    let b = g.param("b", Shape::new(&[n, 1], DType::F64));
                    params.push(("b", f64_bytes(&values(n, 6))));
                    apply(&mut g, Linalg::Solve, &[am, b])
                }
                "cholesky" => apply(&mut g, Linalg::Cholesky, &[am]),
                "qr_r" => apply(
                    &mut g,
                    Linalg::Qr {
                        output: QrOutput::R,
                    },
                    &[am],
                ),
                _ => apply(
                    &mut g,
                    Linalg::Svd {
                        output: SvdOutput::S,
                    },
                    &[am],
                ),
            }
            .unwrap_or_else(|e| die(&e.to_string()));
            g.set_outputs(vec![y]);
            let flops = linalg_flops(kind, n);
            for &t in threads {
                let mut p = program(&g, t, &params);
                let size = n.to_string();
                let args = ["--op", "linalg", "--kind", kind, "--size", &size];
                let (ours, theirs) = alternate(&mut p, rounds, reps, flops, || {
                    py.map_or_else(Vec::new, |py| py.run(&args, t, reps))
                });
                println!(
                    "| {kind} | {n} | {t} | {} | {} | {} |",
                    ours.show(2),
                    theirs.show(2),
                    stats::ratio(&ours, &theirs)
                );
            }
        }
    }
}

/// Mamba's selective scan (softplus on delta, skip and gate) of `[batch, dim, length]` with
/// `state` states, G state updates per second, against PyTorch's `selective_scan_ref`
/// recurrence run by `python` (torch) at the same thread count.
pub fn scan_suite(
    (batch, dim, length, state): (usize, usize, usize, usize),
    threads: &[usize],
    rounds: usize,
    reps: usize,
    python: Option<&Path>,
) {
    println!(
        "\n### Selective scan, batch {batch}, d_inner {dim}, length {length}, state {state}, f32, G state updates per second (B·D·L·N / t): median [min–max] of {} samples\n",
        rounds * reps
    );
    println!("| threads | RLX | PyTorch (selective_scan_ref) | RLX / PyTorch |");
    println!("|---:|---:|---:|---:|");
    let mut g = Graph::new("scan");
    let f32s = |dims: &[usize]| Shape::new(dims, DType::F32);
    let ins = [
        g.param("u", f32s(&[batch, dim, length])),
        g.param("delta", f32s(&[batch, dim, length])),
        g.param("a", f32s(&[dim, state])),
        g.param("b", f32s(&[batch, state, length])),
        g.param("c", f32s(&[batch, state, length])),
        g.param("d", f32s(&[dim])),
        g.param("z", f32s(&[batch, dim, length])),
    ];
    let y = g.selective_scan(
        [ins[0], ins[1], ins[2], ins[3], ins[4]],
        Some(ins[5]),
        Some(ins[6]),
        true,
    );
    g.set_outputs(vec![y]);
    let a: Vec<f32> = crate::fill(dim * state, 3)
        .into_iter()
        .map(|v| -(v * 2.0).exp())
        .collect();
    let params = [
        ("u", f32_bytes(&crate::fill(batch * dim * length, 1))),
        ("delta", f32_bytes(&crate::fill(batch * dim * length, 2))),
        ("a", f32_bytes(&a)),
        ("b", f32_bytes(&crate::fill(batch * state * length, 4))),
        ("c", f32_bytes(&crate::fill(batch * state * length, 5))),
        ("d", f32_bytes(&crate::fill(dim, 6))),
        ("z", f32_bytes(&crate::fill(batch * dim * length, 7))),
    ];
    let work = (batch * dim * length * state) as f64;
    for &t in threads {
        let mut p = program(&g, t, &params);
        let (ours, theirs) = alternate(&mut p, rounds, reps, work, || {
            python.map_or_else(Vec::new, |py| {
                torch_scan(py, (batch, dim, length, state), t, reps)
            })
        });
        println!(
            "| {t} | {} | {} | {} |",
            ours.show(3),
            theirs.show(3),
            stats::ratio(&ours, &theirs)
        );
    }
}

fn torch_scan(
    python: &Path,
    (batch, dim, length, state): (usize, usize, usize, usize),
    threads: usize,
    reps: usize,
) -> Vec<f64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/scan_ref.py");
    let s = |v: usize| v.to_string();
    let out = Command::new(python)
        .arg(&script)
        .args(["--threads", &s(threads), "--reps", &s(reps)])
        .args(["--batch", &s(batch), "--dim", &s(dim)])
        .args(["--length", &s(length), "--state", &s(state)])
        .output()
        .unwrap_or_else(|e| die(&format!("running {}: {e}", python.display())));
    if !out.status.success() {
        die(&format!(
            "scan_ref.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("scan_ref.py prints one JSON object");
    crate::numpy::values(&v)
}

/// Sparse × dense products (`rlx-sparse`'s `spmm`) of an n × n f32 matrix with `per_row`
/// nonzeros in each row (sorted rows, as a CSR matrix's) and a dense vector or `[n, k]`
/// matrix, GFLOP/s (2 nnz k / t), against scipy.sparse's CSR product.
pub fn sparse_suite(
    configs: &[(usize, usize, usize)],
    threads: &[usize],
    rounds: usize,
    reps: usize,
    py: Option<&crate::numpy::Numpy>,
) {
    rlx_sparse::register().unwrap_or_else(|e| die(&e.to_string()));
    println!(
        "\n### Sparse × dense, f32, GFLOP/s (2 nnz k / t): median [min–max] of {} samples\n",
        rounds * reps
    );
    println!(
        "scipy.sparse runs its products on one thread; RLX splits the rows over its threads.\n"
    );
    println!("| n | nonzeros per row | k | threads | RLX | scipy.sparse (CSR) | RLX / scipy |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &(n, per, k) in configs {
        let nnz = n * per;
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let indptr: Vec<i32> = (0..=n).map(|r| (r * per) as i32).collect();
        let cols: Vec<i32> = (0..nnz).map(|_| (next() % n as u64) as i32).collect();
        let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let mut g = Graph::new("spmm");
        let csr = rlx_sparse::Csr {
            indptr: g.param("indptr", Shape::new(&[n + 1], DType::I32)),
            indices: g.param("cols", Shape::new(&[nnz], DType::I32)),
            values: g.param("values", Shape::new(&[nnz], DType::F32)),
            shape: (n, n),
        };
        let dense_dims = if k == 1 { vec![n] } else { vec![n, k] };
        let x = g.param("x", Shape::new(&dense_dims, DType::F32));
        let y = csr
            .matmul(&mut g, x)
            .unwrap_or_else(|e| die(&e.to_string()));
        g.set_outputs(vec![y]);
        let params = [
            ("indptr", ints(&indptr)),
            ("cols", ints(&cols)),
            ("values", f32_bytes(&crate::fill(nnz, 8))),
            ("x", f32_bytes(&crate::fill(n * k, 9))),
        ];
        let flops = 2.0 * (nnz * k) as f64;
        for &t in threads {
            let mut p = program(&g, t, &params);
            let (mut ours, mut theirs) = (Samples::default(), Samples::default());
            for _ in 0..rounds {
                ours.extend(
                    time_reps(reps, || p.execute())
                        .into_iter()
                        .map(|s| flops / s / 1e9),
                );
                if let Some(py) = py {
                    let (ns, ps, ks) = (n.to_string(), per.to_string(), k.to_string());
                    let args = [
                        "--op",
                        "spmm",
                        "--size",
                        &ns,
                        "--per-row",
                        &ps,
                        "--cols",
                        &ks,
                    ];
                    theirs.extend(py.run(&args, t, reps));
                }
            }
            println!(
                "| {n} | {per} | {k} | {t} | {} | {} | {} |",
                ours.show(2),
                theirs.show(2),
                stats::ratio(&ours, &theirs)
            );
        }
    }
}
