//! SentencePiece-style BPE over scores (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session` runs it on one raw-text fragment whose spaces are already "▁":
//!
//! 1. every UTF-8 character starts as one symbol;
//! 2. repeatedly merge the adjacent pair whose concatenation is a vocabulary token with the
//!    highest score (ties: the leftmost pair), using a priority queue with lazy invalidation;
//! 3. each final symbol is its token, or — a character with no token — its UTF-8 bytes as
//!    `<0xXX>` byte tokens.

use super::merge::Merger;
use super::Tokenizer;
use std::cmp::Ordering;

/// A SentencePiece score as a total order (higher merges first; NaN ranks as equal).
#[derive(PartialEq)]
struct Score(f32);

impl Eq for Score {}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Reused buffers of one `encode` call.
#[derive(Default)]
pub(crate) struct Session {
    merger: Merger<Score>,
}

impl Session {
    /// Tokenize `text` (spaces already escaped to "▁"), appending ids to `out`.
    pub(crate) fn tokenize(&mut self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
        self.merger.run(text, |_, _, joined| {
            tok.token_id(joined)
                .map(|id| Score(tok.scores[id as usize]))
        });
        // Merged symbols are tokens by construction; only single characters can be missing.
        for s in self.merger.pieces() {
            let piece = &text[s.start..s.start + s.n];
            match tok.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| tok.byte_token(b))),
            }
        }
    }
}
