//! Tokenizers over tiny hand-built vocabularies, loaded from GGUF bytes built here.

use super::bpe::byte_to_char;
use super::*;

/// A GGUF v3 file with metadata only.
#[derive(Default)]
struct Gguf {
    kv: Vec<u8>,
    n: u64,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

impl Gguf {
    fn key(&mut self, key: &str, ty: u32) -> &mut Vec<u8> {
        self.n += 1;
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&ty.to_le_bytes());
        &mut self.kv
    }

    fn str(mut self, key: &str, v: &str) -> Self {
        put_str(self.key(key, 8), v);
        self
    }

    fn bool(mut self, key: &str, v: bool) -> Self {
        self.key(key, 7).push(v as u8);
        self
    }

    fn u32(mut self, key: &str, v: u32) -> Self {
        self.key(key, 4).extend_from_slice(&v.to_le_bytes());
        self
    }

    fn array(mut self, key: &str, ety: u32, n: usize, items: impl FnOnce(&mut Vec<u8>)) -> Self {
        let buf = self.key(key, 9);
        buf.extend_from_slice(&ety.to_le_bytes());
        buf.extend_from_slice(&(n as u64).to_le_bytes());
        items(buf);
        self
    }

    fn strs(self, key: &str, v: &[String]) -> Self {
        self.array(key, 8, v.len(), |b| v.iter().for_each(|s| put_str(b, s)))
    }

    fn i32s(self, key: &str, v: &[i32]) -> Self {
        self.array(key, 5, v.len(), |b| {
            v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()))
        })
    }

    fn f32s(self, key: &str, v: &[f32]) -> Self {
        self.array(key, 6, v.len(), |b| {
            v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()))
        })
    }

    fn file(self) -> GgufFile {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&self.n.to_le_bytes());
        b.extend_from_slice(&self.kv);
        GgufFile::from_bytes(b).expect("test GGUF parses")
    }

    fn tokenizer(self) -> Result<Tokenizer> {
        Tokenizer::from_gguf(&self.file())
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Byte-level BPE: 4 special tokens, the 256 byte characters, and a few merged pieces.
fn bpe_tokens() -> (Vec<String>, Vec<i32>) {
    let mut tokens = strings(&["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]);
    let mut types = vec![3, 3, 3, 4];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(1);
    }
    for t in ["ab", "Ġa", "Ġab", "cd", "abcd", "xy", "yzw"] {
        tokens.push(t.to_string());
        types.push(1);
    }
    (tokens, types)
}

fn bpe_gguf(tokens: &[String], types: &[i32], pre: &str) -> Gguf {
    let merges = strings(&["a b", "Ġ a", "Ġa b", "c d", "ab cd"]);
    Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", pre)
        .strs("tokenizer.ggml.tokens", tokens)
        .i32s("tokenizer.ggml.token_type", types)
        .strs("tokenizer.ggml.merges", &merges)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
}

fn bpe_vocab() -> (Gguf, Vec<String>) {
    let (tokens, types) = bpe_tokens();
    (bpe_gguf(&tokens, &types, "smollm"), tokens)
}

fn id_of(tokens: &[String], t: &str) -> u32 {
    tokens.iter().position(|x| x == t).unwrap() as u32
}

#[test]
fn bpe_merges_by_rank() {
    let (g, tokens) = bpe_vocab();
    let tok = g.tokenizer().unwrap();
    assert_eq!(tok.kind(), TokenizerKind::Bpe);
    assert_eq!(tok.vocab_size(), tokens.len());
    let id = |t| id_of(&tokens, t);
    // " abcd": (a,b) has rank 0 and wins over (Ġ,a) of rank 1, which then goes stale; "Ġ ab" is
    // no merge, so Ġ stays alone while c+d and then ab+cd merge.
    assert_eq!(
        tok.encode("ab abcd", false, false),
        [id("ab"), id("Ġ"), id("abcd")]
    );
    assert_eq!(tok.encode(" a", false, false), [id("Ġa")]);
    // Digits are split off one by one before the GPT-2 rules.
    assert_eq!(tok.encode("a12", false, false), [id("a"), id("1"), id("2")]);
    assert_eq!(tok.encode("", true, true), Vec::<u32>::new());
    // add_bos_token is absent: BPE adds nothing.
    assert!(!tok.add_bos());
    assert_eq!(tok.encode("a", true, false), [id("a")]);
    assert_eq!(tok.token_str(id("Ġa")), Some("Ġa"));
    assert_eq!(tok.token_id("Ġab"), Some(id("Ġab")));
    assert_eq!(tok.token_id("nope"), None);
}

#[test]
fn bpe_roundtrip_and_bytes() {
    let (g, tokens) = bpe_vocab();
    let tok = g.tokenizer().unwrap();
    for text in [
        "ab abcd",
        "café 日本 😀",
        "tab\tand\r\nnewline  ",
        "I'm ' x",
        "\u{A0}",
    ] {
        let ids = tok.encode(text, false, false);
        assert_eq!(tok.decode(&ids, false), text);
    }
    assert_eq!(tok.token_bytes(id_of(&tokens, "Ġ"), false), b" ");
    assert_eq!(tok.token_bytes(id_of(&tokens, "Ã"), false), [0xC3]);
    assert_eq!(tok.token_bytes(1, false), b"");
    assert_eq!(tok.token_bytes(1, true), b"<|im_start|>");
    assert_eq!(tok.token_bytes(3, false), b"<tool>"); // user-defined: always its text
    assert_eq!(tok.token_bytes(100_000, true), b"");
}

#[test]
fn bpe_special_tokens() {
    let (g, tokens) = bpe_vocab();
    let tok = g.tokenizer().unwrap();
    let id = |t| id_of(&tokens, t);
    let text = "<|im_start|>ab<|im_end|>";
    assert_eq!(tok.encode(text, false, true), [1, id("ab"), 2]);
    let plain = tok.encode(text, false, false);
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain, false), text);
    assert_eq!(tok.decode(&[1, id("ab"), 2], true), text);
    assert_eq!(tok.decode(&[1, id("ab"), 2], false), "ab");
    // User-defined tokens are matched without parse_special.
    assert_eq!(
        tok.encode("x<tool>ab", false, false),
        [id("x"), 3, id("ab")]
    );
    // End of generation: eos, and <|endoftext|>/<|im_end|> by name.
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(tok.is_eog(0) && tok.is_eog(2));
    assert!(!tok.is_eog(1) && !tok.is_eog(id("ab")));
}

#[test]
fn special_tokens_split_longest_first() {
    // "xy" and "yzw" as user-defined tokens: llama.cpp cuts the longer one out of the whole
    // text first, so "xyzw" is x + [yzw], not [xy] + zw.
    let (tokens, mut types) = bpe_tokens();
    types[id_of(&tokens, "xy") as usize] = 4;
    types[id_of(&tokens, "yzw") as usize] = 4;
    let tok = bpe_gguf(&tokens, &types, "smollm").tokenizer().unwrap();
    let id = |t| id_of(&tokens, t);
    assert_eq!(tok.encode("xyzw", false, false), [id("x"), id("yzw")]);
    assert_eq!(tok.encode("xyxy", false, false), [id("xy"), id("xy")]);
}

#[test]
fn llama3_names_bring_their_settings() {
    let (tokens, types) = bpe_tokens();
    let id = |t| id_of(&tokens, t);
    let llama = bpe_gguf(&tokens, &types, "llama-bpe").tokenizer().unwrap();
    let dbrx = bpe_gguf(&tokens, &types, "dbrx").tokenizer().unwrap();
    // Whole-word tokens with ignore_merges (llama-bpe, not dbrx): "xy" is a token no merge
    // builds, and the merges make " ab" Ġ + ab (see bpe_merges_by_rank).
    assert_eq!(llama.encode("xy ab", false, false), [id("xy"), id("Ġab")]);
    assert_eq!(
        dbrx.encode("xy ab", false, false),
        [id("x"), id("y"), id("Ġ"), id("ab")]
    );
    // Llama 3 names add BOS unless add_bos_token says otherwise.
    assert!(llama.add_bos() && !dbrx.add_bos());
    assert_eq!(llama.encode("ab", true, false), [1, id("ab")]);
    let no_bos = bpe_gguf(&tokens, &types, "llama3").bool("tokenizer.ggml.add_bos_token", false);
    assert!(!no_bos.tokenizer().unwrap().add_bos());
    // Numbers: groups of three (Llama 3) or single digits (Qwen2).
    assert_eq!(
        llama.encode("1234", false, false),
        [id("1"), id("2"), id("3"), id("4")]
    );
    let qwen = bpe_gguf(&tokens, &types, "qwen2").tokenizer().unwrap();
    assert_eq!(
        qwen.encode("I'M xy", false, false),
        [id("I"), id("'"), id("M"), id("Ġ"), id("x"), id("y")]
    );
    assert!(!qwen.add_bos());
}

/// SPM: unknown/bos/eos, the 256 byte tokens, then pieces with scores.
fn spm_tokens() -> (Vec<String>, Vec<i32>, Vec<f32>) {
    let mut tokens = strings(&["<unk>", "<s>", "</s>"]);
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -5.0),
        ("a", -5.0),
        ("b", -5.0),
        ("x", -5.0),
        ("y", -5.0),
        ("z", -5.0),
        ("▁a", -2.0),
        ("ab", -1.0),
        ("xy", -3.0),
        ("yz", -3.0),
        ("<start_of_turn>", 0.0),
    ] {
        tokens.push(t.to_string());
        types.push(if t.starts_with('<') { 3 } else { 1 });
        scores.push(s);
    }
    (tokens, types, scores)
}

fn spm_vocab() -> (Gguf, Vec<String>) {
    let (tokens, types, scores) = spm_tokens();
    let g = Gguf::default()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .f32s("tokenizer.ggml.scores", &scores);
    (g, tokens)
}

#[test]
fn spm_merges_by_score() {
    let (g, tokens) = spm_vocab();
    let tok = g
        .bool("tokenizer.ggml.add_space_prefix", false)
        .tokenizer()
        .unwrap();
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    let id = |t| id_of(&tokens, t);
    // "ab" (-1) beats "▁a" (-2); "▁ab" is no token.
    assert_eq!(tok.encode(" ab", false, false), [id("▁"), id("ab")]);
    assert_eq!(tok.encode(" a", false, false), [id("▁a")]);
    // Equal scores: the leftmost pair merges first.
    assert_eq!(tok.encode("xyz", false, false), [id("xy"), id("z")]);
    // Characters without a token fall back to their UTF-8 bytes.
    assert_eq!(tok.encode("é", false, false), [3 + 0xC3, 3 + 0xA9]);
    // SPM defaults: BOS 1, EOS 2, add BOS.
    assert!(tok.add_bos());
    assert_eq!(tok.encode("a", true, false), [1, id("a")]);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(tok.is_eog(2) && !tok.is_eog(1));
    // Control tokens only with parse_special.
    let sot = id("<start_of_turn>");
    assert_eq!(tok.encode("<start_of_turn>a", false, true), [sot, id("a")]);
    assert!(!tok.encode("<start_of_turn>a", false, false).contains(&sot));
    for text in ["ab xyz", " é ", "a  b"] {
        assert_eq!(tok.decode(&tok.encode(text, false, false), false), text);
    }
    assert_eq!(tok.token_bytes(id("▁a"), false), b" a");
    assert_eq!(tok.token_bytes(3 + 0x41, false), b"A");
    assert_eq!(tok.token_bytes(0, false), b"");
    assert_eq!(tok.token_bytes(0, true), b"<unk>");
}

#[test]
fn spm_space_prefix() {
    let (g, tokens) = spm_vocab();
    let tok = g.tokenizer().unwrap(); // add_space_prefix defaults to true for SPM
    let id = |t| id_of(&tokens, t);
    assert_eq!(tok.encode("a", false, false), [id("▁a")]);
    // A raw piece after a special token gets the prefix too.
    assert_eq!(tok.encode("<s>a", false, true), [1, id("▁a")]);
    assert_eq!(tok.decode(&tok.encode("ab", false, false), false), "ab");
}

#[test]
fn metadata_errors() {
    let err = |g: Gguf| g.tokenizer().unwrap_err().to_string();
    assert!(err(Gguf::default()).contains("tokenizer.ggml.model"));
    let e = err(Gguf::default().str("tokenizer.ggml.model", "bert"));
    assert!(e.contains("unsupported tokenizer model \"bert\""), "{e}");
    let (tokens, types) = bpe_tokens();
    let e = err(bpe_gguf(&tokens, &types, "qwen35"));
    assert!(
        e.contains("unsupported pre-tokenizer \"qwen35\"") && e.contains("\"llama-bpe\""),
        "{e}"
    );
    let e = err(Gguf::default()
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "smollm")
        .strs("tokenizer.ggml.tokens", &strings(&["a"])));
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("missing"),
        "{e}"
    );
    let e = err(Gguf::default()
        .str("tokenizer.ggml.model", "llama")
        .i32s("tokenizer.ggml.tokens", &[1, 2]));
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("STRING"),
        "{e}"
    );
    let (tokens, _, _) = spm_tokens();
    let spm = || {
        Gguf::default()
            .str("tokenizer.ggml.model", "llama")
            .strs("tokenizer.ggml.tokens", &tokens)
    };
    let e = err(spm().f32s("tokenizer.ggml.token_type", &vec![1.0; tokens.len()]));
    assert!(
        e.contains("token_type") && e.contains("expected integers"),
        "{e}"
    );
    let e = err(spm().i32s("tokenizer.ggml.token_type", &[1]));
    assert!(
        e.contains("token_type") && e.contains("has 1 elements"),
        "{e}"
    );
    let (g, _) = spm_vocab();
    let e = err(g.str("tokenizer.ggml.add_bos_token", "yes"));
    assert!(e.contains("add_bos_token") && e.contains("BOOL"), "{e}");
}

#[test]
fn byte_value_reads_like_strtol() {
    assert_eq!(byte_value("<0x0A>"), 10);
    assert_eq!(byte_value("<0xff>"), 255);
    assert_eq!(byte_value("<0xZ1>"), 0);
    assert_eq!(byte_value("<0x"), 0);
}
