//! Products cuBLAS computes: a [`Gemm`] is the library call standing in for a matmul launch
//! where the device has cuBLAS (`cublasGemmStridedBatchedEx`), and the launch's own tiled
//! kernel runs where it has not (`RLX_CUBLAS=0`, or no library found).
//!
//! RLX's values are row-major and cuBLAS is column-major: a row-major `C[m, n] = A[m, k] B[k, n]`
//! is the column-major `Cᵀ[n, m] = Bᵀ[n, k] Aᵀ[k, m]`, the same bytes, so the call passes `B`
//! first and swaps `m` and `n` ([`Gemm::column_major`]). [`ColumnMajor::run_on_host`] follows
//! cuBLAS's definition of the call over host memory: host emulation runs it, so the mapping
//! from the graph's shapes to the call's arguments is checked without a device.

use crate::lower::Word;
use rlx_ir::DType;

/// A batched row-major product `C[z] = A[z] B[z]`; `P` says where an operand is (a [`Word`] in
/// a [`crate::Program`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm<P = Word> {
    /// The element type of `A`, `B` and `C` (f32, f64, f16 or bf16); accumulation is f32 (f64
    /// for f64), as RLX's kernels accumulate.
    pub dtype: DType,
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `A`, rows of `B`.
    pub k: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Products.
    pub batches: usize,
    /// Elements from one `A` to the next (0: one `A` for every product).
    pub stride_a: usize,
    /// Elements from one `B` to the next (0: one `B` for every product).
    pub stride_b: usize,
    /// Where `A`, `B` and `C` are.
    pub at: [P; 3],
}

/// The arguments of one `cublasGemmStridedBatchedEx` call, column-major (`alpha` 1, `beta` 0,
/// no operand transposed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnMajor {
    /// Element type of the operands and the result.
    pub dtype: DType,
    /// Rows of `A` and `C`.
    pub m: i32,
    /// Columns of `B` and `C`.
    pub n: i32,
    /// The shared dimension.
    pub k: i32,
    /// Where `A` is; its leading dimension; elements between batches.
    pub a: (Word, i32, i64),
    /// Where `B` is; its leading dimension; elements between batches.
    pub b: (Word, i32, i64),
    /// Where `C` is; its leading dimension; elements between batches.
    pub c: (Word, i32, i64),
    /// Products.
    pub batches: i32,
}

/// Whether cuBLAS takes products of `dt`.
pub fn takes(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

fn fits(v: usize) -> bool {
    i32::try_from(v).is_ok()
}

impl<P: Copy> Gemm<P> {
    /// The call for a matmul of `[.., m, k] x [.., k, n]` in `dtype` over batch dims `cb`
    /// whose operands' batch strides (in matrices, 0 where broadcast) are `sa` and `sb`;
    /// `None` where one strided call cannot do it (batches broadcast in a way no single stride
    /// gives, an empty product, sizes past cuBLAS's 32-bit arguments).
    pub fn for_matmul(
        dtype: DType,
        [m, k, n]: [usize; 3],
        cb: &[usize],
        sa: &[usize],
        sb: &[usize],
        at: [P; 3],
    ) -> Option<Gemm<P>> {
        if !takes(dtype) || m == 0 || k == 0 || n == 0 {
            return None;
        }
        // One stride per operand: every batch dim longer than 1 either dense or broadcast.
        let dense = dense(cb);
        let one = |s: &[usize], size: usize| -> Option<usize> {
            let real: Vec<usize> = (0..cb.len()).filter(|&i| cb[i] > 1).collect();
            if real.iter().all(|&i| s[i] == dense[i]) {
                Some(size)
            } else if real.iter().all(|&i| s[i] == 0) {
                Some(0)
            } else {
                None
            }
        };
        let batches: usize = cb.iter().product();
        let (stride_a, stride_b) = (one(sa, m * k)?, one(sb, k * n)?);
        let mut g = Gemm {
            dtype,
            m,
            k,
            n,
            batches,
            stride_a: if batches > 1 { stride_a } else { 0 },
            stride_b: if batches > 1 { stride_b } else { 0 },
            at,
        };
        // One B for every dense A: a single product of all the rows.
        if g.batches > 1 && g.stride_b == 0 && g.stride_a == m * k {
            g.m *= g.batches;
            g.batches = 1;
            g.stride_a = 0;
        }
        (fits(g.m) && fits(g.n) && fits(g.k) && fits(g.batches)).then_some(g)
    }

    /// The same product with its operands placed by `f`.
    pub fn place<Q, E>(&self, f: impl Fn(P) -> Result<Q, E>) -> Result<Gemm<Q>, E> {
        let [a, b, c] = self.at;
        Ok(Gemm {
            dtype: self.dtype,
            m: self.m,
            k: self.k,
            n: self.n,
            batches: self.batches,
            stride_a: self.stride_a,
            stride_b: self.stride_b,
            at: [f(a)?, f(b)?, f(c)?],
        })
    }
}

impl Gemm<Word> {
    /// The column-major call computing it: `Cᵀ = Bᵀ Aᵀ`.
    pub fn column_major(&self) -> ColumnMajor {
        let [a, b, c] = self.at;
        ColumnMajor {
            dtype: self.dtype,
            m: self.n as i32,
            n: self.m as i32,
            k: self.k as i32,
            a: (b, self.n as i32, self.stride_b as i64),
            b: (a, self.k as i32, self.stride_a as i64),
            c: (c, self.n as i32, (self.m * self.n) as i64),
            batches: self.batches as i32,
        }
    }
}

fn dense(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

fn read(dt: DType, p: *const u8, i: usize) -> f64 {
    // SAFETY: the caller's operands hold at least `i + 1` elements of `dt` at `p`.
    unsafe {
        match dt {
            DType::F64 => (p as *const f64).add(i).read_unaligned(),
            DType::F16 => half::f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f64(),
            DType::BF16 => {
                half::bf16::from_bits((p as *const u16).add(i).read_unaligned()).to_f64()
            }
            _ => (p as *const f32).add(i).read_unaligned() as f64,
        }
    }
}

fn write(dt: DType, p: *mut u8, i: usize, v: f64) {
    // SAFETY: as in `read`, for the output.
    unsafe {
        match dt {
            DType::F64 => (p as *mut f64).add(i).write_unaligned(v),
            DType::F16 => (p as *mut u16)
                .add(i)
                .write_unaligned(half::f16::from_f32(v as f32).to_bits()),
            DType::BF16 => (p as *mut u16)
                .add(i)
                .write_unaligned(half::bf16::from_f32(v as f32).to_bits()),
            _ => (p as *mut f32).add(i).write_unaligned(v as f32),
        }
    }
}

impl ColumnMajor {
    /// cuBLAS's definition of the call over host memory: `C[i + j ldc] = Σ_l A[i + l lda]
    /// B[l + j ldb]` for each batch, accumulated in f32 (f64 for f64) and rounded once to the
    /// element type.
    ///
    /// # Safety
    /// `addr` gives the host address of each operand, where every element the call reads or
    /// writes lies.
    pub unsafe fn run_on_host(&self, addr: impl Fn(Word) -> u64) {
        let dt = self.dtype;
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let (pa, pb, pc) = (
            addr(self.a.0) as *mut u8,
            addr(self.b.0) as *mut u8,
            addr(self.c.0) as *mut u8,
        );
        let (lda, ldb, ldc) = (self.a.1 as usize, self.b.1 as usize, self.c.1 as usize);
        for z in 0..self.batches as usize {
            let (oa, ob, oc) = (
                z * self.a.2 as usize,
                z * self.b.2 as usize,
                z * self.c.2 as usize,
            );
            for j in 0..n {
                for i in 0..m {
                    let v = if dt == DType::F64 {
                        (0..k)
                            .map(|l| {
                                read(dt, pa, oa + i + l * lda) * read(dt, pb, ob + l + j * ldb)
                            })
                            .sum::<f64>()
                    } else {
                        let mut acc = 0f32;
                        for l in 0..k {
                            acc += read(dt, pa, oa + i + l * lda) as f32
                                * read(dt, pb, ob + l + j * ldb) as f32;
                        }
                        acc as f64
                    };
                    write(dt, pc, oc + i + j * ldc, v);
                }
            }
        }
    }
}
