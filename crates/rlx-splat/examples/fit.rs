//! Fit 3D Gaussians to a picture: 256 Gaussians on a grid in front of a camera, optimized by
//! Adam through the splatting ops' gradients (means, scales, rotations, colours, opacities)
//! until their render matches a drawn target (a disc, a square and a stripe). Writes the
//! target, the start and the fit as PNG.
//!
//! `cargo run --release -p rlx-splat --example fit [out-dir] [steps]` (default `target/splat`,
//! 500 steps)

use rlx::prelude::*;
use rlx::train::{mse, Optimizer, Schedule, TrainConfig, Trainer};
use rlx_splat::{covariance, look_at, render, Camera, Gaussians};
use std::io::BufWriter;
use std::path::Path;

const SIZE: usize = 128;
const GRID: usize = 16;

/// The picture to fit: white, a red disc, a blue rotated square and a green stripe.
fn target() -> Vec<f32> {
    let mut img = vec![1.0f32; SIZE * SIZE * 3];
    for y in 0..SIZE {
        for x in 0..SIZE {
            let (u, v) = (
                (x as f32 + 0.5) / SIZE as f32,
                (y as f32 + 0.5) / SIZE as f32,
            );
            let px = &mut img[(y * SIZE + x) * 3..(y * SIZE + x) * 3 + 3];
            if (u - 0.2) + (v - 0.8) * 0.3 > 0.55 && (u - 0.2) + (v - 0.8) * 0.3 < 0.65 {
                px.copy_from_slice(&[0.2, 0.7, 0.3]);
            }
            let (a, b) = (u - 0.68 + v - 0.32, u - 0.68 - (v - 0.32));
            if a.abs() < 0.22 && b.abs() < 0.22 {
                px.copy_from_slice(&[0.15, 0.3, 0.85]);
            }
            if (u - 0.33).powi(2) + (v - 0.36).powi(2) < 0.2f32.powi(2) {
                px.copy_from_slice(&[0.9, 0.2, 0.15]);
            }
        }
    }
    img
}

fn write_png(path: &Path, img: &[f32]) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut enc = png::Encoder::new(BufWriter::new(file), SIZE as u32, SIZE as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let bytes: Vec<u8> = img
        .iter()
        .map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8)
        .collect();
    enc.write_header()?.write_image_data(&bytes)?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = Path::new(args.get(1).map_or("target/splat", |s| s.as_str())).to_path_buf();
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(500);
    std::fs::create_dir_all(&out).map_err(|e| Error::Invalid(format!("{out:?}: {e}")))?;
    let n = GRID * GRID;
    let cam = Camera::with_fov(SIZE, SIZE, 0.8);
    let eye_distance = 4.0f32;
    // From -z looking at the origin, world y up: image x runs along world -x, image y along -y.
    let view = look_at([0.0, 0.0, -eye_distance], [0.0; 3], [0.0, 1.0, 0.0]);
    // The half-width of what the camera sees at the origin's depth.
    let half = eye_distance * (0.4f32).tan();

    let mut g = Graph::new("splat_fit");
    let p = |g: &mut Graph, name: &str, dims: &[usize]| g.param(name, Shape::new(dims, DType::F32));
    let means = p(&mut g, "means", &[n, 3]);
    let log_scales = p(&mut g, "log_scales", &[n, 3]);
    let rotations = p(&mut g, "rotations", &[n, 4]);
    let colour_logits = p(&mut g, "colour_logits", &[n, 3]);
    let opacity_logits = p(&mut g, "opacity_logits", &[n]);
    let v = g.try_constant_f32(&[4, 4], &view)?;
    let scales = g.try_activation(Activation::Exp, log_scales)?;
    let covs = covariance(&mut g, scales, rotations)?;
    let colours = g.try_activation(Activation::Sigmoid, colour_logits)?;
    let opacities = g.try_activation(Activation::Sigmoid, opacity_logits)?;
    let white = g.try_constant_f32(&[3], &[1.0; 3])?;
    let gs = Gaussians {
        means,
        covs,
        colours,
        opacities,
    };
    let img = render(&mut g, &gs, v, &cam, Some(white))?;
    let t = g.input("target", Shape::new(&[SIZE, SIZE, 3], DType::F32));
    let loss = mse(&mut g, img, t)?;
    g.set_outputs(vec![loss, img]);

    // The start: a grid of round grey Gaussians, about a cell wide, half transparent, each a
    // little in front of the next so the depth order is strict.
    let cell = 2.0 * half / GRID as f32;
    let mut start_means = Vec::new();
    for i in 0..n {
        let (gx, gy) = ((i % GRID) as f32 + 0.5, (i / GRID) as f32 + 0.5);
        start_means.extend([half - gx * cell, half - gy * cell, i as f32 * 1e-3]);
    }
    let params: Vec<(&str, Vec<f32>)> = vec![
        ("means", start_means),
        ("log_scales", vec![(cell * 0.5).ln(); n * 3]),
        ("rotations", [1.0, 0.0, 0.0, 0.0].repeat(n)),
        ("colour_logits", vec![0.0; n * 3]),
        ("opacity_logits", vec![0.0; n]),
    ];
    let names: Vec<&str> = params.iter().map(|(n, _)| *n).collect();
    let config = TrainConfig {
        optimizer: Optimizer::adam(),
        schedule: Schedule::Constant { lr: 0.02 },
        clip_norm: None,
    };
    let session = Session::new(Device::Cpu);
    let mut trainer = Trainer::new(&g, &names, config, &session)?;
    for (name, values) in &params {
        trainer.set_param(name, values)?;
    }
    let want = target();
    write_png(&out.join("target.png"), &want).map_err(|e| Error::Invalid(e.to_string()))?;

    // Renders of the current params, by a forward-only graph.
    let mut forward = g.clone();
    forward.set_outputs(vec![img]);
    let mut viewer = session.try_compile(forward)?;
    let mut snapshot = |trainer: &Trainer, file: &str| -> Result<()> {
        for name in &names {
            viewer.set_param(name, &trainer.get_param(name)?);
        }
        let pic = viewer.try_run(&[("target", &want)])?.remove(0);
        write_png(&out.join(file), &pic).map_err(|e| Error::Invalid(e.to_string()))
    };
    snapshot(&trainer, "start.png")?;
    let psnr = |mse: f32| -10.0 * mse.log10();
    let t0 = std::time::Instant::now();
    for step in 0..steps {
        let l = trainer.step(&[("target", &want)])?;
        if step % 50 == 0 || step + 1 == steps {
            println!("step {step:4}  mse {l:.5}  psnr {:.2} dB", psnr(l));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    snapshot(&trainer, "fit.png")?;
    println!(
        "{steps} steps of {n} Gaussians on {SIZE}x{SIZE} in {secs:.1} s ({:.1} ms a step); wrote {}",
        1e3 * secs / steps.max(1) as f64,
        ["target.png", "start.png", "fit.png"]
            .map(|f| out.join(f).display().to_string())
            .join(", ")
    );
    Ok(())
}
