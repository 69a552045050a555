//! The paged KV cache's bookkeeping: a pool of fixed-size blocks of cache rows, handed to
//! sequences through block tables, with reference counts, a free list and prefix caching.
//!
//! A block that a sequence has filled is *registered* under a hash chained over the tokens of
//! every block before it and its own, so a later sequence starting with the same tokens (a shared
//! system prompt) maps those blocks into its own table instead of computing them again. Filled
//! blocks are never written again, so sharing needs no copy: a sequence only writes to the
//! blocks past its shared prefix, which it owns. A registered block no sequence uses stays
//! cached until the pool needs it, least recently used first.

use std::collections::{BTreeMap, HashMap};

/// The key of a filled block: a hash of its parent's key and its tokens.
pub type BlockHash = u64;

/// The key of the block holding `tokens` after the block keyed `parent` (0 for the first).
pub fn chain_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    // FNV-1a over the parent key and the tokens: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    parent.to_le_bytes().into_iter().for_each(&mut eat);
    for t in tokens {
        t.to_le_bytes().into_iter().for_each(&mut eat);
    }
    h
}

/// What a registered block holds, checked on every hit so a hash collision is a miss.
#[derive(Clone, Debug)]
struct Cached {
    hash: BlockHash,
    parent: BlockHash,
    tokens: Vec<u32>,
}

/// Counters of the pool's use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks found in the prefix cache.
    pub prefix_hits: u64,
    /// Tokens whose KV rows came from the prefix cache.
    pub prefix_hit_tokens: u64,
    /// Cached blocks dropped to make room.
    pub evictions: u64,
}

/// A pool of `blocks` cache blocks of `block` token rows each.
#[derive(Debug)]
pub struct BlockPool {
    block: usize,
    refs: Vec<u32>,
    free: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Registered blocks nobody uses, by the tick they were last released.
    idle: BTreeMap<u64, u32>,
    idle_since: Vec<u64>,
    tick: u64,
    stats: PoolStats,
}

impl BlockPool {
    /// A pool of `blocks` empty blocks of `block` rows.
    pub fn new(blocks: usize, block: usize) -> BlockPool {
        assert!(block > 0, "blocks hold at least one row");
        BlockPool {
            block,
            refs: vec![0; blocks],
            // Hand out low block ids first.
            free: (0..blocks as u32).rev().collect(),
            cached: vec![None; blocks],
            by_hash: HashMap::new(),
            idle: BTreeMap::new(),
            idle_since: vec![0; blocks],
            tick: 0,
            stats: PoolStats::default(),
        }
    }

    /// Rows per block.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Blocks in the pool.
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    /// Whether the pool has no blocks.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Blocks a sequence could get now: free ones plus cached ones nobody uses.
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Blocks some sequence holds.
    pub fn in_use(&self) -> usize {
        self.len() - self.available()
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// A block for a sequence to write (reference count 1): a free one, else the least
    /// recently used cached block nobody holds (forgetting what it cached).
    pub fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.idle.pop_first()?;
                if let Some(c) = self.cached[b as usize].take() {
                    self.by_hash.remove(&c.hash);
                }
                self.stats.evictions += 1;
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Drop one reference to `b`; a block nobody holds becomes free, or idle if it is cached.
    pub fn release(&mut self, b: u32) {
        let i = b as usize;
        debug_assert!(self.refs[i] > 0, "block {b} released more often than taken");
        self.refs[i] = self.refs[i].saturating_sub(1);
        if self.refs[i] == 0 {
            if self.cached[i].is_some() {
                self.tick += 1;
                self.idle_since[i] = self.tick;
                self.idle.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// The cached block holding `tokens` after the block keyed `parent`, with a new reference.
    pub fn lookup(&mut self, parent: BlockHash, tokens: &[u32]) -> Option<(u32, BlockHash)> {
        let hash = chain_hash(parent, tokens);
        let &b = self.by_hash.get(&hash)?;
        let c = self.cached[b as usize].as_ref()?;
        if c.parent != parent || c.tokens != tokens {
            return None;
        }
        let i = b as usize;
        if self.refs[i] == 0 {
            self.idle.remove(&self.idle_since[i]);
        }
        self.refs[i] += 1;
        self.stats.prefix_hits += 1;
        self.stats.prefix_hit_tokens += tokens.len() as u64;
        Some((b, hash))
    }

    /// Tokens at the front of `tokens` that [`SeqBlocks::with_prefix`] would map from the
    /// cache now (whole blocks, leaving at least one token), without taking any block.
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        let bs = self.block_size();
        let whole = tokens.len().saturating_sub(1) / bs;
        let mut parent = 0;
        let mut n = 0;
        for chunk in tokens.chunks(bs).take(whole) {
            let hash = chain_hash(parent, chunk);
            let hit = self.by_hash.get(&hash).is_some_and(|&b| {
                self.cached[b as usize]
                    .as_ref()
                    .is_some_and(|c| c.parent == parent && c.tokens == chunk)
            });
            if !hit {
                break;
            }
            parent = hash;
            n += bs;
        }
        n
    }

    /// Register the filled block `b` (holding `tokens` after the block keyed `parent`) for
    /// later sequences; returns its key. A block already cached under that key stays the cached
    /// one and `b` stays private.
    pub fn register(&mut self, b: u32, parent: BlockHash, tokens: &[u32]) -> BlockHash {
        let hash = chain_hash(parent, tokens);
        let i = b as usize;
        if self.cached[i].is_none() && !self.by_hash.contains_key(&hash) {
            self.by_hash.insert(hash, b);
            self.cached[i] = Some(Cached {
                hash,
                parent,
                tokens: tokens.to_vec(),
            });
        }
        hash
    }

    /// Forget every cached block (after a step that may not have filled the blocks it
    /// registered ahead failed): nothing is shared from now on until blocks are filled again.
    pub fn forget(&mut self) {
        for c in &mut self.cached {
            *c = None;
        }
        self.by_hash.clear();
        let idle = std::mem::take(&mut self.idle);
        self.free.extend(idle.into_values());
    }

    /// Check the pool's invariants (for tests): every block is exactly one of free, idle or
    /// held; the hash index matches the cached blocks.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![0u8; self.len()];
        for &b in &self.free {
            seen[b as usize] += 1;
            if self.refs[b as usize] != 0 || self.cached[b as usize].is_some() {
                return Err(format!("free block {b} is held or cached"));
            }
        }
        for &b in self.idle.values() {
            seen[b as usize] += 1;
            if self.refs[b as usize] != 0 || self.cached[b as usize].is_none() {
                return Err(format!("idle block {b} is held or not cached"));
            }
        }
        for (b, &r) in self.refs.iter().enumerate() {
            if r > 0 {
                seen[b] += 1;
            }
        }
        if let Some(b) = seen.iter().position(|&n| n != 1) {
            return Err(format!("block {b} is in {} states", seen[b]));
        }
        for (&h, &b) in &self.by_hash {
            if self.cached[b as usize].as_ref().map(|c| c.hash) != Some(h) {
                return Err(format!(
                    "hash index names block {b}, which holds something else"
                ));
            }
        }
        Ok(())
    }
}

/// One sequence's view of the pool: its block table and what its filled blocks are keyed by.
#[derive(Clone, Debug, Default)]
pub struct SeqBlocks {
    /// Block ids, in position order.
    pub table: Vec<u32>,
    /// Keys of the filled blocks registered so far (a prefix of `table`).
    keys: Vec<BlockHash>,
    /// Tokens at the front whose rows came from the prefix cache.
    pub cached_tokens: usize,
}

impl SeqBlocks {
    /// Map the longest cached prefix of `tokens` (whole blocks, leaving at least one token to
    /// compute so the sequence gets logits) into a new table; returns the tokens covered.
    pub fn with_prefix(pool: &mut BlockPool, tokens: &[u32]) -> SeqBlocks {
        let bs = pool.block_size();
        let mut s = SeqBlocks::default();
        let whole = tokens.len().saturating_sub(1) / bs;
        for chunk in tokens.chunks(bs).take(whole) {
            let parent = s.keys.last().copied().unwrap_or(0);
            match pool.lookup(parent, chunk) {
                Some((b, key)) => {
                    s.table.push(b);
                    s.keys.push(key);
                }
                None => break,
            }
        }
        s.cached_tokens = s.table.len() * bs;
        s
    }

    /// Make the table cover `len` token rows, taking blocks from the pool; all or nothing
    /// (`false`: not enough blocks, nothing taken).
    pub fn reserve(&mut self, pool: &mut BlockPool, len: usize) -> bool {
        let need = len
            .div_ceil(pool.block_size())
            .saturating_sub(self.table.len());
        if need > pool.available() {
            return false;
        }
        for _ in 0..need {
            match pool.allocate() {
                Some(b) => self.table.push(b),
                None => return false,
            }
        }
        true
    }

    /// Register the blocks that `tokens` (the sequence's tokens whose rows are now in the cache)
    /// fill, so later sequences can share them.
    pub fn register_full(&mut self, pool: &mut BlockPool, tokens: &[u32]) {
        let bs = pool.block_size();
        let full = (tokens.len() / bs).min(self.table.len());
        while self.keys.len() < full {
            let i = self.keys.len();
            let parent = self.keys.last().copied().unwrap_or(0);
            let key = pool.register(self.table[i], parent, &tokens[i * bs..(i + 1) * bs]);
            self.keys.push(key);
        }
    }

    /// The cache row of position `pos` (`-1` past the table).
    pub fn slot(&self, pos: usize, block: usize) -> i32 {
        self.table
            .get(pos / block)
            .map_or(-1, |&b| (b as usize * block + pos % block) as i32)
    }

    /// Give every block back to the pool.
    pub fn free(&mut self, pool: &mut BlockPool) {
        for b in self.table.drain(..) {
            pool.release(b);
        }
        self.keys.clear();
        self.cached_tokens = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_shared_prefix_is_found_and_never_overwritten() {
        let mut pool = BlockPool::new(8, 4);
        let system: Vec<u32> = (100..110).collect(); // 2 whole blocks + 2 tokens
        let mut a_tokens = system.clone();
        a_tokens.extend([1, 2, 3]);
        let mut a = SeqBlocks::with_prefix(&mut pool, &a_tokens);
        assert_eq!(a.cached_tokens, 0);
        assert!(a.reserve(&mut pool, a_tokens.len()));
        a.register_full(&mut pool, &a_tokens);
        // B shares the system prompt's two whole blocks, not the partial third.
        let mut b_tokens = system.clone();
        b_tokens.extend([7, 8]);
        let mut b = SeqBlocks::with_prefix(&mut pool, &b_tokens);
        assert_eq!(b.cached_tokens, 8);
        assert_eq!(b.table, a.table[..2]);
        assert!(b.reserve(&mut pool, b_tokens.len()));
        assert_ne!(b.table[2], a.table[2], "B writes its own third block");
        assert_eq!(pool.stats().prefix_hits, 2);
        pool.check().unwrap();
        // A prompt that is exactly the cached blocks still computes its last block.
        let c = SeqBlocks::with_prefix(&mut pool, &system[..8]);
        assert_eq!(c.cached_tokens, 4);
        let mut c = c;
        c.free(&mut pool);
        a.free(&mut pool);
        b.free(&mut pool);
        pool.check().unwrap();
        assert_eq!(pool.available(), 8);
        // Freed, the cached blocks still serve a new sequence until evicted.
        let d = SeqBlocks::with_prefix(&mut pool, &b_tokens);
        assert_eq!(d.cached_tokens, 8);
    }

    #[test]
    fn a_full_pool_evicts_idle_cached_blocks_and_refuses_beyond() {
        let mut pool = BlockPool::new(3, 2);
        let t: Vec<u32> = vec![1, 2, 3, 4, 5];
        let mut a = SeqBlocks::default();
        assert!(a.reserve(&mut pool, 5));
        a.register_full(&mut pool, &t);
        assert!(!a.reserve(&mut pool, 7), "no fourth block");
        assert_eq!(a.table.len(), 3, "a refused reserve takes nothing");
        a.free(&mut pool);
        let mut b = SeqBlocks::default();
        assert!(b.reserve(&mut pool, 6));
        assert_eq!(pool.stats().evictions, 2);
        pool.check().unwrap();
        let c = SeqBlocks::with_prefix(&mut pool, &t);
        assert_eq!(c.cached_tokens, 0, "evicted blocks are gone from the cache");
    }

    proptest! {
        /// Random admissions, growth, frees of sequences and forgetting over a small pool keep every block
        /// in exactly one state, never give a block to two writers, and share only filled
        /// blocks whose tokens match.
        #[test]
        fn pool_invariants_hold(ops in prop::collection::vec((0u8..4, 0usize..6, 1usize..12, 0u32..3), 1..80)) {
            let bs = 4;
            let mut pool = BlockPool::new(12, bs);
            let mut seqs: Vec<Option<(SeqBlocks, Vec<u32>)>> = vec![None; 6];
            for (op, slot, n, base) in ops {
                match (op, seqs[slot].take()) {
                    (3, s) => {
                        // A failed step: the cache forgets what it shared.
                        seqs[slot] = s;
                        pool.forget();
                        prop_assert_eq!(pool.cached_prefix(&[0, 1, 2, 3, 4, 5, 6, 7, 8]), 0);
                    }
                    (0, None) => {
                        // Admit: tokens from a few shared prefixes.
                        let tokens: Vec<u32> = (0..n as u32).map(|i| base * 100 + i).collect();
                        let mut s = SeqBlocks::with_prefix(&mut pool, &tokens);
                        if s.reserve(&mut pool, tokens.len()) {
                            s.register_full(&mut pool, &tokens);
                            seqs[slot] = Some((s, tokens));
                        } else {
                            s.free(&mut pool);
                        }
                    }
                    (1, Some((mut s, mut tokens))) => {
                        let extra: Vec<u32> = (0..n as u32).map(|i| 1000 + slot as u32 * 50 + i).collect();
                        if s.reserve(&mut pool, tokens.len() + extra.len()) {
                            tokens.extend(extra);
                            s.register_full(&mut pool, &tokens);
                        }
                        seqs[slot] = Some((s, tokens));
                    }
                    (_, Some((mut s, _))) => s.free(&mut pool),
                    (_, None) => {}
                }
                pool.check().map_err(TestCaseError::fail)?;
                // Writable (partial or unregistered) blocks belong to one sequence only.
                let mut writers = std::collections::HashMap::new();
                for (s, tokens) in seqs.iter().flatten() {
                    for (i, &b) in s.table.iter().enumerate() {
                        if (i + 1) * bs > tokens.len() {
                            prop_assert!(writers.insert(b, ()).is_none(), "block {} written by two sequences", b);
                        }
                    }
                }
                // Shared blocks hold the same tokens in every sequence that maps them.
                let mut content: std::collections::HashMap<u32, Vec<u32>> = Default::default();
                for (s, tokens) in seqs.iter().flatten() {
                    for (i, &b) in s.table.iter().enumerate() {
                        if (i + 1) * bs <= tokens.len() {
                            let t = tokens[i * bs..(i + 1) * bs].to_vec();
                            if let Some(prev) = content.insert(b, t.clone()) {
                                prop_assert_eq!(prev, t);
                            }
                        }
                    }
                }
            }
        }
    }
}
