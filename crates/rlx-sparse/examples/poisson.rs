//! A sparse solve in a graph: the 1-D Poisson equation `-u'' = f` on 200 points, its
//! tridiagonal matrix in CSR form, solved by conjugate gradients (an RLX `while`), and the
//! gradient of the solution's mean with respect to the source (one more solve, by the implicit
//! reverse-mode rule).
//!
//! `cargo run --release -p rlx-sparse --example poisson`

use rlx::autodiff::{grad_with_loss, D_OUTPUT};
use rlx::prelude::*;
use rlx_sparse::{cg, Csr};

fn main() -> Result<()> {
    let n = 200;
    let h = 1.0 / (n + 1) as f64;
    // Rows of tridiag(-1, 2, -1) / h².
    let (mut indptr, mut indices, mut values) = (vec![0i32], Vec::new(), Vec::new());
    for i in 0..n {
        for (j, v) in [(i as i64 - 1, -1.0), (i as i64, 2.0), (i as i64 + 1, -1.0)] {
            if (0..n as i64).contains(&j) {
                indices.push(j as i32);
                values.push(v / (h * h));
            }
        }
        indptr.push(indices.len() as i32);
    }
    let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let floats = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let f64s = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };

    let mut g = Graph::new("poisson");
    let nnz = values.len();
    let csr = Csr {
        indptr: g.try_constant_bytes(Shape::new(&[n + 1], DType::I32), ints(&indptr))?,
        indices: g.try_constant_bytes(Shape::new(&[nnz], DType::I32), ints(&indices))?,
        values: g.try_constant_bytes(Shape::new(&[nnz], DType::F64), floats(&values))?,
        shape: (n, n),
    };
    let coo = csr.to_coo(&mut g)?;
    let f = g.input("f", Shape::new(&[n], DType::F64));
    let u = cg(&mut g, &coo, f, 1e-10, 4 * n)?;
    let mean = g.try_mean(u, &[0], false)?;
    g.set_outputs(vec![mean, u]);

    // f = 1: the exact solution is u(x) = x (1 - x) / 2, which the discretization reproduces.
    let src = floats(&vec![1.0; n]);
    let mut c = Session::new(Device::Cpu).try_compile(g.clone())?;
    let outs = c.try_run_typed(&[("f", &src, DType::F64)])?;
    let u = f64s(&outs[1].0);
    let worst = (0..n)
        .map(|i| {
            let x = (i + 1) as f64 * h;
            (u[i] - x * (1.0 - x) / 2.0).abs()
        })
        .fold(0.0, f64::max);
    let x = (n / 2 + 1) as f64 * h;
    println!(
        "u({x:.4}) = {:.6} (exact {:.6}), largest error {worst:.2e}",
        u[n / 2],
        x * (1.0 - x) / 2.0
    );
    assert!(worst < 1e-6);

    // d mean(u) / d f = A⁻¹ 1 / n (A is symmetric): the solution itself, divided by n.
    let wrt = [g.find_leaf("f").expect("input f")];
    let mut c = Session::new(Device::Cpu).try_compile(grad_with_loss(&g, &wrt)?)?;
    let one = 1.0f64.to_le_bytes();
    let outs = c.try_run_typed(&[("f", &src, DType::F64), (D_OUTPUT, &one, DType::F64)])?;
    let df = f64s(&outs[1].0);
    let off = (0..n)
        .map(|i| (df[i] - u[i] / n as f64).abs())
        .fold(0.0, f64::max);
    println!("d mean(u) / d f matches u / n to {off:.2e}");
    assert!(off < 1e-9);
    Ok(())
}
