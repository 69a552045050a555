//! An encoder's weights from `model.safetensors` (memory-mapped), checked against the config:
//! every tensor present, of a float dtype, of the shape the config implies. Linear weights are
//! stored by PyTorch as `[out, in]`; they become the graph's `[in, out]` params (Q, K and V side
//! by side in one `[hidden, 3 * hidden]` param).

use super::config::EncoderConfig;
use crate::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// The graph's params: `(name, values)` in the order of [`super::graph::params`].
pub(crate) type Params = Vec<(String, Vec<f32>)>;

/// Read and check the weights of `path`.
pub(crate) fn load(path: &Path, cfg: &EncoderConfig) -> Result<Params> {
    let file = std::fs::File::open(path).map_err(|e| {
        Error::Invalid(format!(
            "cannot open {}: {e} (a model directory holds model.safetensors)",
            path.display()
        ))
    })?;
    // SAFETY: the map is read-only and lives only while the weights are copied out; a file
    // truncated meanwhile by another process is outside what RLX can guard against.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| Error::Invalid(format!("cannot map {}: {e}", path.display())))?;
    from_bytes(&path.display().to_string(), &map, cfg)
}

/// Read and check weights from the bytes of a safetensors file named `file` (in errors).
pub(crate) fn from_bytes(file: &str, bytes: &[u8], cfg: &EncoderConfig) -> Result<Params> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Invalid(format!("{file}: not a valid safetensors file: {e}")))?;
    // Checkpoints saved from BertModel have bare names; from BertFor* heads, a `bert.` prefix.
    let prefix = if st.tensor("embeddings.word_embeddings.weight").is_err()
        && st.tensor("bert.embeddings.word_embeddings.weight").is_ok()
    {
        "bert."
    } else {
        ""
    };
    let get = |name: &str, dims: &[usize]| -> Result<Vec<f32>> {
        let full = format!("{prefix}{name}");
        let t = st.tensor(&full).map_err(|_| {
            Error::Invalid(format!(
                "{file}: no tensor {full} (the config describes a {}-layer BERT encoder)",
                cfg.layers
            ))
        })?;
        if t.shape() != dims {
            return Err(Error::Invalid(format!(
                "{file}: tensor {full} has shape {:?}; config.json implies {dims:?}",
                t.shape()
            )));
        }
        let data = t.data();
        Ok(match t.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::Invalid(format!(
                    "{file}: tensor {full} has dtype {other:?}; expected F32, F16 or BF16"
                )))
            }
        })
    };
    // PyTorch's [out, in] linear weight as an [in, out] matrix.
    let linear = |name: &str, out: usize, inp: usize| -> Result<Vec<f32>> {
        let w = get(name, &[out, inp])?;
        let mut t = vec![0f32; w.len()];
        for o in 0..out {
            for i in 0..inp {
                t[i * out + o] = w[o * inp + i];
            }
        }
        Ok(t)
    };
    let (h, f) = (cfg.hidden, cfg.intermediate);
    let mut p: Params = vec![
        (
            "word_emb".into(),
            get("embeddings.word_embeddings.weight", &[cfg.vocab, h])?,
        ),
        (
            "pos_emb".into(),
            get(
                "embeddings.position_embeddings.weight",
                &[cfg.max_positions, h],
            )?,
        ),
        (
            "type_emb".into(),
            get(
                "embeddings.token_type_embeddings.weight",
                &[cfg.type_vocab, h],
            )?,
        ),
        ("emb_ln.g".into(), get("embeddings.LayerNorm.weight", &[h])?),
        ("emb_ln.b".into(), get("embeddings.LayerNorm.bias", &[h])?),
    ];
    for l in 0..cfg.layers {
        let n = |s: &str| format!("encoder.layer.{l}.{s}");
        let (wq, wk, wv) = (
            linear(&n("attention.self.query.weight"), h, h)?,
            linear(&n("attention.self.key.weight"), h, h)?,
            linear(&n("attention.self.value.weight"), h, h)?,
        );
        // [in, 3h]: row i is Q's row i, then K's, then V's.
        let mut wqkv = Vec::with_capacity(3 * h * h);
        for i in 0..h {
            for w in [&wq, &wk, &wv] {
                wqkv.extend_from_slice(&w[i * h..(i + 1) * h]);
            }
        }
        let mut bqkv = get(&n("attention.self.query.bias"), &[h])?;
        bqkv.extend(get(&n("attention.self.key.bias"), &[h])?);
        bqkv.extend(get(&n("attention.self.value.bias"), &[h])?);
        p.push((format!("l{l}.wqkv"), wqkv));
        p.push((format!("l{l}.bqkv"), bqkv));
        p.push((
            format!("l{l}.wo"),
            linear(&n("attention.output.dense.weight"), h, h)?,
        ));
        p.push((
            format!("l{l}.bo"),
            get(&n("attention.output.dense.bias"), &[h])?,
        ));
        p.push((
            format!("l{l}.ln1.g"),
            get(&n("attention.output.LayerNorm.weight"), &[h])?,
        ));
        p.push((
            format!("l{l}.ln1.b"),
            get(&n("attention.output.LayerNorm.bias"), &[h])?,
        ));
        p.push((
            format!("l{l}.w1"),
            linear(&n("intermediate.dense.weight"), f, h)?,
        ));
        p.push((
            format!("l{l}.b1"),
            get(&n("intermediate.dense.bias"), &[f])?,
        ));
        p.push((format!("l{l}.w2"), linear(&n("output.dense.weight"), h, f)?));
        p.push((format!("l{l}.b2"), get(&n("output.dense.bias"), &[h])?));
        p.push((
            format!("l{l}.ln2.g"),
            get(&n("output.LayerNorm.weight"), &[h])?,
        ));
        p.push((
            format!("l{l}.ln2.b"),
            get(&n("output.LayerNorm.bias"), &[h])?,
        ));
    }
    Ok(p)
}
