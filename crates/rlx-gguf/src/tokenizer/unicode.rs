//! The code point classes llama.cpp's pre-tokenizers use: `\p{L}`, `\p{N}` and `\s`.
//!
//! Letters and numbers come from [`super::unicode_data::RANGES`] (Unicode 15.1.0, the version of
//! llama.cpp's own tables). Whitespace is llama.cpp's list, which is exactly Unicode's
//! `White_Space` property: note that it includes U+0085 and U+00A0 (`\s` in some regex engines
//! does not).

use super::unicode_data::RANGES;

/// The general-category class of a code point, as far as the pre-tokenizers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// `\p{L}`: Lu, Ll, Lt, Lm, Lo.
    Letter,
    /// `\p{N}`: Nd, Nl, No.
    Number,
    /// Everything else (marks, punctuation, symbols, separators, controls, unassigned).
    Other,
}

/// The class of `c`.
pub(super) fn class(c: char) -> Class {
    let c = c as u32;
    if c < 0x80 {
        return match c as u8 {
            b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
            b'0'..=b'9' => Class::Number,
            _ => Class::Other,
        };
    }
    // The last range starting at or before `c`.
    let i = RANGES.partition_point(|&(first, _, _)| first <= c);
    match i.checked_sub(1).map(|i| RANGES[i]) {
        Some((_, last, cls)) if c <= last => cls,
        _ => Class::Other,
    }
}

/// `\p{L}`.
pub(super) fn is_letter(c: char) -> bool {
    class(c) == Class::Letter
}

/// `\p{N}`.
pub(super) fn is_number(c: char) -> bool {
    class(c) == Class::Number
}

/// `\s` as llama.cpp defines it (Unicode `White_Space`).
pub(super) fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_disjoint() {
        for w in RANGES.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0, "{:x?}", w);
        }
        assert!(RANGES.iter().all(|r| r.2 != Class::Other));
    }

    #[test]
    fn classes() {
        for (c, want) in [
            ('a', Class::Letter),
            ('Z', Class::Letter),
            ('7', Class::Number),
            ('_', Class::Other),
            ('é', Class::Letter),
            ('ß', Class::Letter),
            ('ẞ', Class::Letter),
            ('日', Class::Letter),
            ('の', Class::Letter),
            ('Ж', Class::Letter),
            ('ª', Class::Letter),      // Lo
            ('ʰ', Class::Letter),      // Lm
            ('²', Class::Number),      // No
            ('½', Class::Number),      // No
            ('Ⅻ', Class::Number),      // Nl (Rust's is_alphabetic says true)
            ('٣', Class::Number),      // Nd, Arabic-Indic
            ('\u{301}', Class::Other), // Mn: combining acute accent
            ('\u{903}', Class::Other), // Mc: Devanagari visarga (Rust's is_alphabetic says true)
            ('😀', Class::Other),
            ('\u{200D}', Class::Other),
            ('\u{2EBF0}', Class::Letter), // CJK Extension I, new in Unicode 15.1
            ('\u{105C0}', Class::Other),  // Todhri, new in Unicode 16: unassigned for llama.cpp
            ('\u{10FFFF}', Class::Other),
        ] {
            assert_eq!(class(c), want, "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn whitespace_is_white_space_property() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            assert_eq!(is_whitespace(c), c.is_whitespace(), "U+{:04X}", c as u32);
        }
    }
}
