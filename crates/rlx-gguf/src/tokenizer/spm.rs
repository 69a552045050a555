//! SentencePiece-style BPE over scores (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session` runs it on one raw-text fragment whose spaces are already "▁":
//!
//! 1. every UTF-8 character starts as one symbol;
//! 2. repeatedly merge the adjacent pair whose concatenation is a vocabulary token with the
//!    highest score (ties: the leftmost pair), using a priority queue with lazy invalidation;
//! 3. each final symbol is its token, or — a character with no token — its UTF-8 bytes as
//!    `<0xXX>` byte tokens.

use super::Tokenizer;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A candidate merge of the adjacent symbols `left` and `right`, `size` bytes long.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// Max-heap order: the highest score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// One piece of the text: `n` bytes from `start`; `n == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Reused buffers of one `encode` call.
#[derive(Default)]
pub(crate) struct Session {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Session {
    /// Tokenize `text` (spaces already escaped to "▁"), appending ids to `out`.
    pub(crate) fn tokenize(&mut self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
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
            self.add_bigram(tok, text, i - 1, i);
        }
        while let Some(bg) = self.queue.pop() {
            let (l, r) = (self.symbols[bg.left], self.symbols[bg.right]);
            // Stale: one side was merged away or grew since this pair was queued.
            if l.n == 0 || r.n == 0 || l.n + r.n != bg.size {
                continue;
            }
            self.symbols[bg.left].n += r.n;
            self.symbols[bg.right].n = 0;
            self.symbols[bg.left].next = r.next;
            if let Some(next) = r.next {
                self.symbols[next].prev = Some(bg.left);
            }
            if let Some(prev) = l.prev {
                self.add_bigram(tok, text, prev, bg.left);
            }
            if let Some(next) = r.next {
                self.add_bigram(tok, text, bg.left, next);
            }
        }
        // Merged symbols are tokens by construction; only single characters can be missing.
        let mut i = if self.symbols.is_empty() { None } else { Some(0) };
        while let Some(at) = i {
            let s = self.symbols[at];
            let piece = &text[s.start..s.start + s.n];
            match tok.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| tok.byte_token(b))),
            }
            i = s.next;
        }
    }

    fn add_bigram(&mut self, tok: &Tokenizer, text: &str, left: usize, right: usize) {
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let size = l.n + r.n;
        if let Some(id) = tok.token_id(&text[l.start..l.start + size]) {
            self.queue.push(Bigram { score: tok.scores[id as usize], left, right, size });
        }
    }
}
