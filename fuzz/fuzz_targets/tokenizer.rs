//! Arbitrary text through the tokenizers of the two default models (byte-level BPE with
//! SmolLM2's pre-tokenizer, SentencePiece with Gemma 3's vocabulary): encoding must not panic,
//! every id must be in the vocabulary, and for byte-level BPE without special-token parsing,
//! decoding must give the text back byte for byte — except bytes the vocabulary has no token
//! for, which llama.cpp drops too (SmolLM2 has none for a few control bytes, e.g. 0x13).
//!
//! The model files come from `RLX_SMOLLM2_GGUF` / `RLX_GEMMA3_GGUF`, else from the cache
//! `rlx fetch smollm2` / `rlx fetch gemma3` fill (`$RLX_CACHE_DIR`, default `~/.cache/rlx`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_gguf::{GgufFile, Tokenizer};
use std::sync::OnceLock;

fn load(env: &str, file: &str) -> Tokenizer {
    let path = std::env::var(env).unwrap_or_else(|_| {
        let cache = std::env::var("RLX_CACHE_DIR").unwrap_or_else(|_| format!("{}/.cache/rlx", std::env::var("HOME").unwrap_or_default()));
        format!("{cache}/{file}")
    });
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e} (fetch the model first: rlx fetch)"));
    Tokenizer::from_gguf(&f).expect("tokenizer")
}

/// The bytes that are a token of their own in the BPE vocabulary.
fn byte_tokens() -> &'static [bool; 256] {
    static B: OnceLock<[bool; 256]> = OnceLock::new();
    B.get_or_init(|| {
        let tok = &tokenizers()[0];
        let mut has = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if let [b] = tok.token_bytes(id, false)[..] {
                has[b as usize] = true;
            }
        }
        has
    })
}

fn tokenizers() -> &'static [Tokenizer; 2] {
    static T: OnceLock<[Tokenizer; 2]> = OnceLock::new();
    T.get_or_init(|| {
        [
            load("RLX_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            load("RLX_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let (which, special) = ((mode & 1) as usize, mode & 2 != 0);
    let tok = &tokenizers()[which];
    let ids = tok.encode(&text, mode & 4 != 0, special);
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()), "id out of range");
    let back = tok.decode(&ids, false);
    if which == 0 && !special && mode & 4 == 0 {
        let kept: Vec<u8> = text.bytes().filter(|&b| byte_tokens()[b as usize]).collect();
        // `decode` returns a String: a multi-byte character that lost a byte reads as U+FFFD.
        assert_eq!(back, String::from_utf8_lossy(&kept), "BPE round trip");
    }
});
