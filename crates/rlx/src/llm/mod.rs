//! LLM inference from GGUF files: decoder graphs for the llama family and Gemma 3, a KV cache
//! updated in place, chunked prompt processing, sampling and chat templates.
//!
//! ```no_run
//! use rlx::llm::{Llm, LoadOptions, Sampler, SamplerConfig};
//! let mut llm = Llm::load("SmolLM2-135M-Instruct.Q4_1.gguf", LoadOptions::default())?;
//! let ids = llm.tokenizer.encode("The capital of France is", llm.tokenizer.add_bos(), true);
//! let mut logits = llm.forward(&ids)?;
//! let mut sampler = Sampler::new(SamplerConfig::greedy());
//! for _ in 0..8 {
//!     let next = sampler.sample(&mut logits);
//!     print!("{}", llm.tokenizer.decode(&[next], false));
//!     logits = llm.forward(&[next])?;
//! }
//! # Ok::<(), rlx::Error>(())
//! ```

mod chat;
mod config;
mod graph;
mod model;
mod random;
mod sample;

pub use chat::{ChatMessage, ChatTemplate, JinjaTemplate};
pub use config::{Arch, LlmConfig};
pub use graph::{
    build_batch, build_step, cache_names, param_shape, scheme_of, BatchSpec, StepSpec,
};
pub(crate) use model::{load_weights, open_model};
pub use model::{Llm, LoadOptions, LoadStats};
pub use random::{ensure_random, random_gguf};
pub use sample::{Sampler, SamplerConfig};
