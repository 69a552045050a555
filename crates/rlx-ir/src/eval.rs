//! The reference evaluator: runs any graph on the host, one node at a time, in f64 for floats
//! and in exact integer arithmetic for integers, rounding each result to its node's dtype.
//!
//! It is written for clarity, not speed, and is the oracle backends are tested against (the op
//! table runs on a backend and here, ggml `test-backend-ops` style) and what constant folding
//! computes folded values with. Each op's evaluation rule lives with its other rules in its
//! family file under [`crate::ops`]; composite ops without a rule of their own are evaluated
//! through their decomposition.

use crate::{DType, Error, Graph, Op, Result, Shape};
use half::{bf16, f16};
use std::collections::BTreeMap;

/// Element storage of a [`Tensor`]: floats as f64 (already rounded to the tensor's dtype),
/// integers and bools as i64 (already wrapped to the dtype's range; bools are 0 or 1), complex
/// values as `(re, im)` pairs of f64 (each part already rounded to f32).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// F16, BF16, F32 and F64 values.
    Float(Vec<f64>),
    /// I8 … I64, U8, U32 and Bool values.
    Int(Vec<i64>),
    /// C64 values.
    Complex(Vec<(f64, f64)>),
}

/// A host value: static dims, a dtype and its elements in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    dims: Vec<usize>,
    dtype: DType,
    data: Data,
}

/// Round an f64 to the nearest value of float dtype `dt`.
pub fn round_float(dt: DType, v: f64) -> f64 {
    match dt {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F64 => v,
        // Not real floats: nothing to round (callers round float values only; each part of a
        // complex value is rounded as an f32).
        DType::I8
        | DType::I16
        | DType::I32
        | DType::I64
        | DType::U8
        | DType::U32
        | DType::Bool
        | DType::C64 => v,
    }
}

/// Wrap an integer to the range of integer dtype `dt` (two's complement, as `as` does); Bool
/// becomes `v != 0`.
pub fn wrap_int(dt: DType, v: i128) -> i64 {
    match dt {
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U32 => v as u32 as i64,
        DType::Bool => (v != 0) as i64,
        DType::I64 => v as i64,
        // Not integers: callers wrap integer values only (floats are rounded by
        // `round_float`); kept as the nearest i64.
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::C64 => v as i64,
    }
}

/// A float converted to integer dtype `dt` with Rust `as` semantics: truncated toward zero,
/// saturated at the dtype's range, NaN to 0 (what the CPU backend's casts do).
pub fn saturate_int(dt: DType, v: f64) -> i64 {
    match dt {
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U32 => v as u32 as i64,
        DType::Bool => (v != 0.0) as i64,
        DType::I64 => v as i64,
        // Not integers: callers convert to integer dtypes only; kept as the nearest i64.
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::C64 => v as i64,
    }
}

impl Tensor {
    /// A tensor from f64 values, converted to `dtype`: floats round to nearest, integers take
    /// the cast semantics of [`saturate_int`], Bool is `v != 0`, C64 gets imaginary parts 0.
    pub fn from_f64(dims: &[usize], dtype: DType, vals: Vec<f64>) -> Tensor {
        debug_assert_eq!(vals.len(), dims.iter().product::<usize>());
        if dtype == DType::C64 {
            return Tensor::from_complex(dims, vals.into_iter().map(|v| (v, 0.0)).collect());
        }
        let data = if dtype.is_float() {
            Data::Float(vals.into_iter().map(|v| round_float(dtype, v)).collect())
        } else {
            Data::Int(vals.into_iter().map(|v| saturate_int(dtype, v)).collect())
        };
        Tensor {
            dims: dims.to_vec(),
            dtype,
            data,
        }
    }

    /// A tensor from integers, converted to `dtype`: integers wrap, floats round.
    pub fn from_i64(dims: &[usize], dtype: DType, vals: Vec<i64>) -> Tensor {
        Tensor::from_i128(dims, dtype, vals.into_iter().map(i128::from).collect())
    }

    /// A C64 tensor from `(re, im)` pairs, each part rounded to f32.
    pub fn from_complex(dims: &[usize], vals: Vec<(f64, f64)>) -> Tensor {
        debug_assert_eq!(vals.len(), dims.iter().product::<usize>());
        Tensor {
            dims: dims.to_vec(),
            dtype: DType::C64,
            data: Data::Complex(
                vals.into_iter()
                    .map(|(r, i)| (r as f32 as f64, i as f32 as f64))
                    .collect(),
            ),
        }
    }

    /// [`Tensor::from_i64`] from wider intermediates (products and sums before wrapping).
    pub fn from_i128(dims: &[usize], dtype: DType, vals: Vec<i128>) -> Tensor {
        if dtype == DType::C64 {
            return Tensor::from_complex(dims, vals.into_iter().map(|v| (v as f64, 0.0)).collect());
        }
        let data = if dtype.is_float() {
            Data::Float(
                vals.into_iter()
                    .map(|v| round_float(dtype, v as f64))
                    .collect(),
            )
        } else {
            Data::Int(vals.into_iter().map(|v| wrap_int(dtype, v)).collect())
        };
        Tensor {
            dims: dims.to_vec(),
            dtype,
            data,
        }
    }

    /// Decode little-endian bytes of `shape` (which must be static).
    pub fn from_bytes(shape: &Shape, bytes: &[u8]) -> Result<Tensor> {
        let dims = shape
            .static_dims()
            .ok_or_else(|| Error::Invalid(format!("cannot evaluate symbolic shape {shape}")))?;
        let dt = shape.dtype();
        let n: usize = dims.iter().product();
        let w = dt.size_bytes();
        if bytes.len() != n * w {
            return Err(Error::Invalid(format!(
                "{} bytes given for {shape}, which holds {}",
                bytes.len(),
                n * w
            )));
        }
        let data = if dt == DType::C64 {
            let f = |b: &[u8]| f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64;
            Data::Complex(
                bytes
                    .chunks_exact(8)
                    .map(|b| (f(&b[..4]), f(&b[4..])))
                    .collect(),
            )
        } else if dt.is_float() {
            Data::Float(
                bytes
                    .chunks_exact(w)
                    .map(|b| crate::convert::bytes_to_f64(b, dt))
                    .collect(),
            )
        } else if dt == DType::I64 {
            Data::Int(
                bytes
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
            )
        } else {
            // Every other integer fits f64 exactly.
            Data::Int(
                bytes
                    .chunks_exact(w)
                    .map(|b| wrap_int(dt, crate::convert::bytes_to_f64(b, dt) as i128))
                    .collect(),
            )
        };
        Ok(Tensor {
            dims,
            dtype: dt,
            data,
        })
    }

    /// The little-endian bytes of the elements.
    pub fn to_bytes(&self) -> Vec<u8> {
        let w = self.dtype.size_bytes();
        let mut out = vec![0u8; self.numel() * w];
        for (i, o) in out.chunks_exact_mut(w).enumerate() {
            match (&self.data, self.dtype) {
                (Data::Float(v), DType::F32) => o.copy_from_slice(&(v[i] as f32).to_le_bytes()),
                (Data::Float(v), DType::F64) => o.copy_from_slice(&v[i].to_le_bytes()),
                (Data::Float(v), DType::F16) => {
                    o.copy_from_slice(&f16::from_f64(v[i]).to_le_bytes())
                }
                (Data::Float(v), _) => o.copy_from_slice(&bf16::from_f64(v[i]).to_le_bytes()),
                (Data::Int(v), _) => o.copy_from_slice(&v[i].to_le_bytes()[..w]),
                (Data::Complex(v), _) => {
                    o[..4].copy_from_slice(&(v[i].0 as f32).to_le_bytes());
                    o[4..].copy_from_slice(&(v[i].1 as f32).to_le_bytes());
                }
            }
        }
        out
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape (dims and dtype).
    pub fn shape(&self) -> Shape {
        Shape::new(&self.dims, self.dtype)
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The elements.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Every element as f64 (integers converted, exact up to 2^53; complex values give their
    /// real parts).
    pub fn f64s(&self) -> Vec<f64> {
        match &self.data {
            Data::Float(v) => v.clone(),
            Data::Int(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Complex(v) => v.iter().map(|&(r, _)| r).collect(),
        }
    }

    /// Every element as i64 (floats truncated toward zero; complex values give their real
    /// parts so truncated).
    pub fn i64s(&self) -> Vec<i64> {
        match &self.data {
            Data::Float(v) => v.iter().map(|&x| x as i64).collect(),
            Data::Int(v) => v.clone(),
            Data::Complex(v) => v.iter().map(|&(r, _)| r as i64).collect(),
        }
    }

    /// Every element as a `(re, im)` pair (real dtypes give imaginary parts 0).
    pub fn complex(&self) -> Vec<(f64, f64)> {
        match &self.data {
            Data::Complex(v) => v.clone(),
            Data::Float(_) | Data::Int(_) => self.f64s().into_iter().map(|r| (r, 0.0)).collect(),
        }
    }

    /// The same elements under new dims (same count).
    pub fn reshaped(&self, dims: &[usize]) -> Tensor {
        Tensor {
            dims: dims.to_vec(),
            dtype: self.dtype,
            data: self.data.clone(),
        }
    }

    /// The elements picked by `src` (flat indices into `self`), as a tensor of `dims`.
    pub fn pick(&self, dims: &[usize], src: &[usize]) -> Tensor {
        let data = match &self.data {
            Data::Float(v) => Data::Float(src.iter().map(|&i| v[i]).collect()),
            Data::Int(v) => Data::Int(src.iter().map(|&i| v[i]).collect()),
            Data::Complex(v) => Data::Complex(src.iter().map(|&i| v[i]).collect()),
        };
        Tensor {
            dims: dims.to_vec(),
            dtype: self.dtype,
            data,
        }
    }

    /// Broadcast to `dims` (numpy rules; the caller has checked they broadcast).
    pub fn broadcast_to(&self, dims: &[usize]) -> Tensor {
        if self.dims == dims {
            return self.clone();
        }
        self.pick(dims, &broadcast_map(&self.dims, dims))
    }
}

/// Row-major strides of `dims` (in elements).
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of flat position `i` in `dims`.
pub fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        if dims[a] > 0 {
            idx[a] = i % dims[a];
            i /= dims[a];
        }
    }
    idx
}

/// For each element of `to`, the flat index of the element of `from` it reads when `from` is
/// broadcast to `to` (leading axes added, size-1 axes repeated).
pub fn broadcast_map(from: &[usize], to: &[usize]) -> Vec<usize> {
    let n: usize = to.iter().product();
    let off = to.len() - from.len();
    let fs = strides(from);
    (0..n)
        .map(|i| {
            let idx = unravel(i, to);
            from.iter()
                .enumerate()
                .map(|(a, &d)| if d == 1 { 0 } else { idx[a + off] * fs[a] })
                .sum()
        })
        .collect()
}

/// Evaluate `g` with the values of its inputs and params given by name. Returns the outputs in
/// order. Errors name the node and op that cannot be evaluated.
pub fn evaluate(g: &Graph, leaves: &BTreeMap<String, Tensor>) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Option<Tensor>> = vec![None; g.len()];
    // Only nodes the outputs depend on are evaluated.
    let mut needed = vec![false; g.len()];
    for o in g.outputs() {
        needed[o.index()] = true;
    }
    for id in g.ids().collect::<Vec<_>>().into_iter().rev() {
        if needed[id.index()] {
            for i in &g.node(id).inputs {
                needed[i.index()] = true;
            }
        }
    }
    for id in g.ids() {
        if !needed[id.index()] {
            continue;
        }
        let n = g.node(id);
        let at = |e: Error| e.at(id);
        let v = match &n.op {
            Op::Input { name } | Op::Param { name } => {
                let t = leaves
                    .get(name)
                    .ok_or_else(|| Error::MissingInput { name: name.clone() })?;
                if t.shape() != n.shape {
                    return Err(Error::Invalid(format!(
                        "value for {name} has shape {}, the graph declares {}",
                        t.shape(),
                        n.shape
                    )));
                }
                t.clone()
            }
            Op::Constant { data } => Tensor::from_bytes(&n.shape, data).map_err(at)?,
            op => {
                let ins: Vec<&Tensor> = n
                    .inputs
                    .iter()
                    .map(|i| vals[i.index()].as_ref().expect("operands come first"))
                    .collect();
                let dts: Vec<DType> = ins.iter().map(|t| t.dtype()).collect();
                // Complex values go through the op's complex form (real and imaginary parts
                // computed with real ops), which the complex primitives evaluate.
                let out = if crate::ops::complex::splits(op, &dts) {
                    through_decomposition(op, &ins).map_err(at)?
                } else {
                    crate::ops::eval(op, &ins, &n.shape).map_err(at)?
                };
                debug_assert_eq!(
                    out.shape(),
                    n.shape,
                    "{} evaluated to the wrong shape",
                    op.name()
                );
                out
            }
        };
        vals[id.index()] = Some(v);
    }
    Ok(g.outputs()
        .iter()
        .map(|o| vals[o.index()].clone().expect("outputs evaluated"))
        .collect())
}

/// Evaluate `op` on `ins` through its decomposition (for composites without a rule of their
/// own): the decomposition is built over inputs of the operands' shapes and evaluated.
pub(crate) fn through_decomposition(op: &Op, ins: &[&Tensor]) -> Result<Tensor> {
    let mut g = Graph::new("decomposition");
    let mut leaves = BTreeMap::new();
    let mut args = Vec::new();
    for (i, t) in ins.iter().enumerate() {
        let name = format!("arg{i}");
        args.push(g.input(&name, t.shape()));
        leaves.insert(name, (*t).clone());
    }
    let r = crate::ops::decompose(&mut g, op, &args)
        .ok_or_else(|| Error::op(op.name(), "has no evaluation rule and no decomposition"))??;
    g.set_outputs(vec![r]);
    Ok(evaluate(&g, &leaves)?.remove(0))
}

/// For a reduction of `dims` over `axes`: for each result element (kept axes in row-major
/// order), the flat indices of the elements it reduces, in increasing order (so along one axis,
/// in axis order).
pub fn reduce_groups(dims: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let kd: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    let ks = strides(&kd);
    let mut groups = vec![Vec::new(); kd.iter().product()];
    let n: usize = dims.iter().product();
    for i in 0..n {
        let idx = unravel(i, dims);
        let o: usize = kept.iter().zip(&ks).map(|(&a, &s)| idx[a] * s).sum();
        groups[o].push(i);
    }
    groups
}
