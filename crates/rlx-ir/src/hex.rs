//! Raw bytes in JSON as one hexadecimal string (a constant of a million floats is 8 MB of text
//! as an array of numbers, 8 million characters as hex, and reads back an order of magnitude
//! faster). Arrays of numbers, the earlier form, are still read.

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hexadecimal, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    encode_into(bytes, &mut s);
    s
}

/// [`encode`], appended to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
}

/// The bytes of a hexadecimal string (either case); the error names the first bad character.
pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return Err(format!(
            "a hex byte string has an even number of digits, this one {}",
            s.len()
        ));
    }
    let digit = |i: usize| -> Result<u8, String> {
        match s[i] {
            c @ b'0'..=b'9' => Ok(c - b'0'),
            c @ b'a'..=b'f' => Ok(c - b'a' + 10),
            c @ b'A'..=b'F' => Ok(c - b'A' + 10),
            c => Err(format!(
                "character {i} of a hex byte string is {:?}, not a hex digit",
                c as char
            )),
        }
    };
    (0..s.len() / 2)
        .map(|i| Ok((digit(2 * i)? << 4) | digit(2 * i + 1)?))
        .collect()
}

/// `#[serde(with = "crate::hex")]`: write a hex string (in binary formats, the bytes).
pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        s.serialize_str(&encode(bytes))
    } else {
        s.serialize_bytes(bytes)
    }
}

/// `#[serde(with = "crate::hex")]`: read a hex string or an array of byte values (in binary
/// formats, the bytes).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Bytes;
    impl<'de> Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a hex string of bytes or an array of byte values")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            decode(v).map_err(E::custom)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }
    if d.is_human_readable() {
        d.deserialize_any(Bytes)
    } else {
        d.deserialize_byte_buf(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every byte string reads back from its hex form, in either case.
        #[test]
        fn bytes_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let h = encode(&bytes);
            prop_assert_eq!(decode(&h).unwrap(), bytes.clone());
            prop_assert_eq!(decode(&h.to_uppercase()).unwrap(), bytes);
        }

        /// Any string either decodes or is refused with a reason, never a panic.
        #[test]
        fn any_string_decodes_or_is_refused(s in ".{0,40}") {
            if let Err(e) = decode(&s) {
                prop_assert!(e.contains("hex"));
            }
        }
    }

    #[test]
    fn bad_strings_are_named() {
        assert!(decode("abc").unwrap_err().contains("even number"));
        assert!(decode("0g").unwrap_err().contains("character 1"));
    }
}
