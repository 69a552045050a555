//! Property tests: shape inference and CPU execution against small reference implementations
//! written here (numpy's broadcasting rule, naive strided indexing, naive sums).

use proptest::prelude::*;
use rlx::ir::broadcast_dims;
use rlx::prelude::*;

// ---------------------------------------------------------------- references

/// numpy's broadcasting rule on static shapes.
fn ref_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, n - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major strides.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of flat position `flat` in `dims`.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        idx[i] = flat % dims[i];
        flat /= dims[i];
    }
    idx
}

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq)]
struct Tensor {
    dims: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    fn at(&self, idx: &[usize]) -> f32 {
        let off: usize = idx
            .iter()
            .zip(strides(&self.dims))
            .map(|(i, s)| i * s)
            .sum();
        self.data[off]
    }

    fn from_fn(dims: Vec<usize>, f: impl Fn(&[usize]) -> f32) -> Tensor {
        let data = (0..numel(&dims)).map(|i| f(&unravel(i, &dims))).collect();
        Tensor { dims, data }
    }

    fn reshape(&self, dims: &[usize]) -> Tensor {
        assert_eq!(numel(dims), self.data.len());
        Tensor {
            dims: dims.to_vec(),
            data: self.data.clone(),
        }
    }

    fn transpose(&self, perm: &[usize]) -> Tensor {
        let dims = perm.iter().map(|&p| self.dims[p]).collect();
        Tensor::from_fn(dims, |idx| {
            let mut src = vec![0; idx.len()];
            for (i, &p) in perm.iter().enumerate() {
                src[p] = idx[i];
            }
            self.at(&src)
        })
    }

    fn narrow(&self, axis: usize, start: usize, len: usize) -> Tensor {
        let mut dims = self.dims.clone();
        dims[axis] = len;
        Tensor::from_fn(dims, |idx| {
            let mut src = idx.to_vec();
            src[axis] += start;
            self.at(&src)
        })
    }
}

/// `a + b` with numpy broadcasting, element by element.
fn ref_add(a: &Tensor, b: &Tensor) -> Tensor {
    let out = ref_broadcast(&a.dims, &b.dims).expect("compatible");
    let pick = |t: &Tensor, idx: &[usize]| {
        let skip = idx.len() - t.dims.len();
        let src: Vec<usize> = t
            .dims
            .iter()
            .enumerate()
            .map(|(i, &d)| if d == 1 { 0 } else { idx[skip + i] })
            .collect();
        t.at(&src)
    };
    Tensor::from_fn(out, |idx| pick(a, idx) + pick(b, idx))
}

/// Deterministic pseudo-random f32 values in [-4, 4) from a seed (xorshift64*).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40; // 24 bits
            (r as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

fn statics(d: &[usize]) -> Vec<Dim> {
    d.iter().map(|&n| Dim::Static(n)).collect()
}

fn compile(g: Graph, optimize: bool) -> CompiledGraph {
    let s = Session::new(Device::Cpu);
    let s = if optimize {
        s
    } else {
        s.without_optimizations()
    };
    s.try_compile(g).unwrap_or_else(|e| panic!("compile: {e}"))
}

// ---------------------------------------------------------------- strategies

/// A small dim, usually 1 so that broadcasting is often possible.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(1usize), 2 => 0usize..=4]
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(dim(), 0..=4)
}

/// A pair of shapes that is often (not always) broadcast-compatible: `b` is either independent
/// or derived from `a` by dropping leading axes and replacing some dims with 1.
fn shape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    let derived = (
        shape(),
        0usize..=4,
        proptest::collection::vec(any::<bool>(), 4),
        any::<bool>(),
    )
        .prop_map(|(a, drop, ones, swap)| {
            let drop = drop.min(a.len());
            let b: Vec<usize> = a[drop..]
                .iter()
                .zip(&ones)
                .map(|(&d, &one)| if one { 1 } else { d })
                .collect();
            if swap {
                (b, a)
            } else {
                (a, b)
            }
        });
    prop_oneof![(shape(), shape()), derived]
}

// ---------------------------------------------------------------- (a) broadcast_dims

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn broadcast_dims_follows_numpy((a, b) in shape_pair()) {
        let want = ref_broadcast(&a, &b);
        let got = broadcast_dims(&statics(&a), &statics(&b));
        prop_assert_eq!(&got, &want.as_ref().map(|w| statics(w)), "a {:?} b {:?}", a, b);
        // Compatibility (and, for static dims, the result) is symmetric.
        let back = broadcast_dims(&statics(&b), &statics(&a));
        prop_assert_eq!(back, got);
        // Broadcasting with oneself is the identity; with a scalar too.
        prop_assert_eq!(broadcast_dims(&statics(&a), &statics(&a)), Some(statics(&a)));
        prop_assert_eq!(broadcast_dims(&statics(&a), &[]), Some(statics(&a)));
    }
}

// ---------------------------------------------------------------- (b) broadcasting add

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn add_builds_iff_numpy_broadcasts_and_runs_like_numpy((a, b) in shape_pair(), seed in any::<u64>()) {
        let mut g = Graph::new("add");
        let x = g.input("a", Shape::new(&a, DType::F32));
        let y = g.input("b", Shape::new(&b, DType::F32));
        let built = g.try_add(x, y);
        let Some(out_dims) = ref_broadcast(&a, &b) else {
            match built {
                Err(Error::Op { op, msg, .. }) => {
                    prop_assert_eq!(op, "add");
                    prop_assert!(msg.contains("broadcast"), "{}", msg);
                }
                other => prop_assert!(false, "{:?} + {:?} should fail, got {:?}", a, b, other),
            }
            return Ok(());
        };
        let z = built.map_err(|e| TestCaseError::fail(format!("{a:?} + {b:?}: {e}")))?;
        prop_assert_eq!(g.shape(z), &Shape::new(&out_dims, DType::F32));
        g.set_outputs(vec![z]);
        let ta = Tensor { data: values(seed, numel(&a)), dims: a.clone() };
        let tb = Tensor { data: values(seed ^ 0x9e37_79b9, numel(&b)), dims: b.clone() };
        let want = ref_add(&ta, &tb);
        let mut c = compile(g, true);
        let out = c.try_run(&[("a", &ta.data), ("b", &tb.data)]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&out[0], &want.data, "{:?} + {:?}", a, b);
    }
}

// ---------------------------------------------------------------- (c) movement chains

#[derive(Clone, Debug)]
enum Move {
    Reshape(Vec<usize>),
    Transpose(Vec<usize>),
    Narrow {
        axis: usize,
        start: usize,
        len: usize,
    },
}

/// Turn raw random numbers into a valid op on a value of shape `dims`.
fn pick_move(dims: &[usize], kind: u8, r: &[u32; 6]) -> Move {
    let rank = dims.len();
    match kind % 3 {
        0 => {
            // Reshape: split the element count into 1..=4 factors.
            let n = numel(dims);
            let new_rank = 1 + (r[0] as usize % 4);
            let mut out = Vec::with_capacity(new_rank);
            if n == 0 {
                for i in 0..new_rank {
                    out.push(r[1 + i % 5] as usize % 4);
                }
                let z = r[5] as usize % new_rank;
                out[z] = 0;
            } else {
                let mut left = n;
                for i in 0..new_rank - 1 {
                    let divs: Vec<usize> = (1..=left).filter(|d| left.is_multiple_of(*d)).collect();
                    let d = divs[r[1 + i] as usize % divs.len()];
                    out.push(d);
                    left /= d;
                }
                out.push(left);
            }
            Move::Reshape(out)
        }
        1 => {
            // Transpose: a random permutation (Fisher–Yates driven by r).
            let mut perm: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                perm.swap(i, r[i % 6] as usize % (i + 1));
            }
            Move::Transpose(perm)
        }
        _ => {
            if rank == 0 {
                return Move::Reshape(vec![1]);
            }
            let axis = r[0] as usize % rank;
            let n = dims[axis];
            let start = r[1] as usize % (n + 1);
            let len = r[2] as usize % (n - start + 1);
            Move::Narrow { axis, start, len }
        }
    }
}

fn run_chain(
    start: &[usize],
    steps: &[(u8, [u32; 6])],
    optimize: bool,
) -> std::result::Result<(), TestCaseError> {
    let mut g = Graph::new("chain");
    let mut id = g.input("x", Shape::new(start, DType::F32));
    let input = Tensor {
        dims: start.to_vec(),
        data: (0..numel(start)).map(|i| i as f32).collect(),
    };
    let mut want = input.clone();
    let mut applied = Vec::new();
    for (kind, r) in steps {
        let m = pick_move(&want.dims, *kind, r);
        let (next_id, next) = match &m {
            Move::Reshape(d) => (g.try_reshape(id, d), want.reshape(d)),
            Move::Transpose(p) => (g.try_transpose(id, p), want.transpose(p)),
            Move::Narrow { axis, start, len } => (
                g.try_narrow(id, *axis, *start, *len),
                want.narrow(*axis, *start, *len),
            ),
        };
        applied.push(m);
        id = next_id.map_err(|e| TestCaseError::fail(format!("{applied:?}: {e}")))?;
        prop_assert_eq!(
            g.shape(id),
            &Shape::new(&next.dims, DType::F32),
            "after {:?}",
            applied
        );
        want = next;
    }
    g.set_outputs(vec![id]);
    let mut c = compile(g, optimize);
    let out = c
        .try_run(&[("x", &input.data)])
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        &out[0],
        &want.data,
        "start {:?}, moves {:?}, optimize {}",
        start,
        applied,
        optimize
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn movement_chains_match_reference(
        start in proptest::collection::vec(1usize..=4, 1..=4),
        steps in proptest::collection::vec((any::<u8>(), any::<[u32; 6]>()), 1..=6),
    ) {
        run_chain(&start, &steps, true)?;
        run_chain(&start, &steps, false)?;
    }
}

// ---------------------------------------------------------------- (d) reductions

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sum_over_axes_matches_naive_sum(
        dims in proptest::collection::vec(prop_oneof![6 => 1usize..=5, 1 => Just(0usize)], 0..=4),
        mask in any::<u8>(),
        keepdims in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let axes: Vec<usize> = (0..dims.len()).filter(|i| mask & (1 << i) != 0).collect();
        let want_dims: Vec<usize> = dims
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (axes.contains(&i), keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        let x = Tensor { data: values(seed, numel(&dims)), dims: dims.clone() };
        // Naive sums in f64, and the scale of each sum for the tolerance.
        let n_out = numel(&want_dims);
        let mut sums = vec![0f64; n_out];
        let mut scale = vec![0f64; n_out];
        for flat in 0..x.data.len() {
            let idx = unravel(flat, &dims);
            let out_idx: Vec<usize> = idx
                .iter()
                .enumerate()
                .filter_map(|(i, &v)| match (axes.contains(&i), keepdims) {
                    (false, _) => Some(v),
                    (true, true) => Some(0),
                    (true, false) => None,
                })
                .collect();
            let o: usize = out_idx.iter().zip(strides(&want_dims)).map(|(i, s)| i * s).sum();
            sums[o] += x.data[flat] as f64;
            scale[o] += (x.data[flat] as f64).abs();
        }

        let mut g = Graph::new("sum");
        let xi = g.input("x", Shape::new(&dims, DType::F32));
        let s = g.try_sum(xi, &axes, keepdims).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(g.shape(s), &Shape::new(&want_dims, DType::F32));
        let mut outs = vec![s];
        // Max over the same axes, where every reduced axis is non-empty: exact.
        let max_ok = axes.iter().all(|&a| dims[a] > 0);
        if max_ok {
            outs.push(g.try_reduce(ReduceKind::Max, xi, &axes, keepdims).map_err(|e| TestCaseError::fail(e.to_string()))?);
        } else {
            prop_assert!(g.try_reduce(ReduceKind::Max, xi, &axes, keepdims).is_err());
        }
        g.set_outputs(outs);
        let mut c = compile(g, true);
        let out = c.try_run(&[("x", &x.data)]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(out[0].len(), n_out);
        for (i, (&got, &want)) in out[0].iter().zip(&sums).enumerate() {
            let tol = 1e-4 * scale[i].max(want.abs()).max(1e-6);
            prop_assert!((got as f64 - want).abs() <= tol, "dims {:?} axes {:?} keepdims {}: element {}: {} vs {}", dims, axes, keepdims, i, got, want);
        }
        if max_ok {
            let mut maxes = vec![f32::NEG_INFINITY; n_out];
            for flat in 0..x.data.len() {
                let idx = unravel(flat, &dims);
                let o: usize = idx
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !axes.contains(i))
                    .map(|(_, &v)| v)
                    .zip(strides(&dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect::<Vec<_>>()))
                    .map(|(i, s)| i * s)
                    .sum();
                maxes[o] = maxes[o].max(x.data[flat]);
            }
            prop_assert_eq!(&out[1], &maxes, "max: dims {:?} axes {:?}", dims, axes);
        }
    }
}

#[test]
fn reference_broadcast_sanity() {
    assert_eq!(ref_broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
    assert_eq!(ref_broadcast(&[0], &[1]), Some(vec![0]));
    assert_eq!(ref_broadcast(&[0], &[2]), None);
    assert_eq!(ref_broadcast(&[], &[]), Some(vec![]));
    let t = Tensor {
        dims: vec![2, 3],
        data: (0..6).map(|i| i as f32).collect(),
    };
    assert_eq!(
        t.transpose(&[1, 0]).data,
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(t.narrow(1, 1, 2).data, vec![1.0, 2.0, 4.0, 5.0]);
}

/// Shapes big enough that kernels split work across the thread pool; every thread count must
/// give the reference result.
#[test]
fn large_shapes_agree_across_thread_counts() {
    let (a_dims, b_dims) = ([64usize, 1, 1024], [1usize, 8, 1]);
    let a = Tensor {
        dims: a_dims.to_vec(),
        data: values(1, numel(&a_dims)),
    };
    let b = Tensor {
        dims: b_dims.to_vec(),
        data: values(2, numel(&b_dims)),
    };
    let sum_ab = ref_add(&a, &b);
    // A transposed (strided) view of the sum, narrowed, then reduced over its first axis.
    let t = sum_ab.transpose(&[2, 0, 1]).narrow(0, 3, 1000);
    let mut sums = vec![0f64; 64 * 8];
    let mut scale = vec![0f64; 64 * 8];
    for (flat, v) in t.data.iter().enumerate() {
        sums[flat % 512] += *v as f64;
        scale[flat % 512] += v.abs() as f64;
    }
    for threads in [1, 2, 3, 4] {
        let mut g = Graph::new("big");
        let x = g.input("a", Shape::new(&a_dims, DType::F32));
        let y = g.input("b", Shape::new(&b_dims, DType::F32));
        let s = g.add(x, y);
        let tr = g.transpose(s, &[2, 0, 1]);
        let nr = g.narrow(tr, 0, 3, 1000);
        let r = g.sum(nr, &[0], false);
        let e = g.activation(Activation::Relu, nr);
        g.set_outputs(vec![s, r, e]);
        let mut c = Session::new(Device::Cpu).with_threads(threads).compile(g);
        let out = c.run(&[("a", &a.data), ("b", &b.data)]);
        assert_eq!(out[0], sum_ab.data, "add with {threads} threads");
        for (i, (&got, &want)) in out[1].iter().zip(&sums).enumerate() {
            assert!(
                (got as f64 - want).abs() <= 1e-4 * scale[i],
                "sum[{i}] with {threads} threads: {got} vs {want}"
            );
        }
        let relu: Vec<f32> = t.data.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(
            out[2], relu,
            "relu of a strided view with {threads} threads"
        );
    }
}

/// Compiled graphs on several OS threads share the process-wide worker pool; concurrent runs
/// must neither deadlock nor mix up each other's work.
#[test]
fn concurrent_runs_on_the_shared_pool() {
    let n = 1 << 17;
    std::thread::scope(|s| {
        for k in 0..4u64 {
            s.spawn(move || {
                let mut g = Graph::new("concurrent");
                let x = g.input("x", Shape::new(&[n], DType::F32));
                let y = g.input("y", Shape::new(&[n], DType::F32));
                let m = g.mul(x, y);
                let r = g.sum(m, &[0], false);
                g.set_outputs(vec![m, r]);
                let mut c = Session::new(Device::Cpu).with_threads(2).compile(g);
                let xs = values(k + 10, n);
                let ys = values(k + 20, n);
                let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a * b).collect();
                let want_sum: f64 = want.iter().map(|&v| v as f64).sum();
                let scale: f64 = want.iter().map(|&v| v.abs() as f64).sum();
                for _ in 0..20 {
                    let out = c.run(&[("x", &xs), ("y", &ys)]);
                    assert_eq!(out[0], want, "thread {k}");
                    assert!(
                        (out[1][0] as f64 - want_sum).abs() <= 1e-4 * scale,
                        "thread {k}: {} vs {want_sum}",
                        out[1][0]
                    );
                }
            });
        }
    });
}

// ------------------------------------------- constants of every dtype, optimized or not

/// Values worth holding in a constant (or feeding as `x`) of `dt`: the identities the
/// simplifier knows (signed zeros, one), their neighbours, and the values arithmetic treats
/// specially (infinities, NaN), as little-endian bytes of one element.
fn special_elements(dt: DType) -> Vec<Vec<u8>> {
    let floats = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let one = |v: f64, dt: DType| {
        let mut b = vec![0u8; dt.size_bytes()];
        rlx::ir::convert::f64_to_bytes(v, dt, &mut b).unwrap();
        b
    };
    match dt {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            floats.iter().map(|&v| one(v, dt)).collect()
        }
        // Every pair of parts: real part 0 or 1 with a nonzero imaginary part included.
        DType::C64 => {
            let parts = [0.0f32, -0.0, 1.0, 0.5, -2.0, f32::INFINITY, f32::NAN];
            parts
                .iter()
                .flat_map(|&re| parts.iter().map(move |&im| (re, im)))
                .map(|(re, im)| {
                    re.to_le_bytes()
                        .into_iter()
                        .chain(im.to_le_bytes())
                        .collect()
                })
                .collect()
        }
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => [0.0, 1.0, -1.0, 2.0, -3.0, 7.0]
            .iter()
            .map(|&v| one(v, dt))
            .collect(),
        DType::U8 | DType::U32 => [0.0, 1.0, 2.0, 7.0].iter().map(|&v| one(v, dt)).collect(),
        DType::Bool => [0.0, 1.0].iter().map(|&v| one(v, dt)).collect(),
    }
}

/// Whether two outputs of `dt` are the same bits, any NaN matching any NaN (a NaN's payload
/// and sign depend on operand order, which no rule promises).
fn same_bits(a: &[u8], b: &[u8], dt: DType) -> bool {
    // A c64 element is compared part by part, as two f32.
    let dt = if dt == DType::C64 { DType::F32 } else { dt };
    let nan = |e: &[u8]| matches!(rlx::ir::convert::read_element(e, dt), rlx::ir::convert::Element::Float(v) if v.is_nan());
    a.len() == b.len()
        && a.chunks_exact(dt.size_bytes())
            .zip(b.chunks_exact(dt.size_bytes()))
            .all(|(x, y)| x == y || (nan(x) && nan(y)))
}

/// `g` on the CPU with the default pipeline and with every optimization off, on `x`.
fn optimized_and_not(g: &Graph, x: &[u8], dt: DType) -> Option<(Vec<u8>, Vec<u8>)> {
    let run = |s: Session| -> Option<Vec<u8>> {
        let mut c = s.try_compile(g.clone()).ok()?;
        let out = c.try_run_typed(&[("x", x, dt)]).ok()?;
        Some(out[0].0.clone())
    };
    let opt = run(Session::new(Device::Cpu));
    let plain = run(Session::new(Device::Cpu).without_optimizations());
    match (opt, plain) {
        (Some(a), Some(b)) => Some((a, b)),
        (None, None) => None,
        (a, b) => panic!(
            "{}: compiles/runs optimized {} but unoptimized {}",
            g.name(),
            a.is_some(),
            b.is_some()
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// `x op c` and `c op x` for every dtype and op, with `c` a constant splat (of one
    /// element, or broadcast to `x`'s shape) of a special value: the default pipeline (whose
    /// simplifier drops identities) gives the bits the unoptimized one gives.
    #[test]
    fn optimizations_keep_the_bits_of_arithmetic_with_constants(
        dt_i in 0..DType::ALL.len(),
        op_i in 0..4usize,
        c_i in 0..64usize,
        xs in proptest::collection::vec(0..64usize, 4),
        const_first: bool,
        full_shape: bool,
    ) {
        let dt = DType::ALL[dt_i];
        let specials = special_elements(dt);
        let c_bytes = specials[c_i % specials.len()].clone();
        // Integer division by zero (or of MIN by -1) is not what this checks.
        let int_div = op_i == 3 && !dt.is_float() && dt != DType::C64;
        if int_div {
            let e = rlx::ir::convert::read_element(&c_bytes, dt);
            prop_assume!(!matches!(e, rlx::ir::convert::Element::Int(0 | -1)));
        }
        let mut g = Graph::new("constant_arith");
        let x = g.input("x", Shape::new(&[4], dt));
        let c = if full_shape {
            g.try_constant_bytes(Shape::new(&[4], dt), c_bytes.repeat(4)).unwrap()
        } else {
            g.try_constant_bytes(Shape::scalar(dt), c_bytes.clone()).unwrap()
        };
        let (a, b) = if const_first { (c, x) } else { (x, c) };
        let y = match op_i {
            0 => g.try_add(a, b),
            1 => g.try_sub(a, b),
            2 => g.try_mul(a, b),
            _ => g.try_div(a, b),
        };
        let Ok(y) = y else {
            // The op refuses the dtype (Bool arithmetic): nothing to compare.
            return Ok(());
        };
        g.set_outputs(vec![y]);
        let x_bytes: Vec<u8> = xs
            .iter()
            .flat_map(|&i| specials[i % specials.len()].clone())
            .collect();
        if int_div && const_first {
            // x is the divisor here.
            let w = dt.size_bytes();
            prop_assume!(x_bytes.chunks_exact(w).all(|e| !matches!(
                rlx::ir::convert::read_element(e, dt),
                rlx::ir::convert::Element::Int(0 | -1)
            )));
        }
        if let Some((opt, plain)) = optimized_and_not(&g, &x_bytes, dt) {
            prop_assert!(
                same_bits(&opt, &plain, dt),
                "{dt} op {op_i} (const first: {const_first}), c = {c_bytes:?}, x = {x_bytes:?}: \
                 optimized {opt:?}, unoptimized {plain:?}"
            );
        }
    }
}

/// The cases a new user of complex numbers reaches for first (`x * (1 + 0.5i)`, `x + 0.5i`,
/// ...): a constant whose real part is the identity of the op and whose imaginary part is not
/// leaves `x` changed, with and without optimizations alike.
#[test]
fn complex_constants_with_an_identity_real_part_are_not_dropped() {
    let x = [(1.0f32, 2.0f32), (-3.0, 0.5)];
    let x_bytes: Vec<u8> = x
        .iter()
        .flat_map(|&(re, im)| re.to_le_bytes().into_iter().chain(im.to_le_bytes()))
        .collect();
    let cases: [(&str, f32, f32); 4] = [
        ("mul", 1.0, 0.5),
        ("div", 1.0, 0.5),
        ("add", 0.0, 0.5),
        ("sub", 0.0, 0.5),
    ];
    for (op, re, im) in cases {
        let mut g = Graph::new(op);
        let xi = g.input("x", Shape::new(&[2], DType::C64));
        let c = g.complex_scalar(re, im);
        let y = match op {
            "mul" => g.mul(xi, c),
            "div" => g.div(xi, c),
            "add" => g.add(xi, c),
            _ => g.sub(xi, c),
        };
        g.set_outputs(vec![y]);
        let (opt, plain) = optimized_and_not(&g, &x_bytes, DType::C64).unwrap();
        assert!(
            same_bits(&opt, &plain, DType::C64),
            "{op}: {opt:?} vs {plain:?}"
        );
        assert_ne!(opt, x_bytes, "{op} by {re}+{im}i returned x unchanged");
    }
}

/// A sum of concats whose constant splat is cut into pieces rebuilds each piece from the
/// splat's own bytes: a c64 splat keeps its imaginary part.
#[test]
fn a_cut_complex_splat_keeps_its_value() {
    let mut g = Graph::new("add_concats_c64");
    let x = g.input("x", Shape::new(&[6], DType::C64));
    let xa = g.narrow(x, 0, 0, 2);
    let splat = g.complex_scalar(0.5, 0.25);
    let s = g.expand(splat, &[4]);
    let a = g.concat(&[xa, s], 0);
    let y1 = g.narrow(x, 0, 0, 2);
    let y2 = g.narrow(x, 0, 2, 2);
    let y3 = g.narrow(x, 0, 4, 2);
    let b = g.concat(&[y1, y2, y3], 0);
    let y = g.add(a, b);
    g.set_outputs(vec![y]);
    let xs: Vec<u8> = (0..6)
        .flat_map(|i| {
            let (re, im) = (i as f32, -(i as f32) / 2.0);
            re.to_le_bytes().into_iter().chain(im.to_le_bytes())
        })
        .collect();
    let (opt, plain) = optimized_and_not(&g, &xs, DType::C64).unwrap();
    assert!(same_bits(&opt, &plain, DType::C64), "{opt:?} vs {plain:?}");
    let im = |b: &[u8], i: usize| f32::from_le_bytes(b[8 * i + 4..8 * i + 8].try_into().unwrap());
    assert_eq!(im(&opt, 5), -2.5 + 0.25);
}
