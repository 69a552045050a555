//! Serving many sequences at once: the paged KV cache's block pool ([`blocks`]) and the
//! continuous-batching engine ([`engine`]), and (feature `server`) the OpenAI-compatible HTTP
//! server (`http`).

pub mod blocks;
pub mod engine;
#[cfg(feature = "server")]
pub mod http;

pub use blocks::{BlockPool, PoolStats, SeqBlocks};
pub use engine::{Engine, EngineOptions, EngineStats, Event, Finish, GenParams, TokenLogprobs};
