//! The paged KV cache ops against the contiguous ones on the CPU: PagedAttention over a
//! sequence's rows scattered in blocks gives bit for bit what CachedAttention gives over the
//! same rows laid end to end, for every query of a batch mixing sequences (so a sequence's
//! result does not depend on what runs beside it), and CacheWrite's slot form writes what its
//! position form writes.

mod common;
use common::{decode, encode};
use rlx::prelude::*;

/// Deterministic values in [-2, 2).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) * 4.0 - 2.0
        })
        .collect()
}

const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 80;
const DV: usize = 72;
const BLOCK: usize = 16;

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// CachedAttention of `s` queries from position `pos` over a contiguous cache of `t` rows.
fn contiguous(
    cache: DType,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    t: usize,
    pos: usize,
    window: Option<usize>,
) -> Vec<u8> {
    let s = q.len() / (HQ * D);
    let mut g = Graph::new("contiguous");
    let qn = g.input("q", Shape::new(&[s, HQ, D], DType::F32));
    let kn = g.input("k", Shape::new(&[t, HKV, D], cache));
    let vn = g.input("v", Shape::new(&[t, HKV, DV], cache));
    let pn = g.input("pos", Shape::new(&[1], DType::I32));
    let o = g.cached_attention(qn, kn, vn, pn, 0.125, window);
    g.set_outputs(vec![o]);
    let mut c = Session::new(Device::Cpu).compile(g);
    let out = c
        .try_run_typed(&[
            ("q", &encode(q, DType::F32), DType::F32),
            ("k", &encode(k, cache), cache),
            ("v", &encode(v, cache), cache),
            ("pos", &i32s(&[pos as i32]), DType::I32),
        ])
        .unwrap();
    out[0].0.clone()
}

/// PagedAttention of queries at `pos[i]` through block-table rows `table[i]`.
#[allow(clippy::too_many_arguments)]
fn paged(
    cache: DType,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    rows: usize,
    pos: &[i32],
    table: &[Vec<i32>],
    window: Option<usize>,
) -> Vec<u8> {
    let (s, m) = (pos.len(), table[0].len());
    let mut g = Graph::new("paged");
    let qn = g.input("q", Shape::new(&[s, HQ, D], DType::F32));
    let kn = g.input("k", Shape::new(&[rows, HKV, D], cache));
    let vn = g.input("v", Shape::new(&[rows, HKV, DV], cache));
    let pn = g.input("pos", Shape::new(&[s], DType::I32));
    let tn = g.input("table", Shape::new(&[s, m], DType::I32));
    let o = g
        .try_paged_attention(qn, kn, vn, pn, tn, 0.125, window, BLOCK)
        .unwrap();
    g.set_outputs(vec![o]);
    let mut c = Session::new(Device::Cpu).compile(g);
    let flat: Vec<i32> = table.concat();
    let out = c
        .try_run_typed(&[
            ("q", &encode(q, DType::F32), DType::F32),
            ("k", &encode(k, cache), cache),
            ("v", &encode(v, cache), cache),
            ("pos", &i32s(pos), DType::I32),
            ("table", &i32s(&flat), DType::I32),
        ])
        .unwrap();
    out[0].0.clone()
}

/// A sequence's cache rows (`width` values each) scattered into the pool at `blocks`.
fn scatter(pool: &mut [f64], seq: &[f64], blocks: &[i32], width: usize) {
    for (j, row) in seq.chunks(width).enumerate() {
        let r = blocks[j / BLOCK] as usize * BLOCK + j % BLOCK;
        pool[r * width..(r + 1) * width].copy_from_slice(row);
    }
}

/// K and V pools of `nb` blocks of filler holding each sequence's `(k, v)` rows at its blocks.
fn pool_with(nb: usize, seed: u64, seqs: &[(&[f64], &[f64], &[i32])]) -> (Vec<f64>, Vec<f64>) {
    let mut kp = values(nb * BLOCK * HKV * D, seed);
    let mut vp = values(nb * BLOCK * HKV * DV, seed + 1);
    for (k, v, t) in seqs {
        scatter(&mut kp, k, t, HKV * D);
        scatter(&mut vp, v, t, HKV * DV);
    }
    (kp, vp)
}

#[test]
fn paged_attention_is_cached_attention_bit_for_bit_beside_other_sequences() {
    for cache in [DType::F16, DType::F32] {
        for window in [None, Some(40)] {
            // Two sequences: A with 150 cached positions (10 blocks), B with 37 (3 blocks), in a
            // pool of 16 blocks handed out out of order.
            let (la, lb) = (150usize, 37usize);
            let (ta, tb): (Vec<i32>, Vec<i32>) =
                (vec![7, 2, 12, 0, 9, 4, 15, 1, 11, 5], vec![3, 14, 8]);
            let nb = 16;
            let ka = values(la * HKV * D, 1);
            let va = values(la * HKV * DV, 2);
            let kb = values(lb * HKV * D, 3);
            let vb = values(lb * HKV * DV, 4);
            let (kp, vp) = pool_with(nb, 5, &[(&ka, &va, &ta), (&kb, &vb, &tb)]);
            // Queries: A's last two positions (a decode step of 2), then B's last position.
            let q = values(3 * HQ * D, 7);
            let row = HQ * D;
            let want_a = contiguous(cache, &q[..2 * row], &ka, &va, la, la - 2, window);
            let want_b = contiguous(cache, &q[2 * row..], &kb, &vb, lb, lb - 1, window);
            let m = 10;
            let pad = |t: &[i32]| {
                let mut t = t.to_vec();
                t.resize(m, -1);
                t
            };
            let got = paged(
                cache,
                &q,
                &kp,
                &vp,
                nb * BLOCK,
                &[la as i32 - 2, la as i32 - 1, lb as i32 - 1],
                &[pad(&ta), pad(&ta), pad(&tb)],
                window,
            );
            let out_row = HQ * DV * 4;
            assert_eq!(
                got[..2 * out_row],
                want_a[..],
                "sequence A ({cache}, window {window:?})"
            );
            assert_eq!(
                got[2 * out_row..],
                want_b[..],
                "sequence B ({cache}, window {window:?})"
            );
            // Alone, B's query gives the same bits as beside A's.
            let alone = paged(
                cache,
                &q[2 * row..],
                &kp,
                &vp,
                nb * BLOCK,
                &[lb as i32 - 1],
                &[pad(&tb)],
                window,
            );
            assert_eq!(alone, got[2 * out_row..], "B alone ({cache})");
        }
    }
}

#[test]
fn cache_write_slots_write_the_rows_the_position_form_writes() {
    for cache in [DType::F16, DType::F32] {
        let t = 12;
        let write = |at: &[i32], s: usize| {
            let mut g = Graph::new("write");
            let c = g.param("cache", Shape::new(&[t, HKV, D], cache));
            let u = g.input("u", Shape::new(&[s, HKV, D], DType::F32));
            let a = g.input("at", Shape::new(&[at.len()], DType::I32));
            let w = g.cache_write(c, u, a);
            g.set_outputs(vec![w]);
            let mut c = Session::new(Device::Cpu).compile(g);
            c.try_set_param_typed("cache", &encode(&values(t * HKV * D, 9), cache), cache)
                .unwrap();
            let out = c
                .try_run_typed(&[
                    (
                        "u",
                        &encode(&values(s * HKV * D, 10), DType::F32),
                        DType::F32,
                    ),
                    ("at", &i32s(at), DType::I32),
                ])
                .unwrap();
            decode(&out[0].0, cache)
        };
        // Rows 4, 5, 6 from position 4, and the same rows named one by one.
        assert_eq!(write(&[4], 3), write(&[4, 5, 6], 3), "{cache}");
        // Slots outside the cache are dropped, the rest written.
        let dropped = write(&[-1, 12, 6], 3);
        let kept = write(&[4], 3);
        let row = HKV * D;
        assert_eq!(dropped[6 * row..7 * row], kept[6 * row..7 * row]);
        assert_eq!(
            dropped[4 * row..5 * row],
            values(t * HKV * D, 9)[4 * row..5 * row]
                .iter()
                .map(|&x| decode(&encode(&[x], cache), cache)[0])
                .collect::<Vec<_>>()[..]
        );
    }
}

#[test]
fn paged_attention_shapes_are_checked() {
    let mut g = Graph::new("bad");
    let q = g.input("q", Shape::new(&[2, HQ, D], DType::F32));
    let k = g.input("k", Shape::new(&[40, HKV, D], DType::F16));
    let v = g.input("v", Shape::new(&[40, HKV, DV], DType::F16));
    let pos = g.input("pos", Shape::new(&[2], DType::I32));
    let table = g.input("table", Shape::new(&[2, 3], DType::I32));
    // 40 rows are not whole blocks of 16.
    let e = g
        .try_paged_attention(q, k, v, pos, table, 1.0, None, BLOCK)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("paged_attention") && e.contains("whole blocks"),
        "{e}"
    );
    // One table row per query.
    let k = g.input("k2", Shape::new(&[48, HKV, D], DType::F16));
    let v = g.input("v2", Shape::new(&[48, HKV, DV], DType::F16));
    let t1 = g.input("t1", Shape::new(&[1, 3], DType::I32));
    let e = g
        .try_paged_attention(q, k, v, pos, t1, 1.0, None, BLOCK)
        .unwrap_err()
        .to_string();
    assert!(e.contains("table I32 [2, M]"), "{e}");
}

#[test]
fn a_paged_prompt_chunk_is_the_contiguous_chunk_bit_for_bit() {
    for cache in [DType::F16, DType::F32] {
        for (start, s, window) in [(0usize, 40usize, None), (23, 33, None), (16, 20, Some(24))] {
            let len = start + s;
            let table: Vec<i32> = vec![5, 0, 3, 6, 1];
            let nb = 8;
            let k = values(len * HKV * D, 11);
            let v = values(len * HKV * DV, 12);
            let (kp, vp) = pool_with(nb, 13, &[(&k, &v, &table)]);
            let q = values(s * HQ * D, 15);
            // The contiguous cache has as many rows as the table covers; rows past the chunk
            // are never read.
            let t = table.len() * BLOCK;
            let (mut kc, mut vc) = (k.clone(), v.clone());
            kc.resize(t * HKV * D, 0.5);
            vc.resize(t * HKV * DV, 0.5);
            let want = contiguous(cache, &q, &kc, &vc, t, start, window);
            let pos: Vec<i32> = (start..len).map(|p| p as i32).collect();
            let got = paged(
                cache,
                &q,
                &kp,
                &vp,
                nb * BLOCK,
                &pos,
                &vec![table.clone(); s],
                window,
            );
            assert_eq!(got, want, "{cache}, chunk of {s} from {start}");
        }
    }
}

/// One serving step computing the prompts of several sequences: pieces of 40 and 20 rows (the
/// GEMM form), one of 5 rows (the per-query form) and a decode row, in one PagedAttention. Each
/// piece gives bit for bit what its sequence's contiguous chunk gives alone.
#[test]
fn prompt_pieces_of_several_sequences_in_one_op_are_their_chunks() {
    for cache in [DType::F16, DType::F32] {
        for window in [None, Some(24)] {
            // (cached before the piece, piece rows, table); the pool has 24 blocks.
            let seqs: [(usize, usize, Vec<i32>); 4] = [
                (0, 40, vec![5, 0, 3]),
                (23, 20, vec![7, 1, 9]),
                (3, 5, vec![11]),
                (50, 1, vec![2, 4, 6, 8]),
            ];
            let (nb, m) = (24, 4);
            let kv: Vec<(Vec<f64>, Vec<f64>)> = seqs
                .iter()
                .enumerate()
                .map(|(i, (start, s, _))| {
                    let len = start + s;
                    (
                        values(len * HKV * D, 20 + 2 * i as u64),
                        values(len * HKV * DV, 21 + 2 * i as u64),
                    )
                })
                .collect();
            let placed: Vec<(&[f64], &[f64], &[i32])> = seqs
                .iter()
                .zip(&kv)
                .map(|((_, _, t), (k, v))| (&k[..], &v[..], &t[..]))
                .collect();
            let (kp, vp) = pool_with(nb, 30, &placed);
            let rows: usize = seqs.iter().map(|s| s.1).sum();
            let q = values(rows * HQ * D, 31);
            let (mut pos, mut table) = (Vec::new(), Vec::new());
            for (start, s, t) in &seqs {
                let mut t = t.clone();
                t.resize(m, -1);
                for p in *start..start + s {
                    pos.push(p as i32);
                    table.push(t.clone());
                }
            }
            let got = paged(cache, &q, &kp, &vp, nb * BLOCK, &pos, &table, window);
            let (qrow, orow) = (HQ * D, HQ * DV * 4);
            let mut r = 0;
            for ((start, s, t), (k, v)) in seqs.iter().zip(&kv) {
                let rows_t = t.len() * BLOCK;
                let (mut kc, mut vc) = (k.clone(), v.clone());
                kc.resize(rows_t * HKV * D, 0.5);
                vc.resize(rows_t * HKV * DV, 0.5);
                let qs = &q[r * qrow..(r + s) * qrow];
                let want = contiguous(cache, qs, &kc, &vc, rows_t, *start, window);
                assert_eq!(
                    got[r * orow..(r + s) * orow],
                    want[..],
                    "{cache}, window {window:?}: the piece of {s} rows from {start}"
                );
                r += s;
            }
        }
    }
}
