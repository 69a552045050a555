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

/// A batched row-major product `C[z] = A[z] B[z]` (or `A[z] Bᵀ` where `B` is given by rows of
/// `k`, as a dequantized GGUF weight matrix is); `P` says where an operand is (a [`Word`] in a
/// [`crate::Program`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm<P = Word> {
    /// The element type of `A` and `B` (f32, f64, f16 or bf16).
    pub operands: DType,
    /// The element type of `C`: the operands' own, or f32 from f16 / bf16 operands.
    /// Accumulation is f32 (f64 for f64), as RLX's kernels accumulate.
    pub result: DType,
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
    /// `B` is stored as `[n, k]` (the product is `A Bᵀ`).
    pub b_rows: bool,
    /// Where `A`, `B` and `C` are.
    pub at: [P; 3],
}

/// The arguments of one `cublasGemmStridedBatchedEx` call, column-major (`alpha` 1, `beta` 0,
/// the second operand never transposed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnMajor {
    /// Element type of the two operands.
    pub operands: DType,
    /// Element type of the result.
    pub result: DType,
    /// The first operand is transposed (`CUBLAS_OP_T`).
    pub trans_a: bool,
    /// Rows of `op(A)` and `C`.
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

/// Rows from which a GGUF product goes to cuBLAS (its weights decoded to bf16 first, once a
/// run): a prompt's. Fewer rows (decode, a batch of sequences) stay on the kernels that read the
/// packed weights.
pub const GEMM_ROWS: usize = 64;

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
            operands: dtype,
            result: dtype,
            m,
            k,
            n,
            batches,
            stride_a: if batches > 1 { stride_a } else { 0 },
            stride_b: if batches > 1 { stride_b } else { 0 },
            b_rows: false,
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

    /// `C [m, n] (result) = A [m, k] · Bᵀ` for `B` given as `[n, k]` rows, both in `operands`.
    pub fn by_rows(
        operands: DType,
        result: DType,
        [m, k, n]: [usize; 3],
        at: [P; 3],
    ) -> Option<Gemm<P>> {
        (takes(operands) && m > 0 && k > 0 && n > 0 && fits(m) && fits(k) && fits(n)).then_some(
            Gemm {
                operands,
                result,
                m,
                k,
                n,
                batches: 1,
                stride_a: 0,
                stride_b: 0,
                b_rows: true,
                at,
            },
        )
    }

    /// The same product with its operands placed by `f`.
    pub fn place<Q, E>(&self, f: impl Fn(P) -> Result<Q, E>) -> Result<Gemm<Q>, E> {
        let [a, b, c] = self.at;
        Ok(Gemm {
            operands: self.operands,
            result: self.result,
            m: self.m,
            k: self.k,
            n: self.n,
            batches: self.batches,
            stride_a: self.stride_a,
            stride_b: self.stride_b,
            b_rows: self.b_rows,
            at: [f(a)?, f(b)?, f(c)?],
        })
    }
}

impl Gemm<Word> {
    /// The column-major call computing it: `Cᵀ = Bᵀ Aᵀ` (`Cᵀ = B Aᵀ` for `B` by rows).
    pub fn column_major(&self) -> ColumnMajor {
        let [a, b, c] = self.at;
        let ld_b = if self.b_rows { self.k } else { self.n };
        ColumnMajor {
            operands: self.operands,
            result: self.result,
            trans_a: self.b_rows,
            m: self.n as i32,
            n: self.m as i32,
            k: self.k as i32,
            a: (b, ld_b as i32, self.stride_b as i64),
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
    /// cuBLAS's definition of the call over host memory: `C[i + j ldc] = Σ_l op(A)[i, l]
    /// B[l + j ldb]` for each batch (`op(A)[i, l]` is `A[i + l lda]`, or `A[l + i lda]`
    /// transposed), accumulated in f32 (f64 for f64) and rounded once to the result's type.
    ///
    /// # Safety
    /// `addr` gives the host address of each operand, where every element the call reads or
    /// writes lies.
    pub unsafe fn run_on_host(&self, addr: impl Fn(Word) -> u64) {
        let (dt, rt) = (self.operands, self.result);
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let (pa, pb, pc) = (
            addr(self.a.0) as *mut u8,
            addr(self.b.0) as *mut u8,
            addr(self.c.0) as *mut u8,
        );
        let (lda, ldb, ldc) = (self.a.1 as usize, self.b.1 as usize, self.c.1 as usize);
        let a_at = |i: usize, l: usize| {
            if self.trans_a {
                l + i * lda
            } else {
                i + l * lda
            }
        };
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
                            .map(|l| read(dt, pa, oa + a_at(i, l)) * read(dt, pb, ob + l + j * ldb))
                            .sum::<f64>()
                    } else {
                        let mut acc = 0f32;
                        for l in 0..k {
                            acc += read(dt, pa, oa + a_at(i, l)) as f32
                                * read(dt, pb, ob + l + j * ldb) as f32;
                        }
                        acc as f64
                    };
                    write(rt, pc, oc + i + j * ldc, v);
                }
            }
        }
    }
}
