//! Small reference models built from RLX ops, shared by the examples and the benchmarks.

mod gpt;

pub use gpt::{Gpt, GptConfig};
