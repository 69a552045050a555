//! A loaded decoder: weights read once from the GGUF file into params shared by every step
//! graph, a KV cache that persists between runs, prefill in chunks and single-token decoding.

use super::config::LlmConfig;
use super::graph::{build_step, param_shape, StepSpec};
use crate::{CompiledGraph, Device, Session};
use rlx_gguf::{GgufFile, Tokenizer};
use rlx_ir::{DType, Error, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Kernel threads (`None`: `RLX_NUM_THREADS`, else one per core).
    pub threads: Option<usize>,
    /// KV-cache length in tokens (`None`: the trained context, at most 4096).
    pub ctx: Option<usize>,
    /// Most tokens fed through one prompt-processing step (longer prompts go in chunks).
    pub batch: usize,
    /// KV-cache element type: F16 (llama.cpp's default) or F32.
    pub cache_dtype: DType,
    /// Where the model runs (default: the CPU; `Device::Gpu` for the wgpu backend).
    pub device: Device,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: None,
            ctx: None,
            batch: 512,
            cache_dtype: DType::F16,
            device: Device::Cpu,
        }
    }
}

/// Where the time of loading went.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadStats {
    /// Opening and parsing the file (memory-mapped).
    pub open: Duration,
    /// Building and compiling the decode graph.
    pub compile: Duration,
    /// Copying the weights into the runtime.
    pub weights: Duration,
}

/// A decoder LLM ready to run.
pub struct Llm {
    /// Hyper-parameters.
    pub config: LlmConfig,
    /// The tokenizer from the file's metadata.
    pub tokenizer: Tokenizer,
    /// The chat template from the metadata, if any.
    pub chat_template: Option<String>,
    /// Load timings.
    pub load_stats: LoadStats,
    file: GgufFile,
    session: Session,
    opts: LoadOptions,
    ctx: usize,
    /// Step graphs by spec; the first (single-token decode) owns the weights.
    steps: Vec<(StepSpec, CompiledGraph)>,
    pos: usize,
}

impl std::fmt::Debug for Llm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llm")
            .field("config", &self.config)
            .field("ctx", &self.ctx)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

pub(crate) fn gguf_err(e: rlx_gguf::GgufError) -> Error {
    Error::Invalid(e.to_string())
}

/// Bytes of weights copied (and their file pages released) at a time while loading.
const PIECE: usize = 8 << 20;

/// Step graphs kept besides the decode graph (prompt lengths seen recently).
const KEEP: usize = 3;

impl Llm {
    /// Load a GGUF model.
    pub fn load(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Llm> {
        let t0 = Instant::now();
        let (file, config, tokenizer, chat_template) = open_model(path.as_ref())?;
        let ctx = opts.ctx.unwrap_or(config.ctx_train.min(4096)).max(1);
        if !matches!(opts.cache_dtype, DType::F16 | DType::F32 | DType::BF16) {
            return Err(Error::Invalid(format!(
                "the KV cache holds f16, bf16 or f32, not {}",
                opts.cache_dtype
            )));
        }
        let mut session = Session::new(opts.device);
        if let Some(t) = opts.threads {
            session = session.with_threads(t);
        }
        let open = t0.elapsed();
        let t1 = Instant::now();
        let spec = StepSpec {
            tokens: 1,
            all_logits: false,
            ctx,
            cache_dtype: opts.cache_dtype,
        };
        let decode = session.try_compile(build_step(&config, &file, spec)?)?;
        let compile = t1.elapsed();
        let mut llm = Llm {
            config,
            tokenizer,
            chat_template,
            load_stats: LoadStats {
                open,
                compile,
                weights: Duration::ZERO,
            },
            file,
            session,
            opts,
            ctx,
            steps: vec![(spec, decode)],
            pos: 0,
        };
        let t2 = Instant::now();
        llm.load_weights()?;
        llm.load_stats.weights = t2.elapsed();
        Ok(llm)
    }

    /// Copy every weight from the file into the decode graph's params (shared by all steps).
    fn load_weights(&mut self) -> Result<()> {
        load_weights(&mut self.steps[0].1, &self.file)
    }

    /// The compiled one-token decode graph: its optimized graph, fusion and dispatch reports.
    pub fn decode_graph(&self) -> &CompiledGraph {
        &self.steps[0].1
    }

    /// The KV-cache length.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Tokens in the cache (the position of the next token).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forget the cached tokens.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Drop cached tokens after the first `pos` (e.g. to reuse a shared prompt prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    /// The open GGUF file (metadata, tensor table).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    fn step(&mut self, tokens: usize, all_logits: bool) -> Result<usize> {
        let spec = StepSpec {
            tokens,
            all_logits: all_logits && tokens > 1,
            ctx: self.ctx,
            cache_dtype: self.opts.cache_dtype,
        };
        if let Some(i) = self.steps.iter().position(|(s, _)| *s == spec) {
            return Ok(i);
        }
        let g = build_step(&self.config, &self.file, spec)?;
        let compiled = self.session.try_compile_sharing(g, &self.steps[0].1)?;
        if self.steps.len() > KEEP {
            self.steps.remove(1);
        }
        self.steps.push((spec, compiled));
        Ok(self.steps.len() - 1)
    }

    fn run_chunk(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        let i = self.step(tokens.len(), all_logits)?;
        let ids: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let positions: Vec<u8> = (0..tokens.len())
            .flat_map(|j| ((self.pos + j) as i32).to_le_bytes())
            .collect();
        let pos = (self.pos as i32).to_le_bytes();
        let out = self.steps[i].1.try_run_typed_f32(&[
            ("tokens", &ids, DType::I32),
            ("positions", &positions, DType::I32),
            ("pos", &pos, DType::I32),
        ])?;
        self.pos += tokens.len();
        Ok(out.into_iter().next().expect("one output"))
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Invalid("no tokens to evaluate".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is out of range for the {}-token vocabulary",
                self.config.vocab
            )));
        }
        if self.pos + tokens.len() > self.ctx {
            return Err(Error::Invalid(format!(
                "context full: {} cached + {} new tokens exceed the {}-token KV cache; reset, or load with a larger context (--ctx)",
                self.pos,
                tokens.len(),
                self.ctx
            )));
        }
        Ok(())
    }

    /// Append `tokens` to the sequence and return the logits that predict the token after the
    /// last one (`vocab` values). Long inputs run in chunks of `LoadOptions::batch`.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let batch = self.opts.batch.max(1);
        let mut last = Vec::new();
        for chunk in tokens.chunks(batch) {
            last = self.run_chunk(chunk, false)?;
        }
        Ok(last)
    }

    /// Append `tokens` and return the logits after every one of them (`tokens.len() * vocab`
    /// values, row-major), as teacher-forced evaluation needs.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(tokens)?;
        let batch = self.opts.batch.clamp(1, 64);
        let mut all = Vec::with_capacity(tokens.len() * self.config.vocab);
        for chunk in tokens.chunks(batch) {
            all.extend(self.run_chunk(chunk, true)?);
        }
        Ok(all)
    }
}

/// A GGUF model's file, hyper-parameters, tokenizer and chat template.
pub(crate) fn open_model(path: &Path) -> Result<(GgufFile, LlmConfig, Tokenizer, Option<String>)> {
    let file = GgufFile::open(path).map_err(gguf_err)?;
    let config = LlmConfig::from_gguf(&file).map_err(gguf_err)?;
    let tokenizer = Tokenizer::from_gguf(&file).map_err(gguf_err)?;
    let chat_template = file
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    Ok((file, config, tokenizer, chat_template))
}

/// Copy every weight of `file` into `graph`'s params (the KV caches excepted), releasing the
/// file pages as it goes so the weights are resident once. A param named `a+b` (stacked
/// weights, see `graph::stacked_shape`) gets tensor `a`'s bytes, then `b`'s.
pub(crate) fn load_weights(graph: &mut CompiledGraph, file: &GgufFile) -> Result<()> {
    let names: Vec<String> = graph.params().iter().map(|p| p.name.clone()).collect();
    for name in names {
        if name.starts_with("cache.") {
            continue;
        }
        let mut at = 0;
        for part in name.split('+') {
            let t = file.require_tensor(part).map_err(gguf_err)?;
            param_shape(t)?;
            // Copy in pieces, dropping each piece's file pages once copied, so the weights are
            // resident once rather than twice at the peak.
            let data = file.tensor_data(t);
            for (i, piece) in data.chunks(PIECE).enumerate() {
                graph.try_set_param_bytes_at(&name, at + i * PIECE, piece)?;
                file.release_range(t, (i * PIECE) as u64, piece.len() as u64);
            }
            at += data.len();
        }
    }
    Ok(())
}
