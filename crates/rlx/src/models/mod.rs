//! Small reference models built from RLX ops, shared by the examples and the benchmarks.

pub mod digits;
mod gpt;

pub use gpt::{Gpt, GptConfig};
