//! Complex numbers and the Fourier transforms end to end: functions of f32 and c64 inputs
//! (`golden/complex.json`, from `golden/gen_complex.py`) against JAX's loss, `jax.grad` (JAX's
//! convention for complex inputs) and `jax.jvp`, on the CPU and on the reference evaluator;
//! the CPU's FFT kernels against the evaluator at long, odd and prime lengths and along strided
//! axes; the DFT-matrix decomposition (what a backend without an FFT kernel runs) against the
//! kernels; vmap against a loop; and the errors of bad calls. The GPU backends (wgpu on
//! lavapipe, CUDA programs in host emulation) run the same JAX cases, values, gradients and
//! tangents, and the transforms at odd, prime and long lengths through the decomposition.

mod common;

use common::{decode, encode};
use rlx::autodiff::{grad_with_loss, jvp, tangent_name, vmap, D_OUTPUT};
use rlx::ir::eval::{evaluate, Tensor};
use rlx::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;

const C64: DType = DType::C64;
const F32: DType = DType::F32;

fn golden() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/complex.json"
    ))
    .expect("golden/complex.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["cases"].as_array().expect("cases").clone()
}

/// A tensor of the golden file: shape, dtype and values (c64 as real, imaginary pairs).
fn tensor(v: &Value) -> (Vec<usize>, DType, Vec<f64>) {
    let dims = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let dt = DType::from_name(v["dtype"].as_str().unwrap()).unwrap();
    let data = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    (dims, dt, data)
}

fn all_axes(g: &Graph, x: NodeId) -> Vec<usize> {
    (0..g.shape(x).rank()).collect()
}

/// `sum(x * w)` over every axis.
fn weighted_sum(g: &mut Graph, x: NodeId, w: NodeId) -> NodeId {
    let p = g.mul(x, w);
    let axes = all_axes(g, p);
    g.sum(p, &axes, false)
}

fn total(g: &mut Graph, x: NodeId) -> NodeId {
    let axes = all_axes(g, x);
    g.sum(x, &axes, false)
}

/// The c64 scalar `re + i im`.
fn c64_scalar(g: &mut Graph, re: f32, im: f32) -> NodeId {
    let bytes = [re.to_le_bytes(), im.to_le_bytes()].concat();
    g.constant_bytes(Shape::new(&[], C64), bytes)
}

/// The golden case `name` as a graph of inputs `x0, x1, ...` (the same function as in
/// `gen_complex.py`).
fn build(name: &str, shapes: &[Shape]) -> Graph {
    let mut g = Graph::new(name);
    let x: Vec<NodeId> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| g.input(&format!("x{i}"), s.clone()))
        .collect();
    let abs = |g: &mut Graph, v| g.activation(Activation::Abs, v);
    let loss = match name {
        "fft_power" => {
            let f = g.fft(x[0], 1, None);
            let a = abs(&mut g, f);
            let a2 = g.mul(a, a);
            weighted_sum(&mut g, a2, x[1])
        }
        "rfft_filter" => {
            let r = g.rfft(x[0], 1, None);
            let p = g.mul(r, x[1]);
            let y = g.irfft(p, 1, Some(9));
            weighted_sum(&mut g, y, x[2])
        }
        "ifft_axis0" => {
            let y = g.ifft(x[0], 0, None);
            let (re, im) = (g.real(y), g.imag(y));
            let a = weighted_sum(&mut g, re, x[1]);
            let b = weighted_sum(&mut g, im, x[2]);
            g.add(a, b)
        }
        "arith" => {
            let half = c64_scalar(&mut g, 0.5, 0.0);
            let zh = g.mul(x[0], half);
            let e = g.activation(Activation::Exp, zh);
            let ew = g.mul(e, x[1]);
            let shift = c64_scalar(&mut g, 2.0, 1.0);
            let den = g.add(x[0], shift);
            let q = g.div(ew, den);
            let q = abs(&mut g, q);
            let a = total(&mut g, q);
            let lw = g.activation(Activation::Log, x[1]);
            let lw = g.real(lw);
            let b = total(&mut g, lw);
            let an = g.angle(x[0]);
            let c = total(&mut g, an);
            let ab = g.add(a, b);
            g.add(ab, c)
        }
        "matmul" => {
            let p = g.dot(x[0], x[1]);
            let re = g.real(p);
            let pc = g.conj(p);
            let im = g.imag(pc);
            let a = weighted_sum(&mut g, re, x[2]);
            let b = weighted_sum(&mut g, im, x[3]);
            g.add(a, b)
        }
        "rfft2" => {
            let f = g.rfft2(x[0]);
            let a = abs(&mut g, f);
            weighted_sum(&mut g, a, x[1])
        }
        "irfft2" => {
            let y = g.irfft2(x[0], Some((6, 8)));
            weighted_sum(&mut g, y, x[1])
        }
        "prime" => {
            let f = g.fft(x[0], 0, None);
            let c = g.conj(x[0]);
            let p = g.mul(f, c);
            let a = abs(&mut g, p);
            total(&mut g, a)
        }
        "padded" => {
            let r = g.rfft(x[0], 0, Some(12));
            let y = g.irfft(r, 0, Some(5));
            weighted_sum(&mut g, y, x[1])
        }
        "movement" => {
            let t = g.transpose(x[0], &[2, 0, 1]);
            let m = g.mean(t, &[1], false);
            let s = g.sum(x[0], &[0, 1], false);
            let s = g.reshape(s, &[4, 1]);
            let c = g.concat(&[m, s], 1);
            let a = abs(&mut g, c);
            weighted_sum(&mut g, a, x[1])
        }
        "stft" => {
            let f = g.stft(x[0], 16, 6, Some(x[1]));
            let a = abs(&mut g, f);
            weighted_sum(&mut g, a, x[2])
        }
        "istft" => {
            let y = g.istft(x[0], 16, 6, Some(x[1]));
            weighted_sum(&mut g, y, x[2])
        }
        other => panic!("no function {other}"),
    };
    g.set_outputs(vec![loss]);
    g
}

struct Case {
    name: String,
    inputs: Vec<(Vec<usize>, DType, Vec<f64>)>,
    loss: f64,
    grads: Vec<Vec<f64>>,
    tangents: Vec<Vec<f64>>,
    jvp: f64,
}

fn cases() -> Vec<Case> {
    golden()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            inputs: c["inputs"].as_array().unwrap().iter().map(tensor).collect(),
            loss: c["loss"].as_f64().unwrap(),
            grads: c["grads"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| tensor(t).2)
                .collect(),
            tangents: c["tangents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| tensor(t).2)
                .collect(),
            jvp: c["jvp"].as_f64().unwrap(),
        })
        .collect()
}

impl Case {
    fn graph(&self) -> Graph {
        let shapes: Vec<Shape> = self
            .inputs
            .iter()
            .map(|(d, dt, _)| Shape::new(d, *dt))
            .collect();
        build(&self.name, &shapes)
    }

    fn feeds(&self) -> Vec<(String, Vec<u8>, DType)> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, (_, dt, v))| (format!("x{i}"), encode(v, *dt), *dt))
            .collect()
    }
}

/// Within `tol` of `want`, scaled by the largest magnitude of `want`.
fn close(got: &[f64], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} values, want {}", got.len(), want.len()));
    }
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (g - w).abs() > tol * scale || g.is_nan() {
            return Err(format!("element {i}: got {g}, want {w} (scale {scale})"));
        }
    }
    Ok(())
}

fn run_cpu(g: &Graph, feeds: &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>> {
    run_on(Device::Cpu, g, feeds)
}

/// `g` compiled for `device` and run on `feeds`.
fn run_on(device: Device, g: &Graph, feeds: &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>> {
    let mut c = Session::new(device)
        .try_compile(g.clone())
        .unwrap_or_else(|e| panic!("{} on {device}: {e}", g.name()));
    let f: Vec<(&str, &[u8], DType)> = feeds
        .iter()
        .map(|(n, b, d)| (n.as_str(), b.as_slice(), *d))
        .collect();
    c.try_run_typed(&f)
        .unwrap_or_else(|e| panic!("{} on {device}: {e}", g.name()))
        .iter()
        .map(|(b, d)| decode(b, *d))
        .collect()
}

fn run_reference(g: &Graph, feeds: &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>> {
    let mut leaves = BTreeMap::new();
    for (name, bytes, _) in feeds {
        let s = g.shape(g.find_leaf(name).expect("a leaf")).clone();
        leaves.insert(name.clone(), Tensor::from_bytes(&s, bytes).unwrap());
    }
    evaluate(g, &leaves)
        .unwrap_or_else(|e| panic!("{}: {e}", g.name()))
        .iter()
        .map(|t| decode(&t.to_bytes(), t.dtype()))
        .collect()
}

/// `g` compiled for the wgpu backend (lavapipe in CI) and run on `feeds`.
fn run_gpu(g: &Graph, feeds: &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>> {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    run_on(Device::Gpu, g, feeds)
}

/// `g` lowered for CUDA (the compiler's decompositions for the CUDA backend, then its
/// launches) and run in host emulation.
fn run_cuda_emulated(g: &Graph, feeds: &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>> {
    let l = Session::new(Device::Cuda)
        .try_lower(g.clone())
        .unwrap_or_else(|e| panic!("{} for CUDA: {e}", g.name()));
    let p = rlx_cuda::lower(&l.graph, &[]).unwrap_or_else(|e| panic!("{} for CUDA: {e}", g.name()));
    let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).expect("the kernels compile");
    let inputs: Vec<Vec<u8>> = p
        .inputs
        .iter()
        .map(|s| {
            feeds
                .iter()
                .find(|(n, _, _)| *n == s.name)
                .map(|(_, b, _)| b.clone())
                .unwrap_or_else(|| panic!("no value for {}", s.name))
        })
        .collect();
    emu.run(&p, &inputs, &[])
        .unwrap_or_else(|e| panic!("{} in CUDA emulation: {e}", g.name()))
        .iter()
        .zip(&p.outputs)
        .map(|(b, s)| decode(b, s.shape.dtype()))
        .collect()
}

/// How a test runs a graph on its feeds: a backend, or the reference evaluator.
type Runner = fn(&Graph, &[(String, Vec<u8>, DType)]) -> Vec<Vec<f64>>;

/// Every JAX case through each of `runners`: the loss and `jax.grad` (through the reverse-mode
/// graph), and `jax.jvp` (forward mode).
fn jax_checks(runners: &[(&str, Runner)]) {
    for c in cases() {
        let g = c.graph();
        let wrt: Vec<NodeId> = (0..c.inputs.len())
            .map(|i| g.find_leaf(&format!("x{i}")).unwrap())
            .collect();
        let gg = grad_with_loss(&g, &wrt).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let mut feeds = c.feeds();
        feeds.push((D_OUTPUT.into(), encode(&[1.0], F32), F32));
        let names: Vec<String> = (0..c.inputs.len()).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let jg = jvp(&g, &refs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let mut tfeeds = c.feeds();
        for (i, t) in c.tangents.iter().enumerate() {
            let dt = c.inputs[i].1;
            tfeeds.push((tangent_name(&names[i]), encode(t, dt), dt));
        }
        for (what, run) in runners {
            let outs = run(&gg, &feeds);
            close(&outs[0], &[c.loss], 2e-5).unwrap_or_else(|e| panic!("{} {what}: {e}", c.name));
            for (i, want) in c.grads.iter().enumerate() {
                close(&outs[1 + i], want, 1e-4)
                    .unwrap_or_else(|e| panic!("{} {what} d/dx{i}: {e}", c.name));
            }
            let outs = run(&jg, &tfeeds);
            close(&outs[1], &[c.jvp], 1e-4)
                .unwrap_or_else(|e| panic!("{} {what} jvp: {e}", c.name));
        }
    }
}

/// The JAX cases on the GPU backends, every complex op running as real ops on the parts between
/// the `complex` / `real` / `imag` kernels and the transforms as their DFT-matrix decomposition.
#[test]
fn losses_gradients_and_tangents_match_jax_on_the_gpus() {
    jax_checks(&[("wgpu", run_gpu), ("cuda (emulated)", run_cuda_emulated)]);
}

/// The JAX cases on a CUDA device (`scripts/gpu-check.sh` runs it there).
#[test]
#[ignore = "needs a CUDA device (scripts/gpu-check.sh runs it with --ignored)"]
fn needs_cuda_device_the_jax_cases_run_on_the_device() {
    common::require_cuda("the complex JAX cases on CUDA");
    jax_checks(&[("cuda", |g, feeds| run_on(Device::Cuda, g, feeds))]);
    let (g, feeds) = transform(FftKind::Fft, &[4096], 0, 4096);
    close(
        &run_on(Device::Cuda, &g, &feeds)[0],
        &run_cpu(&g, &feeds)[0],
        transform_tolerance(4096),
    )
    .unwrap_or_else(|e| panic!("cuda fft 4096: {e}"));
}

/// Transforms at long, odd and prime lengths and along inner axes on the GPU backends (the
/// DFT-matrix decomposition) against the CPU's FFT kernels, and an stft → istft round trip.
#[test]
fn transforms_on_the_gpus_match_the_cpu_kernels() {
    use FftKind::{Fft as F, Ifft as I, Irfft as Ir, Rfft as R};
    let cases: [(FftKind, &[usize], usize, usize); 8] = [
        (F, &[2, 1000], 1, 1000),
        (I, &[1009], 0, 1009),
        (F, &[37, 3, 5], 0, 37),
        (F, &[4096], 0, 4096),
        (R, &[2, 2048], 1, 2048),
        (R, &[3, 30, 4], 1, 30),
        (Ir, &[501], 0, 1001),
        (Ir, &[2, 9, 3], 1, 17),
    ];
    for (kind, dims, axis, n) in cases {
        let (g, feeds) = transform(kind, dims, axis, n);
        let cpu = run_cpu(&g, &feeds);
        let tol = transform_tolerance(n);
        close(&run_gpu(&g, &feeds)[0], &cpu[0], tol)
            .unwrap_or_else(|e| panic!("wgpu {kind:?} {dims:?} axis {axis} n {n}: {e}"));
        if n <= 64 {
            close(&run_cuda_emulated(&g, &feeds)[0], &cpu[0], tol)
                .unwrap_or_else(|e| panic!("cuda {kind:?} {dims:?} axis {axis} n {n}: {e}"));
        }
    }
    let (n_fft, hop, len) = (32, 8, 120);
    let mut g = Graph::new("stft");
    let x = g.input("x", Shape::new(&[2, len], F32));
    let s = g.stft(x, n_fft, hop, None);
    let y = g.istft(s, n_fft, hop, None);
    let m = g.activation(Activation::Abs, s);
    g.set_outputs(vec![y, m]);
    let feeds = vec![("x".to_string(), encode(&values(2 * len, 4), F32), F32)];
    let cpu = run_cpu(&g, &feeds);
    for (what, got) in [
        ("wgpu", run_gpu(&g, &feeds)),
        ("cuda (emulated)", run_cuda_emulated(&g, &feeds)),
    ] {
        for (o, w) in got.iter().zip(&cpu) {
            close(o, w, 1e-5).unwrap_or_else(|e| panic!("{what} stft/istft: {e}"));
        }
    }
}

#[test]
fn losses_match_jax_on_the_cpu_and_the_reference_evaluator() {
    for c in cases() {
        let g = c.graph();
        let feeds = c.feeds();
        for (what, got) in [
            ("cpu", run_cpu(&g, &feeds)),
            ("reference", run_reference(&g, &feeds)),
        ] {
            close(&got[0], &[c.loss], 2e-5).unwrap_or_else(|e| panic!("{} {what}: {e}", c.name));
        }
    }
}

#[test]
fn gradients_and_tangents_match_jax_on_the_cpu_and_the_reference_evaluator() {
    jax_checks(&[("cpu", run_cpu), ("reference", run_reference)]);
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    common::uniform(n, seed, -1.0, 1.0)
}

/// One transform of `dims` (the operand's) as a graph, and feeds for it.
fn transform(
    kind: FftKind,
    dims: &[usize],
    axis: usize,
    n: usize,
) -> (Graph, Vec<(String, Vec<u8>, DType)>) {
    let in_dt = if kind == FftKind::Rfft { F32 } else { C64 };
    let mut g = Graph::new("t");
    let x = g.input("x", Shape::new(dims, in_dt));
    let y = g.op(Op::defined(Fft { kind, axis, n }), &[x]);
    g.set_outputs(vec![y]);
    let count: usize = dims.iter().product::<usize>() * if in_dt == C64 { 2 } else { 1 };
    let feeds = vec![(
        "x".to_string(),
        encode(&values(count, n as u64), in_dt),
        in_dt,
    )];
    (g, feeds)
}

/// Rounding grows like log n in an FFT and like sqrt n in a direct sum of n terms.
fn transform_tolerance(n: usize) -> f64 {
    2e-6 * (n as f64).sqrt().max(4.0)
}

/// One transform of `dims` (the operand's) on the CPU against the reference evaluator.
fn kernel_vs_reference(kind: FftKind, dims: &[usize], axis: usize, n: usize) {
    let (g, feeds) = transform(kind, dims, axis, n);
    let cpu = run_cpu(&g, &feeds);
    let reference = run_reference(&g, &feeds);
    close(&cpu[0], &reference[0], transform_tolerance(n))
        .unwrap_or_else(|e| panic!("{kind:?} {dims:?} axis {axis} n {n}: {e}"));
}

#[test]
fn the_cpu_kernels_match_the_reference_at_long_odd_and_prime_lengths() {
    use FftKind::*;
    kernel_vs_reference(Fft, &[2, 1000], 1, 1000);
    kernel_vs_reference(Ifft, &[1009], 0, 1009);
    kernel_vs_reference(Fft, &[4096], 0, 4096);
    kernel_vs_reference(Fft, &[37, 3, 5], 0, 37);
    kernel_vs_reference(Ifft, &[2, 21, 18], 1, 21);
    kernel_vs_reference(Rfft, &[2, 2048], 1, 2048);
    kernel_vs_reference(Rfft, &[1001], 0, 1001);
    kernel_vs_reference(Rfft, &[3, 30, 4], 1, 30);
    kernel_vs_reference(Irfft, &[2, 513], 1, 1024);
    kernel_vs_reference(Irfft, &[501], 0, 1001);
    kernel_vs_reference(Irfft, &[2, 9, 3], 1, 17);
}

/// The DFT-matrix decomposition (what a backend without an FFT kernel runs) against the CPU
/// kernel.
#[test]
fn the_decomposition_matches_the_kernels() {
    for kind in FftKind::ALL {
        for (dims, axis, n) in [
            (vec![1], 0, 1),
            (vec![3, 7], 1, 7),
            (vec![16, 2], 0, 16),
            (vec![2, 33, 3], 1, 33),
        ] {
            let mut dims = dims;
            if kind == FftKind::Irfft {
                dims[axis] = n / 2 + 1;
            }
            let in_dt = if kind == FftKind::Rfft { F32 } else { C64 };
            let op = Op::defined(Fft { kind, axis, n });
            let mut g = Graph::new("kernel");
            let x = g.input("x", Shape::new(&dims, in_dt));
            let y = g.op(op.clone(), &[x]);
            g.set_outputs(vec![y]);
            let mut d = Graph::new("decomposed");
            let x = d.input("x", Shape::new(&dims, in_dt));
            let y = rlx::ir::ops::decompose(&mut d, &op, &[x]).unwrap().unwrap();
            d.set_outputs(vec![y]);
            assert!(
                d.nodes().iter().all(|n| n.op.name() != "fft"),
                "the decomposition holds no fft"
            );
            let count: usize = dims.iter().product::<usize>() * if in_dt == C64 { 2 } else { 1 };
            let feeds = vec![("x".to_string(), encode(&values(count, 7), in_dt), in_dt)];
            close(&run_cpu(&d, &feeds)[0], &run_cpu(&g, &feeds)[0], 1e-5)
                .unwrap_or_else(|e| panic!("{kind:?} {dims:?}: {e}"));
        }
    }
}

/// vmap of a transform (along an axis the batch axis shifts) against a loop over examples.
#[test]
fn vmap_of_a_transform_matches_a_loop() {
    let (b, rows, n) = (3, 4, 6);
    let mut g = Graph::new("f");
    let x = g.input("x", Shape::new(&[rows, n], F32));
    let f = g.rfft(x, 1, None);
    let a = g.activation(Activation::Abs, f);
    let y = g.irfft(f, 1, Some(n));
    g.set_outputs(vec![a, y]);
    let batched = vmap(&g, &["x"], b).unwrap();
    let all = values(b * rows * n, 3);
    let outs = run_cpu(&batched, &[("x".into(), encode(&all, F32), F32)]);
    for e in 0..b {
        let one = &all[e * rows * n..(e + 1) * rows * n];
        let want = run_cpu(&g, &[("x".into(), encode(one, F32), F32)]);
        for (o, w) in outs.iter().zip(&want) {
            let k = w.len();
            close(&o[e * k..(e + 1) * k], w, 1e-6).unwrap();
        }
    }
}

/// numpy's behaviours the builders keep: irfft ignores the imaginary parts of the mean and
/// the Nyquist frequency; fft of a real input is the fft of the complex one; ifft(fft(x)) = x.
#[test]
fn round_trips_and_numpy_conventions() {
    let n = 10;
    let mut g = Graph::new("rt");
    let x = g.input("x", Shape::new(&[n], F32));
    let f = g.fft(x, 0, None);
    let back = g.ifft(f, 0, None);
    let back = g.real(back);
    let r = g.rfft(x, 0, None);
    let r2 = g.irfft(r, 0, None);
    g.set_outputs(vec![back, r2]);
    let v = values(n, 11);
    let outs = run_cpu(&g, &[("x".into(), encode(&v, F32), F32)]);
    close(&outs[0], &v, 1e-6).unwrap();
    close(&outs[1], &v, 1e-6).unwrap();

    // Imaginary parts at DC and Nyquist are ignored.
    let mut g = Graph::new("herm");
    let z = g.input("z", Shape::new(&[6], C64));
    let y = g.irfft(z, 0, None);
    g.set_outputs(vec![y]);
    let spec = values(12, 5);
    let mut cleaned = spec.clone();
    cleaned[1] = 0.0;
    cleaned[11] = 0.0;
    let a = run_cpu(&g, &[("z".into(), encode(&spec, C64), C64)]);
    let b = run_cpu(&g, &[("z".into(), encode(&cleaned, C64), C64)]);
    let r = run_reference(&g, &[("z".into(), encode(&spec, C64), C64)]);
    close(&a[0], &b[0], 0.0).unwrap();
    close(&a[0], &r[0], 1e-6).unwrap();
}

/// istft(stft(x)) gives x back wherever the frames cover it, with a Hann window at a quarter
/// hop and with the rectangular one.
#[test]
fn istft_inverts_stft() {
    let (n_fft, hop, len) = (32, 8, 200);
    for hann in [true, false] {
        let mut g = Graph::new("stft");
        let x = g.input("x", Shape::new(&[2, len], F32));
        let window = hann.then(|| {
            let w: Vec<u8> = (0..n_fft)
                .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / n_fft as f32).cos())
                .flat_map(f32::to_le_bytes)
                .collect();
            g.constant_bytes(Shape::new(&[n_fft], F32), w)
        });
        let s = g.stft(x, n_fft, hop, window);
        let y = g.istft(s, n_fft, hop, window);
        g.set_outputs(vec![y]);
        let frames = 1 + (len - n_fft) / hop;
        let covered = (frames - 1) * hop + n_fft;
        assert_eq!(g.shape(y).dims().len(), 2);
        let v = values(2 * len, 21);
        let out = run_cpu(&g, &[("x".into(), encode(&v, F32), F32)]);
        for row in 0..2 {
            // The Hann window is 0 at its first sample: sample 0 is covered by nothing.
            let from = if hann { 1 } else { 0 };
            let got = &out[0][row * covered + from..(row + 1) * covered];
            let want = &v[row * len + from..row * len + covered];
            close(got, want, 1e-5).unwrap_or_else(|e| panic!("hann {hann}: {e}"));
        }
    }
}

/// `angle` against `atan2` in every quadrant, on both axes and at 0 (numpy's `angle`; a sum of
/// angles, as in the JAX cases, can hide a quadrant error when errors of ±2π cancel).
#[test]
fn angle_is_atan2_in_every_quadrant() {
    let points: Vec<(f64, f64)> = [-2.0, -0.5, 0.0, 0.5, 2.0]
        .iter()
        .flat_map(|&x| [-1.5, -0.25, 0.0, 0.25, 1.5].map(|y| (x, y)))
        .collect();
    let mut g = Graph::new("angle");
    let z = g.input("z", Shape::new(&[points.len()], C64));
    let a = g.angle(z);
    g.set_outputs(vec![a]);
    let flat: Vec<f64> = points.iter().flat_map(|&(x, y)| [x, y]).collect();
    let feeds = [("z".to_string(), encode(&flat, C64), C64)];
    let want: Vec<f64> = points.iter().map(|&(x, y)| f64::atan2(y, x)).collect();
    for got in [run_cpu(&g, &feeds), run_reference(&g, &feeds)] {
        close(&got[0], &want, 1e-6).unwrap();
    }
}

#[test]
fn bad_calls_are_named_errors() {
    let mut g = Graph::new("bad");
    let z = g.input("z", Shape::new(&[4, 5], C64));
    let x = g.input("x", Shape::new(&[4, 5], F32));
    let d = g.input("d", Shape::new(&[4, 5], DType::F64));
    let msg = |r: Result<NodeId>| r.unwrap_err().to_string();
    assert!(msg(g.try_rfft(z, 1, None)).contains("rfft"));
    let e = msg(g.try_op(
        Op::defined(Fft {
            kind: FftKind::Fft,
            axis: 1,
            n: 8,
        }),
        &[z],
    ));
    assert!(
        e.contains("fft") && e.contains("8") && e.contains("c64[4, 5]"),
        "{e}"
    );
    assert!(msg(g.try_fft(z, 2, None)).contains("axis 2"));
    assert!(msg(g.try_complex(d, d)).contains("f32"));
    // No c128: a 64-bit operand is refused, never narrowed to f32 silently.
    for e in [
        msg(g.try_fft(d, 1, None)),
        msg(g.try_rfft(d, 1, None)),
        msg(g.try_stft(d, 4, 1, None)),
    ] {
        assert!(e.contains("64-bit") && e.contains("f64[4, 5]"), "{e}");
    }
    assert!(msg(g.try_real(x)).contains("c64"));
    assert!(msg(g.try_maximum(z, z)).contains("complex"));
    assert!(msg(g.try_compare(CmpOp::Lt, z, z)).contains("order"));
    assert!(msg(g.try_activation(Activation::Tanh, z)).contains("complex"));
    assert!(msg(g.try_irfft(z, 1, Some(0))).contains("positive"));
    assert!(msg(g.try_stft(x, 8, 2, None)).contains("n_fft = 8"));
    assert!(msg(g.try_stft(x, 4, 0, None)).contains("hop"));
    assert!(msg(g.try_istft(z, 16, 4, None)).contains("frequencies"));
    assert!(msg(g.try_stft(x, 4, 1, Some(z))).contains("window"));
    // A transform too long for the DFT-matrix decomposition says so.
    let mut big = Graph::new("big");
    let v = big.input("v", Shape::new(&[8192], C64));
    let op = Op::defined(Fft {
        kind: FftKind::Fft,
        axis: 0,
        n: 8192,
    });
    let e = rlx::ir::ops::decompose(&mut big, &op, &[v])
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("8192") && e.contains("no decomposition"), "{e}");
    // An op with no complex form is refused by name when it meets complex values.
    let mut s = Graph::new("softmax");
    let w = s.input("w", Shape::new(&[3], C64));
    assert!(s.try_softmax(w, 0).is_err());
}
