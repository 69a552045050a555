//! Dense linear algebra in a graph: fit a polynomial by least squares through `qr` and
//! `triangular_solve`, check it against `solve` on the normal equations, and differentiate the
//! fit's residual with respect to the data (reverse mode through both factorizations).
//!
//! `cargo run --release -p rlx-linalg --example least_squares`

use rlx::autodiff::{grad_with_loss, D_OUTPUT};
use rlx::prelude::*;
use rlx_linalg::{apply, Linalg, QrOutput};

fn main() -> Result<()> {
    rlx_linalg::register()?;
    // y = 1 - 2t + 0.5t² sampled at 20 points, with a small wiggle.
    let (m, k) = (20, 3);
    let t: Vec<f64> = (0..m)
        .map(|i| i as f64 / (m - 1) as f64 * 4.0 - 2.0)
        .collect();
    let vander: Vec<f64> = t.iter().flat_map(|&t| [1.0, t, t * t]).collect();
    let y: Vec<f64> = t
        .iter()
        .map(|&t| 1.0 - 2.0 * t + 0.5 * t * t + 0.01 * (7.0 * t).sin())
        .collect();

    let mut g = Graph::new("lstsq");
    let a = g.input("a", Shape::new(&[m, k], DType::F64));
    let b = g.input("y", Shape::new(&[m, 1], DType::F64));
    // QR: a = q r, so r x = qᵀ y.
    let q = apply(
        &mut g,
        Linalg::Qr {
            output: QrOutput::Q,
        },
        &[a],
    )?;
    let r = apply(
        &mut g,
        Linalg::Qr {
            output: QrOutput::R,
        },
        &[a],
    )?;
    let qt = g.try_transpose(q, &[1, 0])?;
    let qty = g.try_dot(qt, b)?;
    let x_qr = apply(&mut g, Linalg::TriangularSolve { lower: false }, &[r, qty])?;
    // The normal equations: (aᵀ a) x = aᵀ y.
    let at = g.try_transpose(a, &[1, 0])?;
    let ata = g.try_dot(at, a)?;
    let aty = g.try_dot(at, b)?;
    let x_ne = apply(&mut g, Linalg::Solve, &[ata, aty])?;
    // The squared residual of the QR fit: the loss differentiated below.
    let fit = g.try_dot(a, x_qr)?;
    let res = g.try_sub(fit, b)?;
    let sq = g.try_mul(res, res)?;
    let loss = g.try_sum(sq, &[0, 1], false)?;
    g.set_outputs(vec![loss, x_qr, x_ne]);

    let bytes = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let f64s = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (ab, yb) = (bytes(&vander), bytes(&y));
    let feeds = [
        ("a", ab.as_slice(), DType::F64),
        ("y", yb.as_slice(), DType::F64),
    ];
    let mut c = Session::new(Device::Cpu).try_compile(g.clone())?;
    let outs = c.try_run_typed(&feeds)?;
    let (x_qr, x_ne) = (f64s(&outs[1].0), f64s(&outs[2].0));
    println!("coefficients by qr:               {x_qr:.5?}");
    println!("coefficients by the normal eqns.: {x_ne:.5?}");
    println!("squared residual: {:.3e}", f64s(&outs[0].0)[0]);
    for (p, q) in x_qr.iter().zip(&x_ne) {
        assert!((p - q).abs() < 1e-9);
    }

    // d residual / d y: at the least-squares optimum it is 2 (fit - y), orthogonal to a's columns.
    let wrt = [g.find_leaf("y").expect("input y")];
    let mut c = Session::new(Device::Cpu).try_compile(grad_with_loss(&g, &wrt)?)?;
    let one = 1.0f64.to_le_bytes();
    let mut with_seed = feeds.to_vec();
    with_seed.push((D_OUTPUT, &one, DType::F64));
    let outs = c.try_run_typed(&with_seed)?;
    let dy = f64s(&outs[1].0);
    let dot: Vec<f64> = (0..k)
        .map(|j| (0..m).map(|i| vander[i * k + j] * dy[i]).sum())
        .collect();
    let shown: Vec<String> = dot.iter().map(|v| format!("{v:.1e}")).collect();
    println!(
        "aᵀ · d residual / d y = [{}] (zero at the optimum)",
        shown.join(", ")
    );
    assert!(dot.iter().all(|v| v.abs() < 1e-9));
    Ok(())
}
