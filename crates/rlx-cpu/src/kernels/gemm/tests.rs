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
                        want[(t * kc + p) * nr + j] = if col < nc { b[col * cs + p] } else { 0.0 };
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
