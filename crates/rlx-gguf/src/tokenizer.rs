//! The tokenizer stored in GGUF metadata (`tokenizer.ggml.*`), producing the same ids as
//! llama.cpp's `llama_tokenize`.
//!
//! Two vocabulary types are supported:
//!
//! * [`TokenizerKind::Bpe`] — `tokenizer.ggml.model = "gpt2"`: byte-level BPE with ranked merges
//!   (`tokenizer.ggml.merges`) and a pre-tokenizer chosen by `tokenizer.ggml.pre`: the GPT-2
//!   rules (`gpt-2`, `olmo`, …), optionally preceded by splitting off every digit (`smollm`,
//!   `starcoder`, …); Llama 3's rules (`llama3`/`llama-bpe`, `falcon3`, `pixtral`, `dbrx`,
//!   `glm4`, …: case-insensitive contractions, numbers in groups of up to three, punctuation
//!   runs keeping their trailing newlines); and Qwen2's (`qwen2`, `deepseek-r1-qwen`,
//!   `stablelm2`, …: Llama 3's with single-digit numbers). The settings llama.cpp ties to some
//!   names come along (Llama 3's BOS by default and whole-word tokens that skip the merges).
//! * [`TokenizerKind::Spm`] — `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE over
//!   token scores with `<0xXX>` byte fallback (Llama 1/2, Gemma, …).
//!
//! Encoding follows llama.cpp step by step: special tokens are cut out of the text first
//! (`tokenizer_st_partition`: the longest special token first, each over every remaining piece
//! of raw text; control tokens only when `parse_special`, user-defined tokens always), then
//! each raw piece is tokenized on its own, and BOS/EOS are added when `add_special` and the
//! model asks for them. Token attributes are derived as llama.cpp's loader derives them,
//! including its name-based fix-ups (end-of-generation tokens such as `<|im_end|>` become
//! control tokens, control tokens named `…unused…` are marked unused, and so on).
//!
//! ```no_run
//! let f = rlx_gguf::GgufFile::open("model.gguf")?;
//! let tok = rlx_gguf::Tokenizer::from_gguf(&f)?;
//! // A prompt as llama.cpp would feed it: BOS if the model wants one, special tokens parsed.
//! let prompt = tok.encode("<|im_start|>user\nHi<|im_end|>", true, true);
//! // Plain text: special-token strings in it are tokenized as ordinary text.
//! let ids = tok.encode("Hello world", false, false);
//! assert_eq!(tok.decode(&ids, false), "Hello world");
//! // Generation stops at any end-of-generation token (EOS, <|im_end|>, <end_of_turn>, …).
//! let stop = prompt.iter().any(|&id| tok.is_eog(id));
//! # Ok::<(), rlx_gguf::GgufError>(())
//! ```

pub(crate) mod bpe;
mod merge;
mod spm;
mod unicode;
mod unicode_data;

use crate::error::{GgufError, Result};
use crate::reader::{GgufFile, Value};
use bpe::{PreConfig, PreTokenizer};
use std::collections::{BTreeSet, HashMap};

/// The vocabulary type of a GGUF tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// Byte-level BPE with ranked merges (`tokenizer.ggml.model = "gpt2"`).
    Bpe,
    /// SentencePiece-style BPE over scores with byte fallback (`tokenizer.ggml.model = "llama"`).
    Spm,
}

/// Token attributes, as llama.cpp's `llama_token_attr` bits.
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;

    /// The attribute of a `tokenizer.ggml.token_type` value (0 = undefined gives no bits).
    pub fn from_type(t: i128) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// Texts llama.cpp treats as end-of-generation tokens when present (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts llama.cpp takes as the end-of-turn token when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle tokens llama.cpp recognises by text: (metadata key, texts). The pad,
/// repo and file-separator ones also end generation.
const FIM_TEXTS: &[(&str, &[&str])] = &[
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// A tokenizer loaded from GGUF metadata; see the [module docs](self).
#[derive(Clone)]
pub struct Tokenizer {
    kind: TokenizerKind,
    /// The word splitter and its settings (BPE only).
    pre: Option<PreConfig>,
    /// Token texts by id (an empty text is stored as `[EMPTY_<id>]`, as llama.cpp does).
    tokens: Vec<String>,
    /// SPM merge scores by id (zeros when the file has none).
    scores: Vec<f32>,
    /// `attr` bits by id.
    attrs: Vec<u16>,
    token_to_id: HashMap<String, u32>,
    /// BPE merge ranks keyed by [`bpe::merge_key`].
    merges: HashMap<Vec<u8>, u32>,
    /// SPM byte-fallback token of every byte (`<0xXX>`, else the one-byte token).
    byte_tokens: Vec<Option<u32>>,
    /// Control, user-defined and unknown tokens, longest text first (ties by id).
    special: Vec<u32>,
    /// A byte trie over the texts of `special`, to find which occur in a text.
    trie: Trie,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: BTreeSet<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("pre", &self.pre)
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("special_tokens", &self.special.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

/// The error-message field name of metadata key `key`.
fn field(key: &str) -> String {
    format!("metadata[\"{key}\"]")
}

fn offset_of(f: &GgufFile, key: &str) -> u64 {
    f.entry(key).map_or(0, |e| e.offset)
}

/// An optional boolean key (an error if present with another type).
fn opt_bool(f: &GgufFile, key: &str) -> Result<Option<bool>> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(GgufError::new(
            offset_of(f, key),
            field(key),
            format!("expected BOOL, found {}", v.type_name()),
        )),
    }
}

/// An optional string key (an error if present with another type).
fn opt_str<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a str>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| {
            GgufError::new(
                offset_of(f, key),
                field(key),
                format!("expected STRING, found {}", v.type_name()),
            )
        }),
    }
}

/// An optional array key of at least `min_len` elements, each converted by `conv`.
fn opt_array<T>(
    f: &GgufFile,
    key: &str,
    min_len: usize,
    want: &str,
    conv: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    let Some(v) = f.get(key) else { return Ok(None) };
    let err = |msg: String| GgufError::new(offset_of(f, key), field(key), msg);
    let items = v.as_array().ok_or_else(|| {
        err(format!(
            "expected an ARRAY of {want}, found {}",
            v.type_name()
        ))
    })?;
    if items.len() < min_len {
        return Err(err(format!(
            "has {} elements but the vocabulary has {min_len} tokens",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            conv(x).ok_or_else(|| err(format!("element {i} is {}, expected {want}", x.type_name())))
        })
        .collect::<Result<Vec<T>>>()
        .map(Some)
}

impl Tokenizer {
    /// Load the tokenizer from `f`'s `tokenizer.ggml.*` metadata.
    ///
    /// Fails with a [`GgufError`] naming the key when a required key (`model`, `tokens`, and for
    /// BPE `merges`) is missing or a key has the wrong type, and when the model or its
    /// pre-tokenizer is one RLX does not implement.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        const MODEL: &str = "tokenizer.ggml.model";
        const PRE: &str = "tokenizer.ggml.pre";
        const TOKENS: &str = "tokenizer.ggml.tokens";
        let model = f.get_str(MODEL)?;
        let kind = match model {
            "gpt2" => TokenizerKind::Bpe,
            "llama" => TokenizerKind::Spm,
            other => {
                return Err(GgufError::new(
                    offset_of(f, MODEL),
                    field(MODEL),
                    format!("unsupported tokenizer model {other:?} (RLX supports \"gpt2\" byte-level BPE and \"llama\" SentencePiece)"),
                ))
            }
        };
        let pre_name = opt_str(f, PRE)?;
        let pre = match kind {
            TokenizerKind::Spm => None,
            TokenizerKind::Bpe => {
                let name = pre_name.ok_or_else(|| {
                    GgufError::new(0, field(PRE), "missing: a \"gpt2\" vocabulary needs its pre-tokenizer type (llama.cpp's \"default\" fallback is not supported)")
                })?;
                Some(PreConfig::from_name(name).ok_or_else(|| {
                    GgufError::new(
                        offset_of(f, PRE),
                        field(PRE),
                        format!(
                            "unsupported pre-tokenizer {name:?} (RLX implements the GPT-2 rules: \"gpt-2\", \"smollm\", \"starcoder\", \"olmo\", …; \
                             Llama 3's: \"llama3\", \"llama-bpe\", \"falcon3\", \"pixtral\", \"dbrx\", \"glm4\", …; \
                             Qwen2's: \"qwen2\", \"deepseek-r1-qwen\", \"stablelm2\", \"megrez\", …)"
                        ),
                    )
                })?)
            }
        };

        // Vocabulary.
        let raw = f.get_array(TOKENS)?;
        if raw.is_empty() || raw.len() > u32::MAX as usize {
            return Err(GgufError::new(
                offset_of(f, TOKENS),
                field(TOKENS),
                format!("{} tokens is not a usable vocabulary", raw.len()),
            ));
        }
        let n = raw.len();
        let mut tokens = Vec::with_capacity(n);
        for (i, v) in raw.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                GgufError::new(
                    offset_of(f, TOKENS),
                    field(TOKENS),
                    format!("element {i} is {}, expected STRING", v.type_name()),
                )
            })?;
            tokens.push(if s.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                s.to_owned()
            });
        }
        let scores = opt_array(f, "tokenizer.ggml.scores", n, "numbers", |v| {
            v.as_f64().map(|x| x as f32)
        })?
        .unwrap_or_else(|| vec![0.0; n]);
        let types = opt_array(f, "tokenizer.ggml.token_type", n, "integers", Value::as_int)?;
        let mut attrs: Vec<u16> = match &types {
            Some(t) => t.iter().take(n).map(|&t| attr::from_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32);
        }

        // Merges (BPE): "first second", split at the first space after the first byte.
        let mut merges = HashMap::new();
        if kind == TokenizerKind::Bpe {
            const MERGES: &str = "tokenizer.ggml.merges";
            let list = opt_array(f, MERGES, 0, "STRING", |v| v.as_str().map(str::to_owned))?
                .ok_or_else(|| {
                    GgufError::new(
                        0,
                        field(MERGES),
                        "missing: a \"gpt2\" vocabulary needs its BPE merges",
                    )
                })?;
            merges.reserve(list.len());
            let mut key = Vec::new();
            for (rank, m) in list.iter().enumerate() {
                let (first, second) = match m.bytes().skip(1).position(|b| b == b' ') {
                    Some(p) => (&m[..p + 1], &m[p + 2..]),
                    None => ("", ""),
                };
                bpe::merge_key(first, second, &mut key);
                // A repeated pair keeps its first (lowest) rank, like llama.cpp's map emplace.
                merges.entry(key.clone()).or_insert(rank as u32);
            }
        }

        // Flags and special ids, with llama.cpp's defaults per vocabulary type.
        let (mut add_bos, mut add_space_prefix) = match kind {
            TokenizerKind::Spm => (true, true),
            TokenizerKind::Bpe => (pre.is_some_and(|p| p.add_bos), false),
        };
        add_space_prefix =
            opt_bool(f, "tokenizer.ggml.add_space_prefix")?.unwrap_or(add_space_prefix);
        add_bos = opt_bool(f, "tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos);
        let add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let special_id = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            let default = default.filter(|&d| (d as usize) < n);
            match f.get(key) {
                None => Ok(default),
                Some(v) => match v.as_int() {
                    // An id outside the vocabulary keeps the default, as in llama.cpp.
                    Some(id) => Ok(usize::try_from(id)
                        .ok()
                        .filter(|&id| id < n)
                        .map(|id| id as u32)
                        .or(default)),
                    None => Err(GgufError::new(
                        offset_of(f, key),
                        field(key),
                        format!("expected an integer token id, found {}", v.type_name()),
                    )),
                },
            }
        };
        let (bos, eos, unk) = match (kind, pre) {
            (TokenizerKind::Spm, _) => (Some(1), Some(2), Some(0)),
            (TokenizerKind::Bpe, Some(p)) if !p.default_bos => (None, Some(11), None),
            (TokenizerKind::Bpe, _) => (Some(11), Some(11), None),
        };
        let bos = special_id("tokenizer.ggml.bos_token_id", bos)?;
        let eos = special_id("tokenizer.ggml.eos_token_id", eos)?;
        let unk = special_id("tokenizer.ggml.unknown_token_id", unk)?;
        let mut eot = special_id("tokenizer.ggml.eot_token_id", None)?;
        let mut eom = special_id("tokenizer.ggml.eom_token_id", None)?;
        let mut fim = Vec::with_capacity(FIM_TEXTS.len());
        for (key, _) in FIM_TEXTS {
            fim.push(special_id(key, None)?);
        }
        // The deprecated prefix/suffix/middle keys override fim_pre/suf/mid when present.
        for (i, key) in [
            "tokenizer.ggml.prefix_token_id",
            "tokenizer.ggml.suffix_token_id",
            "tokenizer.ggml.middle_token_id",
        ]
        .into_iter()
        .enumerate()
        {
            fim[i] = special_id(key, fim[i])?;
        }

        // Tokens recognised by their text (llama.cpp scans its hash map; we scan by id).
        for (id, text) in tokens.iter().enumerate() {
            let id32 = id as u32;
            let mut found = |slot: &mut Option<u32>, texts: &[&str]| {
                if slot.is_none() && texts.contains(&text.as_str()) {
                    *slot = Some(id32);
                    attrs[id] |= attr::CONTROL;
                }
            };
            found(&mut eot, EOT_TEXTS);
            found(&mut eom, &["<|eom_id|>"]);
            for (slot, (_, texts)) in fim.iter_mut().zip(FIM_TEXTS) {
                found(slot, texts);
            }
        }
        for (a, text) in attrs.iter_mut().zip(&tokens) {
            if *a & attr::CONTROL != 0 && text.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        let mut eog: BTreeSet<u32> = fim[3..].iter().flatten().copied().collect();
        for (id, text) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&text.as_str()) {
                eog.insert(id as u32);
                attrs[id] |= attr::CONTROL;
            }
            if matches!(
                text.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[id] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let eog_with = |eog: &BTreeSet<u32>, t: &str| {
            eog.iter().find(|&&id| tokens[id as usize] == t).copied()
        };
        // With <|return|> and <|call|> (or <|calls|> and <|flush|>), <|end|> does not end generation.
        if let Some(end) = eog_with(&eog, "<|end|>") {
            let has = |t| eog_with(&eog, t).is_some();
            if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
                eog.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // Next to <|tool_response> or <|plamo:eos|>, </s> is an ordinary token.
        if let Some(s) = eog_with(&eog, "</s>") {
            if eog_with(&eog, "<|tool_response>").is_some()
                || eog_with(&eog, "<|plamo:eos|>").is_some()
            {
                eog.remove(&s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        // Special tokens, longest first (llama.cpp's sort is unstable; ties go by id here).
        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by(|&a, &b| {
            tokens[b as usize]
                .len()
                .cmp(&tokens[a as usize].len())
                .then(a.cmp(&b))
        });

        // Per-model strip attributes, keyed on names as llama.cpp does.
        let name = opt_str(f, "general.name")?
            .unwrap_or("")
            .to_ascii_lowercase();
        let arch = opt_str(f, "general.architecture")?.unwrap_or("");
        let pre_str = pre_name.unwrap_or("");
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre_str.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|p| arch.contains(p))
        {
            set_attr(&mut attrs, &token_to_id, "<mask>", attr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &id in &special {
                attrs[id as usize] |= attr::RSTRIP;
            }
            set_attr(&mut attrs, &token_to_id, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set_attr(&mut attrs, &token_to_id, t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set_attr(&mut attrs, &token_to_id, "[MASK]", attr::LSTRIP, true);
        }

        let byte_tokens = (0..=255u8)
            .map(|b| {
                token_to_id
                    .get(&format!("<0x{b:02X}>"))
                    .or_else(|| {
                        std::str::from_utf8(&[b])
                            .ok()
                            .and_then(|s| token_to_id.get(s))
                    })
                    .copied()
            })
            .collect();
        let trie = Trie::new(
            special
                .iter()
                .map(|&id| (tokens[id as usize].as_bytes(), id)),
        );
        Ok(Tokenizer {
            kind,
            pre,
            tokens,
            scores,
            attrs,
            token_to_id,
            merges,
            byte_tokens,
            special,
            trie,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
        })
    }

    /// The vocabulary type.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Token ids of `text`, the same as llama.cpp's `llama_tokenize(text, add_special,
    /// parse_special)`.
    ///
    /// `add_special` adds BOS (and EOS) where the model asks for them ([`Tokenizer::add_bos`]);
    /// `parse_special` lets control tokens such as `<|im_start|>` be written in the text.
    /// User-defined tokens are matched in the text either way, as llama.cpp does.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match self.kind {
            TokenizerKind::Spm => {
                let mut session = spm::Session::default();
                let mut buf = String::new();
                let mut prev_special = true;
                for frag in fragments {
                    match frag {
                        Fragment::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[a..b].chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            session.tokenize(self, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            TokenizerKind::Bpe => {
                let pre = self.pre.unwrap_or(PreConfig::plain(PreTokenizer::Gpt2));
                let mut session = bpe::Session::default();
                for frag in fragments {
                    match frag {
                        Fragment::Text(a, b) => session.tokenize(self, pre, &text[a..b], &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Cut the special tokens out of `text` as llama.cpp's `tokenizer_st_partition` does: for
    /// each special token, longest first, split every remaining raw piece at each of its
    /// occurrences, left to right.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = vec![Fragment::Text(0, text.len())];
        // Only tokens that occur somewhere in `text` can split a piece of it.
        let present = self.trie.occurring(text.as_bytes());
        if present.is_empty() {
            return frags;
        }
        let bytes = text.as_bytes();
        let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r');
        for &id in self.special.iter().filter(|id| present.contains(id)) {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = self.tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut start, end) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(found) = text[start..end].find(pat) {
                    let at = start + found;
                    let mut left_end = at;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = at + pat.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_space(bytes[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            frags = next;
        }
        frags
    }

    /// The SPM byte-fallback token of `b` (llama.cpp fails when a vocabulary lacks one; here
    /// the unknown token stands in, if there is one).
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize].or(self.unk)
    }

    /// The bytes token `id` stands for, as llama.cpp's `token_to_piece` gives them: byte-level
    /// BPE text maps back to raw bytes, SPM "▁" becomes a space and `<0xXX>` byte tokens become
    /// that byte. Control and unknown tokens give their text only when `special`; user-defined
    /// tokens always give their text. Unused and undefined tokens (and ids outside the
    /// vocabulary) give nothing.
    pub fn token_bytes(&self, id: u32, special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_token_bytes(id, special, &mut out);
        out
    }

    fn append_token_bytes(&self, id: u32, special: bool, out: &mut Vec<u8>) {
        let Some(text) = self.tokens.get(id as usize) else {
            return;
        };
        let a = self.attrs[id as usize];
        if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            if special {
                out.extend_from_slice(text.as_bytes());
            }
        } else if a & attr::USER_DEFINED != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match self.kind {
                TokenizerKind::Spm => out.extend_from_slice(text.replace('▁', " ").as_bytes()),
                TokenizerKind::Bpe => bpe::decode_text(text, out),
            }
        } else if a & attr::BYTE != 0 {
            out.push(byte_value(text));
        }
    }

    /// The text of `ids`: their [`Tokenizer::token_bytes`] concatenated and read as UTF-8
    /// (invalid sequences become U+FFFD). As llama.cpp's detokenizer does for vocabularies that
    /// prepend a space when encoding (`add_space_prefix`), one leading space of the first token
    /// is dropped; llama.cpp's optional `clean_spaces` rewriting is not applied.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let at = out.len();
            self.append_token_bytes(id, special, &mut out);
            if i == 0 && self.add_space_prefix && out.get(at) == Some(&b' ') {
                out.remove(at);
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The raw vocabulary text of token `id` (byte-level BPE texts are in GPT-2's byte alphabet,
    /// SPM texts use "▁" for spaces).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose raw vocabulary text is `s`.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.token_to_id.get(s).copied()
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether llama.cpp prepends BOS by default for this model (`tokenizer.ggml.add_bos_token`,
    /// else true for SPM and for BPE with a Llama 3 pre-tokenizer name such as `llama-bpe`,
    /// false for other BPE).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` ends generation: EOS, the end-of-turn/end-of-message tokens, and tokens
    /// such as `<|im_end|>`, `<end_of_turn>`, `<|endoftext|>` or `<|eot_id|>` present in the
    /// vocabulary (llama.cpp's `special_eog_ids`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
}

/// Set or clear `bit` on the token whose text is `text`, if there is one.
fn set_attr(attrs: &mut [u16], ids: &HashMap<String, u32>, text: &str, bit: u16, on: bool) {
    if let Some(&id) = ids.get(text) {
        let a = &mut attrs[id as usize];
        *a = if on { *a | bit } else { *a & !bit };
    }
}

/// The byte of a `<0xXX>` token, read as C's `strtol(text[3..5], 16)` reads it.
fn byte_value(text: &str) -> u8 {
    let hex = text.get(3..).unwrap_or("");
    let mut v = 0u32;
    for c in hex.chars().take(2) {
        match c.to_digit(16) {
            Some(d) => v = v * 16 + d,
            None => break,
        }
    }
    v as u8
}

/// A piece of the text being encoded: raw bytes `start..end`, or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// A byte trie over the special tokens' texts.
#[derive(Clone, Debug, Default)]
struct Trie {
    /// Children of each node, sorted by byte.
    children: Vec<Vec<(u8, u32)>>,
    /// The token ending at each node.
    token: Vec<Option<u32>>,
}

impl Trie {
    fn new<'a>(words: impl Iterator<Item = (&'a [u8], u32)>) -> Trie {
        let mut t = Trie {
            children: vec![Vec::new()],
            token: vec![None],
        };
        for (w, id) in words {
            let mut node = 0usize;
            for &b in w {
                node = match t.children[node].binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => t.children[node][i].1 as usize,
                    Err(i) => {
                        let new = t.token.len();
                        t.children.push(Vec::new());
                        t.token.push(None);
                        t.children[node].insert(i, (b, new as u32));
                        new
                    }
                };
            }
            t.token[node].get_or_insert(id);
        }
        t
    }

    /// The tokens occurring anywhere in `text`.
    fn occurring(&self, text: &[u8]) -> BTreeSet<u32> {
        let mut found = BTreeSet::new();
        for start in 0..text.len() {
            let mut node = 0usize;
            for &b in &text[start..] {
                match self.children[node].binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => node = self.children[node][i].1 as usize,
                    Err(_) => break,
                }
                if let Some(id) = self.token[node] {
                    found.insert(id);
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests;
