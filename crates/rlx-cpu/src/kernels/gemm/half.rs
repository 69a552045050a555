//! Half-precision GEMM: bf16 or f16 operands, f32 accumulation, each result rounded once to the
//! operands' dtype (round to nearest even), as `MatMul` of two bf16 / f16 values asks.
//!
//! Two paths, chosen at run time by [`path`]:
//! - [`Path::Dot`] (bf16 where the CPU has AVX-512 BF16): `vdpbf16ps` multiplies pairs of bf16
//!   and adds both products to f32 lanes, twice the multiply-adds of an f32 FMA per instruction.
//!   A is packed in 12-row slivers and B in 32-column slivers, each element a pair of depths
//!   (`p`, `p + 1`) in one 32-bit word, and a 12×32 micro-kernel keeps its tile in 24 registers
//!   over the whole depth (no depth blocking, so the tile is rounded once, from f32).
//! - [`Path::Widen`] (f16, and bf16 without AVX-512 BF16): panels are widened to f32 (exact) and
//!   multiplied by the f32 GEMM ([`super::sgemm`]), so every instruction-set level has a path.

use super::{scratch_len as f32_scratch_len, sgemm, Mat};
use crate::pool::Pool;

/// The element type of a half-precision product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// bfloat16: f32's exponent, 8 significant bits.
    Bf16,
    /// IEEE binary16.
    F16,
}

impl Half {
    /// Widen one element (exact).
    #[inline]
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            Half::Bf16 => f32::from_bits((bits as u32) << 16),
            Half::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// Round an f32 to this type (nearest even; NaN stays NaN).
    #[inline]
    pub fn from_f32(self, x: f32) -> u16 {
        match self {
            Half::Bf16 => half::bf16::from_f32(x).to_bits(),
            Half::F16 => half::f16::from_f32(x).to_bits(),
        }
    }
}

/// A strided half-precision matrix operand (bits of each element), optionally stored in
/// column panels.
#[derive(Clone, Copy, Debug)]
pub struct HMat {
    /// Element (0, 0).
    pub ptr: *const u16,
    /// Row stride (elements).
    pub rs: usize,
    /// Column stride (elements).
    pub cs: usize,
    /// 0 for a plain strided matrix. Otherwise the matrix is stored in panels of [`PANEL`]
    /// columns, this many elements apart: element `(r, c)` is at
    /// `ptr + (c / PANEL) * panel + r * rs + (c % PANEL) * cs`. A weight read as the right
    /// operand of products is stored so (see [`panel_offset`]): the dot path then streams each
    /// panel as one contiguous run instead of one cache line per row, a page apart.
    pub panel: usize,
}

impl HMat {
    /// A plain strided matrix.
    pub fn strided(ptr: *const u16, rs: usize, cs: usize) -> HMat {
        HMat {
            ptr,
            rs,
            cs,
            panel: 0,
        }
    }

    /// A `rows`-row matrix stored in column panels (`rows × PANEL` elements each, row-major).
    pub fn panels(ptr: *const u16, rows: usize) -> HMat {
        HMat {
            ptr,
            rs: PANEL,
            cs: 1,
            panel: rows * PANEL,
        }
    }

    /// The matrix from column `j` on (a multiple of [`PANEL`] when stored in panels).
    ///
    /// # Safety
    /// Column `j` lies inside the matrix (or is its end).
    pub unsafe fn from_col(self, j: usize) -> HMat {
        if self.panel == 0 {
            return HMat {
                ptr: self.ptr.add(j * self.cs),
                ..self
            };
        }
        debug_assert!(j.is_multiple_of(PANEL));
        HMat {
            ptr: self.ptr.add(j / PANEL * self.panel),
            ..self
        }
    }
}

/// Columns per panel of a weight stored in column panels: the width of the dot path's
/// micro-tile.
pub const PANEL: usize = NR;

/// Where element `(r, c)` of a `k × n` row-major matrix goes when it is stored in column panels
/// ([`HMat::panels`]; `n` a multiple of [`PANEL`]): in elements from the start.
pub fn panel_offset(k: usize, r: usize, c: usize) -> usize {
    c / PANEL * (k * PANEL) + r * PANEL + c % PANEL
}

/// Which kernel a half-precision product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// AVX-512 BF16 dot products of bf16 pairs.
    Dot,
    /// Panels widened to f32, multiplied by the f32 GEMM.
    Widen,
}

/// Whether this CPU has AVX-512 BF16 (`vdpbf16ps`, `vcvtneps2bf16`).
fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::is_x86_feature_detected!("avx512bf16")
                && !rlx_ir::env::is_off(rlx_ir::env::BF16_DOT)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The path a product of `dt` takes at the current instruction-set level
/// ([`crate::isa::current`]); `RLX_BF16_DOT=0` turns the dot path off.
pub fn path(dt: Half) -> Path {
    if dt == Half::Bf16 && crate::isa::avx512() && has_bf16_dot() {
        Path::Dot
    } else {
        Path::Widen
    }
}

/// Micro-tile of the dot path: rows of A, columns of B.
const MR: usize = 12;
const NR: usize = 32;

/// Bytes of packed A per block and of packed B per panel on the dot path (`RLX_HGEMM_A` /
/// `RLX_HGEMM_B` override them): an A block stays in L2 while every B sliver of the panel passes.
fn dot_blocking(m: usize, n: usize, k: usize) -> (usize, usize) {
    static B: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let (a_bytes, b_bytes) = *B.get_or_init(|| {
        let env = |v: rlx_ir::env::Var, d: usize| rlx_ir::env::count(v).unwrap_or(d);
        (
            env(rlx_ir::env::HGEMM_A, 192 << 10),
            env(rlx_ir::env::HGEMM_B, 2 << 20),
        )
    });
    let kp = k.div_ceil(2).max(1);
    let mc = (a_bytes / (kp * 4) / MR * MR).clamp(MR, 8 * MR);
    let nc = (b_bytes / (kp * 4) / NR * NR).clamp(NR, 64 * NR);
    (
        mc.min(m.next_multiple_of(MR)),
        nc.min(n.next_multiple_of(NR)),
    )
}

/// Rows of C per widened chunk on the widen path.
const WIDEN_ROWS: usize = 256;

/// Scratch bytes one thread's dot-path work needs.
fn dot_scratch(m: usize, n: usize, k: usize) -> usize {
    let (mc, nc) = dot_blocking(m, n, k);
    let kp = k.div_ceil(2);
    (mc + nc) * kp * 4 + 64
}

/// Scratch bytes of the widen path: B widened whole, a chunk of A rows and of C rows, and the
/// f32 GEMM's own scratch.
fn widen_scratch(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let r = m.min(WIDEN_ROWS);
    (k * n + r * k + r * n + f32_scratch_len(r, n, k, threads)) * 4 + 64
}

/// Scratch bytes for an `m×n×k` product of `dt` on `threads` threads, enough for every path any
/// runnable instruction-set level may take (a product compiled at one level may run at another).
pub fn scratch_bytes(m: usize, n: usize, k: usize, threads: usize, dt: Half) -> usize {
    let widen = widen_scratch(m, n, k, threads);
    if dt == Half::Bf16 && has_bf16_dot() {
        widen.max(dot_scratch(m, n, k) * threads.max(1))
    } else {
        widen
    }
}

/// `C = A·B` for half-precision `A [m×k]`, `B [k×n]` and `C` (row-major, rows `ldc` apart),
/// accumulating in f32. `scratch` must hold [`scratch_bytes`]`(m, n, k, threads, dt)` bytes,
/// aligned to 4, where `threads` is the pool's (1 without a pool).
///
/// # Safety
/// A, B and C must be valid for the given sizes and strides; C must not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hgemm(
    pool: Option<&Pool>,
    dt: Half,
    m: usize,
    n: usize,
    k: usize,
    a: HMat,
    b: HMat,
    c: *mut u16,
    ldc: usize,
    scratch: *mut u8,
) {
    if super::empty_product(m, n, k, c, ldc) {
        return;
    }
    match path(dt) {
        #[cfg(target_arch = "x86_64")]
        Path::Dot => dot_gemm(pool, m, n, k, a, b, c, ldc, scratch),
        _ => widen_gemm(pool, dt, m, n, k, a, b, c, ldc, scratch),
    }
}

/// The raw pointers of one product, shared by the tasks of a dispatch.
#[derive(Clone, Copy)]
struct Job {
    a: HMat,
    b: HMat,
    c: *mut u16,
    scratch: *mut u8,
}
// SAFETY: tasks write disjoint parts of C and of the scratch, and only read A and B.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    // A method, so closures capture the whole (Sync) `Job` rather than its raw-pointer fields.
    fn get(&self) -> Job {
        *self
    }
}

/// The dot path: the longer side of C is cut into shares of whole micro-tiles, several per
/// thread (claimed as threads come free), each computed by [`dot_serial`] with its own panels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_gemm(
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: HMat,
    b: HMat,
    c: *mut u16,
    ldc: usize,
    scratch: *mut u8,
) {
    let per = dot_scratch(m, n, k);
    let threads = pool.map_or(1, |p| p.threads());
    let pool = pool.filter(|_| threads > 1 && m * n * k >= 1 << 18);
    let Some(p) = pool else {
        return dot_serial(m, n, k, a, b, c, ldc, scratch);
    };
    let split_m = m / MR >= n / NR;
    let (len, step) = if split_m { (m, MR) } else { (n, NR) };
    // Two shares per thread when each keeps at least a full block of rows or columns.
    let parts = if len >= 2 * threads * 4 * step {
        2 * threads
    } else {
        threads
    };
    let chunk = len.div_ceil(parts).next_multiple_of(step);
    let tasks = len.div_ceil(chunk);
    let job = Job { a, b, c, scratch };
    p.run(tasks, &|t, th| {
        let j = job.get();
        let (s, e) = (t * chunk, ((t + 1) * chunk).min(len));
        let buf = j.scratch.add(th * per);
        if split_m {
            let a = HMat {
                ptr: j.a.ptr.add(s * j.a.rs),
                ..j.a
            };
            dot_serial(e - s, n, k, a, j.b, j.c.add(s * ldc), ldc, buf);
        } else {
            dot_serial(m, e - s, k, j.a, j.b.from_col(s), j.c.add(s), ldc, buf);
        }
    });
}

/// One thread's dot-path product: B panels of `nc` columns over the whole depth, A blocks of
/// `mc` rows, 12×32 tiles.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_serial(
    m: usize,
    n: usize,
    k: usize,
    a: HMat,
    b: HMat,
    c: *mut u16,
    ldc: usize,
    buf: *mut u8,
) {
    let (mc_b, nc_b) = dot_blocking(m, n, k);
    let kp = k.div_ceil(2);
    let pa = buf as *mut u32;
    let pb = pa.add(mc_b * kp);
    // With B read in place (see `direct_b`) the whole width is one panel and nothing is packed.
    let direct = direct_b(m, n, b);
    let mut jc = 0;
    while jc < n {
        let nc = if direct { n } else { (n - jc).min(nc_b) };
        if !direct {
            x86::pack_b_pairs(k, nc, b.from_col(jc), pb);
        }
        let mut ic = 0;
        while ic < m {
            let mc = (m - ic).min(mc_b);
            // Reading B in place, every tile costs a pass over B, and a tile of a few rows is
            // bound by its accumulators' latency (13 rows as 12 + 1 took as long as 12 + 12):
            // the block's rows are shared evenly between as few tiles as hold them (13 rows as
            // 7 + 6). Packed B keeps 12-row tiles.
            let h = if direct {
                mc.div_ceil(mc.div_ceil(MR))
            } else {
                MR
            };
            pack_a_pairs(
                mc,
                k,
                HMat {
                    ptr: a.ptr.add(ic * a.rs),
                    ..a
                },
                pa,
                h,
            );
            let mut jr = 0;
            while jr < nc {
                let cols = (nc - jr).min(NR);
                let mut ir = 0;
                while ir < mc {
                    let rows = (mc - ir).min(h);
                    let (pa, pc) = (pa.add(ir * kp), c.add((ic + ir) * ldc + jc + jr));
                    if direct {
                        // Exactly as many rows of multiply-adds as the tile has.
                        let pb = b.from_col(jr).ptr;
                        macro_rules! tile {
                            ($($r:literal)*) => {
                                match rows {
                                    $($r => x86::micro_dot_direct::<$r>(k, pa, h, pb, b.rs, pc, ldc),)*
                                    _ => x86::micro_dot_direct::<MR>(k, pa, h, pb, b.rs, pc, ldc),
                                }
                            };
                        }
                        tile!(1 2 3 4 5 6 7 8 9 10 11);
                    } else {
                        x86::micro_dot(kp, pa, pb.add(jr * kp), pc, ldc, rows, cols);
                    }
                    ir += h;
                }
                jr += NR;
            }
            ic += mc;
        }
        jc += nc;
    }
}

/// Most rows of C for which the dot path reads a row-major B in place (interleaving its row
/// pairs in registers, again for every tile of rows) instead of packing it: with few rows,
/// packing B — a copy of all of it per product — took as long as the multiply-adds it fed (a
/// short sentence through MiniLM in bf16: 200 → 350 sentences/s), and at 128 rows (a
/// 128-token text) reading it in place was still 5% faster.
const DIRECT_B_MAX_M: usize = 128;

/// Whether [`dot_serial`] reads B in place: row-major, whole 32-column slivers, few rows.
/// `RLX_HGEMM_DIRECT_B=0` turns it off.
fn direct_b(m: usize, n: usize, b: HMat) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| rlx_ir::env::is_off(rlx_ir::env::HGEMM_DIRECT_B));
    !off && b.cs == 1 && n.is_multiple_of(NR) && m <= DIRECT_B_MAX_M
}

/// Two half elements as one word: `lo` in the low 16 bits.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Pack `mc×k` of A into `h`-row slivers (`h <= 12`) of depth pairs: word `(s * kp + q) * h + i`
/// holds `A[hs + i, 2q]` and `A[hs + i, 2q + 1]` (zero past the edges).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
unsafe fn pack_a_pairs(mc: usize, k: usize, a: HMat, dst: *mut u32, h: usize) {
    let kp = k.div_ceil(2);
    let even = k / 2;
    for s in 0..mc.div_ceil(h) {
        let d = dst.add(s * kp * h);
        for i in 0..h {
            let r = s * h + i;
            if r >= mc {
                for q in 0..kp {
                    *d.add(q * h + i) = 0;
                }
                continue;
            }
            let row = a.ptr.add(r * a.rs);
            if a.cs == 1 {
                // Row-major: each pair is already one (unaligned) word.
                for q in 0..even {
                    *d.add(q * h + i) = (row.add(2 * q) as *const u32).read_unaligned();
                }
            } else {
                for q in 0..even {
                    *d.add(q * h + i) = pair(*row.add(2 * q * a.cs), *row.add((2 * q + 1) * a.cs));
                }
            }
            if kp > even {
                *d.add(even * h + i) = pair(*row.add((k - 1) * a.cs), 0);
            }
        }
    }
}

/// The widen path: B widened to f32 once, then chunks of rows of A widened and multiplied by
/// the f32 GEMM into an f32 chunk of C, which is rounded into C.
#[allow(clippy::too_many_arguments)]
unsafe fn widen_gemm(
    pool: Option<&Pool>,
    dt: Half,
    m: usize,
    n: usize,
    k: usize,
    a: HMat,
    b: HMat,
    c: *mut u16,
    ldc: usize,
    scratch: *mut u8,
) {
    let threads = pool.map_or(1, |p| p.threads());
    let r = m.min(WIDEN_ROWS);
    let bw = scratch as *mut f32;
    let aw = bw.add(k * n);
    let cw = aw.add(r * k);
    let gs = cw.add(r * n);
    widen(dt, k, n, b, bw);
    let mut i0 = 0;
    while i0 < m {
        let rows = (m - i0).min(r);
        widen(
            dt,
            rows,
            k,
            HMat {
                ptr: a.ptr.add(i0 * a.rs),
                ..a
            },
            aw,
        );
        // The f32 GEMM's scratch is sized for `threads` threads of an `r`-row product; a
        // shorter last chunk needs less.
        debug_assert!(f32_scratch_len(rows, n, k, threads) <= f32_scratch_len(r, n, k, threads));
        sgemm(
            pool,
            rows,
            n,
            k,
            Mat {
                ptr: aw,
                rs: k,
                cs: 1,
            },
            Mat {
                ptr: bw,
                rs: n,
                cs: 1,
            },
            cw,
            n,
            gs,
        );
        for i in 0..rows {
            let src = std::slice::from_raw_parts(cw.add(i * n), n);
            let dst = std::slice::from_raw_parts_mut(c.add((i0 + i) * ldc), n);
            narrow_row(dt, src, dst);
        }
        i0 += rows;
    }
}

/// Widen a strided `rows×cols` half matrix into a dense row-major f32 one.
unsafe fn widen(dt: Half, rows: usize, cols: usize, x: HMat, dst: *mut f32) {
    if x.panel != 0 {
        // Panel by panel, each a plain strided matrix of up to `PANEL` columns, into its
        // columns of `dst` (rows `cols` apart).
        let mut t = vec![0f32; rows * PANEL];
        for j in (0..cols).step_by(PANEL) {
            let w = (cols - j).min(PANEL);
            let p = HMat {
                panel: 0,
                ..x.from_col(j)
            };
            widen(dt, rows, w, p, t.as_mut_ptr());
            for i in 0..rows {
                std::ptr::copy_nonoverlapping(t.as_ptr().add(i * w), dst.add(i * cols + j), w);
            }
        }
        return;
    }
    for i in 0..rows {
        let d = std::slice::from_raw_parts_mut(dst.add(i * cols), cols);
        let row = x.ptr.add(i * x.rs);
        if x.cs == 1 {
            let s = std::slice::from_raw_parts(row, cols);
            match dt {
                Half::Bf16 => {
                    for (o, &v) in d.iter_mut().zip(s) {
                        *o = f32::from_bits((v as u32) << 16);
                    }
                }
                Half::F16 => {
                    use half::slice::HalfFloatSliceExt;
                    let s: &[half::f16] = std::slice::from_raw_parts(row as *const half::f16, cols);
                    s.convert_to_f32_slice(d);
                }
            }
        } else {
            for (j, o) in d.iter_mut().enumerate() {
                *o = dt.to_f32(*row.add(j * x.cs));
            }
        }
    }
}

/// Round a row of f32 results to `dt`.
fn narrow_row(dt: Half, src: &[f32], dst: &mut [u16]) {
    use half::slice::HalfFloatSliceExt;
    match dt {
        // SAFETY: `bf16` / `f16` are `repr(transparent)` over `u16`.
        Half::Bf16 => unsafe {
            std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut half::bf16, dst.len())
        }
        .convert_from_f32_slice(src),
        Half::F16 => {
            unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut half::f16, dst.len()) }
                .convert_from_f32_slice(src)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 BF16 micro-kernel and B packing of the dot path.

    use super::{pair, HMat, MR, NR};
    use std::arch::x86_64::*;

    /// Pack `k×nc` of B into 32-column slivers of depth pairs: word `(t * kp + q) * 32 + j`
    /// holds `B[2q, 32t + j]` and `B[2q + 1, 32t + j]` (zero past the edges). A row-major
    /// sliver interleaves two rows at a time with 16-lane widenings.
    pub(super) unsafe fn pack_b_pairs(k: usize, nc: usize, b: HMat, dst: *mut u32) {
        let kp = k.div_ceil(2);
        for t in 0..nc.div_ceil(NR) {
            let d = dst.add(t * kp * NR);
            let cols = (nc - t * NR).min(NR);
            let src = b.from_col(t * NR).ptr;
            if b.cs == 1 && cols == NR {
                interleave_rows(k, src, b.rs, d);
                continue;
            }
            for q in 0..kp {
                let dq = d.add(q * NR);
                let r0 = src.add(2 * q * b.rs);
                for j in 0..NR {
                    *dq.add(j) = if j >= cols {
                        0
                    } else if 2 * q + 1 < k {
                        pair(*r0.add(j * b.cs), *r0.add(b.rs + j * b.cs))
                    } else {
                        pair(*r0.add(j * b.cs), 0)
                    };
                }
            }
        }
    }

    /// A full row-major sliver: rows `2q` and `2q + 1` (32 elements each) into 32 words.
    #[target_feature(enable = "avx512f")]
    unsafe fn interleave_rows(k: usize, src: *const u16, rs: usize, d: *mut u32) {
        let even = k / 2;
        for q in 0..even {
            let r0 = src.add(2 * q * rs);
            let r1 = r0.add(rs);
            for h in 0..2 {
                let lo =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256(r0.add(16 * h) as *const __m256i));
                let hi =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256(r1.add(16 * h) as *const __m256i));
                let w = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                _mm512_storeu_si512(d.add(q * NR + 16 * h) as *mut __m512i, w);
            }
        }
        if k % 2 == 1 {
            let r0 = src.add((k - 1) * rs);
            for h in 0..2 {
                let lo =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256(r0.add(16 * h) as *const __m256i));
                _mm512_storeu_si512(d.add(even * NR + 16 * h) as *mut __m512i, lo);
            }
        }
    }

    /// One tile of `R` rows × 32 columns of C from a packed A sliver of height `h >= R` and a
    /// row-major B read in place (`b` at the tile's first column, rows `rs` apart, `k` of them): rows `2q`
    /// and `2q + 1` are interleaved into depth pairs in registers (`vpunpck[lh]wd`, which
    /// leaves columns 0–3, 8–11, … in one register and 4–7, 12–15, … in the other; the
    /// results are put back in order when stored). The same pairs in the same order as
    /// [`micro_dot`] on packed B, so the same bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn micro_dot_direct<const R: usize>(
        k: usize,
        a: *const u32,
        h: usize,
        b: *const u16,
        rs: usize,
        c: *mut u16,
        ldc: usize,
    ) {
        let mut r = [[_mm512_setzero_ps(); 2]; R];
        let kp = k.div_ceil(2);
        for q in 0..kp {
            let r0 = _mm512_loadu_si512(b.add(2 * q * rs) as *const __m512i);
            let r1 = if 2 * q + 1 < k {
                _mm512_loadu_si512(b.add((2 * q + 1) * rs) as *const __m512i)
            } else {
                _mm512_setzero_si512()
            };
            let lo: __m512bh = std::mem::transmute(_mm512_unpacklo_epi16(r0, r1));
            let hi: __m512bh = std::mem::transmute(_mm512_unpackhi_epi16(r0, r1));
            let aq = a.add(q * h);
            for (i, ri) in r.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*aq.add(i) as i32));
                ri[0] = _mm512_dpbf16_ps(ri[0], av, lo);
                ri[1] = _mm512_dpbf16_ps(ri[1], av, hi);
            }
        }
        // Columns 0-15 are lanes 0 of lo, 0 of hi, 1 of lo, 1 of hi; 16-31 lanes 2 and 3.
        let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let second =
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        for (i, ri) in r.iter().enumerate() {
            let cp = c.add(i * ldc);
            for (half, idx) in [first, second].into_iter().enumerate() {
                let x = _mm512_permutex2var_ps(ri[0], idx, ri[1]);
                let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
                _mm256_storeu_si256(cp.add(16 * half) as *mut __m256i, v);
            }
        }
    }

    /// One 12×32 tile of C from packed A and B slivers over `kp` depth pairs; each lane sums
    /// in f32 and is rounded to bf16 once, when stored (only `rows × cols` of it).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn micro_dot(
        kp: usize,
        a: *const u32,
        b: *const u32,
        c: *mut u16,
        ldc: usize,
        rows: usize,
        cols: usize,
    ) {
        let mut r = [[_mm512_setzero_ps(); 2]; MR];
        for q in 0..kp {
            let bq = b.add(q * NR);
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bq as *const __m512i));
            let b1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(bq.add(16) as *const __m512i));
            let aq = a.add(q * MR);
            for (i, ri) in r.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*aq.add(i) as i32));
                ri[0] = _mm512_dpbf16_ps(ri[0], av, b0);
                ri[1] = _mm512_dpbf16_ps(ri[1], av, b1);
            }
        }
        if cols == NR {
            for (i, ri) in r.iter().enumerate().take(rows) {
                let cp = c.add(i * ldc);
                for (h, x) in ri.iter().enumerate() {
                    let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(*x));
                    _mm256_storeu_si256(cp.add(16 * h) as *mut __m256i, v);
                }
            }
        } else {
            let mut t = [[0u16; NR]; MR];
            for (i, ri) in r.iter().enumerate().take(rows) {
                for (h, x) in ri.iter().enumerate() {
                    let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(*x));
                    _mm256_storeu_si256(t[i].as_mut_ptr().add(16 * h) as *mut __m256i, v);
                }
                std::ptr::copy_nonoverlapping(t[i].as_ptr(), c.add(i * ldc), cols);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of every path at every level against the exact sum of the widened operands,
    /// rounded once to the dtype.
    fn check(dt: Half, m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool, threads: usize) {
        check_b(
            dt,
            m,
            n,
            k,
            trans_a,
            if trans_b { B::Trans } else { B::Rows },
            threads,
        )
    }

    /// How B is stored.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum B {
        Rows,
        Trans,
        Panels,
    }

    fn check_b(dt: Half, m: usize, n: usize, k: usize, trans_a: bool, bl: B, threads: usize) {
        let trans_b = bl == B::Trans;
        let val = |i: usize, s: usize| dt.from_f32(((i * s % 29) as f32 - 14.0) / 8.0);
        let a: Vec<u16> = (0..m * k).map(|i| val(i, 7)).collect();
        let b: Vec<u16> = (0..k * n).map(|i| val(i, 5)).collect();
        let (ars, acs) = if trans_a { (1, m) } else { (k, 1) };
        let (brs, bcs) = if trans_b { (1, k) } else { (n, 1) };
        // Stored in panels, the same logical values (row-major `b`) at their panel offsets.
        let stored: Vec<u16> = if bl == B::Panels {
            let mut p = vec![0u16; k * n];
            for r in 0..k {
                for c in 0..n {
                    p[panel_offset(k, r, c)] = b[r * n + c];
                }
            }
            p
        } else {
            b.clone()
        };
        let ldc = n + 3;
        let mut c = vec![0xffffu16; m * ldc];
        let pool = Pool::new(threads);
        let mut scratch = vec![0u32; scratch_bytes(m, n, k, threads, dt) / 4 + 1];
        unsafe {
            hgemm(
                Some(&pool),
                dt,
                m,
                n,
                k,
                HMat::strided(a.as_ptr(), ars, acs),
                if bl == B::Panels {
                    HMat::panels(stored.as_ptr(), k)
                } else {
                    HMat::strided(stored.as_ptr(), brs, bcs)
                },
                c.as_mut_ptr(),
                ldc,
                scratch.as_mut_ptr() as *mut u8,
            )
        };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| {
                        dt.to_f32(a[i * ars + p * acs]) as f64
                            * dt.to_f32(b[p * brs + j * bcs]) as f64
                    })
                    // From +0, as the kernels' accumulators start (`Sum` starts from -0).
                    .fold(0.0, |s, x| s + x);
                // Operands are multiples of 1/8 below 2: every product and partial sum is exact
                // in f32, so each result is the exact sum rounded once, bit for bit.
                let got = c[i * ldc + j];
                assert_eq!(
                    got,
                    dt.from_f32(want as f32),
                    "{dt:?} {m}x{n}x{k} (ta {trans_a}, b {bl:?}, {threads} threads) at ({i},{j}): {} vs {want}",
                    dt.to_f32(got)
                );
            }
            // Past the row's end C is untouched.
            assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|&x| x == 0xffff));
        }
    }

    #[test]
    fn half_products_are_exact_sums_rounded_once_on_every_path_and_edge() {
        crate::isa::for_each_level(|_| {
            for dt in [Half::Bf16, Half::F16] {
                for &(m, n, k) in &[
                    (1, 1, 1),
                    (13, 33, 7),
                    (12, 32, 64),
                    // B read in place: tiles of every height, odd depth, rows shared evenly
                    // between tiles (13 as 7 + 6, 37 as 10 + 10 + 10 + 7).
                    (3, 64, 33),
                    (7, 32, 64),
                    (13, 64, 33),
                    (16, 32, 65),
                    (24, 96, 50),
                    (37, 70, 129),
                    (100, 64, 300),
                ] {
                    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                        check(dt, m, n, k, ta, tb, 1);
                    }
                }
                check(dt, 150, 96, 200, false, false, 2);
                check(dt, 40, 300, 77, false, true, 2);
                check(dt, 16, 1536, 384, false, false, 2);
            }
        });
    }

    /// B stored in column panels gives the same bits as B stored by rows, on every path
    /// (read in place for few rows, packed for many, widened without AVX-512 BF16), with
    /// threads splitting rows or columns.
    #[test]
    fn panel_stored_b_gives_the_same_products() {
        crate::isa::for_each_level(|_| {
            for dt in [Half::Bf16, Half::F16] {
                for &(m, n, k, threads) in &[
                    (1, 32, 1, 1),
                    (13, 64, 33, 1),
                    (15, 384, 96, 1),
                    (7, 96, 65, 2),
                    (150, 96, 200, 2),
                    (300, 64, 40, 1),
                    (16, 1536, 384, 2),
                ] {
                    for ta in [false, true] {
                        check_b(dt, m, n, k, ta, B::Panels, threads);
                    }
                }
            }
        });
    }

    #[test]
    fn empty_depth_gives_zeros() {
        let mut c = vec![7u16; 6];
        let mut s = vec![0u32; scratch_bytes(2, 3, 0, 1, Half::Bf16) / 4 + 1];
        unsafe {
            hgemm(
                None,
                Half::Bf16,
                2,
                3,
                0,
                HMat::strided(std::ptr::null(), 0, 1),
                HMat::strided(std::ptr::null(), 3, 1),
                c.as_mut_ptr(),
                3,
                s.as_mut_ptr() as *mut u8,
            )
        };
        assert!(c.iter().all(|&x| x == 0));
    }
}
