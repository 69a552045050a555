//! KV-cache ops: CacheWrite updates its param in place; CachedAttention attends over the first
//! `pos + S` cache rows only.
//!
//! With an F16 cache the arithmetic follows llama.cpp's default (non-flash) path: keys and
//! values are stored as f16, queries and attention weights are rounded to f16 before their
//! products, and products accumulate in f32.

use super::{kernel, Kernel, Lowered, NodeInfo, TRef};
use crate::layout::for_each_run;
use crate::pool::Pool;
use half::f16;
use rlx_ir::{DType, Op, Result};

/// Read the `I32 [1]` position operand (negative values count as 0).
///
/// # Safety
/// `pos` must be a live I32 value.
unsafe fn read_pos(pos: &TRef) -> usize {
    (*pos.base::<i32>().add(pos.layout.offset)).max(0) as usize
}

#[inline(always)]
unsafe fn load(p: &TRef, i: usize) -> f32 {
    match p.dtype {
        DType::F16 => (*p.base::<f16>().add(i)).to_f32(),
        DType::BF16 => (*p.base::<half::bf16>().add(i)).to_f32(),
        DType::F64 => *p.base::<f64>().add(i) as f32,
        _ => *p.base::<f32>().add(i),
    }
}

#[inline(always)]
unsafe fn store(p: &TRef, i: usize, v: f32) {
    match p.dtype {
        DType::F16 => *p.base::<f16>().add(i) = f16::from_f32(v),
        DType::BF16 => *p.base::<half::bf16>().add(i) = half::bf16::from_f32(v),
        DType::F64 => *p.base::<f64>().add(i) = v as f64,
        _ => *p.base::<f32>().add(i) = v,
    }
}

/// Round to the precision of `dt` (what storing there and loading back gives).
#[inline(always)]
fn round_to(dt: DType, v: f32) -> f32 {
    match dt {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn cache_write(cache: TRef, upd: TRef, pos: TRef) -> Box<dyn Kernel> {
    kernel(move |_pool: &Pool| {
        let dims = upd.layout.dims().to_vec();
        let t = cache.layout.dims()[0];
        // SAFETY: rows past the cache are dropped, so every write lands inside the param buffer.
        unsafe {
            let p = read_pos(&pos);
            let rows = dims[0].min(t.saturating_sub(p));
            if rows == 0 {
                return;
            }
            let mut d = dims.clone();
            d[0] = rows;
            let dst = cache.layout.narrow(0, p, rows);
            let src = upd.layout.narrow(0, 0, rows);
            let n: usize = d.iter().product();
            for_each_run(&d, [&dst, &src], 0..n, |[o, i], len, [so, si]| {
                for k in 0..len {
                    store(&cache, o + k * so, load(&upd, i + k * si));
                }
            });
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn cached_attention(q: TRef, k: TRef, v: TRef, pos: TRef, out: TRef, scratch: super::Ptr, scale: f32, window: Option<usize>) -> Box<dyn Kernel> {
    let (qd, kd, vd) = (q.layout.dims().to_vec(), k.layout.dims().to_vec(), v.layout.dims().to_vec());
    let (s_len, hq, dh) = (qd[0], qd[1], qd[2]);
    let (t_len, hkv, dv) = (kd[0], kd[1], vd[2]);
    let group = hq / hkv;
    let (qs, ks, vs) = (q.layout.strides().to_vec(), k.layout.strides().to_vec(), v.layout.strides().to_vec());
    let os = out.layout.strides().to_vec();
    let cdt = k.dtype;
    kernel(move |pool: &Pool| {
        // SAFETY: reads stay below row pos + S <= T (clamped); each task owns one (query, head)
        // output row and its thread's scratch slot of T + D floats.
        unsafe {
            let p = read_pos(&pos);
            let tasks = s_len * hq;
            pool.run(tasks, &|task, thread| {
                let (i, h) = (task / hq, task % hq);
                let kh = h / group;
                let last = (p + i).min(t_len - 1);
                let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
                let buf = scratch.get().add(thread * (t_len + dh) * 4) as *mut f32;
                let sc = std::slice::from_raw_parts_mut(buf, t_len);
                let qv = std::slice::from_raw_parts_mut(buf.add(t_len), dh);
                let qo = q.layout.offset + i * qs[0] + h * qs[1];
                for (d, x) in qv.iter_mut().enumerate() {
                    *x = round_to(cdt, load(&q, qo + d * qs[2]));
                }
                let mut mx = f32::NEG_INFINITY;
                for (j, slot) in sc.iter_mut().enumerate().take(last + 1).skip(first) {
                    let ko = k.layout.offset + j * ks[0] + kh * ks[1];
                    let mut s = 0f32;
                    for (d, x) in qv.iter().enumerate() {
                        s += x * load(&k, ko + d * ks[2]);
                    }
                    *slot = s * scale;
                    mx = mx.max(*slot);
                }
                let mut sum = 0f32;
                for s in &mut sc[first..=last] {
                    *s = (*s - mx).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                // Accumulate in the (now free) query slot when the value head fits, else in place.
                let oo = out.layout.offset + i * os[0] + h * os[1];
                let in_place = dv > dh;
                let acc = std::slice::from_raw_parts_mut(buf.add(t_len), dv.min(dh));
                acc.fill(0.0);
                if in_place {
                    for d in 0..dv {
                        store(&out, oo + d * os[2], 0.0);
                    }
                }
                for (j, &e) in sc.iter().enumerate().take(last + 1).skip(first) {
                    let pj = round_to(cdt, e * inv);
                    let vo = v.layout.offset + j * vs[0] + kh * vs[1];
                    if in_place {
                        for d in 0..dv {
                            store(&out, oo + d * os[2], load(&out, oo + d * os[2]) + pj * load(&v, vo + d * vs[2]));
                        }
                    } else {
                        for (d, a) in acc.iter_mut().enumerate() {
                            *a += pj * load(&v, vo + d * vs[2]);
                        }
                    }
                }
                if !in_place {
                    for (d, a) in acc.iter().enumerate() {
                        store(&out, oo + d * os[2], *a);
                    }
                }
            });
        }
    })
}

/// Lower CacheWrite (in place on its param) and CachedAttention.
pub fn lower(info: &NodeInfo<'_>) -> Result<Lowered> {
    match &info.node.op {
        Op::CacheWrite => Ok(Lowered::InPlace {
            src: 0,
            build: Box::new(|ins, out| cache_write(out, ins[1], ins[2])),
        }),
        Op::CachedAttention { scale, window } => {
            let (scale, window) = (*scale, *window);
            let t = info.ins[1].dims()[0];
            let d = info.ins[0].dims()[2].max(info.ins[2].dims()[2]);
            Ok(Lowered::Compute {
                scratch: info.threads * (t + d) * 4,
                build: Box::new(move |ins, out, s| cached_attention(ins[0], ins[1], ins[2], ins[3], out, s, scale, window)),
            })
        }
        _ => unreachable!("dispatched by op"),
    }
}
