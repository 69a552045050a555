//! WGSL for every kernel. A shader's source depends only on what it computes (an elementwise
//! region's ops, a reduction's kind), never on shapes or addresses: those are read from the
//! step's words in the meta buffer, so one pipeline serves every step of the same kind.
//!
//! Every value lives in the graph's arena of 32-bit words (`buf`, binding 0) or, for params, in
//! a params buffer (`pbuf`, binding 2) that graphs sharing weights bind together; a word
//! address from `SHARED` (2^31) on is in the params buffer. One word per element: f32
//! bits for f32 (and for f16 / bf16, computed in f32 and rounded to their precision after every
//! op), i32 / u32 as they are, i8 / i16 sign-extended and u8 zero-extended (integer results
//! wrapped to their dtype), bool as 0 / 1; GGUF rows stay packed bytes. A step's meta words are binding 1.
//! Invocations are numbered across a 2-D dispatch (`i = x + y * ROW`), `ROW` elements per row of
//! workgroups, so more than 65535 workgroups fit.

use rlx_ir::{Activation, BinaryOp, CmpOp, DType, Graph, NodeId, Op, ReduceKind};

mod attention;
mod matvec;
pub use attention::{
    attention_decode, attention_scores, attention_values, attention_weights, ATTENTION_STAGE,
    VALUES_WG,
};
pub use matvec::{
    dequant_matvec, group_decoder, matvec_column_loops, matvec_columns, matvec_groups,
    matvec_staged, norm_fuses, MatvecForm, MATVEC_GROUPS, MATVEC_GROUPS_CPU, MATVEC_STAGE,
};

/// Invocations per workgroup of the 1-D kernels.
pub const WG: u32 = 64;
/// Workgroups per dispatch row.
pub const MAX_GROUPS: u32 = 65535;
/// Word addresses from this one on are in the params buffers (see the module docs).
pub const SHARED: usize = 1 << 31;
/// Bytes of one params buffer (a binding no adapter refuses: WebGPU guarantees 128 MiB).
pub const PARAMS_CHUNK: u64 = 1 << 26;
/// Params buffers a graph binds (so at most 384 MiB of params).
pub const PARAMS_CHUNKS: usize = 6;
/// Largest rank the kernels take.
pub const RANK: usize = 6;
/// Bytes of one arena buffer when a graph's arena is larger than one binding may be.
pub const ARENA_CHUNK: u64 = 1 << 26;
/// Word addresses with this bit (below [`SHARED`] or above it) are f16 elements held as 16 bits
/// (see [`Memory::half`]): their index counts halves, not words.
pub const HALF: usize = 1 << 30;

/// What a graph's kernels bind, and so how `rd` / `wr` reach a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Buffers of the arena: one, or several of [`ARENA_CHUNK`] bytes.
    pub arena_chunks: usize,
    /// Whether f16 values are stored as 16 bits (the adapter has `SHADER_F16`): each arena and
    /// params buffer is bound a second time as `array<f16>`, and an address with the [`HALF`]
    /// bit reads and writes it, converting to and from the f32 bits every kernel computes on.
    pub half: bool,
}

/// A buffer a kernel binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The step's meta words.
    Meta,
    /// Arena buffer `c`, as words.
    Arena(usize),
    /// Params buffer `k`, as words.
    Params(usize),
    /// Arena buffer `c`, as f16 halves.
    HalfArena(usize),
    /// Params buffer `k`, as f16 halves.
    HalfParams(usize),
}

impl Memory {
    /// Every binding of group 0 and what it holds, in binding order.
    pub fn bindings(&self) -> Vec<Bound> {
        let mut b = vec![Bound::Arena(0), Bound::Meta];
        b.extend((0..PARAMS_CHUNKS).map(Bound::Params));
        b.extend((1..self.arena_chunks).map(Bound::Arena));
        if self.half {
            b.extend((0..self.arena_chunks).map(Bound::HalfArena));
            b.extend((0..PARAMS_CHUNKS).map(Bound::HalfParams));
        }
        b
    }

    /// The WGSL that declares the bindings and defines `rd(a) -> u32` and `wr(a, v: u32)`.
    fn prelude(&self) -> String {
        let mut s = String::new();
        if self.half {
            s.push_str("enable f16;\n");
        }
        for (k, b) in self.bindings().iter().enumerate() {
            let (name, ty) = match b {
                Bound::Meta => {
                    s.push_str(&format!(
                        "@group(0) @binding({k}) var<storage, read> mt: array<u32>;\n"
                    ));
                    continue;
                }
                Bound::Arena(c) => (format!("a{c}"), "u32"),
                Bound::Params(c) => (format!("p{c}"), "u32"),
                Bound::HalfArena(c) => (format!("ha{c}"), "f16"),
                Bound::HalfParams(c) => (format!("hp{c}"), "f16"),
            };
            s.push_str(&format!(
                "@group(0) @binding({k}) var<storage, read_write> {name}: array<{ty}>;\n"
            ));
        }
        // One access of buffer family `pre` at index `k` (`{}` in `body` stands for it): a
        // switch over `sel` when there are several buffers.
        let access = |pre: &str, n: usize, sel: &str, k: &str, body: &str| -> String {
            if n == 1 {
                return format!("{{ {} }}", body.replace("{}", &format!("{pre}0[{k}]")));
            }
            let cases: String = (0..n)
                .map(|c| {
                    let label = if c + 1 == n {
                        "default".to_string()
                    } else {
                        format!("case {c}u")
                    };
                    format!(
                        "        {label}: {{ {} }}\n",
                        body.replace("{}", &format!("{pre}{c}[{k}]"))
                    )
                })
                .collect();
            format!("{{\n    switch ({sel}) {{\n{cases}    }}\n    }}")
        };
        let family = |arena: &str, params: &str, words: bool, body: &str| -> String {
            // Words: 2^24 a buffer; halves: 2^25 a buffer.
            let (bits, mask) = if words {
                (24, "0xffffffu")
            } else {
                (25, "0x1ffffffu")
            };
            // k: the index without the SHARED and HALF bits; j: its index within its buffer.
            let sel = format!("k >> {bits}u");
            let within = if self.arena_chunks == 1 { "k" } else { "j" };
            format!(
                "    let k = a & 0x3fffffffu;\n    let j = k & {mask};\n    if (a < SHARED) {}\n    {}\n",
                access(arena, self.arena_chunks, &sel, within, body),
                access(params, PARAMS_CHUNKS, &sel, "j", body),
            )
        };
        s.push_str(
            "// Word addresses from SHARED on are in the params buffers (which graphs compiled to share\n\
             // their weights bind together), the others in the graph's own arena; with HALF set they\n\
             // count f16 halves of the same buffers.\n\
             const SHARED: u32 = 0x80000000u;\n",
        );
        // (signature, buffer families, words or halves, body of one access)
        let mut fns = vec![
            ("rdw(a: u32) -> u32", ("a", "p"), true, "return {};"),
            ("wrw(a: u32, v: u32)", ("a", "p"), true, "{} = v; return;"),
        ];
        if self.half {
            fns.push(("rdh(a: u32) -> f32", ("ha", "hp"), false, "return f32({});"));
            fns.push((
                "wrh(a: u32, v: f32)",
                ("ha", "hp"),
                false,
                "{} = f16(v); return;",
            ));
        }
        for (sig, (arena, params), words, body) in fns {
            s.push_str(&format!(
                "fn {sig} {{\n{}}}\n",
                family(arena, params, words, body)
            ));
        }
        if self.half {
            s.push_str(&format!(
                "fn rd(a: u32) -> u32 {{\n    if ((a & {HALF}u) != 0u) {{ return bitcast<u32>(rdh(a)); }}\n    return rdw(a);\n}}\n\
                 fn wr(a: u32, v: u32) {{\n    if ((a & {HALF}u) != 0u) {{ wrh(a, bitcast<f32>(v)); return; }}\n    wrw(a, v);\n}}\n"
            ));
        } else {
            s.push_str(
                "fn rd(a: u32) -> u32 { return rdw(a); }\nfn wr(a: u32, v: u32) { wrw(a, v); }\n",
            );
        }
        s
    }
}

/// `source` (a kernel of this module) for a graph whose memory is `m`: its bindings and the
/// `rd` / `wr` that reach them.
pub fn finish(source: &str, m: &Memory) -> String {
    source.replacen(MEMORY, &m.prelude(), 1)
}

/// Where [`finish`] puts the bindings: the first line of every kernel.
const MEMORY: &str = "// rlx: memory\n";

pub(crate) const HEADER: &str = r#"// rlx: memory
const ROW: u32 = 4194240u; // 65535 workgroups of 64

fn nan_or(a: f32, b: f32, r: f32) -> f32 { return select(r, a + b, a != a || b != b); }
fn rmax(a: f32, b: f32) -> f32 { return nan_or(a, b, max(a, b)); }
fn rmin(a: f32, b: f32) -> f32 { return nan_or(a, b, min(a, b)); }
fn rpow(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (a < 0.0 && floor(b) == b) {
        let r = pow(-a, b);
        return select(r, -r, abs(b) % 2.0 == 1.0);
    }
    return pow(a, b);
}
fn sigm(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
fn rtanh(x: f32) -> f32 { return select(tanh(x), sign(x), abs(x) > 15.0); }
// erfc with fractional error below 1.2e-7 (Numerical Recipes' Chebyshev fit).
fn rerfc(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
    return select(2.0 - r, r, x >= 0.0);
}
fn rerf(x: f32) -> f32 {
    if (abs(x) < 0.5) {
        let x2 = x * x;
        return 1.1283791671 * x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0))))));
    }
    return 1.0 - rerfc(x);
}
fn f16r(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    let a = u & 0x7fffffffu;
    let s = u & 0x80000000u;
    if (a >= 0x7f800000u) { return x; }
    if (a >= 0x477ff000u) { return bitcast<f32>(s | 0x7f800000u); }
    if (a >= 0x38800000u) { return bitcast<f32>(s | ((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u)); }
    let m = round(bitcast<f32>(a) * 16777216.0) * 5.9604644775390625e-8;
    return bitcast<f32>(s | bitcast<u32>(m));
}
fn bf16r(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0u) { return x; }
    return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}
fn ld(k: u32) -> f32 { return bitcast<f32>(rd(k)); }
fn st(k: u32, v: f32) { wr(k, bitcast<u32>(v)); }
fn gelu_u(x: f32) -> f32 { return 0.7978845608 * (x + 0.044715 * x * x * x); }
fn gelu_grad(x: f32) -> f32 {
    let s = sigm(2.0 * gelu_u(x));
    return s * (1.0 + 2.0 * x * (1.0 - s) * 0.7978845608 * (1.0 + 0.134145 * x * x));
}
"#;

/// A kernel of one invocation per `mt[0]` items (numbered `var` across a 2-D dispatch) running
/// `body` (WGSL statements, each line indented by four).
pub(crate) fn one_d(var: &str, body: &str) -> String {
    format!(
        "{HEADER}\n@compute @workgroup_size({WG})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    let {var} = gid.x + gid.y * ROW;\n    if ({var} >= mt[0]) {{ return; }}\n{body}}}\n"
    )
}

/// The WGSL expression of a binary op.
fn binary(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("{a} + {b}"),
        BinaryOp::Sub => format!("{a} - {b}"),
        BinaryOp::Mul => format!("{a} * {b}"),
        BinaryOp::Div => format!("{a} / {b}"),
        BinaryOp::Max => format!("rmax({a}, {b})"),
        BinaryOp::Min => format!("rmin({a}, {b})"),
        BinaryOp::Pow => format!("rpow({a}, {b})"),
    }
}

/// The WGSL expression of an activation.
fn activation(act: Activation, x: &str) -> String {
    match act {
        Activation::Gelu => format!("0.5 * {x} * rerfc(-{x} * 0.70710678118)"),
        // 0.5 x (1 + tanh u) = x sigmoid(2u): no cancellation for negative x.
        Activation::GeluApprox => format!("{x} * sigm(2.0 * gelu_u({x}))"),
        // s (1 + 2 x (1 - s) K0 (1 + 3 K1 x^2)) with s = sigmoid(2u) = (1 + tanh u) / 2, the
        // same value as the tanh form without its cancellation at negative x.
        Activation::GeluApproxGrad => format!("gelu_grad({x})"),
        Activation::Silu => format!("{x} * sigm({x})"),
        Activation::Relu => format!("max({x}, 0.0)"),
        Activation::Sigmoid => format!("sigm({x})"),
        Activation::Tanh => format!("rtanh({x})"),
        Activation::Exp => format!("exp({x})"),
        Activation::Log => format!("log({x})"),
        Activation::Sqrt => format!("sqrt({x})"),
        Activation::Rsqrt => format!("1.0 / sqrt({x})"),
        Activation::Neg => format!("-{x}"),
        Activation::Abs => format!("abs({x})"),
        Activation::Sin => format!("sin({x})"),
        Activation::Cos => format!("cos({x})"),
        Activation::Tan => format!("tan({x})"),
        Activation::Atan => format!("atan({x})"),
        Activation::Round => format!("round({x})"),
        Activation::Erf => format!("rerf({x})"),
    }
}

/// The WGSL type of a dtype's values, when the GPU holds that dtype.
pub fn wgsl_type(dt: DType) -> Option<&'static str> {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => Some("f32"),
        DType::I32 | DType::I16 | DType::I8 => Some("i32"),
        DType::U32 | DType::U8 => Some("u32"),
        DType::Bool => Some("bool"),
        DType::F64 | DType::I64 | DType::C64 => None,
    }
}

/// `x` (an i32 / u32 expression) wrapped to `dt`'s range, as the IR's integer arithmetic wraps:
/// i8 and i16 words hold the sign-extended value, u8 words the value itself.
fn wrap_to(dt: DType, x: String) -> String {
    match dt {
        DType::I8 => format!("(({x}) << 24u) >> 24u"),
        DType::I16 => format!("(({x}) << 16u) >> 16u"),
        DType::U8 => format!("(({x}) & 0xffu)"),
        _ => x,
    }
}

/// `x` (an f32 expression) converted to the integer dtype `dt` as the IR's casts do: toward
/// zero, saturated at the dtype's range, NaN to 0.
fn saturate_to(dt: DType, x: &str) -> Option<String> {
    let (lo, hi, ty) = match dt {
        DType::I8 => ("-128.0", "127.0", "i32"),
        DType::I16 => ("-32768.0", "32767.0", "i32"),
        DType::U8 => ("0.0", "255.0", "u32"),
        _ => return None,
    };
    Some(format!(
        "select({ty}(0), {ty}(clamp({x}, {lo}, {hi})), {x} == {x})"
    ))
}

/// `x` (an f32 expression) rounded to `dt`'s precision.
pub(crate) fn round_to(dt: DType, x: String) -> String {
    match dt {
        DType::F16 => format!("f16r({x})"),
        DType::BF16 => format!("bf16r({x})"),
        _ => x,
    }
}

/// The word at `at` as a value of `dt`.
fn load(dt: DType, at: &str) -> String {
    match wgsl_type(dt) {
        Some("f32") => format!("bitcast<f32>(rd({at}))"),
        Some("i32") => format!("bitcast<i32>(rd({at}))"),
        Some("bool") => format!("(rd({at}) != 0u)"),
        _ => format!("rd({at})"),
    }
}

/// The word of value `v` of `dt`.
fn word(dt: DType, v: &str) -> String {
    match wgsl_type(dt) {
        Some("f32") | Some("i32") => format!("bitcast<u32>({v})"),
        Some("bool") => format!("select(0u, 1u, {v})"),
        _ => v.to_string(),
    }
}

/// The WGSL expression of node `op` of result dtype `out` on operands `a` of dtypes `ins`, or
/// `None` when the GPU has no form for it.
fn expr(op: &Op, out: DType, a: &[String], ins: &[DType]) -> Option<String> {
    let float = |d: DType| wgsl_type(d) == Some("f32");
    let int = |d: DType| matches!(wgsl_type(d), Some("i32") | Some("u32"));
    let e = match op {
        Op::Binary(b) if float(out) => round_to(out, binary(*b, &a[0], &a[1])),
        Op::Binary(b) if int(out) => {
            let ty = wgsl_type(out)?;
            let e = match b {
                BinaryOp::Add => format!("{} + {}", a[0], a[1]),
                BinaryOp::Sub => format!("{} - {}", a[0], a[1]),
                BinaryOp::Mul => format!("{} * {}", a[0], a[1]),
                BinaryOp::Div => format!(
                    "select({0} / {1}, {ty}(0xffffffffu), {1} == {ty}(0))",
                    a[0], a[1]
                )
                .replace("i32(0xffffffffu)", "-1"),
                BinaryOp::Max => format!("max({}, {})", a[0], a[1]),
                BinaryOp::Min => format!("min({}, {})", a[0], a[1]),
                BinaryOp::Pow => return None,
            };
            wrap_to(out, e)
        }
        Op::Activation(act) if float(out) => round_to(out, activation(*act, &a[0])),
        Op::Activation(act) if int(out) => {
            let (x, signed) = (&a[0], wgsl_type(out) == Some("i32"));
            match act {
                Activation::Abs if signed => wrap_to(out, format!("abs({x})")),
                Activation::Neg if signed => wrap_to(out, format!("-{x}")),
                Activation::Neg => wrap_to(out, format!("0u - {x}")),
                Activation::Abs => x.clone(),
                Activation::Relu if signed => format!("max({x}, 0)"),
                Activation::Relu => x.clone(),
                _ => return None,
            }
        }
        Op::Compare(c) if ins[0] != DType::Bool => {
            let o = match c {
                CmpOp::Eq => "==",
                CmpOp::Ne => "!=",
                CmpOp::Lt => "<",
                CmpOp::Le => "<=",
                CmpOp::Gt => ">",
                CmpOp::Ge => ">=",
            };
            format!("({} {o} {})", a[0], a[1])
        }
        Op::Where => format!("select({}, {}, {})", a[2], a[1], a[0]),
        Op::Cast { to } => {
            let (from, x) = (ins[0], &a[0]);
            let ty = wgsl_type(*to)?;
            match (wgsl_type(from)?, ty) {
                (_, "bool") if from == DType::Bool => x.clone(),
                (f, "bool") => format!("({x} != {f}(0))"),
                ("bool", t) => round_to(*to, format!("select({t}(0), {t}(1), {x})")),
                ("f32", "f32") => round_to(*to, x.clone()),
                ("f32", _) if saturate_to(*to, x).is_some() => saturate_to(*to, x)?,
                ("i32", "u32") | ("u32", "i32") => wrap_to(*to, format!("bitcast<{ty}>({x})")),
                (_, t) => wrap_to(*to, round_to(*to, format!("{t}({x})"))),
            }
        }
        _ => return None,
    };
    Some(e)
}

/// Whether node `op` (result `out`, operands `ins`) has a WGSL form here.
pub fn elementwise_op(op: &Op, out: DType, ins: &[DType]) -> bool {
    let a: Vec<String> = (0..ins.len()).map(|k| format!("a{k}")).collect();
    wgsl_type(out).is_some()
        && ins.iter().all(|d| wgsl_type(*d).is_some())
        && expr(op, out, &a, ins).is_some()
}

/// WGSL `let` statements computing `nodes` of `body` at element `i` (operand `k` read through
/// `src(k, i)`), and each node's variable name; `None` if one has no WGSL form.
fn lets(body: &Graph, nodes: &[NodeId]) -> Option<(String, Vec<String>)> {
    let mut s = String::new();
    let mut name = vec![String::new(); body.len()];
    let mut k = 0;
    for &id in nodes {
        let n = body.node(id);
        let dt = n.shape.dtype();
        wgsl_type(dt)?;
        let e = match &n.op {
            Op::Input { .. } => {
                k += 1;
                load(dt, &format!("src({}u, i)", k - 1))
            }
            op => {
                let a: Vec<String> = n.inputs.iter().map(|x| name[x.index()].clone()).collect();
                let ins: Vec<DType> = n.inputs.iter().map(|x| body.shape(*x).dtype()).collect();
                if ins.iter().any(|d| wgsl_type(*d).is_none()) {
                    return None;
                }
                expr(op, dt, &a, &ins)?
            }
        };
        s.push_str(&format!("    let v{} = {e};\n", id.0));
        name[id.index()] = format!("v{}", id.0);
    }
    Some((s, name))
}

/// Meta words of an elementwise step: `[n, rank, out_off, dims[RANK], (off, strides[RANK]) per
/// operand, extra result offsets...]`.
pub const EW_OPERANDS: usize = 3 + RANK;

/// The kernel of an elementwise region whose body is `body` (inputs: the operands; outputs:
/// result 0 at `out_off`, the others at the offsets after the operands' words). `None` if an
/// op of the body has no WGSL form.
pub fn elementwise(body: &Graph) -> Option<String> {
    let n_ops = body
        .ids()
        .filter(|&i| matches!(body.node(i).op, Op::Input { .. }))
        .count();
    let mut s = String::from(HEADER);
    s.push_str(&format!(
        r#"
fn src(k: u32, i: u32) -> u32 {{
    let base = {EW_OPERANDS}u + k * {stride}u;
    let rank = mt[1];
    var rem = i;
    var off = mt[base];
    for (var d = 0u; d < rank; d++) {{
        let ax = rank - 1u - d;
        let dim = mt[3u + ax];
        off += (rem % dim) * mt[base + 1u + ax];
        rem = rem / dim;
    }}
    return off;
}}

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x + gid.y * ROW;
    if (i >= mt[0]) {{ return; }}
"#,
        stride = RANK + 1
    ));
    let ids: Vec<NodeId> = body.ids().collect();
    let (lets, name) = lets(body, &ids)?;
    s.push_str(&lets);
    for (r, o) in body.outputs().iter().enumerate() {
        let at = if r == 0 {
            "mt[2]".to_string()
        } else {
            format!("mt[{}u]", EW_OPERANDS + n_ops * (RANK + 1) + r - 1)
        };
        s.push_str(&format!(
            "    wr({at} + i, {});\n",
            word(body.shape(*o).dtype(), &name[o.index()])
        ));
    }
    s.push_str("}\n");
    Some(s)
}

/// Meta word where a multiply-reduce step's elementwise part starts (its rank, dims and
/// operands, laid out as an elementwise step's from its word 1 on).
pub const MR_EW: usize = 5 + 2 * RANK + 1 + 2 * RANK;

/// The kernel of a multiply-reduce region: an elementwise body whose last node is a Sum or Mean
/// (`None` for other bodies). Meta: the reduction's words (see [`reduce`]: `[n_out, m, _,
/// out_off, outer..., inner...]`, the walks over the dense index space of the reduced value),
/// then from [`MR_EW`] `[rank, dims[RANK], (off, strides[RANK]) per operand]`. Each invocation
/// sums the body's values over its output's elements, which never go to memory.
pub fn multiply_reduce(body: &Graph) -> Option<String> {
    let ids: Vec<NodeId> = body.ids().collect();
    let last = *ids.last()?;
    let Op::Reduce { kind, .. } = &body.node(last).op else {
        return None;
    };
    let fin = match kind {
        ReduceKind::Sum => "acc",
        ReduceKind::Mean => "acc / f32(m)",
        _ => return None,
    };
    let root = body.node(last).inputs[0];
    if body.outputs() != [last] || wgsl_type(body.shape(root).dtype()) != Some("f32") {
        return None;
    }
    let (f, name) = lets(body, &ids[..ids.len() - 1])?;
    let rnd = round_to(body.shape(last).dtype(), fin.to_string());
    let (od, os) = (5, 5 + RANK);
    let (ir, id, is) = (os + RANK, os + RANK + 1, os + 2 * RANK + 1);
    Some(format!(
        r#"{HEADER}
fn src(k: u32, i: u32) -> u32 {{
    let base = {ops}u + k * {stride}u;
    let rank = mt[{MR_EW}u];
    var rem = i;
    var off = mt[base];
    for (var d = 0u; d < rank; d++) {{
        let ax = rank - 1u - d;
        let dim = mt[{dims}u + ax];
        off += (rem % dim) * mt[base + 1u + ax];
        rem = rem / dim;
    }}
    return off;
}}

fn walk(i: u32, rank_at: u32, dims_at: u32, strides_at: u32) -> u32 {{
    let rank = mt[rank_at];
    var rem = i;
    var off = 0u;
    for (var d = 0u; d < rank; d++) {{
        let ax = rank - 1u - d;
        let dim = mt[dims_at + ax];
        off += (rem % dim) * mt[strides_at + ax];
        rem = rem / dim;
    }}
    return off;
}}

fn val(i: u32) -> f32 {{
{f}    return {root};
}}

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let o = gid.x + gid.y * ROW;
    if (o >= mt[0]) {{ return; }}
    let m = mt[1];
    let base = walk(o, 4u, {od}u, {os}u);
    var acc: f32 = 0.0;
    for (var j = 0u; j < m; j++) {{ acc += val(base + walk(j, {ir}u, {id}u, {is}u)); }}
    st(mt[3] + o, {rnd});
}}
"#,
        ops = MR_EW + 1 + RANK,
        stride = RANK + 1,
        dims = MR_EW + 1,
        root = name[root.index()],
    ))
}

/// Strided copy: meta `[n, rank, dst_off, dims[RANK], dst_strides[RANK], src_off, src_strides[RANK]]`.
pub fn copy() -> String {
    one_d(
        "i",
        &format!(
            r#"    let rank = mt[1];
    var rem = i;
    var dst = mt[2];
    var src = mt[{so}u];
    for (var d = 0u; d < rank; d++) {{
        let ax = rank - 1u - d;
        let dim = mt[3u + ax];
        let c = rem % dim;
        rem = rem / dim;
        dst += c * mt[{ds}u + ax];
        src += c * mt[{ss}u + ax];
    }}
    wr(dst, rd(src));
"#,
            ds = 3 + RANK,
            so = 3 + 2 * RANK,
            ss = 4 + 2 * RANK
        ),
    )
}

/// `nanb(v)`: whether `v` is NaN, by its bits (a compiler may fold `v != v` away inside a
/// workgroup tree).
const NAN_BITS: &str = "fn nanb(v: f32) -> bool { let u = bitcast<u32>(v); return (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0u; }";

/// Reduced elements from which a reduction takes a workgroup per result ([`reduce_wide`]).
pub const WIDE_REDUCE: usize = 256;

/// A reduction of at least [`WIDE_REDUCE`] elements per result: meta as [`reduce`]'s; a
/// workgroup per result (dispatch `n_out * WG` invocations), its invocations striding over the
/// reduced elements, then a tree in workgroup memory (the same combining step as [`reduce`]'s,
/// NaN-propagating for max and min).
pub fn reduce_wide(kind: ReduceKind, out: DType) -> String {
    let (init, step, fin) = reduce_parts(kind);
    let rnd = round_to(out, fin.replace("acc", "red[0]"));
    // Max and min test NaN by its bits: the compiler may fold `a != a` away in the tree.
    let combine = match kind {
        ReduceKind::Sum | ReduceKind::Mean => "a + b",
        ReduceKind::Max => "select(max(a, b), a + b, nanb(a) || nanb(b))",
        ReduceKind::Min => "select(min(a, b), a + b, nanb(a) || nanb(b))",
        ReduceKind::Prod => "a * b",
    };
    let step = match kind {
        ReduceKind::Max | ReduceKind::Min => "combine(acc, x)",
        _ => step,
    };
    let (od, os, ir, id, is) = (5, 5 + RANK, 5 + 2 * RANK, 6 + 2 * RANK, 6 + 3 * RANK);
    format!(
        r#"{HEADER}
{WALK}
var<workgroup> red: array<f32, {WG}>;
{NAN_BITS}
fn combine(a: f32, b: f32) -> f32 {{ return {combine}; }}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let i = wg.x + wg.y * {MAX_GROUPS}u;
    let live = i < mt[0];
    let m = mt[1];
    var acc: f32 = {init};
    if (live) {{
        let base = mt[2] + walk(i, 4u, {od}u, {os}u);
        for (var j = lid; j < m; j += {WG}u) {{
            let x = ld(base + walk(j, {ir}u, {id}u, {is}u));
            acc = {step};
        }}
    }}
    red[lid] = acc;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ red[lid] = combine(red[lid], red[lid + s]); }}
        workgroupBarrier();
    }}
    if (live && lid == 0u) {{ st(mt[3] + i, {rnd}); }}
}}
"#,
        half = WG / 2
    )
}

/// The initial value, the step folding element `x` into `acc`, and the result from `acc`, of
/// a reduction kind.
fn reduce_parts(kind: ReduceKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        ReduceKind::Sum => ("0.0", "acc + x", "acc"),
        ReduceKind::Mean => ("0.0", "acc + x", "acc / f32(m)"),
        ReduceKind::Max => ("bitcast<f32>(0xff800000u)", "rmax(acc, x)", "acc"),
        ReduceKind::Min => ("bitcast<f32>(0x7f800000u)", "rmin(acc, x)", "acc"),
        ReduceKind::Prod => ("1.0", "acc * x", "acc"),
    }
}

/// `walk(i, rank_at, dims_at, strides_at)`: the offset of element `i` of the dims at
/// `mt[dims_at..]` laid out with the strides at `mt[strides_at..]`.
const WALK: &str = r#"fn walk(i: u32, rank_at: u32, dims_at: u32, strides_at: u32) -> u32 {
    let rank = mt[rank_at];
    var rem = i;
    var off = 0u;
    for (var d = 0u; d < rank; d++) {
        let ax = rank - 1u - d;
        let dim = mt[dims_at + ax];
        off += (rem % dim) * mt[strides_at + ax];
        rem = rem / dim;
    }
    return off;
}"#;

/// Reduction: meta `[n_out, m, in_off, out_off, outer_rank, outer_dims[RANK],
/// outer_strides[RANK], inner_rank, inner_dims[RANK], inner_strides[RANK]]`; each invocation
/// folds the `m` elements of one output.
pub fn reduce(kind: ReduceKind, out: DType) -> String {
    let (init, step, fin) = reduce_parts(kind);
    let rnd = round_to(out, fin.to_string());
    let od = 5;
    let os = od + RANK;
    let ir = os + RANK;
    let id = ir + 1;
    let is = id + RANK;
    format!(
        r#"{HEADER}
{WALK}

@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x + gid.y * ROW;
    if (i >= mt[0]) {{ return; }}
    let m = mt[1];
    let base = mt[2] + walk(i, 4u, {od}u, {os}u);
    var acc: f32 = {init};
    for (var j = 0u; j < m; j++) {{
        let x = ld(base + walk(j, {ir}u, {id}u, {is}u));
        acc = {step};
    }}
    st(mt[3] + i, {rnd});
}}
"#
    )
}

/// Softmax along one axis of a dense value: meta `[n, len, stride, in_off, out_off]`; element
/// `i`'s row starts at `i - (i / stride % len) * stride`.
pub fn softmax(out: DType) -> String {
    let rnd = round_to(out, "exp(ld(mt[3] + i) - mx) / sum".into());
    one_d(
        "i",
        &format!(
            r#"    let len = mt[1];
    let stride = mt[2];
    let row = i - ((i / stride) % len) * stride;
    var mx: f32 = ld(mt[3] + row);
    for (var j = 1u; j < len; j++) {{ mx = rmax(mx, ld(mt[3] + row + j * stride)); }}
    var sum: f32 = 0.0;
    for (var j = 0u; j < len; j++) {{ sum += exp(ld(mt[3] + row + j * stride) - mx); }}
    st(mt[4] + i, {rnd});
"#
        ),
    )
}

/// Row length from which softmax and cumsum take a workgroup per row ([`softmax_wide`],
/// [`cumsum_wide`]) rather than an invocation per element looping over its row.
pub const WIDE_ROW: usize = 32;

/// The prologue of a kernel with a workgroup per row of a value along one axis (meta as
/// [`softmax`]'s: `[n, len, stride, in_off, out_off]`, dispatch `n / len * WG` invocations):
/// `len`, `stride`, `live` (the workgroup has a row) and `start` (its first element's index).
const ROW_PER_GROUP: &str = r#"var<workgroup> red: array<f32, WGu>;
@compute @workgroup_size(WGu)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let len = mt[1];
    let stride = mt[2];
    let r = wg.x + wg.y * MAX_GROUPSu;
    let live = r < mt[0] / len;
    let start = (r / stride) * len * stride + r % stride;
"#;

/// Softmax along one axis, a workgroup per row: meta as [`softmax`]'s; the row's maximum
/// (NaN-propagating, tested by its bits) and sum each by a tree in workgroup memory.
pub fn softmax_wide(out: DType) -> String {
    let rnd = round_to(out, "exp(ld(mt[3] + e) - mx) / sum".into());
    format!(
        r#"{HEADER}
{NAN_BITS}
fn cmax(a: f32, b: f32) -> f32 {{ return select(max(a, b), a + b, nanb(a) || nanb(b)); }}
{ROW_PER_GROUP}    var mx = bitcast<f32>(0xff800000u);
    if (live) {{ for (var j = lid; j < len; j += WGu) {{ mx = cmax(mx, ld(mt[3] + start + j * stride)); }} }}
    red[lid] = mx;
    workgroupBarrier();
    for (var s = HALFu; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ red[lid] = cmax(red[lid], red[lid + s]); }}
        workgroupBarrier();
    }}
    mx = red[0];
    workgroupBarrier();
    var sum = 0.0;
    if (live) {{ for (var j = lid; j < len; j += WGu) {{ sum += exp(ld(mt[3] + start + j * stride) - mx); }} }}
    red[lid] = sum;
    workgroupBarrier();
    for (var s = HALFu; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ red[lid] = red[lid] + red[lid + s]; }}
        workgroupBarrier();
    }}
    sum = red[0];
    if (live) {{ for (var j = lid; j < len; j += WGu) {{ let e = start + j * stride; st(mt[4] + e, {rnd}); }} }}
}}
"#
    )
    .replace("MAX_GROUPSu", &format!("{MAX_GROUPS}u"))
    .replace("HALFu", &format!("{}u", WG / 2))
    .replace("WGu", &format!("{WG}u"))
}

/// Inclusive prefix sum along one axis, a workgroup per row: meta as [`softmax`]'s; the row in
/// chunks of `WG`, each scanned in workgroup memory (log-step) and added to the sum of the
/// chunks before it.
pub fn cumsum_wide(out: DType) -> String {
    let rnd = round_to(out, "carry + red[lid]".into());
    format!(
        r#"{HEADER}
{ROW_PER_GROUP}    var carry = 0.0;
    for (var c = 0u; c < len; c += WGu) {{
        let j = c + lid;
        let on = live && j < len;
        var v = 0.0;
        if (on) {{ v = ld(mt[3] + start + j * stride); }}
        red[lid] = v;
        workgroupBarrier();
        for (var s = 1u; s < WGu; s = s << 1u) {{
            var t = 0.0;
            if (lid >= s) {{ t = red[lid - s]; }}
            workgroupBarrier();
            red[lid] = red[lid] + t;
            workgroupBarrier();
        }}
        if (on) {{ st(mt[4] + start + j * stride, {rnd}); }}
        carry += red[WGu - 1u];
        workgroupBarrier();
    }}
}}
"#
    )
    .replace("MAX_GROUPSu", &format!("{MAX_GROUPS}u"))
    .replace("WGu", &format!("{WG}u"))
}

/// Gather along an axis: meta `[n, rank, out_off, dims[RANK], x_off, x_strides[RANK], idx_off,
/// idx_strides[RANK], axis_stride, axis_len]` (strides over the result's axes, zero where an
/// axis does not index that operand); indices are clamped into the axis, as the reference
/// evaluator does. `signed`: i32 indices, else u32.
pub fn gather(signed: bool) -> String {
    let xo = 3 + RANK;
    let io = xo + 1 + RANK;
    let ax = io + 1 + RANK;
    let row = if signed {
        "u32(clamp(bitcast<i32>(raw), 0, i32(len) - 1))"
    } else {
        "min(raw, len - 1u)"
    };
    one_d(
        "i",
        &format!(
            r#"    let rank = mt[1];
    var rem = i;
    var xo = mt[{xo}u];
    var io = mt[{io}u];
    for (var d = 0u; d < rank; d++) {{
        let a = rank - 1u - d;
        let c = rem % mt[3u + a];
        rem = rem / mt[3u + a];
        xo += c * mt[{xs}u + a];
        io += c * mt[{is}u + a];
    }}
    let raw = rd(io);
    let len = mt[{al}u];
    let row = {row};
    wr(mt[2] + i, rd(xo + row * mt[{ax}u]));
"#,
            xs = xo + 1,
            is = io + 1,
            al = ax + 1
        ),
    )
}

/// Scatter-add along an axis with 1-d indices: meta `[n, rank, out_off, dims[RANK], x_off,
/// u_off, u_strides[RANK], idx_off, m, axis]`; each result element adds, in index order, the
/// updates whose index names its row (indices outside the axis add nothing, as in the
/// reference evaluator).
pub fn scatter_add(signed: bool, out: DType) -> String {
    let rnd = round_to(out, "acc".into());
    let us = 5 + RANK;
    let io = us + RANK;
    let target = if signed {
        "bitcast<i32>(rd(mt[IO] + j)) == i32(row)"
    } else {
        "rd(mt[IO] + j) == row"
    }
    .replace("IO", &format!("{io}u"));
    one_d(
        "i",
        &format!(
            r#"    let rank = mt[1];
    let axis = mt[{ax}u];
    var rem = i;
    var uo = mt[{uo}u];
    var row = 0u;
    for (var d = 0u; d < rank; d++) {{
        let a = rank - 1u - d;
        let c = rem % mt[3u + a];
        rem = rem / mt[3u + a];
        if (a == axis) {{ row = c; }} else {{ uo += c * mt[{us}u + a]; }}
    }}
    var acc: f32 = ld(mt[{xo}u] + i);
    for (var j = 0u; j < mt[{m}u]; j++) {{
        if ({target}) {{ acc += ld(uo + j * mt[{us}u + axis]); }}
    }}
    st(mt[2] + i, {rnd});
"#,
            xo = 3 + RANK,
            uo = 4 + RANK,
            m = io + 1,
            ax = io + 2
        ),
    )
}

/// Inclusive prefix sum along one axis of a dense value: meta `[n, len, stride, in_off,
/// out_off]`.
pub fn cumsum(out: DType) -> String {
    let rnd = round_to(out, "acc".into());
    one_d(
        "i",
        &format!(
            r#"    let stride = mt[2];
    let c = (i / stride) % mt[1];
    let row = i - c * stride;
    var acc: f32 = 0.0;
    for (var j = 0u; j <= c; j++) {{ acc += ld(mt[3] + row + j * stride); }}
    st(mt[4] + i, {rnd});
"#
        ),
    )
}

/// Top-k along the last axis, a workgroup per row (dispatch `rows * WG` invocations): meta
/// `[rows, k, len, x_off, out_off]`; result `t` of a row is its element of rank `t` in
/// descending order (NaN largest, the lower index first among equals, as the reference
/// evaluator sorts), found in pass `t` as the first of the elements after result `t - 1`: each
/// invocation over every `WG`-th element, then a tree in workgroup memory. `k * len / 64`
/// steps an invocation. `indices`: write the position (i32), else the value's word. `x` is the
/// input dtype.
pub fn topk(x: DType, indices: bool) -> String {
    let (kt, key) = match wgsl_type(x) {
        Some("f32") => ("f32", "fn key(w: u32) -> f32 { let v = bitcast<f32>(w); return select(v, bitcast<f32>(0x7f800000u), v != v); }"),
        Some("i32") => ("i32", "fn key(w: u32) -> i32 { return bitcast<i32>(w); }"),
        _ => ("u32", "fn key(w: u32) -> u32 { return w; }"),
    };
    let store = if indices {
        "wr(mt[4] + row * k + t, bitcast<u32>(i32(ci)))"
    } else {
        "wr(mt[4] + row * k + t, rd(base + ci))"
    };
    format!(
        r#"{HEADER}{key}
const NONE: u32 = 0xffffffffu;
var<workgroup> bk: array<{kt}, {WG}>;
var<workgroup> bi: array<u32, {WG}>;
// Whether (ka, ia) comes before (kb, ib) in the order of the results (`NONE`: no element).
fn first(ka: {kt}, ia: u32, kb: {kt}, ib: u32) -> bool {{
    return ia != NONE && (ib == NONE || ka > kb || (ka == kb && ia < ib));
}}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let row = wg.x + wg.y * {MAX_GROUPS}u;
    let live = row < mt[0];
    let k = mt[1];
    let len = mt[2];
    let base = mt[3] + row * len;
    var pk: {kt};
    var pi = NONE;
    for (var t = 0u; t < k; t++) {{
        var ck: {kt};
        var ci = NONE;
        if (live) {{
            for (var j = lid; j < len; j += {WG}u) {{
                let kj = key(rd(base + j));
                let after = pi == NONE || kj < pk || (kj == pk && j > pi);
                if (after && (ci == NONE || kj > ck)) {{ ck = kj; ci = j; }}
            }}
        }}
        bk[lid] = ck;
        bi[lid] = ci;
        workgroupBarrier();
        for (var s = {half}u; s > 0u; s = s >> 1u) {{
            if (lid < s && first(bk[lid + s], bi[lid + s], bk[lid], bi[lid])) {{
                bk[lid] = bk[lid + s];
                bi[lid] = bi[lid + s];
            }}
            workgroupBarrier();
        }}
        ck = bk[0];
        ci = bi[0];
        workgroupBarrier();
        if (live && lid == 0u && ci != NONE) {{ {store}; }}
        pk = ck;
        pi = ci;
    }}
}}
"#,
        half = WG / 2
    )
}

/// Tile edge of the matmul kernel.
pub const TILE: u32 = 16;

/// Batched matmul `C[b] = A[b] B[b]` with 16×16 tiles in workgroup memory: meta `[m, k, n,
/// a_off, b_off, c_off, batch_rank, c_batch_dims[4], a_batch_strides[4], b_batch_strides[4]]`;
/// workgroup `(x, y, z)` computes tile `(y, x)` of batch `z`.
pub fn matmul(out: DType) -> String {
    let rnd = round_to(out, "acc".into());
    format!(
        r#"{HEADER}
var<workgroup> ta: array<array<f32, {TILE}>, {TILE}>;
var<workgroup> tb: array<array<f32, {TILE}>, {TILE}>;

@compute @workgroup_size({TILE}, {TILE})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
    let m = mt[0];
    let k = mt[1];
    let n = mt[2];
    let rank = mt[6];
    var rem = wg.z;
    var ab = 0u;
    var bb = 0u;
    for (var d = 0u; d < rank; d++) {{
        let ax = rank - 1u - d;
        let dim = mt[7u + ax];
        let c = rem % dim;
        rem = rem / dim;
        ab += c * mt[11u + ax];
        bb += c * mt[15u + ax];
    }}
    let row = wg.y * {TILE}u + lid.y;
    let col = wg.x * {TILE}u + lid.x;
    var acc: f32 = 0.0;
    let tiles = (k + {TILE}u - 1u) / {TILE}u;
    for (var t = 0u; t < tiles; t++) {{
        let ka = t * {TILE}u + lid.x;
        let kb = t * {TILE}u + lid.y;
        ta[lid.y][lid.x] = select(0.0, ld(mt[3] + ab + row * k + ka), row < m && ka < k);
        tb[lid.y][lid.x] = select(0.0, ld(mt[4] + bb + kb * n + col), kb < k && col < n);
        workgroupBarrier();
        for (var j = 0u; j < {TILE}u; j++) {{
            acc += ta[lid.y][j] * tb[j][lid.x];
        }}
        workgroupBarrier();
    }}
    if (row < m && col < n) {{
        st(mt[5] + wg.z * m * n + row * n + col, {rnd});
    }}
}}
"#
    )
}

/// Byte access to the arena (packed u8 values: 4 bytes a word, little-endian).
const BYTES: &str = r#"
// Byte addresses from SHARED on are in the params buffer too.
fn byte(b: u32) -> u32 {
    let w = select(b >> 2u, SHARED + ((b - SHARED) >> 2u), b >= SHARED);
    return (rd(w) >> ((b & 3u) * 8u)) & 0xffu;
}
fn u16at(b: u32) -> u32 { return byte(b) | (byte(b + 1u) << 8u); }
fn u32at(b: u32) -> u32 { return u16at(b) | (u16at(b + 2u) << 16u); }
fn f16at(b: u32) -> f32 { return unpack2x16float(u16at(b)).x; }
fn nib(b: u32, j: u32) -> u32 { return select(byte(b + j) & 0xfu, byte(b + j - 16u) >> 4u, j >= 16u); }
// Scale and min of sub-block j of a Q4_K / Q5_K block whose 12 scale bytes start at s.
fn scmin(s: u32, j: u32) -> vec2<u32> {
    if (j < 4u) { return vec2<u32>(byte(s + j) & 63u, byte(s + j + 4u) & 63u); }
    return vec2<u32>((byte(s + j + 4u) & 0xfu) | ((byte(s + j - 4u) >> 6u) << 4u), (byte(s + j + 4u) >> 4u) | ((byte(s + j) >> 6u) << 4u));
}
"#;

/// WGSL `deq(row, e)`: element `e` of the packed GGUF row starting at byte `row`, for the block
/// types decoded on the GPU (`None` for the others).
pub fn gguf_decoder(scheme: rlx_ir::QuantScheme) -> Option<&'static str> {
    use rlx_ir::QuantScheme::*;
    Some(match scheme {
        GgufF16 => "fn deq(row: u32, e: u32) -> f32 { return f16at(row + e * 2u); }",
        GgufBF16 => "fn deq(row: u32, e: u32) -> f32 { return bitcast<f32>(u16at(row + e * 2u) << 16u); }",
        GgufQ4_0 => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 32u) * 18u; return (f32(nib(b + 2u, e % 32u)) - 8.0) * f16at(b); }",
        GgufQ4_1 => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 32u) * 20u; return f32(nib(b + 4u, e % 32u)) * f16at(b) + f16at(b + 2u); }",
        GgufQ5_0 => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 32u) * 22u; let j = e % 32u; let h = (u32at(b + 2u) >> j) & 1u; return (f32(nib(b + 6u, j) | (h << 4u)) - 16.0) * f16at(b); }",
        GgufQ5_1 => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 32u) * 24u; let j = e % 32u; let h = (u32at(b + 4u) >> j) & 1u; return f32(nib(b + 8u, j) | (h << 4u)) * f16at(b) + f16at(b + 2u); }",
        GgufQ8_0 => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 32u) * 34u; let q = byte(b + 2u + e % 32u); return f32(i32(q << 24u) >> 24u) * f16at(b); }",
        // K-quants: 256 elements a block; element e sits in sub-block `is` with its own scale.
        GgufQ2K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 84u; let w = e % 256u; let h = w / 128u; let j = (w % 128u) / 32u; let r = w % 32u; let sc = byte(b + h * 8u + j * 2u + r / 16u); let q = (byte(b + 16u + h * 32u + r) >> (2u * j)) & 3u; return f16at(b + 80u) * f32(sc & 0xfu) * f32(q) - f16at(b + 82u) * f32(sc >> 4u); }",
        GgufQ3K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 110u; let w = e % 256u; let h = w / 128u; let j = (w % 128u) / 32u; let r = w % 32u; let is = h * 8u + j * 2u + r / 16u; let s = b + 96u; let lo = select(byte(s + is - 8u) >> 4u, byte(s + is) & 0xfu, is < 8u); let hi = (byte(s + 8u + is % 4u) >> (2u * (is / 4u))) & 3u; let sc = i32(lo | (hi << 4u)) - 32; let q = i32((byte(b + 32u + h * 32u + r) >> (2u * j)) & 3u) - select(4, 0, ((byte(b + r) >> (h * 4u + j)) & 1u) == 1u); return f16at(b + 108u) * f32(sc) * f32(q); }",
        GgufQ4K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 144u; let w = e % 256u; let c = w / 64u; let hi = (w % 64u) / 32u; let l = w % 32u; let q = byte(b + 16u + c * 32u + l); let nb = select(q & 0xfu, q >> 4u, hi == 1u); let sm = scmin(b + 4u, 2u * c + hi); return f16at(b) * f32(sm.x) * f32(nb) - f16at(b + 2u) * f32(sm.y); }",
        GgufQ5K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 176u; let w = e % 256u; let c = w / 64u; let hi = (w % 64u) / 32u; let l = w % 32u; let q = byte(b + 48u + c * 32u + l); let nb = select(q & 0xfu, q >> 4u, hi == 1u) + 16u * ((byte(b + 16u + l) >> (2u * c + hi)) & 1u); let sm = scmin(b + 4u, 2u * c + hi); return f16at(b) * f32(sm.x) * f32(nb) - f16at(b + 2u) * f32(sm.y); }",
        GgufQ6K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 210u; let w = e % 256u; let h = w / 128u; let quad = (w % 128u) / 32u; let l = w % 32u; let ql = byte(b + h * 64u + l + (quad & 1u) * 32u); let nb = select(ql & 0xfu, ql >> 4u, quad >= 2u); let qh = (byte(b + 128u + h * 32u + l) >> (2u * quad)) & 3u; let q = i32(nb | (qh << 4u)) - 32; let sc = i32(byte(b + 192u + h * 8u + l / 16u + 2u * quad) << 24u) >> 24u; return f16at(b + 208u) * f32(sc) * f32(q); }",
        GgufQ8K => "fn deq(row: u32, e: u32) -> f32 { let b = row + (e / 256u) * 292u; let q = byte(b + 4u + e % 256u); return bitcast<f32>(u32at(b)) * f32(i32(q << 24u) >> 24u); }",
        _ => return None,
    })
}

/// Activations rounded to int8 blocks and back, one invocation per block of `blk`: meta
/// `[blocks, x_off, out_off, sums_off]` (blocks of 32 also write each block's `Q8_1` sum,
/// `d * sum(q)` with `d` unrounded, rounded to f16, at `sums_off`). Blocks of 32 (`Q8_0`): `d = amax / 127` rounded to f16,
/// `q = round_even(x * 127 / amax)`; blocks of 256 (`Q8_K`): `q = min(round_even(x * -127 /
/// m), 127)` with `m` the first element of largest magnitude, `d = m / -127`. The result is
/// `d * q`, so the product's sum is the CPU's integer products times their scales.
pub fn quantize_acts(blk: u32) -> String {
    let body = if blk == 32 {
        r#"    var amax = 0.0;
    for (var e = 0u; e < 32u; e++) { amax = max(amax, abs(ld(x + e))); }
    let d = f16r(amax / 127.0);
    let id = select(0.0, 127.0 / amax, amax != 0.0);
    var qs = 0.0;
    for (var e = 0u; e < 32u; e++) { let q = round(ld(x + e) * id); st(o + e, d * q); qs += q; }
    st(mt[3] + b, f16r(amax / 127.0 * qs));
"#
    } else {
        r#"    var amax = 0.0;
    var mx = 0.0;
    for (var e = 0u; e < 256u; e++) {
        let v = ld(x + e);
        if (abs(v) > amax) { amax = abs(v); mx = v; }
    }
    if (amax == 0.0) {
        for (var e = 0u; e < 256u; e++) { st(o + e, 0.0); }
        return;
    }
    let iscale = -127.0 / mx;
    let d = 1.0 / iscale;
    for (var e = 0u; e < 256u; e++) { st(o + e, d * min(round(iscale * ld(x + e)), 127.0)); }
"#
    };
    one_d(
        "b",
        &format!("    let x = mt[1] + b * {blk}u;\n    let o = mt[2] + b * {blk}u;\n{body}"),
    )
}

/// Rows up to which a quantized product is a decode product ([`dequant_matvec`]: each decoded
/// weight serves them all); more rows take the tiled prompt kernel ([`dequant_matmul`]).
pub const QROWS: u32 = 8;

/// Rows of a prompt product's tile at most ([`dequant_matmul`]).
pub const TILE_ROWS: u32 = 32;

/// Rows of the tiles of a prompt product of `rows` rows: the rows rounded up to a multiple of 8,
/// at most [`TILE_ROWS`], so a short prompt does not compute the rows a full tile would add
/// (each result's sum is the same whatever the tile's height).
pub fn tile_rows(rows: usize) -> u32 {
    rows.next_multiple_of(8).clamp(8, TILE_ROWS as usize) as u32
}
/// Columns of a prompt product's tile: one per invocation of the workgroup.
pub const TILE_COLS: u32 = WG;
/// Depth of one step of a prompt product's tile.
const TILE_K: u32 = 32;

/// For the block types whose weights carry an offset (Q4_1, Q5_1): WGSL `deq(row, e)` without
/// it and `mof(row, e)`, the offset of `e`'s block, which a product of rounded activations
/// multiplies by their block's `Q8_1` sum, as the CPU does (`None` for the others).
pub fn offset_decoder(scheme: rlx_ir::QuantScheme) -> Option<String> {
    let bytes = match scheme {
        rlx_ir::QuantScheme::GgufQ4_1 => 20,
        rlx_ir::QuantScheme::GgufQ5_1 => 24,
        _ => return None,
    };
    let full = gguf_decoder(scheme)?;
    let bare = full.replace(" + f16at(b + 2u); }", "; }");
    (bare != full).then(|| {
        format!(
            "{bare}\nfn mof(row: u32, e: u32) -> f32 {{ return f16at(row + (e / 32u) * {bytes}u + 2u); }}"
        )
    })
}

/// `x [R, K] @ decode(w)^T` for packed GGUF rows `w [N, row_bytes]` (prompts, `R > QROWS`):
/// meta `[R, K, N, x_off, w_byte, row_bytes, out_off, sums_off]`; a workgroup per tile of
/// `tr` rows ([`tile_rows`]) and [`TILE_COLS`] columns (dispatch `(⌈N / TILE_COLS⌉, ⌈R / tr⌉)`),
/// each invocation one column. Per step of 32 along `K`, the tile's activations are loaded once
/// into workgroup memory for all its columns, and each invocation decodes its column's 32
/// weights once for all the tile's rows, then accumulates the tile's rows in registers (the
/// rows unrolled, so every accumulator index is static). Loops run `2.5 K` iterations an
/// invocation. `sums` (the activations rounded to 32-blocks, `decoder` an [`offset_decoder`]):
/// each block's offset times the rows' `Q8_1` block sums at `sums_off`, one step a block.
pub fn dequant_matmul(decoder: &str, out: DType, sums: bool, tr: u32) -> String {
    let tk = TILE_K;
    let fma: String = (0..tr)
        .map(|t| format!("            acc[{t}] += xs[{t}u * {tk}u + kk] * w;\n"))
        .collect();
    // A step of TILE_K (32) is one block: its offset once, times each row's block sum.
    let offsets: String = if sums {
        let rows: String = (0..tr)
            .map(|t| format!("            if (r0 + {t}u < rows) {{ acc[{t}] += mo * ld(mt[7] + (r0 + {t}u) * (k / 32u) + c / 32u); }}\n"))
            .collect();
        format!(
            "        if (live && c < k) {{\n            let mo = mof(row, c);\n{rows}        }}\n"
        )
    } else {
        String::new()
    };
    let store: String = (0..tr)
        .map(|t| {
            let v = round_to(out, format!("acc[{t}]"));
            format!("        if (r0 + {t}u < rows) {{ st(mt[6] + (r0 + {t}u) * n + j, {v}); }}\n")
        })
        .collect();
    format!(
        r#"{HEADER}{BYTES}{decoder}
var<workgroup> xs: array<f32, {xs}>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let rows = mt[0];
    let k = mt[1];
    let n = mt[2];
    let j = wg.x * {WG}u + lid;
    let r0 = wg.y * {tr}u;
    let live = j < n;
    let row = mt[4] + min(j, n - 1u) * mt[5];
    var acc: array<f32, {tr}>;
    var wv: array<f32, {tk}>;
    for (var c = 0u; c < k; c += {tk}u) {{
        for (var e = lid; e < {xs}u; e += {WG}u) {{
            let t = e / {tk}u;
            let p = c + e % {tk}u;
            var v = 0.0;
            if (r0 + t < rows && p < k) {{ v = ld(mt[3] + (r0 + t) * k + p); }}
            xs[e] = v;
        }}
        for (var kk = 0u; kk < {tk}u; kk++) {{
            var w = 0.0;
            if (live && c + kk < k) {{ w = deq(row, c + kk); }}
            wv[kk] = w;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < {tk}u; kk++) {{
            let w = wv[kk];
{fma}        }}
{offsets}        workgroupBarrier();
    }}
    if (live) {{
{store}    }}
}}
"#,
        xs = tr * tk
    )
}

/// The workgroup-wide sum and maximum of a [`WG`]-invocation workgroup (`red` workgroup
/// memory, a tree of barriers; call them from uniform control flow).
pub(crate) const WG_SUM: &str = r#"var<workgroup> red: array<f32, 64>;
fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
fn wg_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
"#;

/// Packed GGUF rows decoded: meta `[n, K, row_bytes, w_byte, out_off]`.
pub fn dequantize_rows(decoder: &str, out: DType) -> String {
    let rnd = round_to(out, "deq(mt[3] + (i / mt[1]) * mt[2], i % mt[1])".into());
    format!(
        r#"{HEADER}{BYTES}{decoder}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x + gid.y * ROW;
    if (i >= mt[0]) {{ return; }}
    st(mt[4] + i, {rnd});
}}
"#
    )
}

/// Rows of `upd [S, row]` into the cache `[T, row]` from position `pos` (rows past the cache
/// dropped, a negative position counting as 0): meta `[n_upd, row, T, cache_off, upd_off,
/// pos_off]`; the cache's dtype is `cache`.
pub fn cache_write(cache: DType) -> String {
    let rnd = round_to(cache, "ld(mt[4] + i)".into());
    one_d(
        "i",
        &format!(
            r#"    let pos = u32(max(bitcast<i32>(rd(mt[5])), 0));
    let r = pos + i / mt[1];
    if (r >= mt[2]) {{ return; }}
    st(mt[3] + r * mt[1] + i % mt[1], {rnd});
"#
        ),
    )
}
