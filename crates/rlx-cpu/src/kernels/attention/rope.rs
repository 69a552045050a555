//! Rotary position embedding: the (cos, sin) tables, shared by the `Rope` nodes of one key,
//! and the rotation.

use crate::elem::FloatElem;
use crate::kernels::{kernel, Kernel, TRef};
use crate::layout::Layout;

/// Rotate one f32 head row (`d = 2 * table.len()` elements, source stride `sx`, dense
/// destination) by the (cos, sin) pairs of `table`, as llama.cpp's build computes it: the first
/// product of each output fused with the sum (`fma(a, c, -(b s))`, `fma(a, s, b c)`).
///
/// # Safety
/// `src` addresses `d` elements at stride `sx` and `dst` `d` dense writable elements; `fma` only
/// when the CPU has FMA.
#[inline(always)]
unsafe fn rotate_f32(
    src: *const f32,
    sx: usize,
    dst: *mut f32,
    table: &[(f64, f64)],
    interleaved: bool,
    fma: bool,
) {
    #[inline(always)]
    unsafe fn imp(
        src: *const f32,
        sx: usize,
        dst: *mut f32,
        table: &[(f64, f64)],
        interleaved: bool,
    ) {
        let half = table.len();
        for (k, &(cos, sin)) in table.iter().enumerate() {
            let (ia, ib) = if interleaved {
                (2 * k, 2 * k + 1)
            } else {
                (k, k + half)
            };
            let (a, b) = (*src.add(ia * sx), *src.add(ib * sx));
            let (c, s) = (cos as f32, sin as f32);
            *dst.add(ia) = a.mul_add(c, -(b * s));
            *dst.add(ib) = a.mul_add(s, b * c);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        unsafe fn with_fma(
            src: *const f32,
            sx: usize,
            dst: *mut f32,
            table: &[(f64, f64)],
            interleaved: bool,
        ) {
            imp(src, sx, dst, table, interleaved)
        }
        if fma {
            return with_fma(src, sx, dst, table, interleaved);
        }
    }
    let _ = fma;
    imp(src, sx, dst, table, interleaved)
}

/// Which rotations a `Rope` node's table holds: those of its positions operand (node), base and
/// width, for its sequence length, in f32 (llama.cpp's recurrence) or f64. Nodes with equal keys
/// share one [`RopeTable`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RopeKey {
    pub(crate) positions: usize,
    pub(crate) theta_bits: u32,
    pub(crate) d: usize,
    pub(crate) s_len: usize,
    pub(crate) f32_table: bool,
}

/// (cos, sin) for every sequence position and frequency, shared by the `Rope` nodes of one key
/// (see [`crate::kernels::Shared`]), with the positions they were made for: a run whose positions equal
/// those reads the table, any other makes it anew.
#[derive(Default)]
pub(crate) struct RopeTable(std::sync::Mutex<RopeMemo>);

#[derive(Default)]
struct RopeMemo {
    positions: Vec<i64>,
    pairs: Vec<(f64, f64)>,
    /// The f64 table's frequencies, base^(-2k/d), made when first needed (the f32 table's
    /// recurrence needs none).
    inv: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rope<T: FloatElem>(
    x: TRef,
    pos: TRef,
    it: crate::kernels::index::IndexType,
    out: TRef,
    theta: f32,
    interleaved: bool,
    table: std::sync::Arc<RopeTable>,
) -> Box<dyn Kernel> {
    let r = x.layout.rank();
    let (s_len, d) = (x.layout.dims()[r - 2], x.layout.dims()[r - 1]);
    let half = d / 2;
    let lines = x.layout.remove_axis(r - 1);
    kernel(move |pool| {
        let sx = x.layout.strides()[r - 1];
        let n = lines.numel();
        let f32_table = T::DTYPE == rlx_ir::DType::F32;
        #[cfg(target_arch = "x86_64")]
        let fma = crate::isa::avx2();
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        // SAFETY: positions has length S.
        let position = |s: usize| unsafe {
            crate::kernels::index::read_index(
                &pos,
                it,
                pos.layout.offset + s * pos.layout.strides()[0],
            )
        };
        // The table, made for these positions unless a node sharing it already did this run.
        // For f32 it follows llama.cpp's recurrence in f32 (theta_k = p * s^k with s =
        // base^(-2/d), multiplied step by step), so RLX rotates exactly as llama.cpp does;
        // otherwise f64.
        let mut memo = table.0.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = memo.positions.len() == s_len
            && memo.pairs.len() == s_len * half
            && (0..s_len).all(|s| memo.positions[s] == position(s));
        if !fresh {
            let RopeMemo {
                positions,
                pairs,
                inv,
            } = &mut *memo;
            positions.clear();
            positions.extend((0..s_len).map(position));
            pairs.clear();
            let step = (theta).powf(-2.0 / d as f32);
            if !f32_table && inv.len() != half {
                inv.clear();
                inv.extend((0..half).map(|k| (theta as f64).powf(-2.0 * k as f64 / d as f64)));
            }
            for &p in positions.iter() {
                if f32_table {
                    let mut th = p as f32;
                    pairs.extend((0..half).map(|_| {
                        let e = (th.cos() as f64, th.sin() as f64);
                        th *= step;
                        e
                    }));
                } else {
                    pairs.extend(inv.iter().map(|&inv_k| {
                        let (sin, cos) = (p as f64 * inv_k).sin_cos();
                        (cos, sin)
                    }));
                }
            }
        }
        let tab = &memo.pairs[..];
        crate::kernels::par_ranges(pool, n, 64, |range| {
            let (px, po) = (x.base::<T>() as *const T, out.base::<T>());
            let dense = Layout::contiguous(lines.dims());
            crate::layout::for_each_run(
                lines.dims(),
                [&dense, &lines],
                range,
                |[o0, i0], len, [so, si]| {
                    for t in 0..len {
                        let (o, i) = ((o0 + t * so) * d, i0 + t * si);
                        // Row number within the lines = o / d; its sequence index is that mod S.
                        let s = (o / d) % s_len.max(1);
                        let row = &tab[s * half..(s + 1) * half];
                        if f32_table {
                            // SAFETY: as below.
                            unsafe {
                                rotate_f32(
                                    px.add(i) as *const f32,
                                    sx,
                                    po.add(o) as *mut f32,
                                    row,
                                    interleaved,
                                    fma,
                                )
                            };
                            continue;
                        }
                        for (k, &(cos, sin)) in row.iter().enumerate() {
                            let (ia, ib) = if interleaved {
                                (2 * k, 2 * k + 1)
                            } else {
                                (k, k + half)
                            };
                            // SAFETY: offsets come from layouts.
                            unsafe {
                                let a = (*px.add(i + ia * sx)).to_f64();
                                let b = (*px.add(i + ib * sx)).to_f64();
                                *po.add(o + ia) = T::from_f64(a * cos - b * sin);
                                *po.add(o + ib) = T::from_f64(a * sin + b * cos);
                            }
                        }
                    }
                },
            );
        });
    })
}
