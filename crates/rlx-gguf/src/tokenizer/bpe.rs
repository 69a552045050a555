//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the GPT-2 byte↔unicode map, the
//! pre-tokenizers, and the merge loop.
//!
//! Per raw-text fragment, as llama.cpp's `llm_tokenizer_bpe_session` does:
//! 1. split the text into words with the pre-tokenizer's rules (on code points);
//! 2. write every byte of each word's UTF-8 as one character of the GPT-2 byte alphabet;
//! 3. with `ignore_merges` (Llama 3 and a few others), a word that is a token as a whole becomes
//!    that token;
//! 4. otherwise, inside each word, repeatedly merge the adjacent pair with the lowest merge rank
//!    (ties: the leftmost pair), using a priority queue with lazy invalidation;
//! 5. look each final piece up in the vocabulary; a piece that is not a token falls back to its
//!    single-byte pieces that are.

use super::merge::Merger;
use super::unicode::{is_letter, is_number, is_whitespace};
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
    /// Llama 3's rules: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (llama.cpp: `llama3`, `llama-bpe`,
    /// `falcon3`, `pixtral`, `dbrx`, `glm4`, …).
    Llama3,
    /// Qwen2's rules: Llama 3's with every number code point a word of its own (`\p{N}` in
    /// place of `\p{N}{1,3}`) (llama.cpp: `qwen2`, `deepseek-r1-qwen`, `stablelm2`, `megrez`, …).
    Qwen2,
}

/// What llama.cpp's loader makes of a `tokenizer.ggml.pre` value: the word-splitting rules and
/// the vocabulary settings that come with the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreConfig {
    /// The word-splitting rules.
    pub(crate) rules: PreTokenizer,
    /// A word that is a token as a whole becomes that token without merging (llama.cpp's
    /// `ignore_merges`).
    pub(crate) ignore_merges: bool,
    /// Whether BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub(crate) add_bos: bool,
    /// Whether the BOS token defaults to id 11 like other BPE vocabularies when
    /// `tokenizer.ggml.bos_token_id` is absent (false: no BOS token then).
    pub(crate) default_bos: bool,
}

impl PreConfig {
    /// Rules with llama.cpp's default BPE settings.
    pub(crate) const fn plain(rules: PreTokenizer) -> PreConfig {
        PreConfig {
            rules,
            ignore_merges: false,
            add_bos: false,
            default_bos: true,
        }
    }

    /// The settings llama.cpp uses for the `tokenizer.ggml.pre` value `name`, if RLX implements
    /// its rules. Names are grouped as llama.cpp groups them; only names whose regex list is
    /// exactly one of the implemented ones are accepted.
    pub(crate) fn from_name(name: &str) -> Option<PreConfig> {
        use PreTokenizer::*;
        Some(match name {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => PreConfig::plain(DigitsThenGpt2),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "a.x-4.0" | "mellum" | "modern-bert"
            | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" => {
                PreConfig::plain(Gpt2)
            }
            // llama.cpp's LLAMA3 type: whole-word tokens skip the merges, BOS by default.
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreConfig {
                ignore_merges: true,
                add_bos: true,
                ..PreConfig::plain(Llama3)
            },
            // DBRX and SMAUG: the same rules, default settings.
            "dbrx" | "smaug-bpe" => PreConfig::plain(Llama3),
            // CHATGLM4: the same rules, no default BOS token (and ignore_merges for GLM-4/5).
            "chatglm-bpe" => PreConfig {
                default_bos: false,
                ..PreConfig::plain(Llama3)
            },
            "glm4" | "glm5" => PreConfig {
                default_bos: false,
                ignore_merges: true,
                ..PreConfig::plain(Llama3)
            },
            // QWEN2, STABLELM2, HUNYUAN, SOLAR_OPEN and GROK_2 share one regex.
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" | "grok-2" => PreConfig::plain(Qwen2),
            _ => return None,
        })
    }
}

impl PreTokenizer {
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
            PreTokenizer::Llama3 => llama3_split(&cpts, 3, &mut pieces),
            PreTokenizer::Qwen2 => llama3_split(&cpts, 1, &mut pieces),
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

/// The Llama 3 / Qwen2 rules over the code points `c` of one fragment, appending code-point
/// ranges to `out`; a run of number code points is cut into words of at most `max_digits`.
///
/// The alternatives are tried in the regex's order at each position, as llama.cpp's
/// hand-written matcher does; its lookahead `(?!\S)` sees the end of the fragment as "not \S".
fn llama3_split(c: &[char], max_digits: usize, out: &mut Vec<(usize, usize)>) {
    let n = c.len();
    let letter = |p: usize| p < n && is_letter(c[p]);
    let number = |p: usize| p < n && is_number(c[p]);
    let space = |p: usize| p < n && is_whitespace(c[p]);
    let other = |p: usize| p < n && !is_whitespace(c[p]) && !is_letter(c[p]) && !is_number(c[p]);
    let newline = |p: usize| p < n && matches!(c[p], '\r' | '\n');
    let mut pos = 0;
    while pos < n {
        let start = pos;
        let ch = c[pos];
        pos = if let Some(len) = contraction(&c[pos..]) {
            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            pos + len
        } else if letter(pos) || (!newline(pos) && !number(pos) && letter(pos + 1)) {
            // [^\r\n\p{L}\p{N}]?\p{L}+
            let mut end = pos + 1;
            while letter(end) {
                end += 1;
            }
            end
        } else if number(pos) {
            // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
            let mut end = pos + 1;
            while end - pos < max_digits && number(end) {
                end += 1;
            }
            end
        } else if other(if ch == ' ' { pos + 1 } else { pos }) {
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            let mut end = pos + 1;
            while other(end) {
                end += 1;
            }
            while newline(end) {
                end += 1;
            }
            end
        } else {
            // Whitespace (nothing else is left): the run up to its last \r or \n (`\s*[\r\n]+`),
            // else the run but its last character before a non-space (`\s+(?!\S)`), else the
            // whole run (`\s+`).
            let mut end = pos;
            let mut after_newline = None;
            while space(end) {
                if newline(end) {
                    after_newline = Some(end + 1);
                }
                end += 1;
            }
            match after_newline {
                Some(e) => e,
                None if end - pos > 1 && end < n => end - 1,
                // `max` only guards progress; a non-space cannot get here.
                None => end.max(pos + 1),
            }
        };
        out.push((start, pos));
    }
}

/// The length of the case-insensitive contraction `'s`, `'t`, `'re`, `'ve`, `'m`, `'ll` or `'d`
/// at the start of `c`, if there is one. (No non-ASCII character lowercases to one of these
/// letters in llama.cpp's case table, so ASCII lowercasing is the same.)
fn contraction(c: &[char]) -> Option<usize> {
    let lower = |i: usize| c.get(i).map(char::to_ascii_lowercase);
    if c.first() != Some(&'\'') {
        return None;
    }
    match (lower(1)?, lower(2)) {
        ('s' | 't' | 'm' | 'd', _) => Some(2),
        ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => Some(3),
        _ => None,
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
    pub(crate) fn tokenize(
        &mut self,
        tok: &Tokenizer,
        pre: PreConfig,
        text: &str,
        out: &mut Vec<u32>,
    ) {
        self.words.clear();
        pre.rules.split(text, &mut self.words);
        for i in 0..self.words.len() {
            let (a, b) = self.words[i];
            self.word.clear();
            for &byte in &text.as_bytes()[a..b] {
                self.word.push(byte_to_char(byte));
            }
            let whole = if pre.ignore_merges {
                tok.token_id(&self.word)
            } else {
                None
            };
            match whole {
                Some(id) => out.push(id),
                None => self.merge_word(tok, out),
            }
        }
    }

    fn merge_word(&mut self, tok: &Tokenizer, out: &mut Vec<u32>) {
        let word = std::mem::take(&mut self.word);
        let key = &mut self.key;
        // BPE merges the pair of lowest rank first.
        self.merger.run(&word, |first, second, _| {
            merge_key(first, second, key);
            tok.merges
                .get(key.as_slice())
                .map(|&rank| std::cmp::Reverse(rank))
        });
        for s in self.merger.pieces() {
            let piece = &word[s.start..s.start + s.n];
            match tok.token_id(piece) {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp falls back to the piece's single bytes that are tokens.
                    for b in piece.bytes() {
                        let one = [b];
                        if let Some(id) =
                            std::str::from_utf8(&one).ok().and_then(|s| tok.token_id(s))
                        {
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
        assert_eq!(
            split(g, "I'm don't WE'LL"),
            ["I", "'m", " don", "'t", " WE", "'", "LL"]
        );
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

    #[test]
    fn llama3_rules() {
        let l = PreTokenizer::Llama3;
        assert_eq!(split(l, "Hello world"), ["Hello", " world"]);
        // Contractions in any case; a letter run takes an apostrophe that starts no contraction.
        assert_eq!(
            split(l, "DON'T I'M we'Ve they'RE"),
            ["DON", "'T", " I", "'M", " we", "'Ve", " they", "'RE"]
        );
        assert_eq!(
            split(l, "'hello 'store x'"),
            ["'hello", " '", "store", " x", "'"]
        );
        assert_eq!(split(l, "it'll'd"), ["it", "'ll", "'d"]);
        // Numbers in groups of three from the left, never with a leading space.
        assert_eq!(split(l, "1234567"), ["123", "456", "7"]);
        assert_eq!(split(l, "3.14159 x"), ["3", ".", "141", "59", " x"]);
        assert_eq!(split(l, " 42"), [" ", "42"]);
        assert_eq!(split(l, "abc123def"), ["abc", "123", "def"]);
        assert_eq!(
            split(l, "\u{661}\u{662}\u{663}\u{664}"),
            ["\u{661}\u{662}\u{663}", "\u{664}"]
        );
        // Any one non-letter, non-number, non-newline character leads a letter run.
        assert_eq!(
            split(l, "(hello $100 --flag foo_bar"),
            ["(hello", " $", "100", " --", "flag", " foo", "_bar"]
        );
        assert_eq!(split(l, "\tx\u{3000}y"), ["\tx", "\u{3000}y"]);
        assert_eq!(split(l, "\nx"), ["\n", "x"]);
        // Punctuation runs keep an optional leading space and their trailing newlines.
        assert_eq!(split(l, "end.\n\nNext"), ["end", ".\n\n", "Next"]);
        assert_eq!(split(l, "a !?\r\n"), ["a", " !?\r\n"]);
        // Whitespace: up to the last newline; else all but the last before a non-space.
        assert_eq!(split(l, "a  \n  b"), ["a", "  \n", " ", " b"]);
        assert_eq!(split(l, "a   b   "), ["a", "  ", " b", "   "]);
        assert_eq!(split(l, "x   1"), ["x", "  ", " ", "1"]);
        assert_eq!(split(l, "\r\n"), ["\r\n"]);
        assert_eq!(split(l, "naïve e\u{301}"), ["naïve", " e", "\u{301}"]);
        assert_eq!(split(l, "日本語 😀!"), ["日本語", " 😀!"]);
        assert_eq!(split(l, ""), Vec::<&str>::new());
    }

    #[test]
    fn qwen2_rules() {
        let q = PreTokenizer::Qwen2;
        assert_eq!(split(q, "1234567"), ["1", "2", "3", "4", "5", "6", "7"]);
        assert_eq!(
            split(q, "abc123def I'M"),
            ["abc", "1", "2", "3", "def", " I", "'M"]
        );
        assert_eq!(split(q, "$100\n\n"), ["$", "1", "0", "0", "\n\n"]);
        assert_eq!(split(q, "a  b"), ["a", " ", " b"]);
    }

    #[test]
    fn splitters_cover_every_character() {
        // Words are non-empty, in order and tile the text, whatever the input: a few fixed
        // texts, then seeded random ones over an alphabet of every character class.
        let mut texts: Vec<String> = [
            "",
            "'",
            "''",
            "'s",
            " '",
            " ",
            "  ",
            "\r",
            " \r\n\t\u{85}\u{2028}",
            "a1'!\u{301}\u{10FFFF}\0",
        ]
        .map(String::from)
        .to_vec();
        let alphabet = [
            'a', 'Z', 'é', '日', '1', '٣', '½', '\'', 's', 'T', 'l', 'E', ' ', '\t', '\r', '\n',
            '\u{A0}', '\u{3000}', '.', '$', '_', '\u{301}', '😀', '\u{378}',
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let mut t = String::new();
            for _ in 0..(state >> 60) {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                t.push(alphabet[(state >> 33) as usize % alphabet.len()]);
            }
            texts.push(t);
        }
        for pre in [
            PreTokenizer::Gpt2,
            PreTokenizer::DigitsThenGpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
        ] {
            for t in &texts {
                let words = split(pre, t);
                assert!(
                    words.iter().all(|w| !w.is_empty()),
                    "{pre:?} {t:?}: {words:?}"
                );
                assert_eq!(words.concat(), *t, "{pre:?}");
            }
        }
    }

    #[test]
    fn pre_names() {
        let rules = |name| PreConfig::from_name(name).map(|p| p.rules);
        assert_eq!(rules("llama-bpe"), Some(PreTokenizer::Llama3));
        assert_eq!(rules("dbrx"), Some(PreTokenizer::Llama3));
        assert_eq!(rules("qwen2"), Some(PreTokenizer::Qwen2));
        assert_eq!(rules("megrez"), Some(PreTokenizer::Qwen2));
        assert_eq!(rules("smollm"), Some(PreTokenizer::DigitsThenGpt2));
        // Near relatives with other rules are not taken for these.
        for other in [
            "qwen35", "jais-2", "superbpe", "tekken", "gpt-4o", "minicpm5", "llama4", "default",
        ] {
            assert_eq!(rules(other), None, "{other}");
        }
        let llama3 = PreConfig::from_name("llama3").unwrap();
        assert!(llama3.ignore_merges && llama3.add_bos && llama3.default_bos);
        let glm4 = PreConfig::from_name("glm4").unwrap();
        assert!(glm4.ignore_merges && !glm4.add_bos && !glm4.default_bos);
        assert_eq!(
            PreConfig::from_name("qwen2"),
            Some(PreConfig::plain(PreTokenizer::Qwen2))
        );
    }
}
