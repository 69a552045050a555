//! f32 GEMM: BLIS-style blocking with packed panels and register-tiled micro-kernels
//! (AVX-512 12x32, AVX2+FMA 6x16, portable 4x8), chosen once at run time.
//!
//! `C[m×n] = A[m×k] · B[k×n]` with arbitrary row/column strides on A and B (so transposed and
//! broadcast operands need no copy beyond packing) and a row-major C.

use crate::pool::Pool;

/// Blocking: depth of a packed panel (one B micro-panel stays in L1), rows of A per packed
/// block (stays in L2), columns of B per packed block. `RLX_GEMM_KC/MC/NC` override them.
fn blocking() -> (usize, usize, usize) {
    static B: std::sync::OnceLock<(usize, usize, usize)> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        let env = |k: &str, d: usize| rlx_ir::env::count(k).unwrap_or(d);
        // Blocks of whole micro-tiles of every instruction set (12 and 32 are multiples of the
        // smaller tiles): a packed operand shared by threads is addressed by them.
        let (mr, nr) = Isa::Avx512.tile();
        (
            env("RLX_GEMM_KC", 256),
            env("RLX_GEMM_MC", 96).next_multiple_of(mr),
            env("RLX_GEMM_NC", 3072).next_multiple_of(nr),
        )
    })
}

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

/// Scratch floats one thread needs for an `m×n×k` product.
pub fn scratch_per_thread(m: usize, n: usize, k: usize) -> usize {
    let (kc_b, mc_b, nc_b) = blocking();
    let kc = k.clamp(1, kc_b);
    Isa::runnable()
        .map(|isa| {
            let (mr, nr) = isa.tile();
            let mc = m.min(mc_b).div_ceil(mr) * mr;
            let nc = n.min(nc_b).div_ceil(nr) * nr;
            kc * (mc + nc) + 16
        })
        .max()
        .unwrap_or(0)
}

/// Total scratch floats for `threads` threads: each thread's packing buffers, then (with
/// several threads) room for one operand packed whole and shared by all of them.
pub fn scratch_len(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let shared = if threads > 1 { shared_len(m, n, k) } else { 0 };
    scratch_per_thread(m, n, k) * threads.max(1) + shared
}

/// Largest operand (floats, padded) packed once and shared between threads.
const SHARED_MAX: usize = 1 << 20;

/// Floats for the shared packed operand of an `m×n×k` product (0 when neither fits).
fn shared_len(m: usize, n: usize, k: usize) -> usize {
    Isa::runnable()
        .flat_map(|isa| {
            let (mr, nr) = isa.tile();
            [k * n.div_ceil(nr) * nr, m.div_ceil(mr) * mr * k]
        })
        .filter(|&x| x <= SHARED_MAX)
        .max()
        .unwrap_or(0)
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
    if empty_product(m, n, k, c, ldc) {
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
                );
            }),
            _ => gemm_serial(isa, m, n, k, a, b, c, ldc, scratch, Shared::None, Tri::Full),
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
    let off = *OFF.get_or_init(|| rlx_ir::env::is_off("RLX_GEMM_DIRECT_B"));
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
    let force = *FORCE.get_or_init(|| rlx_ir::env::get("RLX_GEMM_DIRECT").map(|v| v != "0"));
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
                ic += mc;
            }
            pc += kc;
        }
        jc += nc;
    }
}

/// Pack `mc×kc` of A into `mr`-row slivers: `dst[(s*kc + p)*mr + i]`, zero-padded.
unsafe fn pack_a(
    mc: usize,
    kc: usize,
    mr: usize,
    a: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let mut s = 0;
    #[cfg(target_arch = "x86_64")]
    if rs == 1 && mr == 12 && Isa::current() == Isa::Avx512 {
        // Column-major A (a transposed operand): walk k outermost, so each column of the block
        // is read once as one contiguous run and dealt out to the slivers (sliver by sliver,
        // the k steps are `cs` floats apart and, at power-of-two strides, share a few L1 sets).
        s = mc / mr;
        x86::pack_a_columns(s, kc, a, cs, dst);
    }
    if rs == 1 && mr == 6 {
        // The same walk for 6-row slivers (AVX2), with constant-length copies.
        s = mc / 6;
        for p in 0..kc {
            let col = a.add(p * cs);
            for t in 0..s {
                std::ptr::copy_nonoverlapping(col.add(t * 6), dst.add((t * kc + p) * 6), 6);
            }
        }
    }
    while s * mr < mc {
        let rows = (mc - s * mr).min(mr);
        let d = dst.add(s * kc * mr);
        let src = a.add(s * mr * rs);
        if rows == mr && rs == 1 {
            // Column-major A (a transposed operand): each k step is `mr` contiguous floats.
            for p in 0..kc {
                std::ptr::copy_nonoverlapping(src.add(p * cs), d.add(p * mr), mr);
            }
        } else if rows == mr && cs == 1 {
            // Row-major A: read each row once, sequentially, writing every `mr`-th float.
            for i in 0..mr {
                let r = src.add(i * rs);
                for p in 0..kc {
                    *d.add(p * mr + i) = *r.add(p);
                }
            }
        } else {
            for p in 0..kc {
                let dp = d.add(p * mr);
                for i in 0..rows {
                    *dp.add(i) = *src.add(i * rs + p * cs);
                }
                for i in rows..mr {
                    *dp.add(i) = 0.0;
                }
            }
        }
        s += 1;
    }
}

/// Pack `kc×nc` of B into `nr`-column slivers: `dst[(t*kc + p)*nr + j]`, zero-padded.
unsafe fn pack_b(
    kc: usize,
    nc: usize,
    nr: usize,
    b: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let mut t = 0;
    if cs == 1 && nr == 16 {
        // Row-major B, 16-column slivers (AVX2): walk k outermost, so each row of the panel is
        // read once as one contiguous run and dealt out to the slivers. Sliver by sliver, the
        // reads would be 64-byte pieces `rs` floats apart, which the prefetchers follow poorly
        // (packing is bound by memory here: a large B is read from L3 or DRAM).
        t = nc / 16;
        for p in 0..kc {
            let row = b.add(p * rs);
            for q in 0..t {
                std::ptr::copy_nonoverlapping(row.add(q * 16), dst.add((q * kc + p) * 16), 16);
            }
        }
    }
    while t * nr < nc {
        let cols = (nc - t * nr).min(nr);
        let d = dst.add(t * kc * nr);
        let src = b.add(t * nr * cs);
        let mut p0 = 0;
        #[cfg(target_arch = "x86_64")]
        if rs == 1 && cols == nr && nr.is_multiple_of(16) && Isa::current() == Isa::Avx512 {
            // A transposed B (each column contiguous): 16×16 blocks transposed in registers.
            p0 = kc / 16 * 16;
            x86::pack_b_transposed(p0, nr, src, cs, d);
        }
        #[cfg(target_arch = "x86_64")]
        if rs == 1 && cols == nr && nr == 16 && Isa::current() == Isa::Avx2 {
            p0 = kc / 8 * 8;
            x86::pack_b_transposed8(p0, src, cs, d);
        }
        #[cfg(target_arch = "x86_64")]
        if cs == 1 && cols == nr && nr == 32 && Isa::current() == Isa::Avx512 {
            x86::copy_rows::<32>(kc - p0, src.add(p0 * rs), rs, d.add(p0 * nr));
            p0 = kc;
        }
        for p in p0..kc {
            let dp = d.add(p * nr);
            let sp = src.add(p * rs);
            if cs == 1 && cols == nr {
                std::ptr::copy_nonoverlapping(sp, dp, nr);
            } else {
                for j in 0..cols {
                    *dp.add(j) = *sp.add(j * cs);
                }
                for j in cols..nr {
                    *dp.add(j) = 0.0;
                }
            }
        }
        t += 1;
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
mod tests {
    use super::*;

    fn check(m: usize, n: usize, k: usize, trans_a: bool, threads: usize) {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0)
            .collect();
        let (ars, acs) = if trans_a { (1, m) } else { (k, 1) };
        let mut c = vec![f32::NAN; m * n];
        let pool = Pool::new(threads);
        let mut scratch = vec![0f32; scratch_len(m, n, k, threads)];
        unsafe {
            sgemm(
                Some(&pool),
                m,
                n,
                k,
                Mat {
                    ptr: a.as_ptr(),
                    rs: ars,
                    cs: acs,
                },
                Mat {
                    ptr: b.as_ptr(),
                    rs: n,
                    cs: 1,
                },
                c.as_mut_ptr(),
                n,
                scratch.as_mut_ptr(),
            )
        };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| a[i * ars + p * acs] as f64 * b[p * n + j] as f64)
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{m}x{n}x{k} at ({i},{j}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn triangular_depth_ranges_and_unneeded_tiles_give_the_full_products_sums() {
        crate::isa::for_each_level(|_| {
            // Operands zero on one side of a diagonal (as `tri` promises), in the layouts causal
            // attention's products use: equal, bit for bit, to the full product (whose skipped
            // terms are exact zeros), for tile-aligned and ragged sizes and several offsets.
            for &(m, n, k) in &[
                (64usize, 32usize, 64usize),
                (64, 64, 64),
                (13, 40, 13),
                (50, 33, 47),
                (24, 64, 24),
            ] {
                for off in [-3isize, 0, 2, 17] {
                    for tri in [
                        Tri::RowMax(off),
                        Tri::RowMin(off),
                        Tri::ColMin(off),
                        Tri::Unneeded(off),
                    ] {
                        let zero = |i: usize, j: usize, p: usize| match tri {
                            Tri::RowMax(o) => p as isize > i as isize + o,
                            Tri::RowMin(o) => (p as isize) < i as isize - o,
                            Tri::ColMin(o) => (p as isize) < j as isize - o,
                            Tri::Full | Tri::Unneeded(_) => false,
                        };
                        // A row-major (read in place) or B row-major, with the promised zeros.
                        let mut a: Vec<f32> = (0..m * k)
                            .map(|x| ((x * 7 % 13) as f32 - 6.0) / 7.0)
                            .collect();
                        let mut b: Vec<f32> = (0..k * n)
                            .map(|x| ((x * 5 % 11) as f32 - 5.0) / 5.0)
                            .collect();
                        for i in 0..m {
                            for p in 0..k {
                                if matches!(tri, Tri::RowMax(_) | Tri::RowMin(_)) && zero(i, 0, p) {
                                    a[i * k + p] = 0.0;
                                }
                            }
                        }
                        for p in 0..k {
                            for j in 0..n {
                                if matches!(tri, Tri::ColMin(_)) && zero(0, j, p) {
                                    b[p * n + j] = 0.0;
                                }
                            }
                        }
                        let run = |tri: Tri| {
                            let mut c = vec![f32::NAN; m * n];
                            let mut scratch = vec![0f32; scratch_len(m, n, k, 1)];
                            let (am, bm) = (
                                Mat {
                                    ptr: a.as_ptr(),
                                    rs: k,
                                    cs: 1,
                                },
                                Mat {
                                    ptr: b.as_ptr(),
                                    rs: n,
                                    cs: 1,
                                },
                            );
                            unsafe {
                                sgemm_tri(
                                    m,
                                    n,
                                    k,
                                    am,
                                    bm,
                                    c.as_mut_ptr(),
                                    n,
                                    scratch.as_mut_ptr(),
                                    tri,
                                )
                            };
                            c
                        };
                        let (skipped, full) = (run(tri), run(Tri::Full));
                        // Elements no reader needs are the full product's or zero; the rest equal.
                        let unneeded = |i: usize, j: usize| matches!(tri, Tri::Unneeded(o) if j as isize > i as isize + o);
                        let same = (0..m * n).all(|e| {
                            skipped[e] == full[e] || (unneeded(e / n, e % n) && skipped[e] == 0.0)
                        });
                        assert!(same, "{m}x{n}x{k} {tri:?}: {skipped:?} vs {full:?}");
                        if let Tri::Unneeded(o) = tri {
                            // Whole tiles past the diagonal were left out (the first tile row's
                            // last column tile, when it lies entirely past it).
                            let (mr, nr) = Isa::current().tile();
                            let c0 = (n - 1) / nr * nr;
                            if c0 as isize - o >= mr as isize {
                                assert_eq!(skipped[n - 1], 0.0, "{m}x{n}x{k} {tri:?}");
                            }
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn transposed_b_packs_like_the_scalar_loop() {
        crate::isa::for_each_level(|_| {
            // Column-major B (rs = 1): the register-transposing path must write exactly what the
            // element-by-element loop writes, for kc with and without a remainder of 16.
            for &(kc, nc) in &[(16usize, 32usize), (48, 64), (37, 70), (256, 96)] {
                let cs = kc + 3;
                let b: Vec<f32> = (0..nc * cs).map(|i| i as f32).collect();
                let nr = Isa::current().tile().1;
                let len = kc * nc.div_ceil(nr) * nr;
                let mut fast = vec![f32::NAN; len];
                unsafe { pack_b(kc, nc, nr, b.as_ptr(), 1, cs, fast.as_mut_ptr()) };
                let mut want = vec![f32::NAN; len];
                for t in 0..nc.div_ceil(nr) {
                    for p in 0..kc {
                        for j in 0..nr {
                            let col = t * nr + j;
                            want[(t * kc + p) * nr + j] =
                                if col < nc { b[col * cs + p] } else { 0.0 };
                        }
                    }
                }
                assert_eq!(fast, want, "kc {kc} nc {nc}");
            }
        });
    }

    #[test]
    fn matches_naive_on_edges_and_blocks() {
        crate::isa::for_each_level(|_| {
            for &(m, n, k) in &[
                (1, 1, 1),
                (13, 33, 7),
                (12, 32, 256),
                (25, 70, 300),
                (200, 65, 513),
                (3, 3100, 5),
                // B read in place (few rows, whole slivers): one and several depth panels,
                // column blocks, and every short-tile height.
                (1, 32, 300),
                (13, 64, 7),
                (16, 1536, 1536),
                (24, 96, 513),
                (5, 4096, 40),
            ] {
                check(m, n, k, false, 1);
                check(m, n, k, true, 2);
            }
        });
    }

    #[test]
    fn parallel_shares_match_naive() {
        crate::isa::for_each_level(|_| {
            // Two threads, several shares each: rows split with B packed once (several depth
            // blocks), columns split with A packed once (row-major A wider than the in-place limit,
            // transposed A, several column blocks), columns split with A read in place.
            for &(m, n, k) in &[
                (400, 70, 600),
                (40, 1000, 600),
                (100, 3300, 300),
                (40, 200, 600),
                (2000, 40, 700),
            ] {
                check(m, n, k, false, 2);
                check(m, n, k, true, 2);
            }
        });
    }
}
