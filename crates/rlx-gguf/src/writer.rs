//! Writing GGUF v3 files ([`GgufWriter`]) and filling tensors with random but well-formed
//! blocks of a ggml type ([`random_tensor`]): what builds random-weight models of a real model's
//! shapes and block types, for checks and benchmarks where the model file cannot travel.

use crate::reader::{Value, DEFAULT_ALIGNMENT};
use crate::{GgmlType, GgufError, Result};

/// A GGUF v3 file being built: metadata in order, then tensors in order, each tensor's data
/// aligned to [`DEFAULT_ALIGNMENT`]. [`crate::GgufFile::from_bytes`] reads back what
/// [`GgufWriter::to_bytes`] writes.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// GGUF's id of a metadata value type.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(buf: &mut Vec<u8>, key: &str, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => put_str(buf, s),
        Value::Array(items) => {
            // An empty array is written as an array of strings (GGUF needs some element type).
            let ety = items.first().map_or(8, type_id);
            if let Some(i) = items.iter().position(|x| type_id(x) != ety) {
                return Err(GgufError::new(
                    buf.len() as u64,
                    format!("metadata[\"{key}\"][{i}]"),
                    format!(
                        "an array's elements must share one type: {} after {}",
                        items[i].type_name(),
                        items[0].type_name()
                    ),
                ));
            }
            buf.extend_from_slice(&ety.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(buf, key, x)?;
            }
        }
    }
    Ok(())
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Add metadata entry `key` (in order; keys are not deduplicated).
    pub fn meta(&mut self, key: &str, value: Value) -> &mut GgufWriter {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Add tensor `name` of type `ty` and row-major `shape` (the last dimension contiguous),
    /// holding `data`: whole blocks of `ty`, `shape`'s rows one after another.
    pub fn tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut GgufWriter> {
        let field = format!("tensor[\"{name}\"]");
        let (&row, rows) = shape
            .split_last()
            .ok_or_else(|| GgufError::new(0, &field, "a tensor needs at least one dimension"))?;
        let row_bytes = ty.row_bytes(row).ok_or_else(|| {
            GgufError::new(
                0,
                &field,
                format!(
                    "rows of {row} elements are not whole {ty} blocks of {}",
                    ty.block_elems()
                ),
            )
        })?;
        let want = rows.iter().product::<usize>() * row_bytes;
        if data.len() != want {
            return Err(GgufError::new(
                0,
                &field,
                format!(
                    "{} bytes of data for {ty} {shape:?} (needs {want})",
                    data.len()
                ),
            ));
        }
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), ty, dims, data));
        Ok(self)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, v) in &self.metadata {
            put_str(&mut b, key);
            b.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut b, key, v)?;
        }
        let align = |n: u64| n.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        let mut offset = 0u64;
        for (name, ty, dims, data) in &self.tensors {
            put_str(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.id().to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset = align(offset + data.len() as u64);
        }
        b.resize(align(b.len() as u64) as usize, 0);
        for (_, _, _, data) in &self.tensors {
            b.extend_from_slice(data);
            b.resize(align(b.len() as u64) as usize, 0);
        }
        Ok(b)
    }
}

/// A small deterministic generator (SplitMix64): the same seed gives the same tensor on every
/// machine.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }
}

/// Where a block type keeps its f16 scale and min (byte offsets in the block), and the scale
/// that gives dequantized values a spread of about 1 when the quants and sub-scales are
/// uniformly random; the min makes the mean about 0.
fn block_scales(ty: GgmlType) -> Option<(usize, Option<usize>, f32, f32)> {
    use GgmlType::*;
    // (scale offset, min offset, scale for spread 1, min as a multiple of the scale)
    Some(match ty {
        Q4_0 => (0, None, 4.6, 0.0),
        Q5_0 => (0, None, 9.2, 0.0),
        Q8_0 => (0, None, 74.0, 0.0),
        Q4_1 => (0, Some(2), 4.6, -7.5),
        Q5_1 => (0, Some(2), 9.2, -15.5),
        // value = d·sc·q − dmin·m with 4-bit sc, m and 2-bit q
        Q2_K => (80, Some(82), 14.0, 1.5),
        // value = d·(sc − 32)·q with 6-bit sc and 3-bit signed q
        Q3_K => (108, None, 43.0, 0.0),
        // value = d·sc·q − dmin·m with 6-bit sc, m and 4- or 5-bit q
        Q4_K => (0, Some(2), 258.0, 7.5),
        Q5_K => (0, Some(2), 527.0, 15.5),
        // value = d·sc·(q − 32) with signed 8-bit sc and 6-bit q
        Q6_K => (208, None, 1365.0, 0.0),
        F32 | F16 | BF16 | Q8_1 | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ4_NL | IQ3_S
        | IQ2_S | IQ4_XS | I8 | I16 | I32 | I64 | F64 | IQ1_M | TQ1_0 | TQ2_0 | MXFP4 => {
            return None
        }
    })
}

/// Random data for a tensor of type `ty` and row-major `shape`: float types get values uniform
/// in `mean ± spread·√3` (standard deviation `spread`); block types get random quants and
/// sub-scales with f16 scales chosen so the dequantized values have a spread of about `spread`
/// around about 0 (`mean` is for float types: norm weights near 1). Types RLX cannot decode,
/// and the integer types, are an error.
pub fn random_tensor(
    ty: GgmlType,
    shape: &[usize],
    mean: f32,
    spread: f32,
    rng: &mut SplitMix64,
) -> Result<Vec<u8>> {
    let numel: usize = shape.iter().product();
    let field = format!("random {ty} tensor {shape:?}");
    let bad = |msg: String| GgufError::new(0, &field, msg);
    let row = *shape.last().ok_or_else(|| bad("no dimensions".into()))?;
    let row_bytes = ty.row_bytes(row).ok_or_else(|| {
        bad(format!(
            "rows of {row} elements are not whole blocks of {}",
            ty.block_elems()
        ))
    })?;
    let bytes = numel / row.max(1) * row_bytes;
    let width = 3f32.sqrt() * spread;
    let mut out = Vec::with_capacity(bytes);
    match ty {
        GgmlType::F32 => (0..numel)
            .for_each(|_| out.extend_from_slice(&(mean + width * rng.signed_unit()).to_le_bytes())),
        GgmlType::F16 => (0..numel).for_each(|_| {
            out.extend_from_slice(
                &half::f16::from_f32(mean + width * rng.signed_unit()).to_le_bytes(),
            )
        }),
        GgmlType::BF16 => (0..numel).for_each(|_| {
            out.extend_from_slice(
                &half::bf16::from_f32(mean + width * rng.signed_unit()).to_le_bytes(),
            )
        }),
        _ => {
            let (d_at, m_at, per_unit, min_mul) = block_scales(ty)
                .ok_or_else(|| bad(format!("random {ty} blocks are not written (RLX writes float types, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K)")))?;
            out.resize(bytes, 0);
            rng.fill(&mut out);
            let d = spread / per_unit;
            for block in out.chunks_mut(ty.block_bytes()) {
                // Each block's scale varies a little, as real blocks' do.
                let di = d * (1.0 + 0.25 * rng.signed_unit());
                block[d_at..d_at + 2].copy_from_slice(&half::f16::from_f32(di).to_le_bytes());
                if let Some(m) = m_at {
                    block[m..m + 2]
                        .copy_from_slice(&half::f16::from_f32(min_mul * di).to_le_bytes());
                }
            }
        }
    }
    Ok(out)
}

/// A synthetic vocabulary of `n` tokens as tokenizer metadata, for random-weight models: with
/// `gpt2`, byte-level BPE (`specials` first, then the 256 byte characters, a few merges and
/// filler tokens `t<i>`); otherwise SentencePiece-style (`specials`, the 256 `<0xXX>` byte
/// tokens, `▁`, then `▁t<i>` with falling scores). The filler tokens only give the embedding its
/// rows: text tokenizes to bytes and the merged pieces.
pub fn synthetic_vocab(gpt2: bool, specials: &[&str], n: usize) -> Result<Vec<(String, Value)>> {
    let fixed = specials.len() + 257;
    if n < fixed {
        return Err(GgufError::new(
            0,
            "tokenizer.ggml.tokens",
            format!(
                "a synthetic vocabulary of {n} tokens cannot hold {fixed} special and byte tokens"
            ),
        ));
    }
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    let mut types = vec![Value::I32(3); specials.len()];
    let mut meta = Vec::new();
    let s = |x: &str| Value::String(x.to_string());
    if gpt2 {
        tokens.extend((0..=255u8).map(|b| crate::tokenizer::bpe::byte_to_char(b).to_string()));
        let merges = ["Ġ t", "e r", "Ġt h", "i n"];
        tokens.extend(["Ġt", "er", "Ġth", "in"].map(String::from));
        let filler = n.saturating_sub(tokens.len());
        tokens.extend((0..filler).map(|i| format!("t{i}")));
        tokens.truncate(n);
        types.resize(tokens.len(), Value::I32(1));
        meta.push(("tokenizer.ggml.model".into(), s("gpt2")));
        meta.push(("tokenizer.ggml.pre".into(), s("smollm")));
        meta.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| s(m)).collect()),
        ));
        meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)));
    } else {
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        types.resize(tokens.len(), Value::I32(6));
        // The word-start mark, so spaces come back as spaces.
        tokens.push("\u{2581}".to_string());
        types.push(Value::I32(1));
        let filler = n.saturating_sub(tokens.len());
        tokens.extend((0..filler).map(|i| format!("\u{2581}t{i}")));
        tokens.truncate(n);
        types.resize(tokens.len(), Value::I32(1));
        let scores = (0..n)
            .map(|i| {
                Value::F32(if i < fixed {
                    0.0
                } else {
                    -((i - fixed) as f32)
                })
            })
            .collect();
        meta.push(("tokenizer.ggml.model".into(), s("llama")));
        meta.push(("tokenizer.ggml.pre".into(), s("default")));
        meta.push(("tokenizer.ggml.scores".into(), Value::Array(scores)));
        meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)));
    }
    meta.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    ));
    meta.push(("tokenizer.ggml.token_type".into(), Value::Array(types)));
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize, GgufFile, Tokenizer};

    #[test]
    fn what_the_writer_writes_reads_back() {
        let mut w = GgufWriter::new();
        w.meta("a.u8", Value::U8(7))
            .meta("a.i8", Value::I8(-7))
            .meta("a.u16", Value::U16(700))
            .meta("a.i16", Value::I16(-700))
            .meta("a.u32", Value::U32(70_000))
            .meta("a.i32", Value::I32(-70_000))
            .meta("a.u64", Value::U64(1 << 40))
            .meta("a.i64", Value::I64(-(1 << 40)))
            .meta("a.f32", Value::F32(0.5))
            .meta("a.f64", Value::F64(-0.25))
            .meta("a.bool", Value::Bool(true))
            .meta("a.str", Value::String("héllo".into()))
            .meta(
                "a.nested",
                Value::Array(vec![
                    Value::Array(vec![Value::I32(1), Value::I32(2)]),
                    Value::Array(vec![Value::I32(3)]),
                ]),
            );
        let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let mut rng = SplitMix64::new(1);
        let q = random_tensor(GgmlType::Q4_0, &[2, 32], 0.0, 1.0, &mut rng).unwrap();
        w.tensor("t.f32", GgmlType::F32, &[2, 3], f32s.clone())
            .unwrap()
            .tensor("t.q4", GgmlType::Q4_0, &[2, 32], q.clone())
            .unwrap();
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let got: Vec<(String, Value)> = f
            .metadata()
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        assert_eq!(got, w.metadata);
        let t = f.tensor("t.f32").unwrap();
        assert_eq!((t.shape(), t.ty), (vec![2, 3], GgmlType::F32));
        assert_eq!(f.tensor_data(t), &f32s[..]);
        let t = f.tensor("t.q4").unwrap();
        assert_eq!((t.shape(), t.ty), (vec![2, 32], GgmlType::Q4_0));
        assert_eq!(f.tensor_data(t), &q[..]);
        assert_eq!(t.offset % DEFAULT_ALIGNMENT, 0);
    }

    #[test]
    fn bad_tensors_and_arrays_are_named_errors() {
        let mut w = GgufWriter::new();
        let e = w
            .tensor("x", GgmlType::F32, &[2, 3], vec![0; 20])
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("20 bytes") && e.to_string().contains("needs 24"),
            "{e}"
        );
        let e = w
            .tensor("x", GgmlType::Q4_0, &[2, 30], vec![])
            .err()
            .unwrap();
        assert!(e.to_string().contains("not whole Q4_0 blocks"), "{e}");
        assert!(w.tensor("x", GgmlType::F32, &[], vec![]).is_err());
        w.meta("mixed", Value::Array(vec![Value::I32(1), Value::F32(1.0)]));
        let e = w.to_bytes().err().unwrap();
        assert!(
            e.to_string().contains("mixed") && e.to_string().contains("FLOAT32"),
            "{e}"
        );
        let e = random_tensor(GgmlType::IQ2_XS, &[256], 0.0, 1.0, &mut SplitMix64::new(0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("IQ2_XS"), "{e}");
    }

    /// Random blocks of every type written decode to finite values spread about as asked.
    #[test]
    fn random_blocks_decode_to_the_spread_asked_for() {
        use GgmlType::*;
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
        ] {
            let mean_in = if matches!(ty, F32 | F16 | BF16) {
                1.0
            } else {
                0.0
            };
            let data =
                random_tensor(ty, &[64, 256], mean_in, 0.02, &mut SplitMix64::new(3)).unwrap();
            let mut v = vec![0f32; 64 * 256];
            dequantize(ty, &data, &mut v).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{ty}");
            let n = v.len() as f32;
            let mean = v.iter().sum::<f32>() / n;
            let sd = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
            assert!((mean - mean_in).abs() < 0.02, "{ty}: mean {mean}");
            assert!((0.01..0.04).contains(&sd), "{ty}: spread {sd}");
        }
    }

    #[test]
    fn synthetic_vocabularies_load_as_tokenizers() {
        for gpt2 in [true, false] {
            let mut w = GgufWriter::new();
            for (k, v) in synthetic_vocab(gpt2, &["<s>", "</s>"], 1000).unwrap() {
                w.meta(&k, v);
            }
            w.meta("tokenizer.ggml.bos_token_id", Value::U32(0))
                .meta("tokenizer.ggml.eos_token_id", Value::U32(1));
            let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
            let t = Tokenizer::from_gguf(&f).unwrap();
            let ids = t.encode("the cat", false, false);
            assert!(!ids.is_empty() && ids.iter().all(|&i| i < 1000), "{ids:?}");
            assert_eq!(t.decode(&ids, false).trim_start(), "the cat");
        }
        assert!(synthetic_vocab(true, &["a"], 100).is_err());
    }
}
