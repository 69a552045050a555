//! The discrete Fourier transform along one axis, numpy's `fft`, `ifft`, `rfft` and `irfft`
//! with its default (`"backward"`) normalization: the inverse transforms divide by `n`.
//!
//! One op, [`Fft`], with the kind, the axis and the signal length `n`:
//!
//! | kind | operand | result |
//! |---|---|---|
//! | `fft`, `ifft` | c64, `n` along `axis` | c64, same shape |
//! | `rfft` | f32, `n` along `axis` | c64, `n / 2 + 1` along `axis` |
//! | `irfft` | c64, `n / 2 + 1` along `axis` | f32, `n` along `axis` |
//!
//! Any length (not only powers of two). The builders (`Graph::try_fft` and the rest) take
//! numpy's `n` (cropping or zero-padding the input) and real or complex inputs, and build the
//! 2-D forms and the short-time transforms from this op. The reference evaluator runs the
//! direct sum in f64; the decomposition multiplies by the DFT matrix (for backends without an
//! FFT kernel, up to [`MAX_DECOMPOSED`] points). All four are linear, so the forward-mode rule
//! is the op itself; the reverse-mode rules are JAX's transposes (`fft`'s is `fft`: the DFT
//! matrix is symmetric; `rfft`'s is the real part of an `fft` of the zero-padded cotangent;
//! `irfft`'s is the conjugate of a weighted `rfft`).

use super::batch::Batched;
use super::{check_axis, static_dims, Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::{reduce_groups, Tensor};
use crate::text::Attr;
use crate::{DType, Error, Graph, NodeId, Op, Result, Shape};
use std::f64::consts::PI;

/// Which transform an [`Fft`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FftKind {
    /// Complex to complex, `e^{-2πi jk/n}`.
    Fft,
    /// Complex to complex, `e^{+2πi jk/n} / n`.
    Ifft,
    /// Real to the `n / 2 + 1` non-negative frequencies.
    Rfft,
    /// The `n / 2 + 1` non-negative frequencies of a real signal back to it.
    Irfft,
}

impl FftKind {
    /// Every kind.
    pub const ALL: [FftKind; 4] = [FftKind::Fft, FftKind::Ifft, FftKind::Rfft, FftKind::Irfft];

    /// The kind's name in the text form (numpy's function name).
    pub fn name(self) -> &'static str {
        match self {
            FftKind::Fft => "fft",
            FftKind::Ifft => "ifft",
            FftKind::Rfft => "rfft",
            FftKind::Irfft => "irfft",
        }
    }
}

/// The op: the transform `kind` of length `n` along `axis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fft {
    /// Which transform.
    pub kind: FftKind,
    /// The axis transformed.
    pub axis: usize,
    /// The signal length (the operand's length along `axis`, but for `irfft`, whose operand
    /// holds `n / 2 + 1` frequencies).
    pub n: usize,
}

pub(super) const OP: OpRegistration = OpRegistration {
    name: "fft",
    from_attrs: |a| {
        let kind = a.word("kind", "fft, ifft, rfft, irfft", |w| {
            FftKind::ALL.into_iter().find(|k| k.name() == w)
        })?;
        Ok(DefinedOp::new(Fft {
            kind,
            axis: a.usize("axis")?,
            n: a.usize("n")?,
        }))
    },
    examples: || {
        FftKind::ALL
            .into_iter()
            .flat_map(|kind| {
                [(0, 8), (1, 5)].map(|(axis, n)| DefinedOp::new(Fft { kind, axis, n }))
            })
            .collect()
    },
};

/// The longest transform the decomposition builds a DFT matrix for (its `n²` complex
/// entries; backends with an FFT kernel have no limit).
pub const MAX_DECOMPOSED: usize = 4096;

/// `(operand length, result length)` along the axis for `kind` of length `n`.
fn lengths(kind: FftKind, n: usize) -> (usize, usize) {
    match kind {
        FftKind::Fft | FftKind::Ifft => (n, n),
        FftKind::Rfft => (n, n / 2 + 1),
        FftKind::Irfft => (n / 2 + 1, n),
    }
}

/// `e^{sign 2πi jk/n}` with the angle reduced exactly first (`jk mod n`).
fn twiddle(j: usize, k: usize, n: usize, sign: f64) -> (f64, f64) {
    let a = sign * 2.0 * PI * (((j as u128 * k as u128) % n as u128) as f64) / n as f64;
    (a.cos(), a.sin())
}

/// The weight of frequency `k` of a real signal of length `n` in its inverse: 1 for the mean
/// and (even `n`) the Nyquist frequency, which appear once in the full spectrum, 2 for the
/// others, which appear with their conjugates.
fn hermitian_weight(k: usize, n: usize) -> f64 {
    if k == 0 || 2 * k == n {
        1.0
    } else {
        2.0
    }
}

impl Fft {
    /// One line of the transform, in f64.
    fn line(&self, x: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let n = self.n;
        match self.kind {
            FftKind::Fft | FftKind::Ifft | FftKind::Rfft => {
                let (sign, scale) = match self.kind {
                    FftKind::Ifft => (1.0, 1.0 / n as f64),
                    _ => (-1.0, 1.0),
                };
                (0..lengths(self.kind, n).1)
                    .map(|k| {
                        let (mut re, mut im) = (0.0, 0.0);
                        for (j, &(xr, xi)) in x.iter().enumerate() {
                            let (c, s) = twiddle(j, k, n, sign);
                            re += xr * c - xi * s;
                            im += xr * s + xi * c;
                        }
                        (re * scale, im * scale)
                    })
                    .collect()
            }
            FftKind::Irfft => (0..n)
                .map(|j| {
                    let y: f64 = x
                        .iter()
                        .enumerate()
                        .map(|(k, &(xr, xi))| {
                            let (c, s) = twiddle(j, k, n, 1.0);
                            hermitian_weight(k, n) * (xr * c - xi * s)
                        })
                        .sum();
                    (y / n as f64, 0.0)
                })
                .collect(),
        }
    }

    /// The same transform along `axis`.
    fn along(&self, axis: usize) -> Op {
        Op::defined(Fft { axis, ..*self })
    }

    /// The DFT-matrix form appended to `g` (see [`MAX_DECOMPOSED`]).
    fn dft_matrix(&self, g: &mut Graph, x: NodeId) -> Result<NodeId> {
        let (n, (len_in, len_out)) = (self.n, lengths(self.kind, self.n));
        if n > MAX_DECOMPOSED {
            return Err(Error::op(
                OP.name,
                format!(
                    "a {} of length {n} has no decomposition (its DFT matrix is limited to {MAX_DECOMPOSED} points); run it on a backend with an FFT kernel",
                    self.kind.name()
                ),
            ));
        }
        // Move the axis last and the rest into rows: [rows, len_in].
        let dims = super::ad::dims(g, x);
        let rank = dims.len();
        let mut perm: Vec<usize> = (0..rank).filter(|&a| a != self.axis).collect();
        perm.push(self.axis);
        let xt = g.try_transpose(x, &perm)?;
        let rows: usize = perm[..rank - 1].iter().map(|&a| dims[a]).product();
        let x2 = g.try_reshape(xt, &[rows, len_in])?;
        let f32s = |v: &mut dyn Iterator<Item = f64>| -> Vec<u8> {
            v.flat_map(|x| (x as f32).to_le_bytes()).collect()
        };
        let matrix = |g: &mut Graph, f: &dyn Fn(usize, usize) -> f64| {
            let data = f32s(&mut (0..len_in * len_out).map(|i| f(i / len_out, i % len_out)));
            g.try_constant_bytes(Shape::new(&[len_in, len_out], DType::F32), data)
        };
        let y2 = match self.kind {
            FftKind::Fft | FftKind::Ifft => {
                let (sign, scale) = if self.kind == FftKind::Ifft {
                    (1.0, 1.0 / n as f64)
                } else {
                    (-1.0, 1.0)
                };
                let data: Vec<u8> = (0..n * n)
                    .flat_map(|i| {
                        let (c, s) = twiddle(i / n, i % n, n, sign);
                        [c * scale, s * scale]
                    })
                    .flat_map(|v| (v as f32).to_le_bytes())
                    .collect();
                let w = g.try_constant_bytes(Shape::new(&[n, n], DType::C64), data)?;
                g.try_op(Op::MatMul, &[x2, w])?
            }
            FftKind::Rfft => {
                let c = matrix(g, &|j, k| twiddle(j, k, n, -1.0).0)?;
                let s = matrix(g, &|j, k| twiddle(j, k, n, -1.0).1)?;
                let re = g.try_op(Op::MatMul, &[x2, c])?;
                let im = g.try_op(Op::MatMul, &[x2, s])?;
                g.try_complex(re, im)?
            }
            FftKind::Irfft => {
                let w = |k: usize| hermitian_weight(k, n) / n as f64;
                let a = matrix(g, &|k, j| w(k) * twiddle(j, k, n, 1.0).0)?;
                let b = matrix(g, &|k, j| -w(k) * twiddle(j, k, n, 1.0).1)?;
                let re = g.try_real(x2)?;
                let im = g.try_imag(x2)?;
                let yr = g.try_op(Op::MatMul, &[re, a])?;
                let yi = g.try_op(Op::MatMul, &[im, b])?;
                g.try_add(yr, yi)?
            }
        };
        let mut od: Vec<usize> = perm[..rank - 1].iter().map(|&a| dims[a]).collect();
        od.push(len_out);
        let y = g.try_reshape(y2, &od)?;
        let mut inv = vec![0; rank];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        g.try_transpose(y, &inv)
    }
}

/// `x` cropped or zero-padded to length `n` along `axis` (numpy's `n` argument).
fn resize(g: &mut Graph, x: NodeId, axis: usize, n: usize) -> Result<NodeId> {
    let mut dims = super::ad::dims(g, x);
    let cur = dims[axis];
    if cur > n {
        g.try_narrow(x, axis, 0, n)
    } else if cur < n {
        dims[axis] = n - cur;
        let z = g.try_scalar(0.0, g.shape(x).dtype())?;
        let z = g.try_expand(z, &dims)?;
        g.try_concat(&[x, z], axis)
    } else {
        Ok(x)
    }
}

/// `x` as `dt` (a no-op when it is already) for the transform `what`. The transforms compute
/// in f32 parts (c64): a 64-bit operand (f64, i64) is refused rather than narrowed silently.
fn as_dtype(g: &mut Graph, x: NodeId, dt: DType, what: &str) -> Result<NodeId> {
    let from = g.shape(x).dtype();
    if matches!(from, DType::F64 | DType::I64) {
        return Err(Error::op(
            what,
            format!(
                "operand {} is 64-bit, but the transforms compute in c64 (f32 parts; there is \
                 no c128): cast it to f32 first to accept the narrowing",
                g.shape(x)
            ),
        ));
    }
    if from == dt {
        Ok(x)
    } else {
        g.try_cast(x, dt)
    }
}

/// The axis of a builder call, checked.
fn axis_of(g: &Graph, x: NodeId, axis: usize, what: &str) -> Result<usize> {
    check_axis(what, axis, g.shape(x))?;
    Ok(axis)
}

impl Graph {
    /// numpy's `fft(x, n, axis)`: a real `x` is taken as complex; `n` (default: the length
    /// along `axis`) crops or zero-pads it.
    pub fn try_fft(&mut self, x: NodeId, axis: usize, n: Option<usize>) -> Result<NodeId> {
        self.complex_transform(FftKind::Fft, x, axis, n)
    }

    /// numpy's `ifft(x, n, axis)`.
    pub fn try_ifft(&mut self, x: NodeId, axis: usize, n: Option<usize>) -> Result<NodeId> {
        self.complex_transform(FftKind::Ifft, x, axis, n)
    }

    fn complex_transform(
        &mut self,
        kind: FftKind,
        x: NodeId,
        axis: usize,
        n: Option<usize>,
    ) -> Result<NodeId> {
        let axis = axis_of(self, x, axis, kind.name())?;
        let x = as_dtype(self, x, DType::C64, kind.name())?;
        let n = n.unwrap_or(super::ad::dims(self, x)[axis]);
        let x = resize(self, x, axis, n)?;
        self.try_op(Op::defined(Fft { kind, axis, n }), &[x])
    }

    /// numpy's `rfft(x, n, axis)`: the `n / 2 + 1` non-negative frequencies of real `x`
    /// (taken as f32).
    pub fn try_rfft(&mut self, x: NodeId, axis: usize, n: Option<usize>) -> Result<NodeId> {
        let axis = axis_of(self, x, axis, "rfft")?;
        if self.shape(x).dtype() == DType::C64 {
            return Err(Error::op(
                "rfft",
                format!("needs a real operand, got {}", self.shape(x)),
            ));
        }
        let x = as_dtype(self, x, DType::F32, "rfft")?;
        let n = n.unwrap_or(super::ad::dims(self, x)[axis]);
        let x = resize(self, x, axis, n)?;
        self.try_op(
            Op::defined(Fft {
                kind: FftKind::Rfft,
                axis,
                n,
            }),
            &[x],
        )
    }

    /// numpy's `irfft(x, n, axis)`: the real signal of length `n` (default `2 (m - 1)` for
    /// `m` frequencies along `axis`) whose `rfft` is `x`; `x` is cropped or zero-padded to
    /// `n / 2 + 1` frequencies, and the imaginary parts of the mean and the Nyquist frequency
    /// are ignored.
    pub fn try_irfft(&mut self, x: NodeId, axis: usize, n: Option<usize>) -> Result<NodeId> {
        let axis = axis_of(self, x, axis, "irfft")?;
        let x = as_dtype(self, x, DType::C64, "irfft")?;
        let m = super::ad::dims(self, x)[axis];
        let n = n.unwrap_or(2 * m.saturating_sub(1));
        if n == 0 {
            return Err(Error::op(
                "irfft",
                format!("the output length must be positive; {m} frequencies give none (pass n)"),
            ));
        }
        let x = resize(self, x, axis, n / 2 + 1)?;
        self.try_op(
            Op::defined(Fft {
                kind: FftKind::Irfft,
                axis,
                n,
            }),
            &[x],
        )
    }

    /// numpy's `fft2`: `fft` over the last two axes.
    pub fn try_fft2(&mut self, x: NodeId) -> Result<NodeId> {
        let r = self.shape(x).rank();
        let inner = self.try_fft(x, r.saturating_sub(1), None)?;
        self.try_fft(inner, r.saturating_sub(2), None)
    }

    /// numpy's `ifft2`: `ifft` over the last two axes.
    pub fn try_ifft2(&mut self, x: NodeId) -> Result<NodeId> {
        let r = self.shape(x).rank();
        let inner = self.try_ifft(x, r.saturating_sub(1), None)?;
        self.try_ifft(inner, r.saturating_sub(2), None)
    }

    /// numpy's `rfft2`: `rfft` over the last axis, then `fft` over the one before.
    pub fn try_rfft2(&mut self, x: NodeId) -> Result<NodeId> {
        let r = self.shape(x).rank();
        let inner = self.try_rfft(x, r.saturating_sub(1), None)?;
        self.try_fft(inner, r.saturating_sub(2), None)
    }

    /// numpy's `irfft2(x, s)`: `ifft` over the second-to-last axis, then `irfft` over the last
    /// (`s`: the output's last two lengths; default: the second-to-last as it is and
    /// `2 (m - 1)` for the last).
    pub fn try_irfft2(&mut self, x: NodeId, s: Option<(usize, usize)>) -> Result<NodeId> {
        let r = self.shape(x).rank();
        let inner = self.try_ifft(x, r.saturating_sub(2), s.map(|s| s.0))?;
        self.try_irfft(inner, r.saturating_sub(1), s.map(|s| s.1))
    }
}

impl Graph {
    /// The short-time Fourier transform of `x [..., T]`: frames of `n_fft` samples every `hop`
    /// (no padding: `F = 1 + (T - n_fft) / hop` frames), each times `window` (`[n_fft]` f32;
    /// `None`: rectangular), transformed by `rfft`. Result c64 `[..., F, n_fft / 2 + 1]`
    /// (frames first; `torch.stft(center=False)` puts frequencies first).
    pub fn try_stft(
        &mut self,
        x: NodeId,
        n_fft: usize,
        hop: usize,
        window: Option<NodeId>,
    ) -> Result<NodeId> {
        let (frames, _) = frame_layout(self, x, n_fft, hop, "stft")?;
        let idx = frame_indices(self, frames, n_fft, hop)?;
        let x = as_dtype(self, x, DType::F32, "stft")?;
        let last = self.shape(x).rank() - 1;
        let framed = self.try_gather(x, idx, last)?;
        let framed = match window {
            Some(w) => {
                check_window(self, w, n_fft, "stft")?;
                self.try_mul(framed, w)?
            }
            None => framed,
        };
        let r = self.shape(framed).rank();
        self.try_rfft(framed, r - 1, None)
    }

    /// The inverse of [`Graph::try_stft`] by weighted overlap-add: each frame's `irfft` times
    /// `window`, summed into place and divided by the summed squared window (the least-squares
    /// inverse of `scipy.signal.istft` / `torch.istft`; samples no frame covers are 0). `z` is
    /// c64 `[..., F, n_fft / 2 + 1]`; the result f32 `[..., (F - 1) hop + n_fft]`.
    pub fn try_istft(
        &mut self,
        z: NodeId,
        n_fft: usize,
        hop: usize,
        window: Option<NodeId>,
    ) -> Result<NodeId> {
        let dims = super::ad::dims(self, z);
        if dims.len() < 2 || hop == 0 || n_fft == 0 || dims[dims.len() - 1] != n_fft / 2 + 1 {
            return Err(Error::op(
                "istft",
                format!(
                    "needs [..., frames, {}] frequencies of frames of {n_fft} samples and a positive hop ({hop}), got {}",
                    n_fft / 2 + 1,
                    self.shape(z)
                ),
            ));
        }
        let r = dims.len();
        let frames = dims[r - 2];
        let len = (frames - 1) * hop + n_fft;
        let y = self.try_irfft(z, r - 1, Some(n_fft))?;
        let (y, w2) = match window {
            Some(w) => {
                check_window(self, w, n_fft, "istft")?;
                let w2 = self.try_mul(w, w)?;
                (self.try_mul(y, w)?, w2)
            }
            None => {
                let one = self.try_scalar(1.0, DType::F32)?;
                (y, self.try_expand(one, &[n_fft])?)
            }
        };
        let idx = frame_indices(self, frames, n_fft, hop)?;
        let flat_idx = self.try_reshape(idx, &[frames * n_fft])?;
        let mut flat = dims[..r - 2].to_vec();
        flat.push(frames * n_fft);
        let y = self.try_reshape(y, &flat)?;
        let mut od = dims[..r - 2].to_vec();
        od.push(len);
        let zero = self.try_scalar(0.0, DType::F32)?;
        let acc = self.try_expand(zero, &od)?;
        let sum = self.try_scatter_add(acc, flat_idx, y, r - 2)?;
        // The summed squared window, a [len] vector.
        let w2 = self.try_expand(w2, &[frames, n_fft])?;
        let w2 = self.try_reshape(w2, &[frames * n_fft])?;
        let wz = self.try_expand(zero, &[len])?;
        let wsum = self.try_scatter_add(wz, flat_idx, w2, 0)?;
        let tiny = self.try_scalar(1e-11, DType::F32)?;
        let covered = self.try_compare(crate::CmpOp::Gt, wsum, tiny)?;
        let one = self.try_scalar(1.0, DType::F32)?;
        let safe = self.try_op(Op::Where, &[covered, wsum, one])?;
        let y = self.try_div(sum, safe)?;
        self.try_op(Op::Where, &[covered, y, zero])
    }
}

/// Frames of `n_fft` every `hop` in the last axis of `x`: `(frames, length)`, checked.
fn frame_layout(
    g: &Graph,
    x: NodeId,
    n_fft: usize,
    hop: usize,
    what: &str,
) -> Result<(usize, usize)> {
    let dims = super::ad::dims(g, x);
    let t = dims.last().copied().unwrap_or(0);
    if hop == 0 || n_fft == 0 || t < n_fft || g.shape(x).dtype() == DType::C64 {
        return Err(Error::op(
            what,
            format!(
                "needs a real signal [..., T] with T >= n_fft = {n_fft} and a positive hop ({hop}), got {}",
                g.shape(x)
            ),
        ));
    }
    Ok((1 + (t - n_fft) / hop, t))
}

/// `[frames, n_fft]` i32 sample positions: frame `f`, sample `k` at `f hop + k`.
fn frame_indices(g: &mut Graph, frames: usize, n_fft: usize, hop: usize) -> Result<NodeId> {
    let data: Vec<u8> = (0..frames * n_fft)
        .flat_map(|i| (((i / n_fft) * hop + i % n_fft) as i32).to_le_bytes())
        .collect();
    g.try_constant_bytes(Shape::new(&[frames, n_fft], DType::I32), data)
}

fn check_window(g: &Graph, w: NodeId, n_fft: usize, what: &str) -> Result<()> {
    let s = g.shape(w);
    if s.dtype() != DType::F32 || s.static_dims() != Some(vec![n_fft]) {
        return Err(Error::op(
            what,
            format!("the window must be f32[{n_fft}], got {s}"),
        ));
    }
    Ok(())
}

impl OpDef for Fft {
    fn name(&self) -> &'static str {
        OP.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("kind", Attr::word(self.kind.name())),
            ("axis", Attr::Int(self.axis as u64)),
            ("n", Attr::Int(self.n as u64)),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let x = ins[0];
        let name = self.kind.name();
        check_axis(name, self.axis, x)?;
        if self.n == 0 {
            return Err(Error::op(name, "the length n must be positive"));
        }
        let (len_in, len_out) = lengths(self.kind, self.n);
        let (want, out_dt) = match self.kind {
            FftKind::Rfft => (DType::F32, DType::C64),
            FftKind::Irfft => (DType::C64, DType::F32),
            FftKind::Fft | FftKind::Ifft => (DType::C64, DType::C64),
        };
        if x.dtype() != want {
            return Err(Error::op(
                name,
                format!("needs a {want} operand, got {x} (the builders cast)"),
            ));
        }
        let mut d = static_dims(name, "operand", x)?;
        if d[self.axis] != len_in {
            return Err(Error::op(
                name,
                format!(
                    "a transform of length {} needs {len_in} values along axis {}, operand {x} has {}",
                    self.n, self.axis, d[self.axis]
                ),
            ));
        }
        d[self.axis] = len_out;
        Ok(Shape::new(&d, out_dt))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let od = static_dims(OP.name, "result", out)?;
        let x = ins[0].complex();
        let mut y = vec![(0.0, 0.0); od.iter().product()];
        let lines_in = reduce_groups(ins[0].dims(), &[self.axis]);
        let lines_out = reduce_groups(&od, &[self.axis]);
        for (li, lo) in lines_in.iter().zip(&lines_out) {
            let line: Vec<(f64, f64)> = li.iter().map(|&i| x[i]).collect();
            for (&o, v) in lo.iter().zip(self.line(&line)) {
                y[o] = v;
            }
        }
        Ok(match out.dtype() {
            DType::C64 => Tensor::from_complex(&od, y),
            dt => Tensor::from_f64(&od, dt, y.into_iter().map(|(r, _)| r).collect()),
        })
    }

    /// `5 n log2 n` per line (the radix-2 count), reading and writing each value once.
    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let n = self.n.max(2) as f64;
        let lines = out
            .static_dims()
            .map_or(1, |d| d.iter().product::<usize>() / d[self.axis].max(1))
            as f64;
        Cost::streaming(ins, out, 0).with_flops((5.0 * n * n.log2() * lines) as u64)
    }

    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some(self.dft_matrix(g, ins[0]))
    }

    fn has_ad_rules(&self) -> bool {
        true
    }

    fn vjp(
        &self,
        g: &mut Graph,
        _: &[NodeId],
        _: NodeId,
        ct: NodeId,
    ) -> Result<Vec<Option<NodeId>>> {
        let (axis, n) = (self.axis, self.n);
        let d = match self.kind {
            // The DFT matrix (and its inverse) is symmetric.
            FftKind::Fft | FftKind::Ifft => g.try_op(Op::defined(*self), &[ct])?,
            // real(fft(ct padded to n))
            FftKind::Rfft => {
                let padded = resize(g, ct, axis, n)?;
                let f = g.try_op(
                    Op::defined(Fft {
                        kind: FftKind::Fft,
                        axis,
                        n,
                    }),
                    &[padded],
                )?;
                g.try_real(f)?
            }
            // conj(w * rfft(ct)) / n, w the Hermitian weights
            FftKind::Irfft => {
                let f = g.try_op(
                    Op::defined(Fft {
                        kind: FftKind::Rfft,
                        axis,
                        n,
                    }),
                    &[ct],
                )?;
                let m = n / 2 + 1;
                let w: Vec<u8> = (0..m)
                    .flat_map(|k| ((hermitian_weight(k, n) / n as f64) as f32).to_le_bytes())
                    .collect();
                let rank = g.shape(ct).rank();
                let mut wd = vec![1; rank];
                wd[axis] = m;
                let w = g.try_constant_bytes(Shape::new(&wd, DType::F32), w)?;
                let (re, im) = (g.try_real(f)?, g.try_imag(f)?);
                let re = g.try_mul(re, w)?;
                let im = g.try_mul(im, w)?;
                let im = g.try_activation(crate::Activation::Neg, im)?;
                g.try_complex(re, im)?
            }
        };
        Ok(vec![Some(d)])
    }

    fn jvp(
        &self,
        g: &mut Graph,
        _: &[NodeId],
        _: NodeId,
        t: &[Option<NodeId>],
    ) -> Result<Option<NodeId>> {
        t[0].map(|t| g.try_op(Op::defined(*self), &[t])).transpose()
    }

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    /// The same transform with the axis moved past the batch axis.
    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        let bd = b.bds[0];
        let axis = match bd {
            Some(bd) if bd <= self.axis => self.axis + 1,
            _ => self.axis,
        };
        Ok((g.try_op(self.along(axis), &[b.ins[0]])?, bd))
    }

    fn precision_class(&self) -> super::OpClass {
        super::OpClass::Fixed
    }
}
