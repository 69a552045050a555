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
//!
//! # Parity with llama.cpp
//!
//! On the CPU, a decode step follows llama.cpp's x86 build operation for operation, so the
//! logits are bit-identical, not merely close (int8 activation quantization would otherwise turn
//! last-bit differences into whole quantization steps):
//!
//! - activations quantized to int8 as llama.cpp does for each weight format, and the int8 dot
//!   products accumulated per block in its order (`rlx_cpu::kernels::quant`);
//! - attention over an f16 cache as its non-flash path: queries and weights rounded to f16, its
//!   lane order for the sums, its vectorized `expf` (RLX's `exp_f32` is that algorithm);
//! - RMSNorm's squares summed in f64; RoPE's products fused into multiply-adds as GCC fuses
//!   them; Gemma's queries scaled before the f16 rounding and its GELU looked up in llama.cpp's
//!   f16 table.
//!
//! `tests/llm_parity.rs` holds both models to llama.cpp's top-5 logits at every position, with
//! the best kernels the CPU has and, for SmolLM2, at the AVX2 level too. The portable kernels
//! sum in another order and are not bit-identical.

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
