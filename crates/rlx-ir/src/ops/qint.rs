//! The int8 integer ops that post-training quantization folds a float graph into
//! (`rlx_opt::quant::quant_propagate`), with the semantics of TFLite's reference int8 kernels
//! and CMSIS-NN: int8 × int8 products summed in `i32` with an `i32` bias, then requantized to
//! int8 by a fixed-point multiplier and shift ([`crate::quant::fixed`]), offset by the result's
//! zero point and clamped to `[lo, hi]` (the int8 range, or a fused ReLU's). Weights are
//! symmetric (zero point 0), per output channel; activations carry a zero point.
//!
//! | op | operands | result |
//! |---|---|---|
//! | `qlinear` | `x i8 [..., K]`, `w i8 [N, K]`, `bias i32 [N]`, `multiplier i32 [N]`, `shift i32 [N]` | `i8 [..., N]` |
//! | `qconv2d` | `x i8 [B, C, H, W]`, `w i8 [O, C, KH, KW]`, `bias`, `multiplier`, `shift` `i32 [O]` | `i8 [B, O, H', W']` |
//! | `qadd` | `a i8`, `b i8` of one shape | `i8`, that shape |
//! | `qpool` | `x i8 [B, C, H, W]` | `i8 [B, C, H', W']` |
//!
//! `qconv2d` pads with the input's zero point (padding adds nothing to a sum); `qpool` leaves
//! padding out of its max and mean (the mean divides by the window's real elements, rounding
//! half away from zero). `qadd` rescales both operands to a shared scale with 20 bits of
//! headroom, adds, and requantizes the sum (TFLite's int8 `ADD`). The ops are primitives: the
//! reference evaluator and the CPU run them (and the Cortex-M and FPGA writers emit them); other
//! backends refuse them by name. Their results are integers, so no derivative flows through
//! them.

use super::batch::Batched;
use super::{static_dims, Cost, DefinedOp, OpDef, OpRegistration};
use crate::eval::Tensor;
use crate::quant::fixed;
use crate::text::{Attr, Attrs};
use crate::{DType, Error, Graph, NodeId, Op, PoolKind, Result, Shape};

/// The left shift `qadd` gives both operands before rescaling them (TFLite's `left_shift`).
pub const QADD_LEFT_SHIFT: i32 = 20;

/// The requantization every op but `qpool` ends with: zero point and clamp of the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QOut {
    /// The result's zero point.
    pub zero_point: i32,
    /// The clamp's low end (`-128`, or the zero point for a fused ReLU).
    pub lo: i32,
    /// The clamp's high end.
    pub hi: i32,
}

impl QOut {
    /// No activation: the whole int8 range.
    pub fn plain(zero_point: i32) -> QOut {
        QOut {
            zero_point,
            lo: -128,
            hi: 127,
        }
    }

    fn check(&self, op: &str) -> Result<()> {
        check_zero_point(op, "result", self.zero_point)?;
        if !(-128..=127).contains(&self.lo) || !(-128..=127).contains(&self.hi) || self.lo > self.hi
        {
            return Err(Error::op(
                op,
                format!(
                    "clamp [{}, {}] must be an ordered range within [-128, 127]",
                    self.lo, self.hi
                ),
            ));
        }
        Ok(())
    }

    fn attrs(&self) -> [(&'static str, Attr); 3] {
        [
            ("out_zero_point", (self.zero_point as i64).into()),
            ("lo", (self.lo as i64).into()),
            ("hi", (self.hi as i64).into()),
        ]
    }

    fn parse(a: &mut Attrs) -> Result<QOut> {
        Ok(QOut {
            zero_point: small(a, "out_zero_point")?,
            lo: small(a, "lo")?,
            hi: small(a, "hi")?,
        })
    }
}

fn small(a: &mut Attrs, key: &str) -> Result<i32> {
    let v = a.i64(key)?;
    i32::try_from(v)
        .map_err(|_| Error::op("qint", format!("attribute `{key}` = {v} does not fit i32")))
}

fn check_zero_point(op: &str, what: &str, zp: i32) -> Result<()> {
    if !(-128..=127).contains(&zp) {
        return Err(Error::op(
            op,
            format!("{what} zero point {zp} is outside the int8 range [-128, 127]"),
        ));
    }
    Ok(())
}

fn check_shift(op: &str, what: &str, shift: i64) -> Result<i32> {
    if !(fixed::MIN_SHIFT as i64..=fixed::MAX_SHIFT as i64).contains(&shift) {
        return Err(Error::op(
            op,
            format!(
                "{what} shift {shift} is outside [{}, {}]",
                fixed::MIN_SHIFT,
                fixed::MAX_SHIFT
            ),
        ));
    }
    Ok(shift as i32)
}

fn require(op: &str, what: &str, s: &Shape, dt: DType) -> Result<Vec<usize>> {
    if s.dtype() != dt {
        return Err(Error::op(op, format!("{what} must be {dt}, got {s}")));
    }
    static_dims(op, what, s)
}

/// The dims of a product's `x` and weight (int8 both), its zero points and clamp checked.
fn product_operands(
    op: &str,
    x_zp: i32,
    out: QOut,
    ins: &[&Shape],
) -> Result<(Vec<usize>, Vec<usize>)> {
    check_zero_point(op, "input", x_zp)?;
    out.check(op)?;
    Ok((
        require(op, "x", ins[0], DType::I8)?,
        require(op, "weight", ins[1], DType::I8)?,
    ))
}

/// Check `bias`, `multiplier` and `shift` (operands 2..5): `i32 [n]` each.
fn check_channels(op: &str, ins: &[&Shape], n: usize) -> Result<()> {
    for (what, s) in ["bias", "multiplier", "shift"].iter().zip(&ins[2..5]) {
        let d = require(op, what, s, DType::I32)?;
        if d != [n] {
            return Err(Error::op(
                op,
                format!("{what} must be i32 [{n}] (one per output channel), got {s}"),
            ));
        }
    }
    Ok(())
}

/// Per output channel: `(bias, multiplier, shift)`, shifts checked.
fn channels(op: &str, ins: &[&Tensor]) -> Result<Vec<(i32, i32, i32)>> {
    let (b, m, s) = (ins[2].i64s(), ins[3].i64s(), ins[4].i64s());
    b.iter()
        .zip(&m)
        .zip(&s)
        .enumerate()
        .map(|(c, ((&b, &m), &s))| {
            Ok((
                b as i32,
                m as i32,
                check_shift(op, &format!("channel {c}'s"), s)?,
            ))
        })
        .collect()
}

/// The derivative rules of an op with integer operands and result: none flows through it.
macro_rules! no_derivatives {
    () => {
        fn has_ad_rules(&self) -> bool {
            true
        }

        fn vjp(
            &self,
            _: &mut Graph,
            ins: &[NodeId],
            _: NodeId,
            _: NodeId,
        ) -> Result<Vec<Option<NodeId>>> {
            Ok(vec![None; ins.len()])
        }

        fn jvp(
            &self,
            _: &mut Graph,
            _: &[NodeId],
            _: NodeId,
            _: &[Option<NodeId>],
        ) -> Result<Option<NodeId>> {
            Ok(None)
        }
    };
}

/// Batch an op whose weights (or requantization operands) differ per example: the op applied
/// to each example's operands and the results stacked.
fn batch_per_example(g: &mut Graph, b: &Batched, op: Op) -> Result<(NodeId, Option<usize>)> {
    let mut outs = Vec::with_capacity(b.size);
    for i in 0..b.size {
        let mut ins = Vec::with_capacity(b.ins.len());
        for (&x, bd) in b.ins.iter().zip(b.bds) {
            ins.push(match *bd {
                None => x,
                Some(axis) => {
                    let mut d = g.shape(x).static_dims().unwrap_or_default();
                    let one = g.try_narrow(x, axis, i, 1)?;
                    d.remove(axis);
                    g.try_reshape(one, &d)?
                }
            });
        }
        let y = g.try_op(op.clone(), &ins)?;
        let mut d = vec![1];
        d.extend(g.shape(y).static_dims().unwrap_or_default());
        outs.push(g.try_reshape(y, &d)?);
    }
    Ok((g.try_concat(&outs, 0)?, Some(0)))
}

/// Batch an op over `[B, C, H, W]` inputs by folding the batch into `B`.
fn batch_nchw(g: &mut Graph, b: &Batched, op: Op) -> Result<(NodeId, Option<usize>)> {
    let x = b.front(g, 0)?;
    let d = g.shape(x).static_dims().unwrap_or_default();
    let folded = g.try_reshape(x, &[d[0] * d[1], d[2], d[3], d[4]])?;
    let mut ins = vec![folded];
    ins.extend_from_slice(&b.ins[1..]);
    let y = g.try_op(op, &ins)?;
    let yd = g.shape(y).static_dims().unwrap_or_default();
    Ok((
        g.try_reshape(y, &[d[0], d[1], yd[1], yd[2], yd[3]])?,
        Some(0),
    ))
}

/// `int8 x [..., K]` times the transpose of `int8 w [N, K]`, plus `bias`, requantized per
/// output channel (TFLite's int8 `FULLY_CONNECTED`, CMSIS-NN's `arm_fully_connected_s8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QLinear {
    /// The input's zero point (subtracted from every `x` before the product).
    pub x_zero_point: i32,
    /// The result's zero point and clamp.
    pub out: QOut,
}

pub(super) const QLINEAR: OpRegistration = OpRegistration {
    name: "qlinear",
    from_attrs: |a| {
        Ok(DefinedOp::new(QLinear {
            x_zero_point: small(a, "x_zero_point")?,
            out: QOut::parse(a)?,
        }))
    },
    examples: || {
        vec![
            DefinedOp::new(QLinear {
                x_zero_point: -128,
                out: QOut::plain(3),
            }),
            DefinedOp::new(QLinear {
                x_zero_point: 5,
                out: QOut {
                    zero_point: -7,
                    lo: -7,
                    hi: 127,
                },
            }),
        ]
    },
};

impl OpDef for QLinear {
    fn name(&self) -> &'static str {
        QLINEAR.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        let mut a = vec![("x_zero_point", (self.x_zero_point as i64).into())];
        a.extend(self.out.attrs());
        a
    }

    fn arity(&self) -> (usize, usize) {
        (5, 5)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let op = QLINEAR.name;
        let (xd, wd) = product_operands(op, self.x_zero_point, self.out, ins)?;
        let (Some(&k), &[n, kw]) = (xd.last(), &wd[..]) else {
            return Err(Error::op(
                op,
                format!(
                    "x must be i8 [..., K] and the weight i8 [N, K], got {} and {}",
                    ins[0], ins[1]
                ),
            ));
        };
        if k != kw {
            return Err(Error::op(
                op,
                format!(
                    "x {} has K = {k} but the weight {} has K = {kw}",
                    ins[0], ins[1]
                ),
            ));
        }
        check_channels(op, ins, n)?;
        let mut d = xd.clone();
        *d.last_mut().unwrap_or(&mut 0) = n;
        Ok(Shape::new(&d, DType::I8))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let ch = channels(QLINEAR.name, ins)?;
        let (x, w) = (ins[0].i64s(), ins[1].i64s());
        let n = ch.len();
        let k = ins[1].dims()[1];
        let rows = x
            .len()
            .checked_div(k)
            .unwrap_or(out.numel().unwrap_or(0) / n.max(1));
        let mut y = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let xr = &x[r * k..(r + 1) * k];
            for (c, &(bias, m, s)) in ch.iter().enumerate() {
                let wr = &w[c * k..(c + 1) * k];
                let acc = xr
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| (a - self.x_zero_point as i64) * b)
                    .sum::<i64>()
                    + bias as i64;
                y.push(requant(acc, m, s, self.out));
            }
        }
        Ok(Tensor::from_i64(
            &out.static_dims().unwrap_or_default(),
            DType::I8,
            y,
        ))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let k = ins[1].static_dims().map_or(0, |d| d[1]) as u64;
        Cost::streaming(ins, out, 2 * k + 4)
    }

    no_derivatives!();

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    /// A batched input only: the batch in front (more rows). Batched weights: per example.
    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        if b.bds[1..].iter().any(Option::is_some) {
            return batch_per_example(g, b, Op::defined(*self));
        }
        let x = b.front(g, 0)?;
        let mut ins = vec![x];
        ins.extend_from_slice(&b.ins[1..]);
        Ok((g.try_op(Op::defined(*self), &ins)?, Some(0)))
    }
}

/// The accumulator (wrapped to `i32`, as the kernels accumulate) requantized.
fn requant(acc: i64, m: i32, s: i32, out: QOut) -> i64 {
    fixed::requantize(acc as i32, m, s, out.zero_point, out.lo, out.hi) as i64
}

/// A 2-D int8 convolution, channels first (TFLite's int8 `CONV_2D` in NCHW, CMSIS-NN's
/// `arm_convolve_s8`): no dilation or groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QConv2d {
    /// Stride `[sh, sw]`.
    pub stride: [usize; 2],
    /// Padding `[(top, bottom), (left, right)]`, with the input's zero point.
    pub padding: [(usize, usize); 2],
    /// The input's zero point.
    pub x_zero_point: i32,
    /// The result's zero point and clamp.
    pub out: QOut,
}

fn two<T: Copy>(op: &str, key: &str, v: Vec<T>) -> Result<[T; 2]> {
    <[T; 2]>::try_from(v).map_err(|v| {
        Error::op(
            op,
            format!(
                "attribute `{key}` must hold 2 entries (height, width), got {}",
                v.len()
            ),
        )
    })
}

pub(super) const QCONV2D: OpRegistration = OpRegistration {
    name: "qconv2d",
    from_attrs: |a| {
        Ok(DefinedOp::new(QConv2d {
            stride: two("qconv2d", "stride", a.usizes("stride")?)?,
            padding: two("qconv2d", "padding", a.pairs("padding")?)?,
            x_zero_point: small(a, "x_zero_point")?,
            out: QOut::parse(a)?,
        }))
    },
    examples: || {
        vec![
            DefinedOp::new(QConv2d {
                stride: [1, 1],
                padding: [(1, 1), (1, 1)],
                x_zero_point: -128,
                out: QOut::plain(0),
            }),
            DefinedOp::new(QConv2d {
                stride: [2, 1],
                padding: [(0, 1), (2, 0)],
                x_zero_point: 3,
                out: QOut {
                    zero_point: -20,
                    lo: -20,
                    hi: 100,
                },
            }),
        ]
    },
};

/// The spatial result length of a window of `k` at `stride` over `n` padded by `(lo, hi)`.
fn spatial_out(n: usize, k: usize, stride: usize, (lo, hi): (usize, usize)) -> Option<usize> {
    let padded = n + lo + hi;
    (stride > 0 && k > 0 && padded >= k).then(|| (padded - k) / stride + 1)
}

impl OpDef for QConv2d {
    fn name(&self) -> &'static str {
        QCONV2D.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        let mut a = vec![
            (
                "stride",
                Attr::List(self.stride.iter().map(|&s| s.into()).collect()),
            ),
            ("padding", Attr::pairs(&self.padding)),
            ("x_zero_point", (self.x_zero_point as i64).into()),
        ];
        a.extend(self.out.attrs());
        a
    }

    fn arity(&self) -> (usize, usize) {
        (5, 5)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let op = QCONV2D.name;
        let (xd, wd) = product_operands(op, self.x_zero_point, self.out, ins)?;
        let (&[b, c, h, w], &[o, cw, kh, kw]) = (&xd[..], &wd[..]) else {
            return Err(Error::op(
                op,
                format!(
                    "x must be i8 [B, C, H, W] and the weight i8 [O, C, KH, KW], got {} and {}",
                    ins[0], ins[1]
                ),
            ));
        };
        if c != cw {
            return Err(Error::op(
                op,
                format!(
                    "x {} has {c} channels but the weight {} takes {cw}",
                    ins[0], ins[1]
                ),
            ));
        }
        check_channels(op, ins, o)?;
        let (Some(ho), Some(wo)) = (
            spatial_out(h, kh, self.stride[0], self.padding[0]),
            spatial_out(w, kw, self.stride[1], self.padding[1]),
        ) else {
            return Err(Error::op(
                op,
                format!(
                    "a {kh}x{kw} window at stride {:?} with padding {:?} does not fit x {}",
                    self.stride, self.padding, ins[0]
                ),
            ));
        };
        Ok(Shape::new(&[b, o, ho, wo], DType::I8))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let ch = channels(QCONV2D.name, ins)?;
        let (x, w) = (ins[0].i64s(), ins[1].i64s());
        let [b, c, h, wd] = dims4(QCONV2D.name, ins[0])?;
        let [o, _, kh, kw] = dims4(QCONV2D.name, ins[1])?;
        let od = out.static_dims().unwrap_or_default();
        let (ho, wo) = (od[2], od[3]);
        let mut y = Vec::with_capacity(b * o * ho * wo);
        for bi in 0..b {
            for (oc, &(bias, m, s)) in ch.iter().enumerate().take(o) {
                for oy in 0..ho {
                    for ox in 0..wo {
                        let mut acc = bias as i64;
                        for ci in 0..c {
                            for ky in 0..kh {
                                let iy = (oy * self.stride[0] + ky) as isize
                                    - self.padding[0].0 as isize;
                                if iy < 0 || iy >= h as isize {
                                    continue;
                                }
                                for kx in 0..kw {
                                    let ix = (ox * self.stride[1] + kx) as isize
                                        - self.padding[1].0 as isize;
                                    if ix < 0 || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv =
                                        x[((bi * c + ci) * h + iy as usize) * wd + ix as usize];
                                    let wv = w[((oc * c + ci) * kh + ky) * kw + kx];
                                    acc += (xv - self.x_zero_point as i64) * wv;
                                }
                            }
                        }
                        y.push(requant(acc, m, s, self.out));
                    }
                }
            }
        }
        Ok(Tensor::from_i64(&od, DType::I8, y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        let per = ins[1].static_dims().map_or(0, |d| d[1] * d[2] * d[3]) as u64;
        Cost::streaming(ins, out, 2 * per + 4)
    }

    no_derivatives!();

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    /// A batched input only: the batch folded into `B`. Batched weights: per example.
    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        if b.bds[1..].iter().any(Option::is_some) {
            return batch_per_example(g, b, Op::defined(*self));
        }
        batch_nchw(g, b, Op::defined(*self))
    }
}

/// A rank-4 value's dims (checked by `infer` already; an error rather than a panic if not).
fn dims4(op: &str, t: &Tensor) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(t.dims()).map_err(|_| {
        Error::op(
            op,
            format!("expected a rank-4 operand, got dims {:?}", t.dims()),
        )
    })
}

/// Int8 elementwise addition of two tensors with their own scales (TFLite's int8 `ADD`): each
/// operand, less its zero point, is shifted left by [`QADD_LEFT_SHIFT`] and scaled by its
/// multiplier; the sum is scaled by the output multiplier and requantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QAdd {
    /// `a`'s zero point.
    pub a_zero_point: i32,
    /// `b`'s zero point.
    pub b_zero_point: i32,
    /// `a`'s rescale `(multiplier, shift)`: `s_a / (2 max(s_a, s_b))`.
    pub a_scale: (i32, i32),
    /// `b`'s rescale: `s_b / (2 max(s_a, s_b))`.
    pub b_scale: (i32, i32),
    /// The sum's rescale: `2 max(s_a, s_b) / (2^20 s_out)`.
    pub out_scale: (i32, i32),
    /// The result's zero point and clamp.
    pub out: QOut,
}

pub(super) const QADD: OpRegistration = OpRegistration {
    name: "qadd",
    from_attrs: |a| {
        let mut pair =
            |m: &str, s: &str| -> Result<(i32, i32)> { Ok((small(a, m)?, small(a, s)?)) };
        let a_scale = pair("a_multiplier", "a_shift")?;
        let b_scale = pair("b_multiplier", "b_shift")?;
        let out_scale = pair("out_multiplier", "out_shift")?;
        Ok(DefinedOp::new(QAdd {
            a_zero_point: small(a, "a_zero_point")?,
            b_zero_point: small(a, "b_zero_point")?,
            a_scale,
            b_scale,
            out_scale,
            out: QOut::parse(a)?,
        }))
    },
    examples: || {
        vec![DefinedOp::new(QAdd {
            a_zero_point: -3,
            b_zero_point: 10,
            a_scale: (1 << 30, 0),
            b_scale: (1_500_000_000, -1),
            out_scale: (1_200_000_000, -18),
            out: QOut::plain(-1),
        })]
    },
};

impl QAdd {
    /// The result for one pair of int8 values.
    #[inline]
    pub fn apply(&self, a: i32, b: i32) -> i32 {
        let scaled = |v: i32, zp: i32, (m, s): (i32, i32)| {
            fixed::multiply_by_quantized_multiplier((v - zp) << QADD_LEFT_SHIFT, m, s)
        };
        let sum = scaled(a, self.a_zero_point, self.a_scale).wrapping_add(scaled(
            b,
            self.b_zero_point,
            self.b_scale,
        ));
        let (m, s) = self.out_scale;
        fixed::requantize(sum, m, s, self.out.zero_point, self.out.lo, self.out.hi)
    }
}

impl OpDef for QAdd {
    fn name(&self) -> &'static str {
        QADD.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        let i = |v: i32| Attr::from(v as i64);
        let mut a = vec![
            ("a_zero_point", i(self.a_zero_point)),
            ("b_zero_point", i(self.b_zero_point)),
            ("a_multiplier", i(self.a_scale.0)),
            ("a_shift", i(self.a_scale.1)),
            ("b_multiplier", i(self.b_scale.0)),
            ("b_shift", i(self.b_scale.1)),
            ("out_multiplier", i(self.out_scale.0)),
            ("out_shift", i(self.out_scale.1)),
        ];
        a.extend(self.out.attrs());
        a
    }

    fn arity(&self) -> (usize, usize) {
        (2, 2)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let op = QADD.name;
        check_zero_point(op, "a's", self.a_zero_point)?;
        check_zero_point(op, "b's", self.b_zero_point)?;
        self.out.check(op)?;
        for (what, (_, s)) in [
            ("a's", self.a_scale),
            ("b's", self.b_scale),
            ("the result's", self.out_scale),
        ] {
            check_shift(op, what, s as i64)?;
        }
        let a = require(op, "a", ins[0], DType::I8)?;
        let b = require(op, "b", ins[1], DType::I8)?;
        if a != b {
            return Err(Error::op(
                op,
                format!(
                    "operands must have one shape, got {} and {}",
                    ins[0], ins[1]
                ),
            ));
        }
        Ok(ins[0].clone())
    }

    fn eval(&self, ins: &[&Tensor], _: &Shape) -> Result<Tensor> {
        let y = ins[0]
            .i64s()
            .into_iter()
            .zip(ins[1].i64s())
            .map(|(a, b)| self.apply(a as i32, b as i32) as i64)
            .collect();
        Ok(Tensor::from_i64(ins[0].dims(), DType::I8, y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, 12)
    }

    no_derivatives!();

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        let (x, y) = (b.front(g, 0)?, b.front(g, 1)?);
        let d = g.shape(x).static_dims().unwrap_or_default();
        let y = g.try_expand(y, &d)?;
        Ok((g.try_op(Op::defined(*self), &[x, y])?, Some(0)))
    }
}

/// 2-D int8 max or mean pooling, channels first (TFLite's int8 `MAX_POOL_2D` /
/// `AVERAGE_POOL_2D`): the result keeps the input's scale and zero point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QPool {
    /// Max or mean.
    pub kind: PoolKind,
    /// Window `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Stride `[sh, sw]`.
    pub stride: [usize; 2],
    /// Padding `[(top, bottom), (left, right)]`, left out of the window.
    pub padding: [(usize, usize); 2],
}

pub(super) const QPOOL: OpRegistration = OpRegistration {
    name: "qpool",
    from_attrs: |a| {
        let kind = a.word("kind", "max, mean", |w| match w {
            "max" => Some(PoolKind::Max),
            "mean" => Some(PoolKind::Mean),
            _ => None,
        })?;
        Ok(DefinedOp::new(QPool {
            kind,
            kernel: two("qpool", "kernel", a.usizes("kernel")?)?,
            stride: two("qpool", "stride", a.usizes("stride")?)?,
            padding: two("qpool", "padding", a.pairs("padding")?)?,
        }))
    },
    examples: || {
        [PoolKind::Max, PoolKind::Mean]
            .map(|kind| {
                DefinedOp::new(QPool {
                    kind,
                    kernel: [2, 3],
                    stride: [2, 1],
                    padding: [(0, 1), (1, 1)],
                })
            })
            .to_vec()
    },
};

impl QPool {
    /// The pooled value of the window's int8 values.
    pub fn reduce(&self, vals: impl Iterator<Item = i32>) -> i32 {
        match self.kind {
            PoolKind::Max => vals.max().unwrap_or(0),
            PoolKind::Mean => {
                let (sum, n) = vals.fold((0i32, 0i32), |(s, n), v| (s + v, n + 1));
                if n == 0 {
                    return 0;
                }
                let half = n / 2;
                if sum > 0 {
                    (sum + half) / n
                } else {
                    (sum - half) / n
                }
            }
        }
    }
}

impl OpDef for QPool {
    fn name(&self) -> &'static str {
        QPOOL.name
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        let list = |v: [usize; 2]| Attr::List(v.iter().map(|&s| s.into()).collect());
        vec![
            (
                "kind",
                Attr::word(match self.kind {
                    PoolKind::Max => "max",
                    PoolKind::Mean => "mean",
                }),
            ),
            ("kernel", list(self.kernel)),
            ("stride", list(self.stride)),
            ("padding", Attr::pairs(&self.padding)),
        ]
    }

    fn arity(&self) -> (usize, usize) {
        (1, 1)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let op = QPOOL.name;
        let xd = require(op, "x", ins[0], DType::I8)?;
        let [b, c, h, w] = xd[..] else {
            return Err(Error::op(
                op,
                format!("x must be i8 [B, C, H, W], got {}", ins[0]),
            ));
        };
        let [kh, kw] = self.kernel;
        let ((top, bottom), (left, right)) = (self.padding[0], self.padding[1]);
        if top >= kh || bottom >= kh || left >= kw || right >= kw {
            return Err(Error::op(
                op,
                format!("padding {:?} must be smaller than the window {:?} (a window of padding alone has no value)", self.padding, self.kernel),
            ));
        }
        let (Some(ho), Some(wo)) = (
            spatial_out(h, kh, self.stride[0], self.padding[0]),
            spatial_out(w, kw, self.stride[1], self.padding[1]),
        ) else {
            return Err(Error::op(
                op,
                format!(
                    "a {kh}x{kw} window at stride {:?} with padding {:?} does not fit x {}",
                    self.stride, self.padding, ins[0]
                ),
            ));
        };
        Ok(Shape::new(&[b, c, ho, wo], DType::I8))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let x = ins[0].i64s();
        let [b, c, h, w] = dims4(QPOOL.name, ins[0])?;
        let od = out.static_dims().unwrap_or_default();
        let (ho, wo) = (od[2], od[3]);
        let mut y = Vec::with_capacity(b * c * ho * wo);
        for plane in 0..b * c {
            let xp = &x[plane * h * w..(plane + 1) * h * w];
            for oy in 0..ho {
                for ox in 0..wo {
                    let ys = window(oy, self.stride[0], self.padding[0].0, self.kernel[0], h);
                    let xs = window(ox, self.stride[1], self.padding[1].0, self.kernel[1], w);
                    let vals = ys.flat_map(|iy| xs.clone().map(move |ix| xp[iy * w + ix] as i32));
                    y.push(self.reduce(vals) as i64);
                }
            }
        }
        Ok(Tensor::from_i64(&od, DType::I8, y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        Cost::streaming(ins, out, (self.kernel[0] * self.kernel[1]) as u64)
    }

    no_derivatives!();

    fn batchable(&self, _: &[bool]) -> bool {
        true
    }

    fn batch(&self, g: &mut Graph, b: &Batched) -> Result<(NodeId, Option<usize>)> {
        batch_nchw(g, b, Op::defined(*self))
    }
}

/// The input positions along one axis that output position `o` of a window reads (padding
/// left out).
pub fn window(o: usize, stride: usize, pad: usize, k: usize, n: usize) -> std::ops::Range<usize> {
    let start = (o * stride) as isize - pad as isize;
    let lo = start.max(0) as usize;
    let hi = ((start + k as isize).max(0) as usize).min(n);
    lo..hi.max(lo)
}
