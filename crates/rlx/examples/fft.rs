//! Fourier transforms and complex numbers: find the tones in a noisy signal with `rfft`, then
//! fit a tone's amplitude and phase by gradient descent through `fft` (a complex parameter,
//! with JAX's convention for its gradient).
//!
//! `cargo run --release -p rlx --example fft`

use rlx::autodiff::{grad_with_loss, D_OUTPUT};
use rlx::prelude::*;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn main() -> Result<()> {
    // 1. Two tones (50 and 120 cycles per 1000 samples) plus noise; the power spectrum's two
    //    largest bins are the tones.
    let n = 1000;
    let mut seed = 1u64;
    let signal: Vec<f32> = (0..n)
        .map(|t| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let noise = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5;
            let t = t as f32 / n as f32;
            (2.0 * std::f32::consts::PI * 50.0 * t).sin()
                + 0.5 * (2.0 * std::f32::consts::PI * 120.0 * t).sin()
                + noise
        })
        .collect();
    let mut g = Graph::new("spectrum");
    let x = g.input("x", Shape::new(&[n], DType::F32));
    let spectrum = g.try_rfft(x, 0, None)?;
    let magnitude = g.try_activation(Activation::Abs, spectrum)?;
    g.set_outputs(vec![magnitude]);
    let mut c = Session::new(Device::Cpu).try_compile(g)?;
    let out = c.try_run(&[("x", &signal)])?;
    let mut bins: Vec<(usize, f32)> = out[0].iter().copied().enumerate().collect();
    bins.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("strongest bins of a {n}-point rfft:");
    for (k, m) in &bins[..2] {
        println!("  bin {k:4}: |X| = {m:.1}");
    }
    assert_eq!(
        {
            let mut top = [bins[0].0, bins[1].0];
            top.sort();
            top
        },
        [50, 120]
    );

    // 2. Fit a complex amplitude `a` so that the spectrum of `a · e^{2πi 5t/n}` matches a
    //    target's: loss = sum |fft(a · tone) - target|², gradient descent on `a`.
    let n = 64;
    let tone: Vec<f32> = (0..n)
        .flat_map(|t| {
            let p = 2.0 * std::f32::consts::PI * 5.0 * t as f32 / n as f32;
            [p.cos(), p.sin()]
        })
        .collect();
    let want = (1.5f32, -0.8f32);
    let target: Vec<f32> = tone
        .chunks(2)
        .flat_map(|z| [want.0 * z[0] - want.1 * z[1], want.0 * z[1] + want.1 * z[0]])
        .collect();
    let mut g = Graph::new("fit");
    let a = g.param("a", Shape::new(&[1], DType::C64));
    let tone_c = g.constant_bytes(Shape::new(&[n], DType::C64), f32_bytes(&tone));
    let target_c = g.constant_bytes(Shape::new(&[n], DType::C64), f32_bytes(&target));
    let signal = g.try_mul(a, tone_c)?;
    let got = g.try_fft(signal, 0, None)?;
    let want_f = g.try_fft(target_c, 0, None)?;
    let diff = g.try_sub(got, want_f)?;
    let mag = g.try_activation(Activation::Abs, diff)?;
    let sq = g.try_mul(mag, mag)?;
    let loss = g.try_sum(sq, &[0], false)?;
    g.set_outputs(vec![loss]);
    let grad = grad_with_loss(&g, &[a])?;
    let mut c = Session::new(Device::Cpu).try_compile(grad)?;
    let mut value = [0.0f32, 0.0];
    let one = 1.0f32.to_le_bytes();
    for step in 0..60 {
        c.try_set_param_typed("a", &f32_bytes(&value), DType::C64)?;
        let outs = c.try_run_typed(&[(D_OUTPUT, &one, DType::F32)])?;
        let l = floats(&outs[0].0)[0];
        // JAX's convention: the gradient is dL/dre - i dL/dim, so descend along its conjugate.
        let d = floats(&outs[1].0);
        let lr = 1.0 / (4.0 * (n * n) as f32);
        value[0] -= lr * d[0];
        value[1] += lr * d[1];
        if step % 20 == 0 {
            println!(
                "step {step:2}: loss {l:10.3}, a = {:.4} {:+.4}i",
                value[0], value[1]
            );
        }
    }
    println!(
        "fitted a = {:.4} {:+.4}i (target {} {:+}i)",
        value[0], value[1], want.0, want.1
    );
    assert!((value[0] - want.0).abs() < 1e-3 && (value[1] - want.1).abs() < 1e-3);
    Ok(())
}
