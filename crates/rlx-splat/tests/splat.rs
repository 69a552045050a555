//! rlx-splat against Gaussian splatting written in JAX (`tests/golden/splat.json`, from
//! `gen_splat.py`): the projection, the depth order and the image on the reference evaluator,
//! the CPU's tile rasterizer, the CPU running the decompositions and the GPU (decompositions,
//! f32); the gradients with respect to means, covariances, colours, opacities, background and
//! the view matrix; vmap over cameras against a loop; a scene fitted to a target image; the
//! text form; bad shapes as named errors.

use rlx::autodiff::{grad, hvp, jvp, tangent_name};
use rlx::ir::eval::Tensor;
use rlx::ir::ops::OpDef;
use rlx::prelude::*;
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use rlx_splat::{Camera, Gaussians, Rasterize, RasterizeVjp};
use serde_json::Value;
use std::collections::BTreeMap;

fn cases() -> Vec<Value> {
    let at = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/splat.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(at).expect("golden file")).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn f64s(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// `got` within `atol + rtol · max|want|` of `want`, everywhere.
fn close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * scale,
            "{what}[{k}]: {g} vs {w} (rtol {rtol} of {scale})"
        );
    }
}

fn as_f64(bytes: &[u8], dt: DType) -> Vec<f64> {
    Tensor::from_bytes(&Shape::new(&[bytes.len() / dt.size_bytes()], dt), bytes)
        .unwrap()
        .f64s()
}

fn camera(c: &Value) -> Camera {
    let k: Vec<f32> = c["intrinsics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    Camera {
        width: c["width"].as_u64().unwrap() as usize,
        height: c["height"].as_u64().unwrap() as usize,
        fx: k[0],
        fy: k[1],
        cx: k[2],
        cy: k[3],
    }
}

/// The leaves of a case (params of its dtype), by name.
const LEAVES: [&str; 6] = [
    "means",
    "covs",
    "colours",
    "opacities",
    "view",
    "background",
];

fn has(c: &Value, name: &str) -> bool {
    c.get(name).is_some()
}

/// The case's render on params of `dt`; outputs `[sum(image * W), image, projected, order]`.
fn render_graph(c: &Value, dt: DType) -> Graph {
    let mut g = Graph::new(c["name"].as_str().unwrap());
    let mut p = BTreeMap::new();
    for name in LEAVES.iter().filter(|n| has(c, n)) {
        p.insert(*name, g.param(name, Shape::new(&dims(&c[*name]), dt)));
    }
    let cam = camera(c);
    let gs = Gaussians {
        means: p["means"],
        covs: p["covs"],
        colours: p["colours"],
        opacities: p["opacities"],
    };
    let proj = rlx_splat::project(&mut g, gs.means, gs.covs, p["view"], &cam).unwrap();
    let order = rlx_splat::sort_by_depth(&mut g, proj).unwrap();
    let image =
        rlx_splat::render(&mut g, &gs, p["view"], &cam, p.get("background").copied()).unwrap();
    let w = &c["cotangent"];
    let wt = Tensor::from_f64(&dims(w), dt, f64s(w));
    let w = g
        .try_constant_bytes(Shape::new(&dims(w), dt), wt.to_bytes())
        .unwrap();
    let prod = g.mul(image, w);
    let loss = g.try_sum(prod, &[0, 1, 2], false).unwrap();
    g.set_outputs(vec![loss, image, proj, order]);
    g
}

fn set_all(cg: &mut CompiledGraph, c: &Value, dt: DType) {
    for name in LEAVES.iter().filter(|n| has(c, n)) {
        let t = Tensor::from_f64(&dims(&c[*name]), dt, f64s(&c[*name]));
        cg.set_param_typed(name, &t.to_bytes(), dt);
    }
}

#[test]
fn renders_and_their_gradients_match_jax() {
    rlx_splat::register().unwrap();
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let image = f64s(&c["image"]);
        let proj = f64s(&c["projected"]);
        let order: Vec<f64> = c["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let g = render_graph(&c, DType::F64);

        // The reference evaluator.
        let leaves: BTreeMap<String, Tensor> = LEAVES
            .iter()
            .filter(|n| has(&c, n))
            .map(|n| {
                (
                    n.to_string(),
                    Tensor::from_f64(&dims(&c[*n]), DType::F64, f64s(&c[*n])),
                )
            })
            .collect();
        let r = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
        close(
            &format!("{name}: image (reference)"),
            &r[1].f64s(),
            &image,
            1e-12,
        );
        close(
            &format!("{name}: projected (reference)"),
            &r[2].f64s(),
            &proj,
            1e-12,
        );
        assert_eq!(r[3].f64s(), order, "{name}: order (reference)");

        // The CPU: its tile rasterizer, the other ops by their decompositions.
        let mut cpu = Session::new(Device::Cpu).compile(g.clone());
        assert!(
            cpu.dispatch_report()
                .nodes
                .iter()
                .any(|n| n.op == "splat_rasterize"),
            "{name}: the CPU runs its own rasterizer"
        );
        set_all(&mut cpu, &c, DType::F64);
        let out = cpu.run_typed(&[]);
        close(
            &format!("{name}: image (CPU)"),
            &as_f64(&out[1].0, DType::F64),
            &image,
            1e-12,
        );
        close(
            &format!("{name}: projected (CPU)"),
            &as_f64(&out[2].0, DType::F64),
            &proj,
            1e-12,
        );
        assert_eq!(as_f64(&out[3].0, DType::I32), order, "{name}: order (CPU)");

        // Reverse mode against JAX: the CPU's backward kernel in f64, the GPU's decomposition
        // in f32.
        let leaf_names: Vec<&str> = LEAVES.iter().copied().filter(|n| has(&c, n)).collect();
        let gradients_match = |device: Device, dt: DType, rtol: f64| {
            let g = render_graph(&c, dt);
            let ids: Vec<NodeId> = leaf_names.iter().map(|n| g.find_leaf(n).unwrap()).collect();
            let mut cg = Session::new(device).compile(grad(&g, &ids).unwrap());
            if device == Device::Cpu {
                assert!(
                    cg.dispatch_report()
                        .nodes
                        .iter()
                        .any(|n| n.op == "splat_rasterize_vjp"),
                    "{name}: the CPU runs its own backward rasterizer"
                );
            }
            set_all(&mut cg, &c, dt);
            let outs = cg.run_typed(&[]);
            for (k, leaf) in leaf_names.iter().enumerate() {
                close(
                    &format!("{name}: d / d {leaf} ({device:?}, {dt})"),
                    &as_f64(&outs[k].0, dt),
                    &f64s(&c[format!("grad_{leaf}").as_str()]),
                    rtol,
                );
            }
        };
        gradients_match(Device::Cpu, DType::F64, 1e-9);

        // f32 on the GPU (Mesa's software Vulkan in the suite): the rasterizer's WGSL kernel,
        // the other ops' decompositions.
        let mut gpu = Session::new(Device::Gpu).compile(render_graph(&c, DType::F32));
        assert!(
            !gpu.dispatch_report()
                .decomposed
                .contains_key("decompose:splat_rasterize"),
            "{name}: the rasterizer runs natively on the GPU"
        );
        set_all(&mut gpu, &c, DType::F32);
        let out = gpu.run_typed(&[]);
        close(
            &format!("{name}: image (GPU, f32)"),
            &as_f64(&out[1].0, DType::F32),
            &image,
            2e-5,
        );
        assert_eq!(as_f64(&out[3].0, DType::I32), order, "{name}: order (GPU)");
        // CUDA in host emulation: the rasterizer's CUDA kernel (and NVRTC compiles it).
        let l = Session::new(Device::Cuda)
            .try_lower(render_graph(&c, DType::F32))
            .unwrap();
        let p = rlx_cuda::lower(&l.graph, &[]).unwrap();
        assert!(
            p.launches.iter().any(|l| l.op == "splat_rasterize"),
            "{name}: one launch of the rasterizer's kernel"
        );
        rlx_cuda::compile_check_for_tests(&p, name).unwrap();
        let params: Vec<Vec<u8>> = p
            .params
            .iter()
            .map(|slot| {
                Tensor::from_f64(&dims(&c[&slot.name]), DType::F32, f64s(&c[&slot.name])).to_bytes()
            })
            .collect();
        let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).unwrap();
        let out = emu.run(&p, &[], &params).unwrap();
        close(
            &format!("{name}: image (CUDA, emulated, f32)"),
            &as_f64(&out[1], DType::F32),
            &image,
            2e-5,
        );
        // The gradients on the GPU: the backward rasterizer's decomposition, in f32.
        gradients_match(Device::Gpu, DType::F32, 2e-4);
    }
}

/// The rasterizer's decomposition (every pixel against every Gaussian) compiled for the CPU,
/// against its tile kernel, in f64 and f32, on the golden scenes in depth order.
#[test]
fn the_decomposition_and_the_tile_kernel_agree() {
    rlx_splat::register().unwrap();
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let order: Vec<usize> = c["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let n = order.len();
        let proj = f64s(&c["projected"]);
        let opac = f64s(&c["opacities"]);
        let cols = f64s(&c["colours"]);
        let ch = cols.len() / n;
        let rows = |v: &[f64], w: usize| -> Vec<f64> {
            order
                .iter()
                .flat_map(|&i| v[i * w..i * w + w].to_vec())
                .collect()
        };
        let (proj, opac, cols) = (rows(&proj, 6), rows(&opac, 1), rows(&cols, ch));
        let cam = camera(&c);
        let r = Rasterize {
            height: cam.height,
            width: cam.width,
        };
        for dt in [DType::F64, DType::F32] {
            let mut results = Vec::new();
            for decomposed in [false, true] {
                let mut g = Graph::new("raster");
                let p = g.input("p", Shape::new(&[n, 6], dt));
                let col = g.input("c", Shape::new(&[n, ch], dt));
                let o = g.input("o", Shape::new(&[n], dt));
                let img = if decomposed {
                    r.decompose(&mut g, &[p, col, o]).unwrap().unwrap()
                } else {
                    rlx_splat::rasterize(&mut g, p, col, o, None, &cam).unwrap()
                };
                g.set_outputs(vec![img]);
                let mut cg = Session::new(Device::Cpu).compile(g);
                let b = |v: &[f64], d: &[usize]| Tensor::from_f64(d, dt, v.to_vec()).to_bytes();
                let out = cg.run_typed(&[
                    ("p", &b(&proj, &[n, 6]), dt),
                    ("c", &b(&cols, &[n, ch]), dt),
                    ("o", &b(&opac, &[n]), dt),
                ]);
                results.push(as_f64(&out[0].0, dt));
            }
            let tol = if dt == DType::F64 { 1e-12 } else { 2e-5 };
            close(
                &format!("{name} {dt}: decomposition vs tiles"),
                &results[1],
                &results[0],
                tol,
            );
        }
        // The backward rasterizer (with a background): reference evaluator, decomposition on
        // the CPU and tile kernel, for the golden cotangent.
        let ct = f64s(&c["cotangent"]);
        let bg: Vec<f64> = (0..ch).map(|k| 0.3 + 0.2 * k as f64).collect();
        let vjp = RasterizeVjp {
            height: cam.height,
            width: cam.width,
        };
        let mut g = Graph::new("raster_vjp");
        let shapes = [
            ("p", vec![n, 6]),
            ("c", vec![n, ch]),
            ("o", vec![n]),
            ("bg", vec![ch]),
            ("ct", vec![cam.height, cam.width, ch]),
        ];
        let ins: Vec<NodeId> = shapes
            .iter()
            .map(|(k, d)| g.input(k, Shape::new(d, DType::F64)))
            .collect();
        let native = g.define(vjp, &ins).unwrap();
        let dense = vjp.decompose(&mut g, &ins).unwrap().unwrap();
        g.set_outputs(vec![native, dense]);
        let values = [&proj, &cols, &opac, &bg, &ct];
        let leaves: BTreeMap<String, Tensor> = shapes
            .iter()
            .zip(values)
            .map(|((k, d), v)| (k.to_string(), Tensor::from_f64(d, DType::F64, v.to_vec())))
            .collect();
        let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
        let mut cg = Session::new(Device::Cpu).compile(g);
        let bytes: Vec<(String, Vec<u8>)> = leaves
            .iter()
            .map(|(k, t)| (k.clone(), t.to_bytes()))
            .collect();
        let run: Vec<(&str, &[u8], DType)> = bytes
            .iter()
            .map(|(k, b)| (k.as_str(), b.as_slice(), DType::F64))
            .collect();
        let out = cg.run_typed(&run);
        close(
            &format!("{name}: vjp tiles vs reference"),
            &as_f64(&out[0].0, DType::F64),
            &want,
            1e-12,
        );
        close(
            &format!("{name}: vjp decomposition vs reference"),
            &as_f64(&out[1].0, DType::F64),
            &want,
            1e-12,
        );
        assert!(
            want.iter().any(|v| v.abs() > 1e-3),
            "{name}: a cotangent that is not zero"
        );
    }
}

/// Many Gaussians (most small, some large, some off-screen) over an image of many tiles, the
/// pool splitting the tiles, against the reference evaluator.
#[test]
fn the_tile_kernel_matches_the_reference_at_size() {
    rlx_splat::register().unwrap();
    let (n, h, w, ch) = (600, 150, 203, 3);
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut proj = Vec::new();
    let (mut cols, mut opac) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (u, v) = (rnd() * 260.0 - 30.0, rnd() * 200.0 - 25.0);
        // Standard deviations 0.5..4 px, a few 30 px; a random orientation.
        let big = if i % 50 == 0 { 30.0 } else { 1.0 };
        let (sa, sb) = (big * (0.5 + 3.5 * rnd()), big * (0.5 + 3.5 * rnd()));
        let th = rnd() * std::f64::consts::PI;
        let (co, si) = (th.cos(), th.sin());
        let (s00, s01, s11) = (
            co * co * sa * sa + si * si * sb * sb,
            co * si * (sa * sa - sb * sb),
            si * si * sa * sa + co * co * sb * sb,
        );
        let det = s00 * s11 - s01 * s01;
        let depth = if i % 37 == 0 { 0.1 } else { 1.0 + i as f64 };
        proj.extend([u, v, s11 / det, -s01 / det, s00 / det, depth]);
        opac.push(if i % 3 == 0 { 1.0 } else { rnd() });
        for _ in 0..ch {
            cols.push(rnd());
        }
    }
    let mut g = Graph::new("raster");
    let p = g.input("p", Shape::new(&[n, 6], DType::F32));
    let c = g.input("c", Shape::new(&[n, ch], DType::F32));
    let o = g.input("o", Shape::new(&[n], DType::F32));
    let bg = g.input("bg", Shape::new(&[ch], DType::F32));
    let cam = Camera {
        width: w,
        height: h,
        fx: 1.0,
        fy: 1.0,
        cx: 0.0,
        cy: 0.0,
    };
    let img = rlx_splat::rasterize(&mut g, p, c, o, Some(bg), &cam).unwrap();
    g.set_outputs(vec![img]);
    // The inputs as f32, for both.
    let f32s = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| *x as f32 as f64).collect() };
    let (proj, cols, opac) = (f32s(&proj), f32s(&cols), f32s(&opac));
    let bgv = vec![0.25, 0.5, 0.75];
    let t = |v: &[f64], d: &[usize]| Tensor::from_f64(d, DType::F32, v.to_vec());
    let leaves: BTreeMap<String, Tensor> = [
        ("p", t(&proj, &[n, 6])),
        ("c", t(&cols, &[n, ch])),
        ("o", t(&opac, &[n])),
        ("bg", t(&bgv, &[ch])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
    let mut cg = Session::new(Device::Cpu).with_threads(2).compile(g);
    let out = cg.run_typed(&[
        ("p", &leaves["p"].to_bytes(), DType::F32),
        ("c", &leaves["c"].to_bytes(), DType::F32),
        ("o", &leaves["o"].to_bytes(), DType::F32),
        ("bg", &leaves["bg"].to_bytes(), DType::F32),
    ]);
    close("tiles at size", &as_f64(&out[0].0, DType::F32), &want, 1e-6);
    // The backward kernel at size, a cotangent of ±1s: against the reference evaluator, and
    // the same bytes on a second run (the threads' sums are added in a fixed order).
    let mut gb = Graph::new("raster_vjp");
    let ins: Vec<NodeId> = [
        ("p", vec![n, 6]),
        ("c", vec![n, ch]),
        ("o", vec![n]),
        ("bg", vec![ch]),
        ("ct", vec![h, w, ch]),
    ]
    .iter()
    .map(|(k, d)| gb.input(k, Shape::new(d, DType::F32)))
    .collect();
    let vjp = gb
        .define(
            RasterizeVjp {
                height: h,
                width: w,
            },
            &ins,
        )
        .unwrap();
    gb.set_outputs(vec![vjp]);
    let ctv: Vec<f64> = (0..h * w * ch)
        .map(|k| if k % 7 < 3 { 1.0 } else { -1.0 })
        .collect();
    let mut leaves = leaves;
    leaves.insert("ct".into(), t(&ctv, &[h, w, ch]));
    let want = rlx::ir::eval::evaluate(&gb, &leaves).unwrap()[0].f64s();
    let mut cg = Session::new(Device::Cpu).with_threads(2).compile(gb);
    let bytes: Vec<(String, Vec<u8>)> = leaves
        .iter()
        .map(|(k, t)| (k.clone(), t.to_bytes()))
        .collect();
    let run: Vec<(&str, &[u8], DType)> = bytes
        .iter()
        .map(|(k, b)| (k.as_str(), b.as_slice(), DType::F32))
        .collect();
    let first = cg.run_typed(&run)[0].0.clone();
    close(
        "vjp tiles at size",
        &as_f64(&first, DType::F32),
        &want,
        1e-5,
    );
    assert_eq!(
        cg.run_typed(&run)[0].0,
        first,
        "the backward kernel is deterministic"
    );
    // The scene is not trivially empty or flat.
    let lit = (0..want.len())
        .filter(|&k| (want[k] - bgv[k % ch]).abs() > 0.05)
        .count();
    assert!(lit > want.len() / 3, "{lit} of {} values drawn", want.len());
}

/// vmap over the view matrix (a batch of cameras) goes through every decomposition and agrees
/// with rendering each camera alone.
#[test]
fn vmap_over_cameras_matches_a_loop() {
    rlx_splat::register().unwrap();
    let c = &cases()[1];
    let cam = camera(c);
    let mut one = Graph::new("one");
    let leaf = |g: &mut Graph, name: &str| g.input(name, Shape::new(&dims(&c[name]), DType::F64));
    let gs = Gaussians {
        means: leaf(&mut one, "means"),
        covs: leaf(&mut one, "covs"),
        colours: leaf(&mut one, "colours"),
        opacities: leaf(&mut one, "opacities"),
    };
    let view = leaf(&mut one, "view");
    let img = rlx_splat::render(&mut one, &gs, view, &cam, None).unwrap();
    one.set_outputs(vec![img]);
    // Three views: the case's, and two turned about the camera's y axis.
    let base = f64s(&c["view"]);
    let mut views = Vec::new();
    for angle in [0.0f64, 0.05, -0.08] {
        let (co, si) = (angle.cos(), angle.sin());
        let turn = [[co, 0.0, si], [0.0, 1.0, 0.0], [-si, 0.0, co]];
        let mut v = base.clone();
        for r in 0..3 {
            for k in 0..4 {
                v[r * 4 + k] = (0..3).map(|j| turn[r][j] * base[j * 4 + k]).sum();
            }
        }
        views.push(v);
    }
    let b = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let fixed: Vec<(&str, Vec<u8>)> = ["means", "covs", "colours", "opacities"]
        .iter()
        .map(|n| (*n, b(&f64s(&c[*n]))))
        .collect();
    let mut single = Session::new(Device::Cpu).compile(one.clone());
    let mut want = Vec::new();
    for v in &views {
        let mut ins: Vec<(&str, &[u8], DType)> = fixed
            .iter()
            .map(|(n, x)| (*n, x.as_slice(), DType::F64))
            .collect();
        let vb = b(v);
        ins.push(("view", &vb, DType::F64));
        want.extend(as_f64(&single.run_typed(&ins)[0].0, DType::F64));
    }
    let batched = rlx::autodiff::vmap(&one, &["view"], views.len()).unwrap();
    let mut cg = Session::new(Device::Cpu).compile(batched);
    let all: Vec<f64> = views.concat();
    let vb = b(&all);
    let mut ins: Vec<(&str, &[u8], DType)> = fixed
        .iter()
        .map(|(n, x)| (*n, x.as_slice(), DType::F64))
        .collect();
    ins.push(("view", &vb, DType::F64));
    let got = as_f64(&cg.run_typed(&ins)[0].0, DType::F64);
    close("vmap(render) over views", &got, &want, 1e-12);
    // The turns moved the picture.
    let px = want.len() / 3;
    assert!(want[..px] != want[px..2 * px]);
}

/// A target image rendered from one scene; a second scene (means moved, colours, scales and
/// opacities reset) fitted to it by Adam through the decompositions' gradients.
#[test]
fn a_scene_fits_a_target_image() {
    rlx_splat::register().unwrap();
    let (n, h, w) = (12, 32, 32);
    let cam = Camera::with_fov(w, h, 0.9);
    let view = rlx_splat::look_at([0.0, 0.0, -4.0], [0.0, 0.0, 0.0], [0.0, -1.0, 0.0]);
    // The scene as params: means, log-scales, quaternions, colour and opacity logits.
    let scene = |name: &str| {
        let mut g = Graph::new(name);
        let means = g.param("means", Shape::new(&[n, 3], DType::F32));
        let log_scales = g.param("log_scales", Shape::new(&[n, 3], DType::F32));
        let rotations = g.param("rotations", Shape::new(&[n, 4], DType::F32));
        let colour_logits = g.param("colour_logits", Shape::new(&[n, 3], DType::F32));
        let opacity_logits = g.param("opacity_logits", Shape::new(&[n], DType::F32));
        let v = g.try_constant_f32(&[4, 4], &view).unwrap();
        let scales = g.try_activation(Activation::Exp, log_scales).unwrap();
        let covs = rlx_splat::covariance(&mut g, scales, rotations).unwrap();
        let colours = g
            .try_activation(Activation::Sigmoid, colour_logits)
            .unwrap();
        let opacities = g
            .try_activation(Activation::Sigmoid, opacity_logits)
            .unwrap();
        let bg = g.try_constant_f32(&[3], &[1.0, 1.0, 1.0]).unwrap();
        let gs = Gaussians {
            means,
            covs,
            colours,
            opacities,
        };
        let img = rlx_splat::render(&mut g, &gs, v, &cam, Some(bg)).unwrap();
        (g, img)
    };
    let mut s = 7u64;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut truth: Vec<(&str, Vec<f32>)> = vec![
        ("means", (0..n * 3).map(|_| rnd() * 2.4 - 1.2).collect()),
        (
            "log_scales",
            (0..n * 3).map(|_| rnd() * 1.2 - 2.0).collect(),
        ),
        ("rotations", (0..n * 4).map(|_| rnd() * 2.0 - 1.0).collect()),
        (
            "colour_logits",
            (0..n * 3).map(|_| rnd() * 6.0 - 3.0).collect(),
        ),
        (
            "opacity_logits",
            (0..n).map(|_| rnd() * 2.0 + 1.0).collect(),
        ),
    ];
    let (tg, timg) = scene("target");
    let mut tg = tg;
    tg.set_outputs(vec![timg]);
    let mut target = Session::new(Device::Cpu).compile(tg);
    for (name, v) in &truth {
        target.set_param(name, v);
    }
    let want = target.run(&[]).remove(0);
    // The start: means moved by up to 0.3, grey, round, half transparent.
    for v in truth[0].1.iter_mut() {
        *v += rnd() * 0.6 - 0.3;
    }
    truth[1].1.fill(-1.6);
    truth[3].1.fill(0.0);
    truth[4].1.fill(0.0);
    let (mut g, img) = scene("fit");
    let t = g.input("target", Shape::new(&[h, w, 3], DType::F32));
    let loss = rlx::train::mse(&mut g, img, t).unwrap();
    g.set_outputs(vec![loss, img]);
    let names: Vec<&str> = truth.iter().map(|(n, _)| *n).collect();
    let config = TrainConfig {
        optimizer: Optimizer::adam(),
        schedule: Schedule::Constant { lr: 0.03 },
        clip_norm: None,
    };
    let mut trainer = Trainer::new(&g, &names, config, &Session::new(Device::Cpu)).unwrap();
    for (name, v) in &truth {
        trainer.set_param(name, v).unwrap();
    }
    let first = trainer.step(&[("target", &want)]).unwrap();
    let mut last = first;
    for _ in 0..150 {
        last = trainer.step(&[("target", &want)]).unwrap();
    }
    assert!(
        last < first / 10.0,
        "loss {first} -> {last}: the fit did not converge"
    );
}

#[test]
fn the_text_form_keeps_the_ops() {
    rlx_splat::register().unwrap();
    let c = &cases()[0];
    let g = render_graph(c, DType::F32);
    let text = g.to_text();
    for op in ["splat_project", "splat_sort", "splat_rasterize"] {
        assert!(text.contains(op), "{op} in {text}");
    }
    assert_eq!(Graph::parse(&text).unwrap().to_text(), text);
}

#[test]
fn bad_shapes_are_named_errors() {
    rlx_splat::register().unwrap();
    let cam = Camera::with_fov(8, 8, 1.0);
    let mut g = Graph::new("bad");
    let means = g.input("means", Shape::new(&[5, 3], DType::F32));
    let covs = g.input("covs", Shape::new(&[5, 2, 2], DType::F32));
    let view = g.input("view", Shape::new(&[4, 4], DType::F32));
    let e = rlx_splat::project(&mut g, means, covs, view, &cam)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("splat_project") && e.contains("covs") && e.contains("[5, 3, 3]"),
        "{e}"
    );
    let half = g.input("h", Shape::new(&[5, 6], DType::F16));
    let col = g.input("c", Shape::new(&[5, 3], DType::F16));
    let op = g.input("o", Shape::new(&[5], DType::F16));
    let e = rlx_splat::rasterize(&mut g, half, col, op, None, &cam)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("splat_rasterize") && e.contains("f32 or f64"),
        "{e}"
    );
    let p = g.input("p", Shape::new(&[5, 6], DType::F32));
    let col = g.input("c3", Shape::new(&[4, 3], DType::F32));
    let op = g.input("o3", Shape::new(&[5], DType::F32));
    let e = rlx_splat::rasterize(&mut g, p, col, op, None, &cam)
        .unwrap_err()
        .to_string();
    assert!(e.contains("colours") && e.contains("[5, C]"), "{e}");
    let e = rlx_splat::sort_by_depth(&mut g, means)
        .unwrap_err()
        .to_string();
    assert!(e.contains("splat_sort") && e.contains("[N, 6]"), "{e}");
}

/// Forward mode (through the decompositions) against reverse mode (the native backward):
/// `J v = ⟨∇L, v⟩` for a random direction over every leaf; and Hessian-vector products
/// (forward over reverse: the backward rasterizer's decomposition differentiated) against
/// central differences of the gradient.
#[test]
fn forward_mode_and_second_order_agree_with_reverse_mode() {
    rlx_splat::register().unwrap();
    let c = &cases()[0];
    let g = render_graph(c, DType::F64);
    let leaves: Vec<&str> = LEAVES.iter().copied().filter(|n| has(c, n)).collect();
    let mut s = 99u64;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let dirs: Vec<Vec<f64>> = leaves
        .iter()
        .map(|n| (0..f64s(&c[*n]).len()).map(|_| rnd()).collect())
        .collect();
    let b = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let ids: Vec<NodeId> = leaves.iter().map(|n| g.find_leaf(n).unwrap()).collect();
    let mut rev = Session::new(Device::Cpu).compile(grad(&g, &ids).unwrap());
    // The gradient at the case's values, each leaf moved by `eps` along its direction.
    let mut grads_at = |eps: f64| -> Vec<Vec<f64>> {
        for (n, d) in leaves.iter().zip(&dirs) {
            let v: Vec<f64> = f64s(&c[*n])
                .iter()
                .zip(d)
                .map(|(x, d)| x + eps * d)
                .collect();
            rev.set_param_typed(n, &b(&v), DType::F64);
        }
        rev.run_typed(&[])
            .iter()
            .map(|o| as_f64(&o.0, DType::F64))
            .collect()
    };
    let grads = grads_at(0.0);
    let want: f64 = grads
        .iter()
        .zip(&dirs)
        .map(|(g, d)| g.iter().zip(d).map(|(a, b)| a * b).sum::<f64>())
        .sum();
    let fwd = jvp(&g, &leaves).unwrap();
    let mut cf = Session::new(Device::Cpu).compile(fwd);
    set_all(&mut cf, c, DType::F64);
    let tangents: Vec<(String, Vec<u8>)> = leaves
        .iter()
        .zip(&dirs)
        .map(|(n, d)| (tangent_name(n), b(d)))
        .collect();
    let ins: Vec<(&str, &[u8], DType)> = tangents
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice(), DType::F64))
        .collect();
    let out = cf.run_typed(&ins);
    // Outputs: the primals [loss, image, projected, order], then the tangents in that order.
    let got = as_f64(&out[4].0, DType::F64)[0];
    close("J v vs <grad, v>", &[got], &[want], 1e-10);

    let h = hvp(&g, &ids).unwrap();
    let mut ch = Session::new(Device::Cpu).compile(h);
    set_all(&mut ch, c, DType::F64);
    let out = ch.run_typed(&ins);
    let eps = 1e-5;
    let (up, down) = (grads_at(eps), grads_at(-eps));
    for (k, leaf) in leaves.iter().enumerate() {
        let fd: Vec<f64> = up[k]
            .iter()
            .zip(&down[k])
            .map(|(a, b)| (a - b) / (2.0 * eps))
            .collect();
        let got = as_f64(&out[1 + leaves.len() + k].0, DType::F64);
        close(
            &format!("H v, {leaf}, vs differences of the gradient"),
            &got,
            &fd,
            1e-5,
        );
    }
}
