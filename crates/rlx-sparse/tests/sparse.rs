//! rlx-sparse against scipy.sparse and JAX (`tests/golden/sparse.json`, from `gen_sparse.py`):
//! COO and CSR products (SpMM and SpMV, duplicate entries) on the reference evaluator, the CPU
//! kernel, the CPU running the decomposition and the GPU (decomposition, f32); gradients with
//! respect to the values and the dense operand; a conjugate-gradient solve as an RLX `while`,
//! its solution and its gradients against JAX's dense solve.

use rlx::ir::eval::Tensor;
use rlx::prelude::*;
use rlx_sparse::{cg, Coo, Csr};
use serde_json::Value;
use std::collections::BTreeMap;

fn cases() -> Vec<Value> {
    let at = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/sparse.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(at).expect("golden file")).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn f64s(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn int_const(g: &mut Graph, v: &[i64]) -> NodeId {
    let t = Tensor::from_i64(&[v.len()], DType::I32, v.to_vec());
    g.try_constant_bytes(Shape::new(&[v.len()], DType::I32), t.to_bytes())
        .unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * scale,
            "{what}[{k}]: {g} vs {w} (rtol {rtol} of {scale})"
        );
    }
}

fn as_f64(bytes: &[u8], dt: DType) -> Vec<f64> {
    Tensor::from_bytes(&Shape::new(&[bytes.len() / dt.size_bytes()], dt), bytes)
        .unwrap()
        .f64s()
}

/// The case's product on params `values` and `dense` of `dt`; outputs `[sum(y * W), y]`.
fn product_graph(c: &Value, dt: DType) -> Graph {
    let mut g = Graph::new(c["name"].as_str().unwrap());
    let m = c["m"].as_u64().unwrap() as usize;
    let n = c["n"].as_u64().unwrap() as usize;
    let values = g.param("values", Shape::new(&dims(&c["values"]), dt));
    let dense = g.param("dense", Shape::new(&dims(&c["dense"]), dt));
    let y = if c["form"] == "coo" {
        let a = Coo {
            rows: int_const(&mut g, &ints(&c["rows"])),
            cols: int_const(&mut g, &ints(&c["cols"])),
            values,
            shape: (m, n),
        };
        a.matmul(&mut g, dense).unwrap()
    } else {
        let a = Csr {
            indptr: int_const(&mut g, &ints(&c["indptr"])),
            indices: int_const(&mut g, &ints(&c["indices"])),
            values,
            shape: (m, n),
        };
        a.matmul(&mut g, dense).unwrap()
    };
    loss(&mut g, y, &c["cotangent"], dt);
    g
}

fn loss(g: &mut Graph, y: NodeId, w: &Value, dt: DType) {
    let wd = dims(w);
    let wt = Tensor::from_f64(&wd, dt, f64s(w));
    let w = g
        .try_constant_bytes(Shape::new(&wd, dt), wt.to_bytes())
        .unwrap();
    let p = g.mul(y, w);
    let axes = (0..wd.len()).collect();
    let l = g
        .try_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes,
                keepdims: false,
            },
            &[p],
        )
        .unwrap();
    g.set_outputs(vec![l, y]);
}

fn set(c: &mut CompiledGraph, name: &str, v: &Value, dt: DType) {
    let t = Tensor::from_f64(&dims(v), dt, f64s(v));
    c.set_param_typed(name, &t.to_bytes(), dt);
}

#[test]
fn products_match_scipy_everywhere_and_their_gradients_match_jax() {
    rlx_sparse::register().unwrap();
    for c in cases().iter().filter(|c| c["kind"] == "spmm") {
        let name = c["name"].as_str().unwrap();
        let want = f64s(&c["expected"]);
        let g = product_graph(c, DType::F64);
        // The reference evaluator.
        let leaves: BTreeMap<String, Tensor> = ["values", "dense"]
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    Tensor::from_f64(&dims(&c[*k]), DType::F64, f64s(&c[*k])),
                )
            })
            .collect();
        let r = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
        close(&format!("{name} (reference)"), &r[1].f64s(), &want, 1e-12);
        // The CPU's kernel.
        let mut cg_ = Session::new(Device::Cpu).compile(g.clone());
        let op = if c["form"] == "coo" {
            "spmm"
        } else {
            "spmm_csr"
        };
        assert!(cg_.dispatch_report().nodes.iter().any(|n| n.op == op));
        set(&mut cg_, "values", &c["values"], DType::F64);
        set(&mut cg_, "dense", &c["dense"], DType::F64);
        let out = cg_.run_typed(&[]);
        close(
            &format!("{name} (CPU)"),
            &as_f64(&out[1].0, DType::F64),
            &want,
            1e-12,
        );
        // Reverse mode (through the decomposition) against JAX.
        let wrt = [
            g.find_leaf("values").unwrap(),
            g.find_leaf("dense").unwrap(),
        ];
        let gg = rlx::autodiff::grad(&g, &wrt).unwrap();
        let mut cgg = Session::new(Device::Cpu).compile(gg);
        set(&mut cgg, "values", &c["values"], DType::F64);
        set(&mut cgg, "dense", &c["dense"], DType::F64);
        let outs = cgg.run_typed(&[]);
        close(
            &format!("{name}: d / d values"),
            &as_f64(&outs[0].0, DType::F64),
            &f64s(&c["grad_values"]),
            1e-12,
        );
        close(
            &format!("{name}: d / d dense"),
            &as_f64(&outs[1].0, DType::F64),
            &f64s(&c["grad_dense"]),
            1e-12,
        );
        // f32 on the GPU (Mesa's software Vulkan in the suite): COO through the decomposition,
        // CSR through its WGSL kernel.
        let g32 = product_graph(c, DType::F32);
        let mut c32 = Session::new(Device::Gpu).compile(g32);
        set(&mut c32, "values", &c["values"], DType::F32);
        set(&mut c32, "dense", &c["dense"], DType::F32);
        let out = c32.run_typed(&[]);
        close(
            &format!("{name} (GPU, f32)"),
            &as_f64(&out[1].0, DType::F32),
            &want,
            1e-5,
        );
    }
}

#[test]
fn conjugate_gradients_solve_and_differentiate_like_a_dense_solve() {
    rlx_sparse::register().unwrap();
    let c = cases().into_iter().find(|c| c["kind"] == "cg").unwrap();
    let n = c["n"].as_u64().unwrap() as usize;
    let mut g = Graph::new("cg");
    let values = g.param("values", Shape::new(&dims(&c["values"]), DType::F64));
    let b = g.param("b", Shape::new(&[n], DType::F64));
    let a = Coo {
        rows: int_const(&mut g, &ints(&c["rows"])),
        cols: int_const(&mut g, &ints(&c["cols"])),
        values,
        shape: (n, n),
    };
    let x = cg(&mut g, &a, b, 1e-12, 60).unwrap();
    loss(&mut g, x, &c["cotangent"], DType::F64);
    let mut cx = Session::new(Device::Cpu).compile(g.clone());
    set(&mut cx, "values", &c["values"], DType::F64);
    set(&mut cx, "b", &c["b"], DType::F64);
    let out = cx.run_typed(&[]);
    close(
        "cg x",
        &as_f64(&out[1].0, DType::F64),
        &f64s(&c["expected"]),
        1e-9,
    );
    // Reverse mode: the implicit rule (one more solve).
    let gg = rlx::autodiff::grad(&g, &[values, b]).unwrap();
    let mut cgg = Session::new(Device::Cpu).compile(gg);
    set(&mut cgg, "values", &c["values"], DType::F64);
    set(&mut cgg, "b", &c["b"], DType::F64);
    let outs = cgg.run_typed(&[]);
    close(
        "cg: d / d values",
        &as_f64(&outs[0].0, DType::F64),
        &f64s(&c["grad_values"]),
        1e-9,
    );
    close(
        "cg: d / d b",
        &as_f64(&outs[1].0, DType::F64),
        &f64s(&c["grad_b"]),
        1e-9,
    );
    // Bad shapes are named errors.
    let mut bad = Graph::new("bad");
    let v = bad.input("v", Shape::new(&[3], DType::F64));
    let d = bad.input("d", Shape::new(&[5, 2], DType::F64));
    let r = int_const(&mut bad, &[0, 1, 2]);
    let a = Coo {
        rows: r,
        cols: r,
        values: v,
        shape: (3, 4),
    };
    let e = a.matmul(&mut bad, d).unwrap_err().to_string();
    assert!(e.contains("spmm") && e.contains("[5, 2]"), "{e}");
    let e = cg(&mut bad, &a, v, 1e-6, 10).unwrap_err().to_string();
    assert!(e.contains("cg") && e.contains("3x4"), "{e}");
}

#[test]
fn the_text_form_keeps_spmm() {
    rlx_sparse::register().unwrap();
    let mut g = Graph::new("t");
    let r = g.input("r", Shape::new(&[4], DType::I32));
    let v = g.input("v", Shape::new(&[4], DType::F32));
    let d = g.input("d", Shape::new(&[6, 2], DType::F32));
    let a = Coo {
        rows: r,
        cols: r,
        values: v,
        shape: (5, 6),
    };
    let y = a.matmul(&mut g, d).unwrap();
    g.set_outputs(vec![y]);
    let text = g.to_text();
    assert!(text.contains("spmm") && text.contains("m = 5"), "{text}");
    assert_eq!(Graph::parse(&text).unwrap().to_text(), text);
}

#[test]
fn vmap_over_the_dense_operand_goes_through_the_decomposition() {
    rlx_sparse::register().unwrap();
    // A 3x4 matrix with entries (0,1)=2, (2,3)=-1, (2,0)=0.5, times each of 2 vectors.
    let mut one = Graph::new("one");
    let v = one.input("v", Shape::new(&[3], DType::F64));
    let d = one.input("d", Shape::new(&[4], DType::F64));
    let a = Coo {
        rows: int_const(&mut one, &[0, 2, 2]),
        cols: int_const(&mut one, &[1, 3, 0]),
        values: v,
        shape: (3, 4),
    };
    let y = a.matmul(&mut one, d).unwrap();
    one.set_outputs(vec![y]);
    let vg = rlx::autodiff::vmap(&one, &["d"], 2).unwrap();
    let mut c = Session::new(Device::Cpu).compile(vg);
    let bytes = |x: &[f64]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let out = c.run_typed(&[
        ("v", &bytes(&[2.0, -1.0, 0.5]), DType::F64),
        (
            "d",
            &bytes(&[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 5.0, 2.0]),
            DType::F64,
        ),
    ]);
    // [2*2, 0, -4 + 0.5] and [0, 0, -2 - 0.5].
    close(
        "vmap(spmv)",
        &as_f64(&out[0].0, DType::F64),
        &[4.0, 0.0, -3.5, 0.0, 0.0, -2.5],
        1e-12,
    );
}

#[test]
fn out_of_range_entries_are_skipped_and_cg_has_forward_mode() {
    rlx_sparse::register().unwrap();
    // Entry 1 names row 7 of a 3-row matrix, entry 2 column -1: both are skipped by the
    // reference evaluator and the CPU kernel.
    let mut g = Graph::new("oob");
    let v = g.input("v", Shape::new(&[3], DType::F64));
    let d = g.input("d", Shape::new(&[2], DType::F64));
    let a = Coo {
        rows: int_const(&mut g, &[0, 7, 1]),
        cols: int_const(&mut g, &[1, 0, -1]),
        values: v,
        shape: (3, 2),
    };
    let y = a.matmul(&mut g, d).unwrap();
    g.set_outputs(vec![y]);
    let t = |x: &[f64]| Tensor::from_f64(&[x.len()], DType::F64, x.to_vec());
    let leaves: BTreeMap<String, Tensor> = [
        ("v".to_string(), t(&[2.0, 3.0, 4.0])),
        ("d".to_string(), t(&[5.0, 6.0])),
    ]
    .into();
    let r = rlx::ir::eval::evaluate(&g, &leaves).unwrap();
    close("oob (reference)", &r[0].f64s(), &[12.0, 0.0, 0.0], 0.0);
    let mut c = Session::new(Device::Cpu).compile(g);
    let out = c.run_typed(&[
        ("v", &t(&[2.0, 3.0, 4.0]).to_bytes(), DType::F64),
        ("d", &t(&[5.0, 6.0]).to_bytes(), DType::F64),
    ]);
    close(
        "oob (CPU)",
        &as_f64(&out[0].0, DType::F64),
        &[12.0, 0.0, 0.0],
        0.0,
    );

    // Forward mode of cg (through the iterations): the tangent of sum(x * w) along a direction
    // of b is JAX's gradient dotted with it.
    let c0 = cases().into_iter().find(|c| c["kind"] == "cg").unwrap();
    let n = c0["n"].as_u64().unwrap() as usize;
    let mut g = Graph::new("cg");
    let values = g.param("values", Shape::new(&dims(&c0["values"]), DType::F64));
    let b = g.param("b", Shape::new(&[n], DType::F64));
    let a = Coo {
        rows: int_const(&mut g, &ints(&c0["rows"])),
        cols: int_const(&mut g, &ints(&c0["cols"])),
        values,
        shape: (n, n),
    };
    let x = cg(&mut g, &a, b, 1e-12, 60).unwrap();
    loss(&mut g, x, &c0["cotangent"], DType::F64);
    let jg = rlx::autodiff::jvp(&g, &["b"]).unwrap();
    let mut cj = Session::new(Device::Cpu).compile(jg);
    set(&mut cj, "values", &c0["values"], DType::F64);
    set(&mut cj, "b", &c0["b"], DType::F64);
    let dir: Vec<f64> = (0..n).map(|i| ((i * 7) % 5) as f64 / 5.0 - 0.4).collect();
    let want: f64 = dir
        .iter()
        .zip(f64s(&c0["grad_b"]))
        .map(|(a, b)| a * b)
        .sum();
    let name = rlx::autodiff::tangent_name("b");
    let outs = cj.run_typed(&[(name.as_str(), &t(&dir).to_bytes(), DType::F64)]);
    let got = as_f64(&outs[2].0, DType::F64)[0];
    assert!(
        (got - want).abs() <= 1e-8 * want.abs().max(1.0),
        "jvp {got} vs {want}"
    );
}

/// The CPU kernel at sizes where it splits sorted rows over threads (and sums each row in
/// several registers), with rows in order and shuffled and with entries out of range, against
/// the reference evaluator.
#[test]
fn the_cpu_kernel_matches_the_reference_at_size() {
    rlx_sparse::register().unwrap();
    let (n, per) = (3000, 9);
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let nnz = n * per;
    let mut rows: Vec<i32> = (0..nnz).map(|e| (e / per) as i32).collect();
    let cols: Vec<i32> = (0..nnz).map(|_| (next() % n as u64) as i32).collect();
    // Rows of different lengths: some entries move to the next row.
    for e in (5..nnz).step_by(17) {
        rows[e] = rows[e - 1];
    }
    let vals: Vec<f32> = (0..nnz)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    for (shuffled, bad) in [(false, false), (true, false), (false, true)] {
        let (mut r, mut c) = (rows.clone(), cols.clone());
        if shuffled {
            for e in (0..nnz).rev() {
                let j = (next() % (e as u64 + 1)) as usize;
                r.swap(e, j);
                c.swap(e, j);
            }
        }
        if bad {
            c[10] = n as i32 + 4;
            r[nnz - 1] = n as i32;
        }
        for k in [1, 3] {
            let mut g = Graph::new("spmm");
            let ri = g.input("r", Shape::new(&[nnz], DType::I32));
            let ci = g.input("c", Shape::new(&[nnz], DType::I32));
            let vi = g.input("v", Shape::new(&[nnz], DType::F32));
            let dims = if k == 1 { vec![n] } else { vec![n, k] };
            let x = g.input("x", Shape::new(&dims, DType::F32));
            let coo = Coo {
                rows: ri,
                cols: ci,
                values: vi,
                shape: (n, n),
            };
            let y = coo.matmul(&mut g, x).unwrap();
            g.set_outputs(vec![y]);
            let xs: Vec<f32> = (0..n * k)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let ib = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let fb = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let feeds: Vec<(&str, Vec<u8>, DType)> = vec![
                ("r", ib(&r), DType::I32),
                ("c", ib(&c), DType::I32),
                ("v", fb(&vals), DType::F32),
                ("x", fb(&xs), DType::F32),
            ];
            let mut leaves = BTreeMap::new();
            for (name, bytes, _) in &feeds {
                let sh = g.shape(g.find_leaf(name).unwrap()).clone();
                leaves.insert(name.to_string(), Tensor::from_bytes(&sh, bytes).unwrap());
            }
            let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
            let mut comp = Session::new(Device::Cpu).with_threads(2).compile(g.clone());
            let f: Vec<(&str, &[u8], DType)> = feeds
                .iter()
                .map(|(n, b, d)| (*n, b.as_slice(), *d))
                .collect();
            let out = comp.run_typed(&f);
            let got: Vec<f32> = out[0]
                .0
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "shuffled {shuffled} bad {bad} k {k} element {i}: {a} vs {b}"
                );
            }
        }
    }
}

/// The CSR kernel (AVX-512 for f32 values with i32 columns: gathers for one dense column, rows of
/// 16 to 64 columns for several; the general loop otherwise) at sizes where it splits rows over
/// threads by their entry counts:
/// rows of different lengths and empty ones, i32 and i64 pointers and columns, f32 and f64,
/// SpMV and SpMM, columns out of range; against the reference evaluator, and against the
/// decomposition (each entry's row from the pointers, then `spmm`'s) compiled for the CPU.
#[test]
fn the_csr_kernel_matches_the_reference_at_size() {
    rlx_sparse::register().unwrap();
    let n = 5000;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    // Row r holds (r * 7) % 23 entries: 0 to 22, some rows empty.
    let mut indptr = vec![0i64];
    for r in 0..n {
        indptr.push(indptr[r] + ((r * 7) % 23) as i64);
    }
    let nnz = indptr[n] as usize;
    let mut cols: Vec<i64> = (0..nnz).map(|_| (next() % n as u64) as i64).collect();
    cols[3] = n as i64 + 2;
    cols[nnz - 5] = -1;
    let vals: Vec<f64> = (0..nnz)
        .map(|_| (next() % 2001) as f64 / 1000.0 - 1.0)
        .collect();
    for (pt, it, dt, k) in [
        (DType::I32, DType::I32, DType::F32, 1),
        (DType::I64, DType::I32, DType::F32, 1),
        (DType::I32, DType::I64, DType::F32, 1),
        (DType::I32, DType::I32, DType::F32, 5),
        (DType::I64, DType::I32, DType::F32, 70),
        (DType::I64, DType::I64, DType::F64, 1),
        (DType::I32, DType::I32, DType::F64, 3),
    ] {
        let xs: Vec<f64> = (0..n * k)
            .map(|_| (next() % 2001) as f64 / 1000.0 - 1.0)
            .collect();
        let ddims = if k == 1 { vec![n] } else { vec![n, k] };
        let leaves: BTreeMap<String, Tensor> = [
            ("p", Tensor::from_i64(&[n + 1], pt, indptr.clone())),
            ("c", Tensor::from_i64(&[nnz], it, cols.clone())),
            ("v", Tensor::from_f64(&[nnz], dt, vals.clone())),
            ("x", Tensor::from_f64(&ddims, dt, xs)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut g = Graph::new("csr");
        let csr = Csr {
            indptr: g.input("p", Shape::new(&[n + 1], pt)),
            indices: g.input("c", Shape::new(&[nnz], it)),
            values: g.input("v", Shape::new(&[nnz], dt)),
            shape: (n, n),
        };
        let x = g.input("x", Shape::new(&ddims, dt));
        let y = csr.matmul(&mut g, x).unwrap();
        let coo = csr.to_coo(&mut g).unwrap();
        let y2 = coo.matmul(&mut g, x).unwrap();
        g.set_outputs(vec![y, y2]);
        let want = rlx::ir::eval::evaluate(&g, &leaves).unwrap()[0].f64s();
        let mut comp = Session::new(Device::Cpu).with_threads(2).compile(g.clone());
        assert!(comp
            .dispatch_report()
            .nodes
            .iter()
            .any(|n| n.op == "spmm_csr"));
        let bytes: Vec<(String, Vec<u8>, DType)> = leaves
            .iter()
            .map(|(k, t)| (k.clone(), t.to_bytes(), t.dtype()))
            .collect();
        let feeds: Vec<(&str, &[u8], DType)> = bytes
            .iter()
            .map(|(k, b, d)| (k.as_str(), b.as_slice(), *d))
            .collect();
        let mut out = comp.run_typed(&feeds);
        // i32 pointers and columns with f32 values: also wgpu's kernel (lavapipe in CI).
        if (pt, it, dt) == (DType::I32, DType::I32, DType::F32) {
            // The product alone (lavapipe cannot loop over every entry as to_coo's cumsum does).
            let mut alone = g.clone();
            alone.set_outputs(vec![y]);
            let mut gpu = Session::new(Device::Gpu).compile(alone);
            assert!(
                !gpu.dispatch_report()
                    .decomposed
                    .contains_key("decompose:spmm_csr"),
                "spmm_csr runs natively on the GPU: {}",
                gpu.dispatch_report()
            );
            out.extend(gpu.run_typed(&feeds));
            // CUDA's kernel in host emulation.
            let mut single = g.clone();
            single.set_outputs(vec![y]);
            let l = Session::new(Device::Cuda).try_lower(single).unwrap();
            let p = rlx_cuda::lower(&l.graph, &[]).unwrap();
            assert!(
                p.launches.iter().any(|l| l.op == "spmm_csr"),
                "one launch of its kernel"
            );
            // NVRTC compiles it (required where `RLX_REQUIRE_NVRTC=1`).
            rlx_cuda::compile_check_for_tests(&p, "spmm_csr").unwrap();
            let emu = rlx_cuda::emulate::Emulator::build(&p.kernels).unwrap();
            let ins: Vec<Vec<u8>> = p
                .inputs
                .iter()
                .map(|s| leaves[&s.name].to_bytes())
                .collect();
            let got = emu.run(&p, &ins, &[]).unwrap();
            out.push((got[0].clone(), dt));
        }
        let names = [
            "spmm_csr",
            "to_coo + spmm",
            "spmm_csr (GPU)",
            "spmm_csr (CUDA, emulated)",
        ];
        for (which, o) in names.iter().zip(&out) {
            let got = Tensor::from_bytes(&Shape::new(&[want.len()], dt), &o.0)
                .unwrap()
                .f64s();
            let tol = if dt == DType::F32 { 1e-5 } else { 1e-12 };
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + b.abs()),
                    "{which} {pt} {it} {dt} k {k} element {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn the_text_form_keeps_spmm_csr() {
    rlx_sparse::register().unwrap();
    let mut g = Graph::new("t");
    let csr = Csr {
        indptr: g.input("p", Shape::new(&[4], DType::I32)),
        indices: g.input("c", Shape::new(&[5], DType::I32)),
        values: g.input("v", Shape::new(&[5], DType::F32)),
        shape: (3, 6),
    };
    let d = g.input("d", Shape::new(&[6, 2], DType::F32));
    let y = csr.matmul(&mut g, d).unwrap();
    g.set_outputs(vec![y]);
    let text = g.to_text();
    assert!(text.contains("spmm_csr"), "{text}");
    assert_eq!(Graph::parse(&text).unwrap().to_text(), text);
    // A wrong pointer count is an error naming the operand.
    let bad = Csr {
        indptr: g.input("p2", Shape::new(&[3], DType::I32)),
        ..csr
    };
    let e = bad.matmul(&mut g, d).unwrap_err().to_string();
    assert!(e.contains("indptr") && e.contains("4 row pointers"), "{e}");
}
