//! Optimizers, learning-rate schedules and gradient clipping, written as graph ops appended to
//! the gradient graph, so a whole training step compiles into one program.

use rlx_ir::{Activation, BinaryOp, DType, Graph, NodeId, ReduceKind, Result};

/// Parameter update rules.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Stochastic gradient descent, optionally with (Nesterov) momentum.
    Sgd {
        /// Momentum coefficient (0 for plain SGD).
        momentum: f32,
        /// Use Nesterov's look-ahead form.
        nesterov: bool,
    },
    /// Adam (Kingma & Ba), with bias correction.
    Adam {
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator epsilon.
        eps: f32,
    },
    /// Adam with decoupled weight decay (Loshchilov & Hutter).
    AdamW {
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator epsilon.
        eps: f32,
        /// Decay applied as `p -= lr * weight_decay * p`.
        weight_decay: f32,
    },
}

impl Optimizer {
    /// Adam with the usual defaults (0.9, 0.999, 1e-8).
    pub fn adam() -> Optimizer {
        Optimizer::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// AdamW with the usual defaults (0.9, 0.999, 1e-8) and `weight_decay`.
    pub fn adamw(weight_decay: f32) -> Optimizer {
        Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }

    /// Names of the state slots kept per param (`"m"`, `"v"`, ...).
    pub(crate) fn slots(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd { momentum, .. } if *momentum == 0.0 => &[],
            Optimizer::Sgd { .. } => &["momentum"],
            Optimizer::Adam { .. } | Optimizer::AdamW { .. } => &["m", "v"],
        }
    }
}

/// Learning rate as a function of the (1-based) step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// Always `lr`.
    Constant {
        /// Learning rate.
        lr: f32,
    },
    /// Linear warmup from 0 to `lr` over `warmup` steps, then cosine decay to `min_lr` at
    /// `total` steps (and `min_lr` after).
    WarmupCosine {
        /// Peak learning rate.
        lr: f32,
        /// Final learning rate.
        min_lr: f32,
        /// Warmup steps.
        warmup: u64,
        /// Total steps.
        total: u64,
    },
}

impl Schedule {
    /// The learning rate at `step` (host-side, for logs and tests).
    pub fn at(&self, step: u64) -> f32 {
        match *self {
            Schedule::Constant { lr } => lr,
            Schedule::WarmupCosine {
                lr,
                min_lr,
                warmup,
                total,
            } => {
                let s = step as f64;
                let warm = if warmup > 0 {
                    (s / warmup as f64).min(1.0)
                } else {
                    1.0
                };
                let span = (total.saturating_sub(warmup)).max(1) as f64;
                let p = ((s - warmup as f64) / span).clamp(0.0, 1.0);
                let cos = min_lr as f64
                    + 0.5 * (lr - min_lr) as f64 * (1.0 + (std::f64::consts::PI * p).cos());
                (warm * if step <= warmup { lr as f64 } else { cos }) as f32
            }
        }
    }
}

/// Everything that defines a training step besides the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// Update rule.
    pub optimizer: Optimizer,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Clip the gradients' global L2 norm to this value.
    pub clip_norm: Option<f32>,
}

/// The learning rate at the step held in the f32 scalar node `step`, as graph ops.
pub(crate) fn lr_node(g: &mut Graph, s: &Schedule, step: NodeId) -> Result<NodeId> {
    let c = |g: &mut Graph, v: f64| g.try_scalar(v, DType::F32);
    match *s {
        Schedule::Constant { lr } => c(g, lr as f64),
        Schedule::WarmupCosine {
            lr,
            min_lr,
            warmup,
            total,
        } => {
            let one = c(g, 1.0)?;
            let zero = c(g, 0.0)?;
            let w = c(g, warmup.max(1) as f64)?;
            let frac = g.try_div(step, w)?;
            let warm = g.try_binary(BinaryOp::Min, frac, one)?;
            let wf = c(g, warmup as f64)?;
            let span = c(g, total.saturating_sub(warmup).max(1) as f64)?;
            let after = g.try_sub(step, wf)?;
            let p = g.try_div(after, span)?;
            let p = g.try_binary(BinaryOp::Max, p, zero)?;
            let p = g.try_binary(BinaryOp::Min, p, one)?;
            let pi = c(g, std::f64::consts::PI)?;
            let ang = g.try_mul(pi, p)?;
            let cs = g.try_activation(Activation::Cos, ang)?;
            let opc = g.try_add(one, cs)?;
            let half = c(g, 0.5 * (lr - min_lr) as f64)?;
            let dec = g.try_mul(half, opc)?;
            let minl = c(g, min_lr as f64)?;
            let cosl = g.try_add(minl, dec)?;
            // Before the end of warmup: lr * step / warmup; after: the cosine value.
            let peak = c(g, lr as f64)?;
            let warm_lr = g.try_mul(peak, warm)?;
            let in_warm = g.try_compare(rlx_ir::CmpOp::Le, step, wf)?;
            g.try_select(in_warm, warm_lr, cosl)
        }
    }
}

/// Scale `grads` so their global L2 norm is at most `max_norm`.
pub(crate) fn clip(g: &mut Graph, grads: &[NodeId], max_norm: f32) -> Result<Vec<NodeId>> {
    let mut total: Option<NodeId> = None;
    for &gr in grads {
        let sq = g.try_mul(gr, gr)?;
        let axes: Vec<usize> = (0..g.shape(sq).rank()).collect();
        let s = g.try_reduce(ReduceKind::Sum, sq, &axes, false)?;
        let s = g.try_cast(s, DType::F32)?;
        total = Some(match total {
            Some(t) => g.try_add(t, s)?,
            None => s,
        });
    }
    let Some(total) = total else {
        return Ok(Vec::new());
    };
    let norm = g.try_activation(Activation::Sqrt, total)?;
    let eps = g.try_scalar(1e-6, DType::F32)?;
    let den = g.try_add(norm, eps)?;
    let mx = g.try_scalar(max_norm as f64, DType::F32)?;
    let r = g.try_div(mx, den)?;
    let one = g.try_scalar(1.0, DType::F32)?;
    let scale = g.try_binary(BinaryOp::Min, r, one)?;
    grads
        .iter()
        .map(|&gr| {
            let s = g.try_cast(scale, g.shape(gr).dtype())?;
            g.try_mul(gr, s)
        })
        .collect()
}

/// Append the update of param `p` with gradient `grad`; `state` holds the optimizer slots (in
/// [`Optimizer::slots`] order). Returns the new param and the new slots.
pub(crate) fn update(
    g: &mut Graph,
    opt: &Optimizer,
    lr: NodeId,
    step: NodeId,
    p: NodeId,
    grad: NodeId,
    state: &[NodeId],
) -> Result<(NodeId, Vec<NodeId>)> {
    let dt = g.shape(p).dtype();
    let c = |g: &mut Graph, v: f64| g.try_scalar(v, dt);
    let lr = g.try_cast(lr, dt)?;
    match *opt {
        Optimizer::Sgd { momentum, nesterov } => {
            if momentum == 0.0 {
                let d = g.try_mul(lr, grad)?;
                return Ok((g.try_sub(p, d)?, Vec::new()));
            }
            let mu = c(g, momentum as f64)?;
            let mv = g.try_mul(mu, state[0])?;
            let v = g.try_add(mv, grad)?;
            let dir = if nesterov {
                let mv2 = g.try_mul(mu, v)?;
                g.try_add(grad, mv2)?
            } else {
                v
            };
            let d = g.try_mul(lr, dir)?;
            Ok((g.try_sub(p, d)?, vec![v]))
        }
        Optimizer::Adam { beta1, beta2, eps }
        | Optimizer::AdamW {
            beta1, beta2, eps, ..
        } => {
            let (b1, b2) = (c(g, beta1 as f64)?, c(g, beta2 as f64)?);
            let (ob1, ob2) = (c(g, 1.0 - beta1 as f64)?, c(g, 1.0 - beta2 as f64)?);
            let m1 = g.try_mul(b1, state[0])?;
            let m2 = g.try_mul(ob1, grad)?;
            let m = g.try_add(m1, m2)?;
            let g2 = g.try_mul(grad, grad)?;
            let v1 = g.try_mul(b2, state[1])?;
            let v2 = g.try_mul(ob2, g2)?;
            let v = g.try_add(v1, v2)?;
            // Bias corrections 1 - beta^t.
            let t = g.try_cast(step, dt)?;
            let one = c(g, 1.0)?;
            let p1 = g.try_pow(b1, t)?;
            let p2 = g.try_pow(b2, t)?;
            let bc1 = g.try_sub(one, p1)?;
            let bc2 = g.try_sub(one, p2)?;
            // lr · (m / bc1) / (sqrt(v / bc2) + eps), arranged as PyTorch does so the bias
            // corrections are scalars computed once per step: one division and one square root
            // per element instead of three divisions and a root.
            let step_size = g.try_div(lr, bc1)?;
            let inv_sqrt_bc2 = g.try_activation(Activation::Rsqrt, bc2)?;
            let rt = g.try_activation(Activation::Sqrt, v)?;
            let rt = g.try_mul(rt, inv_sqrt_bc2)?;
            let e = c(g, eps as f64)?;
            let den = g.try_add(rt, e)?;
            let ratio = g.try_div(m, den)?;
            let mut d = g.try_mul(step_size, ratio)?;
            if let Optimizer::AdamW { weight_decay, .. } = *opt {
                // Decoupled weight decay: lr · wd · p.
                let wd = c(g, weight_decay as f64)?;
                let lr_wd = g.try_mul(lr, wd)?;
                let decay = g.try_mul(lr_wd, p)?;
                d = g.try_add(d, decay)?;
            }
            Ok((g.try_sub(p, d)?, vec![m, v]))
        }
    }
}
