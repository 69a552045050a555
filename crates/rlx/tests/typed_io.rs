//! Exact byte I/O for every commonly used dtype: `set_param_typed` / `run_typed` round trips
//! compared byte for byte with values computed here, the f32 convenience API's conversions, and
//! reading params back.

use half::{bf16, f16};
use rlx::prelude::*;

fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Compile `y = x + p` over `[n]` elements of `dt`.
fn add_graph(dt: DType, n: usize) -> CompiledGraph {
    let mut g = Graph::new(&format!("add_{dt}"));
    let x = g.input("x", Shape::new(&[n], dt));
    let p = g.param("p", Shape::new(&[n], dt));
    let y = g.add(x, p);
    g.set_outputs(vec![y]);
    Session::new(Device::Cpu).compile(g)
}

/// Set `p`, run with `x`, and compare the output bytes with `want`.
fn check_add(dt: DType, x: &[u8], p: &[u8], want: &[u8]) -> CompiledGraph {
    let n = x.len() / dt.size_bytes();
    let mut c = add_graph(dt, n);
    c.set_param_typed("p", p, dt);
    let out = c.run_typed(&[("x", x, dt)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1, dt, "output dtype");
    assert_eq!(out[0].0, want, "{dt}: output bytes differ");
    // Params persist across runs; a second run with new inputs sees the same p.
    let out2 = c.run_typed(&[("x", p, dt)]);
    assert_eq!(out2[0].1, dt);
    c
}

#[test]
fn f16_round_trip() {
    let xs: Vec<f16> = [0.1f32, 1.0, -3.25, 1000.0, 65504.0, 6.1e-5, -0.0]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let ps: Vec<f16> = [0.2f32, 0.000_488_281_25, 3.25, 0.3, 65504.0, 6.1e-5, 0.0]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    // f16 values add exactly in f32; rounding that sum once gives the f16 result.
    let want: Vec<f16> = xs
        .iter()
        .zip(&ps)
        .map(|(a, b)| f16::from_f32(a.to_f32() + b.to_f32()))
        .collect();
    assert!(want[4].is_infinite(), "65504 + 65504 overflows f16");
    assert_eq!(want[1], f16::ONE, "1 + 2^-11 ties to even");
    let c = check_add(
        DType::F16,
        &le(&xs, f16::to_le_bytes),
        &le(&ps, f16::to_le_bytes),
        &le(&want, f16::to_le_bytes),
    );
    let back = c.try_get_param("p").expect("p exists");
    assert_eq!(back, ps.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
}

#[test]
fn bf16_round_trip() {
    let xs: Vec<bf16> = [0.1f32, 1.0, -3.25, 1.0e30, 3.0e38, 1.0]
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let ps: Vec<bf16> = [0.2f32, 0.003_906_25, 3.25, 1.0e28, 3.0e38, -1.0]
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let want: Vec<bf16> = xs
        .iter()
        .zip(&ps)
        .map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32()))
        .collect();
    assert_eq!(want[1], bf16::ONE, "1 + 2^-8 ties to even in bf16");
    assert!(want[4].is_infinite());
    let c = check_add(
        DType::BF16,
        &le(&xs, bf16::to_le_bytes),
        &le(&ps, bf16::to_le_bytes),
        &le(&want, bf16::to_le_bytes),
    );
    assert_eq!(
        c.try_get_param("p").unwrap(),
        ps.iter().map(|v| v.to_f32()).collect::<Vec<_>>()
    );
}

#[test]
fn f64_round_trip() {
    let xs = [0.1f64, 1e300, -2.5, 1.0 + f64::EPSILON, f64::MIN_POSITIVE];
    let ps = [0.2f64, 1e300, 2.5, -1.0, f64::MIN_POSITIVE];
    let want: Vec<f64> = xs.iter().zip(&ps).map(|(a, b)| a + b).collect();
    // Not what f32 arithmetic would give.
    assert_eq!(want[0], 0.30000000000000004);
    assert_eq!(want[3], f64::EPSILON);
    let c = check_add(
        DType::F64,
        &le(&xs, f64::to_le_bytes),
        &le(&ps, f64::to_le_bytes),
        &le(&want, f64::to_le_bytes),
    );
    assert_eq!(
        c.try_get_param("p").unwrap(),
        ps.iter().map(|&v| v as f32).collect::<Vec<_>>()
    );
}

#[test]
fn i32_round_trip() {
    let xs = [1i32, -7, 1 << 30, i32::MAX, 16_777_217];
    let ps = [2i32, 7, 1 << 30, 1, 0];
    // Integer addition wraps like numpy's.
    let want: Vec<i32> = xs
        .iter()
        .zip(&ps)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    assert_eq!(want[3], i32::MIN);
    let c = check_add(
        DType::I32,
        &le(&xs, i32::to_le_bytes),
        &le(&ps, i32::to_le_bytes),
        &le(&want, i32::to_le_bytes),
    );
    assert_eq!(
        c.try_get_param("p").unwrap(),
        vec![2.0, 7.0, 1073741824.0, 1.0, 0.0]
    );
}

#[test]
fn i64_round_trip() {
    // Beyond 2^53: an f64 detour would lose the low bits.
    let xs = [(1i64 << 60) + 1, -5, i64::MAX, 3];
    let ps = [2i64, -(1i64 << 62), 1, -3];
    let want: Vec<i64> = xs
        .iter()
        .zip(&ps)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    assert_eq!(want[0], (1i64 << 60) + 3);
    let c = check_add(
        DType::I64,
        &le(&xs, i64::to_le_bytes),
        &le(&ps, i64::to_le_bytes),
        &le(&want, i64::to_le_bytes),
    );
    assert_eq!(
        c.try_get_param("p").unwrap(),
        ps.iter().map(|&v| v as f32).collect::<Vec<_>>()
    );
}

#[test]
fn u8_round_trip() {
    let xs = [0u8, 1, 100, 250, 255];
    let ps = [0u8, 2, 100, 10, 255];
    let want: Vec<u8> = xs
        .iter()
        .zip(&ps)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    assert_eq!(want, [0, 3, 200, 4, 254]);
    let c = check_add(DType::U8, &xs, &ps, &want);
    assert_eq!(
        c.try_get_param("p").unwrap(),
        vec![0.0, 2.0, 100.0, 10.0, 255.0]
    );
}

#[test]
fn bool_where_and_casts() {
    let n = 6;
    let mut g = Graph::new("bool");
    let cond = g.input("cond", Shape::new(&[n], DType::Bool));
    let a = g.input("a", Shape::new(&[n], DType::F32));
    let b = g.param("b", Shape::new(&[n], DType::F32));
    let mask = g.param("mask", Shape::new(&[n], DType::Bool));
    let sel = g.select(cond, a, b);
    let as_f32 = g.cast(cond, DType::F32);
    let as_bool = g.cast(a, DType::Bool);
    let either = g.maximum(cond, mask); // logical or
    let gt = g.compare(CmpOp::Gt, a, b);
    g.set_outputs(vec![sel, as_f32, as_bool, either, gt]);
    let mut c = Session::new(Device::Cpu).compile(g);

    let cond_v = [1u8, 0, 1, 0, 0, 1];
    let mask_v = [0u8, 0, 1, 1, 0, 0];
    let a_v = [1.5f32, -2.0, 0.0, -0.0, f32::NAN, 7.0];
    let b_v = [10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0];
    c.set_param_typed("mask", &mask_v, DType::Bool);
    c.set_param_typed("b", &le(&b_v, f32::to_le_bytes), DType::F32);
    assert_eq!(
        c.try_get_param("mask").unwrap(),
        vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    );
    let out = c.run_typed(&[
        ("cond", &cond_v, DType::Bool),
        ("a", &le(&a_v, f32::to_le_bytes), DType::F32),
    ]);

    let dtypes: Vec<DType> = out.iter().map(|o| o.1).collect();
    assert_eq!(
        dtypes,
        [
            DType::F32,
            DType::F32,
            DType::Bool,
            DType::Bool,
            DType::Bool
        ]
    );
    let want_sel: Vec<f32> = (0..n)
        .map(|i| if cond_v[i] == 1 { a_v[i] } else { b_v[i] })
        .collect();
    assert_eq!(out[0].0, le(&want_sel, f32::to_le_bytes), "where");
    assert_eq!(
        out[1].0,
        le(&[1.0f32, 0.0, 1.0, 0.0, 0.0, 1.0], f32::to_le_bytes),
        "cast bool -> f32"
    );
    // `!= 0`: -0.0 is false, NaN is true.
    assert_eq!(out[2].0, vec![1, 1, 0, 0, 1, 1], "cast f32 -> bool");
    assert_eq!(out[3].0, vec![1, 0, 1, 1, 0, 1], "max of bools is or");
    assert_eq!(
        out[4].0,
        vec![0, 0, 0, 0, 0, 0],
        "a > b (NaN compares false)"
    );

    // The f32 API takes exactly 0 and 1 for bool inputs and returns bools as 0.0 / 1.0.
    let out = c.run(&[
        ("cond", &[0.0, 1.0, 1.0, 0.0, 1.0, 0.0]),
        ("a", &[100.0, 0.0, 1.0, 2.0, 3.0, 4.0]),
    ]);
    assert_eq!(out[0], vec![10.0, 0.0, 1.0, 40.0, 3.0, 60.0]);
    assert_eq!(out[3], vec![0.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(out[4], vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let err = c
        .try_run(&[("cond", &[0.0, 0.5, 1.0, 0.0, 1.0, 0.0]), ("a", &[0.0; 6])])
        .expect_err("0.5 is not a bool");
    assert!(
        matches!(
            &err,
            Error::DType {
                expected: DType::Bool,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("index 1"), "{err}");
}

#[test]
fn f32_run_into_an_f16_input_rounds() {
    let vals = [0.1f32, 1.0 / 3.0, 70000.0, 1e-8, -2.75, 65519.0];
    let mut g = Graph::new("f16_in");
    let x = g.input("x", Shape::new(&[6], DType::F16));
    let wide = g.cast(x, DType::F32);
    let doubled = g.add(x, x);
    g.set_outputs(vec![wide, doubled]);
    let mut c = Session::new(Device::Cpu).compile(g);
    let out = c.run(&[("x", &vals)]);
    let rounded: Vec<f32> = vals.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(out[0], rounded);
    assert!(out[0][2].is_infinite() && out[0][3] == 0.0 && out[0][5] == 65504.0);
    let doubled_want: Vec<f32> = rounded
        .iter()
        .map(|&v| f16::from_f32(v + v).to_f32())
        .collect();
    assert_eq!(
        out[1], doubled_want,
        "f16 outputs come back through the f32 API"
    );
    // The same graph through run_typed: the f16 input bytes are exactly what the f32 API staged.
    let bytes = le(&vals.map(f16::from_f32), f16::to_le_bytes);
    let typed = c.run_typed(&[("x", &bytes, DType::F16)]);
    assert_eq!(typed[0].0, le(&rounded, f32::to_le_bytes));
}

#[test]
fn f32_run_into_an_i32_input_accepts_exact_integers() {
    let mut g = Graph::new("i32_in");
    let x = g.input("x", Shape::new(&[4], DType::I32));
    let p = g.param("p", Shape::new(&[4], DType::I32));
    let y = g.add(x, p);
    g.set_outputs(vec![y]);
    let mut c = Session::new(Device::Cpu).compile(g);
    c.set_param("p", &[1.0, -2.0, 3.0, 0.0]);
    assert_eq!(c.try_get_param("p").unwrap(), vec![1.0, -2.0, 3.0, 0.0]);
    let out = c.run(&[("x", &[-5.0, 0.0, 16_777_216.0, -2_147_483_648.0])]);
    assert_eq!(out, vec![vec![-4.0, -2.0, 16_777_219.0, -2_147_483_648.0]]);
    // Typed output of the same run: exact i32 bytes.
    let xb = le(&[-5i32, 0, 16_777_216, i32::MIN], i32::to_le_bytes);
    let typed = c.run_typed(&[("x", &xb, DType::I32)]);
    assert_eq!(
        typed[0],
        (
            le(&[-4i32, -2, 16_777_219, i32::MIN], i32::to_le_bytes),
            DType::I32
        )
    );
}

#[test]
fn get_param_reads_back_what_was_set() {
    let mut g = Graph::new("params");
    let x = g.input("x", Shape::new(&[3], DType::F32));
    let w = g.param("w", Shape::new(&[3], DType::F32));
    let h = g.param("h", Shape::new(&[3], DType::F16));
    let q = g.param("q", Shape::new(&[3], DType::U8));
    let hw = g.cast(h, DType::F32);
    let qw = g.cast(q, DType::F32);
    let s = g.add(x, w);
    let s = g.add(s, hw);
    let s = g.add(s, qw);
    g.set_outputs(vec![s]);
    let mut c = Session::new(Device::Cpu).compile(g);
    // Unset params read as zeros.
    assert_eq!(c.try_get_param("w").unwrap(), vec![0.0; 3]);
    c.set_param("w", &[1.5, -2.25, 1e-3]);
    c.set_param("h", &[0.1, 2.0, 1e5]);
    c.set_param("q", &[0.0, 7.0, 255.0]);
    assert_eq!(c.try_get_param("w").unwrap(), vec![1.5, -2.25, 1e-3]);
    assert_eq!(
        c.try_get_param("h").unwrap(),
        vec![f16::from_f32(0.1).to_f32(), 2.0, f32::INFINITY]
    );
    assert_eq!(c.try_get_param("q").unwrap(), vec![0.0, 7.0, 255.0]);
    // Typed writes are visible too, and a later f32 write replaces them.
    c.set_param_typed(
        "h",
        &le(
            &[f16::from_f32(-1.0), f16::ZERO, f16::from_f32(0.5)],
            f16::to_le_bytes,
        ),
        DType::F16,
    );
    assert_eq!(c.try_get_param("h").unwrap(), vec![-1.0, 0.0, 0.5]);
    let out = c.run(&[("x", &[0.0, 0.0, 0.0])]);
    assert_eq!(out[0], vec![1.5 - 1.0, -2.25 + 7.0, 1e-3 + 0.5 + 255.0]);
    c.set_param("w", &[0.0, 0.0, 0.0]);
    let out = c.run(&[("x", &[1.0, 1.0, 1.0])]);
    assert_eq!(out[0], vec![0.0, 8.0, 256.5]);
}

#[test]
fn inputs_and_params_as_outputs() {
    // Leaves returned directly give back exactly the bytes written.
    let mut g = Graph::new("leaves");
    let x = g.input("x", Shape::new(&[3], DType::I64));
    let p = g.param("p", Shape::new(&[2], DType::BF16));
    let y = g.add(x, x);
    g.set_outputs(vec![x, p, y, x]);
    let mut c = Session::new(Device::Cpu).compile(g);
    let pb = le(
        &[bf16::from_f32(1.5), bf16::from_f32(-0.125)],
        bf16::to_le_bytes,
    );
    c.set_param_typed("p", &pb, DType::BF16);
    let xs = [i64::MIN + 5, 0, (1 << 62) + 7];
    let out = c.run_typed(&[("x", &le(&xs, i64::to_le_bytes), DType::I64)]);
    assert_eq!(out.len(), 4);
    assert_eq!(out[0], (le(&xs, i64::to_le_bytes), DType::I64));
    assert_eq!(out[1], (pb, DType::BF16));
    let doubled: Vec<i64> = xs.iter().map(|v| v.wrapping_add(*v)).collect();
    assert_eq!(out[2], (le(&doubled, i64::to_le_bytes), DType::I64));
    assert_eq!(out[3], out[0]);
}

#[test]
fn typed_bool_bytes_must_be_0_or_1() {
    let mut g = Graph::new("bools");
    let c = g.input("c", Shape::new(&[4], DType::Bool));
    let m = g.param("m", Shape::new(&[4], DType::Bool));
    let f = g.cast(c, DType::F32);
    let o = g.maximum(c, m);
    g.set_outputs(vec![f, o]);
    let mut k = Session::new(Device::Cpu).compile(g);
    // A byte of 2 would otherwise flow through casts and logic as the value 2.
    let err = k
        .try_run_typed(&[("c", &[0, 1, 2, 1], DType::Bool)])
        .expect_err("2 is not a bool");
    match &err {
        Error::DType {
            kind,
            name,
            expected,
            msg,
            ..
        } => {
            assert_eq!(
                (*kind, name.as_str(), *expected),
                ("input", "c", DType::Bool)
            );
            assert!(msg.contains("index 2"), "{msg}");
        }
        e => panic!("expected Error::DType, got {e:?}"),
    }
    let err = k
        .try_set_param_typed("m", &[0, 0, 0, 255], DType::Bool)
        .expect_err("255 is not a bool");
    assert!(
        matches!(&err, Error::DType { kind: "param", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("byte 255 at index 3"), "{err}");
    // Valid bools run.
    k.set_param_typed("m", &[0, 1, 0, 1], DType::Bool);
    let out = k.run_typed(&[("c", &[0, 0, 1, 1], DType::Bool)]);
    assert_eq!(out[0].0, le(&[0.0f32, 0.0, 1.0, 1.0], f32::to_le_bytes));
    assert_eq!(out[1], (vec![0, 1, 1, 1], DType::Bool));
}
