//! Packing of [`super::sgemm`]'s operands: blocks of A into `mr`-row slivers and of B into
//! `nr`-column slivers, zero-padded, as the micro-kernels read them.

#[cfg(target_arch = "x86_64")]
use super::x86;
use super::Isa;

/// Pack `mc×kc` of A into `mr`-row slivers: `dst[(s*kc + p)*mr + i]`, zero-padded.
pub(super) unsafe fn pack_a(
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
pub(super) unsafe fn pack_b(
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
