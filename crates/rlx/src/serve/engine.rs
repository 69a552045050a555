//! The serving engine: many sequences decoded together over one paged KV cache.
//!
//! One [`Engine`] owns the model. Each [`Engine::step`] runs **one** forward pass holding the
//! next token of every decoding sequence plus pieces of waiting prompts (up to a token budget,
//! several sequences' pieces in one pass), so sequences join and leave between steps
//! (continuous batching). Every row of that pass is computed with the kernels and float order
//! of the `rlx generate` step that would compute it (the prompt pieces' products as one matrix
//! product whose rows do not depend on each other, each decode row as a one-row product,
//! attention through the sequence's block table exactly as over a contiguous cache, each piece
//! as its own chunk), so a request's tokens do not depend on what runs beside it.
//!
//! Blocks of the cache come from a [`BlockPool`]: a prompt starting with blocks another request
//! already filled (a shared system prompt) maps them instead of computing them; when the pool
//! runs dry a running sequence is preempted (its blocks freed) and recomputed later (its prompt
//! in the same chunks, its generated tokens one per step, so it still computes what it computed
//! the first time), so no request is dropped or changed.

use super::blocks::{BlockPool, PoolStats, SeqBlocks};
use crate::llm::{build_batch, BatchSpec, LlmConfig, Sampler, SamplerConfig};
use crate::{CompiledGraph, Device, Session};
use rlx_gguf::{GgufFile, Tokenizer};
use rlx_ir::{DType, Error, Result};
use std::collections::VecDeque;
use std::path::Path;

/// How to load a model for serving.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Kernel threads (`None`: `RLX_NUM_THREADS`, else one per core).
    pub threads: Option<usize>,
    /// Cache rows of all sequences together (`None`: 8192, at most 64 × the trained context).
    pub ctx_size: Option<usize>,
    /// Longest sequence in tokens (`None`: the trained context, at most `ctx_size`).
    pub max_seq_len: Option<usize>,
    /// Sequences decoded together at most.
    pub parallel: usize,
    /// Rows per cache block.
    pub block: usize,
    /// Prompt tokens per chunk (as `rlx generate`'s `--batch`).
    pub batch: usize,
    /// Prompt tokens computed in one step at most, all sequences' pieces together (chunked
    /// prefill): a long prompt is spread over several steps, so the sequences decoding beside
    /// it keep getting a token per step instead of waiting for the whole prompt, and prompts
    /// arriving together are computed together. Pieces are cut so that each computes what
    /// `rlx generate`'s chunk computes (see [`prefill_piece`]); at least [`MIN_PIECE`].
    pub prefill_budget: usize,
    /// Cache element type.
    pub cache_dtype: DType,
    /// Requests waiting for a slot at most; more are refused ([`Engine::submit`] fails).
    pub max_waiting: usize,
    /// Where the model runs (default the CPU; `Device::Cuda`, `Device::Gpu` for wgpu).
    pub device: Device,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: None,
            ctx_size: None,
            max_seq_len: None,
            parallel: 8,
            block: 16,
            batch: 512,
            prefill_budget: 2048,
            cache_dtype: DType::F16,
            max_waiting: 256,
            device: Device::Cpu,
        }
    }
}

/// What a request asks for besides its prompt.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stop at the model's end-of-generation tokens.
    pub stop_at_eog: bool,
    /// Report each generated token's log-probability and this many most likely alternatives
    /// (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            max_tokens: 128,
            sampler: SamplerConfig::greedy(),
            stop_at_eog: true,
            logprobs: None,
        }
    }
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token (not emitted).
    Stop,
    /// `max_tokens` reached, or the sequence filled its context.
    Length,
    /// Cancelled by the caller.
    Cancelled,
}

/// A step's news for one request: a new token and/or its end.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The request.
    pub id: u64,
    /// The generated token (`None` when the request ended without one).
    pub token: Option<u32>,
    /// Its log-probability under the model (before penalties and temperature) and the most
    /// likely tokens', when the request asked for them.
    pub logprobs: Option<TokenLogprobs>,
    /// Set on the request's last event.
    pub finish: Option<Finish>,
}

/// Log-probabilities of one position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// The log-softmax of `logits` at `token`, and the `n` largest.
    pub fn of(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + logits
            .iter()
            .map(|&l| ((l - m) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let n = n.min(idx.len());
        if n > 0 && n < idx.len() {
            idx.select_nth_unstable_by(n - 1, by);
        }
        idx.truncate(n);
        idx.sort_unstable_by(by);
        TokenLogprobs {
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |l| l - lse),
            top: idx
                .into_iter()
                .map(|t| (t, logits[t as usize] - lse))
                .collect(),
        }
    }
}

/// Counters and gauges of the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences being computed.
    pub running: usize,
    /// Requests waiting for a slot or for blocks.
    pub waiting: usize,
    /// Cache blocks held by sequences.
    pub blocks_in_use: usize,
    /// Cache blocks in the pool.
    pub blocks: usize,
    /// Forward passes run.
    pub steps: u64,
    /// Forward passes that computed prompt rows.
    pub prefill_steps: u64,
    /// Prompt pieces computed (a step may hold several sequences' pieces).
    pub prompt_pieces: u64,
    /// Prompt tokens computed (prefix-cache hits excluded).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Sequences preempted for lack of blocks (and recomputed later).
    pub preemptions: u64,
    /// Graphs compiled for step shapes.
    pub compiles: u64,
    /// Microseconds spent compiling step graphs while serving (the load's excluded).
    pub compile_us: u64,
    /// The block pool's counters (prefix-cache hits).
    pub pool: PoolStats,
}

struct Seq {
    id: u64,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose rows are in the cache.
    computed: usize,
    blocks: SeqBlocks,
    sampler: Sampler,
    params: GenParams,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Past its prompt: one row per step (the last token, or a generated token being replayed
    /// after preemption).
    fn decoding(&self) -> bool {
        self.computed >= self.prompt_len && self.computed < self.tokens.len()
    }
}

/// The fewest prompt rows a piece of a chunk may have. From this many rows on, a chunk's
/// attention and products run as matrix products whose rows do not depend on the other rows
/// (`rlx_cpu`'s prompt attention from 16 queries, the f32 GEMM path of quantized products from
/// `QuantScheme::ROUNDED_ACTS_BELOW` rows), so pieces of at least this size compute exactly
/// the rows the whole chunk computes.
pub const MIN_PIECE: usize = rlx_ir::QuantScheme::MATRIX_ATTENTION_ROWS;

/// Prompt rows to compute this step out of the `rest` rows left in `rlx generate`'s current
/// chunk, under a `budget`: all of them when they fit, else `budget`, shortened when needed so
/// the rows left after it are not fewer than [`MIN_PIECE`]. Every piece but a whole chunk then
/// has at least [`MIN_PIECE`] rows.
pub fn prefill_piece(rest: usize, budget: usize) -> usize {
    if rest <= budget {
        rest
    } else if rest - budget >= MIN_PIECE {
        budget
    } else if rest - MIN_PIECE >= MIN_PIECE {
        rest - MIN_PIECE
    } else {
        rest
    }
}

/// The most prompt tokens (a multiple of `block`, below `len`) a prompt of `len` tokens may take
/// from the prefix cache so that what is left computes what `rlx generate` computes: the mapped
/// prefix ends at a boundary of its chunks of `batch`, or leaves at least [`MIN_PIECE`] rows of
/// its chunk (a shorter rest would take the few-row kernels where the whole chunk took the
/// matrix ones).
pub fn prefix_limit(len: usize, batch: usize, block: usize) -> usize {
    let mut c = len.saturating_sub(1) / block * block;
    while c > 0 {
        let chunk_end = len.min((c / batch + 1) * batch);
        if c.is_multiple_of(batch) || chunk_end - c >= MIN_PIECE {
            return c;
        }
        c -= block;
    }
    0
}

/// Graphs kept for step shapes besides the one holding the weights (least recently used
/// dropped first).
const KEEP_GRAPHS: usize = 48;

/// A model serving many sequences; see the module documentation.
pub struct Engine {
    /// Hyper-parameters.
    pub config: LlmConfig,
    /// The tokenizer from the file's metadata.
    pub tokenizer: Tokenizer,
    /// The chat template from the metadata, if any.
    pub chat_template: Option<String>,
    file: GgufFile,
    session: Session,
    opts: EngineOptions,
    max_seq: usize,
    /// Step graphs by shape; the first holds the weights and the cache.
    graphs: Vec<(BatchSpec, CompiledGraph)>,
    /// The last step's logits, their memory reused from step to step.
    logits: Vec<f32>,
    /// A sampled row's logits copied for a sampler that penalizes (modifies them).
    penalized: Vec<f32>,
    pool: BlockPool,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    next_id: u64,
    stats: EngineStats,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Load a GGUF model for serving (on `opts.device`).
    pub fn load(path: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine> {
        let (file, config, tokenizer, chat_template) = crate::llm::open_model(path.as_ref())?;
        if opts.parallel == 0 || opts.block == 0 || opts.batch == 0 {
            return Err(Error::Invalid(format!(
                "parallel, block and batch must be positive: {opts:?}"
            )));
        }
        if opts.prefill_budget < MIN_PIECE {
            return Err(Error::Invalid(format!(
                "the prefill budget must be at least {MIN_PIECE} tokens, got {}",
                opts.prefill_budget
            )));
        }
        let ctx_size = opts
            .ctx_size
            .unwrap_or(8192.min(64 * config.ctx_train.max(1)));
        let max_seq = opts
            .max_seq_len
            .unwrap_or(config.ctx_train)
            .min(ctx_size)
            .max(1);
        let blocks = ctx_size.div_ceil(opts.block);
        let mut session = Session::new(opts.device);
        if let Some(t) = opts.threads {
            session = session.with_threads(t);
        }
        let mut engine = Engine {
            config,
            tokenizer,
            chat_template,
            file,
            session,
            max_seq,
            pool: BlockPool::new(blocks, opts.block),
            opts,
            graphs: Vec::new(),
            logits: Vec::new(),
            penalized: Vec::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            stats: EngineStats::default(),
        };
        let owner = engine.spec(0, 0, 1);
        let g = build_batch(&engine.config, &engine.file, owner)?;
        let mut compiled = engine.session.try_compile(g)?;
        crate::llm::load_weights(&mut compiled, &engine.file)?;
        engine.touch_cache(&mut compiled)?;
        engine.graphs.push((owner, compiled));
        engine.stats.compiles = 1;
        Ok(engine)
    }

    /// Write the whole KV cache once (zeros) at load, as llama-server clears its cache at
    /// startup: the cache's pages are mapped lazily, and otherwise the first steps to write
    /// each part of it pay for bringing the pages in (~0.4 s over SmolLM2's first requests
    /// with a 16 × 512-row cache).
    fn touch_cache(&self, compiled: &mut CompiledGraph) -> Result<()> {
        let c = &self.config;
        let rows = self.pool.len() * self.opts.block;
        let el = self.opts.cache_dtype.size_bytes();
        let zeros = vec![0u8; 1 << 20];
        for l in 0..c.n_layer {
            let (kn, vn) = crate::llm::cache_names(l);
            for (name, width) in [
                (kn, c.n_head_kv * c.head_dim),
                (vn, c.n_head_kv * c.v_head_dim),
            ] {
                let size = rows * width * el;
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(zeros.len());
                    compiled.try_set_param_bytes_at(&name, at, &zeros[..n])?;
                    at += n;
                }
            }
        }
        Ok(())
    }

    fn spec(&self, prefill: usize, pieces: usize, decode: usize) -> BatchSpec {
        BatchSpec {
            prefill,
            pieces,
            decode,
            blocks: self.pool.len(),
            block: self.opts.block,
            max_blocks: self.max_seq.div_ceil(self.opts.block),
            cache_dtype: self.opts.cache_dtype,
        }
    }

    /// The longest sequence (prompt and generated tokens) a request may reach.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq
    }

    /// Counters and gauges.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            blocks_in_use: self.pool.in_use(),
            blocks: self.pool.len(),
            pool: self.pool.stats(),
            ..self.stats
        }
    }

    /// Requests that may wait at most (more are refused).
    pub fn max_waiting(&self) -> usize {
        self.opts.max_waiting
    }

    /// Whether any request is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Queue a request; returns its id. Fails when the prompt is empty, has an unknown token,
    /// cannot fit the longest sequence, or the queue is full.
    pub fn submit(&mut self, prompt: Vec<u32>, params: GenParams) -> Result<u64> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt has no tokens".into()));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= self.config.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is out of range for the {}-token vocabulary",
                self.config.vocab
            )));
        }
        if prompt.len() >= self.max_seq {
            return Err(Error::Invalid(format!(
                "the prompt has {} tokens; sequences hold at most {} (prompt and generated tokens)",
                prompt.len(),
                self.max_seq
            )));
        }
        if self.waiting.len() >= self.opts.max_waiting {
            return Err(Error::Invalid(format!(
                "{} requests are already waiting; try again later",
                self.waiting.len()
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut sampler = Sampler::new(params.sampler.clone());
        for &t in &prompt {
            sampler.accept(t);
        }
        self.waiting.push_back(Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            blocks: SeqBlocks::default(),
            sampler,
            params,
        });
        Ok(id)
    }

    /// Stop a request; its blocks go back to the pool. Returns whether it was known.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
            s.blocks.free(&mut self.pool);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            if let Some(mut s) = self.waiting.remove(i) {
                s.blocks.free(&mut self.pool);
            }
            return true;
        }
        false
    }

    /// Move waiting requests into the running set while there are slots and blocks for their
    /// prompts (mapping cached prefix blocks first).
    fn admit(&mut self) {
        while self.running.len() < self.opts.parallel {
            let Some(mut s) = self.waiting.pop_front() else {
                return;
            };
            let mappable = prefix_limit(s.tokens.len(), self.opts.batch, self.pool.block_size());
            s.blocks = SeqBlocks::with_prefix(&mut self.pool, &s.tokens[..mappable + 1]);
            if !s.blocks.reserve(&mut self.pool, s.tokens.len()) {
                s.blocks.free(&mut self.pool);
                self.waiting.push_front(s);
                return;
            }
            s.computed = s.blocks.cached_tokens;
            self.running.push(s);
        }
    }

    /// Before running sequence `c` computes its first prompt chunk, map the cached prefix blocks
    /// that appeared since it was admitted: requests admitted together (a burst sharing a system
    /// prompt) then compute the shared blocks once, the first of them, instead of each its own.
    fn remap_prefix(&mut self, c: usize) {
        let s = &mut self.running[c];
        if s.computed != s.blocks.cached_tokens {
            return;
        }
        let mappable = prefix_limit(s.tokens.len(), self.opts.batch, self.pool.block_size()) + 1;
        if self.pool.cached_prefix(&s.tokens[..mappable]) <= s.blocks.cached_tokens {
            return;
        }
        s.blocks.free(&mut self.pool);
        let mut fresh = SeqBlocks::with_prefix(&mut self.pool, &s.tokens[..mappable]);
        // The blocks just freed cover the whole prompt, so this cannot run short; if it did,
        // the sequence would wait again rather than run without its rows.
        if !fresh.reserve(&mut self.pool, s.tokens.len()) {
            fresh.free(&mut self.pool);
            let mut s = self.running.remove(c);
            s.computed = 0;
            self.waiting.push_front(s);
            return;
        }
        s.computed = fresh.cached_tokens;
        s.blocks = fresh;
    }

    /// The prompt pieces of this step, as (running index, rows): sequences still in their
    /// prompt, oldest first, each its next piece (cut where `rlx generate`'s chunk is cut and
    /// by [`prefill_piece`]) while the prefill budget lasts. A sequence maps the blocks that the
    /// pieces before it in this step fill (a burst sharing a system prompt computes it once, in
    /// one step); one whose next block another piece computes later waits and maps it then.
    /// A piece shorter than `QuantScheme::ROUNDED_ACTS_BELOW` rows (a whole short prompt, whose
    /// products take the few-row kernels) is the step's only piece.
    fn plan_pieces(&mut self) -> Vec<(usize, usize)> {
        let (budget, batch, block) = (
            self.opts.prefill_budget,
            self.opts.batch,
            self.pool.block_size(),
        );
        let short = rlx_ir::QuantScheme::ROUNDED_ACTS_BELOW;
        let mut pieces: Vec<(usize, usize)> = Vec::new();
        let mut used = 0;
        let mut c = 0;
        while c < self.running.len() && used < budget {
            if self.running[c].computed >= self.running[c].prompt_len {
                c += 1;
                continue;
            }
            let before = self.running.len();
            self.remap_prefix(c);
            if self.running.len() < before {
                // It went back to the queue (see `remap_prefix`).
                continue;
            }
            let s = &self.running[c];
            let end = s.computed + block;
            let computed_beside = end <= prefix_limit(s.tokens.len(), batch, block)
                && pieces.iter().any(|&(o, _)| {
                    let o = &self.running[o];
                    o.computed <= s.computed
                        && o.tokens.len() >= end
                        && o.tokens[..end] == s.tokens[..end]
                });
            if computed_beside {
                c += 1;
                continue;
            }
            // Chunks end where `rlx generate`'s would: at multiples of `batch`, and at the end
            // of the prompt (a preempted sequence replays its generated tokens one per step, as
            // they were computed).
            let rest = (s.prompt_len - s.computed).min(batch - s.computed % batch);
            let left = budget - used;
            let n = if rest <= left {
                rest
            } else if left >= MIN_PIECE {
                prefill_piece(rest, left)
            } else {
                break;
            };
            if n < short && !pieces.is_empty() {
                c += 1;
                continue;
            }
            pieces.push((c, n));
            used += n;
            // The blocks this piece fills are keyed now, so the sequences after it in this
            // step can map them: within a layer the step writes every row's keys and values
            // before any row attends, so they read what this piece writes.
            let s = &mut self.running[c];
            s.blocks
                .register_full(&mut self.pool, &s.tokens[..s.computed + n]);
            if n < short {
                break;
            }
            c += 1;
        }
        pieces
    }

    /// Free the blocks of the most recently admitted running sequence other than `keep` and
    /// queue it to be recomputed first; its index among the running ones (`None` when there is
    /// none).
    fn preempt(&mut self, keep: u64) -> Option<usize> {
        let i = self.running.iter().rposition(|s| s.id != keep)?;
        let mut s = self.running.remove(i);
        s.blocks.free(&mut self.pool);
        s.computed = 0;
        self.waiting.push_front(s);
        self.stats.preemptions += 1;
        Some(i)
    }

    /// Run one forward pass (if there is work) and return what it produced.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        self.admit();
        let mut events = Vec::new();
        // Each decoding sequence needs a cache row for its next token.
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            let (id, need) = (s.id, s.computed + 1);
            if s.decoding() {
                let s = &mut self.running[i];
                if !s.blocks.reserve(&mut self.pool, need) {
                    // Try this sequence again with the freed blocks: it moved down one place
                    // when the preempted sequence was before it.
                    if let Some(gone) = self.preempt(id) {
                        if gone < i {
                            i -= 1;
                        }
                        continue;
                    }
                    return Err(Error::Invalid(
                        "the KV cache cannot hold one sequence; raise --ctx-size".into(),
                    ));
                }
            }
            i += 1;
        }
        // Prompt pieces (oldest sequence first) within the budget, then every decode row.
        let pieces = self.plan_pieces();
        let decode: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].decoding())
            .collect();
        if pieces.is_empty() && decode.is_empty() {
            return Ok(events);
        }
        let bs = self.opts.block;
        let np: usize = pieces.iter().map(|p| p.1).sum();
        let nd = decode
            .len()
            .next_power_of_two()
            .min(self.opts.parallel.max(decode.len()));
        let nd = if decode.is_empty() { 0 } else { nd };
        let spec = self.spec(np, pieces.len(), nd);
        let m = spec.max_blocks;
        let rows = np + nd;
        let (mut tokens, mut positions, mut slots) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
        );
        let mut table: Vec<i32> = Vec::with_capacity(rows * m);
        let mut push = |s: &Seq, pos: usize| {
            tokens.push(s.tokens[pos] as i32);
            positions.push(pos as i32);
            slots.push(s.blocks.slot(pos, bs));
            table.extend((0..m).map(|b| s.blocks.table.get(b).map_or(-1, |&x| x as i32)));
        };
        let mut last_rows = Vec::with_capacity(pieces.len());
        let mut row = 0;
        for &(c, n) in &pieces {
            let s = &self.running[c];
            for pos in s.computed..s.computed + n {
                push(s, pos);
            }
            row += n;
            last_rows.push(row as i32 - 1);
        }
        for &i in &decode {
            let s = &self.running[i];
            push(s, s.computed);
        }
        // Padding rows: write nowhere, attend to nothing.
        for _ in decode.len()..nd {
            tokens.push(0);
            positions.push(0);
            slots.push(-1);
            table.extend(std::iter::repeat_n(-1, m));
        }
        let logits = match self.run(spec, &tokens, &positions, &slots, &table, &last_rows) {
            Ok(()) => std::mem::take(&mut self.logits),
            Err(e) => {
                // Blocks were keyed before the step filled them (see `plan_pieces`).
                self.pool.forget();
                return Err(e);
            }
        };
        self.stats.steps += 1;
        self.stats.prompt_tokens += np as u64;
        if np > 0 {
            self.stats.prefill_steps += 1;
            self.stats.prompt_pieces += pieces.len() as u64;
        }
        let vocab = self.config.vocab;
        // Logit rows: each piece's last token (used when it ends the prompt), then decode rows.
        let mut row = 0;
        let mut sampled: Vec<(usize, usize)> = Vec::new();
        for &(c, n) in &pieces {
            let s = &mut self.running[c];
            s.computed += n;
            if s.computed == s.tokens.len() {
                sampled.push((c, row));
            }
            row += 1;
        }
        for &i in &decode {
            let s = &mut self.running[i];
            s.computed += 1;
            // A replayed token's successor is already known.
            if s.computed == s.tokens.len() {
                sampled.push((i, row));
            }
            row += 1;
        }
        let mut done = Vec::new();
        for (i, r) in sampled {
            let raw = &logits[r * vocab..(r + 1) * vocab];
            let s = &mut self.running[i];
            // The logits as they are, unless a penalty is to modify them (then a copy).
            let tok = match s.sampler.sample_unchanged(raw) {
                Some(t) => t,
                None => {
                    self.penalized.clear();
                    self.penalized.extend_from_slice(raw);
                    s.sampler.sample(&mut self.penalized)
                }
            };
            if s.params.stop_at_eog && self.tokenizer.is_eog(tok) {
                events.push(Event {
                    id: s.id,
                    token: None,
                    logprobs: None,
                    finish: Some(Finish::Stop),
                });
                done.push(i);
                continue;
            }
            // (`sample` has recorded the token for the penalties, as `rlx generate`'s does.)
            s.tokens.push(tok);
            self.stats.generated_tokens += 1;
            let full = s.generated() >= s.params.max_tokens || s.tokens.len() >= self.max_seq;
            events.push(Event {
                id: s.id,
                token: Some(tok),
                logprobs: s.params.logprobs.map(|n| TokenLogprobs::of(raw, tok, n)),
                finish: full.then_some(Finish::Length),
            });
            if full {
                done.push(i);
            }
        }
        for s in &mut self.running {
            let upto = s.computed.min(s.tokens.len());
            s.blocks.register_full(&mut self.pool, &s.tokens[..upto]);
        }
        done.sort_unstable();
        for i in done.into_iter().rev() {
            let mut s = self.running.remove(i);
            s.blocks.free(&mut self.pool);
        }
        Ok(events)
    }

    /// Compile the step graph of `spec` (sharing the owner's weights and caches) and keep it
    /// last, dropping the least recently used beyond [`KEEP_GRAPHS`].
    fn compile(&mut self, spec: BatchSpec) -> Result<()> {
        let g = build_batch(&self.config, &self.file, spec)?;
        let compiled = self.session.try_compile_sharing(g, &self.graphs[0].1)?;
        if self.graphs.len() > KEEP_GRAPHS {
            self.graphs.remove(1);
        }
        self.graphs.push((spec, compiled));
        self.stats.compiles += 1;
        Ok(())
    }

    /// Run the step graph of `spec` (compiling it the first time it is seen), its logits into
    /// `self.logits`.
    fn run(
        &mut self,
        spec: BatchSpec,
        tokens: &[i32],
        positions: &[i32],
        slots: &[i32],
        table: &[i32],
        last_rows: &[i32],
    ) -> Result<()> {
        let i = match self.graphs.iter().position(|(s, _)| *s == spec) {
            // Most recently used last (the weights' owner stays first).
            Some(i) if i > 0 => {
                let g = self.graphs.remove(i);
                self.graphs.push(g);
                self.graphs.len() - 1
            }
            Some(i) => i,
            None => {
                let t0 = std::time::Instant::now();
                self.compile(spec)?;
                self.stats.compile_us += t0.elapsed().as_micros() as u64;
                self.graphs.len() - 1
            }
        };
        let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (tokens, positions, slots, table, last_rows) = (
            bytes(tokens),
            bytes(positions),
            bytes(slots),
            bytes(table),
            bytes(last_rows),
        );
        let mut inputs = vec![
            ("tokens", &tokens[..], DType::I32),
            ("positions", &positions[..], DType::I32),
            ("slots", &slots[..], DType::I32),
            ("table", &table[..], DType::I32),
        ];
        if spec.prefill > 0 {
            inputs.push(("last_rows", &last_rows[..], DType::I32));
        }
        self.graphs[i]
            .1
            .try_run_typed_f32_into(&inputs, &mut self.logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pieces cover the chunk's rest exactly; each is within the budget or the whole rest,
        /// and none but a whole rest is shorter than `MIN_PIECE`.
        #[test]
        fn pieces_cover_the_rest(rest in 1usize..2000, budget in MIN_PIECE..300) {
            let mut left = rest;
            while left > 0 {
                let p = prefill_piece(left, budget);
                prop_assert!(p >= 1 && p <= left);
                prop_assert!(p == left || (p >= MIN_PIECE && p <= budget));
                prop_assert!(p == left || left - p >= MIN_PIECE);
                left -= p;
            }
        }

        /// A mapped prefix ends on a chunk boundary or leaves `MIN_PIECE` rows of its chunk,
        /// and is the longest such run of whole blocks.
        #[test]
        fn prefix_limits_leave_whole_pieces(len in 1usize..3000, batch_blocks in 1usize..40) {
            let (block, batch) = (16, 16 * batch_blocks);
            let ok = |c: usize| c < len && c.is_multiple_of(block)
                && (c.is_multiple_of(batch) || len.min((c / batch + 1) * batch) - c >= MIN_PIECE);
            let c = prefix_limit(len, batch, block);
            prop_assert!(ok(c));
            let mut d = c + block;
            while d < len {
                prop_assert!(!ok(d), "{d} would do for len {len}, batch {batch}");
                d += block;
            }
        }
    }
}
