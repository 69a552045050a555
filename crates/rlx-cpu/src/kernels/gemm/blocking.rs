//! Blocking and scratch sizing of [`super::sgemm`]: the panel sizes, and the floats of packing
//! buffers (per thread, and for one operand packed whole and shared by threads) a product needs.

use super::Isa;

/// Blocking: depth of a packed panel (one B micro-panel stays in L1), rows of A per packed
/// block (stays in L2), columns of B per packed block. `RLX_GEMM_KC/MC/NC` override them.
pub(super) fn blocking() -> (usize, usize, usize) {
    static B: std::sync::OnceLock<(usize, usize, usize)> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        let env = |v: rlx_ir::env::Var, d: usize| rlx_ir::env::count(v).unwrap_or(d);
        // Blocks of whole micro-tiles of every instruction set (12 and 32 are multiples of the
        // smaller tiles): a packed operand shared by threads is addressed by them.
        let (mr, nr) = Isa::Avx512.tile();
        (
            env(rlx_ir::env::GEMM_KC, 256),
            env(rlx_ir::env::GEMM_MC, 96).next_multiple_of(mr),
            env(rlx_ir::env::GEMM_NC, 3072).next_multiple_of(nr),
        )
    })
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
pub(super) const SHARED_MAX: usize = 1 << 20;

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
