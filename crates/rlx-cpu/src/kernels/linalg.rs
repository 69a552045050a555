//! MatMul: batched, broadcast batch axes, strided operands. f32 goes through the packed GEMM,
//! bf16 and f16 through the half-precision GEMM (f32 sums, rounded once); other dtypes through
//! a simple loop accumulating in the compute type.

use super::gemm::{self, half::HMat, Mat};
use super::patterns::{hook, Epilogue, EpilogueOps};
use super::{kernel, Kernel, Lowered, NodeInfo, Ptr, TRef};
use crate::elem::{Elem, FloatElem, Real};
use crate::layout::{for_each_run, Layout};
use crate::{with_dtype, with_float};
use rlx_ir::{DType, Result};

/// Offsets of every batch matrix of `a`, `b` and the output, in batch order.
struct Batches {
    dims: Vec<usize>,
    la: Layout,
    lb: Layout,
    lo: Layout,
}

impl Batches {
    fn new(a: &Layout, b: &Layout, out: &Layout) -> Batches {
        let r = out.rank();
        let dims = out.dims()[..r - 2].to_vec();
        let strip = |l: &Layout| {
            let mut x = *l;
            x = x.remove_axis(x.rank() - 1);
            x.remove_axis(x.rank() - 1)
        };
        Batches {
            la: strip(a).broadcast_to(&dims),
            lb: strip(b).broadcast_to(&dims),
            lo: strip(out),
            dims,
        }
    }

    fn count(&self) -> usize {
        self.dims.iter().product()
    }

    fn each(&self, range: std::ops::Range<usize>, mut f: impl FnMut(usize, usize, usize)) {
        for_each_run(
            &self.dims,
            [&self.lo, &self.la, &self.lb],
            range,
            |[o, i, j], n, [so, si, sj]| {
                for t in 0..n {
                    f(o + t * so, i + t * si, j + t * sj);
                }
            },
        );
    }
}

fn mnk(a: &Layout, b: &Layout) -> (usize, usize, usize, usize, usize, usize, usize) {
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k, n) = (a.dims()[ra - 2], a.dims()[ra - 1], b.dims()[rb - 1]);
    (
        m,
        n,
        k,
        a.strides()[ra - 2],
        a.strides()[ra - 1],
        b.strides()[rb - 2],
        b.strides()[rb - 1],
    )
}

/// When `b` is shared by every batch and `a`'s batch axes step evenly over its rows, the whole
/// batched product is one `[batch * m, k] x [k, n]` GEMM: returns `a` seen as that matrix.
fn fold_batches(a: &Layout, b: &Layout, out: &Layout) -> Option<Layout> {
    let ra = a.rank();
    if ra <= 2 || b.rank() != 2 || out.rank() != ra || !out.is_contiguous() {
        return None;
    }
    let (d, s) = (a.dims(), a.strides());
    // Row index r of the folded matrix walks the batch axes then m with one stride s[ra-2].
    let mut expect = s[ra - 2] * d[ra - 2];
    for i in (0..ra - 2).rev() {
        if d[i] != 1 && s[i] != expect {
            return None;
        }
        expect *= d[i];
    }
    let rows: usize = d[..ra - 1].iter().product();
    Layout::strided(&[rows, d[ra - 1]], &[s[ra - 2], s[ra - 1]], a.offset)
}

/// The element type of a product the packed GEMMs run.
#[derive(Clone, Copy)]
enum Packed {
    /// f32 through [`gemm::sgemm`], skipping the zeros the plan names.
    F32(gemm::Tri),
    /// bf16 / f16 through [`gemm::half::hgemm`].
    Half(gemm::half::Half),
}

impl Packed {
    fn of(dt: DType, zeros: gemm::Tri) -> Option<Packed> {
        match dt {
            DType::F32 => Some(Packed::F32(zeros)),
            DType::BF16 => Some(Packed::Half(gemm::half::Half::Bf16)),
            DType::F16 => Some(Packed::Half(gemm::half::Half::F16)),
            _ => None,
        }
    }

    /// Scratch bytes of one `m×n×k` product on `threads` threads.
    fn scratch(self, m: usize, n: usize, k: usize, threads: usize) -> usize {
        match self {
            Packed::F32(_) => gemm::scratch_len(m, n, k, threads) * 4,
            Packed::Half(h) => gemm::half::scratch_bytes(m, n, k, threads, h),
        }
    }
}

/// `b_panels`: B is a `[k, n]` param stored in column panels (half-precision products only);
/// `epi`: a bias and activation applied to each block of C as it becomes final (f32 products
/// without skipped zeros only).
#[allow(clippy::too_many_arguments)]
fn packed_matmul(
    a: TRef,
    b: TRef,
    out: TRef,
    scratch: Ptr,
    threads: usize,
    kind: Packed,
    b_panels: bool,
    epi: Option<EpilogueOps>,
) -> Box<dyn Kernel> {
    let full = !matches!(kind, Packed::F32(z) if z != gemm::Tri::Full);
    debug_assert!(epi.is_none() || (full && matches!(kind, Packed::F32(_))));
    if let Some(fa) = fold_batches(&a.layout, &b.layout, &out.layout).filter(|_| full) {
        let rows = fa.dims()[0];
        let n = b.layout.dims()[1];
        let a2 = TRef { layout: fa, ..a };
        let mut ol = Layout::contiguous(&[rows, n]);
        ol.offset = out.layout.offset;
        return packed_matmul(
            a2,
            b,
            TRef { layout: ol, ..out },
            scratch,
            threads,
            kind,
            b_panels,
            epi,
        );
    }
    let (m, n, k, ars, acs, brs, bcs) = mnk(&a.layout, &b.layout);
    // Rows of C may be further apart than `n` (an output laid out for a transpose that
    // follows, see `program::output_layout`); its columns are contiguous.
    let ro = out.layout.rank();
    debug_assert!(out.layout.strides()[ro - 1] == 1 || n == 1);
    let ldc = out.layout.strides()[ro - 2];
    let batches = Batches::new(&a.layout, &b.layout, &out.layout);
    // Bytes of one thread's share of the scratch, for products run one per task.
    let per_thread = kind.scratch(m, n, k, 1);
    let nb = batches.count();
    // Many small products: one product per task. Otherwise threads split each product.
    let per_batch = nb >= threads && m * n * k < (1 << 21);
    kernel(move |pool| {
        let one = |o: usize, i: usize, j: usize, p: Option<&crate::pool::Pool>, th: usize| unsafe {
            let ps = scratch.get().add(th * per_thread);
            // SAFETY: offsets come from the planned layouts; scratch holds `threads` slices; the
            // compiler proved the zeros `zeros` names. A product on one thread skips them.
            match kind {
                Packed::F32(zeros) => {
                    let (am, bm) = (
                        Mat {
                            ptr: a.base::<f32>().add(i),
                            rs: ars,
                            cs: acs,
                        },
                        Mat {
                            ptr: b.base::<f32>().add(j),
                            rs: brs,
                            cs: bcs,
                        },
                    );
                    let (po, ps) = (out.base::<f32>().add(o), ps as *mut f32);
                    match (p, epi) {
                        (_, Some(e)) => {
                            let hook = hook(po, ldc, e);
                            gemm::sgemm_epilogue(p, m, n, k, am, bm, po, ldc, ps, Some(&hook))
                        }
                        (None, None) => gemm::sgemm_tri(m, n, k, am, bm, po, ldc, ps, zeros),
                        (Some(_), None) => gemm::sgemm(p, m, n, k, am, bm, po, ldc, ps),
                    }
                }
                Packed::Half(h) => {
                    let am = HMat::strided(a.base::<u16>().add(i), ars, acs);
                    let bm = if b_panels {
                        HMat::panels(b.base::<u16>().add(j), k)
                    } else {
                        HMat::strided(b.base::<u16>().add(j), brs, bcs)
                    };
                    gemm::half::hgemm(p, h, m, n, k, am, bm, out.base::<u16>().add(o), ldc, ps)
                }
            }
        };
        if per_batch {
            pool.run(nb, &|t, th| {
                batches.each(t..t + 1, |o, i, j| one(o, i, j, None, th))
            });
        } else {
            batches.each(0..nb, |o, i, j| one(o, i, j, Some(pool), 0));
        }
    })
}

/// The plain triple loop over every batch, accumulating in `A`: `to` widens an element,
/// `done` rounds the sum back.
fn naive_matmul<T: Elem, A: Copy + Send + Sync + 'static>(
    a: TRef,
    b: TRef,
    out: TRef,
    zero: A,
    mul_add: fn(A, T, T) -> A,
    done: fn(A) -> T,
) -> Box<dyn Kernel> {
    let (m, n, k, ars, acs, brs, bcs) = mnk(&a.layout, &b.layout);
    let batches = Batches::new(&a.layout, &b.layout, &out.layout);
    kernel(move |pool| {
        pool.run(batches.count(), &|t, _| {
            let (pa, pb, po) = (a.base::<T>(), b.base::<T>(), out.base::<T>());
            batches.each(t..t + 1, |o, i, j| {
                for r in 0..m {
                    for c in 0..n {
                        let mut s = zero;
                        for p in 0..k {
                            // SAFETY: offsets come from the planned layouts.
                            unsafe {
                                s = mul_add(
                                    s,
                                    *pa.add(i + r * ars + p * acs),
                                    *pb.add(j + p * brs + c * bcs),
                                )
                            };
                        }
                        unsafe { *po.add(o + r * n + c) = done(s) };
                    }
                }
            })
        });
    })
}

fn float_matmul<T: FloatElem>(a: TRef, b: TRef, out: TRef) -> Box<dyn Kernel> {
    naive_matmul::<T, T::C>(
        a,
        b,
        out,
        T::C::c(0.0),
        |s, x, y| s + x.to_c() * y.to_c(),
        T::from_c,
    )
}

fn int_matmul<T: Elem>(a: TRef, b: TRef, out: TRef) -> Box<dyn Kernel> {
    naive_matmul::<T, T>(a, b, out, T::zero(), |s, x, y| s.add(x.mul(y)), |s| s)
}

/// Scratch bytes of the packed product of operands `a` and `b` of the node: enough for one
/// product split over every thread or one product per thread.
fn packed_scratch(info: &NodeInfo<'_>, a: usize, b: usize, kind: Packed) -> usize {
    let (a, b) = (&info.ins[a], &info.ins[b]);
    let (m, k, n) = (
        a.dims()[a.rank() - 2],
        a.dims()[a.rank() - 1],
        b.dims()[b.rank() - 1],
    );
    // A folded product has more rows than one batch: size the scratch for the larger m.
    let out = Layout::contiguous(&info.dims);
    let m = fold_batches(a, b, &out).map_or(m, |f| f.dims()[0]);
    let threads = info.threads;
    kind.scratch(m, n, k, threads)
        .max(kind.scratch(m, n, k, 1) * threads)
}

pub(super) fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    let dt = info.dtype();
    let threads = info.threads;
    let b_panels = info.b_panels;
    if b_panels && !(matches!(dt, DType::BF16 | DType::F16) && info.ins[1].rank() == 2) {
        return Err(info.unsupported(format!(
            "a right operand stored in column panels must be a 2-D bf16 / f16 param, not {dt} {:?}",
            info.ins[1].dims()
        )));
    }
    if let Some(kind) = Packed::of(dt, info.zeros) {
        let scratch = packed_scratch(info, 0, 1, kind);
        return Ok(Lowered::Compute {
            scratch,
            build: Box::new(move |i, o, s| {
                packed_matmul(i[0], i[1], o, s, threads, kind, b_panels, None)
            }),
        });
    }
    let ok = with_dtype!(dt, T => { let _ = std::marker::PhantomData::<T>; dt != DType::Bool }, else false);
    if !ok {
        return Err(info.unsupported(format!("matmul of {dt}")));
    }
    Ok(
        with_float!(dt, T => super::compute(move |i, o| float_matmul::<T>(i[0], i[1], o)),
            else with_dtype!(dt, T => super::compute(move |i, o| int_matmul::<T>(i[0], i[1], o)),
                else return Err(info.unsupported(format!("matmul of {dt}"))))),
    )
}

/// A `MatMulEpilogue` region (f32 product, bias along rows, activation; see
/// [`super::patterns`]): the packed GEMM with the epilogue applied to each finished block of C.
pub(super) fn lower_epilogue(
    info: &NodeInfo<'_>,
    e: Epilogue<usize>,
) -> Result<(usize, super::Build)> {
    let threads = info.threads;
    let (a, b) = (&info.ins[e.a], &info.ins[e.b]);
    let f32s = [Some(e.a), Some(e.b), e.bias]
        .into_iter()
        .flatten()
        .all(|i| info.in_dtypes[i] == DType::F32);
    if info.dtype() != DType::F32 || !f32s || a.rank() < 2 || b.rank() < 2 {
        return Err(info.unsupported("a product's epilogue runs on f32 products"));
    }
    let kind = Packed::F32(gemm::Tri::Full);
    let scratch = packed_scratch(info, e.a, e.b, kind);
    Ok((
        scratch,
        Box::new(move |i, o, s| {
            let ops = EpilogueOps {
                bias: e.bias.map(|x| i[x]),
                act: e.act,
            };
            packed_matmul(i[e.a], i[e.b], o, s, threads, kind, false, Some(ops))
        }),
    ))
}
