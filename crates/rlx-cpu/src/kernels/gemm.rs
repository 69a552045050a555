//! f32 GEMM: BLIS-style blocking with packed panels and register-tiled micro-kernels
//! (AVX-512 12x32, AVX2+FMA 6x16, portable 4x8), chosen once at run time.
//!
//! `C[m×n] = A[m×k] · B[k×n]` with arbitrary row/column strides on A and B (so transposed and
//! broadcast operands need no copy beyond packing) and a row-major C.

use crate::pool::Pool;

mod blocking;
mod pack;

use blocking::{blocking, SHARED_MAX};
pub use blocking::{scratch_len, scratch_per_thread};
use pack::{pack_a, pack_b};

/// Instruction set of the micro-kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F, 12×32 tile.
    Avx512,
    /// AVX2 + FMA, 6×16 tile.
    Avx2,
    /// Portable, 4×8 tile.
    Generic,
}

impl Isa {
    /// The instruction set the micro-kernels use now: [`crate::isa::current`] (the best this
    /// CPU has unless lowered, e.g. by `RLX_ISA` or a test's [`crate::isa::with_level`]).
    pub fn current() -> Isa {
        Isa::of(crate::isa::current())
    }

    fn of(level: crate::isa::Level) -> Isa {
        use crate::isa::Level;
        match level {
            Level::Avx512 => Isa::Avx512,
            Level::Avx2 | Level::Avx2Vnni => Isa::Avx2,
            Level::Portable => Isa::Generic,
        }
    }

    /// Every instruction set this CPU may run: scratch is sized for the largest need among
    /// them, so a product compiled at one level may run at another.
    fn runnable() -> impl Iterator<Item = Isa> {
        crate::isa::levels().map(Isa::of)
    }

    fn tile(self) -> (usize, usize) {
        match self {
            Isa::Avx512 => (12, 32),
            Isa::Avx2 => (6, 16),
            Isa::Generic => (4, 8),
        }
    }
}

/// A strided f32 matrix operand.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    /// Element (0, 0).
    pub ptr: *const f32,
    /// Row stride (elements).
    pub rs: usize,
    /// Column stride (elements).
    pub cs: usize,
}

#[derive(Clone, Copy)]
struct Job {
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    scratch: *mut f32,
}
// SAFETY: tasks write disjoint blocks of C (and of the packing buffers) and read A/B only.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    // A method, so closures capture the whole (Sync) `Job` rather than its raw-pointer fields.
    fn get(&self) -> Job {
        *self
    }
}

/// Work done on each block of C as soon as it is final, while it is still in cache: called with
/// rows `r0..r1` and columns `c0..c1` of the whole C (blocks of one call never overlap, and
/// together they cover C once). A GEMM's epilogue (bias, activation) goes here.
pub type Epilogue<'a> = &'a (dyn Fn(usize, usize, usize, usize) + Sync);

/// A hook and the position of a share's C in the whole C (rows, columns).
type EpiAt<'a> = Option<(Epilogue<'a>, usize, usize)>;

/// `C = A·B`. `scratch` must hold [`scratch_len`]`(m, n, k, pool.threads())` floats when a pool
/// is given (one thread's worth otherwise).
///
/// With several threads the longer side of C is cut into shares of whole micro-tiles. When the
/// operand every share would pack (B when rows are split, A when columns are) fits in 4 MiB, it
/// is packed once, in parallel, and shared; the shares are then four per thread, claimed as
/// threads come free, so a thread on a slower or busier core simply takes fewer (on this
/// project's shared 2-core machine one core is at times ~40% slower than the other). Larger
/// products keep one share per thread, each packing its own panels.
///
/// # Safety
/// A, B and C must be valid for the given sizes and strides; C must not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    scratch: *mut f32,
) {
    sgemm_epilogue(pool, m, n, k, a, b, c, ldc, scratch, None)
}

/// [`sgemm`] running `epi` on every block of C as it becomes final (see [`Epilogue`]).
///
/// # Safety
/// As [`sgemm`]; `epi` may touch only the block of C it is given.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_epilogue(
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    scratch: *mut f32,
    epi: Option<Epilogue<'_>>,
) {
    if empty_product(m, n, k, c, ldc) {
        if let Some(f) = epi.filter(|_| m > 0 && n > 0) {
            f(0, m, 0, n);
        }
        return;
    }
    let isa = Isa::current();
    let (mr, nr) = isa.tile();
    let per = scratch_per_thread(m, n, k);
    let threads = pool.map_or(1, |p| p.threads());
    let job = Job {
        a,
        b,
        c,
        ldc,
        scratch,
    };
    // Split the longer side so every task gets whole micro-tiles.
    let split_m = m / mr >= n / nr;
    let (len, step) = if split_m { (m, mr) } else { (n, nr) };
    let (kc_b, _, _) = blocking();
    let (mpad, npad) = (m.div_ceil(mr) * mr, n.div_ceil(nr) * nr);
    // The operand every task would otherwise pack for itself: B when splitting rows, A when
    // splitting columns (unless A is read in place).
    // It goes after the threads' own buffers (see `scratch_len`; only used when it fits).
    let packed = scratch.wrapping_add(threads * per) as *const f32;
    let shared = if split_m {
        (k * npad <= SHARED_MAX).then_some(Shared::PackedB(packed, npad))
    } else if direct_a(isa, &a, n) {
        Some(Shared::None)
    } else {
        (mpad * k <= SHARED_MAX).then_some(Shared::PackedA(packed, mpad))
    };
    let parallel = threads > 1 && m * n * k >= 1 << 18;
    let pool = pool.filter(|_| parallel);
    let (Some(p), Some(shared)) = (pool, shared) else {
        // One share per thread, each packing what it needs.
        let parts = if parallel { threads } else { 1 };
        let chunk = len.div_ceil(parts).div_ceil(step) * step;
        let tasks = len.div_ceil(chunk.max(1));
        match pool {
            Some(p) if tasks > 1 => p.run(tasks, &|t, th| {
                let j = job.get();
                let s = t * chunk;
                let e = (s + chunk).min(len);
                j.share(
                    isa,
                    split_m,
                    s,
                    e,
                    m,
                    n,
                    k,
                    Shared::None,
                    j.scratch.add(th * per),
                    epi,
                );
            }),
            _ => gemm_serial(
                isa,
                m,
                n,
                k,
                a,
                b,
                c,
                ldc,
                scratch,
                Shared::None,
                Tri::Full,
                epi.map(|f| (f, 0, 0)),
            ),
        }
        return;
    };
    // Several shares per thread, claimed as threads come free, so a thread on a slower (say,
    // shared) core takes fewer. What every share would pack is packed once, in parallel, first.
    let pcs = k.div_ceil(kc_b);
    // Packing tasks: 4 slivers of the shared operand at one depth block each.
    let (plen, piece) = if split_m { (n, nr * 4) } else { (m, mr * 4) };
    let pieces = plen.div_ceil(piece);
    if !matches!(shared, Shared::None) {
        p.run(pcs * pieces, &|t, _| {
            let j = job.get();
            let (pc, i) = (t / pieces * kc_b, t % pieces * piece);
            let kc = (k - pc).min(kc_b);
            match shared.get() {
                Shared::PackedB(dst, npad) => {
                    let cols = (n - i).min(piece);
                    pack_b(
                        kc,
                        cols,
                        nr,
                        j.b.ptr.add(pc * j.b.rs + i * j.b.cs),
                        j.b.rs,
                        j.b.cs,
                        dst.add(pc * npad + i * kc) as *mut f32,
                    );
                }
                Shared::PackedA(dst, mpad) => {
                    let rows = (m - i).min(piece);
                    pack_a(
                        rows,
                        kc,
                        mr,
                        j.a.ptr.add(i * j.a.rs + pc * j.a.cs),
                        j.a.rs,
                        j.a.cs,
                        dst.add(pc * mpad + i * kc) as *mut f32,
                    );
                }
                _ => {}
            }
        });
    }
    let chunk = len.div_ceil(threads * 4).div_ceil(step) * step;
    let tasks = len.div_ceil(chunk);
    p.run(tasks, &|t, th| {
        let j = job.get();
        let s = t * chunk;
        let e = (s + chunk).min(len);
        j.share(
            isa,
            split_m,
            s,
            e,
            m,
            n,
            k,
            shared.get(),
            j.scratch.add(th * per),
            epi,
        );
    });
}

/// Handle a product with nothing to multiply: no rows or columns (nothing to write), or no depth
/// (C is zero). Returns whether it was one.
///
/// # Safety
/// C must be valid for `m` rows of `n` elements, `ldc` apart.
pub(crate) unsafe fn empty_product<T>(m: usize, n: usize, k: usize, c: *mut T, ldc: usize) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        for i in 0..m {
            std::ptr::write_bytes(c.add(i * ldc), 0, n);
        }
        return true;
    }
    false
}

/// Which depths `p` of a product can contribute to an element of C, when one operand is zero
/// on one side of a diagonal (causal attention's probabilities and their gradients): the
/// micro-kernels skip the rest, and tiles with none are zero. Or which tiles of C no reader
/// needs (causal attention's scores above the diagonal): those are zero too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tri {
    /// Every depth.
    Full,
    /// A is zero for `p > i + off`: row `i` of C sums depths `p <= i + off`.
    RowMax(isize),
    /// A is zero for `p < i - off`: row `i` sums depths `p >= i - off`.
    RowMin(isize),
    /// B is zero for `p < j - off`: column `j` sums depths `p >= j - off`.
    ColMin(isize),
    /// No operand has zeros, but C is not needed where column `j > i + off`: tiles entirely
    /// there are written as zeros instead of computed.
    Unneeded(isize),
}

impl Tri {
    /// Depths `lo..hi` a tile of rows `r0..r0 + rows` and columns `c0..c0 + cols` needs.
    fn range(self, r0: usize, rows: usize, c0: usize, k: usize) -> (usize, usize) {
        let clamp = |v: isize| v.clamp(0, k as isize) as usize;
        match self {
            Tri::Full => (0, k),
            Tri::RowMax(off) => (0, clamp((r0 + rows) as isize + off)),
            Tri::RowMin(off) => (clamp(r0 as isize - off), k),
            Tri::ColMin(off) => (clamp(c0 as isize - off), k),
            Tri::Unneeded(off) if c0 as isize - off >= (r0 + rows) as isize => (0, 0),
            Tri::Unneeded(_) => (0, k),
        }
    }
}

/// [`sgemm`] on one thread, for a product whose operands are zero where `tri` says: depths that
/// cannot contribute are skipped (a depth is skipped only where its products are exactly zero,
/// so the sums are those of the full product, up to the sign of a zero), and tiles of C that
/// [`Tri::Unneeded`] names are zero. Products deeper than one packed panel are computed whole.
///
/// # Safety
/// As [`sgemm`] (one thread's scratch); the operands are zero where `tri` says.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_tri(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    scratch: *mut f32,
    tri: Tri,
) {
    let (kc_b, _, _) = blocking();
    if m == 0 || n == 0 || k == 0 || k > kc_b || tri == Tri::Full {
        return sgemm(None, m, n, k, a, b, c, ldc, scratch);
    }
    gemm_serial(
        Isa::current(),
        m,
        n,
        k,
        a,
        b,
        c,
        ldc,
        scratch,
        Shared::None,
        tri,
        None,
    );
}

/// An operand packed once for all threads: where, and the padded rows of A or columns of B.
#[derive(Clone, Copy)]
enum Shared {
    None,
    PackedA(*const f32, usize),
    PackedB(*const f32, usize),
}
// SAFETY: the packed operand is written by disjoint tasks of one dispatch, then only read.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    // A method, so closures capture the whole (Sync) value rather than its raw-pointer fields.
    fn get(&self) -> Shared {
        *self
    }
}

impl Job {
    /// Rows (`split_m`) or columns `s..e` of C; a shared packed operand covers all of the other
    /// side, so it is passed on unchanged.
    #[allow(clippy::too_many_arguments)]
    unsafe fn share(
        &self,
        isa: Isa,
        split_m: bool,
        s: usize,
        e: usize,
        m: usize,
        n: usize,
        k: usize,
        shared: Shared,
        buf: *mut f32,
        epi: Option<Epilogue<'_>>,
    ) {
        let j = self;
        if split_m {
            let a = Mat {
                ptr: j.a.ptr.add(s * j.a.rs),
                ..j.a
            };
            gemm_serial(
                isa,
                e - s,
                n,
                k,
                a,
                j.b,
                j.c.add(s * j.ldc),
                j.ldc,
                buf,
                shared,
                Tri::Full,
                epi.map(|f| (f, s, 0)),
            );
        } else {
            let b = Mat {
                ptr: j.b.ptr.add(s * j.b.cs),
                ..j.b
            };
            gemm_serial(
                isa,
                m,
                e - s,
                k,
                j.a,
                b,
                j.c.add(s),
                j.ldc,
                buf,
                shared,
                Tri::Full,
                epi.map(|f| (f, 0, s)),
            );
        }
    }
}

/// Where the micro-kernels read an A block: element `(i, p)` of the sliver starting at row `ir`
/// is `ptr[ir * step + i * rs + p * cs]`.
#[derive(Clone, Copy)]
struct ABlock {
    ptr: *const f32,
    step: usize,
    rs: usize,
    cs: usize,
}

/// A block's depth-range rule and the position of its first element in the whole C.
#[derive(Clone, Copy)]
struct Tile {
    tri: Tri,
    r0: usize,
    c0: usize,
}

/// Multiply an `mc×kc` A block by a packed `kc×nc` B panel into C (adding when `acc`).
/// Partial slivers of an A read in place are packed into `pa` first.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block(
    isa: Isa,
    mc: usize,
    nc: usize,
    kc: usize,
    a: ABlock,
    pa: *mut f32,
    b: BBlock,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    t: Tile,
) {
    let (mr, nr) = isa.tile();
    let packed = a.rs == 1 && a.cs == mr && a.step == kc;
    let tail = mc % mr;
    if !packed && tail != 0 {
        pack_a(
            tail,
            kc,
            mr,
            a.ptr.add((mc - tail) * a.step),
            a.rs,
            a.cs,
            pa,
        );
    }
    let mut jr = 0;
    while jr < nc {
        let cols = (nc - jr).min(nr);
        let mut ir = 0;
        while ir < mc {
            let rows = (mc - ir).min(mr);
            let (ap, rs, cs) = if packed || rows == mr {
                (a.ptr.add(ir * a.step), a.rs, a.cs)
            } else {
                (pa as *const f32, 1, mr)
            };
            let next = if ir + mr < mc {
                c.add((ir + mr) * ldc + jr)
            } else if jr + nr < nc {
                c.add(jr + nr)
            } else {
                std::ptr::null_mut()
            };
            let (lo, hi) = t.tri.range(t.r0 + ir, rows, t.c0 + jr, kc);
            let ct = c.add(ir * ldc + jr);
            if lo < hi {
                micro(
                    isa,
                    hi - lo,
                    ap.add(lo * cs),
                    rs,
                    cs,
                    b.ptr.add(jr * b.step + lo * b.ld),
                    b.ld,
                    ct,
                    ldc,
                    acc,
                    rows,
                    cols,
                    next,
                );
            } else if !acc {
                // No depth contributes: the tile is zero.
                for i in 0..rows {
                    std::ptr::write_bytes(ct.add(i * ldc), 0, cols);
                }
            }
            ir += mr;
        }
        jr += nr;
    }
}

/// Where a block's B slivers are: sliver column `j` at `ptr + j * step`, depth `p` of it `ld`
/// floats further (packed: `step = kc`, `ld = nr`; read in place: `step = 1`, `ld` = B's row
/// stride).
#[derive(Clone, Copy)]
struct BBlock {
    ptr: *const f32,
    step: usize,
    ld: usize,
}

/// Most rows of C for which the AVX-512 and AVX2 kernels read a row-major B in place instead
/// of packing it: with few rows each B sliver is used by one or two tiles only, so packing (a
/// copy of all of B per product) costs as much as the multiply-adds it feeds.
const DIRECT_B_MAX_M: usize = 24;

/// Whether the kernels read B in place: row-major, whole slivers (no ragged last one to
/// pad), few rows (see [`DIRECT_B_MAX_M`]). `RLX_GEMM_DIRECT_B=0` turns it off.
fn direct_b(isa: Isa, b: &Mat, m: usize, n: usize) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| rlx_ir::env::is_off(rlx_ir::env::GEMM_DIRECT_B));
    let (_, nr) = isa.tile();
    !off && matches!(isa, Isa::Avx512 | Isa::Avx2)
        && b.cs == 1
        && n.is_multiple_of(nr)
        && m <= DIRECT_B_MAX_M
}

/// Whether the AVX-512 and AVX2 kernels read this row-major A in place instead of packing it:
/// when B is narrow, packing A (a strided pass over all of A per `kc` panel) costs a large share
/// of the product, while reading a tile's rows in place stays in cache. (A transposed A packs with
/// contiguous copies and gains nothing.) `RLX_GEMM_DIRECT=0/1` forces the choice.
fn direct_a(isa: Isa, a: &Mat, n: usize) -> bool {
    static FORCE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let force = *FORCE.get_or_init(|| rlx_ir::env::get(rlx_ir::env::GEMM_DIRECT).map(|v| v != "0"));
    matches!(isa, Isa::Avx512 | Isa::Avx2)
        && (a.cs == 1 || (a.rs == 1 && force == Some(true)))
        && force.unwrap_or(isa == Isa::Avx2 || n <= DIRECT_MAX_N)
}

/// Widest B (columns) for which the AVX-512 kernels read A in place by default. The AVX2
/// kernels always do: their 6-row slivers read in place measured as fast or 1-3% faster than
/// packed at every width tried (n = 128 to 3072, an EPYC Zen 3).
const DIRECT_MAX_N: usize = 256;

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_serial(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    buf: *mut f32,
    shared: Shared,
    tri: Tri,
    epi: EpiAt<'_>,
) {
    let (mr, nr) = isa.tile();
    let (kc_b, mc_b, nc_b) = blocking();
    let pa = buf;
    let own_b = buf.add(k.min(kc_b) * m.min(mc_b).div_ceil(mr) * mr);
    let direct = direct_a(isa, &a, n);
    let in_place_b = !matches!(shared, Shared::PackedB(..)) && direct_b(isa, &b, m, n);
    let mut jc = 0;
    while jc < n {
        let nc = (n - jc).min(nc_b);
        let mut pc = 0;
        while pc < k {
            let kc = (k - pc).min(kc_b);
            // A panel packed whole is laid out as consecutive `kc`-deep panels of all its
            // slivers, so the block at (row or column `x`, depth `pc`) is at `pc * pad + x * kc`.
            let pb = if let Shared::PackedB(p, npad) = shared {
                p.add(pc * npad + jc * kc)
            } else if in_place_b {
                b.ptr.add(pc * b.rs + jc)
            } else {
                pack_b(
                    kc,
                    nc,
                    nr,
                    b.ptr.add(pc * b.rs + jc * b.cs),
                    b.rs,
                    b.cs,
                    own_b,
                );
                own_b
            };
            let mut ic = 0;
            while ic < m {
                let mc = (m - ic).min(mc_b);
                let src = a.ptr.add(ic * a.rs + pc * a.cs);
                let ab = if let Shared::PackedA(p, mpad) = shared {
                    ABlock {
                        ptr: p.add(pc * mpad + ic * kc),
                        step: kc,
                        rs: 1,
                        cs: mr,
                    }
                } else if direct {
                    ABlock {
                        ptr: src,
                        step: a.rs,
                        rs: a.rs,
                        cs: a.cs,
                    }
                } else {
                    pack_a(mc, kc, mr, src, a.rs, a.cs, pa);
                    ABlock {
                        ptr: pa,
                        step: kc,
                        rs: 1,
                        cs: mr,
                    }
                };
                // Depth ranges per tile only when the whole depth is one panel.
                let tri = if kc == k {
                    Tile {
                        tri,
                        r0: ic,
                        c0: jc,
                    }
                } else {
                    Tile {
                        tri: Tri::Full,
                        r0: 0,
                        c0: 0,
                    }
                };
                block(
                    isa,
                    mc,
                    nc,
                    kc,
                    ab,
                    pa,
                    if in_place_b {
                        BBlock {
                            ptr: pb,
                            step: 1,
                            ld: b.rs,
                        }
                    } else {
                        BBlock {
                            ptr: pb,
                            step: kc,
                            ld: nr,
                        }
                    },
                    c.add(ic * ldc + jc),
                    ldc,
                    pc > 0,
                    tri,
                );
                // The block's last depth panel: it is final.
                if let (Some((f, r0, c0)), true) = (epi, pc + kc == k) {
                    f(r0 + ic, r0 + ic + mc, c0 + jc, c0 + jc + nc);
                }
                ic += mc;
            }
            pc += kc;
        }
        jc += nc;
    }
}

/// One `mr×nr` tile of C from A read at `a[i * ars + p * acs]` (packed: `ars = 1, acs = mr`)
/// and a packed B sliver. The AVX-512 and AVX2 kernels also read A in place, and prefetch
/// `next`, the C tile of the following call (null for none).
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn micro(
    isa: Isa,
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
    next: *const f32,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if rows <= 8 => {
            x86::micro_short(kc, a, ars, acs, b, ldb, c, ldc, acc, rows, cols)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if ars == 1 => {
            x86::micro_12x32(kc, a, acs, b, ldb, c, ldc, acc, rows, cols, next)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::micro_12x32_rows(kc, a, ars, b, ldb, c, ldc, acc, rows, cols, next),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::micro_avx2(kc, a, ars, acs, b, ldb, c, ldc, acc, rows, cols, next),
        _ => micro_generic(kc, a, b, ldb, c, ldc, acc, rows, cols),
    }
}

/// Write a full `MR×NR` tile held in `t` to C (all or part of it), adding when `acc`.
#[inline(always)]
unsafe fn store_tile<const MR: usize, const NR: usize>(
    t: &[[f32; NR]; MR],
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
) {
    for (i, row) in t.iter().enumerate().take(rows) {
        let cr = c.add(i * ldc);
        for (j, &v) in row.iter().enumerate().take(cols) {
            *cr.add(j) = if acc { *cr.add(j) + v } else { v };
        }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn micro_generic(
    kc: usize,
    a: *const f32,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
    cols: usize,
) {
    let mut t = [[0f32; 8]; 4];
    for p in 0..kc {
        let ap = a.add(p * 4);
        let bp = b.add(p * ldb);
        for (i, row) in t.iter_mut().enumerate() {
            let av = *ap.add(i);
            for (j, v) in row.iter_mut().enumerate() {
                *v += av * *bp.add(j);
            }
        }
    }
    store_tile(&t, c, ldc, acc, rows, cols);
}

pub mod half;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
