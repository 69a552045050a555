//! Complex values on the CPU: the three complex primitives (`complex`, `real`, `imag`: a c64
//! element is an f32 real part followed by an f32 imaginary part) and the Fourier transforms
//! (`rustfft` for `fft` / `ifft`, `realfft` for `rfft` / `irfft`, any length, lines split over
//! the pool). Every other op over complex values reaches the CPU as its complex form (real ops
//! on the parts).

use super::registered::{view, CpuKernel};
use super::{par_ranges, Ptr};
use crate::pool::Pool;
use realfft::RealFftPlanner;
use rlx_ir::ops::{Complex, DefinedOp, Fft, FftKind, Imag, Real};
use rlx_ir::{Op, Shape};
use rustfft::num_complex::Complex32;
use rustfft::FftPlanner;
use std::sync::{Arc, Mutex, OnceLock};

/// Whether the CPU runs `op` on complex operands or results itself.
pub(super) fn takes_complex(op: &Op) -> bool {
    match op {
        Op::Defined(d) => kernel_of(d).is_some(),
        _ => false,
    }
}

/// The kernel of a complex primitive or a transform.
pub(super) fn kernel_of(op: &DefinedOp) -> Option<CpuKernel> {
    if op.downcast::<Complex>().is_some() {
        return Some(Arc::new(|_, ins, out, shape, _| join(ins, out, shape)));
    }
    if op.downcast::<Real>().is_some() {
        return Some(Arc::new(|_, ins, out, _, _| part(ins[0].0, out, 0)));
    }
    if op.downcast::<Imag>().is_some() {
        return Some(Arc::new(|_, ins, out, _, _| part(ins[0].0, out, 4)));
    }
    let f = *op.downcast::<Fft>()?;
    Some(Arc::new(move |_, ins, out, _, pool| {
        if (out.as_ptr() as usize).is_multiple_of(4) {
            transform(f, ins[0], out, pool)
        } else {
            let mut tmp = vec![0f32; out.len() / 4];
            // SAFETY: `tmp` holds `out.len()` bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(tmp.as_mut_ptr() as *mut u8, out.len()) };
            transform(f, ins[0], bytes, pool);
            out.copy_from_slice(bytes);
        }
    }))
}

/// `complex(re, im)`, each part broadcast to the result.
fn join(ins: &[(&[u8], &Shape)], out: &mut [u8], shape: &Shape) {
    let od = shape.static_dims().unwrap_or_default();
    for (p, (bytes, s)) in ins.iter().enumerate() {
        let d = s.static_dims().unwrap_or_default();
        let at = 4 * p;
        if d == od {
            for (o, v) in out.chunks_exact_mut(8).zip(bytes.chunks_exact(4)) {
                o[at..at + 4].copy_from_slice(v);
            }
        } else {
            let map = rlx_ir::eval::broadcast_map(&d, &od);
            for (o, &src) in out.chunks_exact_mut(8).zip(&map) {
                o[at..at + 4].copy_from_slice(&bytes[4 * src..4 * src + 4]);
            }
        }
    }
}

/// The part at byte offset `at` (0: real, 4: imaginary) of each c64 element.
fn part(z: &[u8], out: &mut [u8], at: usize) {
    for (o, v) in out.chunks_exact_mut(4).zip(z.chunks_exact(8)) {
        o.copy_from_slice(&v[at..at + 4]);
    }
}

fn complex_planner() -> &'static Mutex<FftPlanner<f32>> {
    static P: OnceLock<Mutex<FftPlanner<f32>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(FftPlanner::new()))
}

fn real_planner() -> &'static Mutex<RealFftPlanner<f32>> {
    static P: OnceLock<Mutex<RealFftPlanner<f32>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(RealFftPlanner::new()))
}

/// The most lines per batch when the transformed axis is strided: gathered into a contiguous
/// buffer, transformed together, scattered back. A batch holds about 32 KiB (an L1 cache) but at
/// least 4 lines: measured on 1024² and 256 × 4096 transforms, larger batches lose to conflict
/// misses (the lines lie a power of two apart), smaller ones to partial cache lines.
const BLOCK: usize = 16;

/// The transform of one operand into `out` (dense, the result's layout).
fn transform(f: Fft, (x, s): (&[u8], &Shape), out: &mut [u8], pool: &Pool) {
    let d = s.static_dims().unwrap_or_default();
    let n = f.n;
    let outer: usize = d[..f.axis].iter().product();
    let inner: usize = d[f.axis + 1..].iter().product();
    let len_in = d[f.axis];
    let len_out = match f.kind {
        FftKind::Fft | FftKind::Ifft => n,
        FftKind::Rfft => n / 2 + 1,
        FftKind::Irfft => n,
    };
    let lines = outer * inner;
    if lines == 0 {
        return;
    }
    let out_ptr = Ptr(out.as_mut_ptr());
    let out_len = out.len();
    let min_chunk = (16384 / n.max(1)).max(1);
    // Element `j` of line `l` in a tensor with `len` values along the axis is at
    // `base(l, len) + j * inner`.
    let base = move |l: usize, len: usize| (l / inner) * len * inner + l % inner;
    match f.kind {
        FftKind::Fft | FftKind::Ifft => {
            let plan = {
                let mut p = complex_planner().lock().unwrap_or_else(|e| e.into_inner());
                if f.kind == FftKind::Fft {
                    p.plan_fft_forward(n)
                } else {
                    p.plan_fft_inverse(n)
                }
            };
            let scale = if f.kind == FftKind::Ifft {
                1.0 / n as f32
            } else {
                1.0
            };
            let xs = view::<Complex32>(x);
            par_ranges(pool, lines, min_chunk, |range| {
                // SAFETY: `out` is `out_len` bytes of c64 values, 4-byte aligned as every
                // buffer of the arena; ranges of lines write disjoint elements.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get() as *mut Complex32, out_len / 8)
                };
                let mut scratch = vec![Complex32::default(); plan.get_inplace_scratch_len()];
                if inner == 1 {
                    let part = &mut o[range.start * n..range.end * n];
                    part.copy_from_slice(&xs[range.start * n..range.end * n]);
                    plan.process_with_scratch(part, &mut scratch);
                    if scale != 1.0 {
                        part.iter_mut().for_each(|v| *v *= scale);
                    }
                    return;
                }
                let block = (4096 / n).clamp(4, BLOCK);
                let mut buf = vec![Complex32::default(); block * n];
                let mut bases = [0usize; BLOCK];
                let mut l = range.start;
                while l < range.end {
                    let b = block.min(range.end - l);
                    for (k, v) in bases[..b].iter_mut().enumerate() {
                        *v = base(l + k, n);
                    }
                    for j in 0..n {
                        let row = j * inner;
                        for k in 0..b {
                            buf[k * n + j] = xs[bases[k] + row];
                        }
                    }
                    plan.process_with_scratch(&mut buf[..b * n], &mut scratch);
                    for j in 0..n {
                        let row = j * inner;
                        for k in 0..b {
                            o[bases[k] + row] = buf[k * n + j] * scale;
                        }
                    }
                    l += b;
                }
            });
        }
        FftKind::Rfft => {
            let plan = real_planner()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .plan_fft_forward(n);
            let xs = view::<f32>(x);
            par_ranges(pool, lines, min_chunk, |range| {
                // SAFETY: as above.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get() as *mut Complex32, out_len / 8)
                };
                let (mut input, mut spectrum, mut scratch) = (
                    plan.make_input_vec(),
                    plan.make_output_vec(),
                    plan.make_scratch_vec(),
                );
                for l in range {
                    let (bi, bo) = (base(l, len_in), base(l, len_out));
                    for (j, v) in input.iter_mut().enumerate() {
                        *v = xs[bi + j * inner];
                    }
                    // Lengths match the plan, so this does not fail.
                    let _ = plan.process_with_scratch(&mut input, &mut spectrum, &mut scratch);
                    for (k, v) in spectrum.iter().enumerate() {
                        o[bo + k * inner] = *v;
                    }
                }
            });
        }
        FftKind::Irfft => {
            let plan = real_planner()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .plan_fft_inverse(n);
            let xs = view::<Complex32>(x);
            let scale = 1.0 / n as f32;
            par_ranges(pool, lines, min_chunk, |range| {
                // SAFETY: as above, f32 results.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get() as *mut f32, out_len / 4)
                };
                let (mut spectrum, mut signal, mut scratch) = (
                    plan.make_input_vec(),
                    plan.make_output_vec(),
                    plan.make_scratch_vec(),
                );
                for l in range {
                    let (bi, bo) = (base(l, len_in), base(l, len_out));
                    for (k, v) in spectrum.iter_mut().enumerate() {
                        *v = xs[bi + k * inner];
                    }
                    // The mean's and the Nyquist frequency's imaginary parts do not exist in
                    // a real signal's spectrum: ignored, as numpy does.
                    spectrum[0].im = 0.0;
                    if n.is_multiple_of(2) {
                        spectrum[n / 2].im = 0.0;
                    }
                    let _ = plan.process_with_scratch(&mut spectrum, &mut signal, &mut scratch);
                    for (j, v) in signal.iter().enumerate() {
                        o[bo + j * inner] = v * scale;
                    }
                }
            });
        }
    }
}
