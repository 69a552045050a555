//! GGUF for RLX: a memory-mapped reader for GGUF v1–v3 ([`GgufFile`]), bit-exact dequantization
//! of the ggml block types ([`dequantize`]), the tokenizer stored in GGUF metadata, and a
//! writer ([`GgufWriter`], with [`random_tensor`] and [`synthetic_vocab`] for random-weight
//! models of a real model's shapes).
//!
//! ```no_run
//! let f = rlx_gguf::GgufFile::open("model.gguf")?;
//! println!("{}", f.get_str("general.architecture")?);
//! for t in f.tensors() {
//!     println!("{} {:?} {}", t.name, t.shape(), t.ty);
//! }
//! # Ok::<(), rlx_gguf::GgufError>(())
//! ```

#![deny(missing_docs)]

mod dequant;
mod error;
mod reader;
#[cfg(target_arch = "x86_64")]
pub mod simd;
pub mod tokenizer;
mod types;
mod writer;

pub use dequant::{
    dequantize, dequantize_block, dequantize_portable, dequantize_with, k4_scale_min, q3k_scales,
};
pub use error::{GgufError, Result};
pub use reader::{
    parse_header, GgufFile, Header, MetadataEntry, TensorInfo, Value, DEFAULT_ALIGNMENT,
};
pub use tokenizer::{Tokenizer, TokenizerKind};
pub use types::GgmlType;
pub use writer::{random_tensor, synthetic_vocab, GgufWriter, SplitMix64};
