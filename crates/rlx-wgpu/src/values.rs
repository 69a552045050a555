//! How values lie in device memory ([`Form`]: 32-bit words, packed GGUF bytes, or f16 halves),
//! which form each node of a graph takes, and the host bytes' conversion at the I/O boundary.

use rlx_ir::{DType, Error, Graph, Op, Result};

/// How a value's elements lie in device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One 32-bit word per element of this dtype (see the [`crate::shaders`] module docs); two
    /// for c64 (the f32 real part, then the imaginary part: the host's layout).
    Words(DType),
    /// The host's bytes, four to a word: u8 rows that only the GGUF decoders read.
    Packed,
    /// f16 as 16 bits (the adapter has `SHADER_F16`), two to a word, addressed with
    /// [`crate::shaders::HALF`]; kernels see the same f32 bits as for `Words(F16)`.
    Half,
}

impl Form {
    /// Device bytes of `n` elements.
    pub(crate) fn bytes(self, n: usize) -> usize {
        match self {
            Form::Words(dt) => n * 4 * words_per(dt),
            Form::Packed => n.next_multiple_of(4),
            Form::Half => (n * 2).next_multiple_of(4),
        }
    }
}

/// Words per element of a value of dtype `dt` held as words: two for c64, one otherwise.
pub(crate) fn words_per(dt: DType) -> usize {
    if dt == DType::C64 {
        2
    } else {
        1
    }
}

/// The form of every node of `g`: u8 values that are read only as GGUF rows (the weights of
/// `DequantMatMul`, `norm_matmul` regions of one and `DequantizeRows`, also through a `Gather`
/// of whole rows) stay packed,
/// f16 values are halves when `half`, and every other value is words. A u8 value read both
/// ways, or packed rows a kernel cannot move, is an error naming the node.
pub(crate) fn forms(g: &Graph, half: bool) -> Result<Vec<Form>> {
    let n = g.len();
    let (mut packed, mut words) = (vec![false; n], vec![false; n]);
    let mut form = vec![Form::Packed; n];
    for id in g.ids().collect::<Vec<_>>().into_iter().rev() {
        let (i, node) = (id.index(), g.node(id));
        let err = |msg: String| Error::Unsupported {
            backend: "wgpu".into(),
            op: node.op.name().into(),
            node: id,
            msg,
        };
        form[i] = if packed[i] {
            if words[i] {
                return Err(err(
                    "this u8 value is read both as packed GGUF rows and as numbers".into(),
                ));
            }
            let movable = match &node.op {
                Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => true,
                Op::Gather { axis } => {
                    *axis + 1 < node.shape.rank()
                        && node
                            .shape
                            .dims()
                            .last()
                            .and_then(|d| d.as_static())
                            .is_some_and(|b| b % 4 == 0)
                }
                _ => false,
            };
            if !movable {
                return Err(err(format!(
                    "packed GGUF rows {} must be a leaf or a gather of rows of a multiple of 4 bytes",
                    node.shape
                )));
            }
            Form::Packed
        } else if half && node.shape.dtype() == DType::F16 {
            Form::Half
        } else {
            Form::Words(node.shape.dtype())
        };
        // A `norm_matmul` region's results read its product's weights packed.
        let region_w = match &node.op {
            Op::Fused(r) if r.kind == rlx_ir::FusionKind::NormMatMul => {
                rlx_opt::norm_matmul_parts(g, id).and_then(|p| p.scheme.map(|_| p.w))
            }
            _ => None,
        };
        for (k, x) in node.inputs.iter().enumerate() {
            let reads_packed = match &node.op {
                Op::Fused(_) if region_w.is_some() => region_w == Some(*x),
                Op::DequantMatMul { .. } => k == 1,
                Op::DequantizeRows { .. } => k == 0,
                Op::Gather { .. } => k == 0 && form[i] == Form::Packed,
                _ => false,
            };
            if reads_packed {
                packed[x.index()] = true;
            } else {
                words[x.index()] = true;
            }
        }
    }
    Ok(form)
}

/// Host bytes of a value of form `f` as device memory.
pub fn to_words(f: Form, bytes: &[u8]) -> Vec<u8> {
    let dt = match f {
        Form::Words(dt) => dt,
        Form::Packed | Form::Half => {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().next_multiple_of(4), 0);
            return v;
        }
    };
    let ints = |v: &mut dyn Iterator<Item = i64>| -> Vec<u8> {
        v.flat_map(|x| (x as i32).to_le_bytes()).collect()
    };
    match dt {
        DType::F16 => bytes
            .chunks_exact(2)
            .flat_map(|b| {
                half::f16::from_le_bytes([b[0], b[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .flat_map(|b| {
                half::bf16::from_le_bytes([b[0], b[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect(),
        DType::U8 => ints(&mut bytes.iter().map(|&b| b as i64)),
        DType::I8 => ints(&mut bytes.iter().map(|&b| b as i8 as i64)),
        DType::I16 => ints(
            &mut bytes
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]) as i64),
        ),
        DType::Bool => bytes
            .iter()
            .flat_map(|&b| u32::from(b != 0).to_le_bytes())
            .collect(),
        // 32-bit values, and c64 as its two f32 parts, are the host's bytes (f64 and i64 never
        // reach the device: `unsupported` refuses them).
        DType::F32 | DType::I32 | DType::U32 | DType::C64 | DType::F64 | DType::I64 => {
            bytes.to_vec()
        }
    }
}

/// Device memory of a value of form `f` as host bytes (the inverse of [`to_words`]).
pub fn from_words(f: Form, words: &[u8], out: &mut [u8]) {
    let w = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let Form::Words(dt) = f else {
        // Packed bytes and f16 halves are the host's bytes.
        out.copy_from_slice(&words[..out.len()]);
        return;
    };
    match dt {
        DType::F16 => words
            .chunks_exact(4)
            .zip(out.chunks_exact_mut(2))
            .for_each(|(c, o)| {
                o.copy_from_slice(&half::f16::from_f32(f32::from_le_bytes(w(c))).to_le_bytes())
            }),
        DType::BF16 => words
            .chunks_exact(4)
            .zip(out.chunks_exact_mut(2))
            .for_each(|(c, o)| {
                o.copy_from_slice(&half::bf16::from_f32(f32::from_le_bytes(w(c))).to_le_bytes())
            }),
        DType::Bool => words
            .chunks_exact(4)
            .zip(out.iter_mut())
            .for_each(|(c, o)| *o = u8::from(u32::from_le_bytes(w(c)) != 0)),
        // The low bytes of each word (the value, wrapped to the dtype's range).
        DType::I8 | DType::U8 | DType::I16 => {
            let size = dt.size_bytes();
            words
                .chunks_exact(4)
                .zip(out.chunks_exact_mut(size))
                .for_each(|(c, o)| o.copy_from_slice(&c[..size]))
        }
        DType::F32 | DType::I32 | DType::U32 | DType::C64 | DType::F64 | DType::I64 => {
            out.copy_from_slice(&words[..out.len()])
        }
    }
}

/// Bytes of device memory a host buffer of `bytes` bytes of form `f` takes.
pub(crate) fn device_bytes(f: Form, bytes: usize) -> usize {
    match f {
        Form::Packed | Form::Half => bytes,
        Form::Words(dt) => bytes / dt.size_bytes() * 4 * words_per(dt),
    }
}
