//! The rasterizer, `splat_rasterize`, and its reverse mode, `splat_rasterize_vjp`: their rules,
//! reference evaluators, dense decompositions and tile-binned CPU kernels.

use super::{bytes_of, column, constant, dims, float_type, ALPHA_MAX, ALPHA_MIN, NEAR, TILE};
use rlx_cpu::kernels::{par_ranges, Ptr};
use rlx_cpu::pool::Pool;
use rlx_ir::eval::Tensor;
use rlx_ir::ops::{Cost, OpDef};
use rlx_ir::text::Attr;
use rlx_ir::{Activation, CmpOp, DType, Error, Graph, NodeId, Result, Shape};
use std::sync::Mutex;

/// `splat_rasterize{height, width}(projected [N, 6], colours [N, C], opacities [N],
/// background [C]?) -> [height, width, C]`, the Gaussians given front to back.
///
/// Its reverse mode is a rule of its own, [`RasterizeVjp`] (a native backward kernel on the
/// CPU); forward mode and batching go through the decomposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rasterize {
    /// Image rows.
    pub height: usize,
    /// Image columns.
    pub width: usize,
}

/// `splat_rasterize_vjp{height, width}(projected, colours, opacities, background?, cotangent
/// [height, width, C]) -> [6N + CN + N (+ C)]`: the cotangents of `splat_rasterize`'s operands
/// given the image's, one flat vector (projected's `[N, 6]`, colours' `[N, C]`, opacities'
/// `[N]`, then background's `[C]` when it has one); the depth column's cotangent is zero.
/// Autodiff emits it for `splat_rasterize`; its own derivatives go through its decomposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RasterizeVjp {
    /// Image rows.
    pub height: usize,
    /// Image columns.
    pub width: usize,
}

/// One Gaussian's alpha at one pixel, with what its derivatives need.
#[derive(Clone, Copy)]
struct Hit {
    alpha: f64,
    /// Pixel centre minus the Gaussian's centre.
    dx: f64,
    dy: f64,
    /// `exp(-q / 2)`.
    e: f64,
    /// Whether `opacity · e` reached [`ALPHA_MAX`] (alpha then does not depend on it).
    clamped: bool,
}

/// The Gaussian `p` (a row of `splat_project`'s result) with opacity `o` at pixel centre
/// `(px, py)`; `None` where its alpha counts as 0.
#[inline]
fn hit(p: &[f64], o: f64, px: f64, py: f64) -> Option<Hit> {
    if p[5].is_nan() || p[5] < NEAR {
        return None;
    }
    let (dx, dy) = (px - p[0], py - p[1]);
    let q = p[2] * dx * dx + 2.0 * p[3] * dx * dy + p[4] * dy * dy;
    let e = (-0.5 * q).exp();
    let g = o * e;
    let alpha = g.min(ALPHA_MAX);
    (alpha >= ALPHA_MIN).then_some(Hit {
        alpha,
        dx,
        dy,
        e,
        clamped: g >= ALPHA_MAX,
    })
}

/// The operands as f64, the way the evaluators and kernels read them.
struct Scene {
    p: Vec<f64>,
    colours: Vec<f64>,
    opacities: Vec<f64>,
    background: Option<Vec<f64>>,
    /// Channels.
    ch: usize,
}

impl Scene {
    fn n(&self) -> usize {
        self.opacities.len()
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.p[i * 6..i * 6 + 6]
    }

    fn colour(&self, i: usize) -> &[f64] {
        &self.colours[i * self.ch..(i + 1) * self.ch]
    }

    /// Composite the Gaussians `list` (front to back) at pixel `(x, y)` into `acc`.
    fn pixel(&self, list: impl Iterator<Item = usize>, x: usize, y: usize, acc: &mut [f64]) {
        let (px, py) = (x as f64 + 0.5, y as f64 + 0.5);
        acc.fill(0.0);
        let mut t = 1.0;
        for i in list {
            if let Some(h) = hit(self.row(i), self.opacities[i], px, py) {
                let wt = h.alpha * t;
                for (v, c) in acc.iter_mut().zip(self.colour(i)) {
                    *v += wt * c;
                }
                t *= 1.0 - h.alpha;
            }
        }
        if let Some(bg) = &self.background {
            for (v, b) in acc.iter_mut().zip(bg) {
                *v += t * b;
            }
        }
    }

    /// Add pixel `(x, y)`'s share of the cotangents, given its cotangent `gct` (`[ch]`), to
    /// `grads` (the flat layout of [`RasterizeVjp`]); `hits` is scratch space.
    #[allow(clippy::too_many_arguments)]
    fn pixel_vjp(
        &self,
        list: impl Iterator<Item = usize>,
        x: usize,
        y: usize,
        gct: &[f64],
        hits: &mut Vec<(usize, Hit, f64)>,
        grads: &mut [f64],
    ) {
        let (n, ch) = (self.n(), self.ch);
        let (px, py) = (x as f64 + 0.5, y as f64 + 0.5);
        hits.clear();
        let mut t = 1.0;
        for i in list {
            if let Some(h) = hit(self.row(i), self.opacities[i], px, py) {
                hits.push((i, h, t));
                t *= 1.0 - h.alpha;
            }
        }
        let dot = |a: &[f64]| a.iter().zip(gct).map(|(a, b)| a * b).sum::<f64>();
        // What lies behind Gaussian i, weighted by the cotangent: Σ_{k>i} w_k (c_k · g) +
        // T_N (background · g), accumulated back to front.
        let mut behind = 0.0;
        if let Some(bg) = &self.background {
            behind = t * dot(bg);
            let at = n * (7 + ch);
            for (d, g) in grads[at..at + ch].iter_mut().zip(gct) {
                *d += t * g;
            }
        }
        for &(i, h, ti) in hits.iter().rev() {
            let cg = dot(self.colour(i));
            let at = 6 * n + i * ch;
            for (d, g) in grads[at..at + ch].iter_mut().zip(gct) {
                *d += h.alpha * ti * g;
            }
            let da = ti * cg - behind / (1.0 - h.alpha);
            behind += h.alpha * ti * cg;
            if h.clamped {
                continue;
            }
            grads[(6 + ch) * n + i] += da * h.e;
            let dq = -0.5 * da * self.opacities[i] * h.e;
            let p = self.row(i);
            let (dx, dy) = (h.dx, h.dy);
            let d = &mut grads[i * 6..i * 6 + 6];
            d[0] -= dq * 2.0 * (p[2] * dx + p[3] * dy);
            d[1] -= dq * 2.0 * (p[3] * dx + p[4] * dy);
            d[2] += dq * dx * dx;
            d[3] += dq * 2.0 * dx * dy;
            d[4] += dq * dy * dy;
        }
    }

    /// The Gaussians binned into [`TILE`]-pixel tiles (`tiles_x` a row) of a `w × h` image
    /// by the box holding every pixel where their alpha reaches [`ALPHA_MIN`]: `q ≤ 2 ln(255 ·
    /// opacity)` is an ellipse whose bounding box follows from the 2-D covariance (the
    /// conic's inverse), widened by a pixel against rounding. A Gaussian whose conic is not
    /// positive definite or whose centre is not finite goes to every tile. Each list keeps the
    /// Gaussians' order.
    fn bins(&self, w: usize, h: usize) -> Vec<Vec<u32>> {
        let (tw, th) = (w.div_ceil(TILE), h.div_ceil(TILE));
        let mut bins: Vec<Vec<u32>> = vec![Vec::new(); tw * th];
        for i in 0..self.n() {
            let (g, o) = (self.row(i), self.opacities[i]);
            if g[5].is_nan() || g[5] < NEAR || o.is_nan() || o < ALPHA_MIN {
                continue;
            }
            let (a, b, c) = (g[2], g[3], g[4]);
            let det = a * c - b * b;
            let (mut x0, mut x1, mut y0, mut y1) = (0, tw - 1, 0, th - 1);
            if det > 0.0 && a > 0.0 && g[0].is_finite() && g[1].is_finite() {
                let q = 2.0 * (o / ALPHA_MIN).ln().max(0.0);
                let rx = (q * c / det).sqrt() + 1.0;
                let ry = (q * a / det).sqrt() + 1.0;
                // Pixel columns whose centres x + 0.5 lie within u ± rx.
                let lo_x = (g[0] - rx - 0.5).floor();
                let hi_x = (g[0] + rx - 0.5).ceil();
                let lo_y = (g[1] - ry - 0.5).floor();
                let hi_y = (g[1] + ry - 0.5).ceil();
                if hi_x < 0.0 || hi_y < 0.0 || lo_x > (w - 1) as f64 || lo_y > (h - 1) as f64 {
                    continue;
                }
                let tile = |v: f64, last: usize| (v.max(0.0) as usize).min(last) / TILE;
                (x0, x1) = (tile(lo_x, w - 1), tile(hi_x, w - 1));
                (y0, y1) = (tile(lo_y, h - 1), tile(hi_y, h - 1));
            }
            for ty in y0..=y1 {
                for tx in x0..=x1 {
                    bins[ty * tw + tx].push(i as u32);
                }
            }
        }
        bins
    }
}

fn f64s((b, s): (&[u8], &Shape)) -> Vec<f64> {
    Tensor::from_bytes(s, b)
        .map(|t| t.f64s())
        .unwrap_or_default()
}

/// The scene of a kernel's operands (`background` at index 3 when `with_background`).
fn scene_of(ins: &[(&[u8], &Shape)], with_background: bool) -> Scene {
    Scene {
        p: f64s(ins[0]),
        colours: f64s(ins[1]),
        opacities: f64s(ins[2]),
        background: with_background.then(|| f64s(ins[3])),
        ch: ins[1].1.static_dims().map_or(1, |d| d[1]),
    }
}

/// The scene of the reference evaluator's operands.
fn scene_of_tensors(ins: &[&Tensor], with_background: bool) -> Scene {
    Scene {
        p: ins[0].f64s(),
        colours: ins[1].f64s(),
        opacities: ins[2].f64s(),
        background: with_background.then(|| ins[3].f64s()),
        ch: ins[1].dims()[1],
    }
}

/// Check the operands of the rasterizer (`ins[..3]`, and the background `ins[3]` when
/// `with_background`); the channel count and dtype.
fn check(op: &str, ins: &[&Shape], with_background: bool) -> Result<(usize, usize, DType)> {
    let err = |m: String| Error::op(op, m);
    let dt = float_type(op, "projected", ins[0])?;
    let pd = dims(op, "projected", ins[0])?;
    let cd = dims(op, "colours", ins[1])?;
    let od = dims(op, "opacities", ins[2])?;
    if pd.len() != 2 || pd[1] != 6 {
        return Err(err(format!(
            "projected {} must be [N, 6] (splat_project's result)",
            ins[0]
        )));
    }
    let n = pd[0];
    if cd.len() != 2 || cd[0] != n || ins[1].dtype() != dt {
        return Err(err(format!(
            "colours {} must be [{n}, C] of {dt} (projected {})",
            ins[1], ins[0]
        )));
    }
    if od != [n] || ins[2].dtype() != dt {
        return Err(err(format!(
            "opacities {} must be [{n}] of {dt} (projected {})",
            ins[2], ins[0]
        )));
    }
    if with_background {
        let bg = ins[3];
        if dims(op, "background", bg)? != [cd[1]] || bg.dtype() != dt {
            return Err(err(format!(
                "background {bg} must be [{}] of {dt} (colours {})",
                cd[1], ins[1]
            )));
        }
    }
    Ok((n, cd[1], dt))
}

fn check_size(op: &str, height: usize, width: usize) -> Result<()> {
    if height == 0 || width == 0 {
        return Err(Error::op(
            op,
            format!("an image of {height} x {width} pixels is empty"),
        ));
    }
    Ok(())
}

impl OpDef for Rasterize {
    fn name(&self) -> &'static str {
        "splat_rasterize"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("height", Attr::from(self.height)),
            ("width", Attr::from(self.width)),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (3, 4)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (_, ch, dt) = check(self.name(), ins, ins.len() == 4)?;
        check_size(self.name(), self.height, self.width)?;
        Ok(Shape::new(&[self.height, self.width, ch], dt))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let s = scene_of_tensors(ins, ins.len() == 4);
        let mut y = Vec::with_capacity(self.height * self.width * s.ch);
        let mut acc = vec![0.0; s.ch];
        for py in 0..self.height {
            for px in 0..self.width {
                s.pixel(0..s.n(), px, py, &mut acc);
                y.extend_from_slice(&acc);
            }
        }
        Ok(Tensor::from_f64(
            &[self.height, self.width, s.ch],
            out.dtype(),
            y,
        ))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = ins[2].numel().unwrap_or(0) as u64;
        let ch = out.static_dims().map_or(1, |d| d[2]) as u64;
        let pixels = (self.height * self.width) as u64;
        Cost {
            flops: pixels * n * (16 + 2 * ch),
            bytes: bytes_of(ins) + out.size_bytes().unwrap_or(0) as u64,
        }
    }

    /// Every pixel against every Gaussian, `[P, N]` with `P = height · width`: alphas by
    /// elementwise ops (the thresholds by `where`), the transmittances `T` as the exponential
    /// of an exclusive `cumsum` of `log(1 - alpha)`, the image as one product of the weights
    /// `alpha · T` with the colours.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let d = Dense::new(g, ins[0], ins[2], self.height, self.width)?;
            let ch = g.shape(ins[1]).static_dims().unwrap_or_default()[1];
            let mut img = g.try_dot(d.wts, ins[1])?;
            if let Some(&bg) = ins.get(3) {
                let behind = g.try_mul(d.t_end, bg)?;
                img = g.try_add(img, behind)?;
            }
            g.try_reshape(img, &[self.height, self.width, ch])
        })())
    }

    fn has_vjp_rule(&self) -> bool {
        true
    }

    /// [`RasterizeVjp`], split into the operands' cotangents.
    fn vjp(
        &self,
        g: &mut Graph,
        ins: &[NodeId],
        _out: NodeId,
        ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        let cd = g.shape(ins[1]).static_dims().unwrap_or_default();
        let (n, ch) = (cd[0], cd[1]);
        let mut args = ins.to_vec();
        args.push(ct);
        let flat = g.define(
            RasterizeVjp {
                height: self.height,
                width: self.width,
            },
            &args,
        )?;
        let dp = g.try_narrow(flat, 0, 0, 6 * n)?;
        let dp = g.try_reshape(dp, &[n, 6])?;
        let dc = g.try_narrow(flat, 0, 6 * n, ch * n)?;
        let dc = g.try_reshape(dc, &[n, ch])?;
        let dop = g.try_narrow(flat, 0, (6 + ch) * n, n)?;
        let mut cts = vec![Some(dp), Some(dc), Some(dop)];
        if ins.len() == 4 {
            cts.push(Some(g.try_narrow(flat, 0, (7 + ch) * n, ch)?));
        }
        Ok(cts)
    }
}

impl OpDef for RasterizeVjp {
    fn name(&self) -> &'static str {
        "splat_rasterize_vjp"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("height", Attr::from(self.height)),
            ("width", Attr::from(self.width)),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (4, 5)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let with_bg = ins.len() == 5;
        let (n, ch, dt) = check(self.name(), ins, with_bg)?;
        check_size(self.name(), self.height, self.width)?;
        let ct = ins[ins.len() - 1];
        if ct.static_dims().as_deref() != Some(&[self.height, self.width, ch][..])
            || ct.dtype() != dt
        {
            return Err(Error::op(
                self.name(),
                format!(
                    "the cotangent {ct} must be the image's shape [{}, {}, {ch}] of {dt}",
                    self.height, self.width
                ),
            ));
        }
        let len = (7 + ch) * n + if with_bg { ch } else { 0 };
        Ok(Shape::new(&[len], dt))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let with_bg = ins.len() == 5;
        let s = scene_of_tensors(ins, with_bg);
        let ct = ins[ins.len() - 1].f64s();
        let len = out.numel().unwrap_or(0);
        let mut grads = vec![0.0; len];
        let mut hits = Vec::new();
        for y in 0..self.height {
            for x in 0..self.width {
                let at = (y * self.width + x) * s.ch;
                s.pixel_vjp(0..s.n(), x, y, &ct[at..at + s.ch], &mut hits, &mut grads);
            }
        }
        Ok(Tensor::from_f64(&[len], out.dtype(), grads))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = ins[2].numel().unwrap_or(0) as u64;
        let ch = ins[1].static_dims().map_or(1, |d| d[1]) as u64;
        let pixels = (self.height * self.width) as u64;
        Cost {
            flops: pixels * n * (40 + 4 * ch),
            bytes: bytes_of(ins) + out.size_bytes().unwrap_or(0) as u64,
        }
    }

    /// The reverse mode of [`Rasterize`]'s decomposition written out over `[P, N]`: the
    /// colours' cotangent `wᵀ G`, the alphas' `T (c · G) - S / (1 - alpha)` with `S` what lies
    /// behind (a reversed exclusive `cumsum` of `w (c · G)` plus the background's share), then
    /// through the thresholds and `exp` to the opacities and the conic, and through the
    /// offsets to the centres, each summed over the pixels.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let with_bg = ins.len() == 5;
            let (proj, colours, opac) = (ins[0], ins[1], ins[2]);
            let ct = ins[ins.len() - 1];
            let dt = g.shape(proj).dtype();
            let cd = g.shape(colours).static_dims().unwrap_or_default();
            let (n, ch) = (cd[0], cd[1]);
            let pixels = self.height * self.width;
            let d = Dense::new(g, proj, opac, self.height, self.width)?;
            let gm = g.try_reshape(ct, &[pixels, ch])?;
            let colt = g.try_transpose(colours, &[1, 0])?;
            let gc = g.try_dot(gm, colt)?;
            let wt = g.try_transpose(d.wts, &[1, 0])?;
            let dcol = g.try_dot(wt, gm)?;
            // S_i = Σ_{k>i} w_k (c_k · G) (+ T_N (background · G)).
            let v = g.try_mul(d.wts, gc)?;
            let all = g.try_sum(v, &[1], true)?;
            let upto = g.try_cumsum(v, 1)?;
            let mut behind = g.try_sub(all, upto)?;
            let mut dbg = None;
            if with_bg {
                let bg = g.try_reshape(ins[3], &[ch, 1])?;
                let bgg = g.try_dot(gm, bg)?;
                let share = g.try_mul(d.t_end, bgg)?;
                behind = g.try_add(behind, share)?;
                let tg = g.try_mul(d.t_end, gm)?;
                dbg = Some(g.try_sum(tg, &[0], false)?);
            }
            let one = g.try_scalar(1.0, dt)?;
            let zero = g.try_scalar(0.0, dt)?;
            let keep = g.try_sub(one, d.alpha)?;
            let direct = g.try_mul(d.t, gc)?;
            let through = g.try_div(behind, keep)?;
            let da = g.try_sub(direct, through)?;
            let da = g.try_select(d.visible, da, zero)?;
            let da = g.try_select(d.front, da, zero)?;
            let amax = g.try_scalar(ALPHA_MAX, dt)?;
            let free = g.try_compare(CmpOp::Lt, d.g, amax)?;
            let dg = g.try_select(free, da, zero)?;
            let de = g.try_mul(dg, d.e)?;
            let dop = g.try_sum(de, &[0], false)?;
            // dq = -dg · opacity · e / 2.
            let dq = g.try_mul(dg, d.g)?;
            let mhalf = g.try_scalar(-0.5, dt)?;
            let dq = g.try_mul(dq, mhalf)?;
            let two = g.try_scalar(2.0, dt)?;
            let sum = |g: &mut Graph, x: NodeId| -> Result<NodeId> {
                let s = g.try_sum(x, &[0], false)?;
                g.try_reshape(s, &[n, 1])
            };
            let times = |g: &mut Graph, x: NodeId| -> Result<NodeId> {
                let t = g.try_mul(dq, x)?;
                sum(g, t)
            };
            let da_ = times(g, d.dx2)?;
            let dxy2 = g.try_mul(d.dxy, two)?;
            let db = times(g, dxy2)?;
            let dc = times(g, d.dy2)?;
            // d/du = -Σ dq · 2 (a dx + b dy), d/dv = -Σ dq · 2 (b dx + c dy).
            let lin = |g: &mut Graph, k0: NodeId, k1: NodeId| -> Result<NodeId> {
                let x = g.try_mul(k0, d.dx)?;
                let y = g.try_mul(k1, d.dy)?;
                let s = g.try_add(x, y)?;
                let s = g.try_mul(s, two)?;
                let s = times(g, s)?;
                g.try_activation(Activation::Neg, s)
            };
            let du = lin(g, d.a, d.b)?;
            let dv = lin(g, d.b, d.c)?;
            let zeros = g.try_expand(zero, &[n, 1])?;
            let dp = g.try_concat(&[du, dv, da_, db, dc, zeros], 1)?;
            let dp = g.try_reshape(dp, &[6 * n])?;
            let dcol = g.try_reshape(dcol, &[ch * n])?;
            let mut parts = vec![dp, dcol, dop];
            parts.extend(dbg);
            g.try_concat(&parts, 0)
        })())
    }
}

/// The `[P, N]` values of the rasterizer's decomposition (pixels by Gaussians).
struct Dense {
    dx: NodeId,
    dy: NodeId,
    dx2: NodeId,
    dxy: NodeId,
    dy2: NodeId,
    /// The conic's entries, `[N]`.
    a: NodeId,
    b: NodeId,
    c: NodeId,
    /// `exp(-q / 2)` and `opacity · exp(-q / 2)`.
    e: NodeId,
    g: NodeId,
    /// Where the clamped alpha reaches [`ALPHA_MIN`] (`[P, N]`) and the Gaussians in front of
    /// the near plane (`[N]`).
    visible: NodeId,
    front: NodeId,
    /// The alphas after both masks.
    alpha: NodeId,
    /// `T_i` (exclusive) and the weights `alpha · T`.
    t: NodeId,
    wts: NodeId,
    /// `T_N`, `[P, 1]`.
    t_end: NodeId,
}

impl Dense {
    fn new(g: &mut Graph, proj: NodeId, opac: NodeId, h: usize, w: usize) -> Result<Dense> {
        let dt = g.shape(proj).dtype();
        let n = g.shape(opac).numel().unwrap_or(0);
        let pixels = h * w;
        let xs = (0..pixels).map(|p| (p % w) as f64 + 0.5).collect();
        let ys = (0..pixels).map(|p| (p / w) as f64 + 0.5).collect();
        let px = constant(g, &[pixels, 1], xs, dt)?;
        let py = constant(g, &[pixels, 1], ys, dt)?;
        let col = |g: &mut Graph, i: usize| -> Result<NodeId> {
            let c = column(g, proj, i)?;
            g.try_reshape(c, &[n])
        };
        let (u, v, a, b, c, depth) = (
            col(g, 0)?,
            col(g, 1)?,
            col(g, 2)?,
            col(g, 3)?,
            col(g, 4)?,
            col(g, 5)?,
        );
        let dx = g.try_sub(px, u)?;
        let dy = g.try_sub(py, v)?;
        let dx2 = g.try_mul(dx, dx)?;
        let qa = g.try_mul(a, dx2)?;
        let two = g.try_scalar(2.0, dt)?;
        let b2 = g.try_mul(two, b)?;
        let dxy = g.try_mul(dx, dy)?;
        let qb = g.try_mul(b2, dxy)?;
        let dy2 = g.try_mul(dy, dy)?;
        let qc = g.try_mul(c, dy2)?;
        let q = g.try_add(qa, qb)?;
        let q = g.try_add(q, qc)?;
        let mhalf = g.try_scalar(-0.5, dt)?;
        let e = g.try_mul(q, mhalf)?;
        let e = g.try_activation(Activation::Exp, e)?;
        let gv = g.try_mul(opac, e)?;
        let amax = g.try_scalar(ALPHA_MAX, dt)?;
        let al = g.try_minimum(gv, amax)?;
        let amin = g.try_scalar(ALPHA_MIN, dt)?;
        let zero = g.try_scalar(0.0, dt)?;
        let visible = g.try_compare(CmpOp::Ge, al, amin)?;
        let al = g.try_select(visible, al, zero)?;
        let near = g.try_scalar(NEAR, dt)?;
        let front = g.try_compare(CmpOp::Ge, depth, near)?;
        let alpha = g.try_select(front, al, zero)?;
        // T_i = exp(Σ_{j<i} log(1 - alpha_j)).
        let one = g.try_scalar(1.0, dt)?;
        let keep = g.try_sub(one, alpha)?;
        let l = g.try_activation(Activation::Log, keep)?;
        let cs = g.try_cumsum(l, 1)?;
        let before = g.try_sub(cs, l)?;
        let t = g.try_activation(Activation::Exp, before)?;
        let wts = g.try_mul(alpha, t)?;
        let total = g.try_sum(l, &[1], true)?;
        let t_end = g.try_activation(Activation::Exp, total)?;
        Ok(Dense {
            dx,
            dy,
            dx2,
            dxy,
            dy2,
            a,
            b,
            c,
            e,
            g: gv,
            visible,
            front,
            alpha,
            t,
            wts,
            t_end,
        })
    }
}

/// Tiles per pool task: about 64 Ki pixel-Gaussian pairs each.
fn tiles_per_task(bins: &[Vec<u32>]) -> usize {
    let work: usize = bins.iter().map(|b| b.len() * TILE * TILE).sum();
    (bins.len() * (1 << 16) / work.max(1)).max(1)
}

/// The pixels of tile `tile` (`tiles_x` a row) of a `w × h` image.
fn tile_pixels(
    tile: usize,
    tiles_x: usize,
    w: usize,
    h: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let (tx, ty) = (tile % tiles_x, tile / tiles_x);
    (ty * TILE..((ty + 1) * TILE).min(h))
        .flat_map(move |y| (tx * TILE..((tx + 1) * TILE).min(w)).map(move |x| (x, y)))
}

/// The CPU rasterizer: [`Scene::bins`], then each tile's pixels composited in f64 over its own
/// list, tiles split over the pool. A Gaussian left out of a tile has alpha 0 at each of its
/// pixels, so the result is the reference evaluator's.
pub(crate) fn rasterize_kernel(
    r: &Rasterize,
    ins: &[(&[u8], &Shape)],
    out: &mut [u8],
    shape: &Shape,
    pool: &Pool,
) {
    let s = scene_of(ins, ins.len() == 4);
    let (h, w) = (r.height, r.width);
    let bins = s.bins(w, h);
    let tiles_x = w.div_ceil(TILE);
    let dt = shape.dtype();
    let size = dt.size_bytes();
    let dst = Ptr(out.as_mut_ptr());
    par_ranges(pool, bins.len(), tiles_per_task(&bins), |tiles| {
        let mut acc = vec![0.0f64; s.ch];
        for tile in tiles {
            let list = &bins[tile];
            for (x, y) in tile_pixels(tile, tiles_x, w, h) {
                s.pixel(list.iter().map(|&i| i as usize), x, y, &mut acc);
                let at = (y * w + x) * s.ch * size;
                for (k, &v) in acc.iter().enumerate() {
                    // SAFETY: pixel (x, y) is this tile's alone, its `ch` values in bounds of
                    // the [h, w, ch] result (f32 or f64, as `infer` checked).
                    unsafe {
                        let d = dst.get().add(at + k * size);
                        if dt == DType::F64 {
                            std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), d, 8)
                        } else {
                            std::ptr::copy_nonoverlapping((v as f32).to_le_bytes().as_ptr(), d, 4)
                        }
                    }
                }
            }
        }
    });
}

/// The CPU's reverse mode: the same bins, each pool task summing its tiles' pixels into a
/// cotangent vector of its own (pixels in order, each pixel's Gaussians back to front); the
/// tasks' vectors are then added in task order, so a run is deterministic.
pub(crate) fn rasterize_vjp_kernel(
    r: &RasterizeVjp,
    ins: &[(&[u8], &Shape)],
    out: &mut [u8],
    shape: &Shape,
    pool: &Pool,
) {
    let s = scene_of(ins, ins.len() == 5);
    let ct = f64s(ins[ins.len() - 1]);
    let (h, w) = (r.height, r.width);
    let len = shape.numel().unwrap_or(0);
    let bins = s.bins(w, h);
    let tiles_x = w.div_ceil(TILE);
    let parts: Mutex<Vec<(usize, Vec<f64>)>> = Mutex::new(Vec::new());
    par_ranges(pool, bins.len(), tiles_per_task(&bins), |tiles| {
        let first = tiles.start;
        let mut grads = vec![0.0f64; len];
        let mut hits = Vec::new();
        for tile in tiles {
            let list = &bins[tile];
            for (x, y) in tile_pixels(tile, tiles_x, w, h) {
                let at = (y * w + x) * s.ch;
                s.pixel_vjp(
                    list.iter().map(|&i| i as usize),
                    x,
                    y,
                    &ct[at..at + s.ch],
                    &mut hits,
                    &mut grads,
                );
            }
        }
        parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((first, grads));
    });
    let mut parts = parts.into_inner().unwrap_or_else(|e| e.into_inner());
    parts.sort_by_key(|p| p.0);
    let mut total = vec![0.0f64; len];
    for (_, part) in &parts {
        for (t, v) in total.iter_mut().zip(part) {
            *t += v;
        }
    }
    let t = Tensor::from_f64(&[len], shape.dtype(), total);
    out.copy_from_slice(&t.to_bytes());
}

/// The GPU kernels' body (WGSL or CUDA C, by `lang`): one invocation per pixel and channel,
/// compositing every Gaussian front to back in f32 as [`Scene::pixel`] does (the same alpha
/// rule, no tile lists: each pixel visits all `N`). Operand `k`'s address is `addr(k)`, the
/// result's `addr(usize::MAX)`; own words: channels, width, `N`.
fn gpu_body(wgsl: bool, background: bool) -> String {
    let (near, amax, amin) = (NEAR as f32, ALPHA_MAX as f32, ALPHA_MIN as f32);
    let own = if background { 6 } else { 5 };
    if wgsl {
        let f = |a: String| format!("bitcast<f32>(rd({a}))");
        format!(
            "    let ch = mt[{c}];\n    let w = mt[{wd}];\n    let n = mt[{nn}];\n    let pix = i / ch;\n    let c = i % ch;\n    let px = f32(pix % w) + 0.5;\n    let py = f32(pix / w) + 0.5;\n    var t = 1.0;\n    var acc = 0.0;\n    for (var g = 0u; g < n; g++) {{\n        let b = mt[2] + g * 6u;\n        let z = {z};\n        if (z != z || z < {near:?}) {{ continue; }}\n        let dx = px - {x};\n        let dy = py - {y};\n        let q = {a} * dx * dx + 2.0 * {bb} * dx * dy + {cc} * dy * dy;\n        let alpha = min({o} * exp(-0.5 * q), {amax:?});\n        if (alpha < {amin:?}) {{ continue; }}\n        acc += alpha * t * {col};\n        t *= 1.0 - alpha;\n    }}\n{bg}    wr(mt[1] + i, bitcast<u32>(acc));\n",
            c = own, wd = own + 1, nn = own + 2,
            z = f("b + 5u".into()), x = f("b".into()), y = f("b + 1u".into()),
            a = f("b + 2u".into()), bb = f("b + 3u".into()), cc = f("b + 4u".into()),
            o = f("mt[4] + g".into()), col = f("mt[3] + g * ch + c".into()),
            bg = if background { format!("    acc += t * {};\n", f("mt[5] + c".into())) } else { String::new() },
        )
    } else {
        format!(
            "        const i64 ch = m.w[{c}], w = m.w[{wd}], n = m.w[{nn}];\n        const float *p = (const float *)m.w[2];\n        const float *col = (const float *)m.w[3];\n        const float *op = (const float *)m.w[4];\n        const i64 pix = i / ch, c = i % ch;\n        const float px = (float)(pix % w) + 0.5f, py = (float)(pix / w) + 0.5f;\n        float t = 1.0f, acc = 0.0f;\n        for (i64 g = 0; g < n; g++) {{\n            const float *b = p + g * 6;\n            const float z = b[5];\n            if (z != z || z < {near:?}f) continue;\n            const float dx = px - b[0], dy = py - b[1];\n            const float q = b[2] * dx * dx + 2.0f * b[3] * dx * dy + b[4] * dy * dy;\n            const float alpha = fminf(op[g] * expf(-0.5f * q), {amax:?}f);\n            if (alpha < {amin:?}f) continue;\n            acc += alpha * t * col[g * ch + c];\n            t *= 1.0f - alpha;\n        }}\n{bg}        ((float *)m.w[1])[i] = acc;\n",
            c = own, wd = own + 1, nn = own + 2,
            bg = if background { "        acc += t * ((const float *)m.w[5])[c];\n".to_string() } else { String::new() },
        )
    }
}

/// `splat_rasterize`'s operands as the GPU kernels take them: f32 throughout, static shapes.
/// Their own words: channels, width, `N`; the invocations: pixels × channels.
fn gpu_shape(op: &Rasterize, ins: &[&Shape], out: &Shape) -> Option<(Vec<u32>, usize, usize)> {
    if ins.iter().any(|s| s.dtype() != DType::F32) || out.dtype() != DType::F32 {
        return None;
    }
    let n = ins[2].numel()?;
    let ch = *out.static_dims()?.last()?;
    Some((vec![ch as u32, op.width as u32, n as u32], out.numel()?, n))
}

/// The wgpu kernel of `splat_rasterize` (`rlx_wgpu::register_kernel`).
pub(crate) fn wgsl_kernel(
    op: &Rasterize,
    ins: &[&Shape],
    out: &Shape,
) -> Option<rlx_wgpu::WgslKernel> {
    let (words, invocations, n) = gpu_shape(op, ins, out)?;
    Some(rlx_wgpu::WgslKernel {
        body: gpu_body(true, ins.len() == 4),
        words,
        invocations,
        longest_loop: n,
    })
}

/// The CUDA kernel of `splat_rasterize` (`rlx_cuda::register_kernel`).
pub(crate) fn cuda_kernel(
    op: &Rasterize,
    ins: &[&Shape],
    out: &Shape,
) -> Option<rlx_cuda::CudaKernel> {
    let (words, items, _) = gpu_shape(op, ins, out)?;
    Some(rlx_cuda::CudaKernel {
        body: gpu_body(false, ins.len() == 4),
        words: words.into_iter().map(i64::from).collect(),
        items,
    })
}
