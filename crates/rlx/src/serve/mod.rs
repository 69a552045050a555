//! Serving many sequences at once: the paged KV cache's block pool ([`blocks`]) and the
//! continuous-batching engine ([`engine`]).

pub mod blocks;
pub mod engine;

pub use blocks::{BlockPool, PoolStats, SeqBlocks};
pub use engine::{Engine, EngineOptions, EngineStats, Event, Finish, GenParams};
