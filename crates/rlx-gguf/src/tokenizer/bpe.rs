//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the GPT-2 byte↔unicode map, the
//! pre-tokenizers, and the merge loop.
//!
//! Per raw-text fragment, as llama.cpp's `llm_tokenizer_bpe_session` does:
//! 1. split the text into words with the pre-tokenizer's rules (on code points);
//! 2. write every byte of each word's UTF-8 as one character of the GPT-2 byte alphabet;
//! 3. inside each word, repeatedly merge the adjacent pair with the lowest merge rank (ties: the
//!    leftmost pair), using a priority queue with lazy invalidation;
//! 4. look each final piece up in the vocabulary; a piece that is not a token falls back to its
//!    single-byte pieces that are.

use super::unicode::{is_letter, is_number, is_whitespace};
use super::merge::Merger;
use super::Tokenizer;

/// Whether GPT-2's byte alphabet keeps byte `b` as the character with the same code point.
const fn is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte → character map: printable bytes stand for themselves; the other 68 bytes take
/// the code points 256, 257, … in increasing byte order.
const BYTE_TO_CHAR: [char; 256] = {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if is_printable(b as u8) {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        map[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => panic!("unreachable: code points below 324 are valid"),
        };
        b += 1;
    }
    map
};

/// The non-printable bytes in increasing order: `NON_PRINTABLE[i]` is written as `256 + i`.
const NON_PRINTABLE: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable(b as u8) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
};

/// The character GPT-2's byte-level BPE writes for byte `b`.
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte that GPT-2's alphabet character `c` stands for, if it is one.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_printable(cp as u8) {
        Some(cp as u8)
    } else if (256..256 + 68).contains(&cp) {
        Some(NON_PRINTABLE[(cp - 256) as usize])
    } else {
        None
    }
}

/// The bytes a byte-level token text stands for, as llama.cpp's `llama_decode_text` gives them:
/// a character outside the byte alphabet comes out as `[UNK_BYTE_0x<its UTF-8 in hex><text>]`.
pub(crate) fn decode_text(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// The word-splitting rules of a byte-level BPE vocabulary (`tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// GPT-2's `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` alone
    /// (llama.cpp: `gpt-2`, `mpt`, `olmo`, `jais`, …).
    Gpt2,
    /// First `\p{N}` (every number code point on its own), then GPT-2's rules inside each piece
    /// (llama.cpp: `smollm`, `starcoder`, `refact`, `command-r`, …).
    DigitsThenGpt2,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for the `tokenizer.ggml.pre` value `name`, if RLX has it.
    pub(crate) fn from_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
            | "mellum2" => PreTokenizer::DigitsThenGpt2,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt"
            | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" => PreTokenizer::Gpt2,
            _ => return None,
        })
    }

    /// Split `text` into words, appending their byte ranges to `words`.
    pub(crate) fn split(self, text: &str, words: &mut Vec<(usize, usize)>) {
        // Code points and their byte offsets (one extra entry for the end).
        let mut cpts = Vec::with_capacity(text.len());
        let mut offs = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cpts.push(c);
            offs.push(i);
        }
        offs.push(text.len());
        let mut pieces = Vec::new();
        match self {
            PreTokenizer::Gpt2 => gpt2_split(&cpts, 0, &mut pieces),
            PreTokenizer::DigitsThenGpt2 => {
                let mut start = 0;
                for i in 0..cpts.len() {
                    if is_number(cpts[i]) {
                        if start < i {
                            gpt2_split(&cpts[start..i], start, &mut pieces);
                        }
                        // A lone number code point stays one word under GPT-2's rules too.
                        pieces.push((i, i + 1));
                        start = i + 1;
                    }
                }
                if start < cpts.len() {
                    gpt2_split(&cpts[start..], start, &mut pieces);
                }
            }
        }
        words.extend(pieces.into_iter().map(|(a, b)| (offs[a], offs[b])));
    }
}

/// GPT-2's rules over one piece `c` (code points; `base` is the index of `c[0]` in the
/// fragment), appending code-point ranges to `out`. This is the hand-written matcher llama.cpp
/// uses for the regex, whose lookahead `(?!\S)` sees the end of the piece as "not \S".
fn gpt2_split(c: &[char], base: usize, out: &mut Vec<(usize, usize)>) {
    let n = c.len();
    let letter = |p: usize| p < n && is_letter(c[p]);
    let number = |p: usize| p < n && is_number(c[p]);
    let space = |p: usize| p < n && is_whitespace(c[p]);
    let other = |p: usize| p < n && !is_whitespace(c[p]) && !is_letter(c[p]) && !is_number(c[p]);
    let mut pos = 0;
    let mut emit = |from: usize, to: usize| out.push((base + from, base + to));
    while pos < n {
        let start = pos;
        let ch = c[pos];
        // 's|'t|'re|'ve|'m|'ll|'d
        if ch == '\'' && pos + 1 < n {
            let next = c[pos + 1];
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(start, pos);
                continue;
            }
            if pos + 2 < n && matches!((next, c[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(start, pos);
                continue;
            }
        }
        // An optional leading space, then a run of one class.
        let first = if ch == ' ' { pos + 1 } else { pos };
        let class_run: Option<&dyn Fn(usize) -> bool> = if letter(first) {
            Some(&letter) // ` ?\p{L}+`
        } else if number(first) {
            Some(&number) // ` ?\p{N}+`
        } else if other(first) {
            Some(&other) // ` ?[^\s\p{L}\p{N}]+`
        } else {
            None
        };
        if let Some(in_run) = class_run {
            pos = first;
            while in_run(pos) {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }
        let mut spaces = 0;
        while space(pos + spaces) {
            spaces += 1;
        }
        if spaces > 1 && pos + spaces < n {
            // `\s+(?!\S)` before a non-space: leave the last space for the next word.
            pos += spaces - 1;
        } else if spaces > 0 {
            // `\s+` up to the end of the piece (or a single space before a non-space).
            pos += spaces;
        } else {
            pos += 1;
        }
        emit(start, pos);
    }
}

/// Reused buffers of one `encode` call.
#[derive(Default)]
pub(crate) struct Session {
    word: String,
    merger: Merger<std::cmp::Reverse<u32>>,
    key: Vec<u8>,
    words: Vec<(usize, usize)>,
}

impl Session {
    /// Byte-level BPE of the raw-text fragment `text`, appending ids to `out`.
    pub(crate) fn tokenize(&mut self, tok: &Tokenizer, pre: PreTokenizer, text: &str, out: &mut Vec<u32>) {
        self.words.clear();
        pre.split(text, &mut self.words);
        for i in 0..self.words.len() {
            let (a, b) = self.words[i];
            self.word.clear();
            for &byte in &text.as_bytes()[a..b] {
                self.word.push(byte_to_char(byte));
            }
            self.merge_word(tok, out);
        }
    }

    fn merge_word(&mut self, tok: &Tokenizer, out: &mut Vec<u32>) {
        let word = std::mem::take(&mut self.word);
        let key = &mut self.key;
        // BPE merges the pair of lowest rank first.
        self.merger.run(&word, |first, second, _| {
            merge_key(first, second, key);
            tok.merges.get(key.as_slice()).map(|&rank| std::cmp::Reverse(rank))
        });
        for s in self.merger.pieces() {
            let piece = &word[s.start..s.start + s.n];
            match tok.token_id(piece) {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp falls back to the piece's single bytes that are tokens.
                    for b in piece.bytes() {
                        let one = [b];
                        if let Some(id) = std::str::from_utf8(&one).ok().and_then(|s| tok.token_id(s)) {
                            out.push(id);
                        }
                    }
                }
            }
        }
        self.word = word;
    }
}

/// The key of the merge `first second` in [`Tokenizer::merges`]: `first`, a 0xFF byte (never
/// part of UTF-8), `second`.
pub(crate) fn merge_key(first: &str, second: &str, key: &mut Vec<u8>) {
    key.clear();
    key.extend_from_slice(first.as_bytes());
    key.push(0xFF);
    key.extend_from_slice(second.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        // The well-known corners of GPT-2's alphabet.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(b'\r'), 'č');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(b'~'), '~');
        assert_eq!(byte_to_char(0x7F), 'ġ');
        assert_eq!(byte_to_char(0xA0), 'ł');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(byte_to_char(0xA1), '¡');
        assert_eq!(byte_to_char(0xFF), 'ÿ');
        assert_eq!(byte_to_char(0xC3), 'Ã');
        // A bijection between all bytes and 256 distinct characters, inverted by char_to_byte.
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "{b:#x} maps to a repeated {c:?}");
            assert_eq!(char_to_byte(c), Some(b));
            assert!((c as u32) < 256 + 68);
        }
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\u{144}'), None); // 256 + 68
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn decode_text_matches_llama_cpp() {
        let mut out = Vec::new();
        decode_text("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        decode_text("Ã©", &mut out);
        assert_eq!(out, "é".as_bytes());
        out.clear();
        decode_text("a€", &mut out);
        assert_eq!(out, b"a[UNK_BYTE_0xe282aca\xe2\x82\xac]");
    }

    fn split(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut words = Vec::new();
        pre.split(text, &mut words);
        words.iter().map(|&(a, b)| &text[a..b]).collect()
    }

    #[test]
    fn gpt2_rules() {
        let g = PreTokenizer::Gpt2;
        assert_eq!(split(g, "Hello world"), ["Hello", " world"]);
        assert_eq!(split(g, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split(g, "I'm don't WE'LL"), ["I", "'m", " don", "'t", " WE", "'", "LL"]);
        assert_eq!(split(g, "a  b"), ["a", " ", " b"]);
        assert_eq!(split(g, "a   "), ["a", "   "]);
        assert_eq!(split(g, "x\t\ty"), ["x", "\t", "\t", "y"]);
        assert_eq!(split(g, "\n\n"), ["\n\n"]);
        assert_eq!(split(g, "line\n\nnext"), ["line", "\n", "\n", "next"]);
        assert_eq!(split(g, " 123 4x"), [" 123", " 4", "x"]);
        assert_eq!(split(g, "café naïve"), ["café", " naïve"]);
        assert_eq!(split(g, "a\u{A0}b"), ["a", "\u{A0}", "b"]);
        assert_eq!(split(g, "(x): {}"), ["(", "x", "):", " {}"]);
        assert_eq!(split(g, "e\u{301}"), ["e", "\u{301}"]); // a mark is not a letter
        assert_eq!(split(g, ""), Vec::<&str>::new());
    }

    #[test]
    fn digits_first() {
        let s = PreTokenizer::DigitsThenGpt2;
        assert_eq!(split(s, "1234 x"), ["1", "2", "3", "4", " x"]);
        assert_eq!(split(s, "3.14"), ["3", ".", "1", "4"]);
        assert_eq!(split(s, "a1b ²"), ["a", "1", "b", " ", "²"]);
        assert_eq!(split(s, "x  7"), ["x", "  ", "7"]); // the piece ends before the digit
    }
}
