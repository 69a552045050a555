//! A batched matmul against a shared weight runs as one GEMM over all rows when the batch axes
//! fold into the rows; results match a naive reference for foldable and non-foldable layouts.

use rlx_cpu::compile;
use rlx_ir::{DType, Graph, Shape};

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn check(perm: Option<&[usize]>) {
    // a: [3, 50, 7] (or a permuted view of it), w: [7, 40]
    let mut g = Graph::new("fold");
    let dims_in = [3usize, 50, 7];
    let a = g.input("a", Shape::new(&dims_in, DType::F32));
    let w = g.input("w", Shape::new(&[7, 40], DType::F32));
    let av = match perm {
        Some(p) => g.transpose(a, p),
        None => a,
    };
    let y = g.dot(av, w);
    g.set_outputs(vec![y]);
    let mut p = compile(&g, 2).unwrap();
    let ad: Vec<f32> = (0..3 * 50 * 7)
        .map(|i| ((i * 31 % 23) as f32 - 11.0) / 7.0)
        .collect();
    let wd: Vec<f32> = (0..7 * 40)
        .map(|i| ((i * 17 % 13) as f32 - 6.0) / 5.0)
        .collect();
    p.write_input(0, &bytes(&ad));
    p.write_input(1, &bytes(&wd));
    p.execute();
    let od = g.shape(y).static_dims().unwrap();
    let mut out = vec![0u8; od.iter().product::<usize>() * 4];
    p.read_output(0, &mut out);
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // Reference on the (possibly permuted) view.
    let view_dims: Vec<usize> = match perm {
        Some(p) => p.iter().map(|&i| dims_in[i]).collect(),
        None => dims_in.to_vec(),
    };
    let src_index = |idx: [usize; 3]| -> usize {
        let mut orig = [0usize; 3];
        match perm {
            Some(p) => (0..3).for_each(|i| orig[p[i]] = idx[i]),
            None => orig = idx,
        }
        (orig[0] * 50 + orig[1]) * 7 + orig[2]
    };
    for b in 0..view_dims[0] {
        for r in 0..view_dims[1] {
            for c in 0..40 {
                let want: f32 = (0..7)
                    .map(|k| ad[src_index([b, r, k])] * wd[k * 40 + c])
                    .sum();
                let g = got[(b * view_dims[1] + r) * 40 + c];
                assert!(
                    (g - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{perm:?} [{b},{r},{c}]: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn folded_and_unfolded_batched_products_match() {
    rlx_cpu::isa::for_each_level(|_| {
        check(None); // folds into one [150, 7] x [7, 40] product
        check(Some(&[1, 0, 2])); // batch axes do not fold: one product per batch
    });
}

#[test]
fn a_product_read_through_a_head_merging_transpose_is_stored_transposed_and_needs_no_copy() {
    rlx_cpu::isa::for_each_level(|_| {
        // Attention's `[b, h, t, d] -> [b, t, h, d] -> [b, t, h*d]`: the product is laid out in the
        // transposed order, so neither the Transpose nor the Reshape copies; on 1 and 2 threads,
        // with a shared-weight product (foldable batches) and a batched one.
        let (b, h, t, k, d) = (3usize, 4, 13, 5, 6);
        for threads in [1, 2] {
            for shared in [false, true] {
                let mut g = Graph::new("heads");
                let x = g.input("x", Shape::new(&[b, h, t, k], DType::F32));
                let wd: &[usize] = if shared { &[k, d] } else { &[b, h, k, d] };
                let w = g.input("w", Shape::new(wd, DType::F32));
                let y = g.dot(x, w);
                let yt = g.transpose(y, &[0, 2, 1, 3]);
                let merged = g.reshape(yt, &[b, t, h * d]);
                let out = g.activation(rlx_ir::Activation::Tanh, merged);
                g.set_outputs(vec![out]);
                let mut p = compile(&g, threads).unwrap();
                assert_eq!(
                    p.steps(),
                    2,
                    "matmul and tanh only (shared weight: {shared})"
                );
                let xd: Vec<f32> = (0..b * h * t * k)
                    .map(|i| ((i * 31 % 23) as f32 - 11.0) / 7.0)
                    .collect();
                let wv: Vec<f32> = (0..wd.iter().product::<usize>())
                    .map(|i| ((i * 17 % 13) as f32 - 6.0) / 5.0)
                    .collect();
                p.write_input(0, &bytes(&xd));
                p.write_input(1, &bytes(&wv));
                p.execute();
                let mut o = vec![0u8; b * t * h * d * 4];
                p.read_output(0, &mut o);
                let got: Vec<f32> = o
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                for (bi, ti, hi, di) in (0..b).flat_map(|bi| {
                    (0..t).flat_map(move |ti| {
                        (0..h).flat_map(move |hi| (0..d).map(move |di| (bi, ti, hi, di)))
                    })
                }) {
                    let wi = |kk: usize| {
                        if shared {
                            kk * d + di
                        } else {
                            ((bi * h + hi) * k + kk) * d + di
                        }
                    };
                    let want: f32 = (0..k)
                        .map(|kk| xd[((bi * h + hi) * t + ti) * k + kk] * wv[wi(kk)])
                        .sum::<f32>()
                        .tanh();
                    let v = got[((bi * t + ti) * h + hi) * d + di];
                    assert!((v - want).abs() < 1e-5, "[{bi}, {ti}, {hi}, {di}]: {v} vs {want} (threads {threads}, shared {shared})");
                }
            }
        }
    });
}
