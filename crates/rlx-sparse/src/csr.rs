//! `spmm_csr`: the sparse × dense product with the matrix in compressed-row form, its rules
//! and its CPU kernel.

use super::{int, Spmm};
use rlx_cpu::kernels::registered::view;
use rlx_cpu::kernels::{par_ranges, Ptr};
use rlx_cpu::pool::Pool;
use rlx_ir::eval::Tensor;
use rlx_ir::ops::{Cost, OpDef};
use rlx_ir::text::Attr;
use rlx_ir::{DType, Error, Graph, NodeId, Result, Shape};

/// `spmm_csr(indptr [m + 1], indices [nnz], values [nnz], dense [n] or [n, k]) -> [m] or
/// [m, k]`: row `r` of the result is `Σ values[e] · dense[indices[e]]` over the entries `e` in
/// `indptr[r]..indptr[r + 1]` (scipy's CSR product).
///
/// `indptr` must rise from 0 to `nnz` without falling, as scipy requires; entries whose column
/// is out of range are skipped (by the reference evaluator and the CPU kernel). Its
/// decomposition expands `indptr` into each entry's row in `O(m + nnz)` and runs `spmm`'s, so
/// every backend runs it and autodiff and vmap go through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpmmCsr;

fn err(msg: String) -> Error {
    Error::op("spmm_csr", msg)
}

impl OpDef for SpmmCsr {
    fn name(&self) -> &'static str {
        "spmm_csr"
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        Vec::new()
    }

    fn arity(&self) -> (usize, usize) {
        (4, 4)
    }

    fn infer(&self, ins: &[&Shape]) -> Result<Shape> {
        let (indptr, indices, values, dense) = (ins[0], ins[1], ins[2], ins[3]);
        let dims = |s: &Shape| {
            s.static_dims()
                .ok_or_else(|| err(format!("{s} needs static dimensions")))
        };
        let (pd, id, vd, dd) = (dims(indptr)?, dims(indices)?, dims(values)?, dims(dense)?);
        if !int(indptr.dtype()) || pd.len() != 1 || pd[0] == 0 {
            return Err(err(format!(
                "indptr {indptr} must be an integer vector of m + 1 row pointers"
            )));
        }
        if !int(indices.dtype()) || id.len() != 1 {
            return Err(err(format!(
                "indices {indices} must be an integer vector (a column per entry)"
            )));
        }
        if !values.dtype().is_float() || vd != id {
            return Err(err(format!(
                "values {values} must be a float vector of the {} entries",
                id[0]
            )));
        }
        if dense.dtype() != values.dtype() || !(1..=2).contains(&dd.len()) {
            return Err(err(format!(
                "dense {dense} must be [n] or [n, k] of {}",
                values.dtype()
            )));
        }
        let mut out = dd.clone();
        out[0] = pd[0] - 1;
        Ok(Shape::new(&out, values.dtype()))
    }

    fn eval(&self, ins: &[&Tensor], out: &Shape) -> Result<Tensor> {
        let (indptr, indices) = (ins[0].i64s(), ins[1].i64s());
        let (values, dense) = (ins[2].f64s(), ins[3].f64s());
        let (m, nnz) = (indptr.len() - 1, values.len());
        let n = ins[3].dims()[0];
        let k = ins[3].dims().get(1).copied().unwrap_or(1);
        let mut y = vec![0.0; m * k];
        for r in 0..m {
            let (lo, hi) = entries(indptr[r], indptr[r + 1], nnz);
            for e in lo..hi {
                let c = indices[e];
                if c < 0 || c as usize >= n {
                    continue;
                }
                for j in 0..k {
                    y[r * k + j] += values[e] * dense[c as usize * k + j];
                }
            }
        }
        let dims = out.static_dims().unwrap_or_default();
        Ok(Tensor::from_f64(&dims, out.dtype(), y))
    }

    fn cost(&self, ins: &[&Shape], out: &Shape) -> Cost {
        super::product_cost(ins, out)
    }

    /// Each entry's row from the row pointers (`rows_of`), then `spmm`'s decomposition.
    fn decompose(&self, g: &mut Graph, ins: &[NodeId]) -> Option<Result<NodeId>> {
        Some((|| {
            let m = g.shape(ins[0]).numel().unwrap_or(1) - 1;
            let rows = rows_of(g, ins[0], g.shape(ins[2]).numel().unwrap_or(0))?;
            Spmm { m }
                .decompose(g, &[rows, ins[1], ins[2], ins[3]])
                .unwrap_or_else(|| Err(err("spmm has no decomposition".into())))
        })())
    }
}

/// The wgpu kernel (`rlx_wgpu::register_kernel`): one invocation per result element `(r, j)`,
/// summing row `r`'s entries in order in f32 (pointers clamped to the entries, columns outside
/// the dense rows skipped, as the CPU kernel does). i32 pointers and columns, f32 values.
pub(crate) fn wgsl_kernel(ins: &[&Shape], out: &Shape) -> Option<rlx_wgpu::WgslKernel> {
    let i32s = [ins[0], ins[1]].iter().all(|s| s.dtype() == DType::I32);
    if !i32s || ins[2].dtype() != DType::F32 || out.dtype() != DType::F32 {
        return None;
    }
    let dd = ins[3].static_dims()?;
    let (n, k) = (dd[0], dd.get(1).copied().unwrap_or(1));
    let nnz = ins[2].numel()?;
    let body = "    let k = mt[6];
    let r = i / k;
    let j = i % k;
    let nnz = i32(mt[7]);
    let lo = clamp(bitcast<i32>(rd(mt[2] + r)), 0, nnz);
    let hi = max(clamp(bitcast<i32>(rd(mt[2] + r + 1u)), 0, nnz), lo);
    var acc = 0.0;
    for (var e = lo; e < hi; e++) {
        let c = bitcast<u32>(rd(mt[3] + u32(e)));
        if (c < mt[8]) {
            acc += bitcast<f32>(rd(mt[4] + u32(e))) * bitcast<f32>(rd(mt[5] + c * k + j));
        }
    }
    wr(mt[1] + i, bitcast<u32>(acc));
";
    Some(rlx_wgpu::WgslKernel {
        body: body.into(),
        words: vec![k as u32, nnz as u32, n as u32],
        invocations: out.numel()?,
        longest_loop: nnz,
    })
}

/// The CUDA kernel (`rlx_cuda::register_kernel`): the WGSL kernel's loop in CUDA C, a thread
/// per result element.
pub(crate) fn cuda_kernel(ins: &[&Shape], out: &Shape) -> Option<rlx_cuda::CudaKernel> {
    let w = wgsl_kernel(ins, out)?;
    let body = "        const i64 k = m.w[6], nnz = m.w[7];
        const u32 n = (u32)m.w[8];
        const i64 r = i / k, j = i % k;
        const int *ip = (const int *)m.w[2];
        const int *cols = (const int *)m.w[3];
        const float *v = (const float *)m.w[4];
        const float *d = (const float *)m.w[5];
        i64 lo = ip[r], hi = ip[r + 1];
        lo = lo < 0 ? 0 : (lo > nnz ? nnz : lo);
        hi = hi < 0 ? 0 : (hi > nnz ? nnz : hi);
        float acc = 0.0f;
        for (i64 e = lo; e < hi; e++) {
            const u32 c = (u32)cols[e];
            if (c < n) acc += v[e] * d[(i64)c * k + j];
        }
        ((float *)m.w[1])[i] = acc;
";
    Some(rlx_cuda::CudaKernel {
        body: body.into(),
        words: w.words.iter().map(|&x| x as i64).collect(),
        items: w.invocations,
    })
}

/// The entries of a row whose pointers are `lo` and `hi`, clamped to `0..nnz` (a falling
/// pointer gives no entries).
fn entries(lo: i64, hi: i64, nnz: usize) -> (usize, usize) {
    let lo = lo.clamp(0, nnz as i64) as usize;
    let hi = hi.clamp(0, nnz as i64) as usize;
    (lo, hi.max(lo))
}

/// Each entry's row, `rows[e] = #{i in 1..=m : indptr[i] ≤ e}`, in the graph: a one at each
/// row's end pointer (`scatter_add` into `nnz + 1` slots), summed by `cumsum` (`O(m + nnz)`),
/// in `indptr`'s type. The counts are taken in f32 (then converted back) while every count
/// is exact in it (`m` and `nnz` below 2^24), since not every backend adds integers by
/// `scatter_add` (wgpu does not).
pub(crate) fn rows_of(g: &mut Graph, indptr: NodeId, nnz: usize) -> Result<NodeId> {
    let it = g.shape(indptr).dtype();
    let m = g.shape(indptr).numel().unwrap_or(1) - 1;
    let dt = if m.max(nnz) < 1 << 24 { DType::F32 } else { it };
    let ends = g.try_narrow(indptr, 0, 1, m)?;
    let zero = g.try_scalar(0.0, dt)?;
    let slots = g.try_expand(zero, &[nnz + 1])?;
    let one = g.try_scalar(1.0, dt)?;
    let ones = g.try_expand(one, &[m])?;
    let marks = g.try_scatter_add(slots, ends, ones, 0)?;
    let counts = g.try_cumsum(marks, 0)?;
    let rows = g.try_narrow(counts, 0, 0, nnz)?;
    if dt == it {
        return Ok(rows);
    }
    g.try_cast(rows, it)
}

/// An index type of the sparse operands.
trait Index: Copy + Sync + Send {
    fn at(self) -> i64;
}

impl Index for i32 {
    #[inline(always)]
    fn at(self) -> i64 {
        self as i64
    }
}

impl Index for i64 {
    #[inline(always)]
    fn at(self) -> i64 {
        self
    }
}

/// The CPU kernel. Rows are split over the pool in ranges of about equal entry counts (by the
/// row pointers), each task writing its own rows. f32 values with i32 columns and one dense
/// column (SpMV) take AVX-512 where the CPU has it: sixteen entries a step, the dense values
/// gathered, columns out of range masked off; the rest sum each row in order in the values'
/// type (f32 or f64; other float types through f64).
pub(crate) fn kernel(ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape, pool: &Pool) {
    let dd = ins[3].1.static_dims().unwrap_or_default();
    let (n, k) = (dd[0], dd.get(1).copied().unwrap_or(1));
    let (pt, it, dt) = (ins[0].1.dtype(), ins[1].1.dtype(), shape.dtype());
    #[cfg(target_arch = "x86_64")]
    if it == DType::I32 && dt == DType::F32 && rlx_cpu::isa::avx512() {
        let (cols, v, d) = (
            view::<i32>(ins[1].0),
            view::<f32>(ins[2].0),
            view::<f32>(ins[3].0),
        );
        match pt {
            DType::I32 => into::<f32>(out, |y| {
                f32_avx512(&view::<i32>(ins[0].0), &cols, &v, &d, y, (n, k), pool)
            }),
            _ => into::<f32>(out, |y| {
                f32_avx512(&view::<i64>(ins[0].0), &cols, &v, &d, y, (n, k), pool)
            }),
        }
        return;
    }
    macro_rules! typed {
        ($p:ty, $i:ty, $t:ty) => {{
            let (indptr, indices) = (view::<$p>(ins[0].0), view::<$i>(ins[1].0));
            let (v, d) = (view::<$t>(ins[2].0), view::<$t>(ins[3].0));
            into::<$t>(out, |y| {
                products(&indptr, &indices, &v, &d, y, (n, k), pool)
            });
        }};
    }
    match (pt, it, dt) {
        (DType::I32, DType::I32, DType::F32) => typed!(i32, i32, f32),
        (DType::I64, DType::I32, DType::F32) => typed!(i64, i32, f32),
        (DType::I32, DType::I64, DType::F32) => typed!(i32, i64, f32),
        (DType::I64, DType::I64, DType::F32) => typed!(i64, i64, f32),
        (DType::I32, DType::I32, DType::F64) => typed!(i32, i32, f64),
        (DType::I64, DType::I32, DType::F64) => typed!(i64, i32, f64),
        (DType::I32, DType::I64, DType::F64) => typed!(i32, i64, f64),
        (DType::I64, DType::I64, DType::F64) => typed!(i64, i64, f64),
        _ => {
            let t = |(b, s): (&[u8], &Shape)| Tensor::from_bytes(s, b);
            let (Ok(a), Ok(b), Ok(c), Ok(d)) = (t(ins[0]), t(ins[1]), t(ins[2]), t(ins[3])) else {
                return;
            };
            if let Ok(y) = SpmmCsr.eval(&[&a, &b, &c, &d], shape) {
                out.copy_from_slice(&y.to_bytes());
            }
        }
    }
}

/// Run `f` on the result as values of `T`, zeroed: in place where its bytes are aligned for
/// `T`, through a copy otherwise.
fn into<T: ToLe + Default>(out: &mut [u8], f: impl FnOnce(&mut [T])) {
    let len = out.len() / std::mem::size_of::<T>();
    if (out.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        out.fill(0);
        // SAFETY: `out` holds `len` values of `T`, aligned for it; zero bytes are 0.0.
        f(unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut T, len) });
    } else {
        let mut y = vec![T::default(); len];
        f(&mut y);
        for (o, x) in out.chunks_exact_mut(std::mem::size_of::<T>()).zip(&y) {
            o.copy_from_slice(x.le().as_ref());
        }
    }
}

/// The value types of the kernel.
trait ToLe: Copy {
    type Bytes: AsRef<[u8]>;
    fn le(self) -> Self::Bytes;
}

impl ToLe for f32 {
    type Bytes = [u8; 4];
    fn le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl ToLe for f64 {
    type Bytes = [u8; 8];
    fn le(self) -> [u8; 8] {
        self.to_le_bytes()
    }
}

/// Rows `first..last` of tasks over `0..m`, each about `nnz / tasks` entries, never
/// overlapping (a falling pointer cannot make two tasks share a row).
fn row_ranges<P: Index>(indptr: &[P], tasks: usize) -> Vec<(usize, usize)> {
    let m = indptr.len() - 1;
    let nnz = indptr[m].at().max(0);
    let mut starts: Vec<usize> = (0..tasks)
        .map(|t| {
            let target = nnz * t as i64 / tasks as i64;
            indptr[..m].partition_point(|p| p.at() < target)
        })
        .collect();
    for t in 1..tasks {
        starts[t] = starts[t].max(starts[t - 1]);
    }
    starts[0] = 0;
    (0..tasks)
        .map(|t| (starts[t], if t + 1 < tasks { starts[t + 1] } else { m }))
        .collect()
}

fn products<P: Index, I: Index, T>(
    indptr: &[P],
    indices: &[I],
    v: &[T],
    d: &[T],
    y: &mut [T],
    (n, k): (usize, usize),
    pool: &Pool,
) where
    T: Copy + Default + std::ops::Mul<Output = T> + std::ops::AddAssign + Send + Sync + 'static,
{
    let nnz = v.len().min(indices.len());
    let yp = Ptr(y.as_mut_ptr() as *mut u8);
    // Rows `a..b` into `y` (this task's alone).
    let rows = |a: usize, b: usize| {
        // SAFETY: rows a..b of `y` belong to this call alone.
        let part =
            unsafe { std::slice::from_raw_parts_mut((yp.get() as *mut T).add(a * k), (b - a) * k) };
        for r in a..b {
            let (lo, hi) = entries(indptr[r].at(), indptr[r + 1].at(), nnz);
            let yr = &mut part[(r - a) * k..(r - a + 1) * k];
            if k == 1 {
                let mut acc = [T::default(); 4];
                let mut e = lo;
                let term = |e: usize| {
                    let c = indices[e].at();
                    if c >= 0 && (c as usize) < n {
                        v[e] * d[c as usize]
                    } else {
                        T::default()
                    }
                };
                while e + 4 <= hi {
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a += term(e + j);
                    }
                    e += 4;
                }
                for e in e..hi {
                    acc[0] += term(e);
                }
                let (mut s01, mut s23) = (acc[0], acc[2]);
                s01 += acc[1];
                s23 += acc[3];
                s01 += s23;
                yr[0] = s01;
                continue;
            }
            for e in lo..hi {
                let c = indices[e].at();
                if c >= 0 && (c as usize) < n {
                    let dc = &d[c as usize * k..(c as usize + 1) * k];
                    for (yv, &dv) in yr.iter_mut().zip(dc) {
                        *yv += v[e] * dv;
                    }
                }
            }
        }
    };
    over_rows(indptr, nnz * k, pool, rows);
}

/// `run(a, b)` over row ranges of about equal entry counts split over the pool (one range of
/// all `m` rows when there is one thread or under 2^15 products).
fn over_rows<P: Index>(
    indptr: &[P],
    products: usize,
    pool: &Pool,
    run: impl Fn(usize, usize) + Sync,
) {
    let (m, threads) = (indptr.len() - 1, pool.threads());
    if threads < 2 || products < 1 << 15 {
        run(0, m);
        return;
    }
    let ranges = row_ranges(indptr, threads * 4);
    par_ranges(pool, ranges.len(), 1, |tasks| {
        for t in tasks {
            let (a, b) = ranges[t];
            run(a, b);
        }
    });
}

/// The product of f32 values with i32 columns by AVX-512 F, rows split over the pool as
/// [`products`] splits them. SpMV: per row, sixteen entries a step, their dense values
/// gathered (`vgatherdps`), columns out of range masked off, the row's sum reduced at its
/// end. SpMM: per row and 64 dense columns, the row's sums in four registers, each entry's
/// value broadcast against its dense row.
#[cfg(target_arch = "x86_64")]
fn f32_avx512<P: Index>(
    indptr: &[P],
    cols: &[i32],
    v: &[f32],
    d: &[f32],
    y: &mut [f32],
    (n, k): (usize, usize),
    pool: &Pool,
) {
    #[target_feature(enable = "avx512f")]
    unsafe fn wide_rows<P: Index>(
        indptr: &[P],
        cols: &[i32],
        v: &[f32],
        d: &[f32],
        y: &mut [f32],
        (a, b): (usize, usize),
        (n, k): (usize, usize),
    ) {
        use std::arch::x86_64::*;
        let nnz = v.len().min(cols.len());
        let lanes = |w: usize| -> __mmask16 {
            if w >= 16 {
                !0
            } else {
                (1u16 << w) - 1
            }
        };
        for r in a..b {
            let (lo, hi) = entries(indptr[r].at(), indptr[r + 1].at(), nnz);
            for j0 in (0..k).step_by(64) {
                let w = (k - j0).min(64);
                let masks = [0, 16, 32, 48].map(|q| lanes(w.saturating_sub(q)));
                let mut acc = [_mm512_setzero_ps(); 4];
                for e in lo..hi {
                    let c = cols[e] as u32 as usize;
                    if c >= n {
                        continue;
                    }
                    let x = _mm512_set1_ps(v[e]);
                    let row = c * k + j0;
                    for (q, sum) in acc.iter_mut().enumerate() {
                        if masks[q] != 0 {
                            // SAFETY: columns j0 + 16q.. of dense row c, masked to the w in
                            // bounds (and not read past them).
                            let dv = unsafe {
                                _mm512_maskz_loadu_ps(masks[q], d.as_ptr().add(row + 16 * q))
                            };
                            *sum = _mm512_fmadd_ps(x, dv, *sum);
                        }
                    }
                }
                for (q, sum) in acc.iter().enumerate() {
                    if masks[q] != 0 {
                        // SAFETY: row r - a of this part, columns j0 + 16q.., masked.
                        unsafe {
                            _mm512_mask_storeu_ps(
                                y.as_mut_ptr().add((r - a) * k + j0 + 16 * q),
                                masks[q],
                                *sum,
                            )
                        };
                    }
                }
            }
        }
    }
    /// How far ahead (entries) the SpMV prefetches the column and value streams.
    const AHEAD: usize = 256;
    #[target_feature(enable = "avx512f")]
    unsafe fn rows<P: Index>(
        indptr: &[P],
        cols: &[i32],
        v: &[f32],
        d: &[f32],
        y: &mut [f32],
        (a, b): (usize, usize),
        n: usize,
    ) {
        use std::arch::x86_64::*;
        let nnz = v.len().min(cols.len());
        let limit = _mm512_set1_epi32(n.min(i32::MAX as usize) as i32);
        for r in a..b {
            let (lo, hi) = entries(indptr[r].at(), indptr[r + 1].at(), nnz);
            // The column and value streams a kilobyte ahead, non-temporally: read once, they
            // would otherwise push the dense vector (read at random) out of the caches.
            if lo + AHEAD < nnz {
                // SAFETY: in bounds (checked); a prefetch reads nothing.
                unsafe {
                    _mm_prefetch::<_MM_HINT_NTA>(cols.as_ptr().add(lo + AHEAD) as *const i8);
                    _mm_prefetch::<_MM_HINT_NTA>(v.as_ptr().add(lo + AHEAD) as *const i8);
                }
            }
            let mut acc = _mm512_setzero_ps();
            let mut e = lo;
            // Whole groups of sixteen: plain loads, and a gather that waits on no mask unless
            // a column is out of range (a predictable branch, not a dependency).
            while e + 16 <= hi {
                // SAFETY: entries e..e + 16 are in bounds; only columns in 0..n are gathered.
                unsafe {
                    let c = _mm512_loadu_si512(cols.as_ptr().add(e) as *const _);
                    let x = _mm512_loadu_ps(v.as_ptr().add(e));
                    let ok = _mm512_cmplt_epu32_mask(c, limit);
                    let g = if ok == !0 {
                        _mm512_i32gather_ps::<4>(c, d.as_ptr())
                    } else {
                        _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), ok, c, d.as_ptr())
                    };
                    acc = _mm512_fmadd_ps(x, g, acc);
                }
                e += 16;
            }
            if e < hi {
                let mask: __mmask16 = (1u16 << (hi - e)) - 1;
                // SAFETY: entries e..hi are in bounds; the rest of the 16 are masked off (and
                // not read); only columns in 0..n are gathered.
                unsafe {
                    let c = _mm512_maskz_loadu_epi32(mask, cols.as_ptr().add(e));
                    let ok = mask & _mm512_cmplt_epu32_mask(c, limit);
                    let x = _mm512_maskz_loadu_ps(mask, v.as_ptr().add(e));
                    let g = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), ok, c, d.as_ptr());
                    acc = _mm512_fmadd_ps(x, g, acc);
                }
            }
            y[r - a] = _mm512_reduce_add_ps(acc);
        }
    }
    let yp = Ptr(y.as_mut_ptr() as *mut u8);
    let run = |a: usize, b: usize| {
        // SAFETY: AVX-512 F is present (checked by the caller); rows a..b of `y` are this
        // call's alone.
        unsafe {
            let part =
                std::slice::from_raw_parts_mut((yp.get() as *mut f32).add(a * k), (b - a) * k);
            if k == 1 {
                rows(indptr, cols, v, d, part, (a, b), n)
            } else {
                wide_rows(indptr, cols, v, d, part, (a, b), (n, k))
            }
        }
    };
    over_rows(indptr, v.len() * k, pool, run);
}
