//! 3D Gaussian splatting for RLX, as ops registered from outside the IR
//! (`rlx_ir::ops::register`), after Kerbl et al., "3D Gaussian Splatting for Real-Time Radiance
//! Field Rendering" (2023):
//!
//! - `splat_project{fx, fy, cx, cy}(means [N, 3], covs [N, 3, 3], view [4, 4]) -> [N, 6]`: each
//!   Gaussian through a pinhole camera (EWA splatting: the 2-D covariance `J W Σ Wᵀ Jᵀ` plus a
//!   0.3-pixel low-pass), as `(u, v, a, b, c, depth)`: the centre in pixels, the conic (the
//!   inverse 2-D covariance `[[a, b], [b, c]]`) and the camera-space depth;
//! - `splat_sort(depth [N]) -> i32 [N]`: the order front to back (stable);
//! - `splat_rasterize{height, width}(projected [N, 6], colours [N, C], opacities [N],
//!   background [C]?) -> [height, width, C]`: front-to-back alpha compositing of Gaussians given
//!   in depth order;
//! - `splat_rasterize_vjp{height, width}`: the rasterizer's reverse mode (what autodiff emits
//!   for it).
//!
//! Each op's rules are an [`OpDef`]: shape inference (errors name the op and the shapes), a
//! reference evaluator in f64, and a decomposition into the IR's own ops (products, elementwise
//! arithmetic, `cumsum`, `topk`), so every backend runs them and vmap and forward mode go
//! through them. Reverse mode of the rasterizer is its own rule, [`RasterizeVjp`]; the others
//! are differentiated through their decompositions: gradients reach the means, covariances,
//! colours, opacities, background and camera. The CPU backend gets a native rasterizer and a
//! native backward ([`register`]) that bin the Gaussians into 16 × 16 pixel tiles by the exact
//! extent where their alpha can pass the threshold, so they compute what the decompositions
//! compute (every pixel against every Gaussian) up to rounding.
//!
//! [`render`] chains the three; [`covariance`] builds covariances from scales and rotations
//! (quaternions), the parametrization under which optimization keeps them positive definite.
//!
//! ```
//! use rlx::prelude::*;
//! use rlx_splat::{covariance, look_at, render, Camera, Gaussians};
//!
//! # fn main() -> Result<()> {
//! let mut g = Graph::new("two_gaussians");
//! let means = g.try_constant_f32(&[2, 3], &[0.0, 0.0, 0.0, 0.5, 0.0, 1.0])?;
//! let scales = g.try_constant_f32(&[2, 3], &[0.3; 6])?;
//! let rotations = g.try_constant_f32(&[2, 4], &[1.0, 0.0, 0.0, 0.0, 0.9, 0.1, 0.3, 0.0])?;
//! let covs = covariance(&mut g, scales, rotations)?;
//! let colours = g.try_constant_f32(&[2, 3], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0])?;
//! let opacities = g.try_constant_f32(&[2], &[0.9, 0.9])?;
//! let camera = Camera::with_fov(32, 24, 0.8);
//! let view = g.try_constant_f32(&[4, 4], &look_at([0.0, 0.0, -4.0], [0.0; 3], [0.0, 1.0, 0.0]))?;
//! let gs = Gaussians { means, covs, colours, opacities };
//! let image = render(&mut g, &gs, view, &camera, None)?;
//! g.set_outputs(vec![image]);
//! let pixels = Session::new(Device::Cpu).try_compile(g)?.try_run(&[])?.remove(0);
//! assert_eq!(pixels.len(), 24 * 32 * 3);
//! // The centre pixel is mostly the red Gaussian in front.
//! let centre = &pixels[(12 * 32 + 16) * 3..][..3];
//! assert!(centre[0] > 0.5 && centre[2] < centre[0]);
//! # Ok(())
//! # }
//! ```
//!
//! The rules, which the reference evaluator, the decomposition and the CPU kernel share:
//! camera space is `view · (x, y, z, 1)` (x right, y down, z forward, as OpenCV and the 3DGS
//! reference); a Gaussian whose depth is below [`NEAR`] is not drawn; pixel `(x, y)` is sampled
//! at its centre `(x + 0.5, y + 0.5)`; `alpha = min(0.99, opacity · exp(-q / 2))` with `q` the
//! conic's quadratic form of the offset, and an alpha below 1/255 counts as 0; the colour is
//! `Σ alpha_i T_i colour_i + T_N background` with `T_i = Π_{j<i} (1 - alpha_j)`. Unlike the
//! CUDA reference, compositing does not stop early when `T` gets small (the result is exact, not
//! within 1e-4), the Jacobian does not clamp off-screen centres, and covariances are read as
//! their symmetric part `(Σ + Σᵀ) / 2`.

#![deny(missing_docs)]

use rlx_cpu::pool::Pool;
use rlx_ir::eval::Tensor;
use rlx_ir::ops::{Cost, DefinedOp, OpDef, OpRegistration};
use rlx_ir::text::Attr;
use rlx_ir::{Activation, DType, Error, Graph, NodeId, Result, Shape};
use std::sync::Arc;

mod raster;
pub use raster::{Rasterize, RasterizeVjp};

/// Gaussians closer to the camera than this (camera-space depth) are not drawn.
pub const NEAR: f64 = 0.2;
/// Added to the diagonal of every projected covariance (pixels²): the low-pass filter that
/// keeps a splat at least about a pixel wide.
pub const BLUR: f64 = 0.3;
/// Alpha is clamped to this, so no Gaussian is fully opaque.
pub const ALPHA_MAX: f64 = 0.99;
/// Alphas below this count as 0.
pub const ALPHA_MIN: f64 = 1.0 / 255.0;
/// The CPU rasterizer's tile edge, in pixels.
pub const TILE: usize = 16;

/// `splat_project{fx, fy, cx, cy}(means [N, 3], covs [N, 3, 3], view [4, 4]) -> [N, 6]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Project {
    /// Focal lengths in pixels.
    pub fx: f32,
    /// Focal lengths in pixels.
    pub fy: f32,
    /// The principal point in pixels.
    pub cx: f32,
    /// The principal point in pixels.
    pub cy: f32,
}

/// `splat_sort(depth [N]) -> i32 [N]`: indices in order of increasing depth, ties in index
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SortByDepth;

/// The registrations of the ops (`rlx_ir::ops::register` each, or call [`register`]).
pub const REGISTRATIONS: [OpRegistration; 4] = [
    OpRegistration {
        name: "splat_project",
        from_attrs: |a| {
            Ok(DefinedOp::new(Project {
                fx: a.f32("fx")?,
                fy: a.f32("fy")?,
                cx: a.f32("cx")?,
                cy: a.f32("cy")?,
            }))
        },
        examples: || {
            vec![
                DefinedOp::new(Project {
                    fx: 100.0,
                    fy: 90.5,
                    cx: 32.0,
                    cy: 24.0,
                }),
                DefinedOp::new(Project {
                    fx: 1.5,
                    fy: 1.5,
                    cx: -0.25,
                    cy: 0.0,
                }),
            ]
        },
    },
    OpRegistration {
        name: "splat_sort",
        from_attrs: |_| Ok(DefinedOp::new(SortByDepth)),
        examples: || vec![DefinedOp::new(SortByDepth)],
    },
    OpRegistration {
        name: "splat_rasterize",
        from_attrs: |a| {
            Ok(DefinedOp::new(Rasterize {
                height: a.usize("height")?,
                width: a.usize("width")?,
            }))
        },
        examples: || {
            vec![
                DefinedOp::new(Rasterize {
                    height: 4,
                    width: 5,
                }),
                DefinedOp::new(Rasterize {
                    height: 64,
                    width: 1,
                }),
            ]
        },
    },
    OpRegistration {
        name: "splat_rasterize_vjp",
        from_attrs: |a| {
            Ok(DefinedOp::new(RasterizeVjp {
                height: a.usize("height")?,
                width: a.usize("width")?,
            }))
        },
        examples: || {
            vec![DefinedOp::new(RasterizeVjp {
                height: 3,
                width: 7,
            })]
        },
    },
];

/// Register the ops with the IR and the rasterizer with the CPU backend (again is a no-op).
pub fn register() -> Result<()> {
    for reg in REGISTRATIONS {
        rlx_ir::ops::register(reg)?;
    }
    cpu_kernel("splat_rasterize", raster::rasterize_kernel);
    cpu_kernel("splat_rasterize_vjp", raster::rasterize_vjp_kernel);
    rlx_wgpu::register_kernel(
        "splat_rasterize",
        Arc::new(|op: &DefinedOp, ins: &[&Shape], out: &Shape| {
            raster::wgsl_kernel(op.downcast()?, ins, out)
        }),
    );
    rlx_cuda::register_kernel(
        "splat_rasterize",
        Arc::new(|op: &DefinedOp, ins: &[&Shape], out: &Shape| {
            raster::cuda_kernel(op.downcast()?, ins, out)
        }),
    );
    Ok(())
}

/// A CPU kernel of one of these ops, given the op as its own type.
type Kernel<T> = fn(&T, &[(&[u8], &Shape)], &mut [u8], &Shape, &Pool);

/// Give the CPU backend `kernel` for the registered op `name` of type `T`.
fn cpu_kernel<T: OpDef>(name: &'static str, kernel: Kernel<T>) {
    rlx_cpu::kernels::registered::register_kernel(
        name,
        Arc::new(
            move |op: &DefinedOp,
                  ins: &[(&[u8], &Shape)],
                  out: &mut [u8],
                  shape: &Shape,
                  pool: &Pool| {
                if let Some(r) = op.downcast::<T>() {
                    kernel(r, ins, out, shape, pool);
                }
            },
        ),
    );
}

/// Static dimensions of operand `what` of `op`, or an error naming both.
fn dims(op: &str, what: &str, s: &Shape) -> Result<Vec<usize>> {
    s.static_dims()
        .ok_or_else(|| Error::op(op, format!("{what} {s} needs static dimensions")))
}

/// The splat ops compute in f32 or f64.
fn float_type(op: &str, what: &str, s: &Shape) -> Result<DType> {
    match s.dtype() {
        DType::F32 | DType::F64 => Ok(s.dtype()),
        _ => Err(Error::op(
            op,
            format!("{what} {s} must be f32 or f64 (other types: cast first)"),
        )),
    }
}

fn bytes_of(shapes: &[&Shape]) -> u64 {
    shapes
        .iter()
        .map(|s| s.size_bytes().unwrap_or(0) as u64)
        .sum()
}

/// A constant of `dims` holding `values`, in `dt`.
fn constant(g: &mut Graph, dims: &[usize], values: Vec<f64>, dt: DType) -> Result<NodeId> {
    let t = Tensor::from_f64(dims, dt, values);
    g.try_constant_bytes(Shape::new(dims, dt), t.to_bytes())
}

/// Column `i` of a `[n, w]` value, as `[n, 1]`.
fn column(g: &mut Graph, x: NodeId, i: usize) -> Result<NodeId> {
    g.try_narrow(x, 1, i, 1)
}

impl Project {
    /// One Gaussian: `(u, v, a, b, c, depth)` for mean `m`, covariance `s` (row-major 3 × 3)
    /// and the first three rows of the view matrix `w` (row-major 3 × 4).
    fn one(&self, m: &[f64], s: &[f64], w: &[f64]) -> [f64; 6] {
        let (fx, fy) = (self.fx as f64, self.fy as f64);
        let (cx, cy) = (self.cx as f64, self.cy as f64);
        let t: Vec<f64> = (0..3)
            .map(|r| w[r * 4] * m[0] + w[r * 4 + 1] * m[1] + w[r * 4 + 2] * m[2] + w[r * 4 + 3])
            .collect();
        let (x, y, depth) = (t[0], t[1], t[2]);
        let z = depth.max(NEAR);
        let iz = 1.0 / z;
        let j = [
            [fx * iz, 0.0, -fx * x * iz * iz],
            [0.0, fy * iz, -fy * y * iz * iz],
        ];
        // M = J R (2 × 3), then M Σ Mᵀ.
        let mut mm = [[0.0; 3]; 2];
        for (r, row) in mm.iter_mut().enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = (0..3).map(|k| j[r][k] * w[k * 4 + c]).sum();
            }
        }
        let mut ms = [[0.0; 3]; 2];
        for (r, row) in ms.iter_mut().enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = (0..3).map(|k| mm[r][k] * s[k * 3 + c]).sum();
            }
        }
        let mut s2 = [[0.0; 2]; 2];
        for (r, row) in s2.iter_mut().enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = (0..3).map(|k| ms[r][k] * mm[c][k]).sum();
            }
        }
        let (s00, s11) = (s2[0][0] + BLUR, s2[1][1] + BLUR);
        let sb = (s2[0][1] + s2[1][0]) * 0.5;
        let det = s00 * s11 - sb * sb;
        [
            fx * x * iz + cx,
            fy * y * iz + cy,
            s11 / det,
            -sb / det,
            s00 / det,
            depth,
        ]
    }
}

impl OpDef for Project {
    fn name(&self) -> &'static str {
        "splat_project"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("fx", Attr::Float(self.fx)),
            ("fy", Attr::Float(self.fy)),
            ("cx", Attr::Float(self.cx)),
            ("cy", Attr::Float(self.cy)),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (3, 3)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let op = "splat_project";
        let (means, covs, view) = (ins[0], ins[1], ins[2]);
        let dt = float_type(op, "means", means)?;
        let (md, cd, vd) = (
            dims(op, "means", means)?,
            dims(op, "covs", covs)?,
            dims(op, "view", view)?,
        );
        if md.len() != 2 || md[1] != 3 {
            return Err(Error::op(op, format!("means {means} must be [N, 3]")));
        }
        if cd != [md[0], 3, 3] || covs.dtype() != dt {
            return Err(Error::op(
                op,
                format!(
                    "covs {covs} must be [{}, 3, 3] of {dt} (means {means})",
                    md[0]
                ),
            ));
        }
        if vd != [4, 4] || view.dtype() != dt {
            return Err(Error::op(op, format!("view {view} must be [4, 4] of {dt}")));
        }
        if ![self.fx, self.fy, self.cx, self.cy]
            .iter()
            .all(|v| v.is_finite())
        {
            return Err(Error::op(
                op,
                format!("camera intrinsics must be finite, got {self:?}"),
            ));
        }
        Ok(Shape::new(&[md[0], 6], dt))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (m, s, w) = (ins[0].f64s(), ins[1].f64s(), ins[2].f64s());
        let n = ins[0].dims()[0];
        let mut y = Vec::with_capacity(n * 6);
        for i in 0..n {
            y.extend(self.one(&m[i * 3..i * 3 + 3], &s[i * 9..i * 9 + 9], &w));
        }
        Ok(Tensor::from_f64(&[n, 6], out.dtype(), y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = out.static_dims().map_or(0, |d| d[0]) as u64;
        Cost {
            flops: 120 * n,
            bytes: bytes_of(&[ins[0], ins[1], ins[2], out]),
        }
    }

    /// Camera-space centres by one product, the Jacobian's rows by elementwise ops, the 2-D
    /// covariances by two batched products, the conic by its closed-form inverse.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let (means, covs, view) = (ins[0], ins[1], ins[2]);
            let dt = g.shape(means).dtype();
            let n = g.shape(means).static_dims().unwrap_or_default()[0];
            let top = g.try_narrow(view, 0, 0, 3)?;
            let r = g.try_narrow(top, 1, 0, 3)?;
            let tr = g.try_narrow(top, 1, 3, 1)?;
            let tr = g.try_reshape(tr, &[3])?;
            let rt = g.try_transpose(r, &[1, 0])?;
            let t = g.try_dot(means, rt)?;
            let t = g.try_add(t, tr)?;
            let (x, y, depth) = (column(g, t, 0)?, column(g, t, 1)?, column(g, t, 2)?);
            let near = g.try_scalar(NEAR, dt)?;
            let z = g.try_maximum(depth, near)?;
            let one = g.try_scalar(1.0, dt)?;
            let iz = g.try_div(one, z)?;
            let iz2 = g.try_mul(iz, iz)?;
            let [fx, fy, cx, cy] = [self.fx, self.fy, self.cx, self.cy];
            let (fx, fy) = (g.try_scalar(fx as f64, dt)?, g.try_scalar(fy as f64, dt)?);
            let (cx, cy) = (g.try_scalar(cx as f64, dt)?, g.try_scalar(cy as f64, dt)?);
            // u = fx x / z + cx, v = fy y / z + cy.
            let fxiz = g.try_mul(fx, iz)?;
            let fyiz = g.try_mul(fy, iz)?;
            let u = g.try_mul(fxiz, x)?;
            let u = g.try_add(u, cx)?;
            let v = g.try_mul(fyiz, y)?;
            let v = g.try_add(v, cy)?;
            // J = [[fx/z, 0, -fx x/z²], [0, fy/z, -fy y/z²]], per Gaussian.
            let zero = g.try_scalar(0.0, dt)?;
            let zeros = g.try_expand(zero, &[n, 1])?;
            let fx2 = g.try_mul(fx, iz2)?;
            let j02 = g.try_mul(fx2, x)?;
            let j02 = g.try_activation(Activation::Neg, j02)?;
            let fy2 = g.try_mul(fy, iz2)?;
            let j12 = g.try_mul(fy2, y)?;
            let j12 = g.try_activation(Activation::Neg, j12)?;
            let j0 = g.try_concat(&[fxiz, zeros, j02], 1)?;
            let j1 = g.try_concat(&[zeros, fyiz, j12], 1)?;
            let j0 = g.try_reshape(j0, &[n, 1, 3])?;
            let j1 = g.try_reshape(j1, &[n, 1, 3])?;
            let j = g.try_concat(&[j0, j1], 1)?;
            // M = J R; Σ' = M Σ Mᵀ.
            let m = g.try_dot(j, r)?;
            let ms = g.try_dot(m, covs)?;
            let mt = g.try_transpose(m, &[0, 2, 1])?;
            let s2 = g.try_dot(ms, mt)?;
            let s2 = g.try_reshape(s2, &[n, 4])?;
            let blur = g.try_scalar(BLUR, dt)?;
            let s00 = column(g, s2, 0)?;
            let s00 = g.try_add(s00, blur)?;
            let s11 = column(g, s2, 3)?;
            let s11 = g.try_add(s11, blur)?;
            let s01 = column(g, s2, 1)?;
            let s10 = column(g, s2, 2)?;
            let sb = g.try_add(s01, s10)?;
            let half = g.try_scalar(0.5, dt)?;
            let sb = g.try_mul(sb, half)?;
            let d0 = g.try_mul(s00, s11)?;
            let d1 = g.try_mul(sb, sb)?;
            let det = g.try_sub(d0, d1)?;
            let a = g.try_div(s11, det)?;
            let b = g.try_div(sb, det)?;
            let b = g.try_activation(Activation::Neg, b)?;
            let c = g.try_div(s00, det)?;
            g.try_concat(&[u, v, a, b, c, depth], 1)
        })())
    }
}

impl OpDef for SortByDepth {
    fn name(&self) -> &'static str {
        "splat_sort"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        Vec::new()
    }

    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let d = dims("splat_sort", "depth", ins[0])?;
        if d.len() != 1 || !ins[0].dtype().is_float() {
            return Err(Error::op(
                "splat_sort",
                format!("depth {} must be a float vector [N]", ins[0]),
            ));
        }
        Ok(Shape::new(&d, DType::I32))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let d = ins[0].f64s();
        let mut order: Vec<usize> = (0..d.len()).collect();
        // `topk` of the negated depths: larger first, ties in index order.
        order.sort_by(|&a, &b| {
            (-d[b])
                .partial_cmp(&-d[a])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        Ok(Tensor::from_f64(
            &[d.len()],
            out.dtype(),
            order.into_iter().map(|i| i as f64).collect(),
        ))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = ins[0].numel().unwrap_or(0) as u64;
        Cost {
            flops: n * (64 - n.leading_zeros() as u64),
            bytes: bytes_of(&[ins[0], out]),
        }
    }

    /// `topk` of the negated depths, its indices.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let n = g.shape(ins[0]).numel().unwrap_or(0);
            let neg = g.try_activation(Activation::Neg, ins[0])?;
            Ok(g.try_topk(neg, n)?.1)
        })())
    }
}

/// The pinhole camera of a render: the image size and the intrinsics in pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Camera {
    /// Image columns.
    pub width: usize,
    /// Image rows.
    pub height: usize,
    /// Focal length along x, in pixels.
    pub fx: f32,
    /// Focal length along y, in pixels.
    pub fy: f32,
    /// Principal point x, in pixels.
    pub cx: f32,
    /// Principal point y, in pixels.
    pub cy: f32,
}

impl Camera {
    /// A camera of `width × height` pixels with vertical field of view `fov_y` (radians),
    /// square pixels and the principal point at the image centre.
    pub fn with_fov(width: usize, height: usize, fov_y: f32) -> Camera {
        let f = height as f32 / (2.0 * (fov_y / 2.0).tan());
        Camera {
            width,
            height,
            fx: f,
            fy: f,
            cx: width as f32 / 2.0,
            cy: height as f32 / 2.0,
        }
    }
}

/// The world-to-camera matrix (row-major 4 × 4) of a camera at `eye` looking at `target`,
/// `up` giving the world's up direction (image y points down it, x to the right).
pub fn look_at(eye: [f32; 3], target: [f32; 3], up: [f32; 3]) -> [f32; 16] {
    let sub = |a: [f32; 3], b: [f32; 3]| [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
    let cross = |a: [f32; 3], b: [f32; 3]| {
        [
            a[1] * b[2] - a[2] * b[1],
            a[2] * b[0] - a[0] * b[2],
            a[0] * b[1] - a[1] * b[0],
        ]
    };
    let norm = |a: [f32; 3]| {
        let l = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
        [a[0] / l, a[1] / l, a[2] / l]
    };
    let dot = |a: [f32; 3], b: [f32; 3]| a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    let z = norm(sub(target, eye));
    let x = norm(cross(z, up));
    let y = cross(z, x);
    [
        x[0],
        x[1],
        x[2],
        -dot(x, eye),
        y[0],
        y[1],
        y[2],
        -dot(y, eye),
        z[0],
        z[1],
        z[2],
        -dot(z, eye),
        0.0,
        0.0,
        0.0,
        1.0,
    ]
}

/// A set of Gaussians as graph values: `means [N, 3]`, `covs [N, 3, 3]`, `colours [N, C]` and
/// `opacities [N]` (in `[0, 1]`), of one float type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gaussians {
    /// Centres in world space.
    pub means: NodeId,
    /// Covariances in world space (symmetric positive semi-definite).
    pub covs: NodeId,
    /// Colours (any number of channels).
    pub colours: NodeId,
    /// Opacities.
    pub opacities: NodeId,
}

/// `splat_project` of the Gaussians seen through `camera` placed by `view` (`[4, 4]`,
/// world to camera): `[N, 6]` rows `(u, v, a, b, c, depth)`.
pub fn project(
    g: &mut Graph,
    means: NodeId,
    covs: NodeId,
    view: NodeId,
    camera: &Camera,
) -> Result<NodeId> {
    register()?;
    g.define(
        Project {
            fx: camera.fx,
            fy: camera.fy,
            cx: camera.cx,
            cy: camera.cy,
        },
        &[means, covs, view],
    )
}

/// `splat_sort` of the depths of `projected` (`splat_project`'s result): the front-to-back
/// order, i32 `[N]`.
pub fn sort_by_depth(g: &mut Graph, projected: NodeId) -> Result<NodeId> {
    register()?;
    let n = g
        .shape(projected)
        .static_dims()
        .filter(|d| d.len() == 2 && d[1] == 6)
        .ok_or_else(|| {
            Error::op(
                "splat_sort",
                format!("projected {} must be [N, 6]", g.shape(projected)),
            )
        })?[0];
    let depth = column(g, projected, 5)?;
    let depth = g.try_reshape(depth, &[n])?;
    g.define(SortByDepth, &[depth])
}

/// `splat_rasterize` of Gaussians already in front-to-back order: the `[height, width, C]`
/// image over `background` (`[C]`; none is black).
pub fn rasterize(
    g: &mut Graph,
    projected: NodeId,
    colours: NodeId,
    opacities: NodeId,
    background: Option<NodeId>,
    camera: &Camera,
) -> Result<NodeId> {
    register()?;
    let mut ins = vec![projected, colours, opacities];
    ins.extend(background);
    g.define(
        Rasterize {
            height: camera.height,
            width: camera.width,
        },
        &ins,
    )
}

/// The image of `gaussians` seen from `view` through `camera`: project, sort by depth, gather
/// in that order, rasterize.
pub fn render(
    g: &mut Graph,
    gaussians: &Gaussians,
    view: NodeId,
    camera: &Camera,
    background: Option<NodeId>,
) -> Result<NodeId> {
    let proj = project(g, gaussians.means, gaussians.covs, view, camera)?;
    let order = sort_by_depth(g, proj)?;
    let proj = g.try_gather(proj, order, 0)?;
    let colours = g.try_gather(gaussians.colours, order, 0)?;
    let opacities = g.try_gather(gaussians.opacities, order, 0)?;
    rasterize(g, proj, colours, opacities, background, camera)
}

/// Covariances `R diag(s²) Rᵀ` `[N, 3, 3]` from `scales [N, 3]` (standard deviations along the
/// Gaussians' axes) and `rotations [N, 4]` (quaternions `(w, x, y, z)`, normalized here), as
/// graph ops: positive semi-definite for any values, so an optimizer may move both freely.
pub fn covariance(g: &mut Graph, scales: NodeId, rotations: NodeId) -> Result<NodeId> {
    let op = "splat covariance";
    let (sd, rd) = (
        dims(op, "scales", g.shape(scales))?,
        dims(op, "rotations", g.shape(rotations))?,
    );
    if sd.len() != 2 || sd[1] != 3 || rd != [sd[0], 4] {
        return Err(Error::op(
            op,
            format!(
                "scales {} must be [N, 3] and rotations {} [N, 4]",
                g.shape(scales),
                g.shape(rotations)
            ),
        ));
    }
    let n = sd[0];
    let dt = g.shape(scales).dtype();
    let sq = g.try_mul(rotations, rotations)?;
    let len = g.try_sum(sq, &[1], true)?;
    let len = g.try_activation(Activation::Rsqrt, len)?;
    let q = g.try_mul(rotations, len)?;
    let (w, x, y, z) = (
        column(g, q, 0)?,
        column(g, q, 1)?,
        column(g, q, 2)?,
        column(g, q, 3)?,
    );
    let one = g.try_scalar(1.0, dt)?;
    let two = g.try_scalar(2.0, dt)?;
    // 2 (a b ± c d) and 1 - 2 (a² + b²).
    let pm = |g: &mut Graph, a, b, c, d, plus: bool| -> Result<NodeId> {
        let ab = g.try_mul(a, b)?;
        let cd = g.try_mul(c, d)?;
        let s = if plus {
            g.try_add(ab, cd)?
        } else {
            g.try_sub(ab, cd)?
        };
        g.try_mul(two, s)
    };
    let diag = |g: &mut Graph, a, b| -> Result<NodeId> {
        let a2 = g.try_mul(a, a)?;
        let b2 = g.try_mul(b, b)?;
        let s = g.try_add(a2, b2)?;
        let s = g.try_mul(two, s)?;
        g.try_sub(one, s)
    };
    let r = [
        diag(g, y, z)?,
        pm(g, x, y, w, z, false)?,
        pm(g, x, z, w, y, true)?,
        pm(g, x, y, w, z, true)?,
        diag(g, x, z)?,
        pm(g, y, z, w, x, false)?,
        pm(g, x, z, w, y, false)?,
        pm(g, y, z, w, x, true)?,
        diag(g, x, y)?,
    ];
    let r = g.try_concat(&r, 1)?;
    let r = g.try_reshape(r, &[n, 3, 3])?;
    // M = R diag(s), Σ = M Mᵀ.
    let s = g.try_reshape(scales, &[n, 1, 3])?;
    let m = g.try_mul(r, s)?;
    let mt = g.try_transpose(m, &[0, 2, 1])?;
    g.try_dot(m, mt)
}
