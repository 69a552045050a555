//! GGUF for RLX: a memory-mapped reader for GGUF v1–v3 ([`GgufFile`]), bit-exact dequantization
//! of the ggml block types ([`dequantize`]) and the tokenizer stored in GGUF metadata.
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

pub use dequant::{
    dequantize, dequantize_block, dequantize_portable, dequantize_with, k4_scale_min, q3k_scales,
};
pub use error::{GgufError, Result};
pub use reader::{
    parse_header, GgufFile, Header, MetadataEntry, TensorInfo, Value, DEFAULT_ALIGNMENT,
};
pub use tokenizer::{Tokenizer, TokenizerKind};
pub use types::GgmlType;
