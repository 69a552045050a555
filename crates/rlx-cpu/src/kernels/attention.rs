//! Attention (grouped-query, all mask kinds) and rotary position embedding.
//!
//! [`lower`] picks the kernel: f32 through the GEMM or register-blocked products, bf16 through
//! AVX-512 BF16 dot products ([`blocked`]); other half-precision attention widened to f32; the
//! general kernel here (sums in f64) for the rest. RoPE and its tables: `rope`.

mod blocked;
#[cfg(target_arch = "x86_64")]
mod dot;
mod rope;
mod small;

#[cfg(target_arch = "x86_64")]
use blocked::{attention_bf16, bf16_scratch_per_thread};
use blocked::{attention_f32, f32_scratch_per_thread};
use rope::rope;
pub(crate) use rope::{RopeKey, RopeTable};

use super::{kernel, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::elem::{FloatElem, Real};
use crate::layout::Layout;
use crate::with_float;
use rlx_ir::{MaskKind, Op, Result};

/// Offset of element `idx` of a rank-4 layout.
#[inline(always)]
fn at4(l: &Layout, i: [usize; 4]) -> usize {
    let s = l.strides();
    l.offset + i[0] * s[0] + i[1] * s[1] + i[2] * s[2] + i[3] * s[3]
}

#[allow(clippy::too_many_arguments)]
fn attention<T: FloatElem>(
    q: TRef,
    k: TRef,
    v: TRef,
    mask: Option<TRef>,
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    let [b, hq, sq, d] = [0, 1, 2, 3].map(|i| q.layout.dims()[i]);
    let (hkv, sk, dv) = (k.layout.dims()[1], k.layout.dims()[2], v.layout.dims()[3]);
    let group = hq / hkv.max(1);
    let ml = mask.map(|m| m.layout.broadcast_to(&[b, hq, sq, sk]));
    let keys = Keys::new(kind, sq, sk);
    kernel(move |pool| {
        let rows = b * hq * sq;
        let c = |x: f64| <T as FloatElem>::C::c(x);
        pool.run(rows, &|row, th| unsafe {
            let (pq, pk, pv, po) = (
                q.base::<T>() as *const T,
                k.base::<T>() as *const T,
                v.base::<T>() as *const T,
                out.base::<T>(),
            );
            // SAFETY: offsets come from the operands' layouts; each thread owns `sk` scratch slots.
            let scores = (scratch.get() as *mut f64).add(th * sk);
            let (bi, rest) = (row / (hq * sq), row % (hq * sq));
            let (h, i) = (rest / sq, rest % sq);
            let kh = h / group.max(1);
            let (lo, hi) = keys.visible(i as isize + keys.off);
            let mut mx = f64::NEG_INFINITY;
            for j in lo..hi {
                let mut s = c(0.0);
                for t in 0..d {
                    s = s
                        + (*pq.add(at4(&q.layout, [bi, h, i, t]))).to_c()
                            * (*pk.add(at4(&k.layout, [bi, kh, j, t]))).to_c();
                }
                let mut s = s.f64() * scale as f64;
                if let (Some(m), Some(l)) = (&mask, &ml) {
                    s += (*m.base::<T>().add(at4(l, [bi, h, i, j]))).to_f64();
                }
                *scores.add(j) = s;
                mx = mx.max(s);
            }
            let mut sum = 0f64;
            for j in lo..hi {
                let e = (*scores.add(j) - mx).exp();
                *scores.add(j) = e;
                sum += e;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            let ob = at4(&out.layout, [bi, h, i, 0]);
            for t in 0..dv {
                let mut acc = 0f64;
                for j in lo..hi {
                    acc += *scores.add(j) * (*pv.add(at4(&v.layout, [bi, kh, j, t]))).to_f64();
                }
                *po.add(ob + t) = T::from_c(c(acc * inv));
            }
        });
    })
}

/// The sizes of an attention: `q [b, hq, sq, d]`, `k [b, hq / group, sk, d]`,
/// `v [b, hq / group, sk, dv]`.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    sq: usize,
    d: usize,
    sk: usize,
    dv: usize,
    /// Query heads per key / value head.
    group: usize,
}

impl Dims {
    fn of(q: &TRef, k: &TRef, v: &TRef) -> Dims {
        let [b, hq, sq, d] = [0, 1, 2, 3].map(|i| q.layout.dims()[i]);
        let (hkv, sk, dv) = (k.layout.dims()[1], k.layout.dims()[2], v.layout.dims()[3]);
        Dims {
            b,
            hq,
            sq,
            d,
            sk,
            dv,
            group: (hq / hkv.max(1)).max(1),
        }
    }
}

/// Which keys each query of an attention may see under its mask kind.
#[derive(Clone, Copy)]
struct Keys {
    kind: MaskKind,
    sk: usize,
    /// Query i sits at key position i + off (the last Sq positions when Sq < Sk).
    off: isize,
}

impl Keys {
    fn new(kind: MaskKind, sq: usize, sk: usize) -> Keys {
        Keys {
            kind,
            sk,
            off: sk as isize - sq as isize,
        }
    }

    /// Keys query position `p` may see, as a half-open range clamped to [0, sk).
    fn visible(&self, p: isize) -> (usize, usize) {
        let sk = self.sk as isize;
        let (lo, hi) = match self.kind {
            MaskKind::Causal => (0, p + 1),
            MaskKind::SlidingWindow(w) => (p - w as isize + 1, p + 1),
            MaskKind::None | MaskKind::Custom => (0, sk),
        };
        let lo = lo.clamp(0, sk) as usize;
        (lo, (hi.clamp(0, sk) as usize).max(lo))
    }

    /// Keys `c0..c0 + ncol` that queries `i0..i1` see between them.
    fn columns(&self, i0: usize, i1: usize) -> (usize, usize) {
        let (lo0, _) = self.visible(i0 as isize + self.off);
        let (_, hi1) = self.visible(i1 as isize - 1 + self.off);
        (lo0.min(hi1), hi1.saturating_sub(lo0))
    }

    /// The keys query `i` sees among `c0..c0 + n`, relative to `c0`.
    fn span(&self, i: usize, c0: usize, n: usize) -> (usize, usize) {
        let (lo, hi) = self.visible(i as isize + self.off);
        let (lo, hi) = ((lo.max(c0) - c0).min(n), (hi.max(c0) - c0).min(n));
        (lo, hi.max(lo))
    }
}

/// Offsets, in bytes, of the f32 copies [`attention_widened`] makes in its scratch (q, k, v,
/// the mask if any, the output, then where the f32 kernel's own scratch starts), and their
/// total size.
fn widened_parts(ins: &[&[usize]], out: &[usize]) -> (Vec<usize>, usize) {
    let mut offs = Vec::with_capacity(ins.len() + 2);
    let mut at = 0;
    for dims in ins.iter().copied().chain([out]) {
        offs.push(at);
        at += (dims.iter().product::<usize>() * 4).next_multiple_of(64);
    }
    offs.push(at);
    (offs, at)
}

/// Half-precision attention without a dot-product kernel for its dtype (f16, or bf16 without
/// AVX-512 BF16): the operands widened to f32 into scratch, [`attention_f32`] on the copies, and
/// its output rounded once into `out`.
fn attention_widened<T: FloatElem>(
    ins: &[TRef],
    out: TRef,
    kind: MaskKind,
    scale: f32,
    scratch: Ptr,
) -> Box<dyn Kernel> {
    use super::elementwise::map1;
    let dims: Vec<&[usize]> = ins.iter().map(|t| t.layout.dims()).collect();
    let (offs, _) = widened_parts(&dims, out.layout.dims());
    let copy = |t: &TRef, i: usize| TRef {
        // SAFETY: `lower` sized the scratch with `widened_parts` of these operands.
        ptr: Ptr(unsafe { scratch.get().add(offs[i]) }),
        layout: Layout::contiguous(t.layout.dims()),
        dtype: rlx_ir::DType::F32,
    };
    let wide: Vec<TRef> = ins.iter().enumerate().map(|(i, t)| copy(t, i)).collect();
    let wout = copy(&out, ins.len());
    let widen: Vec<Box<dyn Kernel>> = ins
        .iter()
        .zip(&wide)
        .map(|(&t, &w)| map1(t, w, |x: T| x.to_f64() as f32))
        .collect();
    // SAFETY: as above; the f32 kernel's scratch follows the copies.
    let rest = Ptr(unsafe { scratch.get().add(offs[ins.len() + 1]) });
    let inner = attention_f32(
        wide[0],
        wide[1],
        wide[2],
        wide.get(3).copied(),
        wout,
        kind,
        scale,
        rest,
    );
    let narrow = map1(wout, out, |x: f32| T::from_f64(x as f64));
    kernel(move |pool| {
        for w in &widen {
            w.run(pool);
        }
        inner.run(pool);
        narrow.run(pool);
    })
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    if !dt.is_float() {
        return Err(info.unsupported(format!("dtype {dt}")));
    }
    Ok(match info.node.op {
        Op::Attention { mask, scale } => {
            let sk = info.ins[1].dims()[2];
            let sq = info.ins[0].dims()[2];
            let (d, dv) = (info.ins[0].dims()[3], info.ins[2].dims()[3]);
            let f32_scratch = info.threads * f32_scratch_per_thread(sq, sk, d, dv) * 4;
            let half = matches!(dt, rlx_ir::DType::BF16 | rlx_ir::DType::F16);
            let dot = dt == rlx_ir::DType::BF16
                && super::gemm::half::path(super::gemm::half::Half::Bf16)
                    == super::gemm::half::Path::Dot;
            let ins: Vec<&[usize]> = info.ins.iter().map(|s| s.dims()).collect();
            let scratch = match dt {
                rlx_ir::DType::F32 => f32_scratch,
                _ if half => {
                    // The widened path (taken for a strided output too), or the dot kernel's.
                    let wide = widened_parts(&ins, &info.dims).1 + f32_scratch;
                    let dot = if dot {
                        info.threads * bf16_scratch_per_thread(sq, sk, d, dv)
                    } else {
                        0
                    };
                    wide.max(dot)
                }
                _ => info.threads * sk.max(1) * 8,
            };
            Lowered::Compute {
                scratch,
                build: with_float!(dt, T => Box::new(move |i: &[TRef], o: TRef, s| {
                    let m = if mask == MaskKind::Custom {
                        Some(i[3])
                    } else {
                        None
                    };
                    // The GEMM and dot paths write whole output rows: they need a dense last axis.
                    let dense = o.layout.strides()[3] == 1;
                    if dt == rlx_ir::DType::F32 && dense {
                        return attention_f32(i[0], i[1], i[2], m, o, mask, scale, s);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if dot && dense {
                        return attention_bf16(i[0], i[1], i[2], m, o, mask, scale, s);
                    }
                    if half {
                        return attention_widened::<T>(i, o, mask, scale, s);
                    }
                    attention::<T>(i[0], i[1], i[2], m, o, mask, scale, s)
                }) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        Op::Rope { theta, interleaved } => {
            let Some(it) = super::index::IndexType::of(info.in_dtypes[1]) else {
                return Err(info.unsupported(format!(
                    "positions must be integers, got {}",
                    info.in_dtypes[1]
                )));
            };
            let r = info.ins[0].rank();
            let (s_len, d) = (info.ins[0].dims()[r - 2], info.ins[0].dims()[r - 1]);
            let table = info.shared.rope(RopeKey {
                positions: info.node.inputs[1].index(),
                theta_bits: theta.to_bits(),
                d,
                s_len,
                f32_table: dt == rlx_ir::DType::F32,
            });
            Lowered::Compute {
                scratch: 0,
                build: with_float!(dt, T => Box::new(
                    move |i: &[TRef], o, _| rope::<T>(i[0], i[1], it, o, theta, interleaved, table),
                ) as super::Build, else return Err(info.unsupported(format!("dtype {dt}")))),
            }
        }
        _ => return Err(info.unsupported("not an attention op")),
    })
}
