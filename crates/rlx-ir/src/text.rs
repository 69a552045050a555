//! The IR's text form: it prints ([`Graph`]'s `Display`) and parses ([`Graph::parse`]) back to
//! an equal graph.
//!
//! ```text
//! graph "mlp" {
//!   %0 = input {name = "x"} : f32[2, 3]
//!   %1 = param {name = "w"} : f32[3, 4]
//!   %2 = matmul %0, %1 : f32[2, 4]
//!   %3 = reduce %2 {kind = sum, axes = [1], keepdims = false} : f32[2]
//!   return %3
//! }
//! ```
//!
//! Each node is `%id = op operands {attributes} : shape`. Node names are any `%` word, bound in
//! order of definition (the printer numbers them). Attribute values are integers, floats (Rust's
//! shortest round-trip form, `inf` and `NaN` included), `true`/`false`, strings, words
//! (`sum`, `none`), tagged values (`sliding_window(16)`), lists `[..]`, byte strings `0x..` and
//! nested graphs. Which attributes an op has is its family file's business (`ops::attrs` and
//! `ops::from_attrs`); this module only reads and writes the syntax.

use crate::{ops, DType, Dim, Error, Graph, NodeId, OpKind, Result, Shape};
use std::collections::HashMap;
use std::fmt::{self, Write};

/// One attribute value of the text form.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A non-negative integer.
    Int(u64),
    /// A negative integer, `-v` (`v > 0`; zero and positive values are [`Attr::Int`]).
    NegInt(u64),
    /// A float.
    Float(f32),
    /// `true` / `false`.
    Bool(bool),
    /// A quoted string.
    Str(String),
    /// A bare word naming an enum value (`sum`, `causal`, `none`).
    Word(String),
    /// A word with an argument, `word(arg)`.
    Tagged(String, Box<Attr>),
    /// `[a, b, ...]`
    List(Vec<Attr>),
    /// Raw bytes, `0x0a1b..`.
    Bytes(Vec<u8>),
    /// A nested graph.
    Graph(Box<Graph>),
}

impl From<usize> for Attr {
    fn from(v: usize) -> Attr {
        Attr::Int(v as u64)
    }
}

impl From<i64> for Attr {
    fn from(v: i64) -> Attr {
        if v < 0 {
            Attr::NegInt(v.unsigned_abs())
        } else {
            Attr::Int(v as u64)
        }
    }
}

impl From<f32> for Attr {
    fn from(v: f32) -> Attr {
        Attr::Float(v)
    }
}

impl From<bool> for Attr {
    fn from(v: bool) -> Attr {
        Attr::Bool(v)
    }
}

impl From<&[usize]> for Attr {
    fn from(v: &[usize]) -> Attr {
        Attr::List(v.iter().map(|&x| Attr::from(x)).collect())
    }
}

impl From<Option<usize>> for Attr {
    fn from(v: Option<usize>) -> Attr {
        v.map_or(Attr::word("none"), Attr::from)
    }
}

impl Attr {
    /// A bare word.
    pub fn word(w: &str) -> Attr {
        Attr::Word(w.to_string())
    }

    /// `(low, high)` pairs as a list of two-element lists.
    pub fn pairs(v: &[(usize, usize)]) -> Attr {
        Attr::List(
            v.iter()
                .map(|&(a, b)| Attr::List(vec![a.into(), b.into()]))
                .collect(),
        )
    }

    fn write(&self, out: &mut String, indent: usize) {
        match self {
            Attr::Int(v) => push_int(out, *v),
            Attr::NegInt(v) => {
                out.push('-');
                push_int(out, *v);
            }
            // Debug is the shortest form that reads back to the same f32 (`1e-5`, `10000.0`).
            Attr::Float(v) => {
                let _ = write!(out, "{v:?}");
            }
            Attr::Bool(v) => out.push_str(if *v { "true" } else { "false" }),
            // Names are plain ASCII almost always: quoted as they are, else escaped by Debug.
            Attr::Str(s)
                if s.bytes()
                    .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\') =>
            {
                out.push('"');
                out.push_str(s);
                out.push('"');
            }
            Attr::Str(s) => {
                let _ = write!(out, "{s:?}");
            }
            Attr::Word(w) => out.push_str(w),
            Attr::Tagged(w, a) => {
                out.push_str(w);
                out.push('(');
                a.write(out, indent);
                out.push(')');
            }
            Attr::List(items) => {
                out.push('[');
                for (i, a) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    a.write(out, indent);
                }
                out.push(']');
            }
            Attr::Bytes(b) => {
                out.push_str("0x");
                crate::hex::encode_into(b, out);
            }
            Attr::Graph(g) => write_graph(out, g, indent),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) | Attr::NegInt(_) => "an integer",
            Attr::Float(_) => "a float",
            Attr::Bool(_) => "true or false",
            Attr::Str(_) => "a string",
            Attr::Word(_) => "a word",
            Attr::Tagged(..) => "a tagged value",
            Attr::List(_) => "a list",
            Attr::Bytes(_) => "bytes",
            Attr::Graph(_) => "a graph",
        }
    }
}

/// The attributes of one node being parsed; the op's family file takes them by name. Taking a
/// missing attribute, a value of the wrong kind, or leaving one untaken is an error naming the op.
pub struct Attrs {
    op: &'static str,
    items: Vec<(String, Attr)>,
}

impl Attrs {
    /// Attributes `items` of an op named `op`.
    pub fn new(op: &'static str, items: Vec<(String, Attr)>) -> Attrs {
        Attrs { op, items }
    }

    fn bad(&self, key: &str, want: &str, got: &Attr) -> Error {
        Error::op(
            self.op,
            format!("attribute `{key}` must be {want}, got {}", got.kind()),
        )
    }

    /// Remove and return attribute `key`.
    pub fn take(&mut self, key: &str) -> Result<Attr> {
        let i = self
            .items
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| Error::op(self.op, format!("missing attribute `{key}`")))?;
        Ok(self.items.remove(i).1)
    }

    /// An integer attribute.
    pub fn usize(&mut self, key: &str) -> Result<usize> {
        let a = self.take(key)?;
        self.as_usize(key, &a)
    }

    /// A signed integer.
    pub fn i64(&mut self, key: &str) -> Result<i64> {
        match self.take(key)? {
            Attr::Int(v) => i64::try_from(v).map_err(|_| {
                Error::op(self.op, format!("attribute `{key}` = {v} does not fit i64"))
            }),
            Attr::NegInt(v) => 0i64.checked_sub_unsigned(v).ok_or_else(|| {
                Error::op(
                    self.op,
                    format!("attribute `{key}` = -{v} does not fit i64"),
                )
            }),
            other => Err(self.bad(key, "an integer", &other)),
        }
    }

    fn as_usize(&self, key: &str, a: &Attr) -> Result<usize> {
        match a {
            Attr::Int(v) => usize::try_from(*v).map_err(|_| {
                Error::op(
                    self.op,
                    format!("attribute `{key}` = {v} does not fit usize"),
                )
            }),
            other => Err(self.bad(key, "an integer", other)),
        }
    }

    /// An integer attribute that may be left out (then `default`).
    pub fn usize_or(&mut self, key: &str, default: usize) -> Result<usize> {
        if self.items.iter().any(|(k, _)| k == key) {
            self.usize(key)
        } else {
            Ok(default)
        }
    }

    /// An integer or `none`.
    pub fn opt_usize(&mut self, key: &str) -> Result<Option<usize>> {
        match self.take(key)? {
            Attr::Word(w) if w == "none" => Ok(None),
            a => self.as_usize(key, &a).map(Some),
        }
    }

    /// A list of integers.
    pub fn usizes(&mut self, key: &str) -> Result<Vec<usize>> {
        match self.take(key)? {
            Attr::List(items) => items.iter().map(|a| self.as_usize(key, a)).collect(),
            other => Err(self.bad(key, "a list of integers", &other)),
        }
    }

    /// A list of `[low, high]` pairs.
    pub fn pairs(&mut self, key: &str) -> Result<Vec<(usize, usize)>> {
        match self.take(key)? {
            Attr::List(items) => items
                .iter()
                .map(|p| match p {
                    Attr::List(ab) if ab.len() == 2 => {
                        Ok((self.as_usize(key, &ab[0])?, self.as_usize(key, &ab[1])?))
                    }
                    other => Err(self.bad(key, "a list of [low, high] pairs", other)),
                })
                .collect(),
            other => Err(self.bad(key, "a list of [low, high] pairs", &other)),
        }
    }

    /// A float (an integer is accepted too).
    pub fn f32(&mut self, key: &str) -> Result<f32> {
        match self.take(key)? {
            Attr::Float(v) => Ok(v),
            Attr::Int(v) => Ok(v as f32),
            other => Err(self.bad(key, "a float", &other)),
        }
    }

    /// `true` or `false`.
    pub fn bool(&mut self, key: &str) -> Result<bool> {
        match self.take(key)? {
            Attr::Bool(v) => Ok(v),
            other => Err(self.bad(key, "true or false", &other)),
        }
    }

    /// A quoted string.
    pub fn string(&mut self, key: &str) -> Result<String> {
        match self.take(key)? {
            Attr::Str(v) => Ok(v),
            other => Err(self.bad(key, "a string", &other)),
        }
    }

    /// Raw bytes.
    pub fn bytes(&mut self, key: &str) -> Result<Vec<u8>> {
        match self.take(key)? {
            Attr::Bytes(v) => Ok(v),
            other => Err(self.bad(key, "bytes (0x..)", &other)),
        }
    }

    /// A graph, or `none` when `optional`.
    pub fn graph(&mut self, key: &str, optional: bool) -> Result<Option<Graph>> {
        match self.take(key)? {
            Attr::Graph(g) => Ok(Some(*g)),
            Attr::Word(w) if optional && w == "none" => Ok(None),
            other => Err(self.bad(
                key,
                if optional {
                    "a graph or none"
                } else {
                    "a graph"
                },
                &other,
            )),
        }
    }

    /// A word, mapped by `pick` (whose `None` is an error listing `choices`).
    pub fn word<T>(
        &mut self,
        key: &str,
        choices: &str,
        pick: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T> {
        match self.take(key)? {
            Attr::Word(w) => pick(&w).ok_or_else(|| {
                Error::op(
                    self.op,
                    format!("attribute `{key}` = {w} is not one of {choices}"),
                )
            }),
            other => Err(self.bad(key, &format!("one of {choices}"), &other)),
        }
    }

    /// A dtype name.
    pub fn dtype(&mut self, key: &str) -> Result<DType> {
        self.word(key, "the dtype names (f32, i8, ...)", DType::from_name)
    }

    /// Fails on any attribute no one took.
    pub fn finish(self) -> Result<()> {
        match self.items.first() {
            None => Ok(()),
            Some((k, _)) => Err(Error::op(self.op, format!("unknown attribute `{k}`"))),
        }
    }
}

/// `{k = v, ...}`
fn write_attrs(out: &mut String, attrs: &[(&str, Attr)], indent: usize) {
    out.push('{');
    for (i, (k, a)) in attrs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push_str(" = ");
        a.write(out, indent);
    }
    out.push('}');
}

/// Attributes written as in the text form, `{axis = 0}`; empty when there are none.
pub(crate) fn attrs_text(attrs: &[(&str, Attr)]) -> String {
    let mut out = String::new();
    if !attrs.is_empty() {
        write_attrs(&mut out, attrs, 0);
    }
    out
}

/// Attributes from text written as [`attrs_text`] writes them (empty text: none).
pub(crate) fn parse_attrs(text: &str) -> Result<Vec<(String, Attr)>> {
    let mut p = Parser { src: text, pos: 0 };
    let items = p.attr_list()?;
    p.skip_space();
    if p.pos != text.len() {
        return Err(p.err("unexpected text after the attributes"));
    }
    Ok(items)
}

/// `v` in decimal, appended to `out` (the text form writes thousands of ids and dims; this
/// skips the formatting machinery).
fn push_int(out: &mut String, mut v: u64) {
    if v < 10 {
        out.push((b'0' + v as u8) as char);
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // Decimal digits are ASCII, so each byte is a char.
    out.extend(buf[i..].iter().map(|&b| b as char));
}

/// A node reference, `%7`.
fn push_id(out: &mut String, id: NodeId) {
    out.push('%');
    push_int(out, id.0 as u64);
}

/// A shape as its `Display` writes it, `f32[2, ?n]`.
fn push_shape(out: &mut String, s: &Shape) {
    out.push_str(s.dtype().name());
    out.push('[');
    for (i, d) in s.dims().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        match d {
            Dim::Static(n) => push_int(out, *n as u64),
            Dim::Dynamic(_) => {
                let _ = write!(out, "{d}");
            }
        }
    }
    out.push(']');
}

fn write_graph(out: &mut String, g: &Graph, indent: usize) {
    let pad = "  ".repeat(indent + 1);
    let _ = writeln!(out, "graph {:?} {{", g.name());
    for id in g.ids() {
        let n = g.node(id);
        out.push_str(&pad);
        push_id(out, id);
        out.push_str(" = ");
        out.push_str(n.op.name());
        for (i, &x) in n.inputs.iter().enumerate() {
            out.push_str(if i == 0 { " " } else { ", " });
            push_id(out, x);
        }
        let attrs = ops::attrs(&n.op);
        if !attrs.is_empty() {
            out.push(' ');
            write_attrs(out, &attrs, indent + 1);
        }
        out.push_str(" : ");
        push_shape(out, &n.shape);
        out.push('\n');
    }
    let outs: Vec<String> = g.outputs().iter().map(|o| o.to_string()).collect();
    let _ = writeln!(out, "{pad}return {}", outs.join(", "));
    let _ = write!(out, "{}}}", "  ".repeat(indent));
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl Graph {
    /// The text form (what `Display` writes), made in one buffer sized for the graph rather
    /// than through a formatter: the compile cache writes it for every compile's key.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(64 * self.len() + 64);
        write_graph(&mut s, self, 0);
        s
    }

    /// Parse the text form (see [`crate::text`]) and verify the graph. Errors give the line and
    /// column, and the verifier's findings for a graph that reads but is inconsistent.
    pub fn parse(text: &str) -> Result<Graph> {
        let g = Graph::parse_unverified(text)?;
        crate::verify(&g)?;
        Ok(g)
    }

    /// Parse the text form without verifying the graph (a tool showing a broken graph, a test of
    /// the verifier). Operands must still be defined before their use.
    pub fn parse_unverified(text: &str) -> Result<Graph> {
        let mut p = Parser { src: text, pos: 0 };
        let g = p.graph()?;
        p.skip_space();
        if p.pos < p.src.len() {
            return Err(p.err("text after the graph's closing brace"));
        }
        Ok(g)
    }
}

impl std::str::FromStr for Graph {
    type Err = Error;
    fn from_str(s: &str) -> Result<Graph> {
        Graph::parse(s)
    }
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, msg: impl fmt::Display) -> Error {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let col = before
            .rfind('\n')
            .map_or(before.chars().count(), |i| before[i + 1..].chars().count())
            + 1;
        Error::Parse(format!("line {line}, column {col}: {msg}"))
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    /// Skips whitespace and `;` / `#` comments to the end of the line.
    fn skip_space(&mut self) {
        loop {
            let r = self.rest();
            let t = r.trim_start();
            self.pos += r.len() - t.len();
            if t.starts_with(';') || t.starts_with('#') {
                self.pos += t.find('\n').unwrap_or(t.len());
            } else {
                return;
            }
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.rest().chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            let got = self
                .peek()
                .map_or("the end of the text".to_string(), |g| format!("`{g}`"));
            Err(self.err(format!("expected `{c}`, found {got}")))
        }
    }

    /// A run of word characters (letters, digits, `_`, `.`, `-`, `+`).
    fn word(&mut self) -> Result<&'a str> {
        self.skip_space();
        let r = self.rest();
        let len = r
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+')))
            .unwrap_or(r.len());
        if len == 0 {
            return Err(self.err("expected a word"));
        }
        let start = self.pos;
        self.pos += len;
        Ok(&self.src[start..start + len])
    }

    fn keyword(&mut self, k: &str) -> Result<()> {
        let at = self.pos;
        let w = self.word()?;
        if w == k {
            Ok(())
        } else {
            let w = w.to_string();
            self.pos = at;
            Err(self.err(format!("expected `{k}`, found `{w}`")))
        }
    }

    fn string(&mut self) -> Result<String> {
        self.expect('"')?;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => {
                    let e = chars.next().map(|x| x.1);
                    out.push(match e {
                        Some('n') => '\n',
                        Some('r') => '\r',
                        Some('t') => '\t',
                        Some('0') => '\0',
                        Some(q @ ('\\' | '"' | '\'')) => q,
                        Some('u') => {
                            let body: String = chars
                                .by_ref()
                                .map(|x| x.1)
                                .take_while(|&c| c != '}')
                                .collect();
                            let hex = body.strip_prefix('{').unwrap_or("");
                            u32::from_str_radix(hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .ok_or_else(|| self.err(format!("bad escape \\u{body}}}")))?
                        }
                        other => {
                            return Err(self.err(format!(
                                "unknown escape \\{}",
                                other.map_or(String::new(), String::from)
                            )))
                        }
                    });
                }
                c => out.push(c),
            }
        }
        Err(self.err("string not closed"))
    }

    /// `%name`
    fn node_name(&mut self) -> Result<String> {
        self.expect('%')?;
        let r = self.rest();
        let len = r
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(r.len());
        if len == 0 {
            return Err(self.err("expected a node name after `%`"));
        }
        self.pos += len;
        Ok(r[..len].to_string())
    }

    fn number(&mut self, w: &str) -> Result<Attr> {
        if w.bytes().all(|b| b.is_ascii_digit()) {
            return w
                .parse()
                .map(Attr::Int)
                .map_err(|_| self.err(format!("integer {w} is too large")));
        }
        if let Some(m) = w.strip_prefix('-') {
            if !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()) {
                return match m.parse::<u64>() {
                    Ok(0) => Ok(Attr::Int(0)),
                    Ok(v) => Ok(Attr::NegInt(v)),
                    Err(_) => Err(self.err(format!("integer {w} is too large"))),
                };
            }
        }
        w.parse::<f32>()
            .map(Attr::Float)
            .map_err(|_| self.err(format!("`{w}` is not a number")))
    }

    /// An optional `{key = value, ...}` list.
    fn attr_list(&mut self) -> Result<Vec<(String, Attr)>> {
        let mut items = Vec::new();
        if self.eat('{') && !self.eat('}') {
            loop {
                let key = self.word()?.to_string();
                self.expect('=')?;
                items.push((key, self.attr()?));
                if self.eat('}') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(items)
    }

    fn attr(&mut self) -> Result<Attr> {
        match self.peek() {
            Some('"') => return self.string().map(Attr::Str),
            Some('[') => {
                self.pos += 1;
                let mut items = Vec::new();
                if !self.eat(']') {
                    loop {
                        items.push(self.attr()?);
                        if self.eat(']') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
                return Ok(Attr::List(items));
            }
            None => return Err(self.err("expected a value, found the end of the text")),
            _ => {}
        }
        let at = self.pos;
        let w = self.word()?.to_string();
        Ok(match w.as_str() {
            "true" => Attr::Bool(true),
            "false" => Attr::Bool(false),
            "inf" | "-inf" | "NaN" => self.number(&w)?,
            "graph" => {
                self.pos = at;
                Attr::Graph(Box::new(self.graph()?))
            }
            _ if w.starts_with("0x") => {
                let hex = &w[2..];
                if hex.len() % 2 != 0 {
                    return Err(self.err("a byte string needs an even number of hex digits"));
                }
                let bytes: Option<Vec<u8>> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect();
                Attr::Bytes(
                    bytes.ok_or_else(|| self.err(format!("`{w}` is not a hex byte string")))?,
                )
            }
            _ if w
                .starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.') =>
            {
                self.number(&w)?
            }
            _ if self.eat('(') => {
                let inner = self.attr()?;
                self.expect(')')?;
                Attr::Tagged(w, Box::new(inner))
            }
            _ => Attr::Word(w),
        })
    }

    fn shape(&mut self) -> Result<Shape> {
        let at = self.pos;
        let name = self.word()?.to_string();
        let dtype = DType::from_name(&name).ok_or_else(|| {
            self.pos = at;
            self.err(format!("`{name}` is not a dtype"))
        })?;
        self.expect('[')?;
        let mut dims = Vec::new();
        if !self.eat(']') {
            loop {
                if self.eat('?') {
                    dims.push(Dim::Dynamic(self.word()?.to_string()));
                } else {
                    let w = self.word()?.to_string();
                    dims.push(Dim::Static(
                        w.parse()
                            .map_err(|_| self.err(format!("`{w}` is not a dimension")))?,
                    ));
                }
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(Shape::with_dims(dims, dtype))
    }

    /// `%a, %b, ...` (possibly none), each defined earlier.
    fn node_list(&mut self, names: &HashMap<String, NodeId>) -> Result<Vec<NodeId>> {
        let mut ids = Vec::new();
        if self.peek() == Some('%') {
            loop {
                let n = self.node_name()?;
                ids.push(
                    *names
                        .get(&n)
                        .ok_or_else(|| self.err(format!("%{n} is not defined before this use")))?,
                );
                if !self.eat(',') {
                    break;
                }
            }
        }
        Ok(ids)
    }

    fn graph(&mut self) -> Result<Graph> {
        self.keyword("graph")?;
        let name = self.string()?;
        self.expect('{')?;
        let mut g = Graph::new(&name);
        let mut names: HashMap<String, NodeId> = HashMap::new();
        loop {
            if self.peek() == Some('%') {
                let at = self.pos;
                let id = self.node_name()?;
                if names.contains_key(&id) {
                    self.pos = at;
                    return Err(self.err(format!("%{id} is defined twice")));
                }
                self.expect('=')?;
                let at = self.pos;
                let op_name = self.word()?.to_string();
                let kind = OpKind::from_name(&op_name).ok_or_else(|| {
                    self.pos = at;
                    self.err(format!("unknown op `{op_name}`"))
                })?;
                let inputs = self.node_list(&names)?;
                let items = self.attr_list()?;
                let at_attrs = self.pos;
                let op = ops::from_attrs(kind, Attrs::new(kind.name(), items)).map_err(|e| {
                    self.pos = at_attrs;
                    self.err(e)
                })?;
                self.expect(':')?;
                let shape = self.shape()?;
                names.insert(id, g.push_unchecked(op, inputs, shape));
            } else {
                self.keyword("return")?;
                let outs = self.node_list(&names)?;
                g.set_outputs_unchecked(outs);
                self.expect('}')?;
                return Ok(g);
            }
        }
    }
}
