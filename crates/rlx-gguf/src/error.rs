//! Errors of the GGUF reader: every one names the byte offset and the field being read.

use std::fmt;

/// A GGUF file that cannot be read, with where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufError {
    /// Byte offset in the file where the problem was found.
    pub offset: u64,
    /// The field being read, e.g. `tensor_info[3].dims` or `metadata["general.name"]`.
    pub field: String,
    /// What is wrong.
    pub msg: String,
}

impl GgufError {
    /// An error at `offset` while reading `field`.
    pub fn new(offset: u64, field: impl Into<String>, msg: impl Into<String>) -> GgufError {
        GgufError {
            offset,
            field: field.into(),
            msg: msg.into(),
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GGUF: {} at byte offset {}: {}",
            self.field, self.offset, self.msg
        )
    }
}

impl std::error::Error for GgufError {}

/// Result alias of this crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
