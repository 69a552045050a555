//! The symbol merging both tokenizers share: a text starts as one symbol per character, and the
//! best adjacent pair (by a key the tokenizer computes: BPE merge rank, SentencePiece score) is
//! merged until no pair qualifies. A priority queue with lazy invalidation keeps it fast.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One piece of the text: `n` bytes from `start`; `n == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
pub(super) struct Symbol {
    pub(super) start: usize,
    pub(super) n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of the adjacent symbols `left` and `right`, `size` bytes long.
struct Pair<K> {
    key: K,
    left: usize,
    right: usize,
    size: usize,
}

impl<K: Ord> Ord for Pair<K> {
    /// Max-heap order: the largest key first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key).then(other.left.cmp(&self.left))
    }
}

impl<K: Ord> PartialOrd for Pair<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord> PartialEq for Pair<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K: Ord> Eq for Pair<K> {}

/// Reusable symbol list and queue.
pub(super) struct Merger<K> {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Pair<K>>,
}

impl<K> Default for Merger<K> {
    fn default() -> Self {
        Merger {
            symbols: Vec::new(),
            queue: BinaryHeap::new(),
        }
    }
}

impl<K: Ord> Merger<K> {
    /// Split `text` into characters, then merge adjacent pairs while `key(left, right, joined)`
    /// (their texts) gives them a priority; larger keys merge first.
    pub(super) fn run(&mut self, text: &str, mut key: impl FnMut(&str, &str, &str) -> Option<K>) {
        self.symbols.clear();
        self.queue.clear();
        let count = text.chars().count();
        for (i, (start, c)) in text.char_indices().enumerate() {
            self.symbols.push(Symbol {
                start,
                n: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < count).then_some(i + 1),
            });
        }
        for i in 1..self.symbols.len() {
            self.push(text, i - 1, i, &mut key);
        }
        while let Some(p) = self.queue.pop() {
            let (l, r) = (self.symbols[p.left], self.symbols[p.right]);
            // Stale: one side was merged away or grew since this pair was queued.
            if l.n == 0 || r.n == 0 || l.n + r.n != p.size {
                continue;
            }
            self.symbols[p.left].n += r.n;
            self.symbols[p.right].n = 0;
            self.symbols[p.left].next = r.next;
            if let Some(next) = r.next {
                self.symbols[next].prev = Some(p.left);
            }
            if let Some(prev) = l.prev {
                self.push(text, prev, p.left, &mut key);
            }
            if let Some(next) = r.next {
                self.push(text, p.left, next, &mut key);
            }
        }
    }

    fn push(
        &mut self,
        text: &str,
        left: usize,
        right: usize,
        key: &mut impl FnMut(&str, &str, &str) -> Option<K>,
    ) {
        let (l, r) = (self.symbols[left], self.symbols[right]);
        // Adjacent symbols are adjacent spans of the text.
        let (first, joined) = (&text[l.start..l.start + l.n], &text[l.start..r.start + r.n]);
        if let Some(k) = key(first, &text[r.start..r.start + r.n], joined) {
            self.queue.push(Pair {
                key: k,
                left,
                right,
                size: l.n + r.n,
            });
        }
    }

    /// The final symbols in text order.
    pub(super) fn pieces(&self) -> impl Iterator<Item = Symbol> + '_ {
        let mut at = (!self.symbols.is_empty()).then_some(0);
        std::iter::from_fn(move || {
            let s = self.symbols[at?];
            at = s.next;
            Some(s)
        })
    }
}
