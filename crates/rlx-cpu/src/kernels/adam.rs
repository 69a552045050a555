//! The Adam / AdamW parameter update as one pass over its tensors.
//!
//! A training step's optimizer update arrives as a fused elementwise group of 13 (Adam) or 15
//! (AdamW) instructions over the param `p`, its gradient `g` and the moments `m`, `v`:
//!
//! ```text
//! m' = b1·m + (1-b1)·g            v' = b2·v + (1-b2)·(g·g)
//! p' = p - (step · (m' / (sqrt(v')·c + eps)) [+ lr_wd · p])
//! ```
//!
//! The generic group evaluator runs that one instruction at a time over blocks of 512 elements,
//! each a load / op / store pass, so the square root and the division run in passes of their
//! own with the load and store ports idle, and every intermediate goes through L1 and back.
//! Recognised here, the same operations run in one loop, eight elements at a time in registers:
//! every element goes through the same f32 operations in the same order (products and sums of
//! two values are commutative in IEEE arithmetic; nothing is reassociated or contracted into a
//! fused multiply-add), so results are bit-identical to the generic evaluator's.

use super::fused::{Instr, Src};
use super::{kernel, Kernel, TRef};
use crate::pool::Pool;
use rlx_ir::{Activation, BinaryOp};

/// An Adam(W) update group: which external operand is which, and which instructions compute
/// the new moments (stored as extra results of the group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdamGroup {
    p: usize,
    m: usize,
    v: usize,
    g: usize,
    b1: usize,
    ob1: usize,
    b2: usize,
    ob2: usize,
    /// `1 / sqrt(1 - b2^t)`.
    rsqrt_bc2: usize,
    eps: usize,
    /// `lr / (1 - b1^t)`.
    step: usize,
    /// `lr · weight_decay` (AdamW).
    decay: Option<usize>,
    /// Instructions computing `m'` and `v'`.
    m_new: usize,
    v_new: usize,
}

fn binary(code: &[Instr], s: Src, op: BinaryOp, seen: &mut u32) -> Option<(Src, Src)> {
    let Src::Tmp(j) = s else { return None };
    match code[j] {
        Instr::Binary(o, a, b) if o == op && *seen & (1 << j) == 0 => {
            *seen |= 1 << j;
            Some((a, b))
        }
        _ => None,
    }
}

fn unary(code: &[Instr], s: Src, act: Activation, seen: &mut u32) -> Option<Src> {
    let Src::Tmp(j) = s else { return None };
    match code[j] {
        Instr::Unary(a, x) if a == act && *seen & (1 << j) == 0 => {
            *seen |= 1 << j;
            Some(x)
        }
        _ => None,
    }
}

fn ext(s: Src) -> Option<usize> {
    match s {
        Src::Ext(k) => Some(k),
        Src::Tmp(_) => None,
    }
}

fn tmp(s: Src) -> Option<usize> {
    match s {
        Src::Tmp(j) => Some(j),
        Src::Ext(_) => None,
    }
}

impl AdamGroup {
    /// Recognise the update in a group's instructions (the last one is the new param);
    /// `scalar(k)` tells whether external operand `k` is one value broadcast, `dense(k)`
    /// whether it is dense in the result's order (as `p`, `m`, `v` and `g` must be), and
    /// `extra` lists the instructions the group also stores, which must be exactly `m'` and
    /// `v'`. Every instruction must belong to the update, each exactly once.
    pub fn find(
        code: &[Instr],
        scalar: &dyn Fn(usize) -> bool,
        dense: &dyn Fn(usize) -> bool,
        extra: &[usize],
    ) -> Option<AdamGroup> {
        if !(code.len() == 13 || code.len() == 15) {
            return None;
        }
        let mut seen = 0u32;
        let s = &mut seen;
        let (p, d) = binary(code, Src::Tmp(code.len() - 1), BinaryOp::Sub, s)?;
        let p = ext(p)?;
        let (upd, decay) = if code.len() == 15 {
            let (upd, dec) = binary(code, d, BinaryOp::Add, s)?;
            let (lw, p2) = binary(code, dec, BinaryOp::Mul, s)?;
            (ext(p2)? == p).then_some(())?;
            (upd, Some(ext(lw)?))
        } else {
            (d, None)
        };
        let (step, ratio) = binary(code, upd, BinaryOp::Mul, s)?;
        let (mn, den) = binary(code, ratio, BinaryOp::Div, s)?;
        let (rt, eps) = binary(code, den, BinaryOp::Add, s)?;
        let (sq, rsqrt_bc2) = binary(code, rt, BinaryOp::Mul, s)?;
        let vn = unary(code, sq, Activation::Sqrt, s)?;
        let (m_new, v_new) = (tmp(mn)?, tmp(vn)?);
        let (m1, m2) = binary(code, mn, BinaryOp::Add, s)?;
        let (b1, m) = binary(code, m1, BinaryOp::Mul, s)?;
        let (ob1, g) = binary(code, m2, BinaryOp::Mul, s)?;
        let (v1, v2) = binary(code, vn, BinaryOp::Add, s)?;
        let (b2, v) = binary(code, v1, BinaryOp::Mul, s)?;
        let (ob2, g2) = binary(code, v2, BinaryOp::Mul, s)?;
        let (ga, gb) = binary(code, g2, BinaryOp::Mul, s)?;
        let (m, g, v) = (ext(m)?, ext(g)?, ext(v)?);
        (ext(ga)? == g && ext(gb)? == g).then_some(())?;
        let a = AdamGroup {
            p,
            m,
            v,
            g,
            b1: ext(b1)?,
            ob1: ext(ob1)?,
            b2: ext(b2)?,
            ob2: ext(ob2)?,
            rsqrt_bc2: ext(rsqrt_bc2)?,
            eps: ext(eps)?,
            step: ext(step)?,
            decay,
            m_new,
            v_new,
        };
        let arrays = [a.p, a.m, a.v, a.g];
        let scalars = [a.b1, a.ob1, a.b2, a.ob2, a.rsqrt_bc2, a.eps, a.step];
        let distinct = arrays
            .iter()
            .enumerate()
            .all(|(i, x)| !arrays[..i].contains(x));
        let kinds_ok = arrays.iter().all(|&k| dense(k) && !scalar(k))
            && scalars.iter().chain(a.decay.iter()).all(|&k| scalar(k));
        let extra_ok = extra.len() == 2 && extra.contains(&m_new) && extra.contains(&v_new);
        (seen.count_ones() as usize == code.len() && distinct && kinds_ok && extra_ok).then_some(a)
    }
}

/// The scalars of one step.
#[derive(Clone, Copy)]
struct Consts {
    b1: f32,
    ob1: f32,
    b2: f32,
    ob2: f32,
    rsqrt_bc2: f32,
    eps: f32,
    step: f32,
    decay: f32,
}

/// One element, in the group's order of operations: `(p', m', v')`.
#[inline(always)]
fn update<const DECAY: bool>(c: &Consts, p: f32, m: f32, v: f32, g: f32) -> (f32, f32, f32) {
    let mn = c.b1 * m + c.ob1 * g;
    let vn = c.b2 * v + c.ob2 * (g * g);
    let den = vn.sqrt() * c.rsqrt_bc2 + c.eps;
    let mut d = c.step * (mn / den);
    if DECAY {
        d += c.decay * p;
    }
    (p - d, mn, vn)
}

/// Pointers of one update: inputs, then outputs (which may be the inputs: each element is
/// read before it is written).
#[derive(Clone, Copy)]
struct Io {
    p: *const f32,
    m: *const f32,
    v: *const f32,
    g: *const f32,
    p_out: *mut f32,
    m_out: *mut f32,
    v_out: *mut f32,
}

/// Elements `s..e`, eight at a time through arrays the compiler keeps in vector registers.
///
/// # Safety
/// Every pointer is valid for `e` elements; outputs overlap inputs only element for element.
#[inline(always)]
unsafe fn range<const DECAY: bool>(c: &Consts, io: Io, s: usize, e: usize) {
    const W: usize = 8;
    let mut i = s;
    while i + W <= e {
        let ld = |x: *const f32| (x.add(i) as *const [f32; W]).read_unaligned();
        let (p, m, v, g) = (ld(io.p), ld(io.m), ld(io.v), ld(io.g));
        let (mut po, mut mo, mut vo) = ([0f32; W], [0f32; W], [0f32; W]);
        for l in 0..W {
            (po[l], mo[l], vo[l]) = update::<DECAY>(c, p[l], m[l], v[l], g[l]);
        }
        (io.p_out.add(i) as *mut [f32; W]).write_unaligned(po);
        (io.m_out.add(i) as *mut [f32; W]).write_unaligned(mo);
        (io.v_out.add(i) as *mut [f32; W]).write_unaligned(vo);
        i += W;
    }
    for i in i..e {
        let (p, m, v) = update::<DECAY>(c, *io.p.add(i), *io.m.add(i), *io.v.add(i), *io.g.add(i));
        (*io.p_out.add(i), *io.m_out.add(i), *io.v_out.add(i)) = (p, m, v);
    }
}

/// [`range`] with or without the decay term.
///
/// # Safety
/// As [`range`].
#[inline(always)]
unsafe fn either(c: &Consts, io: Io, decay: bool, s: usize, e: usize) {
    if decay {
        range::<true>(c, io, s, e)
    } else {
        range::<false>(c, io, s, e)
    }
}

/// [`either`] compiled for the widest vector unit the CPU has.
///
/// # Safety
/// As [`range`].
unsafe fn range_best(c: &Consts, io: Io, decay: bool, s: usize, e: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn v512(c: &Consts, io: Io, decay: bool, s: usize, e: usize) {
            either(c, io, decay, s, e)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn v256(c: &Consts, io: Io, decay: bool, s: usize, e: usize) {
            either(c, io, decay, s, e)
        }
        if crate::isa::avx512() {
            return v512(c, io, decay, s, e);
        }
        if crate::isa::avx2() {
            return v256(c, io, decay, s, e);
        }
    }
    either(c, io, decay, s, e)
}

// SAFETY: tasks touch disjoint element ranges of the buffers, which outlive the kernel.
unsafe impl Send for Io {}
unsafe impl Sync for Io {}

impl Io {
    // A method, so closures capture the whole (Sync) value rather than its raw-pointer fields.
    fn get(&self) -> Io {
        *self
    }
}

/// The kernel: `ins` are the group's external operands (as [`AdamGroup::find`] checked them,
/// the arrays dense with `n` elements), `out` the new param and `extra` the group's stored
/// instructions with their dense buffers (the new moments).
pub fn build(
    a: AdamGroup,
    ins: Vec<TRef>,
    n: usize,
    out: TRef,
    extra: &[(usize, TRef)],
    threads: usize,
) -> Box<dyn Kernel> {
    // SAFETY: dense operands of `n` elements from their offsets (checked by `find`).
    let at = |t: &TRef| unsafe { t.base::<f32>().add(t.layout.offset) };
    let stored = |j: usize| {
        extra
            .iter()
            .find(|e| e.0 == j)
            .map(|e| e.1)
            .expect("find checked the stored instructions")
    };
    let (m_out, v_out) = (stored(a.m_new), stored(a.v_new));
    let io = Io {
        p: at(&ins[a.p]),
        m: at(&ins[a.m]),
        v: at(&ins[a.v]),
        g: at(&ins[a.g]),
        p_out: at(&out),
        m_out: at(&m_out),
        v_out: at(&v_out),
    };
    // Chunks of at least 16 Ki elements, whole vectors, a few per thread.
    let chunk = n
        .div_ceil(threads.max(1) * 4)
        .max(1 << 14)
        .next_multiple_of(16);
    let tasks = n.div_ceil(chunk);
    kernel(move |pool: &Pool| {
        // Read when the step runs: the scalars (step size, bias correction) change every step.
        // SAFETY: a scalar operand's one value is at its offset.
        let s = |k: usize| unsafe { *at(&ins[k]) };
        let c = Consts {
            b1: s(a.b1),
            ob1: s(a.ob1),
            b2: s(a.b2),
            ob2: s(a.ob2),
            rsqrt_bc2: s(a.rsqrt_bc2),
            eps: s(a.eps),
            step: s(a.step),
            decay: a.decay.map_or(0.0, s),
        };
        pool.run(tasks, &|t, _| {
            let io = io.get();
            // SAFETY: see `Io`; tasks cover disjoint ranges inside the buffers.
            unsafe {
                range_best(
                    &c,
                    io,
                    a.decay.is_some(),
                    t * chunk,
                    ((t + 1) * chunk).min(n),
                )
            };
        });
    })
}
