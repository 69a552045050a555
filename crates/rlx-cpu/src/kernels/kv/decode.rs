//! Decode attention: a few queries over the KV cache, per query and head (or, with AVX-512, up
//! to [`GROUP_MAX`] heads of one key head at once), in llama.cpp's float order: blocked f16 dot
//! products reduced in `reduce64`'s order, its exponential and block sums, weights rounded to
//! the cache type, and the value sum taken in 64 lanes by position, then reduced in the same
//! tree. [`PerQuery`] serves the contiguous and the paged cache alike.

use super::*;

/// The per-query attention both cache forms share: one query and one head — or up to
/// [`GROUP_MAX`] heads of one key head ([`attend_avx2`]) — per task, the scores of positions
/// `first..=last` in the thread's scratch slots, lanes by position.
#[derive(Clone, Copy)]
pub(super) struct PerQuery {
    q: TRef,
    k: TRef,
    v: TRef,
    out: TRef,
    reals: Reals,
    kr: Rows,
    vr: Rows,
    scratch: crate::kernels::Ptr,
    scale: f32,
    /// Positions a query may see (the scores' length).
    pub(super) positions: usize,
    simd: bool,
    /// Query heads of one key head a task takes together (see [`attend_group`]): up to
    /// [`GROUP_MAX`] with AVX-512 VL, else 1.
    heads: usize,
}

impl PerQuery {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        q: TRef,
        k: TRef,
        v: TRef,
        out: TRef,
        reals: Reals,
        scratch: crate::kernels::Ptr,
        scale: f32,
        positions: usize,
    ) -> PerQuery {
        #[cfg(target_arch = "x86_64")]
        let simd = crate::isa::avx2();
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        #[cfg(target_arch = "x86_64")]
        let wide = crate::isa::avx512() && std::is_x86_feature_detected!("avx512vl");
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        let group = AttentionShape::of(&q, &k, &v).group;
        PerQuery {
            q,
            k,
            v,
            out,
            reals,
            kr: Rows::of(&k).expect("checked at lowering"),
            vr: Rows::of(&v).expect("checked at lowering"),
            scratch,
            scale,
            positions,
            simd,
            heads: if wide { group.clamp(1, GROUP_MAX) } else { 1 },
        }
    }

    /// Run every (query, head): `span(i)` gives the positions `(first, last)` query `i` sees
    /// (`None`: none, zeros out), `row(i, j)` the cache row of its position `j` (`None`: skipped).
    ///
    /// # Safety
    /// Every row `row` gives lies inside the cache; `last < positions`.
    pub(super) unsafe fn run(
        &self,
        pool: &Pool,
        span: impl Fn(usize) -> Option<(usize, usize)> + Sync,
        row: impl Fn(usize, usize) -> Option<usize> + Sync,
    ) {
        let PerQuery {
            q,
            k,
            v,
            out,
            reals,
            kr,
            vr,
            scratch,
            scale,
            positions,
            simd,
            heads,
        } = *self;
        let AttentionShape {
            s_len,
            hq: _,
            dh,
            hkv,
            dv,
            group,
        } = AttentionShape::of(&q, &k, &v);
        let [qs, ks, vs, os] = [&q, &k, &v, &out].map(|t| t.layout.strides());
        let cdt = reals.k;
        let slot = scratch_floats(positions, dh, dv);
        // A task: one query, one key head, `heads` of its query heads (the last chunk fewer).
        let chunks = group.div_ceil(heads);
        pool.run(s_len * hkv * chunks, &|task, thread| {
            let (i, kh, c) = (task / (hkv * chunks), task / chunks % hkv, task % chunks);
            let h0 = kh * group + c * heads;
            let n = heads.min(kh * group + group - h0);
            let zero = |h: usize| {
                let oo = out.layout.offset + i * os[0] + h * os[1];
                (0..dv).for_each(|d| store(&out, reals.out, oo + d * os[2], 0.0));
            };
            let Some((first, last)) = span(i) else {
                (h0..h0 + n).for_each(zero);
                return;
            };
            // SAFETY (of the block): each task owns its (query, head) output rows and its
            // thread's scratch slots; cache rows come from `row`, inside the cache.
            let (koff, voff) = (k.layout.offset + kh * ks[1], v.layout.offset + kh * vs[1]);
            let (ks0, vs0) = (ks[0], vs[0]);
            let kpos = |j: usize| row(i, j).map(|r| koff + r * ks0);
            let vpos = |j: usize| row(i, j).map(|r| voff + r * vs0);
            // Lane rows that receive a product: all of them once the range spans a block,
            // else the lanes first % 64 ..= last % 64. Untouched rows count as zero below.
            let (lo, hi) = if last / LANES == first / LANES {
                (first % LANES, last % LANES + 1)
            } else {
                (0, LANES)
            };
            // Head `g` of the chunk: its scores, query and lane rows in slot `g`.
            let parts = |g: usize| {
                let buf = scratch.get().add((thread * GROUP_MAX + g) * slot * 4) as *mut f32;
                let h = h0 + g;
                let qv = std::slice::from_raw_parts_mut(buf.add(positions), dh);
                let qo = q.layout.offset + i * qs[0] + h * qs[1];
                for (d, x) in qv.iter_mut().enumerate() {
                    *x = round_to(cdt, load(&q, reals.q, qo + d * qs[2]));
                }
                (
                    std::slice::from_raw_parts_mut(buf, positions),
                    qv,
                    std::slice::from_raw_parts_mut(buf.add(positions + dh), LANES * dv),
                )
            };
            let finish = |h: usize, acc: &mut [f32]| {
                let oo = out.layout.offset + i * os[0] + h * os[1];
                reduce_lanes(acc, dv, lo, hi, simd);
                for (d, v) in acc[..dv].iter().enumerate() {
                    store(&out, reals.out, oo + d * os[2], *v);
                }
            };
            #[cfg(target_arch = "x86_64")]
            if simd {
                let span = Span {
                    first,
                    last,
                    lo,
                    hi,
                    scale,
                    cdt,
                };
                // SAFETY: the CPU has the features (`heads > 1` only with AVX-512 VL); each
                // head its own slot; rows as above.
                macro_rules! group {
                    ($($g:literal)*) => {{
                        let mut sl = [$(parts($g)),*];
                        let ok = attend_avx2(&mut sl, dv, kr, vr, span, &kpos, &vpos);
                        for (g, (_, _, acc)) in sl.iter_mut().enumerate() {
                            if ok[g] {
                                finish(h0 + g, acc);
                            } else {
                                zero(h0 + g);
                            }
                        }
                    }};
                }
                match n {
                    1 => group!(0),
                    2 => group!(0 1),
                    _ => group!(0 1 2),
                }
                return;
            }
            for g in 0..n {
                let h = h0 + g;
                let (sc, qv, acc) = parts(g);
                let mut mx = f32::NEG_INFINITY;
                for (j, s) in sc.iter_mut().enumerate().take(last + 1).skip(first) {
                    *s = match kpos(j) {
                        Some(at) => row_dot(qv, kr, at) * scale,
                        None => f32::NEG_INFINITY,
                    };
                    mx = mx.max(*s);
                }
                if mx == f32::NEG_INFINITY {
                    zero(h);
                    continue;
                }
                let inv = (1.0 / exp_blocks(sc, first, last, mx)) as f32;
                acc[lo * dv..hi * dv].fill(0.0);
                for (j, &e) in sc.iter().enumerate().take(last + 1).skip(first) {
                    let Some(at) = vpos(j) else { continue };
                    let lane = &mut acc[(j % LANES) * dv..][..dv];
                    row_axpy(lane, round_to(cdt, e * inv), vr, at);
                }
                finish(h, acc);
            }
        });
    }
}

/// Where one query's attention runs: positions `first..=last`, lane rows `lo..hi`, the score
/// scale and the cache type.
#[derive(Clone, Copy)]
struct Span {
    first: usize,
    last: usize,
    lo: usize,
    hi: usize,
    scale: f32,
    cdt: Real,
}

/// Eight elements of a cache row from element `at` as f32 (`$h`: the row is f16).
#[cfg(target_arch = "x86_64")]
macro_rules! ld8 {
    ($h:expr, $p:expr, $at:expr) => {
        if $h {
            _mm256_cvtph_ps(_mm_loadu_si128(
                ($p as *const u16).add($at) as *const __m128i
            ))
        } else {
            _mm256_loadu_ps(($p as *const f32).add($at))
        }
    };
}

/// One element of a cache row as f32 (`$h`: the row is f16).
#[cfg(target_arch = "x86_64")]
macro_rules! ld1 {
    ($h:expr, $p:expr, $at:expr) => {
        if $h {
            f16::from_bits(*($p as *const u16).add($at)).to_f32()
        } else {
            *($p as *const f32).add($at)
        }
    };
}

/// Query heads of one key head that decode attention takes together at most.
pub(super) const GROUP_MAX: usize = 3;

/// One query's attention for one to [`GROUP_MAX`] query heads of one key head, compiled for
/// AVX2 with the cache types fixed: the scores of the positions, their softmax weights rounded
/// to the cache type, and the 64 lane rows of the value sum (row `l` holding positions
/// `j % 64 == l` in order), each accumulated in registers rather than in memory. The operations
/// and their order are those of the portable path, head by head; heads taken together
/// (grouped-query attention) share each key and value row's load, conversion and location, so
/// each head's result is bit for bit the one it gets alone. `heads[g]` = (scores, query, lane
/// rows) of head `g`; `kpos`/`vpos` give a position's key/value row offset (`None`: not in the
/// cache). Returns, per head, whether any position was visible.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and AVX-512 F and VL for more than one head (the
/// accumulators of three heads need its 32 registers); each head's scores hold `last + 1`
/// floats and its lane rows `64 * dv`; every offset `kpos`/`vpos` gives starts a whole row of
/// `kr`/`vr`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
unsafe fn attend_avx2(
    heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
    dv: usize,
    kr: Rows,
    vr: Rows,
    span: Span,
    kpos: &impl Fn(usize) -> Option<usize>,
    vpos: &impl Fn(usize) -> Option<usize>,
) -> [bool; GROUP_MAX] {
    let raw = |r: Rows| match r {
        Rows::F16(p) => (true, p as *const u8),
        Rows::F32(p) => (false, p as *const u8),
    };
    let ((kh, kp), (vh, vp)) = (raw(kr), raw(vr));
    /// The one-head form on AVX2 and the grouped forms on AVX-512 VL.
    macro_rules! forms {
        ($($name:ident, $features:literal);*) => {$(
            #[target_feature(enable = $features)]
            #[allow(clippy::type_complexity)]
            unsafe fn $name<const KH: bool, const VH: bool, const G: usize>(
                heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
                dv: usize,
                kp: *const u8,
                vp: *const u8,
                span: Span,
                kpos: &impl Fn(usize) -> Option<usize>,
                vpos: &impl Fn(usize) -> Option<usize>,
            ) -> [bool; GROUP_MAX] {
                attend_heads::<KH, VH, G>(heads, dv, kp, vp, span, kpos, vpos)
            }
        )*};
    }
    forms!(one, "avx2,fma,f16c"; wide, "avx2,fma,f16c,avx512f,avx512vl");
    macro_rules! go {
        ($k:literal, $v:literal) => {
            match heads.len() {
                1 => one::<$k, $v, 1>(heads, dv, kp, vp, span, kpos, vpos),
                2 => wide::<$k, $v, 2>(heads, dv, kp, vp, span, kpos, vpos),
                _ => wide::<$k, $v, 3>(heads, dv, kp, vp, span, kpos, vpos),
            }
        };
    }
    match (kh, vh) {
        (true, true) => go!(true, true),
        (true, false) => go!(true, false),
        (false, true) => go!(false, true),
        (false, false) => go!(false, false),
    }
}

/// The body of [`attend_avx2`] for `G` heads (`heads.len() == G`) and keys (`KH`) and values
/// (`VH`) stored as f16 (else f32).
///
/// # Safety
/// As [`attend_avx2`], inlined into a function with its features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    clippy::type_complexity,
    clippy::needless_range_loop
)]
unsafe fn attend_heads<const KH: bool, const VH: bool, const G: usize>(
    heads: &mut [(&mut [f32], &mut [f32], &mut [f32])],
    dv: usize,
    kp: *const u8,
    vp: *const u8,
    span: Span,
    kpos: &impl Fn(usize) -> Option<usize>,
    vpos: &impl Fn(usize) -> Option<usize>,
) -> [bool; GROUP_MAX] {
    use std::arch::x86_64::*;
    let (first, last, lo, hi) = (span.first, span.last, span.lo, span.hi);
    let (scale, cdt) = (span.scale, span.cdt);
    let dh = heads[0].1.len();
    let full = dh / LANES * LANES;
    let q: [*const f32; G] = std::array::from_fn(|g| heads[g].1.as_ptr());
    let sc: [*mut f32; G] = std::array::from_fn(|g| heads[g].0.as_mut_ptr());
    let mut mx = [f32::NEG_INFINITY; G];
    let vrow = dv * if VH { 2 } else { 4 };
    // The value rows are read lane by lane below (64 positions apart), which the hardware
    // prefetcher does not follow: ask for each as its position's score is made.
    let fetch_value = |j: usize| {
        if let Some(at) = vpos(j) {
            let p = vp.add(at * if VH { 2 } else { 4 });
            let mut o = 0;
            while o < vrow {
                _mm_prefetch::<_MM_HINT_T0>(p.add(o) as *const i8);
                o += 64;
            }
        }
    };
    let mut j = first;
    while j <= last {
        // Eight positions whose keys are all in the cache, for heads of whole blocks (no
        // leftover products): their eight-lane sums reduced together, each position's lanes
        // added in the pairs the one-position reduction below adds (lanes i and i + 4, then
        // 0 + 2 and 1 + 3, then the two), so the same scores.
        if full == dh && j + 8 <= last + 1 {
            let at: [Option<usize>; 8] = std::array::from_fn(|p| kpos(j + p));
            if at.iter().all(Option::is_some) {
                let mut hv = [[_mm256_setzero_ps(); 8]; G];
                for (p, at) in at.iter().enumerate() {
                    fetch_value(j + p);
                    let h = lane_sums::<KH, G>(&q, kp, at.unwrap_unchecked(), full);
                    for g in 0..G {
                        hv[g][p] = h[g];
                    }
                }
                for g in 0..G {
                    let s = _mm256_mul_ps(sum_lanes8(&hv[g]), _mm256_set1_ps(scale));
                    _mm256_storeu_ps(sc[g].add(j), s);
                    for p in 0..8 {
                        mx[g] = mx[g].max(*sc[g].add(j + p));
                    }
                }
                j += 8;
                continue;
            }
        }
        fetch_value(j);
        let Some(at) = kpos(j) else {
            for g in 0..G {
                *sc[g].add(j) = f32::NEG_INFINITY;
            }
            j += 1;
            continue;
        };
        let h = lane_sums::<KH, G>(&q, kp, at, full);
        for g in 0..G {
            let mut t = sum_lanes(h[g]) as f64;
            for d in full..dh {
                t += (*q[g].add(d) * ld1!(KH, kp, at + d)) as f64;
            }
            let s = t as f32 * scale;
            *sc[g].add(j) = s;
            mx[g] = mx[g].max(s);
        }
        j += 1;
    }
    let mut ok = [false; GROUP_MAX];
    for g in 0..G {
        if mx[g] == f32::NEG_INFINITY {
            continue;
        }
        ok[g] = true;
        let w = &mut heads[g].0[..=last];
        let inv = (1.0 / exp_blocks(w, first, last, mx[g])) as f32;
        let w = &mut w[first..];
        for e in w.iter_mut() {
            *e *= inv;
        }
        round_slice(cdt, w);
    }
    if !ok.contains(&true) {
        return ok;
    }
    // The heads with no visible position keep their scores out of the sums (their lane rows are
    // not read): give them zero weights so the shared loop below stays branch-free.
    for g in 0..G {
        if !ok[g] {
            heads[g].0[first..=last].fill(0.0);
        }
    }
    let sc: [*const f32; G] = std::array::from_fn(|g| heads[g].0.as_ptr());
    let acc: [*mut f32; G] = std::array::from_fn(|g| heads[g].2.as_mut_ptr());
    // The lane rows of `attend_avx2`, every head's from the same value registers.
    for l in lo..hi {
        let j0 = first + (l + LANES - first % LANES) % LANES;
        let mut c = 0;
        while c + 64 <= dv {
            let mut r = [[_mm256_setzero_ps(); 8]; G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let mut wv = [_mm256_setzero_ps(); G];
                    for g in 0..G {
                        wv[g] = _mm256_set1_ps(*sc[g].add(j));
                    }
                    for m in 0..8 {
                        let vv = ld8!(VH, vp, at + c + 8 * m);
                        for g in 0..G {
                            r[g][m] = _mm256_fmadd_ps(wv[g], vv, r[g][m]);
                        }
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                for m in 0..8 {
                    _mm256_storeu_ps(acc[g].add(l * dv + c + 8 * m), r[g][m]);
                }
            }
            c += 64;
        }
        while c + 8 <= dv {
            let mut r = [_mm256_setzero_ps(); G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let vv = ld8!(VH, vp, at + c);
                    for g in 0..G {
                        r[g] = _mm256_fmadd_ps(_mm256_set1_ps(*sc[g].add(j)), vv, r[g]);
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                _mm256_storeu_ps(acc[g].add(l * dv + c), r[g]);
            }
            c += 8;
        }
        for d in c..dv {
            let mut a = [0f32; G];
            let mut j = j0;
            while j <= last {
                if let Some(at) = vpos(j) {
                    let x = ld1!(VH, vp, at + d);
                    for g in 0..G {
                        a[g] += *sc[g].add(j) * x;
                    }
                }
                j += LANES;
            }
            for g in 0..G {
                *acc[g].add(l * dv + d) = a[g];
            }
        }
    }
    ok
}

/// `row_dot`'s products of the whole 64-element blocks (`full` elements) of `G` queries with the
/// key row at `at`, each key register shared by the queries, summed over the blocks' eight
/// registers in `reduce64`'s order: lane `d % 8` of each query's sum.
///
/// # Safety
/// Inlined into a function with AVX2, FMA and F16C; each query holds `full` floats and the key
/// row `full` elements from `at`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn lane_sums<const KH: bool, const G: usize>(
    q: &[*const f32; G],
    kp: *const u8,
    at: usize,
    full: usize,
) -> [std::arch::x86_64::__m256; G] {
    use std::arch::x86_64::*;
    let mut a = [[_mm256_setzero_ps(); LANES / 8]; G];
    let mut b = 0;
    while b < full {
        for m in 0..LANES / 8 {
            let kv = ld8!(KH, kp, at + b + 8 * m);
            for g in 0..G {
                a[g][m] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g].add(b + 8 * m)), kv, a[g][m]);
            }
        }
        b += LANES;
    }
    // (Loops rather than closures here and below: a closure does not get the target features
    // of the function it is inlined into, and its intrinsics would be calls.)
    let mut h = [_mm256_setzero_ps(); G];
    for g in 0..G {
        let a = &a[g];
        let x0 = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let x1 = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        h[g] = _mm256_add_ps(x1, x0);
    }
    h
}

/// The sum of a register's eight lanes in `reduce64`'s order: lanes i + (i + 4), then
/// 0 + 2 and 1 + 3, then the two.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_lanes(h: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let q4 = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
    let q2 = _mm_add_ps(q4, _mm_movehl_ps(q4, q4));
    _mm_cvtss_f32(_mm_add_ss(q2, _mm_shuffle_ps(q2, q2, 1)))
}

/// [`sum_lanes`] of eight registers at once, lane `p` of the result the sum of `h[p]`: the same
/// pairs added in the same order, so the same bits, in ~3 instructions a register instead of 6.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_lanes8(h: &[std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // Registers 2k and 2k + 1: lanes i + (i + 4) of each, in one register's two halves.
    let mut quad = [_mm256_setzero_ps(); 4];
    for (k, x) in quad.iter_mut().enumerate() {
        let (a, b) = (h[2 * k], h[2 * k + 1]);
        *x = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(a, b),
            _mm256_permute2f128_ps::<0x20>(a, b),
        );
    }
    // Lanes 0 + 2 and 1 + 3 of registers (0, 2), (1, 3) and (4, 6), (5, 7).
    let mut r = [_mm256_setzero_ps(); 2];
    for (i, x) in r.iter_mut().enumerate() {
        let (a, b) = (quad[2 * i], quad[2 * i + 1]);
        *x = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        );
    }
    let [r0, r1] = r;
    // The two: registers 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high; then in order.
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(r0, r1),
        _mm256_shuffle_ps::<0b11_01_11_01>(r0, r1),
    );
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Sum the 64 lane rows `acc[l * dv..]` (live: `lo..hi`) into row 0 in [`reduce64`]'s order,
/// for every column at once; rows outside `lo..hi` count as zero.
fn reduce_lanes(acc: &mut [f32], dv: usize, lo: usize, hi: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd && lo == 0 && hi == LANES {
        // SAFETY: `simd` is set only when the CPU has AVX2; `acc` holds the 64 rows.
        unsafe { reduce_all_lanes(acc, dv) };
        return;
    }
    // Adding a zero row is a copy.
    let mut live: [bool; LANES] = std::array::from_fn(|l| (lo..hi).contains(&l));
    let mut combine = |dst: usize, a: usize, b: usize| {
        let (src, other) = match (live[a], live[b]) {
            (true, true) => (a, Some(b)),
            (true, false) => (a, None),
            (false, true) => (b, None),
            (false, false) => {
                live[dst] = false;
                return;
            }
        };
        // SAFETY: the three rows lie in `acc`; `dst` may be `src` (element-wise).
        unsafe {
            let base = acc.as_mut_ptr();
            add_rows(
                base.add(dst * dv),
                base.add(src * dv),
                other.map(|o| base.add(o * dv) as *const f32),
                dv,
                simd,
            );
        }
        live[dst] = true;
    };
    for l in 0..16 {
        combine(l, l, l + 32);
        combine(l + 16, l + 16, l + 48);
        combine(l, l, l + 16);
    }
    for l in 0..8 {
        combine(l, l + 8, l);
    }
    for l in 0..4 {
        combine(l, l + 4, l);
    }
    combine(0, 2, 0);
    combine(1, 3, 1);
    combine(0, 0, 1);
}

/// [`reduce_lanes`] when every lane row is live (a range of 64 positions or more): the same
/// sums in the same order — rows `l + 32`, `l + 16`, `l + 48` into `l`, then `l + 8`, `l + 4`,
/// `2`, `3` and `1` — taken eight columns at a time in registers, each lane row read once
/// instead of every partial sum being stored and read back.
///
/// # Safety
/// The CPU has AVX; `acc` holds `64 * dv` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn reduce_all_lanes(acc: &mut [f32], dv: usize) {
    use std::arch::x86_64::*;
    let p = acc.as_mut_ptr();
    let mut c = 0;
    while c + 8 <= dv {
        macro_rules! row {
            ($l:expr) => {
                _mm256_loadu_ps(p.add(($l) * dv + c))
            };
        }
        // Lane rows q, q + 32, q + 16 and q + 48 summed as the first level sums them.
        macro_rules! quad {
            ($q:expr) => {
                _mm256_add_ps(
                    _mm256_add_ps(row!($q), row!($q + 32)),
                    _mm256_add_ps(row!($q + 16), row!($q + 48)),
                )
            };
        }
        let mut e = [_mm256_setzero_ps(); 4];
        for (l, e) in e.iter_mut().enumerate() {
            let d = _mm256_add_ps(quad!(l + 8), quad!(l));
            let d4 = _mm256_add_ps(quad!(l + 12), quad!(l + 4));
            *e = _mm256_add_ps(d4, d);
        }
        let (f0, f1) = (_mm256_add_ps(e[2], e[0]), _mm256_add_ps(e[3], e[1]));
        _mm256_storeu_ps(p.add(c), _mm256_add_ps(f0, f1));
        c += 8;
    }
    for c in c..dv {
        let r = |l: usize| *p.add(l * dv + c);
        let quad = |q: usize| (r(q) + r(q + 32)) + (r(q + 16) + r(q + 48));
        let e: [f32; 4] =
            std::array::from_fn(|l| (quad(l + 12) + quad(l + 4)) + (quad(l + 8) + quad(l)));
        *p.add(c) = (e[2] + e[0]) + (e[3] + e[1]);
    }
}

/// `x[d] = y[d] + z[d]` for `d < n` (`y[d] + 0.0` without `z`), eight at a time with AVX.
///
/// # Safety
/// The three rows hold `n` floats; `x` may be `y` or `z` (element-wise), else they do not
/// overlap. `simd` only when the CPU has AVX2.
#[inline]
unsafe fn add_rows(x: *mut f32, y: *const f32, z: Option<*const f32>, n: usize, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        #[target_feature(enable = "avx")]
        unsafe fn avx(x: *mut f32, y: *const f32, z: Option<*const f32>, n: usize) {
            use std::arch::x86_64::*;
            let mut d = 0;
            while d + 8 <= n {
                let b = z.map_or(_mm256_setzero_ps(), |z| _mm256_loadu_ps(z.add(d)));
                _mm256_storeu_ps(x.add(d), _mm256_add_ps(_mm256_loadu_ps(y.add(d)), b));
                d += 8;
            }
            for d in d..n {
                *x.add(d) = *y.add(d) + z.map_or(0.0, |z| *z.add(d));
            }
        }
        // SAFETY: the CPU has AVX; the rows as the caller promises.
        return avx(x, y, z, n);
    }
    let _ = simd;
    match z {
        Some(z) => (0..n).for_each(|d| *x.add(d) = *y.add(d) + *z.add(d)),
        None => (0..n).for_each(|d| *x.add(d) = *y.add(d) + 0.0),
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The all-lanes reduction in registers is bit for bit the row-by-row one, with and
    /// without leftover columns, on values of mixed magnitudes.
    #[test]
    fn all_lanes_reduced_in_registers_equal_row_by_row() {
        if !crate::isa::avx2() {
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for dv in [64usize, 12, 256] {
            let acc: Vec<f32> = (0..LANES * dv)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    unit * 2f32.powi(((seed >> 20) % 24) as i32 - 12)
                })
                .collect();
            let (mut fast, mut slow) = (acc.clone(), acc);
            reduce_lanes(&mut fast, dv, 0, LANES, true);
            reduce_lanes(&mut slow, dv, 0, LANES, false);
            for d in 0..dv {
                assert_eq!(fast[d].to_bits(), slow[d].to_bits(), "dv {dv} column {d}");
            }
        }
    }

    /// Eight registers' lane sums taken at once are bit for bit each register's sum alone, on
    /// values of mixed magnitudes (whose sums round differently when the pairs change).
    #[test]
    fn eight_lane_sums_at_once_equal_each_alone() {
        if !crate::isa::avx2() {
            return;
        }
        #[target_feature(enable = "avx2")]
        unsafe fn check() {
            use std::arch::x86_64::*;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                unit * 2f32.powi(((seed >> 20) % 24) as i32 - 12)
            };
            for _ in 0..500 {
                let h: [__m256; 8] = std::array::from_fn(|_| {
                    let v: [f32; 8] = std::array::from_fn(|_| next());
                    _mm256_loadu_ps(v.as_ptr())
                });
                let mut got = [0f32; 8];
                _mm256_storeu_ps(got.as_mut_ptr(), sum_lanes8(&h));
                for (p, g) in got.iter().enumerate() {
                    assert_eq!(g.to_bits(), sum_lanes(h[p]).to_bits(), "register {p}");
                }
            }
        }
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { check() }
    }
}
