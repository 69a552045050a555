//! Tensor shapes: dimensions plus element type.

use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension of a shape: a known size, or a named size bound later.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    /// A size known when the graph is built.
    Static(usize),
    /// A size named symbolically (e.g. `"seq"`); it must be bound before compiling.
    Dynamic(String),
}

impl Dim {
    /// The static size, if known.
    pub fn as_static(&self) -> Option<usize> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Dynamic(_) => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Dynamic(s) => write!(f, "?{s}"),
        }
    }
}

/// Tensor shape: ordered dimensions and the element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    dims: Vec<Dim>,
    dtype: DType,
}

impl Shape {
    /// A shape with static dimensions.
    pub fn new(dims: &[usize], dtype: DType) -> Shape {
        Shape {
            dims: dims.iter().map(|&d| Dim::Static(d)).collect(),
            dtype,
        }
    }

    /// A rank-0 (scalar) shape.
    pub fn scalar(dtype: DType) -> Shape {
        Shape {
            dims: Vec::new(),
            dtype,
        }
    }

    /// A shape whose dimensions may be symbolic.
    pub fn with_dims(dims: Vec<Dim>, dtype: DType) -> Shape {
        Shape { dims, dtype }
    }

    /// The dimensions.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Same dimensions, another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Shape {
        Shape {
            dims: self.dims.clone(),
            dtype,
        }
    }

    /// True when every dimension is static.
    pub fn is_static(&self) -> bool {
        self.dims.iter().all(|d| d.as_static().is_some())
    }

    /// Static sizes, or `None` if some dimension is symbolic.
    pub fn static_dims(&self) -> Option<Vec<usize>> {
        self.dims.iter().map(Dim::as_static).collect()
    }

    /// Static size of dimension `i` (`None` if symbolic or out of range).
    pub fn dim(&self, i: usize) -> Option<usize> {
        self.dims.get(i).and_then(Dim::as_static)
    }

    /// Element count, if static.
    pub fn numel(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |acc, d| {
            d.as_static().and_then(|n| acc.checked_mul(n))
        })
    }

    /// Byte size of a dense buffer holding this shape, if static.
    pub fn size_bytes(&self) -> Option<usize> {
        self.numel()
            .and_then(|n| n.checked_mul(self.dtype.size_bytes()))
    }

    /// Replace each named symbolic dimension found in `bindings` by its size.
    pub fn bind(&self, bindings: &[(&str, usize)]) -> Shape {
        let dims = self
            .dims
            .iter()
            .map(|d| match d {
                Dim::Dynamic(name) => bindings
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|&(_, v)| Dim::Static(v))
                    .unwrap_or_else(|| d.clone()),
                s => s.clone(),
            })
            .collect();
        Shape {
            dims,
            dtype: self.dtype,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// numpy broadcasting of two dimension lists. `None` when incompatible.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            Some(&a[i + a.len() - n])
        } else {
            None
        };
        let db = if i + b.len() >= n {
            Some(&b[i + b.len() - n])
        } else {
            None
        };
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Static(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Static(1))) => x.clone(),
            _ => return None,
        };
        out.push(d);
    }
    Some(out)
}
